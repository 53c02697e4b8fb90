//! The drivers themselves (issue 25): each store statement and transaction
//! the two backends now share, called directly on the store (no HTTP), on
//! Postgres and on SQLite, the way River tests its drivers. One case, two
//! tests: `driver::postgres::name` and `driver::sqlite::name`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sendonce::domain::{AttemptOutcome, Encoding, IdempotencyKey, MessageId, Phone};
use sendonce::store::{
    AttemptResult, Circuit, CircuitState, Claim, Lease, MessageEvent, MoveOn, NewMessage, Store,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::helpers::*;

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00.123456 UTC);
const LIVE: Duration = Duration::from_secs(30);

struct Fixture {
    store: Arc<dyn Store>,
    db: Db,
    tenant: Uuid,
}

async fn fixture(backend: Backend) -> Fixture {
    let url = fresh_database_on(backend).await;
    let (store, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    Fixture { store, db, tenant }
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
        provider: "a".into(),
        sender: None,
        created_at: T0,
        expires_at: None,
        deadline_at: T0 + time::Duration::hours(1),
    }
}

/// A message in flight on provider `a`, its first attempt open.
async fn in_flight(f: &Fixture, key: &str) -> (MessageId, Lease) {
    let lease = Lease::new("i1", LIVE);
    let m = message(f.tenant, key);
    let claim = f.store.insert_message(&m, &lease).await.unwrap();
    assert!(matches!(claim, Claim::Created(_)));
    (m.id, lease)
}

/// The premise of the shared SQL: both drivers bind `$N` by its number,
/// out of order and repeated.
async fn numbered_parameters_bind_by_number(backend: Backend) {
    let f = fixture(backend).await;
    let sql = "SELECT CAST($2 AS TEXT) || CAST($1 AS TEXT) || CAST($2 AS TEXT)";
    let got: String = match &f.db {
        Db::Pg(p) => {
            sqlx::query_scalar(sql)
                .bind("x")
                .bind("y")
                .fetch_one(p)
                .await
        }
        Db::Sqlite(p) => {
            sqlx::query_scalar(sql)
                .bind("x")
                .bind("y")
                .fetch_one(p)
                .await
        }
    }
    .unwrap();
    assert_eq!(got, "yxy");
}

async fn circuits_are_compare_and_set_on_the_version(backend: Backend) {
    let f = fixture(backend).await;
    assert!(f.store.circuits().await.unwrap().is_empty());
    let mut c = Circuit::closed("a", T0);
    c.version = 1;
    c.state = CircuitState::Open;
    c.failures = 3;
    c.window_started_at = Some(T0 - time::Duration::seconds(5));
    c.opened_at = Some(T0);
    assert!(f.store.put_circuit(&c).await.unwrap(), "the first write");
    assert!(
        !f.store.put_circuit(&c).await.unwrap(),
        "a second writer of version 1 loses"
    );
    let stored = f.store.circuits().await.unwrap();
    assert_eq!(stored, vec![c.clone()]);
    c.version = 2;
    c.state = CircuitState::HalfOpen;
    c.probe_started_at = Some(T0 + time::Duration::seconds(1));
    assert!(f.store.put_circuit(&c).await.unwrap());
    let mut b = Circuit::closed("b", T0);
    b.version = 1;
    assert!(f.store.put_circuit(&b).await.unwrap());
    let stored = f.store.circuits().await.unwrap();
    assert_eq!(stored, vec![c, b], "in provider order, as last written");
}

async fn message_events_are_kept_in_time_order(backend: Backend) {
    let f = fixture(backend).await;
    let (id, _) = in_flight(&f, "K").await;
    let event = |at, kind: &str| MessageEvent {
        at,
        kind: kind.into(),
        provider: "a".into(),
        to_provider: None,
        detail: format!("{kind} detail"),
    };
    let later = event(T0 + time::Duration::seconds(2), "circuit_closed");
    let earlier = event(T0, "circuit_opened");
    f.store.add_message_event(id, &later).await.unwrap();
    f.store.add_message_event(id, &earlier).await.unwrap();
    let events = f.store.message_events(id).await.unwrap();
    assert_eq!(events, vec![earlier, later]);
    assert!(
        f.store
            .message_events(MessageId::new())
            .await
            .unwrap()
            .is_empty()
    );
}

fn move_on(id: MessageId, lease: &Lease, closing: Option<AttemptResult>) -> MoveOn {
    MoveOn {
        id,
        lease: lease.clone(),
        from: "a".into(),
        to: "b".into(),
        closing,
        reason: "a is down".into(),
        now: T0 + time::Duration::seconds(1),
        sender: Some("Acme".into()),
    }
}

async fn move_on_moves_the_open_attempt_when_nothing_was_sent(backend: Backend) {
    let f = fixture(backend).await;
    let (id, lease) = in_flight(&f, "K").await;
    let number = f.store.move_on(&move_on(id, &lease, None)).await.unwrap();
    assert_eq!(number, Some(1), "the same attempt, now on b");
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.provider, "b");
    assert_eq!(m.attempts, 1);
    let attempts = f.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].provider, "b");
    assert_eq!(attempts[0].finished_at, None);
    let events = f.store.message_events(id).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "failover");
    assert_eq!(events[0].to_provider.as_deref(), Some("b"));
    assert_eq!(events[0].detail, "a is down");
}

async fn move_on_closes_the_answered_attempt_and_opens_the_next(backend: Backend) {
    let f = fixture(backend).await;
    let (id, lease) = in_flight(&f, "K").await;
    let closing = AttemptResult {
        number: 1,
        outcome: AttemptOutcome::Refused,
        http_status: Some(401),
        provider_code: Some("auth".into()),
        error: Some("refused".into()),
        provider_message_id: None,
        finished_at: T0 + time::Duration::seconds(1),
    };
    let number = f
        .store
        .move_on(&move_on(id, &lease, Some(closing)))
        .await
        .unwrap();
    assert_eq!(number, Some(2));
    let attempts = f.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].provider, "a");
    assert_eq!(attempts[0].outcome.as_deref(), Some("refused"));
    assert_eq!(attempts[0].http_status, Some(401));
    assert_eq!(attempts[1].provider, "b");
    assert_eq!(attempts[1].finished_at, None);
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!((m.provider.as_str(), m.attempts), ("b", 2));
    assert_eq!(m.last_attempt_sender.as_deref(), Some("Acme"));
    let held = m.lease.expect("still leased");
    assert_eq!(held.token, lease.token);
}

async fn move_on_is_fenced_on_the_lease(backend: Backend) {
    let f = fixture(backend).await;
    let (id, _) = in_flight(&f, "K").await;
    let stranger = Lease::new("i2", LIVE);
    assert_eq!(
        f.store
            .move_on(&move_on(id, &stranger, None))
            .await
            .unwrap(),
        None
    );
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.provider, "a", "nothing moved");
    assert!(f.store.message_events(id).await.unwrap().is_empty());
}

async fn opt_outs_add_once_list_in_pages_and_remove(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    for n in ["+3", "+1", "+2"] {
        assert!(s.add_opt_out(f.tenant, n, "api", T0).await.unwrap());
    }
    assert!(!s.add_opt_out(f.tenant, "+1", "inbound", T0).await.unwrap());
    let page = s.list_opt_outs(f.tenant, None, 2).await.unwrap();
    let numbers: Vec<_> = page.iter().map(|o| o.number.as_str()).collect();
    assert_eq!(numbers, ["+1", "+2"]);
    assert_eq!(page[0].source, "api", "the first add stands");
    assert_eq!(page[0].created_at, T0);
    let rest = s.list_opt_outs(f.tenant, Some("+2"), 2).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].number, "+3");
    assert!(
        s.list_opt_outs(Uuid::new_v4(), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.remove_opt_out(f.tenant, "+2").await.unwrap());
    assert!(!s.remove_opt_out(f.tenant, "+2").await.unwrap());
    assert_eq!(s.list_opt_outs(f.tenant, None, 10).await.unwrap().len(), 2);
}

on_both_backends!(
    numbered_parameters_bind_by_number,
    circuits_are_compare_and_set_on_the_version,
    message_events_are_kept_in_time_order,
    move_on_moves_the_open_attempt_when_nothing_was_sent,
    move_on_closes_the_answered_attempt_and_opens_the_next,
    move_on_is_fenced_on_the_lease,
    opt_outs_add_once_list_in_pages_and_remove,
);
