//! sendonce: one logical send, one message on the phone.
//!
//! A REST service between callers that retry (CRMs, ERPs, mobile backends)
//! and an SMS provider. `POST /messages` with an `Idempotency-Key` reserves
//! the key under a Postgres unique constraint before anything leaves the
//! building; a delivery task calls the provider with durable, jittered
//! retries under a lease; the final response is stored and replayed byte for
//! byte to every retry of the same request.
//!
//! # Layout
//! - [`config`]: CLI flags and environment, validated at start.
//! - [`app`]: builds an instance from a listener, store, provider and clock;
//!   runs it until a shutdown signal, then drains.
//! - [`http`]: the router, extractors and one module per resource.
//! - [`error`]: every API error as RFC 9457 problem+json.
//! - [`domain`]: validated newtypes, segment counting, fingerprints, states.
//! - [`store`]: the storage interface and its Postgres and SQLite implementations.
//! - [`provider`]: the provider trait, outcome classes, `simulated`, `http`
//!   and `twilio` (with Twilio's request signatures).
//! - [`delivery`]: the delivery task, retry policy, scheduler/rescuer, purge.
//! - [`clock`]: the time source (hand-moved in tests).
//!
//! See `docs/architecture.md` for the state machine and the failure model.

pub mod admin;
pub mod apikey;
pub mod app;
pub mod body;
pub mod cache;
pub mod clock;
pub mod commands;
pub mod config;
pub mod console;
pub mod delivery;
pub mod domain;
pub mod error;
pub mod failpoint;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod outbox;
pub mod provider;
pub mod ratelimit;
pub mod scopes;
pub mod send;
pub mod shutdown;
pub use domain::spend;
pub mod store;
pub mod telemetry;
pub mod verify;
pub mod webhooks;

/// Installs rustls's ring crypto provider for the process (reqwest is built
/// without one of its own, so one TLS stack serves the whole binary).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
