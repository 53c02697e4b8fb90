//! A tenant's spend caps, the periods they count in, and the pure decisions
//! around them.

use std::time::Duration;

use time::{Date, Month, OffsetDateTime, Time};

use super::Micros;

/// A tenant's caps; `None`: no cap of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpendCaps {
    /// Most spent per UTC day, in micro-units.
    pub daily: Option<Micros>,
    /// Most spent per UTC month, in micro-units.
    pub monthly: Option<Micros>,
    /// Most messages per UTC day to countries other than the home country.
    pub international_daily_messages: Option<i64>,
}

/// Which cap refused a send (or whose 80 % a send crossed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    Daily,
    Monthly,
    InternationalDailyMessages,
}

impl Cap {
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::Daily => "daily",
            Cap::Monthly => "monthly",
            Cap::InternationalDailyMessages => "international_daily_messages",
        }
    }
}

/// Whether the caps are capping anything at all.
impl SpendCaps {
    pub fn any(&self) -> bool {
        self.daily.is_some()
            || self.monthly.is_some()
            || self.international_daily_messages.is_some()
    }
}

/// The UTC day and month a send at `now` counts in, as the counter rows'
/// keys (`d2026-12-02`, `m2026-12`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    pub day: String,
    pub month: String,
    /// When the day and the month began (for seeding a counter from the
    /// messages already sent in it).
    pub day_start: OffsetDateTime,
    pub month_start: OffsetDateTime,
}

impl Period {
    pub fn at(now: OffsetDateTime) -> Period {
        let now = now.to_offset(time::UtcOffset::UTC);
        let d = now.date();
        let day_start = d.with_time(Time::MIDNIGHT).assume_utc();
        let month_start = first_of(d.year(), d.month())
            .with_time(Time::MIDNIGHT)
            .assume_utc();
        Period {
            day: format!("d{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day()),
            month: format!("m{:04}-{:02}", d.year(), u8::from(d.month())),
            day_start,
            month_start,
        }
    }
}

fn first_of(year: i32, month: Month) -> Date {
    Date::from_calendar_date(year, month, 1).unwrap_or(Date::MIN)
}

/// How long a refusal by `cap` lasts from `now`: until the next UTC day, or
/// the next UTC month for the monthly cap (at least a second).
pub fn retry_after(cap: Cap, now: OffsetDateTime) -> Duration {
    let now = now.to_offset(time::UtcOffset::UTC);
    let d = now.date();
    let next = match cap {
        Cap::Daily | Cap::InternationalDailyMessages => d.next_day().unwrap_or(Date::MAX),
        Cap::Monthly => {
            let (y, m) = match d.month() {
                Month::December => (d.year() + 1, Month::January),
                m => (d.year(), m.next()),
            };
            first_of(y, m)
        }
    };
    let secs = (next.with_time(Time::MIDNIGHT).assume_utc() - now).whole_seconds();
    Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1))
}

/// Whether a total going from `before` to `after` crossed 80 % of `cap`
/// (once per period: totals only grow within one).
pub fn crossed_warning(before: i64, after: i64, cap: i64) -> bool {
    let (b, a, c) = (
        i128::from(before) * 5,
        i128::from(after) * 5,
        i128::from(cap) * 4,
    );
    b < c && a >= c
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn periods_and_their_ends() {
        #[rustfmt::skip]
        let cases = [
            (datetime!(2026-12-02 20:00:00 UTC), Cap::Daily, 4 * 3600, "d2026-12-02", "m2026-12"),
            (datetime!(2026-12-31 23:59:59 UTC), Cap::Monthly, 1, "d2026-12-31", "m2026-12"),
            (datetime!(2026-02-28 00:00:00 UTC), Cap::Monthly, 86_400, "d2026-02-28", "m2026-02"),
            (datetime!(2026-02-28 00:00:00 UTC), Cap::InternationalDailyMessages, 86_400, "d2026-02-28", "m2026-02"),
            // Another offset is the same instant in UTC.
            (datetime!(2026-03-01 01:00:00 +02:00), Cap::Daily, 3600, "d2026-02-28", "m2026-02"),
        ];
        for (now, cap, secs, day, month) in cases {
            assert_eq!(
                retry_after(cap, now),
                Duration::from_secs(secs),
                "{now} {cap:?}"
            );
            let p = Period::at(now);
            assert_eq!((p.day.as_str(), p.month.as_str()), (day, month));
            assert!(p.day_start <= now && p.month_start <= p.day_start);
        }
    }

    #[test]
    fn the_warning_is_crossing_eighty_percent() {
        #[rustfmt::skip]
        let cases = [
            (0, 79, 100, false), (0, 80, 100, true), (79, 81, 100, true), (80, 90, 100, false),
            (10, 100, 100, true), (0, 4, 5, true), (0, 3, 5, false), (0, 0, 0, false),
        ];
        for (before, after, cap, want) in cases {
            assert_eq!(
                crossed_warning(before, after, cap),
                want,
                "{before} {after} {cap}"
            );
        }
    }
}
