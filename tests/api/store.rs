//! The storage interface itself, on both backends: the guarantees the
//! delivery code leans on.

use std::collections::{BTreeMap, HashSet};
use std::error::Error as _;
use std::time::Duration;

use sendonce::domain::{AttemptOutcome, Encoding, IdempotencyKey, MessageId, Phone, Status};
use sendonce::store::postgres::PoolSettings;
use sendonce::store::time::DbTime;
use sendonce::store::{
    AttemptResult, Claim, Finish, Lease, NewMessage, PgStore, SqliteStore, Store, StoreError,
    StoredResponse,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::helpers::*;

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00 UTC);

/// A lease that is live for a good while, in the database's clock.
const LIVE: Duration = Duration::from_secs(30);
/// A lease that has expired by the time anything reads it.
const EXPIRED: Duration = Duration::ZERO;

fn lease(owner: &str, ttl: Duration) -> Lease {
    Lease::new(owner, ttl)
}

fn message(tenant_id: Uuid, key: &str) -> NewMessage {
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164("+14155550100").unwrap().into(),
        from: None,
        body: "hi".into(),
        segments: 1,
        encoding: Encoding::Gsm7,
        metadata: BTreeMap::new(),
        validity_seconds: None,
        provider: "http".into(),
        route: None,
        route_order: None,
        sender: None,
        created_at: T0,
        expires_at: None,
        deadline_at: T0 + time::Duration::hours(1),
        cost: None,
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
        .insert_message(&message(tenant, "K"), &lease("a", LIVE))
        .await
        .unwrap();
    assert!(matches!(first, Claim::Created(_)));
    let mut other = message(tenant, "K");
    other.fingerprint = vec![2; 32];
    match a.insert_message(&other, &lease("b", LIVE)).await.unwrap() {
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
        a.insert_message(&message(tenant, &format!("K{i}")), &lease("dead", EXPIRED))
            .await
            .unwrap();
    }
    let later = T0 + time::Duration::minutes(1);
    let (x, y) = tokio::join!(
        a.claim_due("a", later, LIVE, 25),
        b.claim_due("b", later, LIVE, 25)
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.len() + y.len(), 40, "every expired lease is claimed once");
    let xs: HashSet<MessageId> = x.iter().map(|(m, _)| m.id).collect();
    let ys: HashSet<MessageId> = y.iter().map(|(m, _)| m.id).collect();
    assert!(xs.is_disjoint(&ys));
    assert!(x.iter().all(|(m, l)| m.last_attempt_open
        && l.owner == "a"
        && l.ttl == LIVE
        && m.lease.as_ref().map(|h| (h.token, &h.owner)) == Some((l.token, &l.owner))));
    // Nothing is claimable again until those new leases expire.
    assert!(a.claim_due("a", later, LIVE, 100).await.unwrap().is_empty());
}

async fn finishing_writes_are_fenced_on_the_lease(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (a, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = a.create_tenant("t", &key.stored).await.unwrap();
    let old = lease("old", EXPIRED);
    let m = message(tenant, "FENCE");
    a.insert_message(&m, &old).await.unwrap();
    let later = T0 + time::Duration::seconds(31);
    let claimed = a.claim_due("new", later, LIVE, 10).await.unwrap();
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
        opt_out: None,
    };
    assert!(
        a.start_attempt(m.id, &old, later, None)
            .await
            .unwrap()
            .is_none(),
        "stale start"
    );
    assert!(!a.renew_lease(m.id, &old).await.unwrap(), "stale renewal");
    // A stale finish that closes the attempt it made: the fence keeps the
    // attempt open (the new owner's start records it as lost) and writes no
    // event.
    let stale = Finish {
        attempt: Some(AttemptResult {
            number: 1,
            outcome: AttemptOutcome::Sent,
            http_status: Some(200),
            provider_code: None,
            error: None,
            provider_message_id: Some("stale".into()),
            finished_at: later,
        }),
        ..finish(old.token, "stale")
    };
    assert!(!a.finish(&stale).await.unwrap(), "stale finish");
    assert_eq!(
        a.start_attempt(m.id, &new, later, None).await.unwrap(),
        Some(2)
    );
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
    // One final write, one event: the fenced-out finishes wrote none. (The
    // table itself: Postgres's event feed holds back events while any older
    // transaction on the server is open, another test's included.)
    assert_eq!(db.count("SELECT count(*) FROM webhook_events").await, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE type = 'message.sent'")
            .await,
        1
    );
}

async fn purge_keeps_what_is_still_processing(backend: Backend) {
    let (a, _, tenant) = setup(backend).await;
    let l = lease("a", LIVE);
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
        opt_out: None,
    })
    .await
    .unwrap();
    a.insert_message(&message(tenant, "RUNNING"), &lease("a", LIVE))
        .await
        .unwrap();
    let cutoff = T0 + time::Duration::days(60);
    assert_eq!(a.purge(cutoff, 10).await.unwrap(), 1);
    assert!(a.key_state(tenant, "DONE").await.unwrap().is_none());
    assert!(a.key_state(tenant, "RUNNING").await.unwrap().is_some());
    assert_eq!(a.oldest_processing().await.unwrap(), Some(T0));
}

async fn a_unique_violation_is_a_conflict_that_keeps_its_cause(backend: Backend) {
    let (a, _, _) = setup(backend).await;
    let key = sendonce::apikey::generate();
    let err = a.create_tenant("t", &key.stored).await.unwrap_err();
    let StoreError::Conflict { constraint, .. } = &err else {
        panic!("a taken tenant name must be a conflict, got {err:?}");
    };
    if backend == Backend::Postgres {
        assert_eq!(constraint.as_deref(), Some("tenants_name_key"));
    }
    let source = err
        .source()
        .expect("the driver's error is kept as the source");
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        panic!("the source is the database's error, got {source:?}");
    };
    assert_eq!(db.kind(), sqlx::error::ErrorKind::UniqueViolation);
    assert!(err.to_string().starts_with("conflict on "), "{err}");
}

async fn an_unreachable_database_is_unavailable(backend: Backend) {
    let store: Box<dyn Store> = match backend {
        Backend::Postgres => {
            // A port that was just free: nothing listens there.
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            Box::new(
                PgStore::connect_lazy(
                    &format!("postgres://postgres@127.0.0.1:{port}/none"),
                    &PoolSettings {
                        max_connections: 1,
                        acquire_timeout: Duration::from_millis(300),
                    },
                )
                .unwrap(),
            )
        }
        Backend::Sqlite => {
            // A file in a directory that does not exist cannot be opened or
            // created (the tests run as root, so permissions would not do).
            let path = std::env::temp_dir()
                .join(format!("sendonce-missing-{}", Uuid::new_v4()))
                .join("db.sqlite");
            Box::new(
                SqliteStore::connect_lazy(
                    &format!("sqlite://{}", path.display()),
                    1,
                    Duration::from_millis(300),
                )
                .unwrap(),
            )
        }
    };
    for err in [
        store.ping().await.unwrap_err(),
        store.migrate().await.unwrap_err(),
    ] {
        assert!(
            matches!(err, StoreError::Unavailable(_)),
            "expected Unavailable, got {err:?}"
        );
        assert!(err.source().is_some(), "the cause is kept: {err:?}");
        assert!(
            err.to_string().starts_with("database unavailable: "),
            "{err}"
        );
    }
}

async fn times_keep_microseconds_and_come_back_in_utc(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (a, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = a.create_tenant("t", &key.stored).await.unwrap();
    // Nanoseconds beyond the microsecond are dropped, on both backends; an
    // offset other than UTC names the same instant.
    let at = time::macros::datetime!(2026-11-29 14:00:00.123456789 +02:00);
    let want = time::macros::datetime!(2026-11-29 12:00:00.123456 UTC);
    let mut m = message(tenant, "TIME");
    m.created_at = at;
    m.deadline_at = at + time::Duration::microseconds(1);
    a.insert_message(&m, &lease("a", LIVE)).await.unwrap();
    let read = a.message_by_id(m.id).await.unwrap().unwrap();
    for (what, t) in [
        ("created_at", read.created_at),
        ("updated_at", read.updated_at),
        ("attempt", read.last_attempt_started_at.unwrap()),
    ] {
        assert_eq!(t, want, "{what}");
        assert_eq!(t.offset(), time::UtcOffset::UTC, "{what}");
    }
    assert_eq!(
        read.deadline_at,
        time::macros::datetime!(2026-11-29 12:00:00.123457 UTC)
    );
    // The type itself, through the driver, and the format on disk.
    let micros = 1_795_953_600_123_456_i64;
    assert_eq!(DbTime(want).to_micros().unwrap(), micros);
    match db {
        Db::Pg(p) => {
            let back: DbTime = sqlx::query_scalar("SELECT $1::timestamptz")
                .bind(DbTime(at))
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(back, DbTime(want));
            assert_eq!(back.0.offset(), time::UtcOffset::UTC);
            let stored: bool = sqlx::query_scalar(
                "SELECT created_at = '2026-11-29 12:00:00.123456+00'::timestamptz FROM messages",
            )
            .fetch_one(&p)
            .await
            .unwrap();
            assert!(stored, "stored as the same instant");
        }
        Db::Sqlite(p) => {
            let back: DbTime = sqlx::query_scalar("SELECT ?")
                .bind(DbTime(at))
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(back, DbTime(want));
            let stored: i64 = sqlx::query_scalar("SELECT created_at FROM messages")
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(stored, micros, "integer microseconds since the epoch");
            // A time written by the schema's own default (seconds * 10^6)
            // reads back as the same kind of value.
            let tenants = a.list_tenants().await.unwrap();
            assert_eq!(tenants[0].2.offset(), time::UtcOffset::UTC);
        }
    }
}

async fn stored_types_come_back_as_types(backend: Backend) {
    let (a, _, tenant) = setup(backend).await;
    let m = message(tenant, "TYPED");
    a.insert_message(&m, &lease("a", LIVE)).await.unwrap();
    let read = a.message(tenant, "TYPED").await.unwrap().unwrap();
    assert_eq!(read.idempotency_key, m.idempotency_key);
    assert_eq!(read.to, m.to);
    assert_eq!(read.status, Status::Processing);
    assert_eq!(read.encoding, Encoding::Gsm7);
}

/// Lease expiry is written and compared in the database's clock: a claimer
/// whose clock is far ahead does not take a live lease, and a renewal from an
/// instance whose clock is far behind does not shorten it.
async fn a_live_lease_is_safe_from_a_skewed_claimer(backend: Backend) {
    let (a, b, tenant) = setup(backend).await;
    let m = message(tenant, "LIVE");
    let held = lease("a", LIVE);
    let wall = OffsetDateTime::now_utc();
    a.insert_message(&m, &held).await.unwrap();
    let ahead = wall + time::Duration::days(365);
    let behind = wall - time::Duration::days(365);
    for now in [ahead, behind] {
        assert!(
            b.claim_due("b", now, LIVE, 10).await.unwrap().is_empty(),
            "a live lease is not claimed by a clock at {now}"
        );
    }
    // The expiry is the database's now plus the lease, whatever the
    // instances' clocks say (this host's clock is the database's here).
    assert!(a.renew_lease(m.id, &held).await.unwrap());
    let after = OffsetDateTime::now_utc();
    let expires = a
        .message_by_id(m.id)
        .await
        .unwrap()
        .unwrap()
        .lease
        .unwrap()
        .expires_at;
    let live = time::Duration::try_from(LIVE).unwrap();
    let ms = time::Duration::milliseconds(1);
    assert!(
        expires >= wall + live - ms && expires <= after + live + ms,
        "expiry {expires} is the database's clock plus the lease ({wall}..{after})"
    );
    assert!(b.claim_due("b", ahead, LIVE, 10).await.unwrap().is_empty());
}

/// A lease that really ran out (in the database's clock) is taken over by a
/// claimer however far behind or ahead its own clock is, and not before.
async fn an_expired_lease_is_taken_over_whatever_the_claimers_clock(backend: Backend) {
    let (a, b, tenant) = setup(backend).await;
    let short = Duration::from_millis(400);
    let wall = OffsetDateTime::now_utc();
    for (key, now) in [
        ("AHEAD", wall + time::Duration::days(365)),
        ("BEHIND", wall - time::Duration::days(365)),
    ] {
        let m = message(tenant, key);
        let started = std::time::Instant::now();
        a.insert_message(&m, &lease("a", short)).await.unwrap();
        let deadline = started + Duration::from_secs(10);
        let claimed = loop {
            let claimed = b.claim_due("b", now, LIVE, 10).await.unwrap();
            if !claimed.is_empty() {
                break claimed;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the expired lease of {key} was never taken over"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // SQLite's clock is read to the millisecond.
        assert!(
            started.elapsed() + Duration::from_millis(2) >= short,
            "{key} was taken over {:?} after its lease of {short:?} was written",
            started.elapsed()
        );
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].0.id, m.id);
        assert_eq!(claimed[0].1.owner, "b");
    }
}

on_both_backends!(
    the_key_admits_one_insert,
    claims_never_hand_one_row_to_two_claimers,
    finishing_writes_are_fenced_on_the_lease,
    purge_keeps_what_is_still_processing,
    a_unique_violation_is_a_conflict_that_keeps_its_cause,
    an_unreachable_database_is_unavailable,
    times_keep_microseconds_and_come_back_in_utc,
    stored_types_come_back_as_types,
    a_live_lease_is_safe_from_a_skewed_claimer,
    an_expired_lease_is_taken_over_whatever_the_claimers_clock,
);

/// A transaction whose `BEGIN` is cancelled in flight (a client that went
/// away, a timeout) must not leave its pooled connection inside that
/// transaction: sqlx 0.9.0 did (transact-rs/sqlx#4393, fixed in 0.9.1 by
/// #4394), and the quality benchmark saw it once: every later statement
/// on that connection failed with "current transaction is aborted", at
/// every call site, until the instance was stopped.
#[tokio::test]
async fn a_cancelled_begin_leaves_no_transaction_behind() {
    use std::future::Future;
    use std::task::Poll;

    let url = fresh_database().await;
    // As the service's pool: no round trip before a connection is handed
    // out.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .expect("pool");
    sqlx::query("SELECT 1").execute(&pool).await.expect("warm");
    let mut cancelled = 0;
    // Dropped after 1, 2, ... 12 polls (a yield between them), three
    // times over: some of them while BEGIN's answer is on its way.
    for i in 0..36 {
        let polls = i % 12 + 1;
        let mut begin = Box::pin(pool.begin());
        let mut done = false;
        for _ in 0..polls {
            let ready =
                std::future::poll_fn(|cx| Poll::Ready(begin.as_mut().poll(cx).is_ready())).await;
            if ready {
                done = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        if !done {
            cancelled += 1;
        }
        drop(begin);
        // Whatever the next borrower runs is its own: an error of its
        // own, then a statement that must work.
        let _ = sqlx::query("SELECT 1/0").execute(&pool).await;
        sqlx::query("SELECT 1")
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("after {cancelled} cancelled BEGINs: {e}"));
    }
    assert!(cancelled > 0, "no BEGIN was cancelled");
}
