//! Scheduled sends and cancel: the pure rules, tested as tables.
//!
//! - [`start_at`]: what a request's `send_at` means at the time it arrives
//!   (send now, schedule, or refuse).
//! - [`cancelable`]: whether a message, as its row stands, may be canceled.
//!   The stores write the same rule as the `WHERE` of their one conditional
//!   `UPDATE` (the fence), so a cancel racing a scheduler's claim is decided
//!   by the database, never by a read followed by a write.

use time::{Duration, OffsetDateTime};

use super::quiet::QuietHours;
use super::{FieldError, Status};

/// `send_at` in the fingerprint: RFC 3339 (UTC, as parsed).
pub(crate) mod utc {
    pub use time::serde::rfc3339::option::serialize;
}

/// How far ahead a send may be scheduled (Twilio's limit too).
pub const MAX_AHEAD: Duration = Duration::days(35);

const SEND_AT_FORMAT: &str =
    "must be an RFC 3339 date-time with an offset, e.g. 2026-03-08T09:30:00-05:00";

/// A request's `send_at` and `quiet_hours`, their problems added to `errors`.
pub(crate) fn parse_fields(
    map: &serde_json::Map<String, serde_json::Value>,
    errors: &mut Vec<FieldError>,
) -> (Option<OffsetDateTime>, Option<bool>) {
    let send_at = parse_send_at(map.get("send_at")).unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    let quiet = parse_quiet_hours(map.get("quiet_hours")).unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    (send_at, quiet)
}

/// A request's `send_at` (absent or `null`: none), kept in UTC.
pub(crate) fn parse_send_at(
    v: Option<&serde_json::Value>,
) -> Result<Option<OffsetDateTime>, FieldError> {
    let refused = || FieldError {
        field: "send_at".into(),
        message: SEND_AT_FORMAT.into(),
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(t)) => {
            OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .map(|t| Some(t.to_offset(time::UtcOffset::UTC)))
                .map_err(|_| refused())
        }
        Some(_) => Err(refused()),
    }
}

/// A request's `quiet_hours` (absent or `null`: none given).
pub(crate) fn parse_quiet_hours(v: Option<&serde_json::Value>) -> Result<Option<bool>, FieldError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(FieldError {
            field: "quiet_hours".into(),
            message: "must be true or false".into(),
        }),
    }
}

/// When a request with `send_at` starts: `Ok(None)` sends at once (no
/// `send_at`, or one that is not in the future: "a time in the past means
/// now"), `Ok(Some(t))` is scheduled for `t`, `Err` is a 400 for a time more
/// than [`MAX_AHEAD`] away.
pub fn start_at(
    send_at: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> Result<Option<OffsetDateTime>, FieldError> {
    match send_at {
        None => Ok(None),
        Some(t) if t <= now => Ok(None),
        Some(t) if t - now > MAX_AHEAD => Err(FieldError {
            field: "send_at".into(),
            message: "must be at most 35 days ahead".into(),
        }),
        Some(t) => Ok(Some(t)),
    }
}

/// When a message starts: its `send_at` ([`start_at`], already checked),
/// then moved to the end of the tenant's quiet hours in the recipient's
/// zones when it would fall inside them, unless the request opted out.
/// `None`: at once.
pub fn starts_at(
    due: Option<OffsetDateTime>,
    now: OffsetDateTime,
    quiet: Option<&QuietHours>,
    honour_quiet: bool,
    zones: &[chrono_tz::Tz],
) -> Option<OffsetDateTime> {
    let Some(q) = quiet.filter(|_| honour_quiet) else {
        return due;
    };
    let t = due.unwrap_or(now);
    let released = super::quiet::release_at(q, zones, t);
    if released > t { Some(released) } else { due }
}

/// Whether a message may be canceled: while it is `scheduled`, or
/// `processing` waiting for a retry with no lease (nobody is about to call
/// the provider), no attempt without a recorded answer, and no earlier
/// attempt that may have reached the provider (`maybe_sent`: an ambiguous
/// answer, a 5xx after sending). Never once it is final, and never while an
/// instance holds it: its lease may cover a provider call in flight, and an
/// expired lease means an owner that died perhaps mid-call. A `canceled`
/// answer is a promise that nothing was sent.
pub fn cancelable(status: Status, leased: bool, attempt_open: bool, maybe_sent: bool) -> bool {
    match status {
        Status::Scheduled | Status::Processing => !leased && !attempt_open && !maybe_sent,
        Status::Sent
        | Status::Failed
        | Status::Unknown
        | Status::Delivered
        | Status::Undelivered
        | Status::Canceled => false,
    }
}

/// The SQL form of [`cancelable`] on a message row `m` (both backends),
/// kept next to the function it mirrors.
macro_rules! cancelable_sql {
    () => {
        "(m.status IN ('scheduled', 'processing') AND m.lease_token IS NULL \
          AND NOT m.maybe_sent \
          AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.message_id = m.id \
              AND a.finished_at IS NULL))"
    };
}
pub(crate) use cancelable_sql;

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn send_at_and_quiet_hours_are_parsed_and_part_of_the_fingerprint() {
        let plain =
            crate::domain::SendRequest::parse(br#"{"to":"+14155550100","body":"hi"}"#).unwrap();
        let a = crate::domain::SendRequest::parse(
            br#"{"to":"+14155550100","body":"hi","send_at":"2026-03-08T09:30:00-05:00"}"#,
        )
        .unwrap();
        let same_instant = crate::domain::SendRequest::parse(
            br#"{"to":"+14155550100","body":"hi","send_at":"2026-03-08T14:30:00Z"}"#,
        )
        .unwrap();
        let later = crate::domain::SendRequest::parse(
            br#"{"to":"+14155550100","body":"hi","send_at":"2026-03-08T14:31:00Z"}"#,
        )
        .unwrap();
        let null = crate::domain::SendRequest::parse(
            br#"{"to":"+14155550100","body":"hi","send_at":null}"#,
        )
        .unwrap();
        assert_eq!(
            a.send_at,
            Some(time::macros::datetime!(2026-03-08 14:30 UTC))
        );
        assert_eq!(a.fingerprint(), same_instant.fingerprint());
        assert_ne!(a.fingerprint(), later.fingerprint());
        assert_ne!(a.fingerprint(), plain.fingerprint());
        assert_eq!(null.fingerprint(), plain.fingerprint());
        let urgent = crate::domain::SendRequest::parse(
            br#"{"to":"+14155550100","body":"hi","quiet_hours":false}"#,
        )
        .unwrap();
        assert_eq!(urgent.quiet_hours, Some(false));
        assert_ne!(urgent.fingerprint(), plain.fingerprint());
        for bad in [
            r#"{"to":"+14155550100","body":"hi","send_at":"2026-03-08T09:30:00"}"#,
            r#"{"to":"+14155550100","body":"hi","send_at":"tomorrow"}"#,
            r#"{"to":"+14155550100","body":"hi","send_at":1772980200}"#,
        ] {
            match crate::domain::SendRequest::parse(bad.as_bytes()) {
                Err(crate::domain::request::RequestError::Invalid(e)) => {
                    let fields: Vec<String> = e.into_iter().map(|e| e.field).collect();
                    assert_eq!(fields, vec!["send_at"], "{bad}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn when_a_request_starts() {
        let now = datetime!(2026-03-01 12:00 UTC);
        type Case = (Option<OffsetDateTime>, Result<Option<OffsetDateTime>, ()>);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (None, Ok(None)),
            (Some(now - Duration::days(400)), Ok(None)),
            (Some(now), Ok(None)),
            (Some(now + Duration::seconds(1)), Ok(Some(now + Duration::seconds(1)))),
            (Some(now + MAX_AHEAD), Ok(Some(now + MAX_AHEAD))),
            (Some(now + MAX_AHEAD + Duration::seconds(1)), Err(())),
            (Some(now + Duration::days(365)), Err(())),
        ];
        for (send_at, want) in cases {
            assert_eq!(start_at(send_at, now).map_err(|_| ()), want, "{send_at:?}");
        }
    }

    #[test]
    fn quiet_hours_move_the_start() {
        let now = datetime!(2026-03-01 13:00 UTC); // 22:00 in Tokyo
        let q = QuietHours::parse("21:00-08:00").expect("window");
        let tokyo = [chrono_tz::Asia::Tokyo];
        let morning = datetime!(2026-03-01 23:00 UTC); // 08:00 in Tokyo
        let noon = datetime!(2026-03-02 03:00 UTC); // 12:00 in Tokyo
        type Case<'a> = (
            Option<OffsetDateTime>,
            Option<&'a QuietHours>,
            bool,
            Option<OffsetDateTime>,
        );
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (None, None, true, None),
            (None, Some(&q), true, Some(morning)),
            // "quiet_hours": false sends at once.
            (None, Some(&q), false, None),
            // A send_at inside the window waits for its end too.
            (Some(now + Duration::hours(1)), Some(&q), true, Some(morning)),
            (Some(noon), Some(&q), true, Some(noon)),
            (Some(noon), None, true, Some(noon)),
        ];
        for (due, quiet, honour, want) in cases {
            assert_eq!(
                starts_at(due, now, quiet, honour, &tokyo),
                want,
                "{due:?} {honour}"
            );
        }
        // A number with no known zone is not held.
        assert_eq!(starts_at(None, now, Some(&q), true, &[]), None);
    }

    #[test]
    fn who_may_be_canceled() {
        // (status, leased, attempt open, maybe sent, cancelable)
        #[rustfmt::skip]
        let cases = [
            (Status::Scheduled, false, false, false, true),
            // A retry waiting, nothing in flight, nothing maybe sent.
            (Status::Processing, false, false, false, true),
            // A retry waiting after an ambiguous answer (a 5xx after the
            // provider sent, with Retry-After): it may be on the phone, so
            // `canceled` would not be true (issue 24, finding 7).
            (Status::Processing, false, false, true, false),
            // Leased: an attempt is starting or running (or its owner died
            // mid-call: the lease expired but is still on the row).
            (Status::Processing, true, false, false, false),
            (Status::Processing, true, true, false, false),
            // Released by a shutdown with an attempt unanswered: the
            // provider may have it.
            (Status::Processing, false, true, false, false),
            (Status::Scheduled, true, false, false, false),
            (Status::Sent, false, false, false, false),
            (Status::Failed, false, false, false, false),
            (Status::Unknown, false, false, false, false),
            (Status::Delivered, false, false, false, false),
            (Status::Undelivered, false, false, false, false),
            (Status::Canceled, false, false, false, false),
        ];
        for (status, leased, open, maybe_sent, want) in cases {
            assert_eq!(
                cancelable(status, leased, open, maybe_sent),
                want,
                "{status:?} {leased} {open}"
            );
        }
    }
}
