//! Why a configuration was refused: one variant per kind of mistake, each
//! naming the variable, with the underlying parse error as its source.

use std::net::AddrParseError;
use std::num::ParseIntError;

/// A boxed source error (URL parse errors and the like).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An invalid configuration. `Display` is one line naming the variable; the
/// cause, if any, is the `source()` (print it with `{:#}` through anyhow).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}={value:?} is not a duration like 30s, 10m, 1h 30m or 250ms")]
    Duration {
        var: &'static str,
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("{var}={value:?} is not a whole number")]
    Number {
        var: &'static str,
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error("{var}={value:?} is not a socket address like 127.0.0.1:8080")]
    Address {
        var: &'static str,
        value: String,
        #[source]
        source: AddrParseError,
    },
    #[error("{var} is not {expected}")]
    Url {
        var: &'static str,
        expected: &'static str,
        #[source]
        source: Option<BoxError>,
    },
    #[error("both {var} and {old} are set; set only {var} (it takes a duration like 30s)")]
    BothSet {
        var: &'static str,
        old: &'static str,
    },
    #[error("{needed_by} needs {var}")]
    Missing {
        var: &'static str,
        needed_by: &'static str,
    },
    #[error("{var} {reason}")]
    Invalid { var: &'static str, reason: String },
}

impl ConfigError {
    /// The variable the error is about.
    pub fn var(&self) -> &'static str {
        match self {
            ConfigError::Duration { var, .. }
            | ConfigError::Number { var, .. }
            | ConfigError::Address { var, .. }
            | ConfigError::Url { var, .. }
            | ConfigError::BothSet { var, .. }
            | ConfigError::Missing { var, .. }
            | ConfigError::Invalid { var, .. } => var,
        }
    }

    pub(crate) fn invalid(var: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            var,
            reason: reason.into(),
        }
    }
}
