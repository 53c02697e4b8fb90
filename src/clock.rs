//! The wall clock the service reads for timestamps and due times.
//!
//! Every comparison of "now" with a retry's due time is made with a time this
//! clock produced and passed to the store as a parameter, so a test can move
//! time forward by hand (`Clock::manual`) and watch a `Retry-After: 120` take
//! effect without waiting for it. Leases are not on this clock: their expiry
//! is written and compared in the database's clock only, so a skewed (or
//! hand-moved) clock can neither steal nor shorten one; see
//! docs/architecture.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use time::OffsetDateTime;

/// A source of the current time. Cheap to clone; clones share a manual offset.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<ManualTime>>,
}

#[derive(Debug)]
struct ManualTime {
    /// Nanoseconds since the Unix epoch.
    now_nanos: AtomicI64,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self { manual: None }
    }

    /// A clock that stands still at `start` until [`Clock::advance`] moves it.
    pub fn manual(start: OffsetDateTime) -> Self {
        let nanos = i64::try_from(start.unix_timestamp_nanos()).unwrap_or(i64::MAX);
        Self {
            manual: Some(Arc::new(ManualTime {
                now_nanos: AtomicI64::new(nanos),
            })),
        }
    }

    /// Whether this is a hand-moved clock (tests).
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// The current time, truncated to microseconds (what Postgres stores), so a
    /// value read back compares equal to the one written.
    pub fn now(&self) -> OffsetDateTime {
        let now = match &self.manual {
            None => OffsetDateTime::now_utc(),
            Some(m) => OffsetDateTime::from_unix_timestamp_nanos(i128::from(
                m.now_nanos.load(Ordering::SeqCst),
            ))
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        };
        truncate_to_micros(now)
    }

    /// Moves a manual clock forward. A no-op on the system clock.
    pub fn advance(&self, by: Duration) {
        if let Some(m) = &self.manual {
            let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
            m.now_nanos.fetch_add(by, Ordering::SeqCst);
        }
    }
}

/// Drops sub-microsecond precision.
pub fn truncate_to_micros(t: OffsetDateTime) -> OffsetDateTime {
    let micros = t.nanosecond() / 1_000 * 1_000;
    t.replace_nanosecond(micros).unwrap_or(t)
}

/// `std::time::Duration` as `time::Duration`, saturating.
pub fn to_time(d: Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let start = time::macros::datetime!(2026-01-01 00:00:00 UTC);
        let clock = Clock::manual(start);
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(120));
        assert_eq!(clock.now(), start + time::Duration::seconds(120));
        let shared = clock.clone();
        shared.advance(Duration::from_millis(1));
        assert_eq!(clock.now(), start + time::Duration::milliseconds(120_001));
    }
}

/// A point on this host's clock that goes on counting while the system is
/// suspended (`CLOCK_BOOTTIME` on Linux; elsewhere the monotonic clock), for
/// lease ages. `Instant` stands still during a suspend, so a task put to
/// sleep with its host would wake up believing a lease written before the
/// suspend is still fresh, and call the provider after another instance
/// took the message over (docs/model.md, finding 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(std::time::Duration);

impl Stamp {
    pub fn now() -> Self {
        Stamp(since_boot())
    }

    /// How long ago this was (zero if the clock went back).
    pub fn elapsed(&self) -> std::time::Duration {
        since_boot().saturating_sub(self.0)
    }
}

#[cfg(target_os = "linux")]
fn since_boot() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is handed.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    match (rc, u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec)) {
        (0, Ok(secs), Ok(nanos)) => std::time::Duration::new(secs, nanos),
        _ => monotonic(),
    }
}

#[cfg(not(target_os = "linux"))]
fn since_boot() -> std::time::Duration {
    monotonic()
}

/// The monotonic clock, from the first time it was read in this process.
#[cfg_attr(target_os = "linux", allow(dead_code))]
fn monotonic() -> std::time::Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}
