//! Shutdown, send slots, leases and the purge: the corners of running
//! deliveries over time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sendonce::provider::{
    AttemptRef, HttpProvider, OutgoingSms, Provider, Reconciled, SendOutcome,
};
use time::OffsetDateTime;

use sendonce::clock::{Clock, to_time};
use sendonce::delivery::Purger;
use sendonce::domain::MessageId;
use serde_json::json;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::helpers::*;

fn busy(retry_after: u64) -> Behaviour {
    Behaviour::Fail {
        status: 503,
        body: json!({"message": "busy"}),
        retry_after: Some(retry_after),
    }
}

async fn post_async(app: &TestApp, key: &str) -> serde_json::Value {
    let a = app
        .post_with(
            Some(key),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(a.status, 202);
    a.json()
}

async fn wait_for_backoff(app: &TestApp, n: i64) {
    eventually("messages waiting for their retry", || async {
        let waiting = app
            .db
            .count(
                "SELECT count(*) FROM messages \
                 WHERE next_attempt_at IS NOT NULL AND lease_owner IS NULL",
            )
            .await;
        (waiting == n).then_some(())
    })
    .await;
}

/// A retry that is merely scheduled is a due time on the row, not work:
/// shutdown does not wait for it.
async fn a_scheduled_retry_does_not_hold_up_shutdown(backend: Backend) {
    let mut settings = test_settings();
    settings.server.shutdown_grace = Duration::from_secs(30);
    let mut app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    app.mock.push([busy(30)]);
    post_async(&app, "BACKOFF").await;
    wait_for_backoff(&app, 1).await;
    // The reschedule is visible in the row a moment before its task ends.
    eventually("the delivery task to end", || async {
        (app.handle.deliverer.in_flight() == 0).then_some(())
    })
    .await;

    let started = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(5), app.stop()).await;
    assert!(
        stopped.is_ok(),
        "shutdown waited for a retry timer (grace 30 s)"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(app.mock.call_count(), 1);
}

/// The server's drain and the deliverer's share one deadline, fixed at the
/// signal: a call that hangs past the grace period ends shutdown at the
/// grace, not at twice the grace plus a margin.
async fn one_deadline_bounds_the_whole_drain(backend: Backend) {
    let grace = Duration::from_secs(2);
    let mut settings = test_settings();
    settings.server.shutdown_grace = grace;
    settings.delivery.provider_timeout = Duration::from_secs(60);
    settings.delivery.lease = Duration::from_secs(90);
    let mut app = spawn_with(TestOptions {
        backend,
        settings,
        provider_timeout: Duration::from_secs(60),
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Hang]);
    // A request that waits for the outcome keeps its connection open.
    let request = app
        .client
        .post(format!("{}/messages", app.base))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "HANGS")
        .header("prefer", "wait=30")
        .json(&sms("+14155550100", "hi"));
    let waiting = tokio::spawn(async move { request.send().await });
    eventually("the call to hang", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;

    let started = Instant::now();
    app.stop().await;
    let took = started.elapsed();
    assert!(
        took <= grace + Duration::from_millis(1500),
        "shutdown took {took:?} with a grace of {grace:?}"
    );
    assert!(took >= grace, "the call in flight got its grace ({took:?})");
    let _ = waiting.await;
    // The call was cut off mid-flight: its lease is held (the provider may
    // still be acting on it), not released for another instance at once.
    let held = app
        .db
        .count(
            "SELECT count(*) FROM messages WHERE lease_owner IS NOT NULL \
             AND next_attempt_at IS NULL",
        )
        .await;
    assert_eq!(held, 1);
}

/// The scheduler takes a send slot before it claims: with the only slot
/// taken, a due retry stays unclaimed (and unleased) for another instance.
async fn a_due_retry_is_not_claimed_without_a_free_slot(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-30 12:00:00 UTC));
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    settings.delivery.max_concurrent_sends = 1;
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings,
        ..TestOptions::default()
    })
    .await;
    app.mock.push([busy(60), busy(60)]);
    post_async(&app, "RETRY-1").await;
    post_async(&app, "RETRY-2").await;
    wait_for_backoff(&app, 2).await;

    let gates: Vec<Arc<Notify>> = (0..2).map(|_| Arc::new(Notify::new())).collect();
    app.mock.push(gates.iter().cloned().map(Behaviour::Gate));
    clock.advance(Duration::from_secs(61));
    // Two scans back to back: the first takes the only slot.
    let first = app.handle.scheduler.tick().await.unwrap();
    let second = app.handle.scheduler.tick().await.unwrap();
    assert_eq!(
        (first, second),
        (1, 0),
        "claimed only what a slot was free for"
    );
    let leased = app
        .db
        .count("SELECT count(*) FROM messages WHERE lease_owner IS NOT NULL")
        .await;
    assert_eq!(leased, 1, "no message waits leased behind the slot");

    for g in &gates {
        g.notify_one();
    }
    eventually("one of them sent", || async {
        let sent = app
            .db
            .count("SELECT count(*) FROM messages WHERE status = 'sent'")
            .await;
        (sent == 1).then_some(())
    })
    .await;
    assert_eq!(
        app.handle.scheduler.tick().await.unwrap(),
        1,
        "the other now"
    );
    for g in &gates {
        g.notify_one();
    }
    app.wait_for_status("RETRY-1", "sent").await;
    app.wait_for_status("RETRY-2", "sent").await;
}

/// However long a message waited for a send slot, its provider call starts
/// under a full lease, counted from the database's clock: the instance's own
/// clock (here a hand-moved one, far behind) has no say in it.
async fn every_provider_call_starts_with_a_full_lease(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-30 12:00:00 UTC));
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    settings.delivery.max_concurrent_sends = 1;
    // The first call holds the only slot until the test lets it go.
    settings.delivery.provider_timeout = Duration::from_secs(30);
    settings.delivery.lease = Duration::from_secs(62);
    let lease = settings.delivery.lease;
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings,
        provider_timeout: Duration::from_secs(30),
        ..TestOptions::default()
    })
    .await;
    let gates: Vec<Arc<Notify>> = (0..2).map(|_| Arc::new(Notify::new())).collect();
    app.mock.push(gates.iter().cloned().map(Behaviour::Gate));
    post_async(&app, "FIRST").await;
    eventually("the first call", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    let second = post_async(&app, "SECOND").await;
    let id = MessageId(
        uuid::Uuid::parse_str(second["id"].as_str().unwrap().trim_start_matches("msg_")).unwrap(),
    );

    // The second waits for the slot longer than a lease may age before a
    // call (the database and this test share the host's clock).
    let waited = Instant::now();
    while waited.elapsed() < 2 * sendonce::delivery::LEASE_FRESHNESS {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let released = OffsetDateTime::now_utc();
    gates[0].notify_one();
    eventually("the second call", || async {
        (app.mock.call_count() == 2).then_some(())
    })
    .await;
    let called = OffsetDateTime::now_utc();
    let row = app.handle.store.message_by_id(id).await.unwrap().unwrap();
    let expires = row.lease.expect("leased during the call").expires_at;
    // SQLite reads its clock to the millisecond.
    let ms = time::Duration::milliseconds(1);
    assert!(
        expires >= released + to_time(lease) - ms && expires <= called + to_time(lease) + ms,
        "the call started with a full lease: expires {expires}, slot freed {released}"
    );
    gates[1].notify_one();
    app.wait_for_status("SECOND", "sent").await;
}

/// The purge checks between batches whether it should stop.
async fn the_purge_stops_between_batches_when_asked(backend: Backend) {
    let app = spawn_app_on(backend).await;
    for i in 0..3 {
        let m = app
            .post(&format!("OLD-{i}"), &sms("+14155550100", "hi"))
            .await
            .json();
        assert_eq!(m["status"], "sent");
    }
    let purger = Purger::new(
        Arc::clone(&app.handle.store),
        Clock::system(),
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .with_batch(1);
    let stop = CancellationToken::new();
    stop.cancel();
    assert_eq!(purger.purge_until(&stop).await.unwrap(), 1, "one batch");
    assert_eq!(app.message_count().await, 2);
    // Asked to stop before it starts, `run` still ends after one batch.
    tokio::time::timeout(Duration::from_secs(5), purger.run(stop))
        .await
        .expect("run returns");
    assert_eq!(app.message_count().await, 1);
}

/// The mock's HTTP provider, as one that does not de-duplicate on our key
/// and can be asked: answers its lookups from a script and records the
/// window each one asked about.
struct Asked {
    inner: HttpProvider,
    answers: Mutex<Vec<Reconciled>>,
    since: Arc<Mutex<Vec<OffsetDateTime>>>,
}

#[async_trait]
impl Provider for Asked {
    fn name(&self) -> &'static str {
        "http"
    }

    fn dedupes_by_key(&self) -> bool {
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        self.inner.send(sms).await
    }

    async fn reconcile(&self, _sms: &OutgoingSms, attempt: &AttemptRef) -> Reconciled {
        self.since.lock().unwrap().push(attempt.started_at);
        self.answers.lock().unwrap().remove(0)
    }
}

/// A message resumed after a crash makes a new attempt; when that attempt's
/// answer is ambiguous, the provider is asked about the window since the new
/// attempt started, not since the crashed one.
async fn a_resumed_attempt_is_reconciled_from_its_own_start(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-30 12:00:00 UTC));
    let start = clock.now();
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    // A short lease, to run out in real time after the crash (the
    // shortest a 500 ms provider timeout allows: 2 x timeout + 2 s).
    settings.delivery.lease = Duration::from_secs(3);
    settings.delivery.provider_timeout = Duration::from_millis(500);
    let mut a = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: settings.clone(),
        provider_timeout: Duration::from_millis(500),
        ..TestOptions::default()
    })
    .await;
    a.mock
        .push([Behaviour::Hang, Behaviour::AcceptThenFail { status: 502 }]);
    post_async(&a, "RESUMED").await;
    eventually("a's call", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    a.crash().await;

    let since = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&since);
    let b = spawn_with(TestOptions {
        settings,
        clock: clock.clone(),
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        api_key: Some(a.api_key.clone()),
        provider: Some(Box::new(move |base, _, _| {
            let inner = HttpProvider::new(
                &format!("{base}/messages"),
                Some("provider-token".into()),
                Duration::from_secs(2),
                Duration::from_secs(1),
            )
            .unwrap();
            Arc::new(Asked {
                inner,
                answers: Mutex::new(vec![
                    Reconciled::NotSent,
                    Reconciled::Sent {
                        provider_message_id: "prov_found".into(),
                    },
                ]),
                since: recorded,
            })
        })),
        ..TestOptions::default()
    })
    .await;
    // a's lease runs out (in the database's clock) and b takes over.
    clock.advance(Duration::from_secs(20));
    let resumed_at = clock.now();
    assert_eq!(b.claim_within(Duration::from_secs(15)).await, 1);
    let m = b.wait_for_status("RESUMED", "sent").await;
    assert_eq!(m["attempts"], 2);
    assert_eq!(
        *since.lock().unwrap(),
        vec![start, resumed_at],
        "the crashed attempt, then the current one"
    );
}

on_both_backends!(
    a_resumed_attempt_is_reconciled_from_its_own_start,
    a_scheduled_retry_does_not_hold_up_shutdown,
    one_deadline_bounds_the_whole_drain,
    a_due_retry_is_not_claimed_without_a_free_slot,
    every_provider_call_starts_with_a_full_lease,
    the_purge_stops_between_batches_when_asked,
);

/// Connections to `database` from anyone (Postgres's own view).
async fn connections_to(database: &str) -> i64 {
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url())
        .await
        .expect("connect to the test Postgres");
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
        .bind(database)
        .fetch_one(&mut admin)
        .await
        .expect("pg_stat_activity")
}

/// An instance that stopped, in a runtime that ended (as at the end of a
/// test or of a process's use of it), holds no database connection: a
/// reference cycle through test mode's provider (it holds the receipt sink,
/// which held the deliverer, which holds the providers) kept every stopped
/// instance's pool open, about 4 connections each, until the whole suite
/// exhausted the server's connections.
#[tokio::test]
async fn a_stopped_instance_closes_its_database_connections() {
    let url = fresh_database().await;
    let name = url.rsplit('/').next().expect("a database name").to_string();
    let name_inside = name.clone();
    let used = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let mut app = spawn_with(TestOptions {
                database: Some(url),
                ..TestOptions::default()
            })
            .await;
            let sent = app.post("closes-1", &sms("+14155550100", "hello")).await;
            assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.bytes));
            let used = connections_to(&name_inside).await;
            app.stop().await;
            used
        })
    })
    .join()
    .expect("the instance's thread");
    assert!(
        used > 0,
        "the instance used no connection: the test proves nothing"
    );
    within(
        Duration::from_secs(10),
        "the stopped instance's connections to close",
        || async { (connections_to(&name).await == 0).then_some(()) },
    )
    .await;
}
