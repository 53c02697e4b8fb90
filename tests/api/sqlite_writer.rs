//! The SQLite store's single writer (issue 19): group commits answer each
//! caller after the commit, a failing write fails alone, the background work
//! never meets a locked database, and a SIGKILL in the middle of group
//! commits loses nothing that was acknowledged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sendonce::domain::{AttemptOutcome, Encoding, IdempotencyKey, MessageId, Phone, Status};
use sendonce::store::{
    AttemptResult, Finish, Lease, NewMessage, NewReceipt, Store, StoreError, StoredResponse,
};
use testkit::mock_provider::MockProvider;
use time::OffsetDateTime;

use crate::helpers::*;
use crate::process::start_server;

fn message(tenant_id: uuid::Uuid, key: &str, n: u32) -> NewMessage {
    let now = OffsetDateTime::now_utc();
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164(&format!("+1415555{:04}", n % 10_000))
            .unwrap()
            .into(),
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
        created_at: now,
        expires_at: None,
        deadline_at: now + time::Duration::hours(1),
        cost: None,
    }
}

/// Writes handed to the writer at the same time share commits, and one that
/// fails (a taken tenant name) fails alone: the others of its group commit.
#[tokio::test]
async fn a_failing_write_fails_alone_in_its_group() {
    let url = fresh_database_on(Backend::Sqlite).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let names: Vec<String> = (0..40).map(|i| format!("t{}", i % 30)).collect();
    let results = crate::delivery::futures_join_all(names.iter().map(|name| {
        let store = Arc::clone(&store);
        let name = name.clone();
        async move {
            let key = sendonce::apikey::generate();
            store.create_tenant(&name, &key.stored).await
        }
    }))
    .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let conflicts = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::Conflict { .. })))
        .count();
    assert_eq!((ok, conflicts), (30, 10), "{results:?}");
    let tenants = store.list_tenants().await.unwrap();
    assert_eq!(tenants.len(), 30, "every successful write committed");
}

/// Final writes handed to the writer at once, ten of which take a provider
/// message id another one took (a unique violation in the last of the three
/// statements of a final write): each of those fails alone, and the
/// attempt's close and the outbox row its query wrote before the failure
/// are undone with it; the other thirty commit whole.
#[tokio::test]
async fn a_final_write_that_fails_is_undone_whole_and_alone() {
    let url = fresh_database_on(Backend::Sqlite).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    let lease = Lease::new("w", Duration::from_secs(60));
    let mut ids = Vec::new();
    for i in 0..40u32 {
        let m = message(tenant, &format!("FIN-{i}"), i);
        store.insert_message(&m, &lease).await.unwrap();
        ids.push(m.id);
    }
    let now = OffsetDateTime::now_utc();
    let results = crate::delivery::futures_join_all(ids.iter().enumerate().map(|(i, id)| {
        let store = Arc::clone(&store);
        let finish = Finish {
            id: *id,
            lease_token: lease.token,
            status: Status::Sent,
            provider_message_id: Some(format!("pm-{}", i % 30)),
            error: None,
            sent_at: Some(now),
            updated_at: now,
            response: StoredResponse {
                status_code: 201,
                body: format!("m{i}").into_bytes(),
            },
            attempt: Some(AttemptResult {
                number: 1,
                outcome: AttemptOutcome::Sent,
                http_status: Some(200),
                provider_code: None,
                error: None,
                provider_message_id: Some(format!("pm-{}", i % 30)),
                finished_at: now,
            }),
            opt_out: None,
        };
        async move { store.finish(&finish).await }
    }))
    .await;
    let failed: Vec<usize> = (0..40).filter(|&i| results[i].is_err()).collect();
    assert_eq!(failed.len(), 10, "{results:?}");
    assert!(
        failed
            .iter()
            .all(|&i| matches!(results[i], Err(StoreError::Conflict { .. }))),
        "{results:?}"
    );
    let events = store.webhook_events_after(tenant, None, 100).await.unwrap();
    let mut written: Vec<String> = events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data).into_owned())
        .collect();
    written.sort();
    let mut committed: Vec<String> = (0..40)
        .filter(|i| !failed.contains(i))
        .map(|i| format!("m{i}"))
        .collect();
    committed.sort();
    assert_eq!(written, committed, "one event per committed final write");
    for (i, id) in ids.iter().enumerate() {
        let state = store.state_by_id(*id).await.unwrap().unwrap();
        let attempts = store.attempts(*id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        if failed.contains(&i) {
            assert_eq!(state.status, Status::Processing, "message {i}");
            assert_eq!(
                attempts[0].outcome, None,
                "message {i}'s attempt stays open"
            );
        } else {
            assert_eq!(state.status, Status::Sent, "message {i}");
            assert_eq!(attempts[0].outcome.as_deref(), Some("sent"), "message {i}");
        }
    }
}

/// Sends, claims, receipts, lease releases and the purge all at once on one
/// SQLite file: nothing fails with `database is locked` and nothing waits
/// anywhere near the busy timeout (5 s).
async fn run_mix(store: Arc<dyn Store>, tenant: uuid::Uuid) -> Duration {
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let timed = |worst: Arc<Mutex<Duration>>, started: Instant| {
        let took = started.elapsed();
        let mut w = worst.lock().unwrap();
        *w = (*w).max(took);
    };
    let mut tasks = Vec::new();
    for t in 0..16u32 {
        let (store, worst) = (Arc::clone(&store), Arc::clone(&worst));
        tasks.push(tokio::spawn(async move {
            for i in 0..25u32 {
                let n = t * 100 + i;
                let started = Instant::now();
                let lease = Lease::new(
                    "mix",
                    Duration::from_millis(if i % 2 == 0 { 0 } else { 30_000 }),
                );
                store
                    .insert_message(&message(tenant, &format!("MIX-{n}"), n), &lease)
                    .await
                    .expect("insert");
                timed(Arc::clone(&worst), started);
            }
        }));
    }
    for kind in 0..4u32 {
        let (store, worst) = (Arc::clone(&store), Arc::clone(&worst));
        tasks.push(tokio::spawn(async move {
            for i in 0..40u32 {
                let started = Instant::now();
                let now = OffsetDateTime::now_utc();
                match kind {
                    0 => {
                        store
                            .claim_due("claimer", now, Duration::from_secs(30), 10)
                            .await
                            .expect("claim");
                    }
                    1 => {
                        store
                            .purge(now - time::Duration::days(1), 100)
                            .await
                            .expect("purge");
                    }
                    2 => {
                        store
                            .record_receipt(&NewReceipt {
                                provider: "http".into(),
                                event_id: format!("ev-{i}"),
                                provider_message_id: format!("pm-{i}"),
                                provider_status: "delivered".into(),
                                status: Some(sendonce::domain::Status::Delivered),
                                error_code: None,
                                received_at: now,
                                message_id: None,
                            })
                            .await
                            .expect("receipt");
                    }
                    _ => {
                        store
                            .release_leases("claimer", now, &[], Duration::ZERO)
                            .await
                            .expect("release");
                    }
                }
                timed(Arc::clone(&worst), started);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    *worst.lock().unwrap()
}

#[tokio::test]
async fn sends_claims_receipts_and_the_purge_at_once_never_meet_a_lock() {
    let url = fresh_database_on(Backend::Sqlite).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    let worst = run_mix(Arc::clone(&store), tenant).await;
    assert!(
        worst < Duration::from_secs(2),
        "the slowest write took {worst:?}: a lock wait"
    );
    let (store, _) = open_store(&url, Duration::from_secs(5));
    assert_eq!(
        store
            .key_state(tenant, "MIX-1524")
            .await
            .unwrap()
            .map(|s| s.status),
        Some(sendonce::domain::Status::Processing)
    );
}

/// SIGKILL while 48 clients keep the writer committing groups: every send
/// the server acknowledged (202 after the insert, 201 after the final write)
/// is in the file afterwards, in at least the state it was acknowledged in.
#[tokio::test]
async fn a_sigkill_during_group_commits_loses_nothing_acknowledged() {
    let database = fresh_database_on(Backend::Sqlite).await;
    let (_mock, mock_url, _) = MockProvider::start().await.unwrap();
    let key = "so_sqlite-writer-kill-test-aaaaaaaaaaaaa";
    let (mut server, _) = start_server(
        &database,
        &mock_url,
        &[
            ("SENDONCE_BOOTSTRAP_API_KEY", key),
            ("SENDONCE_RATE_TENANT_RPS", "0"),
            ("SENDONCE_RATE_NUMBER_PER_HOUR", "0"),
            ("SENDONCE_RATE_PREFIX_PER_HOUR", "0"),
            ("RUST_LOG", "warn"),
        ],
    )
    .await;
    // Nobody reads the server's output otherwise: a full pipe would stall it.
    if let Some(mut err) = server.child.stderr.take() {
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut err, &mut tokio::io::sink()).await;
        });
    }
    let acked: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let mut clients = Vec::new();
    for c in 0..48u32 {
        let (acked, failed, client, base) = (
            Arc::clone(&acked),
            Arc::clone(&failed),
            client.clone(),
            server.base.clone(),
        );
        clients.push(tokio::spawn(async move {
            for i in 0u32.. {
                let k = format!("KILL-{c}-{i}");
                let prefer = if i % 2 == 0 {
                    "respond-async"
                } else {
                    "wait=5"
                };
                let sent = client
                    .post(format!("{base}/messages"))
                    .bearer_auth(key)
                    .header("Idempotency-Key", &k)
                    .header("Prefer", prefer)
                    .json(&sms(
                        &format!("+1415556{:04}", (c * 1000 + i) % 10_000),
                        "hi",
                    ))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 201 || r.status() == 202 => {
                        acked.lock().unwrap().push((k, r.status().as_u16()));
                    }
                    Ok(r) => panic!("unexpected answer {} for {k}", r.status()),
                    Err(_) => {
                        failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                }
            }
        }));
    }
    // Wait, with a deadline, until the writer has acknowledged plenty.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = acked.lock().unwrap().len();
        assert_eq!(
            failed.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a request failed before the kill ({n} acknowledged)"
        );
        if n >= 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} sends acknowledged in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = server.child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = server.child.wait().await;
    for c in clients {
        c.await.expect("client");
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "requests were in flight when the process died"
    );

    let (store, _) = open_store(&database, Duration::from_secs(5));
    let tenant = store
        .tenant_for_key(&sendonce::apikey::hash(key))
        .await
        .unwrap()
        .expect("the tenant survived")
        .id;
    let mut lost = Vec::new();
    for (k, status) in &acked {
        match store.key_state(tenant, k).await.unwrap() {
            None => lost.push(k.clone()),
            Some(state) if *status == 201 && !state.status.is_final() => lost.push(k.clone()),
            Some(_) => {}
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged sends lost: {lost:?}",
        lost.len(),
        acked.len()
    );
}

/// Two processes on one SQLite file (each with its own writer) stay safe:
/// every key sent to both at once is created once and sent once.
#[tokio::test]
async fn two_processes_on_one_file_send_each_key_once() {
    let database = fresh_database_on(Backend::Sqlite).await;
    let (mock, mock_url, _) = MockProvider::start().await.unwrap();
    let key = "so_sqlite-two-processes-aaaaaaaaaaaaaaaaa";
    let env = [
        ("SENDONCE_BOOTSTRAP_API_KEY", key),
        ("SENDONCE_RATE_TENANT_RPS", "0"),
        ("SENDONCE_RATE_NUMBER_PER_HOUR", "0"),
        ("SENDONCE_RATE_PREFIX_PER_HOUR", "0"),
        ("RUST_LOG", "warn"),
    ];
    let (mut a, _) = start_server(&database, &mock_url, &env).await;
    let (mut b, _) = start_server(&database, &mock_url, &env).await;
    for server in [&mut a, &mut b] {
        if let Some(mut err) = server.child.stderr.take() {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut err, &mut tokio::io::sink()).await;
            });
        }
    }
    let client = reqwest::Client::new();
    let keys: Vec<String> = (0..60).map(|i| format!("TWO-{i}")).collect();
    let answers = crate::delivery::futures_join_all(keys.iter().flat_map(|k| {
        [a.base.clone(), b.base.clone()].map(|base| {
            let (client, k) = (client.clone(), k.clone());
            async move {
                client
                    .post(format!("{base}/messages"))
                    .bearer_auth(key)
                    .header("Idempotency-Key", &k)
                    .header("Prefer", "wait=10")
                    .json(&sms("+14155550100", "hi"))
                    .send()
                    .await
                    .expect("an answer")
                    .status()
                    .as_u16()
            }
        })
    }))
    .await;
    assert!(
        answers.iter().all(|s| *s == 201 || *s == 409),
        "{answers:?}"
    );
    let (store, _) = open_store(&database, Duration::from_secs(5));
    let tenant = store
        .tenant_for_key(&sendonce::apikey::hash(key))
        .await
        .unwrap()
        .expect("tenant")
        .id;
    for k in &keys {
        let state = eventually("the key to be final", || async {
            store
                .key_state(tenant, k)
                .await
                .unwrap()
                .filter(|s| s.status.is_final())
        })
        .await;
        assert_eq!(state.status, sendonce::domain::Status::Sent, "{k}");
    }
    assert_eq!(mock.call_count(), keys.len(), "one provider call per key");
    a.child.kill().await.unwrap();
    b.child.kill().await.unwrap();
}
