//! How long messages are kept, and how often the purge runs.

use std::time::Duration;

use super::parse::{DurationVar, Unit, positive_duration};
use super::{ConfigArgs, ConfigError};

#[derive(Clone, Debug)]
pub struct RetentionSettings {
    /// Messages are kept this long, then purged and their keys free again.
    pub period: Duration,
    /// How often the purge runs.
    pub purge_interval: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(30 * 86_400),
            purge_interval: Duration::from_secs(3600),
        }
    }
}

const RETENTION: DurationVar = DurationVar {
    var: "SENDONCE_RETENTION",
    old: "SENDONCE_RETENTION_DAYS",
    unit: Unit::Days,
};
const PURGE_INTERVAL: DurationVar = DurationVar {
    var: "SENDONCE_PURGE_INTERVAL",
    old: "SENDONCE_PURGE_INTERVAL_SECS",
    unit: Unit::Secs,
};

impl RetentionSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        Ok(Self {
            period: positive_duration(RETENTION, &a.retention, &a.retention_days, d.period)?.value,
            purge_interval: positive_duration(
                PURGE_INTERVAL,
                &a.purge_interval,
                &a.purge_interval_secs,
                d.purge_interval,
            )?
            .value,
        })
    }
}
