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
            provider: ProviderSettings::from_args(a, &d.provider, delivery.provider_timeout)?,
            delivery,
            scheduler: SchedulerSettings::from_args(a, &d.scheduler)?,
            limits: LimitSettings::from_args(a, &d.limits)?,
            retention: RetentionSettings::from_args(a, &d.retention)?,
            log: LogSettings::from_args(a, &d.log),
            caches: caches::from_args(a, &d.caches)?,
            verify: VerifySettings::from_args(a, &d.verify)?,
            webhooks: WebhookSettings::from_args(a, &d.webhooks),
        })
    }
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
