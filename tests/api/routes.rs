//! Routes by destination (`SENDONCE_ROUTES`), end to end: each number takes
//! the providers of the longest prefix it starts with, fails over along that
//! route only, and the route shows on the message and its events. Messages
//! are counted where they are created: Twilio at the instance's mock (its
//! Twilio API), `http` at a second mock, neither de-duplicating.

use std::sync::Arc;

use reqwest::Method;
use sendonce::delivery::destinations::Routes;
use sendonce::provider::{Provider, SimulatedProvider};
use serde_json::{Value, json};
use testkit::mock_provider::MockProvider;

use crate::failover::{
    attempts, dead_address, events, providers_and_outcomes, secondary, twilio_at,
};
use crate::helpers::*;

const SAUDI: &str = "+966501234567";
const US: &str = "+14155550123";
const UK: &str = "+447911123456";

fn routes(table: &str) -> Routes {
    Routes::parse(table, |name| {
        ["twilio", "http", "simulated"]
            .into_iter()
            .find(|known| *known == name)
    })
    .expect("routes")
}

struct Routed {
    app: TestApp,
    /// The `http` provider's mock (Twilio's is `app.mock`).
    second: MockProvider,
}

/// An instance with Twilio (at its own mock, or at a dead address), `http`
/// at a second mock and the simulated provider, routed by `table`.
async fn spawn_routed(backend: Backend, table: &str, twilio_down: bool) -> Routed {
    let (second, http) = secondary().await;
    let dead = if twilio_down {
        Some(dead_address().await)
    } else {
        None
    };
    let mut settings = test_settings();
    settings.provider.routes = Some(routes(table));
    let simulated: Arc<dyn Provider> = Arc::new(SimulatedProvider { log_bodies: false });
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(Box::new(move |mock, _app, _settings| {
            twilio_at(dead.as_deref().unwrap_or(mock))
        })),
        fallbacks: vec![http, simulated],
        ..TestOptions::default()
    })
    .await;
    Routed { app, second }
}

async fn each_number_takes_the_first_provider_of_its_route(backend: Backend) {
    let r = spawn_routed(backend, "+966=twilio,http; +1=http; *=simulated", false).await;
    for (key, to, provider, route) in [
        ("sa-1", SAUDI, "twilio", "+966"),
        ("us-1", US, "http", "+1"),
        ("uk-1", UK, "simulated", "*"),
    ] {
        let body = format!("Order {key} confirmed");
        let a = r.app.post(key, &sms(to, &body)).await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
        let m = a.json();
        assert_eq!(m["status"], "sent", "{m}");
        assert_eq!(m["provider"], provider, "{to}");
        assert_eq!(m["route"], route, "{to}");
        // The stored resource says the same.
        let got = r.app.get(&format!("/messages/{key}")).await.json();
        assert_eq!(got["route"], route);
    }
    // One message each, where each was sent, and none anywhere else.
    assert_eq!(r.app.mock.deliveries_to(SAUDI, "Order sa-1 confirmed"), 1);
    assert_eq!(r.app.mock.created(), 1);
    assert_eq!(r.second.deliveries_to(US, "Order us-1 confirmed"), 1);
    assert_eq!(r.second.created(), 1);
}

async fn a_routes_first_provider_down_sends_on_its_second_once(backend: Backend) {
    let r = spawn_routed(backend, "+966=twilio,http; *=twilio", true).await;
    let a = r.app.post("sa-down", &sms(SAUDI, "code 1")).await;
    assert_eq!(a.status, 201);
    let m = a.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["provider"], "http");
    assert_eq!(m["route"], "+966");
    assert_eq!(r.second.deliveries_to(SAUDI, "code 1"), 1);
    assert_eq!(
        providers_and_outcomes(&attempts(&r.app, "sa-down").await),
        vec![
            ("twilio".into(), "retryable".into()),
            ("http".into(), "sent".into())
        ]
    );
    let ev = events(&r.app, "sa-down").await;
    let failover: Vec<&Value> = ev.iter().filter(|e| e["type"] == "failover").collect();
    assert_eq!(failover.len(), 1, "{ev:?}");
    assert_eq!(failover[0]["to"], "http");
    let reason = failover[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("(route +966)"), "{reason}");
    // Issue 42, item 7: the route is on the message's events too: each
    // attempt and failover says the route it followed.
    let routed: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "attempt" || e["type"] == "failover")
        .collect();
    assert_eq!(routed.len(), 3, "{ev:?}");
    for e in routed {
        assert_eq!(e["route"], "+966", "{e}");
    }
    // A replay sends nothing more.
    let again = r.app.post("sa-down", &sms(SAUDI, "code 1")).await;
    assert_eq!(again.bytes, a.bytes);
    assert_eq!(r.second.deliveries_to(SAUDI, "code 1"), 1);

    // The default route has only Twilio: its numbers never fail over to
    // `http`, whatever the list of configured providers holds.
    let a = r
        .app
        .post_with(Some("us-down"), &sms(US, "code 2"), &[("prefer", "wait=1")])
        .await;
    assert!(a.status == 202 || a.status == 201, "{}", a.status);
    let after = within(
        std::time::Duration::from_secs(20),
        "the default route's message to run out of attempts",
        || async {
            let m = r.app.get("/messages/us-down").await.json();
            (m["status"] != "processing").then_some(m)
        },
    )
    .await;
    assert_eq!(after["provider"], "twilio", "{after}");
    assert_eq!(after["route"], "*");
    let tried = providers_and_outcomes(&attempts(&r.app, "us-down").await);
    assert!(
        !tried.is_empty() && tried.iter().all(|(p, _)| p == "twilio"),
        "{tried:?}"
    );
    assert_eq!(r.second.deliveries_to(US, "code 2"), 0);
}

async fn start_verification(app: &TestApp, key: &str, to: &str) -> Answer {
    answer(
        app.request(Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&json!({ "to": to }))
            .send()
            .await
            .expect("POST /verifications"),
    )
    .await
}

/// Without a default, a number no prefix covers is refused up front: a 400
/// on `to`, nothing stored, nothing sent, for messages, batch items and
/// verifications alike.
async fn a_number_no_route_covers_is_refused_and_nothing_is_stored(backend: Backend) {
    let r = spawn_routed(backend, "+966=twilio", false).await;
    let a = r.app.post("us-none", &sms(US, "hello")).await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let p = a.json();
    assert_eq!(p["errors"][0]["field"], "to", "{p}");
    assert!(
        p["errors"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no route covers this number"),
        "{p}"
    );
    assert_eq!(r.app.get("/messages/us-none").await.status, 404);

    let batch = answer(
        r.app
            .request(Method::POST, "/messages/batch")
            .bearer_auth(&r.app.api_key)
            .json(&json!({ "messages": [
                { "idempotency_key": "b-sa", "to": SAUDI, "body": "batch sa" },
                { "idempotency_key": "b-us", "to": US, "body": "batch us" },
            ] }))
            .send()
            .await
            .expect("POST /messages/batch"),
    )
    .await;
    assert_eq!(
        batch.status,
        200,
        "{}",
        String::from_utf8_lossy(&batch.bytes)
    );
    let results = batch.json()["results"].clone();
    assert_eq!(results[0]["status"], 202, "{results}");
    assert_eq!(results[1]["status"], 400, "{results}");
    assert_eq!(
        results[1]["problem"]["errors"][0]["field"], "to",
        "{results}"
    );
    assert_eq!(r.app.get("/messages/b-us").await.status, 404);

    let v = start_verification(&r.app, "v-us", US).await;
    assert_eq!(v.status, 400, "{}", String::from_utf8_lossy(&v.bytes));
    assert_eq!(v.json()["errors"][0]["field"], "to");

    // The covered number of the batch goes out, once; nothing else does.
    r.app.wait_for_status("b-sa", "sent").await;
    assert_eq!(r.app.mock.deliveries_to(SAUDI, "batch sa"), 1);
    assert_eq!(r.app.mock.created(), 1);
    assert_eq!(r.app.message_count().await, 1);
}

/// A verification's messages take the route of its number.
async fn a_verification_takes_its_numbers_route(backend: Backend) {
    let r = spawn_routed(backend, "+966=twilio; *=http", false).await;
    let v = start_verification(&r.app, "v-us", US).await;
    assert_eq!(v.status, 201, "{}", String::from_utf8_lossy(&v.bytes));
    within(
        std::time::Duration::from_secs(10),
        "the verification's message to be sent",
        || async { (r.second.created_to(US) == 1).then_some(()) },
    )
    .await;
    assert_eq!(r.app.mock.created(), 0);
}

on_both_backends!(
    each_number_takes_the_first_provider_of_its_route,
    a_routes_first_provider_down_sends_on_its_second_once,
    a_number_no_route_covers_is_refused_and_nothing_is_stored,
    a_verification_takes_its_numbers_route,
);
