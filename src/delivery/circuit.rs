//! The circuit breaker of one provider: pure functions of its stored state,
//! what just happened and the time, shared by every instance through the
//! store (writes are compare-and-set on the version).
//!
//! | state       | event                          | next state                        |
//! |-------------|--------------------------------|-----------------------------------|
//! | closed      | the provider works             | closed, run of failures reset     |
//! | closed      | a failure, run < `failures`    | closed, run + 1 (a run older than |
//! |             |                                | `window` starts again at 1)       |
//! | closed      | a failure, run = `failures`    | open                              |
//! | open        | `open_for` passed, a send      | half-open: that send is the probe |
//! | half-open   | the probe's provider works     | closed                            |
//! | half-open   | the probe fails                | open again, from now              |
//! | half-open   | no answer for `open_for`       | another send may probe            |
//! | open        | a late answer: works           | closed                            |
//! | open        | a late failure                 | open (unchanged)                  |
//!
//! "The provider works" is an acceptance or a refusal of the message itself;
//! a failure is anything else (not reachable, 429/5xx, a refusal of the
//! account, no clear answer): see [`SendOutcome::provider_works`].
//!
//! [`SendOutcome::provider_works`]: crate::provider::SendOutcome::provider_works

use std::time::Duration;

use time::OffsetDateTime;

use crate::clock::to_time;
use crate::store::{Circuit, CircuitState};

/// When a circuit opens and how long it stays open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CircuitPolicy {
    /// Failures in a row that open the circuit (0: never opens).
    pub failures: u32,
    /// A run of failures counts only while it is younger than this.
    pub window: Duration,
    /// How long the circuit stays open before one send probes the provider
    /// (and how long a probe may go unanswered before another may try).
    pub open_for: Duration,
    /// How long an instance's copy of the circuits is used before it is read
    /// again from the store.
    pub refresh: Duration,
}

impl Default for CircuitPolicy {
    fn default() -> Self {
        Self {
            failures: 5,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(30),
            refresh: Duration::from_secs(1),
        }
    }
}

/// What a send may do with a provider now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Send.
    Pass,
    /// The circuit is open but due for a probe: send if the probe is won.
    Probe,
    /// The circuit is open: send elsewhere.
    Blocked,
}

/// What a send may do with the provider of circuit `c` at `now`.
pub fn gate(c: &Circuit, now: OffsetDateTime, policy: &CircuitPolicy) -> Gate {
    let since = |t: Option<OffsetDateTime>| t.is_none_or(|t| now >= t + to_time(policy.open_for));
    match c.state {
        CircuitState::Closed => Gate::Pass,
        CircuitState::Open if since(c.opened_at) => Gate::Probe,
        CircuitState::HalfOpen if since(c.probe_started_at) => Gate::Probe,
        CircuitState::Open | CircuitState::HalfOpen => Gate::Blocked,
    }
}

/// `c` with its probe taken at `now` (written compare-and-set: one sender
/// wins it).
pub fn take_probe(c: &Circuit, now: OffsetDateTime) -> Circuit {
    bumped(
        Circuit {
            state: CircuitState::HalfOpen,
            probe_started_at: Some(now),
            ..c.clone()
        },
        now,
    )
}

/// `c` after a send's answer: `works` is whether the provider works. The
/// same circuit (same version) when nothing changes.
pub fn after(c: &Circuit, works: bool, now: OffsetDateTime, policy: &CircuitPolicy) -> Circuit {
    if works {
        if c.state == CircuitState::Closed && c.failures == 0 {
            return c.clone();
        }
        return bumped(
            Circuit {
                state: CircuitState::Closed,
                failures: 0,
                window_started_at: None,
                opened_at: None,
                probe_started_at: None,
                ..c.clone()
            },
            now,
        );
    }
    match c.state {
        CircuitState::Open => c.clone(),
        CircuitState::HalfOpen => bumped(
            Circuit {
                state: CircuitState::Open,
                opened_at: Some(now),
                probe_started_at: None,
                ..c.clone()
            },
            now,
        ),
        CircuitState::Closed => {
            let fresh = c
                .window_started_at
                .is_none_or(|start| now - start > to_time(policy.window));
            let (failures, window_started_at) = if fresh || c.failures == 0 {
                (1, Some(now))
            } else {
                (c.failures.saturating_add(1), c.window_started_at)
            };
            let opens = policy.failures > 0 && failures >= policy.failures;
            bumped(
                Circuit {
                    state: if opens {
                        CircuitState::Open
                    } else {
                        CircuitState::Closed
                    },
                    failures,
                    window_started_at,
                    opened_at: opens.then_some(now),
                    probe_started_at: None,
                    ..c.clone()
                },
                now,
            )
        }
    }
}

fn bumped(c: Circuit, now: OffsetDateTime) -> Circuit {
    Circuit {
        version: c.version + 1,
        updated_at: now,
        ..c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2026-01-01 00:00 UTC);

    fn policy() -> CircuitPolicy {
        CircuitPolicy {
            failures: 3,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(30),
            refresh: Duration::ZERO,
        }
    }

    fn at(secs: i64) -> OffsetDateTime {
        T0 + time::Duration::seconds(secs)
    }

    fn run(events: &[(i64, bool)]) -> Circuit {
        let mut c = Circuit::closed("p", T0);
        for &(t, works) in events {
            c = after(&c, works, at(t), &policy());
        }
        c
    }

    #[test]
    fn transitions() {
        let p = policy();
        // (what happened, state after, run of failures)
        type Row<'a> = (&'a [(i64, bool)], CircuitState, u32);
        let table: &[Row<'_>] = &[
            (&[], CircuitState::Closed, 0),
            (&[(0, false)], CircuitState::Closed, 1),
            (&[(0, false), (1, false)], CircuitState::Closed, 2),
            (&[(0, false), (1, false), (2, false)], CircuitState::Open, 3),
            // A success ends the run.
            (
                &[(0, false), (1, false), (2, true), (3, false)],
                CircuitState::Closed,
                1,
            ),
            // A run older than the window starts again.
            (
                &[(0, false), (1, false), (12, false)],
                CircuitState::Closed,
                1,
            ),
            // Late failures leave an open circuit as it is; a late success closes it.
            (
                &[(0, false), (1, false), (2, false), (3, false)],
                CircuitState::Open,
                3,
            ),
            (
                &[(0, false), (1, false), (2, false), (3, true)],
                CircuitState::Closed,
                0,
            ),
        ];
        for (events, state, failures) in table {
            let c = run(events);
            assert_eq!((c.state, c.failures), (*state, *failures), "{events:?}");
        }
        // Nothing changes, nothing is written: the version stays.
        assert_eq!(after(&run(&[]), true, at(5), &p).version, 0);
        assert_eq!(run(&[(0, false)]).version, 1);
    }

    #[test]
    fn gates_and_probes() {
        let p = policy();
        let open = run(&[(0, false), (1, false), (2, false)]);
        let table = [
            (Circuit::closed("p", T0), 0, Gate::Pass),
            (open.clone(), 3, Gate::Blocked),
            (open.clone(), 31, Gate::Blocked),
            (open.clone(), 32, Gate::Probe),
            (take_probe(&open, at(32)), 33, Gate::Blocked),
            // A probe that never answered: another may try.
            (take_probe(&open, at(32)), 62, Gate::Probe),
        ];
        for (c, t, want) in table {
            assert_eq!(gate(&c, at(t), &p), want, "{c:?} at {t}");
        }
        let probing = take_probe(&open, at(32));
        assert_eq!(probing.version, open.version + 1);
        let closed = after(&probing, true, at(33), &p);
        assert_eq!((closed.state, closed.failures), (CircuitState::Closed, 0));
        let reopened = after(&probing, false, at(33), &p);
        assert_eq!(reopened.state, CircuitState::Open);
        assert_eq!(reopened.opened_at, Some(at(33)));
        assert_eq!(gate(&reopened, at(40), &p), Gate::Blocked);
    }

    #[test]
    fn zero_failures_never_opens() {
        let p = CircuitPolicy {
            failures: 0,
            ..policy()
        };
        let mut c = Circuit::closed("p", T0);
        for t in 0..10 {
            c = after(&c, false, at(t), &p);
        }
        assert_eq!(c.state, CircuitState::Closed);
    }
}
