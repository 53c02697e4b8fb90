//! Abuse limits: request and send rates, message size.

use std::time::Duration;

use crate::ratelimit::{Limits, Rate};

use super::parse::number_or;
use super::{ConfigArgs, ConfigError};

#[derive(Clone, Debug)]
pub struct LimitSettings {
    /// Per tenant, per destination number and per destination prefix.
    pub rates: Limits,
    /// Most SMS segments one message may take.
    pub max_segments: u32,
}

const HOUR: Duration = Duration::from_secs(3600);

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            rates: Limits {
                // 100 per second steady, 200 in a burst.
                tenant: Rate {
                    capacity: 200,
                    per: Duration::from_secs(2),
                },
                number: Rate {
                    capacity: 10,
                    per: HOUR,
                },
                // 10,000 numbers share a prefix; 1,000 new SMS an hour to
                // them (docs/configuration.md, "Why these limits").
                prefix: Rate {
                    capacity: 1000,
                    per: HOUR,
                },
            },
            max_segments: 10,
        }
    }
}

/// A per-hour limit (0: none).
fn hourly(n: u32) -> Rate {
    if n == 0 {
        Rate::UNLIMITED
    } else {
        Rate {
            capacity: n,
            per: HOUR,
        }
    }
}

/// The count per hour of an hourly rate (0: none).
fn per_hour(r: Rate) -> u32 {
    if r.is_unlimited() {
        0
    } else {
        (f64::from(r.capacity) * HOUR.as_secs_f64() / r.per.as_secs_f64()).round() as u32
    }
}

/// A tenant rate's steady requests per second and burst (0, 0: none).
fn rps_and_burst(r: Rate) -> (u32, u32) {
    if r.is_unlimited() {
        (0, 0)
    } else {
        let rps = (f64::from(r.capacity) / r.per.as_secs_f64()).round() as u32;
        (rps, r.capacity)
    }
}

/// A steady rate with a burst: the bucket holds `burst` and refills at `rps`.
fn tenant_rate(rps: u32, burst: u32) -> Result<Rate, ConfigError> {
    if rps == 0 {
        return Ok(Rate::UNLIMITED);
    }
    if burst < rps {
        return Err(ConfigError::invalid(
            "SENDONCE_RATE_TENANT_BURST",
            "must not be below SENDONCE_RATE_TENANT_RPS",
        ));
    }
    Ok(Rate {
        capacity: burst,
        per: Duration::from_secs_f64(f64::from(burst) / f64::from(rps)),
    })
}

impl LimitSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        let tenant = if a.rate_tenant_rps.is_none() && a.rate_tenant_burst.is_none() {
            d.rates.tenant
        } else {
            let (rps, burst) = rps_and_burst(d.rates.tenant);
            tenant_rate(
                number_or("SENDONCE_RATE_TENANT_RPS", &a.rate_tenant_rps, rps)?,
                number_or("SENDONCE_RATE_TENANT_BURST", &a.rate_tenant_burst, burst)?,
            )?
        };
        let hourly_or = |var, v: &Option<String>, default: Rate| -> Result<Rate, ConfigError> {
            match v {
                None => Ok(default),
                Some(_) => Ok(hourly(number_or(var, v, per_hour(default))?)),
            }
        };
        let max_segments = number_or("SENDONCE_MAX_SEGMENTS", &a.max_segments, d.max_segments)?;
        if max_segments == 0 {
            return Err(ConfigError::invalid(
                "SENDONCE_MAX_SEGMENTS",
                "must be at least 1",
            ));
        }
        Ok(Self {
            rates: Limits {
                tenant,
                number: hourly_or(
                    "SENDONCE_RATE_NUMBER_PER_HOUR",
                    &a.rate_number_per_hour,
                    d.rates.number,
                )?,
                prefix: hourly_or(
                    "SENDONCE_RATE_PREFIX_PER_HOUR",
                    &a.rate_prefix_per_hour,
                    d.rates.prefix,
                )?,
            },
            max_segments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_tenant_rate_is_100_per_second_with_bursts_of_200() {
        let d = LimitSettings::default();
        assert_eq!(rps_and_burst(d.rates.tenant), (100, 200));
        assert_eq!(tenant_rate(100, 200).unwrap(), d.rates.tenant);
        assert_eq!(per_hour(d.rates.number), 10);
        assert_eq!(per_hour(d.rates.prefix), 1000);
    }
}
