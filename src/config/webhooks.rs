//! Webhook deliveries.

use std::time::Duration;

use super::ConfigArgs;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `SENDONCE_WEBHOOK_ALLOW_PRIVATE`: allow endpoints on loopback,
    /// private, link-local and metadata addresses, and plain `http` (tests,
    /// local setups). Off: `https` to public addresses only.
    pub allow_private: bool,
    /// How often each instance looks for due deliveries.
    pub poll_interval: Duration,
    /// A delivery's lease (longer than `timeout`: an attempt never outlives it).
    pub lease: Duration,
    /// Connecting to a receiver.
    pub connect_timeout: Duration,
    /// A whole attempt: connect, send, answer.
    pub timeout: Duration,
    /// Most deliveries one instance makes at once.
    pub concurrency: u32,
    /// Most deliveries in flight to one endpoint, over every instance.
    pub per_endpoint: u32,
    /// Most deliveries in flight for one tenant, over every instance.
    pub per_tenant: u32,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            allow_private: false,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            concurrency: 32,
            per_endpoint: 4,
            per_tenant: 8,
        }
    }
}

impl WebhookSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Self {
        Self {
            allow_private: a.webhook_allow_private || d.allow_private,
            ..d.clone()
        }
    }
}
