//! The in-process caches and the bound on waiting requests.

use crate::cache::CacheSettings;

use super::parse::{DurationVar, Unit, duration, number_or};
use super::{ConfigArgs, ConfigError};

const KEY_CACHE_TTL: DurationVar = DurationVar {
    var: "SENDONCE_KEY_CACHE_TTL",
    old: "SENDONCE_KEY_CACHE_TTL",
    unit: Unit::Secs,
};

pub(super) fn from_args(a: &ConfigArgs, d: &CacheSettings) -> Result<CacheSettings, ConfigError> {
    Ok(CacheSettings {
        key_ttl: duration(KEY_CACHE_TTL, &a.key_cache_ttl, &None, d.key_ttl)?.value,
        replay_entries: number_or(
            "SENDONCE_REPLAY_CACHE_ENTRIES",
            &a.replay_cache_entries,
            d.replay_entries,
        )?,
        max_waiters_per_tenant: number_or(
            "SENDONCE_MAX_WAITERS_PER_TENANT",
            &a.max_waiters_per_tenant,
            d.max_waiters_per_tenant,
        )?,
        ..d.clone()
    })
}
