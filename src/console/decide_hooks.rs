//! A message's webhook deliveries as timeline entries (pure, with
//! [`super::decide`]'s table tests).

use super::entry::{Entry, Kind, Zone, human, span, when_in};
use crate::store::MessageWebhookDelivery;

/// Where a webhook delivery stands, as the last line of its entries: when
/// the next attempt is due, `delivered`, `given up` or `endpoint disabled`.
pub fn webhook_state(d: &MessageWebhookDelivery, zone: Zone) -> String {
    let when = |t| when_in(t, zone);
    let gone = d.attempts.last().is_some_and(|a| a.outcome == "gone");
    match d.status.as_str() {
        "pending" => match (d.next_attempt_at, d.attempts.len()) {
            (Some(due), 0) => format!("first attempt due at {}", when(due)),
            (Some(due), n) => format!("attempt {} due at {}", n + 1, when(due)),
            (None, _) => "waiting".into(),
        },
        "succeeded" => "delivered".into(),
        "failed" if gone => "endpoint disabled".into(),
        "failed" => format!(
            "given up after {} attempt{}",
            d.attempts.len(),
            if d.attempts.len() == 1 { "" } else { "s" }
        ),
        "canceled" => "endpoint disabled".into(),
        other => other.to_string(),
    }
}

/// A delivery's entries: one per attempt, titled by its result ("Webhook
/// delivered to …", "Webhook failed …"), the last one saying where the
/// delivery stands when it is not delivered; a delivery without attempts
/// is one entry saying where it stands.
pub(super) fn webhook_entries(d: &MessageWebhookDelivery, zone: Zone) -> Vec<Entry> {
    let mut facts = vec![("event", d.event_type.clone()), ("endpoint", d.url.clone())];
    let disabled = match (d.endpoint_enabled, &d.endpoint_disabled_reason) {
        (false, Some(r)) => Some(("endpoint disabled", r.clone())),
        _ => None,
    };
    let Some(last) = d.attempts.last() else {
        facts.extend(disabled);
        let at = match d.status.as_str() {
            "pending" => d.event_at,
            _ => d.updated_at,
        };
        return vec![Entry {
            at,
            kind: Kind::Webhook,
            title: format!("Webhook to {}: {}", d.url, webhook_state(d, zone)),
            facts,
        }];
    };
    let mut out = Vec::with_capacity(d.attempts.len());
    for a in &d.attempts {
        let mut facts = facts.clone();
        facts.push(("attempt", a.number.to_string()));
        if let Some(s) = a.http_status {
            facts.push(("HTTP status", s.to_string()));
        }
        if let Some(e) = &a.error {
            facts.push(("error", e.clone()));
        }
        facts.push(("duration", human(span(a.started_at, a.finished_at))));
        let title = match (a.outcome.as_str(), a.http_status) {
            ("succeeded", _) => format!("Webhook delivered to {}", d.url),
            (_, Some(s)) => format!("Webhook failed: HTTP {s}"),
            (_, None) => "Webhook failed: no answer".into(),
        };
        if std::ptr::eq(a, last) {
            if d.status != "succeeded" {
                facts.push(("then", webhook_state(d, zone)));
            }
            facts.extend(disabled.clone());
        }
        out.push(Entry {
            at: a.started_at,
            kind: Kind::Webhook,
            title,
            facts,
        });
    }
    out
}
