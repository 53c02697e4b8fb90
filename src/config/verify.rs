//! Verifications (one-time codes): the secret codes are stored under, the
//! check and resend rules, and the SMS-pumping defence.

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError};

pub use crate::verify::settings::{MIN_SECRET_LEN, VerifySecret, VerifySettings};

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
            pause_country_min_starts: number_or(
                "SENDONCE_VERIFY_PAUSE_COUNTRY_MIN_STARTS",
                &a.verify_pause_country_min_starts,
                d.pause_country_min_starts,
            )?,
            starts_per_prefix_per_hour: number_or(
                "SENDONCE_VERIFY_STARTS_PER_PREFIX_PER_HOUR",
                &a.verify_starts_per_prefix_per_hour,
                d.starts_per_prefix_per_hour,
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
    use std::time::Duration;

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
        assert_eq!(parse(&[]).unwrap().pause_country_min_starts, 100);
        let off = parse(&["--verify-pause-country-min-starts", "0"]).unwrap();
        assert_eq!(off.pause_country_min_starts, 0);
        assert!(parse(&["--verify-pause-country-min-starts", "many"]).is_err());
    }
}
