//! Which provider a message goes to: a pure function on top of [`decide`].
//!
//! A message starts on the first provider (the primary) and only ever moves
//! forward in the configured order. It moves on to the next provider whose
//! circuit lets a send through only when the current one certainly did not
//! send it, and nothing earlier may have been sent:
//!
//! | what happened (nothing earlier maybe sent)    | next provider? | transition          |
//! |-----------------------------------------------|----------------|---------------------|
//! | about to send, current circuit open           | yes            | move on (no call)   |
//! | about to send, current circuit open           | no             | proceed (as `decide`)|
//! | retryable (not reachable, 429, 503 + R-A)     | yes            | move on             |
//! | refused (bad credentials, suspended account)  | yes            | move on             |
//! | ambiguous                                     | any            | reconcile / retry on|
//! |                                               |                | the same provider   |
//! | ambiguous, reconciled `NotSent`               | yes            | move on             |
//! | ambiguous, reconciled `Answered` refused or   | yes            | move on             |
//! | retryable (the provider shows it did not act) |                |                     |
//! | ambiguous, reconciled `Unknown`               | any            | final `unknown`     |
//! | rejected (invalid number, opted out, ...)     | any            | final `failed`      |
//! | accepted, reconciled `Sent`                   | any            | final `sent`        |
//! | retries exhausted / past validity or deadline | any            | as `decide`         |
//! | an earlier attempt may have been sent         | any            | as `decide`         |
//!
//! Everything else is what [`decide`] says, on the current provider.

use time::OffsetDateTime;

use super::RetryPolicy;
use super::decide::{Event, KeyRule, Snapshot, Step, Transition, Write, decide, too_late};
use crate::provider::{Reconciled, SendOutcome};

/// Where the message is and where it could go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route<'a> {
    /// The provider the message is on.
    pub current: &'a str,
    /// The current provider's circuit is open (and its probe not ours).
    pub current_open: bool,
    /// The next provider in order whose circuit lets a send through.
    pub next: Option<&'a str>,
}

/// The transition `event` leads to, routing included.
pub fn route(
    snap: &Snapshot,
    event: &Event<'_>,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    keys: KeyRule,
    r: &Route<'_>,
) -> Transition {
    let t = decide(snap, event, now, policy, keys);
    // Something earlier may have been sent: another provider could send it
    // a second time.
    if snap.maybe_sent {
        return t;
    }
    let Some(next) = r.next else {
        return t;
    };
    let move_on = |reason: String, attempt| {
        Transition::Step(Step::MoveOn {
            to: next.to_string(),
            reason,
            attempt,
        })
    };
    // What the provider answered the attempt, or showed of it when asked
    // afterwards (a lookup that finds the attempt's own refusal).
    let shown: Option<&SendOutcome> = match event {
        Event::Answered(o) => Some(o),
        Event::Reconciled {
            answer: Reconciled::Answered(o),
            ..
        } => Some(o),
        _ => None,
    };
    match (event, shown, t) {
        (Event::Starting { .. }, _, Transition::Step(Step::Proceed)) if r.current_open => {
            move_on(format!("the {} circuit is open", r.current), None)
        }
        (
            _,
            Some(o @ SendOutcome::Retryable { .. }),
            Transition::Write(Write::Retry { attempt, .. }),
        ) => move_on(
            format!("{} did not send it: {}", r.current, message(o)),
            Some(attempt),
        ),
        (
            _,
            Some(o @ SendOutcome::Refused { .. }),
            Transition::Write(Write::Final {
                attempt: Some(attempt),
                ..
            }),
        ) if snap.attempt < policy.max_attempts && too_late(snap, now).is_none() => move_on(
            format!("{} refused to send anything: {}", r.current, message(o)),
            Some(attempt),
        ),
        (
            Event::Reconciled {
                after,
                answer: Reconciled::NotSent,
            },
            _,
            Transition::Write(Write::Retry { attempt, .. }),
        ) => move_on(
            format!(
                "{} gave no clear answer ({}) and shows no such message",
                r.current,
                message(after)
            ),
            Some(attempt),
        ),
        (_, _, t) => t,
    }
}

fn message(o: &SendOutcome) -> &str {
    match o {
        SendOutcome::Accepted { .. } => "accepted",
        SendOutcome::Rejected { message, .. }
        | SendOutcome::Refused { message, .. }
        | SendOutcome::Retryable { message, .. }
        | SendOutcome::Ambiguous { message, .. } => message,
    }
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
