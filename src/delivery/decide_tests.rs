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

fn refused() -> SendOutcome {
    SendOutcome::Refused {
        http_status: Some(200),
        provider_code: Some("REJECTED_NOT_ENOUGH_CREDITS".into()),
        message: "no credit".into(),
    }
}

/// A provider that neither de-duplicates nor replays (Twilio, Infobip by
/// default).
const NO: KeyRule = KeyRule {
    dedupes: false,
    rejection_covers_earlier: false,
};
/// A bridge that de-duplicates on our key and replays its first answer.
const DEDUPES: KeyRule = KeyRule {
    dedupes: true,
    rejection_covers_earlier: true,
};
/// De-duplicates, but a refusal of a repeat says nothing of the first
/// (Infobip with idempotency declared).
const REPEAT_ONLY: KeyRule = KeyRule {
    dedupes: true,
    rejection_covers_earlier: false,
};

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
    let old_attempt = Snapshot {
        attempt_started_at: NOW - time::Duration::minutes(10),
        ..snap()
    };
    let old_attempt_near_deadline = Snapshot {
        deadline_at: NOW + time::Duration::seconds(5),
        ..old_attempt.clone()
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
    let shown = |o: SendOutcome| Reconciled::Answered(o);
    let (shown_rej, shown_ref, shown_r0, shown_acc, shown_amb) = (
        shown(rejected()),
        shown(refused()),
        shown(retryable(None)),
        shown(accepted()),
        shown(ambiguous()),
    );
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
    let rows: Vec<(&str, Snapshot, Event<'_>, KeyRule, Want)> = vec![
        ("accepted", snap(), Event::Answered(&acc), NO, Want::Final(Sent, None, Some(O::Sent))),
        ("rejected", snap(), Event::Answered(&rej), NO, Want::Final(Failed, Some("provider_rejected"), Some(O::Rejected))),
        ("rejected after a maybe-sent attempt", maybe_sent.clone(), Event::Answered(&rej), NO, Want::Final(Unknown, Some("provider_rejected"), Some(O::Rejected))),
        ("rejected by a deduping provider after a maybe-sent attempt", maybe_sent.clone(), Event::Answered(&rej), DEDUPES, Want::Final(Failed, Some("provider_rejected"), Some(O::Rejected))),
        ("rejected as a repeat after a maybe-sent attempt (the refusal is the repeat's only)", maybe_sent.clone(), Event::Answered(&rej), REPEAT_ONLY, Want::Final(Unknown, Some("provider_rejected"), Some(O::Rejected))),
        ("ambiguous on a provider that de-duplicates repeats only", snap(), Event::Answered(&amb), REPEAT_ONLY, Want::Retry(0.0, 1.0, "provider_ambiguous")),
        ("retryable without Retry-After", snap(), Event::Answered(&r0), NO, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("retryable with Retry-After", snap(), Event::Answered(&ra), NO, Want::Retry(120.0, 120.0, "provider_unavailable")),
        ("retryable, attempts used up", last.clone(), Event::Answered(&r0), NO, Want::Final(Failed, Some("retries_exhausted"), Some(O::Retryable))),
        ("retryable, attempts used up, maybe sent", last_maybe_sent.clone(), Event::Answered(&r0), NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Retryable))),
        ("retryable, retry after the validity", expiring.clone(), Event::Answered(&ra), NO, Want::Final(Failed, Some("validity_expired"), Some(O::Retryable))),
        ("retryable, retry after the deadline", near_deadline.clone(), Event::Answered(&ra), NO, Want::Final(Failed, Some("retries_exhausted"), Some(O::Retryable))),
        ("ambiguous on a deduping provider", snap(), Event::Answered(&amb), DEDUPES, Want::Retry(0.0, 1.0, "provider_ambiguous")),
        ("ambiguous on a deduping provider, attempts used up", last.clone(), Event::Answered(&amb), DEDUPES, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("ambiguous on a deduping provider, retry after the validity", expiring.clone(), Event::Answered(&amb60), DEDUPES, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("ambiguous on a provider that does not dedupe", snap(), Event::Answered(&amb), NO, Want::Reconcile(CURRENT_START)),
        ("reconciled: sent", snap(), Event::Reconciled { after: &amb, answer: &sent }, NO, Want::Final(Sent, None, Some(O::Ambiguous))),
        ("reconciled: not sent", snap(), Event::Reconciled { after: &amb, answer: &not_sent }, NO, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("reconciled: not sent, attempts used up", last.clone(), Event::Reconciled { after: &amb, answer: &not_sent }, NO, Want::Final(Failed, Some("retries_exhausted"), Some(O::Ambiguous))),
        ("reconciled: unknown", snap(), Event::Reconciled { after: &amb, answer: &unknown }, NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("reconciled: the attempt's own rejection shown", snap(), Event::Reconciled { after: &amb, answer: &shown_rej }, NO, Want::Final(Failed, Some("provider_rejected"), Some(O::Rejected))),
        ("reconciled: its rejection shown, after a maybe-sent attempt", maybe_sent.clone(), Event::Reconciled { after: &amb, answer: &shown_rej }, NO, Want::Final(Unknown, Some("provider_rejected"), Some(O::Rejected))),
        ("reconciled: its account refusal shown (one provider)", snap(), Event::Reconciled { after: &amb, answer: &shown_ref }, NO, Want::Final(Failed, Some("provider_refused"), Some(O::Refused))),
        ("reconciled: a retryable rejection shown", snap(), Event::Reconciled { after: &amb, answer: &shown_r0 }, NO, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("reconciled: an acceptance shown", snap(), Event::Reconciled { after: &amb, answer: &shown_acc }, NO, Want::Final(Sent, None, Some(O::Sent))),
        ("reconciled: an ambiguous answer shown is no answer", snap(), Event::Reconciled { after: &amb, answer: &shown_amb }, NO, Want::Recheck(0.0, 1.0)),
        ("resumed: a retryable rejection shown", maybe_sent.clone(), Event::Resumed(&shown_r0), NO, Want::Retry(0.0, 1.0, "provider_unavailable")),
        ("resumed: its rejection shown (the open attempt made it maybe sent)", maybe_sent.clone(), Event::Resumed(&shown_rej), NO, Want::Final(Unknown, Some("provider_rejected"), Some(O::Rejected))),
        ("resumed: an acceptance shown", maybe_sent.clone(), Event::Resumed(&shown_acc), NO, Want::Final(Sent, None, Some(O::Sent))),
        ("resumed: an ambiguous answer shown is no answer", snap(), Event::Resumed(&shown_amb), NO, Want::Recheck(0.0, 1.0)),
        ("resumed: an ambiguous answer shown, past the deadline", past_deadline.clone(), Event::Resumed(&shown_amb), NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("409 in flight on a deduping provider", maybe_sent.clone(), Event::Answered(&in_flight), DEDUPES, Want::Retry(1.0, 1.0, "provider_ambiguous")),
        ("reconciled: pending (a sibling may own the candidate)", snap(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Recheck(0.0, 1.0)),
        ("reconciled: pending, attempts used up (rechecks add none)", last.clone(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Recheck(0.0, 4.0)),
        ("reconciled: pending, an attempt 10 minutes old: asked at its pace (a quarter of its age, at most the cap)", old_attempt.clone(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Recheck(8.0, 8.0)),
        ("reconciled: pending, the pace past the deadline: once more at the deadline", old_attempt_near_deadline.clone(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Recheck(5.0, 5.0)),
        ("resumed: pending, an attempt 20 s old", Snapshot { attempt_started_at: NOW - time::Duration::seconds(20), ..snap() }, Event::Resumed(&pending), NO, Want::Recheck(5.0, 5.0)),
        ("reconciled: pending past the deadline", past_deadline.clone(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("resumed: pending", snap(), Event::Resumed(&pending), NO, Want::Recheck(0.0, 1.0)),
        ("resumed: pending past the deadline", past_deadline.clone(), Event::Resumed(&pending), NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("unsendable (a sealed body that does not open)", snap(), Event::Unsendable("secret changed"), NO, Want::Final(Failed, Some("unsendable"), Some(O::Unsendable))),
        ("unsendable after a maybe-sent attempt", maybe_sent.clone(), Event::Unsendable("secret changed"), NO, Want::Final(Unknown, Some("unsendable"), Some(O::Unsendable))),
        ("resumed: sent", snap(), Event::Resumed(&sent), NO, Want::Final(Sent, None, Some(O::Reconciled))),
        ("resumed: not sent", snap(), Event::Resumed(&not_sent), NO, Want::Proceed),
        ("resumed: unknown", snap(), Event::Resumed(&unknown), NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("starting in time", snap(), starting(false, Some((1, O::Expired))), NO, Want::Proceed),
        ("starting past the deadline", past_deadline.clone(), starting(false, Some((1, O::Expired))), NO, Want::Final(Failed, Some("retries_exhausted"), Some(O::Expired))),
        ("starting past the deadline, no attempt open", past_deadline.clone(), starting(false, None), NO, Want::Final(Failed, Some("retries_exhausted"), None)),
        ("starting past the validity, an open attempt maybe sent", past_validity_maybe_sent.clone(), starting(false, Some((2, O::Lost))), NO, Want::Final(Unknown, Some("validity_expired"), Some(O::Lost))),
        ("starting, recipient opted out", snap(), starting(true, Some((1, O::Expired))), NO, Want::Final(Failed, Some("recipient_opted_out"), Some(O::OptedOut))),
        ("starting, opted out after a maybe-sent attempt", maybe_sent.clone(), starting(true, Some((2, O::Expired))), NO, Want::Final(Unknown, Some("recipient_opted_out"), Some(O::OptedOut))),
        ("reconciled: pending past the validity (a stopped code)", past_validity_maybe_sent.clone(), Event::Reconciled { after: &amb, answer: &pending }, NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Ambiguous))),
        ("resumed: pending past the validity", past_validity_maybe_sent.clone(), Event::Resumed(&pending), NO, Want::Final(Unknown, Some("outcome_unknown"), Some(O::Lost))),
        ("stopped before the call (its verification moved on or ended)", snap(), Event::Stopped, NO, Want::Final(Status::Canceled, Some("stopped"), Some(O::Expired))),
        ("stopped before the call, an earlier attempt maybe sent", maybe_sent.clone(), Event::Stopped, NO, Want::Final(Unknown, Some("stopped"), Some(O::Expired))),
    ];
    for (name, snap, event, keys, want) in &rows {
        let t = decide(snap, event, NOW, &policy(), *keys);
        assert!(matches(&t, want), "{name}: got {t:?}, want {want:?}");
    }
}

#[test]
fn an_accepted_answer_carries_the_provider_id() {
    let t = decide(&snap(), &Event::Answered(&accepted()), NOW, &policy(), NO);
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
            route_order: None,
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
    let t = decide(&snap, &Event::Answered(&ambiguous()), NOW, &policy(), NO);
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
