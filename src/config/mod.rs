//! Configuration: environment variables and matching `--flags`, validated once
//! at start into [`Settings`], grouped by concern (server, database, provider,
//! delivery, scheduler, limits, retention, log). `Settings::default()` holds
//! every default; an unset variable keeps it. An invalid value stops the
//! process with a [`ConfigError`] naming the variable.

mod caches;
mod cli;
mod database;
mod delivery;
mod error;
mod limits;
pub mod parse;
mod provider;
pub mod quality;
mod retention;
mod server;
mod verify;
mod webhooks;

pub use cli::{
    AdapterArgs, Cli, Command, ConfigArgs, KeyCommand, LogFormat, Pooler, ReceiptsCommand,
    SendersCommand, TenantCommand,
};
pub use database::{Backend, DatabaseSettings, redact_url};
pub use delivery::SchedulerSettings;
pub use error::{BoxError, ConfigError};
pub use limits::LimitSettings;
pub use provider::{ProviderConfig, ProviderSettings};
pub use retention::RetentionSettings;
pub use server::{ConnectionLimits, ServerSettings, WaitSettings};
pub use verify::{VerifySecret, VerifySettings};
pub use webhooks::WebhookSettings;

use crate::delivery::DeliverySettings;

/// Everything an instance is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub provider: ProviderSettings,
    /// Retries, lease, provider call bound, concurrency.
    pub delivery: DeliverySettings,
    pub scheduler: SchedulerSettings,
    pub limits: LimitSettings,
    pub retention: RetentionSettings,
    pub log: LogSettings,
    /// API-key and replay caches, waiters.
    pub caches: crate::cache::CacheSettings,
    /// Verifications (one-time codes).
    pub verify: VerifySettings,
    /// Webhook deliveries.
    pub webhooks: WebhookSettings,
    /// The price table messages' costs are estimated with (`SENDONCE_PRICES`).
    pub prices: std::sync::Arc<crate::spend::Prices>,
}

/// The only place defaults live: what an empty environment and command line
/// give.
impl Default for Settings {
    fn default() -> Self {
        Self {
            server: ServerSettings::default(),
            database: DatabaseSettings::default(),
            provider: ProviderSettings::default(),
            delivery: delivery::default_delivery(),
            scheduler: SchedulerSettings::default(),
            limits: LimitSettings::default(),
            retention: RetentionSettings::default(),
            log: LogSettings::default(),
            caches: crate::cache::CacheSettings::default(),
            verify: VerifySettings::default(),
            webhooks: WebhookSettings::default(),
            prices: std::sync::Arc::default(),
        }
    }
}

impl Settings {
    /// Parses and checks every argument; what is not given keeps its default.
    pub fn from_args(a: &ConfigArgs) -> Result<Settings, ConfigError> {
        let d = Settings::default();
        let delivery = delivery::delivery_from_args(a, &d.delivery)?;
        Ok(Settings {
            server: ServerSettings::from_args(a, &d.server)?,
            database: DatabaseSettings::from_args(a, &d.database)?,
            provider: ProviderSettings::from_args(
                a,
                &d.provider,
                delivery.provider_timeout,
                delivery.retry.deadline,
            )?,
            delivery,
            scheduler: SchedulerSettings::from_args(a, &d.scheduler)?,
            limits: LimitSettings::from_args(a, &d.limits)?,
            retention: RetentionSettings::from_args(a, &d.retention)?,
            log: LogSettings::from_args(a, &d.log),
            caches: caches::from_args(a, &d.caches)?,
            verify: VerifySettings::from_args(a, &d.verify)?,
            webhooks: WebhookSettings::from_args(a, &d.webhooks),
            prices: prices_from_args(a, d.prices)?,
        })
    }
}

/// The price table of `SENDONCE_PRICES` (a file's path), or the default.
fn prices_from_args(
    a: &ConfigArgs,
    d: std::sync::Arc<crate::spend::Prices>,
) -> Result<std::sync::Arc<crate::spend::Prices>, ConfigError> {
    let Some(path) = a.prices.as_deref().map(str::trim).filter(|p| !p.is_empty()) else {
        return Ok(d);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::invalid("SENDONCE_PRICES", format!("cannot read {path:?}: {e}"))
    })?;
    crate::spend::Prices::parse(&text)
        .map(std::sync::Arc::new)
        .map_err(|e| ConfigError::invalid("SENDONCE_PRICES", format!("{path:?} is refused: {e}")))
}

impl ConfigArgs {
    /// [`Settings::from_args`].
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        Settings::from_args(self)
    }
}

/// Logging.
#[derive(Clone, Debug, Default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// Log message bodies (off: a body may be a one-time code).
    pub bodies: bool,
}

impl LogSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Self {
        Self {
            format: a.log_format.unwrap_or(d.format),
            bodies: a.log_bodies || d.bodies,
        }
    }
}

#[cfg(test)]
mod tests;

/// The bootstrap key docker-compose.yml publishes for its demo.
pub const DEMO_BOOTSTRAP_KEY: &str = "so_demo-key-change-me-0000000000";
/// The receipt secret docker-compose.yml publishes for its demo (the http
/// adapter's endpoint warns of it).
pub use crate::provider::http::receipts::DEMO_RECEIPT_SECRET;

impl Settings {
    /// What an operator should hear at start, though it is allowed: the
    /// demo's published key or receipt secret, and `/metrics` with
    /// `/readyz`'s details served to anyone who reaches the API's port.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.server.bootstrap_api_key.as_deref() == Some(DEMO_BOOTSTRAP_KEY) {
            out.push(
                "SENDONCE_BOOTSTRAP_API_KEY is the demo key published in docker-compose.yml: \
                 anyone can use it; set your own and revoke this one"
                    .to_string(),
            );
        }
        out.extend(self.provider.receipts.warnings());
        for p in self.provider.all() {
            out.extend(p.warnings());
        }
        if self.server.metrics_listen.is_none() {
            out.push(
                "/metrics (message volumes) and /readyz's details (the database's host and \
                 role) are served on the API's listener to anyone who reaches it: set \
                 SENDONCE_METRICS_LISTEN to a private address to serve them only there"
                    .to_string(),
            );
        }
        out
    }
}
