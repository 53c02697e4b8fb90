//! The console's decisions as pure functions: what a search box entry is,
//! what a message's history looks like on one time axis, what to tell the
//! customer, when the overview warns, when sign-ins are refused, how a body
//! is masked. Tested as tables in `decide_tests.rs`.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::decide_hooks::webhook_entries;
pub use super::decide_hooks::webhook_state;
use super::entry::span;
pub use super::entry::{Entry, Kind, Zone, human, when, when_in, zone_of};

use crate::domain::{MessageId, Status};
use crate::store::{
    AttemptRow, MessageEvent, MessageRecord, MessageWebhookDelivery, OverviewCounts, ReceiptRow,
};

/// Longest search box entry (an idempotency key is at most 255 characters).
pub const MAX_QUERY: usize = 255;

/// The overview warns when more than this share of the last 24 hours'
/// finished messages failed (`failed`, `unknown` or `undelivered`)...
pub const WARN_FAILURE_RATE: f64 = 0.05;
/// ...and at least this many messages finished (a handful of failures on a
/// quiet day is no alarm).
pub const WARN_MIN_FINISHED: i64 = 10;

/// What a search box entry can name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// `msg_<uuid>`: a message id.
    pub message_id: Option<MessageId>,
    /// A phone number in international form, as E.164.
    pub phone: Option<String>,
    /// The entry as an idempotency key or provider message id (any visible
    /// ASCII, as keys are).
    pub key: Option<String>,
    /// `ver_<uuid>`: a verification id.
    pub verification: Option<Uuid>,
    /// Digits alone (spaces, dashes, dots and parentheses allowed) with no
    /// `+`: a national-format number, read as `phone` only in the tenant's
    /// home country.
    pub national: bool,
}

/// A message id as shown (`msg_` and 32 hex digits).
pub fn parse_message_id(s: &str) -> Option<MessageId> {
    let hex = s.strip_prefix("msg_")?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Uuid::try_parse(hex).ok().map(MessageId)
}

/// Reads a search box entry, a national-format number in `home_country`
/// when the tenant has one: `None` when it is too long or not text a key
/// could be (then it is bad input, a 400).
pub fn classify(q: &str, home_country: Option<&str>) -> Option<Query> {
    let q = q.trim();
    if q.is_empty() || q.len() > MAX_QUERY {
        return None;
    }
    let key = q
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b))
        .then(|| q.to_string());
    let national = crate::domain::phone::is_national(q);
    let phone = crate::domain::phone::parse(q).map(|p| p.e164).or_else(|| {
        home_country
            .filter(|_| national)
            .and_then(|c| crate::domain::phone::national_number(q, c))
    });
    if key.is_none() && phone.is_none() {
        return None;
    }
    Some(Query {
        message_id: parse_message_id(q),
        phone,
        key,
        verification: crate::verify::parse_id(q),
        national,
    })
}

/// A position in a list of messages, newest first: (created at, id),
/// written `<microseconds>.<uuid>` in a `before=` link.
pub fn cursor(at: OffsetDateTime, id: MessageId) -> String {
    format!("{}.{}", at.unix_timestamp_nanos() / 1000, id.0.simple())
}

pub fn parse_cursor(s: &str) -> Option<(OffsetDateTime, MessageId)> {
    let (us, id) = s.split_once('.')?;
    let us: i64 = us.parse().ok()?;
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000).ok()?;
    if id.len() != 32 {
        return None;
    }
    Some((at, MessageId(Uuid::try_parse(id).ok()?)))
}

/// A prefix of a phone number for the opt-out search (`+` then digits, or
/// digits alone, which get the `+`); `None` for anything else.
pub fn number_prefix(q: &str) -> Option<String> {
    let q: String = q
        .trim()
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')'))
        .collect();
    let digits = q.strip_prefix('+').unwrap_or(&q);
    if digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(format!("+{digits}"))
}

/// Words in a body that make its digit runs one-time codes.
const CODE_WORDS: &[&str] = &[
    "code",
    "otp",
    "pin",
    "passcode",
    "password",
    "verification",
    "verify",
    "token",
];

/// The body as the console shows it: a sealed body (a verification's SMS,
/// stored encrypted) is never opened, its masked text is shown; in a body
/// that speaks of a code, every run of 4 to 10 digits is masked.
pub fn masked_body(body: &str) -> String {
    if crate::domain::sealed::is_sealed(body) {
        return crate::domain::sealed::shown_body(body).into_owned();
    }
    let lower = body.to_lowercase();
    let speaks_of_code = lower
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| CODE_WORDS.contains(&w));
    if !speaks_of_code {
        return body.to_string();
    }
    let mut out = String::with_capacity(body.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if (4..=10).contains(&run.len()) {
            out.extend(std::iter::repeat_n('•', run.len()));
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in body.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Everything that happened to one message, on one time axis, oldest first
/// (ties keep the order in which they happened: accepted, attempts with
/// their retries, routing, the final status, receipts, webhook deliveries).
///
/// Webhook deliveries of the message's events (issue 14) are `Kind::Webhook`
/// entries: one per delivery attempt (endpoint, event type, HTTP status or
/// error, duration), then one for where the delivery stands (see
/// [`webhook_state`]). Scheduled sends join here when they land (issue 15: a
/// `Kind::Scheduled` entry before the first attempt).
pub fn timeline(
    m: &MessageRecord,
    attempts: &[AttemptRow],
    routing: &[MessageEvent],
    receipts: &[ReceiptRow],
    webhooks: &[MessageWebhookDelivery],
    zone: Zone,
) -> Vec<Entry> {
    let when = |t| when_in(t, zone);
    let mut out = vec![Entry {
        at: m.created_at,
        kind: Kind::Accepted,
        title: "Accepted".into(),
        facts: vec![
            ("idempotency key", m.idempotency_key.to_string()),
            ("to", m.to.to_string()),
            (
                "segments",
                format!("{} ({})", m.segments, m.encoding.as_str()),
            ),
        ],
    }];
    for (i, a) in attempts.iter().enumerate() {
        let reconciled = a.outcome.as_deref() == Some("reconciled");
        let opted_out = a.outcome.as_deref() == Some("opted_out");
        let mut facts = if opted_out {
            Vec::new()
        } else {
            vec![("provider", a.provider.clone())]
        };
        facts.push((
            "answer",
            a.outcome.clone().unwrap_or_else(|| "no answer yet".into()),
        ));
        if let Some(s) = a.http_status {
            facts.push(("HTTP status", s.to_string()));
        }
        if let Some(c) = &a.provider_code {
            facts.push(("error code", c.clone()));
        }
        if let Some(e) = &a.error {
            facts.push(("error", e.clone()));
        }
        if let Some(f) = a.finished_at {
            facts.push(("duration", human(span(a.started_at, f))));
        }
        if let Some(p) = &a.provider_message_id {
            facts.push(("provider message id", p.clone()));
        }
        out.push(Entry {
            at: a.started_at,
            kind: if reconciled {
                Kind::Reconciliation
            } else {
                Kind::Attempt
            },
            title: if reconciled {
                format!("Reconciled with {} (attempt {})", a.provider, a.number)
            } else if opted_out {
                "Not sent: the recipient opted out (no provider was called)".into()
            } else {
                format!("Attempt {} to {}", a.number, a.provider)
            },
            facts,
        });
        let retried = matches!(
            a.outcome.as_deref(),
            Some("retryable" | "ambiguous" | "lost")
        );
        if retried {
            let (at, title) = match attempts.get(i + 1) {
                Some(next) => (
                    a.finished_at.unwrap_or(a.started_at),
                    format!(
                        "Retried: attempt {} started at {}",
                        next.number,
                        when(next.started_at)
                    ),
                ),
                None => match m.next_attempt_at {
                    Some(due) => (
                        a.finished_at.unwrap_or(a.started_at),
                        format!(
                            "Retry scheduled: attempt {} due at {}",
                            a.number + 1,
                            when(due)
                        ),
                    ),
                    None => continue,
                },
            };
            out.push(Entry {
                at,
                kind: Kind::Retry,
                title,
                facts: Vec::new(),
            });
        }
    }
    for e in routing {
        let title = match (e.kind.as_str(), &e.to_provider) {
            ("failover", Some(to)) => format!("Moved on from {} to {}", e.provider, to),
            ("circuit_opened", _) => format!("Circuit for {} opened", e.provider),
            ("circuit_closed", _) => format!("Circuit for {} closed", e.provider),
            (kind, _) => format!("{kind} ({})", e.provider),
        };
        out.push(Entry {
            at: e.at,
            kind: Kind::Routing,
            title,
            facts: vec![("why", e.detail.clone())],
        });
    }
    if let Some(at) = final_at(m) {
        let mut facts = Vec::new();
        if let Some(err) = &m.error {
            facts.push(("reason", err.message.clone()));
            facts.push(("code", err.code.clone()));
            if let Some(c) = &err.provider_code {
                facts.push(("provider code", c.clone()));
            }
        }
        let status = match m.status {
            Status::Delivered | Status::Undelivered => "sent",
            s => s.as_str(),
        };
        out.push(Entry {
            at,
            kind: Kind::Final,
            title: format!("Final status: {status}"),
            facts,
        });
    }
    for r in receipts {
        let mut facts = vec![
            ("provider status", r.provider_status.clone()),
            (
                "applied",
                if r.applied {
                    "yes: it set the message's status".into()
                } else {
                    "no: the status was already final or it is not a final report".into()
                },
            ),
        ];
        if let Some(c) = &r.error_code {
            facts.push(("error code", c.clone()));
        }
        out.push(Entry {
            at: r.received_at,
            kind: Kind::Receipt,
            title: format!("Receipt from {}: {}", r.provider, r.provider_status),
            facts,
        });
    }
    for d in webhooks {
        out.extend(webhook_entries(d, zone));
    }
    out.sort_by_key(|e| e.at);
    out
}

/// When the message got its final (send) status.
fn final_at(m: &MessageRecord) -> Option<OffsetDateTime> {
    match m.status {
        Status::Processing | Status::Scheduled => None,
        Status::Canceled => Some(m.updated_at),
        Status::Sent | Status::Delivered | Status::Undelivered => m.sent_at.or(Some(m.updated_at)),
        Status::Failed | Status::Unknown => Some(m.updated_at),
    }
}

/// What support should tell the customer, in plain words.
pub fn plain_words(m: &MessageRecord, zone: Zone) -> String {
    let when = |t| when_in(t, zone);
    let sent = m.sent_at.map(when);
    let tries = |n: u32| {
        if n == 1 {
            "once".into()
        } else {
            format!("{n} times")
        }
    };
    match m.status {
        Status::Processing => match m.next_attempt_at {
            Some(due) => format!(
                "Not sent yet: the provider was tried {} without success; sendonce tries again at {}.",
                tries(m.attempts.saturating_sub(1).max(1)),
                when(due)
            ),
            None => "Being sent right now: give it a minute and look again.".into(),
        },
        Status::Scheduled => {
            let due = when(m.next_attempt_at.or(m.send_at).unwrap_or(m.updated_at));
            // Held past its send_at: the tenant's quiet hours where the
            // recipient is.
            if m.send_at.is_some_and(|at| Some(at) == m.next_attempt_at) {
                format!("Not sent yet: it is scheduled to go out at {due}, as requested.")
            } else {
                format!(
                    "Not sent yet: it is held for the quiet hours where the customer is, and goes out at {due}."
                )
            }
        }
        Status::Canceled => format!(
            "Not sent: it was canceled at {}, before anything reached the provider. Nothing reached the phone.",
            when(m.updated_at)
        ),
        Status::Sent => format!(
            "Sent to the carrier at {}; the carrier has not reported delivery yet.",
            sent.unwrap_or_else(|| when(m.updated_at))
        ),
        Status::Delivered => format!(
            "Sent to the carrier at {}; the carrier reported it delivered at {}.",
            sent.unwrap_or_else(|| when(m.updated_at)),
            when(m.delivery_status_at.unwrap_or(m.updated_at))
        ),
        Status::Undelivered => format!(
            "Sent to the carrier at {}; the carrier reported at {} that it could not deliver it to the phone.",
            sent.unwrap_or_else(|| when(m.updated_at)),
            when(m.delivery_status_at.unwrap_or(m.updated_at))
        ),
        Status::Failed => {
            if m.error
                .as_ref()
                .is_some_and(|e| e.code == "recipient_opted_out")
            {
                "Not sent: the number is on the opt-out list (it asked not to be messaged).".into()
            } else {
                format!(
                    "Not sent: {}. Nothing reached the phone.",
                    m.error
                        .as_ref()
                        .map_or("the provider refused it", |e| e.message.as_str())
                )
            }
        }
        Status::Unknown => format!(
            "Unclear: the provider gave no clear answer after {} attempt{}, so the message may or may not have reached the phone. Do not promise either way.",
            m.attempts,
            if m.attempts == 1 { "" } else { "s" }
        ),
    }
}

/// The overview's warning, when the last 24 hours' failures pass the
/// documented threshold ([`WARN_FAILURE_RATE`], [`WARN_MIN_FINISHED`]).
pub fn warning(c: &OverviewCounts) -> Option<String> {
    let (mut finished, mut failed) = (0i64, 0i64);
    for (status, _, n) in &c.by_status_provider {
        match status.as_str() {
            "processing" => {}
            "failed" | "unknown" | "undelivered" => {
                finished += n;
                failed += n;
            }
            _ => finished += n,
        }
    }
    if finished < WARN_MIN_FINISHED {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = failed as f64 / finished as f64;
    (rate > WARN_FAILURE_RATE).then(|| {
        format!(
            "{failed} of {finished} messages in the last 24 hours failed ({:.1} %), above the {:.0} % threshold.",
            rate * 100.0,
            WARN_FAILURE_RATE * 100.0
        )
    })
}

/// Failed sign-ins: at most this many per window per client address (and
/// instance)...
pub const SIGNIN_FAILURES: usize = 10;
/// ...in this window; then that address's sign-ins wait until its oldest
/// failure leaves it.
pub const SIGNIN_WINDOW: Duration = Duration::from_secs(60);

/// Whether a sign-in may be tried now, given the times of the recent
/// failures (oldest first): `Err(wait)` when too many failed within the
/// window.
pub fn signin_allowed(failures: &[OffsetDateTime], now: OffsetDateTime) -> Result<(), Duration> {
    let window = time::Duration::try_from(SIGNIN_WINDOW).unwrap_or(time::Duration::MINUTE);
    let recent: Vec<_> = failures.iter().filter(|t| now - **t < window).collect();
    if recent.len() < SIGNIN_FAILURES {
        return Ok(());
    }
    let oldest = recent.first().map_or(now, |t| **t);
    let wait = Duration::try_from(oldest + window - now).unwrap_or_default();
    Err(wait.max(Duration::from_secs(1)))
}

/// The client a sign-in is counted against: its IPv4 address (an
/// IPv4-mapped IPv6 address counts as the IPv4 one), or the /64 of an IPv6
/// one, since one host is usually given a whole /64.
pub fn signin_peer(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}
