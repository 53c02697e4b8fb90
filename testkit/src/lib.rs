//! Test tooling for sendonce, kept out of the product: the product never
//! depends on this crate; its tests, the benchmark and the chaos run do.
//!
//! - [`mock_provider`]: a scriptable provider server (the `http` protocol and
//!   Twilio's Messages endpoint, Vonage's SMS API, faults, receipts) for tests and demos; the
//!   `mock-provider` binary serves it as a process.
//! - [`providers`]: one module per protocol the mock speaks (`http`, `vonage`,
//!   `twilio`), listed once.
//! - [`accept`]: its accept loop, which backs off after accept errors.

pub mod accept;
pub mod mock_provider;
pub mod providers;
