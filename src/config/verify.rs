//! Verifications (one-time codes): the secret codes are stored under, the
//! check and resend rules, and the SMS-pumping defence.

use std::time::Duration;

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError};

/// The verify secret: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct VerifySecret(pub Vec<u8>);

impl std::fmt::Debug for VerifySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VerifySecret(<redacted>)")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct VerifySettings {
    /// `SENDONCE_VERIFY_SECRET`; `None`: one generated on first use and kept
    /// in the database.
    pub secret: Option<VerifySecret>,
    /// Checks per verification (the last wrong one ends it).
    pub max_checks: u32,
    /// Least time between two sends of one verification.
    pub resend_cooldown: Duration,
    /// Most sends of one verification, the first included.
    pub max_sends: u32,
    /// A destination prefix is paused when fewer than this percentage of its
    /// recent concluded verifications were approved...
    pub pause_min_approval_percent: u32,
    /// ...once at least this many concluded (0: never pause).
    pub pause_min_starts: u32,
    /// "Recent": started within this window.
    pub pause_window: Duration,
    /// How long a pause lasts.
    pub pause_duration: Duration,
}

impl Default for VerifySettings {
    fn default() -> Self {
        Self {
            secret: None,
            max_checks: 5,
            resend_cooldown: Duration::from_secs(30),
            max_sends: 5,
            pause_min_approval_percent: 20,
            pause_min_starts: 20,
            pause_window: Duration::from_secs(3600),
            pause_duration: Duration::from_secs(3600),
        }
    }
}

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

fn no_old(var: &'static str) -> DurationVar {
    // These variables are new: they have no older, suffixed twin.
    DurationVar {
        var,
        old: var,
        unit: Unit::Secs,
    }
}

impl VerifySettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        let secret = match given(&a.verify_secret) {
            None => d.secret.clone(),
            Some(s) if s.len() < MIN_SECRET_LEN => {
                return Err(ConfigError::invalid(
                    "SENDONCE_VERIFY_SECRET",
                    "must be at least 32 characters (e.g. `openssl rand -hex 32`)",
                ));
            }
            Some(s) => Some(VerifySecret(s.as_bytes().to_vec())),
        };
        let at_least_one = |var, v: &Option<String>, default: u32| {
            let n = number_or(var, v, default)?;
            if n == 0 {
                return Err(ConfigError::invalid(var, "must be at least 1"));
            }
            Ok(n)
        };
        let max_checks = at_least_one(
            "SENDONCE_VERIFY_MAX_CHECKS",
            &a.verify_max_checks,
            d.max_checks,
        )?;
        let max_sends = at_least_one(
            "SENDONCE_VERIFY_MAX_SENDS",
            &a.verify_max_sends,
            d.max_sends,
        )?;
        let percent = number_or(
            "SENDONCE_VERIFY_PAUSE_MIN_APPROVAL_PERCENT",
            &a.verify_pause_min_approval_percent,
            d.pause_min_approval_percent,
        )?;
        if percent > 100 {
            return Err(ConfigError::invalid(
                "SENDONCE_VERIFY_PAUSE_MIN_APPROVAL_PERCENT",
                "must be between 0 and 100",
            ));
        }
        let none = None;
        Ok(Self {
            secret,
            max_checks,
            resend_cooldown: super::parse::duration(
                no_old("SENDONCE_VERIFY_RESEND_COOLDOWN"),
                &a.verify_resend_cooldown,
                &none,
                d.resend_cooldown,
            )?
            .value,
            max_sends,
            pause_min_approval_percent: percent,
            pause_min_starts: number_or(
                "SENDONCE_VERIFY_PAUSE_MIN_STARTS",
                &a.verify_pause_min_starts,
                d.pause_min_starts,
            )?,
            pause_window: positive_duration(
                no_old("SENDONCE_VERIFY_PAUSE_WINDOW"),
                &a.verify_pause_window,
                &none,
                d.pause_window,
            )?
            .value,
            pause_duration: positive_duration(
                no_old("SENDONCE_VERIFY_PAUSE_DURATION"),
                &a.verify_pause_duration,
                &none,
                d.pause_duration,
            )?
            .value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<VerifySettings, ConfigError> {
        let cli = super::super::Cli::try_parse_from(
            std::iter::once("sendonce").chain(args.iter().copied()),
        )
        .expect("arguments parse");
        VerifySettings::from_args(&cli.config, &VerifySettings::default())
    }

    #[test]
    fn verify_settings_parse_and_refuse_bad_values() {
        assert_eq!(parse(&[]).unwrap(), VerifySettings::default());
        let s = parse(&[
            "--verify-max-checks",
            "3",
            "--verify-resend-cooldown",
            "1m",
            "--verify-secret",
            "0123456789abcdef0123456789abcdef",
        ])
        .unwrap();
        assert_eq!(s.max_checks, 3);
        assert_eq!(s.resend_cooldown, Duration::from_secs(60));
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
        assert!(parse(&["--verify-secret", "short"]).is_err());
        assert!(parse(&["--verify-max-sends", "0"]).is_err());
        assert!(parse(&["--verify-pause-min-approval-percent", "101"]).is_err());
        assert!(parse(&["--verify-pause-window", "0s"]).is_err());
    }
}
