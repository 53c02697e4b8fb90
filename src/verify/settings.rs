//! What verifications are configured with. The settings live with the
//! verifications; `config::verify` reads them from the environment.

use std::time::Duration;

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
    /// A destination country is paused, for the tenant, when as few of its
    /// recent concluded verifications were approved, once at least this
    /// many concluded across all its prefixes (0: never). Pumping spreads
    /// over many ranges of one country, each under `pause_min_starts`.
    pub pause_country_min_starts: u32,
    /// Verifications started per destination prefix per hour (0: no
    /// limit). Its own setting: a prefix's one-time codes are what SMS
    /// pumping aims at, so it stays at the old 100 while ordinary messages
    /// per prefix (`SENDONCE_RATE_PREFIX_PER_HOUR`) got 1,000.
    pub starts_per_prefix_per_hour: u32,
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
            pause_country_min_starts: 100,
            starts_per_prefix_per_hour: 100,
            pause_window: Duration::from_secs(3600),
            pause_duration: Duration::from_secs(3600),
        }
    }
}

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 32;
