//! The decision table, row by row, without a database.

use std::time::Duration;

use time::OffsetDateTime;
use time::macros::datetime;

use super::*;

const NOW: OffsetDateTime = datetime!(2026-11-30 12:00:00 UTC);
const PREVIOUS_START: OffsetDateTime = datetime!(2026-11-30 11:00:00 UTC);
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
        provider_message_id: "p1".into(),
        http_status: Some(201),
    }
}

fn rejected() -> SendOutcome {
    SendOutcome::Rejected {
        http_status: Some(400),
        provider_code: Some("21211".into()),
        message: "bad number".into(),
    }
}

fn retryable(retry_after: Option<u64>) -> SendOutcome {
    SendOutcome::Retryable {
        http_status: Some(503),
        provider_code: None,
        retry_after: retry_after.map(Duration::from_secs),
        message: "busy".into(),
    }
}

fn ambiguous() -> SendOutcome {
    SendOutcome::Ambiguous {
        http_status: Some(502),
        retry_after: None,
        message: "bad gateway".into(),
    }
}

/// What a row expects, compared on the parts that matter.
#[derive(Debug, PartialEq)]
enum Want {
    /// Status, error code, outcome recorded for the attempt closed.
    Final(Status, Option<&'static str>, Option<AttemptOutcome>),
    /// Due between these many seconds from now (inclusive), error code.
    Retry(f64, f64, &'static str),
    Reconcile(OffsetDateTime),
    /// Asked again between these many seconds from now, the attempt open.
    Recheck(f64, f64),
    Proceed,
}

fn matches(t: &Transition, want: &Want) -> bool {
    match (t, want) {
        (
            Transition::Write(Write::Final {
                status,
                error,
                attempt,
                ..
            }),
            Want::Final(s, code, outcome),
        ) => {
            status == s
                && error.as_ref().map(|e| e.code.as_str()) == *code
                && attempt.as_ref().map(|a| a.outcome) == *outcome
        }
        (Transition::Write(Write::Retry { at, error, attempt }), Want::Retry(lo, hi, code)) => {
            let secs = (*at - NOW).as_seconds_f64();
            *lo <= secs && secs <= *hi && error.code == *code && attempt.finished_at == NOW
        }
        (Transition::Step(Step::Reconcile { since }), Want::Reconcile(w)) => since == w,
        (Transition::Write(Write::Recheck { at, error }), Want::Recheck(lo, hi)) => {
            let secs = (*at - NOW).as_seconds_f64();
            *lo <= secs && secs <= *hi && error.code == "provider_ambiguous"
        }
        (Transition::Step(Step::Proceed), Want::Proceed) => true,
        _ => false,
    }
}

#[test]
fn the_decision_table() {
    use AttemptOutcome as O;
    use Status::{Failed, Sent, Unknown};
    let maybe_sent = Snapshot {
        maybe_sent: true,
        ..snap()
    };
    let last = Snapshot {
        attempt: 3,
        ..snap()
    };
    let last_maybe_sent = Snapshot {
        attempt: 3,
        maybe_sent: true,
        ..snap()
    };
    let expiring = Snapshot {
        expires_at: Some(NOW + time::Duration::seconds(30)),
        ..snap()
    };
    let near_deadline = Snapshot {
        deadline_at: NOW + time::Duration::seconds(30),
        ..snap()
    };
    let past_deadline = Snapshot {
        deadline_at: NOW,
        ..snap()
    };
    let past_validity_maybe_sent = Snapshot {
        expires_at: Some(NOW - time::Duration::seconds(1)),
        maybe_sent: true,
        ..snap()
    };
    let (acc, rej, ra, r0, amb) = (
        accepted(),
        rejected(),
        retryable(Some(120)),
        retryable(None),
        ambiguous(),
    );
    let amb60 = SendOutcome::Ambiguous {
        http_status: None,
        retry_after: Some(Duration::from_secs(60)),
        message: "x".into(),
    };
    let sent = Reconciled::Sent {
        provider_message_id: "p9".into(),
    };
    let not_sent = Reconciled::NotSent;
    let unknown = Reconciled::Unknown("cannot ask".into());
    let pending = Reconciled::Pending("a sibling may own it".into());
    // An IETF-draft provider still processing the same key (409).
    let in_flight = SendOutcome::Ambiguous {
        http_status: Some(409),
        retry_after: Some(Duration::from_secs(1)),
        message: "still processing".into(),
    };
    let starting = |opted_out, closing| Event::Starting { opted_out, closing };

    #[rustfmt::skip]
    let rows: Vec<(&str, Snapshot, Event<'_>, bool, Want)> = vec![
        ("accepted", snap(), Event::Answered(&acc), false, Want::Final(Sent, None, Some(O::Sent))),
        ("rejected", snap(), Event::Answered(&rej), false, Want::Final(Failed, Some("provider_rejected"), Some(O::Rejected))),
        ("rejected after a maybe-sent attempt", maybe_sent.clone(), Event::Answered(&rej), false, Want::Final(Unknown, Some("provider_rejected"), Some(O::Rejected))),
        ("rejected by a deduping provider after a maybe-sent attempt", maybe_sent.clone(), Event::Answered(&rej), true, Want::Final(Failed, Some("provider_rejected"), Some(O::Rejected))),
        ("retryable without Retry-After", snap(), Event::Answered(&r0), false, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("retryable with Retry-After", snap(), Event::Answered(&ra), false, Want::Retry(120.0, 120.0, "provider_unavailable")),
        ("retryable, attempts used up", last.clone(), Event::Answered(&r0), false, Want::Final(Failed, Some("retries_exhausted"), Some(O::Retryable))),
        ("retryable, attempts used up, maybe sent", last_maybe_sent.clone(), Event::Answered(&r0), false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Retryable))),
        ("retryable, retry after the validity", expiring.clone(), Event::Answered(&ra), false, Want::Final(Failed, Some("validity_expired"), Some(O::Retryable))),
        ("retryable, retry after the deadline", near_deadline.clone(), Event::Answered(&ra), false, Want::Final(Failed, Some("retries_exhausted"), Some(O::Retryable))),
        ("ambiguous on a deduping provider", snap(), Event::Answered(&amb), true, Want::Retry(0.0, 1.0, "provider_ambiguous")),
        ("ambiguous on a deduping provider, attempts used up", last.clone(), Event::Answered(&amb), true, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("ambiguous on a deduping provider, retry after the validity", expiring.clone(), Event::Answered(&amb60), true, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("ambiguous on a provider that does not dedupe", snap(), Event::Answered(&amb), false, Want::Reconcile(CURRENT_START)),
        ("reconciled: sent", snap(), Event::Reconciled { after: &amb, answer: &sent }, false, Want::Final(Sent, None, Some(O::Ambiguous))),
        ("reconciled: not sent", snap(), Event::Reconciled { after: &amb, answer: &not_sent }, false, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("reconciled: not sent, attempts used up", last.clone(), Event::Reconciled { after: &amb, answer: &not_sent }, false, Want::Final(Failed, Some("retries_exhausted"), Some(O::Ambiguous))),
        ("reconciled: unknown", snap(), Event::Reconciled { after: &amb, answer: &unknown }, false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("409 in flight on a deduping provider", maybe_sent.clone(), Event::Answered(&in_flight), true, Want::Retry(1.0, 1.0, "provider_ambiguous")),
        ("reconciled: pending (a sibling may own the candidate)", snap(), Event::Reconciled { after: &amb, answer: &pending }, false, Want::Recheck(0.0, 1.0)),
        ("reconciled: pending, attempts used up (rechecks add none)", last.clone(), Event::Reconciled { after: &amb, answer: &pending }, false, Want::Recheck(0.0, 4.0)),
        ("reconciled: pending past the deadline", past_deadline.clone(), Event::Reconciled { after: &amb, answer: &pending }, false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("resumed: pending", snap(), Event::Resumed(&pending), false, Want::Recheck(0.0, 1.0)),
        ("resumed: pending past the deadline", past_deadline.clone(), Event::Resumed(&pending), false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("reconciled: pending past the validity (a stopped code)", past_validity_maybe_sent.clone(), Event::Reconciled { after: &amb, answer: &pending }, false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("resumed: pending past the validity", past_validity_maybe_sent.clone(), Event::Resumed(&pending), false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("unsendable (a sealed body that does not open)", snap(), Event::Unsendable("secret changed"), false, Want::Final(Failed, Some("unsendable"), Some(O::Unsendable))),
        ("unsendable after a maybe-sent attempt", maybe_sent.clone(), Event::Unsendable("secret changed"), false, Want::Final(Unknown, Some("unsendable"), Some(O::Unsendable))),
        ("stopped before the call (its verification moved on or ended)", snap(), Event::Stopped, false, Want::Final(Status::Canceled, Some("stopped"), Some(O::Expired))),
        ("stopped before the call, an earlier attempt maybe sent", maybe_sent.clone(), Event::Stopped, false, Want::Final(Unknown, Some("stopped"), Some(O::Expired))),
        ("resumed: sent", snap(), Event::Resumed(&sent), false, Want::Final(Sent, None, Some(O::Reconciled))),
        ("resumed: not sent", snap(), Event::Resumed(&not_sent), false, Want::Proceed),
        ("resumed: unknown", snap(), Event::Resumed(&unknown), false, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("starting in time", snap(), starting(false, Some((1, O::Expired))), false, Want::Proceed),
        ("starting past the deadline", past_deadline.clone(), starting(false, Some((1, O::Expired))), false, Want::Final(Failed, Some("retries_exhausted"), Some(O::Expired))),
        ("starting past the deadline, no attempt open", past_deadline.clone(), starting(false, None), false, Want::Final(Failed, Some("retries_exhausted"), None)),
        ("starting past the validity, an open attempt maybe sent", past_validity_maybe_sent.clone(), starting(false, Some((2, O::Lost))), false, Want::Final(Unknown, Some("validity_expired"), Some(O::Lost))),
        ("starting, recipient opted out", snap(), starting(true, Some((1, O::Expired))), false, Want::Final(Failed, Some("recipient_opted_out"), Some(O::OptedOut))),
        ("starting, opted out after a maybe-sent attempt", maybe_sent.clone(), starting(true, Some((2, O::Expired))), false, Want::Final(Unknown, Some("recipient_opted_out"), Some(O::OptedOut))),
    ];
    for (name, snap, event, dedupes, want) in &rows {
        let t = decide(snap, event, NOW, &policy(), *dedupes);
        assert!(matches(&t, want), "{name}: got {t:?}, want {want:?}");
    }
}

#[test]
fn an_accepted_answer_carries_the_provider_id() {
    let t = decide(
        &snap(),
        &Event::Answered(&accepted()),
        NOW,
        &policy(),
        false,
    );
    let Transition::Write(Write::Final {
        provider_message_id,
        attempt,
        ..
    }) = t
    else {
        panic!("not final: {t:?}");
    };
    assert_eq!(provider_message_id.as_deref(), Some("p1"));
    let attempt = attempt.unwrap();
    assert_eq!(attempt.number, 1);
    assert_eq!(attempt.provider_message_id.as_deref(), Some("p1"));
    assert_eq!(attempt.http_status, Some(201));
}

/// A resumed message's current attempt started long after the previous
/// one: the reconcile window begins at the current attempt (the snapshot
/// the deliverer builds for it), not at the record's previous attempt.
#[test]
fn a_resumed_message_reconciles_from_its_current_attempt() {
    let mut msg = crate::store::MessageRecord::claimed(
        &crate::store::NewMessage {
            id: crate::domain::MessageId::new(),
            tenant_id: uuid::Uuid::nil(),
            idempotency_key: crate::domain::IdempotencyKey::parse("K").unwrap(),
            fingerprint: vec![],
            to: crate::domain::Phone::from_e164("+14155550100")
                .unwrap()
                .into(),
            from: None,
            body: "hi".into(),
            segments: 1,
            encoding: crate::domain::Encoding::Gsm7,
            metadata: Default::default(),
            validity_seconds: None,
            provider: "http".into(),
            route: None,
            sender: None,
            created_at: PREVIOUS_START,
            expires_at: None,
            deadline_at: NOW + time::Duration::minutes(10),
            cost: None,
        },
        &crate::store::Lease::new("o", std::time::Duration::from_secs(30)),
        NOW,
        false,
    );
    msg.attempts = 2;
    assert_eq!(msg.last_attempt_started_at, Some(PREVIOUS_START));
    let snap = Snapshot::of(&msg, 3, CURRENT_START);
    let t = decide(&snap, &Event::Answered(&ambiguous()), NOW, &policy(), false);
    assert_eq!(
        t,
        Transition::Step(Step::Reconcile {
            since: CURRENT_START
        })
    );
}

#[test]
fn a_call_starts_under_a_nearly_full_lease() {
    use crate::delivery::needs_renewal;
    use std::time::Duration;
    let ms = Duration::from_millis;
    // (time since the lease's latest write started, renew?)
    let table = [
        (ms(0), false),
        (ms(1), false),
        (ms(999), false),
        (ms(1000), true),
        (ms(1001), true),
        (ms(15_000), true),
        (Duration::from_secs(3600), true),
    ];
    for (age, renew) in table {
        assert_eq!(needs_renewal(age), renew, "written {age:?} ago");
    }
}
