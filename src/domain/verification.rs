//! What a check, a resend and a start may do: pure functions of the
//! verification's state, the time and the settings, tested as tables.

use std::time::Duration;

use time::OffsetDateTime;

/// A verification's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationStatus {
    Pending,
    Approved,
    Expired,
    MaxAttemptsReached,
    Canceled,
}

impl VerificationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Expired => "expired",
            Self::MaxAttemptsReached => "max_attempts_reached",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "expired" => Self::Expired,
            "max_attempts_reached" => Self::MaxAttemptsReached,
            "canceled" => Self::Canceled,
            _ => return None,
        })
    }
}

/// What the decisions read of a verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub status: VerificationStatus,
    pub expires_at: OffsetDateTime,
    pub checks_remaining: u32,
    pub sends: u32,
    pub last_sent_at: OffsetDateTime,
}

/// The status as of `now`: a pending verification past its expiry is
/// expired whether or not anything wrote that yet.
pub fn status_at(s: &State, now: OffsetDateTime) -> VerificationStatus {
    if s.status == VerificationStatus::Pending && now >= s.expires_at {
        VerificationStatus::Expired
    } else {
        s.status
    }
}

/// What a check does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The right code: approved (answer 200, `valid: true`).
    Approve,
    /// A wrong code with checks left after it (200, `valid: false`).
    Wrong { remaining: u32 },
    /// The last allowed wrong code: `max_attempts_reached` (200, `valid: false`).
    LastWrong,
    /// Past its expiry: written `expired`, answered 409.
    Expire,
    /// No longer pending: nothing changes, 409.
    NotPending(VerificationStatus),
}

/// The code that approves any test-mode verification (issue 27), beside
/// its real code.
pub const TEST_CODE: &str = "000000";

/// Whether `code` is right: the verification's own code (`matches`, asked
/// only when needed), or in test mode (`test`) [`TEST_CODE`] too.
pub fn code_accepted(test: bool, code: &str, matches: impl FnOnce() -> bool) -> bool {
    (test && code == TEST_CODE) || matches()
}

pub fn check(s: &State, now: OffsetDateTime, code_matches: bool) -> Check {
    match status_at(s, now) {
        VerificationStatus::Pending => {}
        VerificationStatus::Expired if s.status == VerificationStatus::Pending => {
            return Check::Expire;
        }
        other => return Check::NotPending(other),
    }
    if s.checks_remaining == 0 {
        // Not reachable through the API (the last wrong check ends it), but
        // the right code must never be accepted without a check left.
        return Check::NotPending(VerificationStatus::MaxAttemptsReached);
    }
    if code_matches {
        Check::Approve
    } else if s.checks_remaining == 1 {
        Check::LastWrong
    } else {
        Check::Wrong {
            remaining: s.checks_remaining - 1,
        }
    }
}

/// What a resend does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// Send once more (send number `sends + 1`).
    Send,
    /// Before the cooldown: 429 `resend-too-soon`, retry after this.
    TooSoon(Duration),
    /// 429 `max-sends-reached`.
    MaxSends,
    /// Past its expiry: written `expired`, answered 409.
    Expire,
    /// 409 `verification-not-pending`.
    NotPending(VerificationStatus),
}

pub fn resend(s: &State, now: OffsetDateTime, cooldown: Duration, max_sends: u32) -> Resend {
    match status_at(s, now) {
        VerificationStatus::Pending => {}
        VerificationStatus::Expired if s.status == VerificationStatus::Pending => {
            return Resend::Expire;
        }
        other => return Resend::NotPending(other),
    }
    if s.sends >= max_sends {
        return Resend::MaxSends;
    }
    let ready = s.last_sent_at + cooldown;
    if now < ready {
        let wait = Duration::try_from(ready - now).unwrap_or(Duration::ZERO);
        return Resend::TooSoon(wait);
    }
    Resend::Send
}

/// When the next resend will be allowed, if one will be.
pub fn resend_available_at(
    s: &State,
    now: OffsetDateTime,
    cooldown: Duration,
    max_sends: u32,
) -> Option<OffsetDateTime> {
    if status_at(s, now) != VerificationStatus::Pending || s.sends >= max_sends {
        return None;
    }
    let at = s.last_sent_at + cooldown;
    (at < s.expires_at).then_some(at)
}

/// The automatic pause of a destination prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PausePolicy {
    /// Concluded starts needed before the rate is judged.
    pub min_starts: u32,
    /// Pause when fewer than this percentage of them were approved.
    pub min_approval_percent: u32,
}

/// Whether a prefix whose recent starts concluded `concluded` times, of
/// which `approved` were approved, is to be paused.
pub fn should_pause(policy: PausePolicy, approved: u64, concluded: u64) -> bool {
    policy.min_starts > 0
        && concluded >= u64::from(policy.min_starts)
        && approved * 100 < u64::from(policy.min_approval_percent) * concluded
}

#[cfg(test)]
mod tests {
    use super::*;
    use VerificationStatus::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

    fn state(status: VerificationStatus, checks: u32, sends: u32) -> State {
        State {
            status,
            expires_at: T0 + time::Duration::minutes(10),
            checks_remaining: checks,
            sends,
            last_sent_at: T0,
        }
    }

    #[test]
    fn check_table() {
        let early = T0 + time::Duration::minutes(1);
        let late = T0 + time::Duration::minutes(10);
        let rows = [
            (state(Pending, 5, 1), early, true, Check::Approve),
            (
                state(Pending, 5, 1),
                early,
                false,
                Check::Wrong { remaining: 4 },
            ),
            (
                state(Pending, 2, 1),
                early,
                false,
                Check::Wrong { remaining: 1 },
            ),
            (state(Pending, 1, 1), early, false, Check::LastWrong),
            (state(Pending, 1, 1), early, true, Check::Approve),
            (
                state(Pending, 0, 1),
                early,
                true,
                Check::NotPending(MaxAttemptsReached),
            ),
            (state(Pending, 5, 1), late, true, Check::Expire),
            (state(Pending, 5, 1), late, false, Check::Expire),
            (
                state(Approved, 5, 1),
                early,
                true,
                Check::NotPending(Approved),
            ),
            (
                state(MaxAttemptsReached, 0, 1),
                early,
                true,
                Check::NotPending(MaxAttemptsReached),
            ),
            (
                state(Canceled, 5, 1),
                early,
                true,
                Check::NotPending(Canceled),
            ),
            (
                state(Expired, 5, 1),
                early,
                true,
                Check::NotPending(Expired),
            ),
            (
                state(Approved, 5, 1),
                late,
                true,
                Check::NotPending(Approved),
            ),
        ];
        for (i, (s, now, ok, want)) in rows.into_iter().enumerate() {
            assert_eq!(check(&s, now, ok), want, "row {i}");
        }
    }

    #[test]
    fn test_mode_code_table() {
        // (test mode, code, the real code matches, accepted)
        #[rustfmt::skip]
        let table = [
            (true, "000000", false, true),
            (true, "000000", true, true),
            (true, "123456", true, true),
            (true, "123456", false, false),
            (true, "0000", false, false),
            (true, "0000000", false, false),
            (false, "000000", false, false),
            (false, "000000", true, true),
            (false, "123456", true, true),
        ];
        for (test, code, real, want) in table {
            assert_eq!(
                code_accepted(test, code, || real),
                want,
                "{test} {code} {real}"
            );
        }
    }

    #[test]
    fn resend_table() {
        let cd = Duration::from_secs(30);
        let at = |s: i64| T0 + time::Duration::seconds(s);
        let rows = [
            (state(Pending, 5, 1), at(30), Resend::Send),
            (
                state(Pending, 5, 1),
                at(10),
                Resend::TooSoon(Duration::from_secs(20)),
            ),
            (state(Pending, 5, 5), at(60), Resend::MaxSends),
            (state(Pending, 5, 4), at(60), Resend::Send),
            // The check counter is not the resend's business.
            (state(Pending, 1, 1), at(60), Resend::Send),
            (state(Pending, 5, 1), at(600), Resend::Expire),
            (state(Approved, 5, 1), at(60), Resend::NotPending(Approved)),
            (state(Canceled, 5, 1), at(60), Resend::NotPending(Canceled)),
            (
                state(MaxAttemptsReached, 0, 1),
                at(60),
                Resend::NotPending(MaxAttemptsReached),
            ),
        ];
        for (i, (s, now, want)) in rows.into_iter().enumerate() {
            assert_eq!(resend(&s, now, cd, 5), want, "row {i}");
        }
        assert_eq!(
            resend_available_at(&state(Pending, 5, 1), at(1), cd, 5),
            Some(at(30))
        );
        assert_eq!(
            resend_available_at(&state(Pending, 5, 5), at(1), cd, 5),
            None
        );
        assert_eq!(
            resend_available_at(&state(Approved, 5, 1), at(1), cd, 5),
            None
        );
        // A cooldown that ends after the expiry offers no resend.
        assert_eq!(
            resend_available_at(&state(Pending, 5, 1), at(1), Duration::from_secs(700), 5),
            None
        );
    }

    #[test]
    fn pause_table() {
        let p = PausePolicy {
            min_starts: 10,
            min_approval_percent: 20,
        };
        let rows = [
            (0, 9, false),  // too few to judge
            (0, 10, true),  // none approved
            (1, 10, true),  // 10 %
            (2, 10, false), // exactly 20 %: not below
            (50, 100, false),
            (19, 100, true),
        ];
        for (approved, concluded, want) in rows {
            assert_eq!(
                should_pause(p, approved, concluded),
                want,
                "{approved}/{concluded}"
            );
        }
        let off = PausePolicy {
            min_starts: 0,
            min_approval_percent: 20,
        };
        assert!(!should_pause(off, 0, 1000));
    }

    #[test]
    fn status_names_round_trip() {
        for s in [Pending, Approved, Expired, MaxAttemptsReached, Canceled] {
            assert_eq!(VerificationStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(VerificationStatus::parse("nope"), None);
    }
}
