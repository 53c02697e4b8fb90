//! What follows a delivery attempt: a pure function of the attempt's answer,
//! its number and a random draw, tested as a table.
//!
//! | answer | next |
//! |---|---|
//! | any 2xx | `Succeeded` |
//! | `410 Gone` | `Disable`: the endpoint is disabled, its pending deliveries canceled |
//! | anything else (other status, timeout, refused, TLS, DNS) | `Retry` after [`SCHEDULE`]`[n-1]` ± 20 % jitter, or `GiveUp` after the last |
//!
//! The schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 20 h: ten
//! attempts over about three days (71 h 35 min without jitter).

use std::time::Duration;

/// Delay after attempt `n` failed is `SCHEDULE[n - 1]`; after the last one
/// the delivery is given up.
pub const SCHEDULE: [Duration; 9] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(14 * 3600),
    Duration::from_secs(20 * 3600),
    Duration::from_secs(20 * 3600),
];

/// Most attempts of one delivery.
pub const MAX_ATTEMPTS: u32 = SCHEDULE.len() as u32 + 1;

/// How one attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The receiver answered with this status.
    Status(u16),
    /// No answer: connection refused, DNS, TLS, timeout.
    NoAnswer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Succeeded,
    /// Try again after this long.
    Retry(Duration),
    /// The schedule is over.
    GiveUp,
    /// `410 Gone`: the receiver asked to be left alone.
    Disable,
}

/// What follows attempt number `attempt` (1-based) that ended with `answer`;
/// `draw` in [0, 1) picks the jitter.
pub fn next(answer: Answer, attempt: u32, draw: f64) -> Next {
    match answer {
        Answer::Status(s) if (200..300).contains(&s) => Next::Succeeded,
        Answer::Status(410) => Next::Disable,
        _ => match SCHEDULE.get(attempt.saturating_sub(1) as usize) {
            Some(base) if attempt >= 1 => Next::Retry(jittered(*base, draw)),
            _ => Next::GiveUp,
        },
    }
}

/// `base` moved by up to ±20 %.
fn jittered(base: Duration, draw: f64) -> Duration {
    let draw = if draw.is_finite() {
        draw.clamp(0.0, 1.0)
    } else {
        0.5
    };
    base.mul_f64(0.8 + 0.4 * draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_table() {
        let s = Duration::from_secs;
        let table: &[(Answer, u32, f64, Next)] = &[
            (Answer::Status(200), 1, 0.5, Next::Succeeded),
            (Answer::Status(204), 10, 0.5, Next::Succeeded),
            (Answer::Status(299), 3, 0.5, Next::Succeeded),
            (Answer::Status(410), 1, 0.5, Next::Disable),
            (Answer::Status(410), 10, 0.5, Next::Disable),
            (Answer::Status(500), 1, 0.5, Next::Retry(s(5))),
            (Answer::Status(404), 1, 0.0, Next::Retry(s(4))),
            (Answer::Status(301), 1, 1.0, Next::Retry(s(6))),
            (Answer::NoAnswer, 2, 0.5, Next::Retry(s(300))),
            (Answer::Status(429), 4, 0.5, Next::Retry(s(7200))),
            (Answer::Status(503), 9, 0.5, Next::Retry(s(72000))),
            (Answer::Status(503), 10, 0.5, Next::GiveUp),
            (Answer::NoAnswer, 11, 0.5, Next::GiveUp),
            (Answer::NoAnswer, 0, 0.5, Next::GiveUp),
            (Answer::NoAnswer, 1, f64::NAN, Next::Retry(s(5))),
        ];
        for (answer, attempt, draw, expected) in table {
            assert_eq!(
                next(*answer, *attempt, *draw),
                *expected,
                "{answer:?} attempt {attempt} draw {draw}"
            );
        }
    }

    #[test]
    fn the_schedule_lasts_about_three_days() {
        let total: Duration = SCHEDULE.iter().sum();
        let hours = total.as_secs_f64() / 3600.0;
        assert!((70.0..74.0).contains(&hours), "{hours} h");
        assert_eq!(MAX_ATTEMPTS, 10);
        // Never shrinking, and the jitter keeps each step within ±20 %.
        assert!(SCHEDULE.windows(2).all(|w| w[0] <= w[1]));
        for (i, base) in SCHEDULE.iter().enumerate() {
            let n = u32::try_from(i + 1).unwrap();
            for draw in [0.0, 0.3, 0.999] {
                let Next::Retry(d) = next(Answer::NoAnswer, n, draw) else {
                    panic!("attempt {n} must be retried");
                };
                assert!(d >= base.mul_f64(0.8) && d <= base.mul_f64(1.2));
            }
        }
    }
}
