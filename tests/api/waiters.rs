//! Requests waiting for a message another request is sending (issue 18,
//! finding 5): they do not poll the database each, they are capped per
//! tenant, and the queue of sends behind the provider slots is bounded.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::helpers::*;

async fn tenant_id(app: &TestApp) -> uuid::Uuid {
    let tenants = app.handle.store.list_tenants().await.unwrap();
    tenants
        .iter()
        .find(|(_, name, _)| *name == app.tenant)
        .unwrap()
        .0
}

fn body() -> serde_json::Value {
    sms("+14155550100", "code 1234")
}

async fn post_async(app: &TestApp, key: &str) -> Answer {
    app.post_with(Some(key), &body(), &[("prefer", "respond-async")])
        .await
}

/// Duplicates waiting for the result, each on a task of its own.
fn wait_in_background(app: &TestApp, key: &str, n: usize) -> Vec<tokio::task::JoinHandle<Answer>> {
    (0..n)
        .map(|_| {
            let req = app
                .request(reqwest::Method::POST, "/messages")
                .bearer_auth(&app.api_key)
                .header("Idempotency-Key", key)
                .header("prefer", "wait=10")
                .json(&body());
            tokio::spawn(async move { answer(req.send().await.expect("POST")).await })
        })
        .collect()
}

/// Beyond the tenant's cap a duplicate is answered 409 with Retry-After at
/// once, instead of joining the wait; those already waiting get the result.
async fn a_duplicate_beyond_the_waiter_cap_is_answered_at_once(backend: Backend) {
    let mut settings = test_settings();
    settings.caches.max_waiters_per_tenant = 2;
    // The gated call must outlast however long a loaded machine takes to
    // reach `notify_one`: a provider timeout would make it ambiguous and
    // resend it (a legitimate second call that this test would count).
    settings.delivery.provider_timeout = Duration::from_secs(60);
    settings.delivery.lease = Duration::from_secs(120);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider_timeout: Duration::from_secs(60),
        ..TestOptions::default()
    })
    .await;
    let tenant = tenant_id(&app).await;
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(Arc::clone(&gate))]);
    assert_eq!(post_async(&app, "W1").await.status, 202);
    let waiting = wait_in_background(&app, "W1", 2);
    eventually("two waiters", || async {
        (app.handle.waiters.count(tenant) == 2).then_some(())
    })
    .await;

    let started = Instant::now();
    let refused = app.post("W1", &body()).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at once, not after the wait"
    );
    assert_eq!(refused.status, 409);
    assert_eq!(refused.slug(), "too-many-waiters");
    assert_eq!(refused.header("retry-after"), Some("1"));
    // Another message of the same tenant still sends: not refused, and
    // sent (a 202 when the default 10 s wait ran out first: seen once in a
    // full suite on 2 loaded cores; the body says what it was then).
    let w2 = app.post("W2", &body()).await;
    let shown = String::from_utf8_lossy(&w2.bytes).into_owned();
    assert!(matches!(w2.status, 201 | 202), "{} {shown}", w2.status);
    eventually("W2 sent", || async {
        (app.get("/messages/W2").await.json()["status"] == "sent").then_some(())
    })
    .await;

    gate.notify_one();
    for w in waiting {
        let a = w.await.unwrap();
        assert_eq!(a.status, 201);
        assert_eq!(a.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(
        app.handle.waiters.count(tenant),
        0,
        "every place given back"
    );
    assert_eq!(app.mock.call_count(), 2, "W1 and W2, once each");
}

/// Many requests waiting on one instance for a message in backoff whose
/// retry may run anywhere share one reader of its row, and all get the
/// final answer when it comes.
#[tokio::test]
async fn waiters_for_a_message_in_backoff_share_one_poller() {
    let a = spawn_app().await;
    let b = spawn_with(TestOptions {
        database: Some(a.database.clone()),
        api_key: Some(a.api_key.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    a.mock.push([Behaviour::Fail {
        status: 503,
        body: json!({"message": "busy"}),
        retry_after: Some(2),
    }]);
    assert_eq!(post_async(&a, "B1").await.status, 202);
    eventually("the message to wait for its retry", || async {
        let n =
            a.db.count(
                "SELECT count(*) FROM messages \
                 WHERE next_attempt_at IS NOT NULL AND lease_owner IS NULL",
            )
            .await;
        (n == 1).then_some(())
    })
    .await;
    let tenant = tenant_id(&a).await;
    let waiting = wait_in_background(&b, "B1", 20);
    eventually("twenty waiters on b", || async {
        (b.handle.waiters.count(tenant) == 20).then_some(())
    })
    .await;
    assert_eq!(b.handle.deliverer.hub().pollers(), 1, "one reader, not 20");
    assert_eq!(b.handle.deliverer.hub().slots(), 1);

    let mut bodies = Vec::new();
    for w in waiting {
        let got = w.await.unwrap();
        assert_eq!(got.status, 201);
        bodies.push(got.bytes);
    }
    bodies.dedup();
    assert_eq!(bodies.len(), 1, "one final answer for all");
    eventually("b's rendezvous to empty", || async {
        (b.handle.deliverer.hub().slots() == 0).then_some(())
    })
    .await;
    assert_eq!(a.mock.call_count(), 2, "the refused call and the retry");
}

/// With every send slot busy and the queue behind them full, a new send is
/// refused with 503 and Retry-After and nothing is stored; a request for a
/// key that exists still gets its usual answer; once the queue drains new
/// sends are taken again.
async fn a_full_send_queue_refuses_new_sends(backend: Backend) {
    let mut settings = test_settings();
    settings.delivery.max_concurrent_sends = 1;
    settings.delivery.max_queued_sends = 1;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let (g1, g2) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    app.mock.push([
        Behaviour::Gate(Arc::clone(&g1)),
        Behaviour::Gate(Arc::clone(&g2)),
    ]);
    let deliverer = &app.handle.deliverer;
    assert_eq!(post_async(&app, "Q1").await.status, 202);
    eventually("Q1 to hold the only slot", || async {
        (deliverer.queued() == 0 && deliverer.free_permits() == 0).then_some(())
    })
    .await;
    assert_eq!(post_async(&app, "Q2").await.status, 202);
    assert_eq!(deliverer.queued(), 1);

    let refused = post_async(&app, "Q3").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.slug(), "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(app.get("/messages/Q3").await.status, 404, "nothing stored");
    assert_eq!(app.message_count().await, 2);
    // A key that exists is not a new send: its usual answer.
    let again = post_async(&app, "Q2").await;
    assert_eq!(again.status, 409);
    assert_eq!(again.slug(), "idempotency-key-in-use");

    g1.notify_one();
    eventually("Q2 to leave the queue", || async {
        (deliverer.queued() == 0).then_some(())
    })
    .await;
    g2.notify_one();
    app.wait_for_status("Q2", "sent").await;
    assert_eq!(app.post("Q3", &body()).await.status, 201);
}

on_both_backends!(
    a_duplicate_beyond_the_waiter_cap_is_answered_at_once,
    a_full_send_queue_refuses_new_sends,
);
