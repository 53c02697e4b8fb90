//! Routes that react to measured quality (`SENDONCE_ROUTE_QUALITY*`,
//! issue 43): whether, over which window, and the thresholds.

use std::time::Duration;

pub use crate::delivery::quality::QualitySettings;
use crate::delivery::quality::Thresholds;

use super::parse::{given, number_or};
use super::{ConfigArgs, ConfigError};

fn duration(var: &'static str, v: &Option<String>, d: Duration) -> Result<Duration, ConfigError> {
    let Some(v) = given(v) else { return Ok(d) };
    let parsed = humantime::parse_duration(v.trim()).map_err(|source| ConfigError::Duration {
        var,
        value: v.to_string(),
        source,
    })?;
    if parsed.is_zero() {
        return Err(ConfigError::invalid(var, "must be greater than 0"));
    }
    Ok(parsed)
}

/// A share written as a percentage (`15%`, or `15`), within `range`
/// percent.
fn percent(
    var: &'static str,
    v: &Option<String>,
    d: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<f64, ConfigError> {
    let Some(v) = given(v) else { return Ok(d) };
    let n: f64 = v.trim().trim_end_matches('%').trim().parse().map_err(|_| {
        ConfigError::invalid(var, format!("{v:?} is not a percentage: write e.g. 15%"))
    })?;
    if !n.is_finite() || !range.contains(&n) {
        return Err(ConfigError::invalid(
            var,
            format!("must be between {}% and {}%", range.start(), range.end()),
        ));
    }
    Ok(n / 100.0)
}

/// Reads the `SENDONCE_ROUTE_QUALITY*` settings over the defaults `d`.
pub(super) fn from_args(
    a: &ConfigArgs,
    d: &QualitySettings,
) -> Result<QualitySettings, ConfigError> {
    let on = match given(&a.route_quality).map(|v| v.trim().to_ascii_lowercase()) {
        None => d.on,
        Some(v) if v == "on" => true,
        Some(v) if v == "off" => false,
        Some(_) => {
            return Err(ConfigError::invalid(
                "SENDONCE_ROUTE_QUALITY",
                "must be on or off",
            ));
        }
    };
    let t = &d.thresholds;
    let every = duration(
        "SENDONCE_ROUTE_QUALITY_EVERY",
        &a.route_quality_every,
        d.every,
    )?;
    if every > Duration::from_secs(30) {
        return Err(ConfigError::invalid(
            "SENDONCE_ROUTE_QUALITY_EVERY",
            "must be at most 30s: quality is evaluated at least every 30 seconds",
        ));
    }
    let prefer_cheaper = match given(&a.route_quality_prefer_cheaper) {
        None => t.prefer_cheaper,
        Some(v) if v.trim().eq_ignore_ascii_case("off") => None,
        Some(_) => Some(percent(
            "SENDONCE_ROUTE_QUALITY_PREFER_CHEAPER",
            &a.route_quality_prefer_cheaper,
            0.0,
            0.0..=50.0,
        )?),
    };
    let min_samples: u32 = number_or(
        "SENDONCE_ROUTE_QUALITY_MIN_SAMPLES",
        &a.route_quality_min_samples,
        t.min_samples,
    )?;
    if min_samples == 0 {
        return Err(ConfigError::invalid(
            "SENDONCE_ROUTE_QUALITY_MIN_SAMPLES",
            "must be at least 1",
        ));
    }
    Ok(QualitySettings {
        on,
        window: duration(
            "SENDONCE_ROUTE_QUALITY_WINDOW",
            &a.route_quality_window,
            d.window,
        )?,
        every,
        thresholds: Thresholds {
            slow_share: percent(
                "SENDONCE_ROUTE_QUALITY_SLOW_SHARE",
                &a.route_quality_slow_share,
                t.slow_share,
                1.0..=100.0,
            )?,
            slow_after: duration(
                "SENDONCE_ROUTE_QUALITY_SLOW_AFTER",
                &a.route_quality_slow_after,
                t.slow_after,
            )?,
            gap: percent(
                "SENDONCE_ROUTE_QUALITY_GAP",
                &a.route_quality_gap,
                t.gap,
                1.0..=100.0,
            )?,
            min_samples,
            cooldown: duration(
                "SENDONCE_ROUTE_QUALITY_COOLDOWN",
                &a.route_quality_cooldown,
                t.cooldown,
            )?,
            floor: percent(
                "SENDONCE_ROUTE_QUALITY_FLOOR",
                &a.route_quality_floor,
                t.floor,
                1.0..=50.0,
            )?,
            prefer_cheaper,
        },
    })
}
