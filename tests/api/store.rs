//! The storage interface itself, on both backends: the guarantees the
//! delivery code leans on.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use sendonce::domain::{Encoding, IdempotencyKey, MessageId, Phone, Status};
use sendonce::store::{Claim, Finish, Lease, NewMessage, Store, StoredResponse};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::helpers::*;

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00 UTC);

fn lease(owner: &str, expires_at: OffsetDateTime) -> Lease {
    Lease {
        token: Uuid::new_v4(),
        owner: owner.into(),
        expires_at,
    }
}

fn message(tenant_id: Uuid, key: &str) -> NewMessage {
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164("+14155550100").unwrap(),
        from: None,
        body: "hi".into(),
        segments: 1,
        encoding: Encoding::Gsm7,
        metadata: BTreeMap::new(),
        validity_seconds: None,
        provider: "http".into(),
        created_at: T0,
        expires_at: None,
        deadline_at: T0 + time::Duration::hours(1),
    }
}

async fn setup(backend: Backend) -> (std::sync::Arc<dyn Store>, std::sync::Arc<dyn Store>, Uuid) {
    let url = fresh_database_on(backend).await;
    let (a, _) = open_store(&url, Duration::from_secs(5));
    let (b, _) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = a.create_tenant("t", &key.stored).await.unwrap();
    (a, b, tenant)
}

async fn the_key_admits_one_insert(backend: Backend) {
    let (a, _, tenant) = setup(backend).await;
    let first = a
        .insert_message(&message(tenant, "K"), &lease("a", T0))
        .await
        .unwrap();
    assert!(matches!(first, Claim::Created(_)));
    let mut other = message(tenant, "K");
    other.fingerprint = vec![2; 32];
    match a.insert_message(&other, &lease("b", T0)).await.unwrap() {
        Claim::Existing(state) => {
            assert_eq!(state.fingerprint, vec![1; 32]);
            assert_eq!(state.status, Status::Processing);
            assert_eq!(state.response, None);
        }
        Claim::Created(_) => panic!("a second insert with one key must not create"),
    }
}

async fn claims_never_hand_one_row_to_two_claimers(backend: Backend) {
    let (a, b, tenant) = setup(backend).await;
    for i in 0..40 {
        a.insert_message(&message(tenant, &format!("K{i}")), &lease("dead", T0))
            .await
            .unwrap();
    }
    let later = T0 + time::Duration::minutes(1);
    let until = later + time::Duration::seconds(30);
    let (x, y) = tokio::join!(
        a.claim_due("a", later, until, 25),
        b.claim_due("b", later, until, 25)
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.len() + y.len(), 40, "every expired lease is claimed once");
    let xs: HashSet<MessageId> = x.iter().map(|(m, _)| m.id).collect();
    let ys: HashSet<MessageId> = y.iter().map(|(m, _)| m.id).collect();
    assert!(xs.is_disjoint(&ys));
    assert!(
        x.iter()
            .all(|(m, l)| m.last_attempt_open && l.owner == "a" && m.lease.as_ref() == Some(l))
    );
    // Nothing is claimable again until those new leases expire.
    assert!(
        a.claim_due("a", later, until, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn finishing_writes_are_fenced_on_the_lease(backend: Backend) {
    let (a, _, tenant) = setup(backend).await;
    let old = lease("old", T0 + time::Duration::seconds(30));
    let m = message(tenant, "FENCE");
    a.insert_message(&m, &old).await.unwrap();
    let later = T0 + time::Duration::seconds(31);
    let claimed = a
        .claim_due("new", later, later + time::Duration::seconds(30), 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let new = claimed[0].1.clone();
    let finish = |token: Uuid, body: &str| Finish {
        id: m.id,
        lease_token: token,
        status: Status::Sent,
        provider_message_id: Some(body.into()),
        error: None,
        sent_at: Some(later),
        updated_at: later,
        response: StoredResponse {
            status_code: 201,
            body: body.as_bytes().to_vec(),
        },
        attempt: None,
    };
    assert!(
        a.start_attempt(m.id, &old, later).await.unwrap().is_none(),
        "stale start"
    );
    assert!(!a.renew_lease(m.id, &old).await.unwrap(), "stale renewal");
    assert!(
        !a.finish(&finish(old.token, "stale")).await.unwrap(),
        "stale finish"
    );
    assert_eq!(a.start_attempt(m.id, &new, later).await.unwrap(), Some(2));
    assert!(a.finish(&finish(new.token, "fresh")).await.unwrap());
    assert!(
        !a.finish(&finish(new.token, "again")).await.unwrap(),
        "final is final"
    );
    let state = a.state_by_id(m.id).await.unwrap().unwrap();
    assert_eq!(state.status, Status::Sent);
    assert_eq!(state.response.unwrap().body, b"fresh");
    let history = a.attempts(m.id).await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].outcome.as_deref(), Some("lost"));
}

async fn purge_keeps_what_is_still_processing(backend: Backend) {
    let (a, _, tenant) = setup(backend).await;
    let l = lease("a", T0 + time::Duration::seconds(30));
    let done = message(tenant, "DONE");
    a.insert_message(&done, &l).await.unwrap();
    a.finish(&Finish {
        id: done.id,
        lease_token: l.token,
        status: Status::Failed,
        provider_message_id: None,
        error: None,
        sent_at: None,
        updated_at: T0,
        response: StoredResponse {
            status_code: 201,
            body: b"{}".to_vec(),
        },
        attempt: None,
    })
    .await
    .unwrap();
    a.insert_message(&message(tenant, "RUNNING"), &lease("a", T0))
        .await
        .unwrap();
    let cutoff = T0 + time::Duration::days(60);
    assert_eq!(a.purge(cutoff, 10).await.unwrap(), 1);
    assert!(a.key_state(tenant, "DONE").await.unwrap().is_none());
    assert!(a.key_state(tenant, "RUNNING").await.unwrap().is_some());
    assert_eq!(a.oldest_processing().await.unwrap(), Some(T0));
}

on_both_backends!(
    the_key_admits_one_insert,
    claims_never_hand_one_row_to_two_claimers,
    finishing_writes_are_fenced_on_the_lease,
    purge_keeps_what_is_still_processing,
);
