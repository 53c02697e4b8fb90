//! A message's history: `GET /messages/{key}/events` — attempts, failovers,
//! circuit changes and receipts, oldest first, in pages (`limit`, and
//! `cursor` from the previous page's `next_cursor`).

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use time::OffsetDateTime;

use super::page::Page;
use super::{SharedState, Tenant};
use crate::domain::Status;
use crate::error::ApiError;
use crate::store::{AttemptRow, ReceiptRow};

pub fn router() -> Router<SharedState> {
    Router::new().route("/messages/{key}/events", get(list_events))
}

/// One entry of a message's history.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Event {
    Attempt {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        #[serde(flatten)]
        attempt: AttemptRow,
        /// The message's route (`SENDONCE_ROUTES`' prefix, `*` the
        /// default), whose providers the attempt was made along; absent
        /// when the service does not route by destination.
        #[serde(skip_serializing_if = "Option::is_none")]
        route: Option<String>,
    },
    /// The message moved on from provider `from` to `to`.
    Failover {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        from: String,
        to: String,
        reason: String,
        /// As on an attempt: the route it moved along.
        #[serde(skip_serializing_if = "Option::is_none")]
        route: Option<String>,
    },
    /// An answer to this message opened or closed its provider's circuit.
    Circuit {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        provider: String,
        state: &'static str,
        detail: String,
    },
    Receipt {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        provider: String,
        event_id: String,
        provider_status: String,
        status: Option<Status>,
        error_code: Option<String>,
        applied: bool,
    },
}

/// Where an event sits in a message's history: its time, then attempts,
/// routing events (failovers, circuit changes) and receipts at the same
/// instant, then the attempt's number, the routing event's place in the
/// message's routing history or the receipt's arrival order. Pages of `/events` continue after one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    /// Microseconds since the epoch (the precision both databases keep).
    micros: i64,
    /// 0: attempt, 1: routing event, 2: receipt.
    kind: u8,
    /// Attempt number, routing event index or receipt `seq`.
    n: i64,
}

impl Position {
    fn at(t: OffsetDateTime, kind: u8, n: i64) -> Self {
        let micros = i64::try_from(t.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX);
        Position { micros, kind, n }
    }

    fn time(self) -> Option<OffsetDateTime> {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.micros) * 1000).ok()
    }

    /// The opaque cursor a client hands back.
    fn cursor(self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}.{}.{}", self.micros, self.kind, self.n))
    }

    fn from_cursor(cursor: &str) -> Option<Self> {
        if cursor.len() > 64 {
            return None;
        }
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).ok()?).ok()?;
        let mut parts = text.split('.');
        let position = Position {
            micros: parts.next()?.parse().ok()?,
            kind: parts.next()?.parse().ok().filter(|k| *k <= 2)?,
            n: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && position.time().is_some()).then_some(position)
    }
}

/// One page of a message's history: the attempts, routing events and
/// receipts after
/// `after`, oldest first, at most `limit`, and the position to continue
/// from when more remain. `receipts` must hold the receipts after `after`
/// in order (at least `limit + 1` of them if there are that many).
fn page(
    route: Option<&str>,
    attempts: Vec<AttemptRow>,
    routing: Vec<crate::store::MessageEvent>,
    receipts: Vec<ReceiptRow>,
    after: Option<Position>,
    limit: usize,
) -> (Vec<Event>, Option<Position>) {
    let mut events: Vec<(Position, Event)> = Vec::new();
    for (i, e) in routing.into_iter().enumerate() {
        let event = if e.kind == "failover" {
            Event::Failover {
                at: e.at,
                from: e.provider,
                to: e.to_provider.unwrap_or_default(),
                reason: e.detail,
                route: route.map(str::to_string),
            }
        } else {
            Event::Circuit {
                at: e.at,
                provider: e.provider,
                state: if e.kind == "circuit_closed" {
                    "closed"
                } else {
                    "open"
                },
                detail: e.detail,
            }
        };
        // After the attempt that caused it, which started no later.
        let n = i64::try_from(i).unwrap_or(i64::MAX);
        events.push((Position::at(e.at, 1, n), event));
    }
    for a in attempts {
        let at = Position::at(a.started_at, 0, i64::from(a.number));
        events.push((
            at,
            Event::Attempt {
                at: a.started_at,
                attempt: a,
                route: route.map(str::to_string),
            },
        ));
    }
    for r in receipts {
        events.push((
            Position::at(r.received_at, 2, r.seq),
            Event::Receipt {
                at: r.received_at,
                provider: r.provider,
                event_id: r.event_id,
                provider_status: r.provider_status,
                status: r.status,
                error_code: r.error_code,
                applied: r.applied,
            },
        ));
    }
    events.retain(|(p, _)| after.is_none_or(|after| *p > after));
    events.sort_by_key(|(p, _)| *p);
    let more = events.len() > limit;
    events.truncate(limit);
    let next = more.then(|| events.last().map(|(p, _)| *p)).flatten();
    (events.into_iter().map(|(_, e)| e).collect(), next)
}

/// Longest page of `/events`, and the default.
pub const EVENTS_MAX_LIMIT: u32 = 500;
pub const EVENTS_DEFAULT_LIMIT: u32 = 100;

async fn list_events(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (_, record) = super::messages::message_at(&state, tenant_id, key).await?;
    let list = format!("message-events:{}", record.id);
    let paged = Page::of(
        &state,
        tenant_id,
        &list,
        query.as_deref(),
        EVENTS_DEFAULT_LIMIT,
        EVENTS_MAX_LIMIT,
    )
    .await?;
    let after = paged.after_as(|b| Position::from_cursor(std::str::from_utf8(b).ok()?))?;
    let limit = paged.limit;
    // Receipts after the cursor: an attempt position takes every receipt at
    // its instant (receipts come after attempts), a receipt position those
    // after its seq.
    let receipts_after = after.and_then(|p| {
        let seq = if p.kind < 2 { 0 } else { p.n };
        p.time().map(|t| (t, seq))
    });
    let attempts = state.store.attempts(record.id).await?;
    let routing = state.store.message_events(record.id).await?;
    let receipts = state
        .store
        .receipts_after(record.id, receipts_after, limit + 1)
        .await?;
    let (data, next) = page(
        record.route.as_deref(),
        attempts,
        routing,
        receipts,
        after,
        limit as usize,
    );
    Ok(axum::Json(serde_json::json!({
        "data": data,
        "next_cursor": next.map(|p| paged.cursor(p.cursor().as_bytes())),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(number: u32, at: i64) -> AttemptRow {
        AttemptRow {
            number,
            lease_owner: None,
            started_at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
            finished_at: None,
            outcome: None,
            http_status: None,
            provider_code: None,
            error: None,
            provider_message_id: None,
            provider: "twilio".into(),
        }
    }

    fn failover(at: i64) -> crate::store::MessageEvent {
        crate::store::MessageEvent {
            at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
            kind: "failover".into(),
            provider: "twilio".into(),
            to_provider: Some("http".into()),
            detail: "not reachable".into(),
        }
    }

    fn receipt(seq: i64, at: i64) -> ReceiptRow {
        ReceiptRow {
            seq,
            provider: "http".into(),
            event_id: format!("e{seq}"),
            provider_message_id: "p".into(),
            message_id: None,
            provider_status: "sent".into(),
            status: None,
            error_code: None,
            applied: false,
            received_at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
        }
    }

    /// The (kind, n) of each event on a page.
    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Attempt { attempt, .. } => format!("a{}", attempt.number),
                Event::Receipt { event_id, .. } => event_id.clone(),
                Event::Failover { to, .. } => format!("f{to}"),
                Event::Circuit { provider, .. } => format!("c{provider}"),
            })
            .collect()
    }

    #[test]
    fn history_pages_follow_one_order_without_gaps_or_repeats() {
        // Attempt 2, a failover and receipt 2 at the same second: the
        // attempt first, then the failover, then the receipt.
        let attempts = || vec![attempt(1, 10), attempt(2, 20)];
        let routing = || vec![failover(20)];
        let receipts = || vec![receipt(1, 15), receipt(2, 20), receipt(3, 30)];
        let (all, next) = page(None, attempts(), routing(), receipts(), None, 10);
        assert_eq!(names(&all), ["a1", "e1", "a2", "fhttp", "e2", "e3"]);
        assert_eq!(next, None);

        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..10 {
            // As the store would: only receipts after the position.
            let rs: Vec<ReceiptRow> = receipts()
                .into_iter()
                .filter(|r| {
                    after.is_none_or(|p: Position| Position::at(r.received_at, 2, r.seq) > p)
                })
                .collect();
            let (events, next) = page(None, attempts(), routing(), rs, after, 2);
            assert!(events.len() <= 2);
            seen.extend(names(&events));
            let Some(next) = next else { break };
            let round_trip = Position::from_cursor(&next.cursor());
            assert_eq!(round_trip, Some(next));
            after = round_trip;
        }
        assert_eq!(seen, ["a1", "e1", "a2", "fhttp", "e2", "e3"]);
    }

    #[test]
    fn only_our_cursors_are_accepted() {
        let p = Position::at(
            OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            1,
            7,
        );
        assert_eq!(Position::from_cursor(&p.cursor()), Some(p));
        for bad in [
            "",
            "x",
            "not base64!",
            &URL_SAFE_NO_PAD.encode("1.3.3"),
            &URL_SAFE_NO_PAD.encode("1.0"),
            &URL_SAFE_NO_PAD.encode("1.0.1.1"),
            &URL_SAFE_NO_PAD.encode("a.0.1"),
            &"A".repeat(100),
        ] {
            assert_eq!(Position::from_cursor(bad), None, "{bad}");
        }
    }
}
