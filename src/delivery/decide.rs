//! What a delivery does next: a pure function of the message, what just
//! happened, the time and the retry policy. No I/O and no clock reads, so
//! every row of the decision table is a unit test.
//!
//! | what happened                          | transition                                   |
//! |----------------------------------------|----------------------------------------------|
//! | about to send, past validity/deadline  | final `failed` (`unknown` if maybe sent)     |
//! | about to send, recipient opted out     | final `failed` (`unknown` if maybe sent)     |
//! | about to send, otherwise               | proceed                                      |
//! | accepted                               | final `sent`                                 |
//! | rejected                               | final `failed` (`unknown` if maybe sent,     |
//! |                                        | unless a refusal under the provider's key    |
//! |                                        | covers earlier attempts: the `http` bridge)  |
//! | refused (the account, not the message) | final `failed` (`unknown` if maybe sent)     |
//! | retryable                              | retry at backoff/Retry-After, or give up     |
//! | ambiguous, provider de-duplicates      | retry (resending cannot send twice; a 409,   |
//! |                                        | "still processing this key", is one of them) |
//! | ambiguous, otherwise                   | reconcile since the current attempt started  |
//! | reconciled `Sent`                      | final `sent`                                 |
//! | reconciled `NotSent` after an answer   | as retryable                                 |
//! | reconciled `NotSent` on resume         | proceed                                      |
//! | reconciled `Answered` (the provider    | as that answer (after an answer or on        |
//! | shows the attempt's own answer)        | resume); an ambiguous one as `Pending`       |
//! | reconciled `Pending` (after an answer  | ask again later (after the retry delay, at   |
//! | or on resume)                          | least a quarter of the attempt's age), the   |
//! |                                        | attempt left open; past the deadline or the  |
//! |                                        | validity final `unknown`                     |
//! | reconciled `Unknown`                   | final `unknown`                              |
//! | the body cannot be opened (a sealed    | final `failed` (`unknown` if maybe sent)     |
//! | code whose secret is gone)             |                                              |
//! | stopped right before the call (its     | final `canceled` (`unknown` if maybe sent)   |
//! | verification moved on or ended)        |                                              |
//!
//! With several providers, [`route`](super::route::route) turns some of
//! these into moving on to the next provider.

use std::time::Duration;

use time::OffsetDateTime;

use super::RetryPolicy;
use crate::clock::to_time;
use crate::domain::{AttemptOutcome, MessageError, Status};
use crate::provider::{Provider, Reconciled, SendOutcome};
use crate::store::{AttemptResult, MessageRecord};

/// What the provider does with our key ([`Provider::dedupes_by_key`],
/// [`Provider::rejection_covers_earlier_attempts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyRule {
    /// A resend under the same key cannot send twice.
    pub dedupes: bool,
    /// A refusal under the key also says no earlier attempt sent it.
    pub rejection_covers_earlier: bool,
}

impl KeyRule {
    /// The rule of `provider`; none when it is not configured.
    pub fn of(provider: Option<&dyn Provider>) -> Self {
        provider.map_or_else(KeyRule::default, |p| KeyRule {
            dedupes: p.dedupes_by_key(),
            rejection_covers_earlier: p.rejection_covers_earlier_attempts(),
        })
    }
}

/// What the decision needs to know about the message.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The number of the current attempt.
    pub attempt: u32,
    /// When the current attempt started: the window a reconciliation asks
    /// about begins here.
    pub attempt_started_at: OffsetDateTime,
    /// An earlier attempt may have reached the provider.
    pub maybe_sent: bool,
    pub expires_at: Option<OffsetDateTime>,
    pub deadline_at: OffsetDateTime,
}

impl Snapshot {
    /// The snapshot of `msg` whose attempt `attempt` started at `started_at`.
    pub fn of(msg: &MessageRecord, attempt: u32, started_at: OffsetDateTime) -> Self {
        Self {
            attempt,
            attempt_started_at: started_at,
            maybe_sent: msg.maybe_sent,
            expires_at: msg.expires_at,
            deadline_at: msg.deadline_at,
        }
    }
}

/// What happened.
#[derive(Clone, Debug)]
pub enum Event<'a> {
    /// About to call the provider. `closing`: an attempt this ends if no
    /// call is made, and how.
    Starting {
        opted_out: bool,
        closing: Option<(u32, AttemptOutcome)>,
    },
    /// The provider answered the current attempt.
    Answered(&'a SendOutcome),
    /// The provider was asked about the ambiguous answer `after`.
    Reconciled {
        after: &'a SendOutcome,
        answer: &'a Reconciled,
    },
    /// The provider was asked about an attempt a previous owner left open,
    /// before starting a new one.
    Resumed(&'a Reconciled),
    /// The message cannot be handed to any provider, ever (a sealed body
    /// whose secret is gone): why.
    Unsendable(&'a str),
    /// The check right before the call found the message stopped: the
    /// verification whose code it carries moved on to its next channel,
    /// or ended, after the message was read (`domain::stop`).
    Stopped,
}

/// What to do next: a step the run takes (it decides again afterwards), or
/// a result to write. Only a [`Write`] is ever written, so the applier
/// takes nothing else.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    Step(Step),
    Write(Write),
}

/// A step of a run: nothing is written because of it.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Go on: start (or make) the provider call.
    Proceed,
    /// Ask the provider whether it sent the message since `since`.
    Reconcile { since: OffsetDateTime },
    /// Move the message to provider `to` and go on there at once (see
    /// [`route`](super::route::route)). `attempt` closes the current attempt
    /// when the provider answered it; `None`: no call was made, and the open
    /// attempt moves as it is.
    MoveOn {
        to: String,
        reason: String,
        attempt: Option<AttemptResult>,
    },
}

/// A result of a run, written fenced on the lease; the run ends with it.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Make the message final; `attempt` closes the open attempt.
    Final {
        status: Status,
        provider_message_id: Option<String>,
        error: Option<MessageError>,
        attempt: Option<AttemptResult>,
    },
    /// Record the attempt and try again at `at`.
    Retry {
        at: OffsetDateTime,
        error: MessageError,
        attempt: AttemptResult,
    },
    /// Leave the current attempt open (its outcome is not known yet) and
    /// ask the provider about it again at `at`; nothing is sent meanwhile.
    Recheck {
        at: OffsetDateTime,
        error: MessageError,
    },
}

/// The transition `event` leads to.
pub fn decide(
    snap: &Snapshot,
    event: &Event<'_>,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    keys: KeyRule,
) -> Transition {
    match event {
        Event::Starting { opted_out, closing } => {
            let why = too_late(snap, now).or_else(|| {
                opted_out.then(|| {
                    (
                        error(
                            "recipient_opted_out",
                            "the recipient opted out of messages from this account",
                            None,
                        ),
                        AttemptOutcome::OptedOut,
                    )
                })
            });
            match why {
                None => Transition::Step(Step::Proceed),
                Some((e, outcome)) => Transition::Write(Write::Final {
                    status: give_up_status(snap.maybe_sent),
                    provider_message_id: None,
                    attempt: closing.map(|(n, closing_outcome)| {
                        // An attempt left open by a crash stays `lost`.
                        let o = if closing_outcome == AttemptOutcome::Lost {
                            closing_outcome
                        } else {
                            outcome
                        };
                        local_result(n, o, Some(e.message.clone()), now)
                    }),
                    error: Some(e),
                }),
            }
        }
        Event::Answered(outcome) => answered(snap, outcome, now, policy, keys),
        Event::Reconciled { after, answer } => match answer {
            Reconciled::Sent {
                provider_message_id,
            } => Transition::Write(Write::Final {
                status: Status::Sent,
                provider_message_id: Some(provider_message_id.clone()),
                error: None,
                attempt: Some(result_from(after, snap.attempt, now)),
            }),
            // The provider shows no such message: resending is safe.
            Reconciled::NotSent => {
                let (_, retry_after, message) = parts(after);
                retry_or_give_up(snap, after, retry_after, now, policy, false, &message)
            }
            // The provider shows what became of the attempt: decided as its
            // answer would have been (an ambiguous one is no answer yet).
            Reconciled::Answered(shown @ SendOutcome::Ambiguous { .. }) => {
                let (_, retry_after, reason) = parts(shown);
                recheck_or_give_up(snap, &reason, retry_after, now, policy, || {
                    result_from(after, snap.attempt, now)
                })
            }
            Reconciled::Answered(shown) => answered(snap, shown, now, policy, keys),
            Reconciled::Pending(reason) => {
                let (_, retry_after, _) = parts(after);
                recheck_or_give_up(snap, reason, retry_after, now, policy, || {
                    result_from(after, snap.attempt, now)
                })
            }
            Reconciled::Unknown(reason) => Transition::Write(Write::Final {
                status: Status::Unknown,
                provider_message_id: None,
                error: Some(error("outcome_unknown", reason, None)),
                attempt: Some(result_from(after, snap.attempt, now)),
            }),
        },
        Event::Resumed(answer) => match answer {
            Reconciled::Sent {
                provider_message_id,
            } => Transition::Write(Write::Final {
                status: Status::Sent,
                provider_message_id: Some(provider_message_id.clone()),
                error: None,
                attempt: Some(local_result(
                    snap.attempt,
                    AttemptOutcome::Reconciled,
                    None,
                    now,
                )),
            }),
            Reconciled::NotSent => Transition::Step(Step::Proceed),
            Reconciled::Answered(shown @ SendOutcome::Ambiguous { .. }) => {
                let (_, _, reason) = parts(shown);
                recheck_or_give_up(snap, &reason, None, now, policy, || {
                    local_result(
                        snap.attempt,
                        AttemptOutcome::Lost,
                        Some(reason.clone()),
                        now,
                    )
                })
            }
            Reconciled::Answered(shown) => answered(snap, shown, now, policy, keys),
            Reconciled::Pending(reason) => {
                recheck_or_give_up(snap, reason, None, now, policy, || {
                    local_result(
                        snap.attempt,
                        AttemptOutcome::Lost,
                        Some(reason.clone()),
                        now,
                    )
                })
            }
            Reconciled::Unknown(reason) => Transition::Write(Write::Final {
                status: Status::Unknown,
                provider_message_id: None,
                error: Some(error("outcome_unknown", reason, None)),
                attempt: Some(local_result(
                    snap.attempt,
                    AttemptOutcome::Lost,
                    Some(reason.clone()),
                    now,
                )),
            }),
        },
        Event::Stopped => {
            let e = error(
                "stopped",
                "the verification moved on to its next channel, or ended, before this message \
                 was sent",
                None,
            );
            Transition::Write(Write::Final {
                status: if snap.maybe_sent {
                    Status::Unknown
                } else {
                    Status::Canceled
                },
                provider_message_id: None,
                attempt: Some(local_result(
                    snap.attempt,
                    AttemptOutcome::Expired,
                    Some(e.message.clone()),
                    now,
                )),
                error: Some(e),
            })
        }
        Event::Unsendable(why) => {
            let e = error("unsendable", why, None);
            Transition::Write(Write::Final {
                status: give_up_status(snap.maybe_sent),
                provider_message_id: None,
                attempt: Some(local_result(
                    snap.attempt,
                    AttemptOutcome::Unsendable,
                    Some(e.message.clone()),
                    now,
                )),
                error: Some(e),
            })
        }
    }
}

/// Asking again later about an attempt whose outcome is not known yet:
/// before the retry deadline, a recheck (the attempt stays open, nothing is
/// sent); after it, final `unknown`, closing the attempt as `closing` says.
fn recheck_or_give_up(
    snap: &Snapshot,
    reason: &str,
    retry_after: Option<Duration>,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    closing: impl FnOnce() -> AttemptResult,
) -> Transition {
    let at = now + to_time(policy.delay(snap.attempt, retry_after));
    if at > snap.deadline_at {
        return Transition::Write(Write::Final {
            status: Status::Unknown,
            provider_message_id: None,
            error: Some(error(
                "outcome_unknown",
                &format!(
                    "the retry deadline passed while the provider could not tell yet: {reason}"
                ),
                None,
            )),
            attempt: Some(closing()),
        });
    }
    // Past its validity (a verification's code that expired, or whose
    // verification moved on or ended) nothing of it will be sent again,
    // and asking on tells nobody anything new: it ends here.
    if snap.expires_at.is_some_and(|e| now >= e) {
        return Transition::Write(Write::Final {
            status: Status::Unknown,
            provider_message_id: None,
            error: Some(error(
                "outcome_unknown",
                &format!(
                    "the message's validity ended while the provider could not tell yet: {reason}"
                ),
                None,
            )),
            attempt: Some(closing()),
        });
    }
    // A log may lag for long: asked at a pace of a quarter of the
    // attempt's age (at most the retry cap), not every retry delay, and
    // once more at the deadline if the pace would pass it.
    let age = Duration::try_from(now - snap.attempt_started_at).unwrap_or(Duration::ZERO);
    let paced = now + to_time((age / 4).min(policy.cap));
    Transition::Write(Write::Recheck {
        at: at.max(paced.min(snap.deadline_at)),
        error: error("provider_ambiguous", reason, None),
    })
}

fn answered(
    snap: &Snapshot,
    outcome: &SendOutcome,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    keys: KeyRule,
) -> Transition {
    let attempt = Some(result_from(outcome, snap.attempt, now));
    match outcome {
        SendOutcome::Accepted {
            provider_message_id,
            ..
        } => Transition::Write(Write::Final {
            status: Status::Sent,
            provider_message_id: Some(provider_message_id.clone()),
            error: None,
            attempt,
        }),
        SendOutcome::Rejected {
            provider_code,
            message,
            ..
        } => Transition::Write(Write::Final {
            // A definite "no" to this very attempt; it covers an earlier
            // ambiguous one only where a refusal under the key replays the
            // key's first answer (not Infobip's refusal of a repeat).
            status: if keys.rejection_covers_earlier {
                Status::Failed
            } else {
                give_up_status(snap.maybe_sent)
            },
            provider_message_id: None,
            error: Some(error("provider_rejected", message, provider_code.clone())),
            attempt,
        }),
        // With one provider, a refusal of the account is final: nothing
        // sent it, and retrying here will not help.
        SendOutcome::Refused {
            provider_code,
            message,
            ..
        } => Transition::Write(Write::Final {
            status: give_up_status(snap.maybe_sent),
            provider_message_id: None,
            error: Some(error("provider_refused", message, provider_code.clone())),
            attempt,
        }),
        SendOutcome::Retryable {
            retry_after,
            message,
            ..
        } => retry_or_give_up(snap, outcome, *retry_after, now, policy, false, message),
        SendOutcome::Ambiguous {
            retry_after,
            message,
            ..
        } => {
            if keys.dedupes {
                // Resending with the same key cannot send twice.
                retry_or_give_up(snap, outcome, *retry_after, now, policy, true, message)
            } else {
                Transition::Step(Step::Reconcile {
                    since: snap.attempt_started_at,
                })
            }
        }
    }
}

pub(super) fn retry_or_give_up(
    snap: &Snapshot,
    outcome: &SendOutcome,
    retry_after: Option<Duration>,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    ambiguous: bool,
    message: &str,
) -> Transition {
    let attempt = snap.attempt;
    let result = result_from(outcome, attempt, now);
    let maybe_sent = snap.maybe_sent || ambiguous;
    let give_up = |code: &str, why: String| {
        Transition::Write(Write::Final {
            status: give_up_status(maybe_sent),
            provider_message_id: None,
            error: Some(error(
                if maybe_sent { "outcome_unknown" } else { code },
                &why,
                None,
            )),
            attempt: Some(result.clone()),
        })
    };
    if attempt >= policy.max_attempts {
        return give_up(
            "retries_exhausted",
            format!("gave up after {attempt} attempts; last: {message}"),
        );
    }
    let at = now + to_time(policy.delay(attempt, retry_after));
    if snap.expires_at.is_some_and(|e| at >= e) {
        return give_up(
            "validity_expired",
            format!("the next attempt would fall after the validity period; last: {message}"),
        );
    }
    if at > snap.deadline_at {
        return give_up(
            "retries_exhausted",
            format!("the next attempt would fall after the retry deadline; last: {message}"),
        );
    }
    Transition::Write(Write::Retry {
        at,
        error: error(
            if ambiguous {
                "provider_ambiguous"
            } else {
                "provider_unavailable"
            },
            message,
            None,
        ),
        attempt: result,
    })
}

pub(crate) fn error(code: &str, message: &str, provider_code: Option<String>) -> MessageError {
    MessageError {
        code: code.to_string(),
        message: message.to_string(),
        provider_code,
    }
}

/// Giving up on a message the provider may have sent ends it `unknown`.
fn give_up_status(maybe_sent: bool) -> Status {
    if maybe_sent {
        Status::Unknown
    } else {
        Status::Failed
    }
}

/// Why no attempt may start now, if none may, and how the attempt it would
/// have been ends.
pub(super) fn too_late(
    snap: &Snapshot,
    now: OffsetDateTime,
) -> Option<(MessageError, AttemptOutcome)> {
    if snap.expires_at.is_some_and(|e| now >= e) {
        return Some((
            error(
                "validity_expired",
                "the message's validity period ended before it could be sent",
                None,
            ),
            AttemptOutcome::Expired,
        ));
    }
    if now >= snap.deadline_at {
        return Some((
            error(
                "retries_exhausted",
                "the retry deadline passed before the provider accepted the message",
                None,
            ),
            AttemptOutcome::Expired,
        ));
    }
    None
}

fn local_result(
    number: u32,
    outcome: AttemptOutcome,
    error: Option<String>,
    now: OffsetDateTime,
) -> AttemptResult {
    AttemptResult {
        number,
        outcome,
        http_status: None,
        provider_code: None,
        error,
        provider_message_id: None,
        finished_at: now,
    }
}

fn parts(outcome: &SendOutcome) -> (Option<u16>, Option<Duration>, String) {
    match outcome {
        SendOutcome::Accepted { http_status, .. } => (*http_status, None, String::new()),
        SendOutcome::Rejected {
            http_status,
            message,
            ..
        }
        | SendOutcome::Refused {
            http_status,
            message,
            ..
        } => (*http_status, None, message.clone()),
        SendOutcome::Retryable {
            http_status,
            retry_after,
            message,
            ..
        }
        | SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        } => (*http_status, *retry_after, message.clone()),
    }
}

pub(super) fn result_from(
    outcome: &SendOutcome,
    number: u32,
    now: OffsetDateTime,
) -> AttemptResult {
    let (http_status, _, message) = parts(outcome);
    let (name, provider_code, provider_message_id) = match outcome {
        SendOutcome::Accepted {
            provider_message_id,
            ..
        } => (
            AttemptOutcome::Sent,
            None,
            Some(provider_message_id.clone()),
        ),
        SendOutcome::Rejected { provider_code, .. } => {
            (AttemptOutcome::Rejected, provider_code.clone(), None)
        }
        SendOutcome::Refused { provider_code, .. } => {
            (AttemptOutcome::Refused, provider_code.clone(), None)
        }
        SendOutcome::Retryable { provider_code, .. } => {
            (AttemptOutcome::Retryable, provider_code.clone(), None)
        }
        SendOutcome::Ambiguous { .. } => (AttemptOutcome::Ambiguous, None, None),
    };
    AttemptResult {
        number,
        outcome: name,
        http_status,
        provider_code,
        error: (!message.is_empty()).then_some(message),
        provider_message_id,
        finished_at: now,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
