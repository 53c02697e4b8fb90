//! The routing table, row by row, without a database: provider answer ×
//! circuit state × whether a next provider is available.

use std::time::Duration;

use time::OffsetDateTime;
use time::macros::datetime;

use super::*;
use crate::domain::Status;

const NOW: OffsetDateTime = datetime!(2026-11-30 12:00:00 UTC);
const CURRENT_START: OffsetDateTime = datetime!(2026-11-30 11:59:58 UTC);

fn policy() -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(8),
        max_attempts: 3,
        deadline: Duration::from_secs(900),
        max_retry_after: Duration::from_secs(600),
    }
}

fn snap() -> Snapshot {
    Snapshot {
        attempt: 1,
        attempt_started_at: CURRENT_START,
        maybe_sent: false,
        expires_at: None,
        deadline_at: NOW + time::Duration::minutes(10),
    }
}

fn accepted() -> SendOutcome {
    SendOutcome::Accepted {
        provider_message_id: "p-1".into(),
        http_status: Some(201),
    }
}
fn invalid_number() -> SendOutcome {
    SendOutcome::Rejected {
        http_status: Some(400),
        provider_code: Some("21211".into()),
        message: "invalid number".into(),
    }
}
fn opted_out() -> SendOutcome {
    SendOutcome::Rejected {
        http_status: Some(400),
        provider_code: Some("21610".into()),
        message: "unsubscribed recipient".into(),
    }
}
fn refused() -> SendOutcome {
    SendOutcome::Refused {
        http_status: Some(401),
        provider_code: Some("20003".into()),
        message: "authentication failed".into(),
    }
}
fn refused_connection() -> SendOutcome {
    SendOutcome::Retryable {
        http_status: None,
        provider_code: None,
        retry_after: None,
        message: "could not connect to the provider".into(),
    }
}
fn busy() -> SendOutcome {
    SendOutcome::Retryable {
        http_status: Some(503),
        provider_code: None,
        retry_after: Some(Duration::from_secs(1)),
        message: "try later".into(),
    }
}
fn ambiguous() -> SendOutcome {
    SendOutcome::Ambiguous {
        http_status: None,
        retry_after: None,
        message: "timeout".into(),
    }
}

/// What a transition amounts to, for the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Proceed,
    Retry,
    Reconcile,
    Recheck,
    MoveOn,
    Sent,
    Failed,
    Unknown,
}

fn kind(t: &Transition) -> Want {
    match t {
        Transition::Step(Step::Proceed) => Want::Proceed,
        Transition::Write(Write::Retry { .. }) => Want::Retry,
        Transition::Step(Step::Reconcile { .. }) => Want::Reconcile,
        Transition::Write(Write::Recheck { .. }) => Want::Recheck,
        Transition::Step(Step::MoveOn { .. }) => Want::MoveOn,
        Transition::Write(Write::Final { status, .. }) => match status {
            Status::Sent => Want::Sent,
            Status::Failed => Want::Failed,
            _ => Want::Unknown,
        },
    }
}

const NEXT: Option<&str> = Some("http");

/// A provider that de-duplicates (or not) and whose refusals follow suit
/// (the default of `Provider::rejection_covers_earlier_attempts`).
impl From<bool> for KeyRule {
    fn from(dedupes: bool) -> Self {
        KeyRule {
            dedupes,
            rejection_covers_earlier: dedupes,
        }
    }
}

#[test]
fn the_routing_table() {
    use Want::*;
    let starting = Event::Starting {
        opted_out: false,
        closing: None,
    };
    let starting_opted_out = Event::Starting {
        opted_out: true,
        closing: Some((1, crate::domain::AttemptOutcome::Expired)),
    };
    let (a, r, rf, rc, b, amb, oo) = (
        accepted(),
        invalid_number(),
        refused(),
        refused_connection(),
        busy(),
        ambiguous(),
        opted_out(),
    );
    let (sent, not_sent, unknown) = (
        Reconciled::Sent {
            provider_message_id: "p-9".into(),
        },
        Reconciled::NotSent,
        Reconciled::Unknown("cannot tell".into()),
    );
    let (shown_refused, shown_retryable, shown_rejected, pending) = (
        Reconciled::Answered(refused()),
        Reconciled::Answered(refused_connection()),
        Reconciled::Answered(invalid_number()),
        Reconciled::Pending("the log shows nothing yet".into()),
    );
    let recon = |answer| Event::Reconciled {
        after: &amb,
        answer,
    };
    // (event, circuit open, next provider, provider de-duplicates, maybe sent before, want)
    type Row<'a> = (&'a str, Event<'a>, bool, Option<&'a str>, bool, bool, Want);
    let table: Vec<Row<'_>> = vec![
        (
            "start, closed",
            starting.clone(),
            false,
            NEXT,
            false,
            false,
            Proceed,
        ),
        (
            "start, open, next",
            starting.clone(),
            true,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "start, open, no next",
            starting.clone(),
            true,
            None,
            false,
            false,
            Proceed,
        ),
        (
            "start, open, maybe sent",
            starting.clone(),
            true,
            NEXT,
            false,
            true,
            Proceed,
        ),
        (
            "start, opted out",
            starting_opted_out,
            true,
            NEXT,
            false,
            false,
            Failed,
        ),
        (
            "accepted",
            Event::Answered(&a),
            false,
            NEXT,
            false,
            false,
            Sent,
        ),
        (
            "accepted, open",
            Event::Answered(&a),
            true,
            NEXT,
            false,
            false,
            Sent,
        ),
        (
            "invalid number",
            Event::Answered(&r),
            false,
            NEXT,
            false,
            false,
            Failed,
        ),
        (
            "invalid number, open",
            Event::Answered(&r),
            true,
            NEXT,
            false,
            false,
            Failed,
        ),
        (
            "opted out at provider",
            Event::Answered(&oo),
            false,
            NEXT,
            false,
            false,
            Failed,
        ),
        (
            "refused, next",
            Event::Answered(&rf),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "refused, no next",
            Event::Answered(&rf),
            false,
            None,
            false,
            false,
            Failed,
        ),
        (
            "refused, maybe sent",
            Event::Answered(&rf),
            false,
            NEXT,
            false,
            true,
            Unknown,
        ),
        (
            "conn refused, next",
            Event::Answered(&rc),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "conn refused, open",
            Event::Answered(&rc),
            true,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "conn refused, no next",
            Event::Answered(&rc),
            false,
            None,
            false,
            false,
            Retry,
        ),
        (
            "conn refused, maybe sent",
            Event::Answered(&rc),
            false,
            NEXT,
            true,
            true,
            Retry,
        ),
        (
            "503, next",
            Event::Answered(&b),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "503, no next",
            Event::Answered(&b),
            true,
            None,
            false,
            false,
            Retry,
        ),
        (
            "ambiguous",
            Event::Answered(&amb),
            false,
            NEXT,
            false,
            false,
            Reconcile,
        ),
        (
            "ambiguous, open",
            Event::Answered(&amb),
            true,
            NEXT,
            false,
            false,
            Reconcile,
        ),
        (
            "ambiguous, dedupes",
            Event::Answered(&amb),
            false,
            NEXT,
            true,
            false,
            Retry,
        ),
        (
            "reconciled sent",
            recon(&sent),
            false,
            NEXT,
            false,
            false,
            Sent,
        ),
        (
            "reconciled not sent",
            recon(&not_sent),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "reconciled not sent, no next",
            recon(&not_sent),
            false,
            None,
            false,
            false,
            Retry,
        ),
        (
            "reconciled not sent, maybe sent",
            recon(&not_sent),
            false,
            NEXT,
            false,
            true,
            Retry,
        ),
        (
            "reconciled unknown",
            recon(&unknown),
            false,
            NEXT,
            false,
            false,
            Unknown,
        ),
        (
            "reconciled unknown, open",
            recon(&unknown),
            true,
            NEXT,
            false,
            false,
            Unknown,
        ),
        // A lookup that shows the attempt's own answer (Infobip's log entry
        // with a REJECTED status) routes as that answer would have.
        (
            "reconciled: its account refusal shown, next",
            recon(&shown_refused),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "reconciled: its account refusal shown, no next",
            recon(&shown_refused),
            false,
            None,
            false,
            false,
            Failed,
        ),
        (
            "reconciled: its account refusal shown, maybe sent",
            recon(&shown_refused),
            false,
            NEXT,
            false,
            true,
            Unknown,
        ),
        (
            "reconciled: a retryable rejection shown, next",
            recon(&shown_retryable),
            false,
            NEXT,
            false,
            false,
            MoveOn,
        ),
        (
            "reconciled: its rejection of the message shown",
            recon(&shown_rejected),
            false,
            NEXT,
            false,
            false,
            Failed,
        ),
        (
            "reconciled pending (a log that lags)",
            recon(&pending),
            false,
            NEXT,
            false,
            false,
            Recheck,
        ),
    ];
    for (name, event, open, next, dedupes, maybe_sent, want) in table {
        let s = Snapshot {
            maybe_sent,
            ..snap()
        };
        let r = Route {
            current: "twilio",
            current_open: open,
            next,
        };
        let t = route(&s, &event, NOW, &policy(), dedupes.into(), &r);
        assert_eq!(kind(&t), want, "{name}: {t:?}");
    }
}

#[test]
fn moving_on_closes_the_answered_attempt_and_names_the_next_provider() {
    let r = Route {
        current: "twilio",
        current_open: false,
        next: NEXT,
    };
    let o = refused_connection();
    let t = route(
        &snap(),
        &Event::Answered(&o),
        NOW,
        &policy(),
        false.into(),
        &r,
    );
    let Transition::Step(Step::MoveOn {
        to,
        reason,
        attempt,
    }) = t
    else {
        panic!("{t:?}");
    };
    assert_eq!(to, "http");
    assert!(reason.contains("twilio did not send it"), "{reason}");
    let attempt = attempt.expect("the answered attempt is closed");
    assert_eq!(attempt.number, 1);
    assert_eq!(attempt.outcome, crate::domain::AttemptOutcome::Retryable);
    // Starting on an open circuit moves the open attempt, closing nothing.
    let starting = Event::Starting {
        opted_out: false,
        closing: None,
    };
    let open = Route {
        current_open: true,
        ..r
    };
    let t = route(&snap(), &starting, NOW, &policy(), false.into(), &open);
    assert!(
        matches!(&t, Transition::Step(Step::MoveOn { attempt: None, reason, .. }) if reason.contains("circuit is open")),
        "{t:?}"
    );
}

#[test]
fn no_move_on_past_the_attempt_budget() {
    let r = Route {
        current: "twilio",
        current_open: false,
        next: NEXT,
    };
    let last = Snapshot {
        attempt: 3,
        ..snap()
    };
    for o in [refused(), refused_connection(), busy()] {
        let t = route(
            &last,
            &Event::Answered(&o),
            NOW,
            &policy(),
            false.into(),
            &r,
        );
        assert_eq!(kind(&t), Want::Failed, "{o:?}: {t:?}");
    }
}
