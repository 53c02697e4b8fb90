//! Routing across two providers, end to end: Twilio (the mock's Twilio API)
//! first, the `http` provider (a second mock) after it. A message moves on
//! only when Twilio certainly did not send it; the circuit breaker is shared
//! by every instance through the store.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::provider::{HttpProvider, Provider, TwilioProvider, TwilioSettings};
use serde_json::Value;
use testkit::mock_provider::{Behaviour, MockProvider};

use crate::helpers::*;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, DEFAULT_FROM};

const TO: &str = "+14155550111";

pub(crate) fn twilio_at(base_url: &str) -> Arc<dyn Provider> {
    Arc::new(
        TwilioProvider::new(TwilioSettings {
            base_url: base_url.to_string(),
            account_sid: ACCOUNT.into(),
            auth_token: AUTH_TOKEN.into(),
            from: Some(DEFAULT_FROM.into()),
            messaging_service_sid: None,
            status_callback: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        })
        .expect("twilio provider"),
    )
}

/// Twilio aimed at the instance's mock, or at `dead` when given.
fn primary(dead: Option<String>) -> ProviderFactory {
    Box::new(move |mock, _app, _settings| twilio_at(dead.as_deref().unwrap_or(mock)))
}

/// The second mock and the `http` provider aimed at it.
pub(crate) async fn secondary() -> (MockProvider, Arc<dyn Provider>) {
    let (mock, url, _) = MockProvider::start().await.expect("second mock");
    let provider = HttpProvider::new(
        &url,
        Some("provider-token".into()),
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .expect("http provider");
    (mock, Arc::new(provider))
}

/// An address nothing listens on: connecting is refused.
pub(crate) async fn dead_address() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

struct Pair {
    app: TestApp,
    second: MockProvider,
}

async fn spawn_pair(backend: Backend, dead_primary: bool) -> Pair {
    let (second, fallback) = secondary().await;
    let dead = if dead_primary {
        Some(dead_address().await)
    } else {
        None
    };
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(primary(dead)),
        fallbacks: vec![fallback],
        ..TestOptions::default()
    })
    .await;
    Pair { app, second }
}

pub(crate) async fn attempts(app: &TestApp, key: &str) -> Vec<Value> {
    let a = app.get(&format!("/messages/{key}/attempts")).await;
    assert_eq!(a.status, 200);
    a.json()["data"].as_array().cloned().unwrap_or_default()
}

pub(crate) async fn events(app: &TestApp, key: &str) -> Vec<Value> {
    let a = app.get(&format!("/messages/{key}/events")).await;
    assert_eq!(a.status, 200);
    a.json()["data"].as_array().cloned().unwrap_or_default()
}

pub(crate) fn providers_and_outcomes(attempts: &[Value]) -> Vec<(String, String)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap_or("?").to_string(),
                a["outcome"].as_str().unwrap_or("open").to_string(),
            )
        })
        .collect()
}

async fn primary_down_sends_on_the_secondary_once(backend: Backend) {
    let p = spawn_pair(backend, true).await;
    let a = p.app.post("down-1", &sms(TO, "code 1")).await;
    assert_eq!(a.status, 201);
    let body = a.json();
    assert_eq!(body["status"], "sent", "{body}");
    assert_eq!(body["provider"], "http");
    assert!(body["provider_message_id"].is_string());
    assert_eq!(p.second.deliveries_to(TO, "code 1"), 1);
    assert_eq!(
        providers_and_outcomes(&attempts(&p.app, "down-1").await),
        vec![
            ("twilio".into(), "retryable".into()),
            ("http".into(), "sent".into())
        ]
    );
    let ev = events(&p.app, "down-1").await;
    let failover: Vec<&Value> = ev.iter().filter(|e| e["type"] == "failover").collect();
    assert_eq!(failover.len(), 1, "{ev:?}");
    assert_eq!(failover[0]["from"], "twilio");
    assert_eq!(failover[0]["to"], "http");
    // Not routed by destination: no event names a route.
    assert!(ev.iter().all(|e| e.get("route").is_none()), "{ev:?}");
    // A replay changes nothing and sends nothing.
    let again = p.app.post("down-1", &sms(TO, "code 1")).await;
    assert_eq!(again.bytes, a.bytes);
    assert_eq!(p.second.deliveries_to(TO, "code 1"), 1);
}

async fn an_invalid_number_fails_and_the_secondary_is_never_called(backend: Backend) {
    let p = spawn_pair(backend, false).await;
    p.app.mock.push([Behaviour::Fail {
        status: 400,
        body: serde_json::json!({
            "code": 21211,
            "message": "The 'To' number is not a valid phone number.",
            "status": 400,
        }),
        retry_after: None,
    }]);
    let a = p.app.post("invalid-1", &sms(TO, "code 2")).await;
    assert_eq!(a.status, 201);
    assert_eq!(a.json()["status"], "failed", "{}", a.json());
    assert_eq!(a.json()["provider"], "twilio");
    assert_eq!(p.second.call_count(), 0);
    assert!(
        events(&p.app, "invalid-1")
            .await
            .iter()
            .all(|e| e["type"] != "failover")
    );
}

async fn a_dropped_answer_is_reconciled_on_the_primary(backend: Backend) {
    let p = spawn_pair(backend, false).await;
    p.app.mock.push([Behaviour::AcceptThenDrop]);
    let a = p.app.post("drop-1", &sms(TO, "code 3")).await;
    assert_eq!(a.status, 201);
    let body = a.json();
    assert_eq!(body["status"], "sent", "{body}");
    assert_eq!(body["provider"], "twilio");
    assert_eq!(p.app.mock.deliveries_to(TO, "code 3"), 1);
    assert_eq!(p.second.call_count(), 0);
    assert_eq!(
        providers_and_outcomes(&attempts(&p.app, "drop-1").await),
        vec![("twilio".into(), "ambiguous".into())]
    );
}

async fn twilio_refusing_the_account_moves_on(backend: Backend) {
    let p = spawn_pair(backend, false).await;
    p.app.mock.push([Behaviour::Fail {
        status: 401,
        body: serde_json::json!({"code": 20003, "message": "Authenticate", "status": 401}),
        retry_after: None,
    }]);
    let a = p.app.post("refused-1", &sms(TO, "code 4")).await;
    assert_eq!(a.json()["status"], "sent", "{}", a.json());
    assert_eq!(a.json()["provider"], "http");
    assert_eq!(p.second.deliveries_to(TO, "code 4"), 1);
    assert_eq!(
        providers_and_outcomes(&attempts(&p.app, "refused-1").await),
        vec![
            ("twilio".into(), "refused".into()),
            ("http".into(), "sent".into())
        ]
    );
}

async fn a_receipt_from_the_secondary_matches_the_failed_over_message(backend: Backend) {
    let mut settings = test_settings();
    let secret = "failover-receipt-secret-0123456789";
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        secret,
    )])
    .unwrap();
    let (second, fallback) = secondary().await;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(primary(None)),
        fallbacks: vec![fallback],
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Fail {
        status: 429,
        body: serde_json::json!({"code": 20429, "message": "Too Many Requests", "status": 429}),
        retry_after: Some(1),
    }]);
    let a = app.post("dlr-1", &sms(TO, "dlr")).await;
    assert_eq!(a.json()["provider"], "http", "{}", a.json());
    assert_eq!(second.deliveries_to(TO, "dlr"), 1);
    let id = a.json()["provider_message_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = app
        .client
        .post(format!("{}/providers/http/status", app.base))
        .header("X-Receipt-Secret", secret)
        .json(&serde_json::json!({"id": id, "status": "delivered", "event_id": "ev-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    app.wait_for_status("dlr-1", "delivered").await;
}

on_both_backends!(
    a_receipt_from_the_secondary_matches_the_failed_over_message,
    primary_down_sends_on_the_secondary_once,
    an_invalid_number_fails_and_the_secondary_is_never_called,
    a_dropped_answer_is_reconciled_on_the_primary,
    twilio_refusing_the_account_moves_on,
    the_circuit_opens_under_503s_and_closes_after_recovery,
    three_instances_share_the_circuit,
    circuit_writes_are_compare_and_set,
);

/// Opens after 3 failures in a row; a probe is due 30 s later (on the
/// manual clock); every read of the circuits goes to the store.
fn circuit_settings() -> sendonce::config::Settings {
    let mut s = test_settings();
    s.provider.circuit = sendonce::delivery::CircuitPolicy {
        failures: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(30),
        refresh: Duration::ZERO,
    };
    s
}

/// Twilio's 20429: "never processed and is always safe to retry", so the
/// message moves on (a 5xx is no clear answer, and with Twilio's list that
/// may lag it never moves on).
fn busy() -> Behaviour {
    Behaviour::Fail {
        status: 429,
        body: serde_json::json!({"code": 20429, "message": "Too Many Requests", "status": 429}),
        retry_after: None,
    }
}

async fn circuit_of(app: &TestApp, provider: &str) -> String {
    let a = app.get("/readyz").await;
    assert_eq!(a.status, 200);
    a.json()["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == provider))
        .and_then(|p| p["circuit"].as_str())
        .unwrap_or("?")
        .to_string()
}

async fn metrics(app: &TestApp) -> String {
    let r = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    r.text().await.unwrap()
}

async fn the_circuit_opens_under_503s_and_closes_after_recovery(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let (second, fallback) = secondary().await;
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: circuit_settings(),
        provider: Some(primary(None)),
        fallbacks: vec![fallback],
        ..TestOptions::default()
    })
    .await;
    app.mock.push([busy(), busy(), busy()]);
    for i in 0..3 {
        let a = app
            .post(&format!("burst-{i}"), &sms(TO, &format!("b{i}")))
            .await;
        // Twilio never processed it: the second provider sends it.
        assert_eq!(a.json()["status"], "sent", "{}", a.json());
        assert_eq!(a.json()["provider"], "http");
    }
    assert_eq!(app.mock.deliveries_to(TO, "b0"), 0);
    assert_eq!(circuit_of(&app, "twilio").await, "open");
    assert!(
        metrics(&app)
            .await
            .contains("sendonce_provider_circuit_state{provider=\"twilio\"} 2")
    );
    let ev = events(&app, "burst-2").await;
    assert!(
        ev.iter()
            .any(|e| e["type"] == "circuit" && e["state"] == "open"),
        "{ev:?}"
    );

    // Open: new messages go straight to the second provider.
    let twilio_sends = app.mock.stats().calls;
    let a = app.post("while-open", &sms(TO, "w")).await;
    assert_eq!(a.json()["provider"], "http");
    assert_eq!(
        providers_and_outcomes(&attempts(&app, "while-open").await),
        vec![("http".into(), "sent".into())]
    );
    assert_eq!(
        app.mock.stats().calls,
        twilio_sends,
        "Twilio was called while open"
    );
    assert_eq!(second.deliveries_to(TO, "w"), 1);

    // After open_for one send probes Twilio, which works again: closed.
    clock.advance(Duration::from_secs(31));
    let a = app.post("probe", &sms(TO, "p")).await;
    assert_eq!(a.json()["status"], "sent", "{}", a.json());
    assert_eq!(a.json()["provider"], "twilio");
    assert_eq!(circuit_of(&app, "twilio").await, "closed");
    let ev = events(&app, "probe").await;
    assert!(
        ev.iter()
            .any(|e| e["type"] == "circuit" && e["state"] == "closed"),
        "{ev:?}"
    );
    let a = app.post("after", &sms(TO, "a")).await;
    assert_eq!(a.json()["provider"], "twilio");
}

async fn three_instances_share_the_circuit(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let (second, fallback) = secondary().await;
    let first = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: circuit_settings(),
        provider: Some(primary(None)),
        fallbacks: vec![Arc::clone(&fallback)],
        ..TestOptions::default()
    })
    .await;
    let mut others = Vec::new();
    for _ in 0..2 {
        others.push(
            spawn_with(TestOptions {
                backend,
                clock: clock.clone(),
                settings: circuit_settings(),
                database: Some(first.database.clone()),
                mock: Some((first.mock.clone(), first.mock_url.clone())),
                api_key: Some(first.api_key.clone()),
                provider: Some(primary(None)),
                fallbacks: vec![Arc::clone(&fallback)],
                ..TestOptions::default()
            })
            .await,
        );
    }
    first.mock.push([busy(), busy(), busy()]);
    for i in 0..3 {
        let a = first
            .post(&format!("one-{i}"), &sms(TO, &format!("o{i}")))
            .await;
        assert_eq!(a.json()["provider"], "http", "{}", a.json());
    }
    let twilio_calls = first.mock.stats().calls;
    for (n, app) in others.iter().enumerate() {
        assert_eq!(circuit_of(app, "twilio").await, "open");
        for i in 0..3 {
            let key = format!("other-{n}-{i}");
            let a = app.post(&key, &sms(TO, &key)).await;
            assert_eq!(a.json()["provider"], "http", "{}", a.json());
        }
    }
    assert_eq!(
        first.mock.stats().calls,
        twilio_calls,
        "another instance called Twilio while its circuit was open"
    );
    assert_eq!(second.stats().deliveries, 9);

    // One probe for all three: the first instance to try takes it.
    clock.advance(Duration::from_secs(31));
    let gate = Arc::new(tokio::sync::Notify::new());
    first.mock.push([Behaviour::Gate(Arc::clone(&gate))]);
    let probe = {
        let c = first.client.clone();
        let url = format!("{}/messages", first.base);
        let key = first.api_key.clone();
        tokio::spawn(async move {
            c.post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", "probe")
                .json(&sms(TO, "probe"))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    eventually("the probe to reach Twilio", || async {
        (first.mock.stats().calls > twilio_calls).then_some(())
    })
    .await;
    for (n, app) in others.iter().enumerate() {
        assert_eq!(circuit_of(app, "twilio").await, "half_open");
        let key = format!("during-probe-{n}");
        let a = app.post(&key, &sms(TO, &key)).await;
        assert_eq!(a.json()["provider"], "http", "{}", a.json());
    }
    assert_eq!(first.mock.stats().calls, twilio_calls + 1);
    gate.notify_one();
    let probed = probe.await.unwrap();
    assert_eq!(probed["provider"], "twilio", "{probed}");
    for app in &others {
        assert_eq!(circuit_of(app, "twilio").await, "closed");
    }
}

/// Circuits change by compare-and-set: of two writes from the same version
/// one wins, and a write from a stale version changes nothing.
async fn circuit_writes_are_compare_and_set(backend: Backend) {
    use sendonce::store::{Circuit, CircuitState};
    let url = fresh_database_on(backend).await;
    let (store, _) = open_store(&url, Duration::from_secs(2));
    let now = time::OffsetDateTime::now_utc();
    let base = Circuit::closed("twilio", now);
    let first = Circuit {
        failures: 1,
        version: 1,
        ..base.clone()
    };
    assert!(store.put_circuit(&first).await.unwrap());
    // Another instance that also started from "no row" loses.
    assert!(!store.put_circuit(&first).await.unwrap());
    let open = Circuit {
        state: CircuitState::Open,
        failures: 3,
        opened_at: Some(now),
        version: 2,
        ..first.clone()
    };
    let probe = Circuit {
        state: CircuitState::HalfOpen,
        version: 2,
        ..first.clone()
    };
    assert!(store.put_circuit(&open).await.unwrap());
    assert!(!store.put_circuit(&probe).await.unwrap());
    let stored = store.circuits().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].state, CircuitState::Open);
    assert_eq!(stored[0].failures, 3);
    assert_eq!(stored[0].version, 2);
}
