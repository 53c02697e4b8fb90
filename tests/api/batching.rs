//! Coalesced writes (`src/store/postgres/batch.rs`): concurrent claims and
//! final writes share statements, and each caller still gets its own result.
//! The guarantees are the store's, so the first two tests run on both
//! backends; the batch sizes are Postgres's own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sendonce::domain::{Encoding, IdempotencyKey, MessageId, Phone};
use sendonce::metrics::BatchKind;
use sendonce::store::{Claim, Lease, NewMessage, Store, StoreError};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::delivery::futures_join_all;
use crate::helpers::*;

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00 UTC);

fn message(tenant_id: Uuid, i: usize) -> NewMessage {
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(&format!("B-{i}")).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164(&format!("+1415555{:04}", i % 10_000))
            .unwrap()
            .into(),
        from: None,
        body: format!("message {i}"),
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

/// The lease of the claims: short enough that the crash test sees it run
/// out, long enough that it is live while the test sets up.
const LEASE: Duration = Duration::from_secs(3);

fn lease(owner: &str) -> Lease {
    Lease::new(owner, LEASE)
}

/// Claims all of `messages` at once, each from its own task (as concurrent
/// requests would), and returns the results in order.
async fn claim_concurrently(
    store: &Arc<dyn Store>,
    messages: Vec<NewMessage>,
) -> Vec<Result<Claim, StoreError>> {
    let tasks: Vec<_> = messages
        .into_iter()
        .map(|m| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.insert_message(&m, &lease("a")).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("claim task"));
    }
    out
}

/// Rows that break a constraint (a tenant that does not exist; an id another
/// message has) fail alone: every other claim of their batches is created,
/// with its attempt row, and a key claimed twice in one batch is created once.
async fn one_failing_row_does_not_fail_its_batch_mates(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (store, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    let taken = message(tenant, 10_000);
    assert!(matches!(
        store.insert_message(&taken, &lease("a")).await.unwrap(),
        Claim::Created(_)
    ));
    // The lanes are Postgres's (SQLite's writer counts its group commits).
    let before = (backend == Backend::Postgres)
        .then(|| store.batch_sizes().map(|s| s.totals(BatchKind::Claim)))
        .flatten();

    let mut messages: Vec<NewMessage> = (0..60).map(|i| message(tenant, i)).collect();
    let no_tenant = [7, 31];
    for i in no_tenant {
        messages[i].tenant_id = Uuid::new_v4();
    }
    let taken_id = 44;
    messages[taken_id].id = taken.id;
    // The same key twice in one go: one creates, the other sees it.
    messages[59].idempotency_key = messages[58].idempotency_key.clone();
    let results = claim_concurrently(&store, messages).await;

    for (i, r) in results.iter().enumerate() {
        match (i, r) {
            (i, Err(StoreError::Other(_))) if no_tenant.contains(&i) => {}
            (i, Err(StoreError::Conflict { .. })) if i == taken_id => {}
            (58 | 59, Ok(_)) => {}
            (i, Ok(Claim::Created(_))) if !no_tenant.contains(&i) && i != taken_id => {}
            (i, other) => panic!("row {i}: {other:?}"),
        }
    }
    let created = results
        .iter()
        .filter(|r| matches!(r, Ok(Claim::Created(_))))
        .count();
    assert_eq!(
        created,
        60 - 3 - 1,
        "all but the three bad rows and one duplicate"
    );
    assert!(
        matches!(
            (&results[58], &results[59]),
            (Ok(Claim::Created(_)), Ok(Claim::Existing(_)))
                | (Ok(Claim::Existing(_)), Ok(Claim::Created(_)))
        ),
        "{:?} {:?}",
        results[58],
        results[59]
    );
    assert_eq!(
        db.count("SELECT count(*) FROM messages").await,
        1 + created as i64
    );
    assert_eq!(
        db.count("SELECT count(*) FROM attempts").await,
        1 + created as i64
    );
    if let (Some(sizes), Some((statements, rows))) = (store.batch_sizes(), before) {
        let (s, r) = sizes.totals(BatchKind::Claim);
        assert_eq!(r - rows, 60, "every claim went through the lane once");
        assert!(
            s - statements < 60,
            "claims shared statements: {} for 60",
            s - statements
        );
    }
}

/// The instance that claimed a batch dies after the commit, before any caller
/// acts on its answer: the rows hold everything (lease, attempt 1 started),
/// and another instance takes each message over once its lease ends and
/// sends it exactly once.
async fn a_crash_between_batch_commit_and_answer_loses_nothing(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (store, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    let claimed = std::time::Instant::now();
    // Made now: the instance taking over runs on the system clock.
    let now = OffsetDateTime::now_utc();
    let messages: Vec<NewMessage> = (0..40)
        .map(|i| NewMessage {
            created_at: now,
            deadline_at: now + time::Duration::hours(1),
            cost: None,
            ..message(tenant, i)
        })
        .collect();
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    // The callers are gone as soon as the rows are committed.
    let tasks: Vec<_> = messages
        .into_iter()
        .map(|m| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.insert_message(&m, &lease("dead")).await })
        })
        .collect();
    eventually("the claims to commit", || async {
        (db.count("SELECT count(*) FROM messages").await == 40).then_some(())
    })
    .await;
    for t in &tasks {
        t.abort();
    }
    drop(store);

    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    let b = spawn_with(TestOptions {
        backend,
        settings,
        database: Some(url),
        api_key: Some(key.secret),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(
        b.handle.scheduler.tick().await.unwrap(),
        0,
        "leases still held"
    );
    assert!(
        claimed.elapsed() < LEASE,
        "the scan ran while the leases were live"
    );
    let mut taken = 0;
    while taken < 40 {
        taken += b.claim_within(Duration::from_secs(15)).await;
    }
    assert!(claimed.elapsed() >= LEASE);
    eventually("every message to be sent", || async {
        (db.count("SELECT count(*) FROM messages WHERE status = 'sent'")
            .await
            == 40)
            .then_some(())
    })
    .await;
    assert_eq!(b.mock.call_count(), 40);
    for id in ids {
        assert_eq!(b.mock.deliveries_for(&id.to_string()), 1, "{id}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM attempts WHERE outcome = 'lost'")
            .await,
        40,
        "the dead owner's attempts are closed as lost"
    );
}

/// Concurrent looks for receipts that overtook a final write share reads
/// (on Postgres) and each still gets its own answer: unlinked receipts for
/// its id (true), none (false), or receipts under another provider's name
/// only (false).
async fn concurrent_receipt_looks_each_get_their_own_answer(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let receipt = |provider: &str, id: String| sendonce::store::NewReceipt {
        provider: provider.into(),
        event_id: format!("{provider}-{id}"),
        provider_message_id: id,
        provider_status: "delivered".into(),
        status: Some(sendonce::domain::Status::Delivered),
        error_code: None,
        received_at: T0,
        message_id: None,
    };
    // Every third id has an unlinked receipt under "http"; every fifth one
    // under "twilio" only.
    for i in 0..60 {
        if i % 3 == 0 {
            store
                .record_receipt(&receipt("http", format!("SM{i}")))
                .await
                .unwrap();
        } else if i % 5 == 0 {
            store
                .record_receipt(&receipt("twilio", format!("SM{i}")))
                .await
                .unwrap();
        }
    }
    let before = (backend == Backend::Postgres)
        .then(|| store.batch_sizes().map(|s| s.totals(BatchKind::Look)))
        .flatten();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                store
                    .has_unmatched_receipts("http", &format!("SM{i}"))
                    .await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let found = t.await.expect("look task").unwrap();
        assert_eq!(found, i % 3 == 0, "SM{i}");
    }
    if let (Some(sizes), Some((statements, rows))) = (store.batch_sizes(), before) {
        let (s, r) = sizes.totals(BatchKind::Look);
        assert_eq!(r - rows, 60, "every look went through the lane once");
        assert!(
            s - statements < 60,
            "looks shared reads: {} for 60",
            s - statements
        );
    }
}

on_both_backends!(
    one_failing_row_does_not_fail_its_batch_mates,
    a_crash_between_batch_commit_and_answer_loses_nothing,
    concurrent_receipt_looks_each_get_their_own_answer,
);

/// The value of a series in a Prometheus text exposition.
fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
}

/// Sends `n` messages at once over HTTP with keys `PREFIX-i`, checks every
/// caller got its own message back, sent once at the mock, and returns the
/// service's `/metrics` text.
async fn send_at_once(app: &TestApp, prefix: &str, n: u64) -> String {
    let answers = futures_join_all((0..n).map(|i| {
        let key = format!("{prefix}-{i}");
        let to = format!("+1415555{i:04}");
        async move {
            let a = app.post(&key, &sms(&to, &format!("hello {i}"))).await;
            (key, to, a)
        }
    }))
    .await;
    for (key, to, a) in &answers {
        assert_eq!(
            a.status,
            201,
            "{key}: {}",
            String::from_utf8_lossy(&a.bytes)
        );
        let body = a.json();
        assert_eq!(body["idempotency_key"], key.as_str());
        assert_eq!(body["to"], to.as_str());
        assert_eq!(body["status"], "sent");
        assert_eq!(app.mock.deliveries_for(body["id"].as_str().unwrap()), 1);
    }
    let text = app.get("/metrics").await;
    String::from_utf8_lossy(&text.bytes).into_owned()
}

/// Concurrent sends over HTTP share claiming and final statements (the batch
/// size histogram shows it), and every caller gets its own message back.
#[tokio::test]
async fn concurrent_sends_form_batches_and_each_gets_its_own_answer() {
    let app = spawn_app().await;
    let n = 64;
    let text = send_at_once(&app, "CONC", n).await;
    let claims = series(&text, "sendonce_store_batch_size_count{kind=\"claim\"}");
    let claimed = series(&text, "sendonce_store_batch_size_sum{kind=\"claim\"}");
    let finishes = series(&text, "sendonce_store_batch_size_count{kind=\"finish\"}");
    let finished = series(&text, "sendonce_store_batch_size_sum{kind=\"finish\"}");
    assert_eq!(claimed, n);
    assert_eq!(finished, n);
    assert!(
        claims < n,
        "claims shared statements: {claims} for {n}\n{text}"
    );
    assert!(
        finishes < n,
        "final writes shared statements: {finishes} for {n}\n{text}"
    );
    let ones = series(
        &text,
        "sendonce_store_batch_size_bucket{kind=\"claim\",le=\"1\"}",
    );
    assert!(
        ones < claims,
        "some claim batch had more than one row\n{text}"
    );
}

/// On SQLite, concurrent sends share the single writer's group commits: the
/// histogram of jobs per group counts every claim and final write, in fewer
/// commits than jobs, and every caller gets its own message back.
#[tokio::test]
async fn concurrent_sends_on_sqlite_share_group_commits() {
    let app = spawn_app_on(Backend::Sqlite).await;
    let n = 64;
    let text = send_at_once(&app, "GRP", n).await;
    let commits = series(&text, "sendonce_store_batch_size_count{kind=\"group\"}");
    let jobs = series(&text, "sendonce_store_batch_size_sum{kind=\"group\"}");
    // A claim and a final write for each send, and whatever else the
    // instance wrote (its start-up, the tenant).
    assert!(jobs >= 2 * n, "{jobs} jobs for {n} sends\n{text}");
    assert!(
        commits < jobs,
        "jobs shared commits: {commits} for {jobs}\n{text}"
    );
    assert_eq!(
        series(&text, "sendonce_store_batch_size_count{kind=\"claim\"}"),
        0,
        "no Postgres lanes on SQLite"
    );
}
