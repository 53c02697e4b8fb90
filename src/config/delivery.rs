//! Delivery: retries, the lease, provider call bounds, concurrency, and how
//! often each instance scans for due work.

use std::time::Duration;

use crate::delivery::{DeliverySettings, RetryPolicy};

use super::parse::{DurationVar, Unit, duration, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError};

/// The default delivery settings (the group's type lives in `delivery`).
pub(super) fn default_delivery() -> DeliverySettings {
    DeliverySettings {
        retry: RetryPolicy::default(),
        lease: Duration::from_secs(30),
        provider_timeout: Duration::from_secs(10),
        max_concurrent_sends: 64,
        max_queued_sends: 1024,
        spare_send_slots: None,
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerSettings {
    /// How often each instance looks for due retries and expired leases.
    pub poll_interval: Duration,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
        }
    }
}

const fn var(var: &'static str, old: &'static str, unit: Unit) -> DurationVar {
    DurationVar { var, old, unit }
}
const PROVIDER_TIMEOUT: DurationVar = var(
    "SENDONCE_PROVIDER_TIMEOUT",
    "SENDONCE_PROVIDER_TIMEOUT_MS",
    Unit::Millis,
);
const RETRY_BASE: DurationVar = var(
    "SENDONCE_RETRY_BASE",
    "SENDONCE_RETRY_BASE_MS",
    Unit::Millis,
);
const RETRY_CAP: DurationVar = var("SENDONCE_RETRY_CAP", "SENDONCE_RETRY_CAP_MS", Unit::Millis);
const RETRY_DEADLINE: DurationVar = var(
    "SENDONCE_RETRY_DEADLINE",
    "SENDONCE_RETRY_DEADLINE_SECS",
    Unit::Secs,
);
const RETRY_AFTER_MAX: DurationVar = var(
    "SENDONCE_RETRY_AFTER_MAX",
    "SENDONCE_RETRY_AFTER_MAX_SECS",
    Unit::Secs,
);
const LEASE: DurationVar = var("SENDONCE_LEASE", "SENDONCE_LEASE_SECS", Unit::Secs);
const POLL_INTERVAL: DurationVar = var(
    "SENDONCE_POLL_INTERVAL",
    "SENDONCE_POLL_INTERVAL_MS",
    Unit::Millis,
);

pub(super) fn delivery_from_args(
    a: &ConfigArgs,
    d: &DeliverySettings,
) -> Result<DeliverySettings, ConfigError> {
    let provider_timeout = positive_duration(
        PROVIDER_TIMEOUT,
        &a.provider_timeout,
        &a.provider_timeout_ms,
        d.provider_timeout,
    )?;
    let lease = positive_duration(LEASE, &a.lease, &a.lease_secs, d.lease)?;
    if lease.value < provider_timeout.value * 2 + Duration::from_secs(2) {
        return Err(ConfigError::invalid(
            lease.var,
            format!(
                "must be at least twice {} plus 2 s, so a lease always outlives a provider call",
                provider_timeout.var
            ),
        ));
    }
    let base = positive_duration(RETRY_BASE, &a.retry_base, &a.retry_base_ms, d.retry.base)?;
    let cap = positive_duration(RETRY_CAP, &a.retry_cap, &a.retry_cap_ms, d.retry.cap)?;
    if cap.value < base.value {
        return Err(ConfigError::invalid(
            cap.var,
            format!("must not be below {}", base.var),
        ));
    }
    let max_attempts = number_or(
        "SENDONCE_RETRY_MAX_ATTEMPTS",
        &a.retry_max_attempts,
        d.retry.max_attempts,
    )?;
    if max_attempts == 0 {
        return Err(ConfigError::invalid(
            "SENDONCE_RETRY_MAX_ATTEMPTS",
            "must be at least 1",
        ));
    }
    let max_concurrent_sends = number_or(
        "SENDONCE_MAX_CONCURRENT_SENDS",
        &a.max_concurrent_sends,
        d.max_concurrent_sends,
    )?;
    if max_concurrent_sends == 0 {
        return Err(ConfigError::invalid(
            "SENDONCE_MAX_CONCURRENT_SENDS",
            "must be at least 1",
        ));
    }
    let max_queued_sends = number_or(
        "SENDONCE_MAX_QUEUED_SENDS",
        &a.max_queued_sends,
        d.max_queued_sends,
    )?;
    let spare_send_slots = match given(&a.spare_send_slots) {
        None => d.spare_send_slots,
        Some(_) => Some(number_or(
            "SENDONCE_SPARE_SEND_SLOTS",
            &a.spare_send_slots,
            0,
        )?),
    };
    if spare_send_slots.is_some_and(|n| n >= max_concurrent_sends) {
        return Err(ConfigError::invalid(
            "SENDONCE_SPARE_SEND_SLOTS",
            "must be below SENDONCE_MAX_CONCURRENT_SENDS: a tenant alone needs a slot",
        ));
    }
    Ok(DeliverySettings {
        retry: RetryPolicy {
            base: base.value,
            cap: cap.value,
            max_attempts,
            deadline: positive_duration(
                RETRY_DEADLINE,
                &a.retry_deadline,
                &a.retry_deadline_secs,
                d.retry.deadline,
            )?
            .value,
            max_retry_after: duration(
                RETRY_AFTER_MAX,
                &a.retry_after_max,
                &a.retry_after_max_secs,
                d.retry.max_retry_after,
            )?
            .value,
        },
        lease: lease.value,
        provider_timeout: provider_timeout.value,
        max_concurrent_sends,
        max_queued_sends,
        spare_send_slots,
    })
}

impl SchedulerSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        Ok(Self {
            poll_interval: positive_duration(
                POLL_INTERVAL,
                &a.poll_interval,
                &a.poll_interval_ms,
                d.poll_interval,
            )?
            .value,
        })
    }
}
