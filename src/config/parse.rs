//! Parsing single values: durations (new humantime variables and their old
//! `_MS`/`_SECS`/`_DAYS` twins), whole numbers and addresses, each error
//! naming the variable.

use std::str::FromStr;
use std::time::Duration;

use super::ConfigError;

/// The unit of an old, suffixed duration variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Secs,
    Days,
}

impl Unit {
    fn of(self, n: u64) -> Duration {
        match self {
            Unit::Millis => Duration::from_millis(n),
            Unit::Secs => Duration::from_secs(n),
            Unit::Days => Duration::from_secs(n.saturating_mul(86_400)),
        }
    }
}

/// A duration setting: its variable, which takes `30s`, `10m`, `1h 30m`,
/// `250ms`, and the older variable that takes a bare number of `unit`.
#[derive(Clone, Copy, Debug)]
pub struct DurationVar {
    pub var: &'static str,
    pub old: &'static str,
    pub unit: Unit,
}

/// A value with the variable it came from (the new one when neither is set),
/// so later checks name what the operator actually wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sourced<T> {
    pub value: T,
    pub var: &'static str,
}

/// An argument that was given and is not blank (a blank variable counts as
/// unset, as `VAR=` in a compose file means "no value").
pub fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|v| !v.trim().is_empty())
}

/// `new` in humantime syntax, else `old` as a number of `spec.unit`, else
/// `default`. Both set is an error: neither silently wins.
pub fn duration(
    spec: DurationVar,
    new: &Option<String>,
    old: &Option<String>,
    default: Duration,
) -> Result<Sourced<Duration>, ConfigError> {
    match (given(new), given(old)) {
        (Some(_), Some(_)) => Err(ConfigError::BothSet {
            var: spec.var,
            old: spec.old,
        }),
        (Some(v), None) => humantime::parse_duration(v.trim())
            .map(|value| Sourced {
                value,
                var: spec.var,
            })
            .map_err(|source| ConfigError::Duration {
                var: spec.var,
                value: v.to_string(),
                source,
            }),
        (None, Some(v)) => Ok(Sourced {
            value: spec.unit.of(number(spec.old, v)?),
            var: spec.old,
        }),
        (None, None) => Ok(Sourced {
            value: default,
            var: spec.var,
        }),
    }
}

/// A duration that must not be zero.
pub fn positive_duration(
    spec: DurationVar,
    new: &Option<String>,
    old: &Option<String>,
    default: Duration,
) -> Result<Sourced<Duration>, ConfigError> {
    let d = duration(spec, new, old, default)?;
    if d.value.is_zero() {
        return Err(ConfigError::invalid(d.var, "must be greater than 0"));
    }
    Ok(d)
}

fn number<T: FromStr<Err = std::num::ParseIntError>>(
    var: &'static str,
    v: &str,
) -> Result<T, ConfigError> {
    v.trim().parse().map_err(|source| ConfigError::Number {
        var,
        value: v.to_string(),
        source,
    })
}

/// A whole number, or `default` when not given.
pub fn number_or<T: FromStr<Err = std::num::ParseIntError>>(
    var: &'static str,
    v: &Option<String>,
    default: T,
) -> Result<T, ConfigError> {
    given(v).map_or(Ok(default), |v| number(var, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: DurationVar = DurationVar {
        var: "SENDONCE_LEASE",
        old: "SENDONCE_LEASE_SECS",
        unit: Unit::Secs,
    };

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn durations_accept_humantime_and_the_old_units() {
        let default = Duration::from_secs(7);
        for (new, old, unit, want, var) in [
            (
                s("30s"),
                None,
                Unit::Secs,
                Duration::from_secs(30),
                LEASE.var,
            ),
            (
                s("10m"),
                None,
                Unit::Secs,
                Duration::from_secs(600),
                LEASE.var,
            ),
            (
                s("1h 30m"),
                None,
                Unit::Secs,
                Duration::from_secs(5400),
                LEASE.var,
            ),
            (
                s("250ms"),
                None,
                Unit::Secs,
                Duration::from_millis(250),
                LEASE.var,
            ),
            (
                s(" 2s "),
                None,
                Unit::Secs,
                Duration::from_secs(2),
                LEASE.var,
            ),
            (
                s("30days"),
                None,
                Unit::Secs,
                Duration::from_secs(30 * 86_400),
                LEASE.var,
            ),
            (
                None,
                s("45"),
                Unit::Secs,
                Duration::from_secs(45),
                LEASE.old,
            ),
            (
                None,
                s("45"),
                Unit::Millis,
                Duration::from_millis(45),
                LEASE.old,
            ),
            (
                None,
                s("2"),
                Unit::Days,
                Duration::from_secs(2 * 86_400),
                LEASE.old,
            ),
            (None, None, Unit::Secs, default, LEASE.var),
            // Blank counts as unset.
            (s(""), s("  "), Unit::Secs, default, LEASE.var),
            (s(""), s("3"), Unit::Secs, Duration::from_secs(3), LEASE.old),
        ] {
            let spec = DurationVar { unit, ..LEASE };
            let got = duration(spec, &new, &old, default)
                .unwrap_or_else(|e| panic!("{new:?} {old:?}: {e}"));
            assert_eq!(got, Sourced { value: want, var }, "{new:?} {old:?}");
        }
    }

    #[test]
    fn bad_durations_are_one_line_naming_the_variable() {
        for (new, old, names) in [
            (s("30"), None, "SENDONCE_LEASE=\"30\" is not a duration"),
            (s("soon"), None, "SENDONCE_LEASE=\"soon\""),
            (s("-5s"), None, "SENDONCE_LEASE=\"-5s\""),
            (s("5 parsecs"), None, "SENDONCE_LEASE=\"5 parsecs\""),
            (
                None,
                s("30s"),
                "SENDONCE_LEASE_SECS=\"30s\" is not a whole number",
            ),
            (None, s("-1"), "SENDONCE_LEASE_SECS=\"-1\""),
            (
                s("30s"),
                s("30"),
                "both SENDONCE_LEASE and SENDONCE_LEASE_SECS are set",
            ),
        ] {
            let err = duration(LEASE, &new, &old, Duration::ZERO).unwrap_err();
            let line = err.to_string();
            assert!(line.contains(names), "{new:?} {old:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
            let has_source = std::error::Error::source(&err).is_some();
            assert_eq!(
                has_source,
                !matches!(err, ConfigError::BothSet { .. }),
                "{line}"
            );
        }
    }

    #[test]
    fn zero_is_refused_where_it_must_be_positive() {
        let err = positive_duration(LEASE, &s("0s"), &None, Duration::ZERO).unwrap_err();
        assert_eq!(err.to_string(), "SENDONCE_LEASE must be greater than 0");
        let err = positive_duration(LEASE, &None, &s("0"), Duration::ZERO).unwrap_err();
        assert_eq!(err.var(), "SENDONCE_LEASE_SECS");
    }

    #[test]
    fn numbers_name_their_variable() {
        assert_eq!(number_or::<u32>("N", &None, 5).unwrap(), 5);
        assert_eq!(number_or::<u32>("N", &s("12"), 5).unwrap(), 12);
        let err = number_or::<u32>("SENDONCE_MAX_SEGMENTS", &s("ten"), 5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "SENDONCE_MAX_SEGMENTS=\"ten\" is not a whole number"
        );
        assert!(std::error::Error::source(&err).is_some());
    }
}
