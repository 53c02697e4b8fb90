//! A verification's channels in any order, one step at a time (issue 40),
//! counted at mocks that make a message for every accepted send: the
//! `http` SMS endpoint (per number and text) and the Gateway (per number
//! and code). The Telegram-first order's own cases are in
//! `telegram_gateway.rs` and `gateway_promise.rs`; these are the orders and
//! step delays it did not allow.

use std::time::Duration;

use reqwest::Method;
use sendonce::clock::Clock;
use serde_json::{Value, json};
use testkit::mock_provider::{Behaviour, MockProvider};

use crate::helpers::*;
use crate::telegram_gateway::{
    TO, TOKEN, check, gateway_calling_back, manual_clock, messages_when, pair, sms_to, started,
    verification,
};

const RECEIPT_SECRET: &str = "channel-orders-receipt-secret-0123";

/// An instance with the `http` SMS provider (its receipts keyed) and the
/// Gateway, both on one mock.
async fn spawn_orders(backend: Backend, clock: Clock) -> TestApp {
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_gateway_token(TOKEN);
    let base = url.trim_end_matches("/messages").to_string();
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
        ("TELEGRAM_GATEWAY_TOKEN", TOKEN),
        ("SENDONCE_RECEIPT_SECRET", RECEIPT_SECRET),
    ])
    .expect("receipt settings");
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        mock: Some((mock, url)),
        fallbacks: vec![gateway_calling_back(&base, None)],
        ..TestOptions::default()
    })
    .await
}

fn sms_first() -> Value {
    json!({"to": TO, "channels": ["sms", "telegram"], "fallback_after_seconds": 10})
}

/// The code the one SMS to `TO` carried.
fn sms_code(app: &TestApp) -> String {
    let bodies = sms_to(app, TO);
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    bodies[0].chars().filter(char::is_ascii_digit).collect()
}

/// Silence on the SMS: Telegram after the SMS's delay, once, the same
/// code, under the step's own key; nothing more however long it waits.
async fn sms_first_then_telegram_after_its_delay(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_orders(backend, clock.clone()).await;
    let id = started(&app, "order-1", sms_first()).await;
    messages_when(&app, &id, "the SMS sent", |m| m == [pair("sms", "sent")]).await;
    clock.advance(Duration::from_secs(9));
    // A pass at 9 s moves nothing (the row is not due).
    let v = verification(&app, &id).await;
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(app.mock.gateway_messages().is_empty());
    clock.advance(Duration::from_secs(2));
    messages_when(&app, &id, "Telegram after the SMS's delay", |m| {
        m == [pair("sms", "sent"), pair("telegram", "sent")]
    })
    .await;
    let code = sms_code(&app);
    let sent = app.mock.gateway_messages();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0].code.as_deref(),
        Some(code.as_str()),
        "the same code"
    );
    assert_eq!(app.mock.deliveries_to(TO, &code), 1, "one Gateway message");
    let v = verification(&app, &id).await;
    assert_eq!(
        v["messages"][1]["idempotency_key"]
            .as_str()
            .map(|k| k.ends_with(":send:1:telegram")),
        Some(true),
        "{v}"
    );
    assert_eq!(v["channels"], json!(["sms", "telegram"]));
    assert_eq!(v["fallback_after_seconds"], 10);
    // The last step has nothing after it.
    clock.advance(Duration::from_secs(120));
    let waiting = app
        .db
        .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'waiting' AND step = 1")
        .await;
    assert_eq!(waiting, 1, "the last step's row waits for the end");
    assert_eq!(sms_to(&app, TO).len(), 1);
    assert_eq!(app.mock.gateway_messages().len(), 1);
    assert_eq!(check(&app, &id, &code).await.json()["status"], "approved");
}

/// A delivery report of the SMS stops the rest: no Telegram message,
/// however long it waits.
async fn a_delivered_sms_never_goes_on_to_telegram(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_orders(backend, clock.clone()).await;
    let id = started(&app, "order-2", sms_first()).await;
    messages_when(&app, &id, "the SMS sent", |m| m == [pair("sms", "sent")]).await;
    let v = verification(&app, &id).await;
    let key = v["messages"][0]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_string();
    let m = app.get(&format!("/messages/{key}")).await.json();
    let provider_id = m["provider_message_id"].as_str().expect("provider id");
    let r = app
        .request(Method::POST, "/providers/http/status")
        .header("X-Receipt-Secret", RECEIPT_SECRET)
        .json(&json!({"id": provider_id, "status": "delivered", "event_id": "ev-1"}))
        .send()
        .await
        .expect("receipt");
    assert_eq!(r.status(), 200);
    messages_when(&app, &id, "the SMS delivered", |m| {
        m == [pair("sms", "delivered")]
    })
    .await;
    clock.advance(Duration::from_secs(60));
    eventually("the step's row settled delivered", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
            .await;
        (n == 1).then_some(())
    })
    .await;
    assert!(
        app.mock.gateway_messages().is_empty(),
        "Telegram never sent"
    );
    assert_eq!(app.mock.gateway_checks().len(), 0);
    assert_eq!(sms_to(&app, TO).len(), 1);
}

/// An SMS refused for certain moves on at once, before its delay.
async fn a_refused_sms_goes_on_to_telegram_at_once(backend: Backend) {
    let app = spawn_orders(backend, Clock::system()).await;
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: json!({"error": "invalid number"}),
        retry_after: None,
    }]);
    let id = started(
        &app,
        "order-3",
        json!({"to": TO, "channels": ["sms", "telegram"], "fallback_after_seconds": 300}),
    )
    .await;
    let got = messages_when(&app, &id, "Telegram after the SMS failed", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    assert_eq!(got, [pair("sms", "failed"), pair("telegram", "sent")]);
    assert_eq!(app.mock.gateway_messages().len(), 1);
}

/// `fallback_after_seconds` as a list: each step waits its own time.
async fn each_step_waits_its_own_delay(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_orders(backend, clock.clone()).await;
    let id = started(
        &app,
        "order-4",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": [25]}),
    )
    .await;
    messages_when(&app, &id, "the Telegram message sent", |m| {
        m == [pair("telegram", "sent")]
    })
    .await;
    assert_eq!(
        verification(&app, &id).await["fallback_after_seconds"],
        json!([25])
    );
    // Past the one-number default's 10 s and the shortest 5 s: nothing yet.
    clock.advance(Duration::from_secs(20));
    let v = verification(&app, &id).await;
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(sms_to(&app, TO).is_empty());
    clock.advance(Duration::from_secs(6));
    messages_when(&app, &id, "the SMS after 25 s", |m| {
        m.len() == 2 && m[1] == pair("sms", "sent")
    })
    .await;
    assert_eq!(sms_to(&app, TO).len(), 1);
    assert_eq!(app.mock.gateway_messages().len(), 1);
}

/// PATCHes the tenant of `app`'s key with `body`.
async fn patch_tenant(app: &TestApp, admin: &str, body: Value) -> crate::helpers::Answer {
    let req = app
        .request(Method::PATCH, &format!("/admin/tenants/{}", app.tenant))
        .bearer_auth(admin)
        .json(&body);
    answer(req.send().await.expect("PATCH")).await
}

/// A tenant's default channels (`verify_channels`) are a start's when it
/// names none; a start that names them wins; a replay after the default
/// changed is the same request; a bad default is a 400 that changes
/// nothing.
async fn a_tenants_default_channels_apply_when_a_start_names_none(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_orders(backend, clock.clone()).await;
    let admin = crate::access::key_with(&app, sendonce::scopes::Scopes::ALL, Some("ops")).await;
    let bad = patch_tenant(&app, &admin, json!({"verify_channels": ["sms", "pigeon"]})).await;
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.bytes));
    assert_eq!(bad.json()["errors"][0]["field"], "verify_channels");
    let ok = patch_tenant(
        &app,
        &admin,
        json!({"verify_channels": ["telegram", "sms"]}),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.bytes));
    assert_eq!(ok.json()["verify_channels"], json!(["telegram", "sms"]));
    let body = json!({"to": TO, "ttl_seconds": 120});
    let id = started(&app, "default-1", body.clone()).await;
    let v = verification(&app, &id).await;
    assert_eq!(v["channels"], json!(["telegram", "sms"]), "{v}");
    // Unsaid, the step waits half the life (60 s): nothing at 59 s.
    messages_when(&app, &id, "the Telegram message sent", |m| {
        m == [pair("telegram", "sent")]
    })
    .await;
    assert_eq!(v["fallback_after_seconds"], 60);
    // A start that names its channels keeps them.
    let own = started(
        &app,
        "default-2",
        json!({"to": "+14155550124", "channels": ["sms"]}),
    )
    .await;
    assert_eq!(verification(&app, &own).await["channels"], json!(["sms"]));
    // The default cleared: the replay under the first key is the first
    // answer, not a refusal of a changed request.
    let cleared = patch_tenant(&app, &admin, json!({"verify_channels": null})).await;
    assert_eq!(cleared.json()["verify_channels"], Value::Null);
    let replay = crate::telegram_gateway::start(&app, "default-1", body).await;
    assert_eq!(
        replay.status,
        201,
        "{}",
        String::from_utf8_lossy(&replay.bytes)
    );
    assert_eq!(replay.json()["id"], id.as_str());
    let fresh = started(&app, "default-3", json!({"to": "+14155550125"})).await;
    assert_eq!(verification(&app, &fresh).await["channels"], json!(["sms"]));
}

on_both_backends!(
    a_tenants_default_channels_apply_when_a_start_names_none,
    sms_first_then_telegram_after_its_delay,
    a_delivered_sms_never_goes_on_to_telegram,
    a_refused_sms_goes_on_to_telegram_at_once,
    each_step_waits_its_own_delay,
);
