//! Issue 41, finding 4: send slots and the queue behind them are shared
//! fairly between tenants. A tenant whose route is slow (its provider
//! calls hang here) takes neither every slot nor the whole queue: another
//! tenant's sends to a fast route still go out at once.

use std::sync::Arc;
use std::time::Duration;

use sendonce::delivery::destinations::Routes;
use sendonce::provider::{Provider, SimulatedProvider};
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::helpers::*;

/// A's slow route (`http`, at the instance's mock); B's fast one.
const SLOW: &str = "+14155550100";
const FAST: &str = "+447911123456";

/// An instance with 4 send slots (1 spare), a queue of 8, A's slow route
/// (`+1`, `http` at the mock) and B's fast one (the simulated provider).
/// A's calls hang until the test opens their gates: its provider timeout
/// (and the lease) outlast the test.
async fn spawn_two_routes(backend: Backend) -> TestApp {
    let mut settings = test_settings();
    settings.delivery.provider_timeout = Duration::from_secs(30);
    settings.delivery.lease = Duration::from_secs(90);
    settings.delivery.max_concurrent_sends = 4;
    settings.delivery.max_queued_sends = 8;
    settings.delivery.spare_send_slots = Some(1);
    settings.provider.routes = Some(
        Routes::parse("+1=http; *=simulated", |name| {
            ["http", "simulated"].into_iter().find(|k| *k == name)
        })
        .expect("routes"),
    );
    let simulated: Arc<dyn Provider> = Arc::new(SimulatedProvider { log_bodies: false });
    spawn_with(TestOptions {
        backend,
        settings,
        provider_timeout: Duration::from_secs(30),
        fallbacks: vec![simulated],
        ..TestOptions::default()
    })
    .await
}

/// Tenant B, within its rights, sends `n` messages to the fast route: each
/// goes out at once (final within its 3 s wait, while A's calls hang),
/// however busy A keeps its route.
async fn b_sends_at_once(app: &TestApp, n: usize) {
    let key = sendonce::apikey::generate();
    app.handle
        .store
        .create_tenant("b-fast", &key.stored)
        .await
        .expect("tenant");
    for i in 0..n {
        let sent = app
            .request(reqwest::Method::POST, "/messages")
            .bearer_auth(&key.secret)
            .header("Idempotency-Key", format!("B-{i}"))
            .header("prefer", "wait=3")
            .json(&sms(FAST, "fast route"))
            .send()
            .await
            .expect("POST");
        let sent = answer(sent).await;
        assert_eq!(
            sent.status,
            201,
            "B's send {i}: {}",
            String::from_utf8_lossy(&sent.bytes)
        );
        assert_eq!(sent.json()["status"], "sent");
    }
}

async fn a_tenant_on_a_slow_route_leaves_slots_and_queue_for_others(backend: Backend) {
    let app = spawn_two_routes(backend).await;
    // Every call of A's route hangs until its gate opens.
    let gates: Vec<Arc<Notify>> = (0..32).map(|_| Arc::new(Notify::new())).collect();
    app.mock
        .push(gates.iter().map(|g| Behaviour::Gate(Arc::clone(g))));

    // Tenant A sends until this instance refuses it: its slots and its
    // part of the queue are taken.
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..32 {
        let key = format!("A-{i}");
        let a = app
            .post_with(
                Some(&key),
                &sms(SLOW, "slow route"),
                &[("prefer", "respond-async")],
            )
            .await;
        match a.status {
            202 => accepted.push(key),
            503 => {
                assert_eq!(a.slug(), "overloaded");
                refused += 1;
                break;
            }
            other => panic!("A's send {key}: {other}"),
        }
    }
    assert_eq!(refused, 1, "A is refused once it holds its share");
    eventually("A's calls to hang in the slots it holds", || async {
        (app.mock.call_count() > 0 && app.handle.deliverer.in_flight() == accepted.len())
            .then_some(())
    })
    .await;

    b_sends_at_once(&app, 8).await;

    // A's sends still go out once its route answers.
    for g in &gates {
        g.notify_one();
    }
    for key in &accepted {
        app.wait_for_status(key, "sent").await;
    }
}

/// The same through a batch: its items are started by the scheduler, which
/// leaves the spare slots to other tenants' new sends.
async fn a_batch_on_a_slow_route_leaves_a_slot_for_others(backend: Backend) {
    let app = spawn_two_routes(backend).await;
    let gates: Vec<Arc<Notify>> = (0..12).map(|_| Arc::new(Notify::new())).collect();
    app.mock
        .push(gates.iter().map(|g| Behaviour::Gate(Arc::clone(g))));
    let items: Vec<serde_json::Value> = (0..12)
        .map(|i| serde_json::json!({"idempotency_key": format!("A-{i}"), "to": SLOW, "body": "slow route"}))
        .collect();
    let batch = app
        .request(reqwest::Method::POST, "/messages/batch")
        .bearer_auth(&app.api_key)
        .json(&serde_json::json!({ "messages": items }))
        .send()
        .await
        .expect("POST /messages/batch");
    assert_eq!(answer(batch).await.status, 200);
    eventually("the batch to hold every slot it may", || async {
        (app.mock.call_count() >= 3).then_some(())
    })
    .await;

    b_sends_at_once(&app, 4).await;
    assert_eq!(app.mock.call_count(), 3, "A still holds three slots");

    for g in &gates {
        g.notify_one();
    }
    for i in 0..12 {
        app.wait_for_status(&format!("A-{i}"), "sent").await;
    }
}

on_both_backends!(
    a_tenant_on_a_slow_route_leaves_slots_and_queue_for_others,
    a_batch_on_a_slow_route_leaves_a_slot_for_others,
);
