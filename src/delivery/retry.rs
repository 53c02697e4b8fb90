//! When to try again, and when to stop.
//!
//! Delays are exponential with full jitter: the ceiling for attempt n is
//! `min(cap, base * 2^(n-1))` and the delay is uniform in `[0, ceiling]`, which
//! spreads a burst of failures out instead of retrying them in lockstep. The
//! ceilings come from `backon`'s exponential schedule; we draw the jitter
//! ourselves because backon's jitter adds to the delay rather than spreading
//! it, and because our retries are durable (a due time on the row, resumed by
//! any instance from the recorded attempt number) rather than a loop in one
//! task's memory. A provider's `Retry-After` is honoured, clamped to a maximum
//! so a hostile or broken answer cannot park a message for days.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rand::Rng;

#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Ceiling of the first retry's delay.
    pub base: Duration,
    /// Largest delay between two attempts.
    pub cap: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// No attempt starts later than this after the message was accepted.
    pub deadline: Duration,
    /// Largest `Retry-After` honoured.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(60),
            max_attempts: 6,
            deadline: Duration::from_secs(15 * 60),
            max_retry_after: Duration::from_secs(15 * 60),
        }
    }
}

impl RetryPolicy {
    /// The ceiling of the delay after attempt `attempt` (1-based) failed.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let steps = attempt.max(1) as usize;
        ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_max_delay(self.cap)
            .with_factor(2.0)
            .with_max_times(steps)
            .build()
            .take(steps)
            .last()
            // backon multiplies in f32: round its float noise away.
            .map_or(self.cap, |d| {
                Duration::from_millis((d.as_secs_f64() * 1000.0).round() as u64)
            })
    }

    /// The delay before the next attempt after attempt `attempt` failed,
    /// honouring the provider's `Retry-After` when it gave one.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(ra) => ra.min(self.max_retry_after),
            None => {
                let ceiling = self.ceiling(attempt);
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rand::rng().random_range(0..=nanos))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let p = policy();
        assert_eq!(p.ceiling(1), Duration::from_millis(100));
        assert_eq!(p.ceiling(2), Duration::from_millis(200));
        assert_eq!(p.ceiling(3), Duration::from_millis(400));
        assert_eq!(p.ceiling(4), Duration::from_millis(800));
        assert_eq!(p.ceiling(5), Duration::from_secs(1));
        assert_eq!(p.ceiling(30), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_the_ceiling_and_varies() {
        let p = policy();
        let delays: Vec<Duration> = (0..200).map(|_| p.delay(3, None)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(400)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "full jitter should spread delays");
    }

    #[test]
    fn retry_after_wins_but_is_clamped() {
        let p = policy();
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(120))),
            Duration::from_secs(120)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(10 * 86_400))),
            p.max_retry_after
        );
    }
}
