//! Codes through the Telegram Gateway with SMS as the fallback (issue 28),
//! against the mock's Gateway API (a message for every accepted send,
//! counted per number and code) and its `http` SMS endpoint (which does not
//! de-duplicate: counted per number and text). The promise's own cases
//! (issue 39) are in `gateway_promise.rs`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use sendonce::clock::Clock;
use sendonce::provider::Provider;
use sendonce::provider::telegram_gateway::{GatewayProvider, GatewaySettings};
use serde_json::{Value, json};
use testkit::mock_provider::{Behaviour, MockProvider};
use testkit::providers::telegram_gateway::gateway_report;

use crate::helpers::*;

pub(crate) const TOKEN: &str = "gateway-test-token";
pub(crate) const TO: &str = "+14155550123";

/// The Gateway at `base`, passing the reports URL of `public_url`.
pub(crate) fn gateway_calling_back(base: &str, public_url: Option<&str>) -> Arc<dyn Provider> {
    Arc::new(
        GatewayProvider::new(GatewaySettings {
            url: base.to_string(),
            token: TOKEN.into(),
            callback_url: sendonce::provider::telegram_gateway::callback_url(public_url),
            public_url: public_url.map(str::to_string),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        })
        .expect("gateway provider"),
    )
}

/// An instance with the `http` SMS provider and the Gateway, both on one
/// mock, and the Gateway's reports endpoint keyed with its token.
pub(crate) async fn spawn_gateway(backend: Backend, clock: Clock) -> TestApp {
    spawn_gateway_with(backend, clock, test_settings()).await
}

pub(crate) async fn spawn_gateway_with(
    backend: Backend,
    clock: Clock,
    settings: sendonce::config::Settings,
) -> TestApp {
    spawn_gateway_at(backend, clock, settings, None).await
}

pub(crate) async fn spawn_gateway_at(
    backend: Backend,
    clock: Clock,
    mut settings: sendonce::config::Settings,
    public_url: Option<&str>,
) -> TestApp {
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_gateway_token(TOKEN);
    let base = url.trim_end_matches("/messages").to_string();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "TELEGRAM_GATEWAY_TOKEN",
        TOKEN,
    )])
    .expect("receipt settings");
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        mock: Some((mock, url)),
        fallbacks: vec![gateway_calling_back(&base, public_url)],
        ..TestOptions::default()
    })
    .await
}

pub(crate) fn manual_clock() -> Clock {
    Clock::manual(time::macros::datetime!(2026-12-04 12:00:00 UTC))
}

pub(crate) async fn start(app: &TestApp, key: &str, body: Value) -> Answer {
    let req = app
        .request(Method::POST, "/verifications")
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", key)
        .json(&body);
    answer(req.send().await.expect("POST")).await
}

pub(crate) async fn started(app: &TestApp, key: &str, body: Value) -> String {
    let a = start(app, key, body).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()["id"].as_str().expect("id").to_string()
}

pub(crate) async fn post_to(app: &TestApp, path: &str, key: Option<&str>, body: Value) -> Answer {
    let mut req = app
        .request(Method::POST, path)
        .bearer_auth(&app.api_key)
        .json(&body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    answer(req.send().await.expect("POST")).await
}

pub(crate) async fn verification(app: &TestApp, id: &str) -> Value {
    app.get(&format!("/verifications/{id}")).await.json()
}

/// The verification's messages as (channel, status), once `done` says so.
pub(crate) async fn messages_when(
    app: &TestApp,
    id: &str,
    what: &str,
    done: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    eventually(what, || async {
        let v = verification(app, id).await;
        let got: Vec<(String, String)> = v["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m["channel"].as_str().unwrap_or("?").to_string(),
                    m["status"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        done(&got).then_some(got)
    })
    .await
}

/// Starts a verification on `telegram` then `sms` (the SMS after 10 s)
/// under `key` and waits for its Telegram message to be sent; its id.
pub(crate) async fn sent_on_telegram(app: &TestApp, key: &str) -> String {
    let id = started(
        app,
        key,
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 10}),
    )
    .await;
    messages_when(app, &id, "the Telegram message sent", |m| {
        m == [pair("telegram", "sent")]
    })
    .await;
    id
}

pub(crate) fn pair(channel: &str, status: &str) -> (String, String) {
    (channel.to_string(), status.to_string())
}

/// The SMS bodies the `http` endpoint got for `to`.
pub(crate) fn sms_to(app: &TestApp, to: &str) -> Vec<String> {
    app.mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "http" && c.body["to"] == to)
        .filter_map(|c| c.body["body"].as_str().map(str::to_string))
        .collect()
}

pub(crate) async fn check(app: &TestApp, id: &str, code: &str) -> Answer {
    post_to(
        app,
        &format!("/verifications/{id}/check"),
        None,
        json!({ "code": code }),
    )
    .await
}

/// Posts the Gateway's signed report of `request_id`'s message as it
/// stands at the mock, stamped `at` (unix seconds).
pub(crate) async fn report(app: &TestApp, request_id: &str, at: i64, token: &str) -> Answer {
    let status = app.mock.gateway_report_of(request_id).expect("a message");
    let (body, signature) = gateway_report(token, at, &status);
    let req = app
        .request(Method::POST, "/channels/telegram/gateway/reports")
        .header("X-Request-Timestamp", at.to_string())
        .header("X-Request-Signature", signature)
        .header("Content-Type", "application/json")
        .body(body);
    answer(req.send().await.expect("POST report")).await
}

async fn a_number_on_telegram_gets_one_gateway_message_and_no_sms(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = started(
        &app,
        "tg-1",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 30}),
    )
    .await;
    let got = messages_when(&app, &id, "the Telegram message sent", |m| {
        m == [pair("telegram", "sent")]
    })
    .await;
    assert_eq!(got.len(), 1);
    let sent = app.mock.gateway_messages();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let code = sent[0].code.clone().expect("our code, passed as code");
    assert_eq!(code.len(), 6);
    assert_eq!(app.mock.deliveries_to(TO, &code), 1);
    assert_eq!(app.mock.gateway_checks(), [TO]);
    assert_eq!(
        sent[0].ttl,
        Some(600),
        "ttl is what is left of the verification"
    );
    assert_eq!(
        sent[0].callback_url, None,
        "no https public URL: no callback"
    );
    // Delivered, reported: the fallback never comes, whatever the time.
    let request_id = sent[0].request_id.clone();
    app.mock.gateway_set_status(&request_id, "delivered");
    let at = clock.now().unix_timestamp();
    let r = report(&app, &request_id, at, TOKEN).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    messages_when(&app, &id, "the Telegram message delivered", |m| {
        m == [pair("telegram", "delivered")]
    })
    .await;
    let v = verification(&app, &id).await;
    assert_eq!(v["messages"][0]["delivery_report"], "delivered", "{v}");
    assert_eq!(v["channels"], json!(["telegram", "sms"]));
    clock.advance(Duration::from_secs(120));
    eventually("the fallback row settled delivered", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
            .await;
        (n == 1).then_some(())
    })
    .await;
    assert!(sms_to(&app, TO).is_empty(), "SMS never called");
    // The code Telegram carried approves; the verification's end revokes.
    let ok = check(&app, &id, &code).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["status"], "approved");
    eventually("the Telegram message revoked at the end", || async {
        app.mock
            .gateway_revoked()
            .contains(&request_id)
            .then_some(())
    })
    .await;
    assert!(sms_to(&app, TO).is_empty());
}

/// A Telegram→SMS fallback's SMS is charged at the SMS price (issue 41,
/// finding 2), and still goes when the tenant is at its cap: the code was
/// promised; the counter passes the cap and later sends are refused. The
/// Gateway message, without a price row of its own, costs nothing.
async fn a_fallback_sms_is_charged_even_past_the_cap(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    crate::spend::set_caps(&app, crate::spend::daily(1)).await;
    let m = app
        .post("fill", &sms("+14155550199", "fills the cap"))
        .await;
    assert!(matches!(m.status, 201 | 202), "{:?}", m.json());
    let id = sent_on_telegram(&app, "tg-cap").await;
    clock.advance(Duration::from_secs(11));
    messages_when(&app, &id, "the SMS after no report", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    let gateway = app
        .db
        .count(
            "SELECT CAST(COALESCE(SUM(cost_micros), -1) AS BIGINT) FROM messages \
             WHERE verification_id IS NOT NULL AND provider = 'telegram_gateway'",
        )
        .await;
    assert_eq!(gateway, -1, "the Gateway message is not priced");
    let sms = app
        .db
        .count(
            "SELECT CAST(COALESCE(SUM(cost_micros), -1) AS BIGINT) FROM messages \
             WHERE verification_id IS NOT NULL AND provider = 'http'",
        )
        .await;
    assert_eq!(sms, crate::spend::PRICE, "the fallback SMS is");
    let spent = app
        .db
        .count("SELECT CAST(spent_micros AS BIGINT) FROM tenant_spend WHERE period LIKE 'd%'")
        .await;
    assert_eq!(spent, 2 * crate::spend::PRICE, "counted past the cap");
}

async fn a_number_not_on_telegram_gets_the_sms_at_once(backend: Backend) {
    let app = spawn_gateway(backend, Clock::system()).await;
    app.mock.gateway_not_on_telegram(TO);
    let id = started(
        &app,
        "tg-2",
        json!({"to": TO, "channels": ["telegram", "sms"]}),
    )
    .await;
    let got = messages_when(&app, &id, "the SMS after Telegram failed", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    assert_eq!(got, [pair("telegram", "failed"), pair("sms", "sent")]);
    assert!(app.mock.gateway_messages().is_empty());
    let metrics = String::from_utf8_lossy(&app.get("/metrics").await.bytes).into_owned();
    assert!(
        metrics.contains(r#"sendonce_verify_events_total{event="fallback",country="US"} 1"#),
        "{metrics}"
    );
    let bodies = sms_to(&app, TO);
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert_eq!(app.mock.deliveries_to(TO, &bodies[0]), 1);
    let code: String = bodies[0].chars().filter(char::is_ascii_digit).collect();
    assert_eq!(check(&app, &id, &code).await.json()["status"], "approved");
    let v = verification(&app, &id).await;
    assert_eq!(
        v["messages"][1]["idempotency_key"]
            .as_str()
            .map(|k| k.ends_with(":send:1:sms")),
        Some(true),
        "{v}"
    );
}

async fn no_report_in_time_revokes_then_sends_one_sms_with_the_same_code(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = sent_on_telegram(&app, "tg-4").await;
    let sent = app.mock.gateway_messages();
    let (request_id, code) = (
        sent[0].request_id.clone(),
        sent[0].code.clone().expect("code"),
    );
    // Before its time nothing goes (the boundary is the table of
    // `delivery::fallback::next`); past it, the revoke and then the SMS.
    assert!(sms_to(&app, TO).is_empty());
    clock.advance(Duration::from_secs(11));
    let got = messages_when(&app, &id, "the SMS after no report", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    // Revoked, then asked: the Gateway's answer ("revoked") is its
    // report, and the message is undelivered.
    assert_eq!(got[0], pair("telegram", "undelivered"));
    assert!(
        app.mock.gateway_revoked().contains(&request_id),
        "revoked first"
    );
    let bodies = sms_to(&app, TO);
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(bodies[0].contains(&code), "the same code: {}", bodies[0]);
    assert_eq!(app.mock.deliveries_to(TO, &bodies[0]), 1);
    // A later word of the Gateway is kept in the history and shown as
    // the last report; the status only moves forward.
    app.mock.gateway_set_status(&request_id, "read");
    let r = report(&app, &request_id, clock.now().unix_timestamp(), TOKEN).await;
    assert_eq!(r.status, 200);
    eventually("the late report shown", || async {
        (verification(&app, &id).await["messages"][0]["delivery_report"] == "read").then_some(())
    })
    .await;
    let got = messages_when(&app, &id, "both messages", |m| m.len() == 2).await;
    assert_eq!(got, [pair("telegram", "undelivered"), pair("sms", "sent")]);
    // The console shows both channels' messages, never the code.
    let mut b = crate::console::Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let page = b.get(&format!("/console/verifications/{id}")).await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8_lossy(&page.bytes).into_owned();
    assert!(html.contains("telegram, then sms"), "{html}");
    assert!(html.contains(":send:1:sms") && html.contains("telegram_gateway"));
    assert!(!html.contains(&code), "no code on the page");
    // Whichever channel carried it, the code approves.
    assert_eq!(check(&app, &id, &code).await.json()["status"], "approved");
    assert_eq!(sms_to(&app, TO).len(), 1);
}

async fn a_report_of_expiry_or_revoke_sends_the_sms_at_once(backend: Backend) {
    for (i, word) in ["expired", "revoked"].into_iter().enumerate() {
        let clock = manual_clock();
        let app = spawn_gateway(backend, clock.clone()).await;
        let id = started(
            &app,
            &format!("tg-r{i}"),
            json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 300}),
        )
        .await;
        messages_when(&app, &id, "sent", |m| m == [pair("telegram", "sent")]).await;
        let sent = app.mock.gateway_messages();
        let (request_id, code) = (
            sent[0].request_id.clone(),
            sent[0].code.clone().expect("code"),
        );
        // Long before the fallback is due (the clock stands still).
        app.mock.gateway_set_status(&request_id, word);
        let r = report(&app, &request_id, clock.now().unix_timestamp(), TOKEN).await;
        assert_eq!(r.status, 200, "{word}");
        let got = messages_when(&app, &id, "the SMS after the report", |m| {
            m.len() == 2 && m[1].1 == "sent"
        })
        .await;
        assert_eq!(got, [pair("telegram", "undelivered"), pair("sms", "sent")]);
        let v = verification(&app, &id).await;
        assert_eq!(v["messages"][0]["delivery_report"], word, "{v}");
        assert!(
            app.mock.gateway_revoked().is_empty(),
            "a message that will never arrive is not revoked"
        );
        let bodies = sms_to(&app, TO);
        assert_eq!(bodies.len(), 1, "{bodies:?}");
        assert!(bodies[0].contains(&code), "the same code: {}", bodies[0]);
        assert_eq!(app.mock.deliveries_to(TO, &bodies[0]), 1);
    }
}

async fn forged_and_stale_reports_are_refused(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = started(&app, "tg-5", json!({"to": TO, "channels": ["telegram"]})).await;
    messages_when(&app, &id, "sent", |m| m == [pair("telegram", "sent")]).await;
    let request_id = app.mock.gateway_messages()[0].request_id.clone();
    app.mock.gateway_set_status(&request_id, "delivered");
    let now = clock.now().unix_timestamp();
    let forged = report(&app, &request_id, now, "not-the-token").await;
    assert_eq!(forged.status, 403);
    let stale = report(&app, &request_id, now - 301, TOKEN).await;
    assert_eq!(stale.status, 403);
    let early = report(&app, &request_id, now + 301, TOKEN).await;
    assert_eq!(early.status, 403);
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
    assert_eq!(
        verification(&app, &id).await["messages"][0]["status"],
        "sent"
    );
    let ok = report(&app, &request_id, now - 299, TOKEN).await;
    assert_eq!(ok.status, 200);
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 1);
}

async fn resends_follow_the_channel_order(backend: Backend) {
    let mut settings = test_settings();
    settings.verify.resend_cooldown = Duration::ZERO;
    let app = spawn_gateway_with(backend, Clock::system(), settings).await;
    let id = started(
        &app,
        "tg-6",
        json!({"to": TO, "channels": ["telegram", "sms"]}),
    )
    .await;
    messages_when(&app, &id, "sent", |m| m == [pair("telegram", "sent")]).await;
    let r = post_to(
        &app,
        &format!("/verifications/{id}/resend"),
        Some("r1"),
        json!({}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.bytes));
    messages_when(&app, &id, "the resend through Telegram", |m| {
        m == [pair("telegram", "sent"), pair("telegram", "sent")]
    })
    .await;
    let sent = app.mock.gateway_messages();
    assert_eq!(sent.len(), 2);
    assert_ne!(sent[0].request_id, sent[1].request_id, "a check per send");
    assert_eq!(sent[0].code, sent[1].code, "the same code");
    assert!(sms_to(&app, TO).is_empty());
}

async fn bad_channel_requests_are_400_and_store_nothing(backend: Backend) {
    let app = spawn_gateway(backend, Clock::system()).await;
    let rows = [
        (
            json!({"to": TO, "channels": ["telegram"], "code_length": 9}),
            "code_length",
        ),
        (
            json!({"to": TO, "channels": ["sms", "telegram", "sms"]}),
            "channels",
        ),
        (json!({"to": TO, "channels": ["email"]}), "channels"),
        (json!({"to": TO, "channels": []}), "channels"),
        // One number per step after the first, together within the life.
        (
            json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": [30, 30]}),
            "fallback_after_seconds",
        ),
        (
            json!({"to": TO, "channels": ["telegram", "sms"], "ttl_seconds": 60, "fallback_after_seconds": [60]}),
            "fallback_after_seconds",
        ),
        (
            json!({"to": TO, "fallback_after_seconds": 30}),
            "fallback_after_seconds",
        ),
        (
            json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 4}),
            "fallback_after_seconds",
        ),
        (
            json!({"to": TO, "channels": ["telegram", "sms"], "ttl_seconds": 60, "fallback_after_seconds": 60}),
            "fallback_after_seconds",
        ),
    ];
    for (i, (body, field)) in rows.into_iter().enumerate() {
        let a = start(&app, &format!("bad-{i}"), body.clone()).await;
        assert_eq!(a.status, 400, "{body}");
        assert_eq!(a.json()["errors"][0]["field"], field, "{body}");
    }
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 0);
    // Without a Gateway, telegram is refused naming the field.
    let plain = spawn_with(TestOptions {
        backend,
        ..TestOptions::default()
    })
    .await;
    let a = start(
        &plain,
        "no-gw",
        json!({"to": TO, "channels": ["telegram", "sms"]}),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["errors"][0]["field"], "channels");
    assert_eq!(
        plain.db.count("SELECT count(*) FROM verifications").await,
        0
    );
}

async fn a_refused_send_falls_back_and_a_cancel_revokes(backend: Backend) {
    let app = spawn_gateway_at(
        backend,
        Clock::system(),
        test_settings(),
        Some("https://sendonce.example.com/"),
    )
    .await;
    // The send itself refused (after a good check): nothing was sent, the
    // SMS goes at once.
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: json!({"ok": false, "error": "PHONE_NUMBER_FLOOD"}),
        retry_after: None,
    }]);
    let id = started(
        &app,
        "tg-7",
        json!({"to": TO, "channels": ["telegram", "sms"]}),
    )
    .await;
    let got = messages_when(&app, &id, "the SMS after a refused send", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    assert_eq!(got, [pair("telegram", "failed"), pair("sms", "sent")]);
    assert!(app.mock.gateway_messages().is_empty());
    assert_eq!(sms_to(&app, TO).len(), 1);
    // A https public URL: the reports URL is passed as callback_url.
    let other = "+14155550124";
    let id = started(
        &app,
        "tg-8",
        json!({"to": other, "channels": ["telegram", "sms"]}),
    )
    .await;
    messages_when(&app, &id, "sent", |m| m == [pair("telegram", "sent")]).await;
    let sent = app.mock.gateway_messages();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].callback_url.as_deref(),
        Some("https://sendonce.example.com/channels/telegram/gateway/reports")
    );
    // Canceled: its Telegram message is revoked, no SMS follows.
    let c = post_to(
        &app,
        &format!("/verifications/{id}/cancel"),
        None,
        json!({}),
    )
    .await;
    assert_eq!(c.status, 200, "{}", String::from_utf8_lossy(&c.bytes));
    let request_id = sent[0].request_id.clone();
    eventually("the canceled verification's message revoked", || async {
        app.mock
            .gateway_revoked()
            .contains(&request_id)
            .then_some(())
    })
    .await;
    assert_eq!(app.mock.gateway_messages()[0].status, "revoked");
    assert!(sms_to(&app, other).is_empty());
}

async fn a_telegram_send_still_checking_is_canceled_with_the_fallback(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    // checkSendAbility answers 5xx: nothing sent, the check is retried.
    let down = || Behaviour::Fail {
        status: 502,
        body: json!({"ok": false, "error": "INTERNAL_ERROR"}),
        retry_after: None,
    };
    app.mock.push_gateway_check((0..3).map(|_| down()));
    let id = started(
        &app,
        "tg-9",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 10}),
    )
    .await;
    let waiting = "SELECT count(*) FROM messages WHERE provider = 'telegram_gateway' \
         AND status = 'processing' AND prepared_token IS NULL \
         AND lease_token IS NULL AND next_attempt_at IS NOT NULL";
    eventually("the check's retry waiting", || async {
        (app.db.count(waiting).await == 1).then_some(())
    })
    .await;
    // Due with the check still being retried: the Telegram message, never
    // sent, is canceled with the SMS's insert, and never goes after it.
    clock.advance(Duration::from_secs(11));
    let got = messages_when(&app, &id, "the SMS, the Telegram message canceled", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    assert_eq!(got, [pair("telegram", "canceled"), pair("sms", "sent")]);
    let bodies = sms_to(&app, TO);
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    // The Gateway is back and any retry long due: none is made.
    clock.advance(Duration::from_secs(300));
    let key = verification(&app, &id).await["messages"][0]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_string();
    let m = app.get(&format!("/messages/{key}")).await.json();
    assert_eq!(m["status"], "canceled", "{m}");
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM messages WHERE status = 'processing'")
            .await,
        0,
        "nothing left to send"
    );
    assert!(
        app.mock.gateway_messages().is_empty(),
        "no Telegram message"
    );
    assert!(app.mock.gateway_checks().len() <= 3);
    let code: String = bodies[0].chars().filter(char::is_ascii_digit).collect();
    assert_eq!(check(&app, &id, &code).await.json()["status"], "approved");
    assert_eq!(sms_to(&app, TO).len(), 1);
}

on_both_backends!(
    a_fallback_sms_is_charged_even_past_the_cap,
    a_refused_send_falls_back_and_a_cancel_revokes,
    a_number_on_telegram_gets_one_gateway_message_and_no_sms,
    a_number_not_on_telegram_gets_the_sms_at_once,
    no_report_in_time_revokes_then_sends_one_sms_with_the_same_code,
    forged_and_stale_reports_are_refused,
    resends_follow_the_channel_order,
    bad_channel_requests_are_400_and_store_nothing,
    a_telegram_send_still_checking_is_canceled_with_the_fallback,
    a_report_of_expiry_or_revoke_sends_the_sms_at_once,
);
