//! Signed status webhooks (Standard Webhooks) and their delivery.
//!
//! A status change writes its event to the outbox (`webhook_events`) and one
//! delivery row per endpoint subscribed at that moment (`webhook_deliveries`)
//! in the same transaction; see [`crate::store::webhooks`]. The
//! [`Dispatcher`] on every instance claims due deliveries under a lease (the
//! expiry in the database's clock, as for messages), POSTs the signed event,
//! and records the attempt and what follows ([`schedule`]) with one write
//! fenced on the lease. [`signing`] makes the signatures, [`ssrf`] keeps
//! deliveries away from the service's own network.

pub mod dispatch;
pub mod schedule;
pub mod signing;
pub mod ssrf;

pub use dispatch::Dispatcher;

/// Every event type, in documentation order.
pub const EVENT_TYPES: &[&str] = &[
    "message.sent",
    "message.failed",
    "message.unknown",
    "message.delivered",
    "message.undelivered",
    "message.canceled",
    "message.received",
    "verification.approved",
    "verification.max_attempts_reached",
    "verification.expired",
    "verification.canceled",
    "tenant.spend_warning",
];

/// Whether `t` is an event type an endpoint may subscribe to.
pub fn is_event_type(t: &str) -> bool {
    EVENT_TYPES.contains(&t)
}
