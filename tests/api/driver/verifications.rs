//! The verification transactions (`store/shared/verifications.rs`), called
//! directly on both stores: the start's limits and pause, the fenced write
//! of a check or resend with its stored answer and message, the expiry
//! sweep and cancel with their webhook events.

use std::time::Duration;

use sendonce::store::{
    Changed, Lease, NewVerification, OpKey, OpKind, StartOutcome, StartPolicy, StoredResponse,
    VerificationRecord, send_key,
};
use sendonce::verify::decide::{self, PausePolicy, VerificationStatus};
use uuid::Uuid;

use super::{Fixture, LIVE, T0, endpoint, fixture, message};
use crate::helpers::*;

/// In-flight caps no case here reaches.
const NO_CAPS: sendonce::store::InFlightCaps = sendonce::store::InFlightCaps {
    per_endpoint: 100,
    per_tenant: 100,
};

const TO: &str = "+14155550100";

fn policy() -> StartPolicy {
    StartPolicy {
        number_per_hour: 0,
        prefix_per_hour: 0,
        pause: PausePolicy {
            min_starts: 0,
            min_approval_percent: 0,
        },
        country_pause: PausePolicy {
            min_starts: 0,
            min_approval_percent: 0,
        },
        pause_window: Duration::from_secs(3600),
        pause_for: Duration::from_secs(600),
        refused_here: None,
    }
}

fn new_verification(f: &Fixture, key: &str, at: time::OffsetDateTime) -> NewVerification {
    NewVerification {
        id: Uuid::now_v7(),
        tenant_id: f.tenant,
        idempotency_key: key.into(),
        fingerprint: vec![7; 32],
        to: TO.into(),
        country: Some("US".into()),
        prefix: "+1415".into(),
        code_length: 6,
        code_mac: vec![1; 32],
        code_sealed: vec![2; 40],
        template: None,
        checks_remaining: 3,
        created_at: at,
        expires_at: at + time::Duration::minutes(10),
        channels: sendonce::verify::Channels::default(),
        fallback_after: sendonce::domain::FallbackAfter::default(),
    }
}

/// Starts a verification under `key` at `at`; its record as stored.
async fn started(f: &Fixture, key: &str, at: time::OffsetDateTime) -> VerificationRecord {
    let v = new_verification(f, key, at);
    let mut m = message(f.tenant, &send_key(v.id, 1));
    m.created_at = at;
    let lease = Lease::new("i1", LIVE);
    let outcome = f
        .store
        .start_verification(&v, &m, &lease, &policy())
        .await
        .unwrap();
    let StartOutcome::Created {
        verification,
        message: first,
    } = outcome
    else {
        panic!("not created: {outcome:?}");
    };
    assert_eq!(first.id, m.id);
    assert_eq!(first.lease.as_ref().map(|l| l.token), Some(lease.token));
    let stored = f.store.verification(f.tenant, v.id).await.unwrap().unwrap();
    assert_eq!(stored.sends, verification.sends);
    stored
}

fn answer(body: &str) -> StoredResponse {
    StoredResponse {
        status_code: 200,
        body: body.as_bytes().to_vec(),
    }
}

async fn starts_replay_their_key_and_keep_their_limits(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let first = started(&f, "s1", T0).await;
    assert_eq!(
        (first.status, first.sends, first.checks_remaining),
        (VerificationStatus::Pending, 1, 3)
    );
    let m = f.store.message(f.tenant, &send_key(first.id, 1)).await;
    assert!(m.unwrap().is_some(), "the first message is stored with it");

    let lease = Lease::new("i1", LIVE);
    let mut again = new_verification(&f, "s1", T0);
    again.id = Uuid::now_v7();
    let m = message(f.tenant, &send_key(again.id, 1));
    let out = s
        .start_verification(&again, &m, &lease, &policy())
        .await
        .unwrap();
    assert!(
        matches!(&out, StartOutcome::Existing(v) if v.id == first.id),
        "{out:?}"
    );
    assert!(
        s.message(f.tenant, m.idempotency_key.as_str())
            .await
            .unwrap()
            .is_none()
    );

    let limited = StartPolicy {
        number_per_hour: 1,
        ..policy()
    };
    let other = new_verification(&f, "s2", T0 + time::Duration::minutes(1));
    let m = message(f.tenant, &send_key(other.id, 1));
    let out = s
        .start_verification(&other, &m, &lease, &limited)
        .await
        .unwrap();
    let StartOutcome::Limited { limit, retry_after } = out else {
        panic!("not limited: {out:?}");
    };
    assert_eq!(limit, "verifications per destination number");
    assert_eq!(
        retry_after,
        Duration::from_secs(59 * 60),
        "free an hour after the first"
    );
    assert!(s.verification(f.tenant, other.id).await.unwrap().is_none());

    // One concluded start of which none was approved pauses the prefix, once.
    let pausing = StartPolicy {
        pause: PausePolicy {
            min_starts: 1,
            min_approval_percent: 50,
        },
        ..policy()
    };
    let late = T0 + time::Duration::minutes(11);
    let third = new_verification(&f, "s3", late);
    let m = message(f.tenant, &send_key(third.id, 1));
    let out = s
        .start_verification(&third, &m, &lease, &pausing)
        .await
        .unwrap();
    assert!(
        matches!(out, StartOutcome::Paused { until, newly: true } if until == late + time::Duration::minutes(10)),
        "{out:?}"
    );
    let out = s
        .start_verification(&third, &m, &lease, &pausing)
        .await
        .unwrap();
    assert!(
        matches!(out, StartOutcome::Paused { newly: false, .. }),
        "{out:?}"
    );
}

async fn a_check_is_written_once_fenced_on_the_row_as_read(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    s.create_webhook_endpoint(&endpoint(&f, "https://a.example/hook"), 20)
        .await
        .unwrap()
        .expect("under the cap");
    let read = started(&f, "v", T0).await;
    let now = T0 + time::Duration::seconds(5);
    let wrong = read.checked(decide::Check::Wrong { remaining: 2 }, now);
    let op = OpKey {
        key: "c1",
        fingerprint: b"mac-1",
    };
    let first = answer("first");
    let out = s
        .check_verification(&read, &wrong, Some((op, &first)))
        .await
        .unwrap();
    assert!(matches!(out, Changed::Written(None)), "{out:?}");
    let after = s.verification(f.tenant, read.id).await.unwrap().unwrap();
    assert_eq!(
        (after.status, after.checks_remaining),
        (VerificationStatus::Pending, 2)
    );
    assert_eq!(after.updated_at, now);

    // The same key again: its first answer, nothing written.
    let other = answer("other");
    let out = s
        .check_verification(
            &after,
            &after.checked(decide::Check::Approve, now),
            Some((op, &other)),
        )
        .await
        .unwrap();
    let Changed::Replay(done) = out else {
        panic!("not a replay: {out:?}");
    };
    assert_eq!(
        (done.fingerprint.as_slice(), done.response),
        (&b"mac-1"[..], first)
    );
    let stored = s
        .verification_op(read.id, OpKind::Check, "c1")
        .await
        .unwrap();
    assert!(stored.is_some());
    assert!(
        s.verification_op(read.id, OpKind::Resend, "c1")
            .await
            .unwrap()
            .is_none()
    );

    // Decided from the row before the first check: stale, nothing written.
    let op2 = OpKey {
        key: "c2",
        fingerprint: b"mac-2",
    };
    let approve = read.checked(decide::Check::Approve, now);
    let out = s
        .check_verification(&read, &approve, Some((op2, &other)))
        .await
        .unwrap();
    assert!(matches!(out, Changed::Stale), "{out:?}");
    assert!(
        s.verification_op(read.id, OpKind::Check, "c2")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.verification(f.tenant, read.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        VerificationStatus::Pending
    );

    // From the row as it now is: approved, with its webhook event.
    let approve = after.checked(decide::Check::Approve, now);
    let out = s
        .check_verification(&after, &approve, Some((op2, &other)))
        .await
        .unwrap();
    assert!(matches!(out, Changed::Written(None)), "{out:?}");
    let done = s.verification(f.tenant, read.id).await.unwrap().unwrap();
    assert_eq!(
        (done.status, done.approved_at),
        (VerificationStatus::Approved, Some(now))
    );
    let claimed = s
        .claim_webhook_deliveries("w1", now + time::Duration::hours(1), LIVE, 10, NO_CAPS)
        .await
        .unwrap();
    let types: Vec<_> = claimed
        .iter()
        .map(|d| d.event.event_type.as_str())
        .collect();
    assert_eq!(
        types,
        ["verification.approved"],
        "one event, for the move out of pending"
    );
}

async fn a_resend_writes_its_message_and_answer_in_one_change(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let read = started(&f, "v", T0).await;
    let now = T0 + time::Duration::seconds(40);
    let after = read.resent(now);
    let mut m = message(f.tenant, &send_key(read.id, 2));
    m.created_at = now;
    let lease = Lease::new("i1", LIVE);
    let op = OpKey {
        key: "r1",
        fingerprint: b"resend",
    };
    let body = StoredResponse {
        status_code: 201,
        body: b"sent".to_vec(),
    };
    let out = s
        .resend_verification(&read, &after, (op, &body), &m, &lease)
        .await
        .unwrap();
    let Changed::Written(Some(sent)) = out else {
        panic!("not written with its message: {out:?}");
    };
    assert_eq!(sent.id, m.id);
    assert_eq!(sent.lease.as_ref().map(|l| l.token), Some(lease.token));
    let attempts = s.attempts(m.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "its first attempt, started");
    let v = s.verification(f.tenant, read.id).await.unwrap().unwrap();
    assert_eq!((v.sends, v.last_sent_at), (2, now));
    let stored = s
        .verification_op(read.id, OpKind::Resend, "r1")
        .await
        .unwrap();
    assert_eq!(stored.map(|o| o.response), Some(body.clone()));

    // Retried under its key: the answer, and no second message.
    let mut m3 = message(f.tenant, &send_key(read.id, 3));
    m3.created_at = now;
    let out = s
        .resend_verification(&v, &v.resent(now), (op, &body), &m3, &lease)
        .await
        .unwrap();
    assert!(
        matches!(out, Changed::Replay(ref d) if d.response == body),
        "{out:?}"
    );
    // Another key, decided from the row before the first resend: stale.
    let op2 = OpKey {
        key: "r2",
        fingerprint: b"resend",
    };
    let out = s
        .resend_verification(&read, &after, (op2, &body), &m3, &lease)
        .await
        .unwrap();
    assert!(matches!(out, Changed::Stale), "{out:?}");
    assert!(
        s.message_by_id(m3.id).await.unwrap().is_none(),
        "nothing sent"
    );
    assert_eq!(
        s.verification(f.tenant, read.id)
            .await
            .unwrap()
            .unwrap()
            .sends,
        2
    );
}

async fn expiry_and_cancel_write_their_events_once(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    s.create_webhook_endpoint(&endpoint(&f, "https://a.example/hook"), 20)
        .await
        .unwrap()
        .expect("under the cap");
    let a = started(&f, "a", T0).await;
    let b = started(&f, "b", T0 + time::Duration::minutes(5)).await;
    let at = T0 + time::Duration::minutes(12);
    let expired = s.expire_verifications(at, 10).await.unwrap();
    let ids: Vec<_> = expired.iter().map(|v| (v.id, v.status)).collect();
    assert_eq!(
        ids,
        [(a.id, VerificationStatus::Expired)],
        "only the one past its time"
    );
    assert!(s.expire_verifications(at, 10).await.unwrap().is_empty());

    let canceled = s
        .cancel_verification(f.tenant, b.id, at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (canceled.status, canceled.updated_at),
        (VerificationStatus::Canceled, at)
    );
    let again = s
        .cancel_verification(f.tenant, a.id, at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.status,
        VerificationStatus::Expired,
        "an ended one stays as it is"
    );
    assert!(
        s.cancel_verification(Uuid::new_v4(), b.id, at)
            .await
            .unwrap()
            .is_none()
    );

    let claimed = s
        .claim_webhook_deliveries("w1", at + time::Duration::hours(1), LIVE, 10, NO_CAPS)
        .await
        .unwrap();
    let mut types: Vec<_> = claimed
        .iter()
        .map(|d| d.event.event_type.as_str())
        .collect();
    types.sort_unstable();
    assert_eq!(types, ["verification.canceled", "verification.expired"]);

    let cutoff = T0 + time::Duration::minutes(14);
    assert_eq!(s.purge_verifications(cutoff, 10).await.unwrap(), 1);
    assert!(s.verification(f.tenant, a.id).await.unwrap().is_none());
    assert!(s.verification(f.tenant, b.id).await.unwrap().is_some());
}

/// Pumping spread over many ranges of one country: each prefix stays under
/// its own minimum, the country's starts together do not (issue 29, 14).
async fn a_country_whose_codes_go_unapproved_is_paused_across_its_prefixes(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let lease = Lease::new("i1", LIVE);
    let guarded = StartPolicy {
        pause: PausePolicy {
            min_starts: 20,
            min_approval_percent: 20,
        },
        country_pause: PausePolicy {
            min_starts: 5,
            min_approval_percent: 20,
        },
        ..policy()
    };
    let start = |key: &str, to: &str, country: &str, at| {
        let mut v = new_verification(&f, key, at);
        v.to = to.into();
        v.prefix = to[..to.len() - 4].into();
        v.country = Some(country.into());
        v
    };
    // Five US codes, each to a range of its own, none ever approved: they
    // expire unapproved ten minutes later.
    for i in 0..5 {
        let v = start(&format!("us{i}"), &format!("+1415{i}550100"), "US", T0);
        let m = message(f.tenant, &send_key(v.id, 1));
        let out = s.start_verification(&v, &m, &lease, &guarded).await;
        assert!(matches!(out, Ok(StartOutcome::Created { .. })), "{out:?}");
    }
    let late = T0 + time::Duration::minutes(11);
    let next = start("us-next", "+12125550100", "US", late);
    let m = message(f.tenant, &send_key(next.id, 1));
    let out = s.start_verification(&next, &m, &lease, &guarded).await;
    assert!(
        matches!(out, Ok(StartOutcome::Paused { newly: true, until }) if until == late + time::Duration::minutes(10)),
        "a new US range is paused by its country's record: {out:?}"
    );
    let again = start("us-again", "+13105550100", "US", late);
    let m = message(f.tenant, &send_key(again.id, 1));
    let out = s.start_verification(&again, &m, &lease, &guarded).await;
    assert!(
        matches!(out, Ok(StartOutcome::Paused { newly: false, .. })),
        "{out:?}"
    );
    let gb = start("gb", "+442079460958", "GB", late);
    let m = message(f.tenant, &send_key(gb.id, 1));
    let out = s.start_verification(&gb, &m, &lease, &guarded).await;
    assert!(
        matches!(out, Ok(StartOutcome::Created { .. })),
        "another country is not paused: {out:?}"
    );
    let off = StartPolicy {
        country_pause: PausePolicy {
            min_starts: 0,
            min_approval_percent: 20,
        },
        ..guarded
    };
    let unguarded = start("us-off", "+16175550100", "US", late);
    let m = message(f.tenant, &send_key(unguarded.id, 1));
    let out = s.start_verification(&unguarded, &m, &lease, &off).await;
    assert!(
        matches!(out, Ok(StartOutcome::Created { .. })),
        "with the country's minimum at 0 no country is paused: {out:?}"
    );
}

async fn the_verify_secret_is_the_first_callers(backend: Backend) {
    let f = fixture(backend).await;
    assert_eq!(f.store.verify_secret(b"one").await.unwrap(), b"one");
    assert_eq!(f.store.verify_secret(b"two").await.unwrap(), b"one");
}

on_both_backends!(
    starts_replay_their_key_and_keep_their_limits,
    a_check_is_written_once_fenced_on_the_row_as_read,
    a_resend_writes_its_message_and_answer_in_one_change,
    expiry_and_cancel_write_their_events_once,
    the_verify_secret_is_the_first_callers,
    a_country_whose_codes_go_unapproved_is_paused_across_its_prefixes,
);
