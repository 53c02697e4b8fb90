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

/// The zone the console shows a tenant's times in: its home country's
/// main zone (the first of [`crate::domain::quiet::zones_for`]'s, the
/// capital's), `None` (UTC) with no home country or one the table lacks.
pub type Zone = Option<chrono_tz::Tz>;

/// The main zone of `country` (ISO 3166-1 alpha-2), see [`Zone`].
pub fn zone_of(country: Option<&str>) -> Zone {
    let country = country?;
    crate::domain::quiet::zones_for("", Some(country))
        .first()
        .copied()
}

/// A time as support reads it in `zone`: `2026-12-01 17:02:11 +03`
/// (the tz database's abbreviation, e.g. `EST`), or as [`when`] in UTC.
pub fn when_in(t: OffsetDateTime, zone: Zone) -> String {
    let Some(tz) = zone else {
        return when(t);
    };
    use chrono::{Datelike, Timelike};
    match chrono::DateTime::from_timestamp(t.unix_timestamp(), 0) {
        Some(utc) => {
            let local = utc.with_timezone(&tz);
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02} {}",
                local.year(),
                local.month(),
                local.day(),
                local.hour(),
                local.minute(),
                local.second(),
                local.offset()
            )
        }
        None => when(t),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_in_the_home_countrys_main_zone() {
        let t = time::macros::datetime!(2026-12-01 14:02:11.5 UTC);
        assert_eq!(when_in(t, zone_of(Some("SA"))), "2026-12-01 17:02:11 +03");
        assert_eq!(when_in(t, zone_of(Some("AE"))), "2026-12-01 18:02:11 +04");
        assert_eq!(when_in(t, zone_of(Some("US"))), "2026-12-01 09:02:11 EST");
        assert_eq!(when_in(t, zone_of(None)), "2026-12-01 14:02:11 UTC");
        assert_eq!(zone_of(Some("ZZ")), None);
    }
}
