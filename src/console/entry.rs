//! A timeline's entries and how support reads times and durations: the
//! pieces `decide.rs` and `decide_hooks.rs` both build timelines from.

use std::time::Duration;

use time::OffsetDateTime;
use time::macros::format_description;

/// A time as support reads it: `2026-12-01 14:02:11 UTC`.
pub fn when(t: OffsetDateTime) -> String {
    let f = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    t.to_offset(time::UtcOffset::UTC)
        .format(f)
        .map(|s| format!("{s} UTC"))
        .unwrap_or_else(|_| t.to_string())
}

/// A duration as support reads it: `850 ms`, `12.3 s`, `4 min 10 s`, `3 h 5 min`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{:.1} s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{} h {} min", s / 3600, (s % 3600) / 60)
    }
}

pub(super) fn span(from: OffsetDateTime, to: OffsetDateTime) -> Duration {
    Duration::try_from(to - from).unwrap_or_default()
}

/// What kind of line a timeline entry is (its marker on the page).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Accepted,
    Attempt,
    Retry,
    Routing,
    Reconciliation,
    Receipt,
    Final,
    Webhook,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Accepted => "accepted",
            Kind::Attempt => "attempt",
            Kind::Retry => "retry",
            Kind::Routing => "routing",
            Kind::Reconciliation => "reconciliation",
            Kind::Receipt => "receipt",
            Kind::Final => "final",
            Kind::Webhook => "webhook",
        }
    }
}

/// One line of a message's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at: OffsetDateTime,
    pub kind: Kind,
    pub title: String,
    /// Facts, each shown as "name: value".
    pub facts: Vec<(&'static str, String)>,
}
