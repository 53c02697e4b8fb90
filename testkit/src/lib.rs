//! Test tooling for sendonce, kept out of the product: the product never
//! depends on this crate; its tests, the benchmark and the chaos run do.
//!
//! - [`mock_provider`]: a scriptable provider server (the `http` protocol and
//!   Twilio's Messages endpoint, faults, receipts) for tests and demos; the
//!   `mock-provider` binary serves it as a process.

pub mod mock_provider;
