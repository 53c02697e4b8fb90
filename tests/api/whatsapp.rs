//! WhatsApp authentication codes (issue 40), against the mock's Cloud API,
//! which speaks Meta's documented wire format and never de-duplicates:
//! every accepted send is a message, counted per (number, code).
//!
//! Verifications with `channels: ["whatsapp", "sms"]` run through an
//! instance on both backends: an ambiguous send ends `unknown`, is never
//! made again, and the SMS goes after the step's delay; a throughput limit
//! is retried and sent once; a certain refusal fails and the SMS goes at
//! once; statuses (delivered, read, failed; duplicated, out of order) land
//! right; a forged status changes nothing. The same send situations are
//! also run through the adapter alone, each answer fed to delivery's
//! decision table (`delivery::decide`), and the webhook's handshake and
//! its forged and duplicated notifications through the HTTP routes.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use sendonce::clock::Clock;
use sendonce::delivery::RetryPolicy;
use sendonce::delivery::decide::{Event, KeyRule, Snapshot, Step, Transition, Write, decide};
use sendonce::domain::{MessageId, Recipient, Status};
use sendonce::provider::whatsapp::inbound::WhatsAppInbound;
use sendonce::provider::whatsapp::{WhatsAppProvider, WhatsAppSettings};
use sendonce::provider::{AttemptRef, OutgoingSms, Provider, Reconciled, SendOutcome};
use serde_json::{Value, json};
use testkit::mock_provider::{Behaviour, MockProvider};
use testkit::providers::whatsapp::{
    Outcome, Webhook, WhatsAppMessage, error_body, notification, signature, status,
};

use crate::helpers::*;
use crate::telegram_gateway::{manual_clock, messages_when, pair, sms_to, started, verification};

pub(crate) const TOKEN: &str = "EAAJB-whatsapp-test-token";
pub(crate) const APP_SECRET: &str = "whatsapp-app-secret";
pub(crate) const VERIFY_TOKEN: &str = "whatsapp-verify-token";
pub(crate) const PHONE_NUMBER_ID: &str = "106540352242922";
pub(crate) const TEMPLATE: &str = "verification_code";
pub(crate) const TO: &str = "+14155550123";
pub(crate) const WEBHOOK: &str = "/channels/whatsapp/webhook";
/// The tenant the instance's key belongs to, which owns what users write.
pub(crate) const INBOUND_OWNER: &str = "whatsapp-owner";

/// The adapter aimed at the mock at `mock_base` (`http://host:port`).
pub(crate) fn whatsapp_at(mock_base: &str, timeout: Duration) -> Arc<dyn Provider> {
    Arc::new(
        WhatsAppProvider::new(WhatsAppSettings {
            base_url: format!("{mock_base}/v21.0"),
            access_token: TOKEN.into(),
            phone_number_id: PHONE_NUMBER_ID.into(),
            template_name: TEMPLATE.into(),
            template_language: "en_US".into(),
            app_secret_set: true,
            verify_token_set: true,
            timeout,
            connect_timeout: Duration::from_secs(1),
        })
        .expect("whatsapp provider"),
    )
}

/// A mock that checks the token, the number id and the template.
pub(crate) async fn checking_mock() -> (MockProvider, String, String) {
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_whatsapp_token(TOKEN);
    mock.set_whatsapp_phone_number_id(PHONE_NUMBER_ID);
    mock.set_whatsapp_template(TEMPLATE, "en_US");
    let base = url.trim_end_matches("/messages").to_string();
    (mock, url, base)
}

/// An instance with the `http` SMS provider and WhatsApp on one mock, and
/// the WhatsApp webhook keyed with the app secret and the verify token.
pub(crate) async fn spawn_whatsapp(backend: Backend) -> TestApp {
    spawn_whatsapp_with(backend, Clock::system()).await
}

pub(crate) async fn spawn_whatsapp_with(backend: Backend, clock: Clock) -> TestApp {
    let (mock, url, base) = checking_mock().await;
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
        ("WHATSAPP_APP_SECRET", APP_SECRET),
        ("WHATSAPP_VERIFY_TOKEN", VERIFY_TOKEN),
    ])
    .expect("receipt settings");
    // What users write comes to the same webhook; the instance's tenant
    // owns its events.
    let database = fresh_database_on(backend).await;
    let (store, _) = open_store(&database, Duration::from_secs(2));
    let key = sendonce::apikey::generate();
    store
        .create_tenant(INBOUND_OWNER, &key.stored)
        .await
        .expect("tenant");
    settings.provider.inbound = vec![Arc::new(WhatsAppInbound::new(
        PHONE_NUMBER_ID,
        INBOUND_OWNER,
        APP_SECRET,
    ))];
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        database: Some(database),
        api_key: Some(key.secret),
        mock: Some((mock, url)),
        fallbacks: vec![whatsapp_at(&base, Duration::from_secs(2))],
        ..TestOptions::default()
    })
    .await
}

/// One code to `TO`, as delivery hands it to the adapter.
fn code_message(code: &str) -> OutgoingSms {
    OutgoingSms {
        message_id: MessageId::new(),
        to: Recipient::parse(TO, &[]).expect("number").recipient,
        from: None,
        body: code.to_string(),
        validity: Some(Duration::from_secs(600)),
        attempt: 1,
        prepared: None,
    }
}

fn snapshot(attempt: u32, maybe_sent: bool) -> Snapshot {
    let now = time::OffsetDateTime::now_utc();
    Snapshot {
        attempt,
        attempt_started_at: now,
        maybe_sent,
        expires_at: Some(now + time::Duration::minutes(10)),
        deadline_at: now + time::Duration::minutes(15),
    }
}

/// What delivery does with `outcome` of `provider`, and with its
/// reconciliation if it asks for one.
async fn delivery_decides(
    provider: &dyn Provider,
    sms: &OutgoingSms,
    snap: &Snapshot,
    outcome: &SendOutcome,
) -> Transition {
    let now = time::OffsetDateTime::now_utc();
    let policy = RetryPolicy::default();
    let keys = KeyRule::of(Some(provider));
    let t = decide(snap, &Event::Answered(outcome), now, &policy, keys);
    let Transition::Step(Step::Reconcile { since }) = t else {
        return t;
    };
    let answer = provider
        .reconcile(
            sms,
            &AttemptRef {
                started_at: since,
                age: Duration::from_secs(1),
                sender: None,
            },
        )
        .await;
    decide(
        snap,
        &Event::Reconciled {
            after: outcome,
            answer: &answer,
        },
        now,
        &policy,
        keys,
    )
}

fn final_status(t: &Transition) -> Option<Status> {
    match t {
        Transition::Write(Write::Final { status, .. }) => Some(*status),
        _ => None,
    }
}

#[tokio::test]
async fn an_ambiguous_send_is_never_resent_and_ends_unknown() {
    sendonce::install_crypto_provider();
    let (mock, _, base) = checking_mock().await;
    let provider = whatsapp_at(&base, Duration::from_millis(800));
    assert!(
        !provider.dedupes_by_key(),
        "Meta documents no idempotency key"
    );
    // Each: the mock made the message, then the answer was lost.
    let cases = [
        ("accept then drop the connection", Behaviour::AcceptThenDrop),
        ("accept then never answer", Behaviour::AcceptThenHang),
        ("accept then 503", Behaviour::AcceptThenFail { status: 503 }),
        (
            "accept then a slow answer",
            Behaviour::AcceptThenDelay(Duration::from_secs(3)),
        ),
    ];
    for (i, (what, behaviour)) in cases.into_iter().enumerate() {
        let code = format!("48291{i}");
        mock.push([behaviour]);
        let sms = code_message(&code);
        let outcome = provider.send(&sms).await;
        assert_eq!(outcome.class(), "ambiguous", "{what}: {outcome:?}");
        assert_eq!(mock.deliveries_to(TO, &code), 1, "{what}");
        let t = delivery_decides(provider.as_ref(), &sms, &snapshot(1, false), &outcome).await;
        assert_eq!(final_status(&t), Some(Status::Unknown), "{what}: {t:?}");
        // Never resent: the decision made no further attempt, and nothing
        // else reached the mock for this code.
        assert_eq!(mock.deliveries_to(TO, &code), 1, "{what}");
    }
    assert_eq!(mock.whatsapp_messages().len(), 4);
    let calls = mock.calls();
    assert_eq!(calls.len(), 4, "one request per send, never a second");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
}

#[tokio::test]
async fn a_throughput_or_pair_rate_limit_is_retried_then_sent_once() {
    sendonce::install_crypto_provider();
    let (mock, _, base) = checking_mock().await;
    let provider = whatsapp_at(&base, Duration::from_secs(2));
    for (code, limit) in [("111222", 130429), ("333444", 131056)] {
        mock.push([Behaviour::Fail {
            status: 400,
            body: error_body(limit),
            retry_after: None,
        }]);
        let sms = code_message(code);
        let first = provider.send(&sms).await;
        assert_eq!(first.class(), "retryable", "{limit}: {first:?}");
        assert!(
            matches!(&first, SendOutcome::Retryable { provider_code: Some(c), .. } if *c == limit.to_string()),
            "{first:?}"
        );
        let t = delivery_decides(provider.as_ref(), &sms, &snapshot(1, false), &first).await;
        assert!(
            matches!(t, Transition::Write(Write::Retry { .. })),
            "{limit}: retried with backoff: {t:?}"
        );
        assert_eq!(mock.deliveries_to(TO, code), 0, "nothing sent yet");
        let again = OutgoingSms {
            attempt: 2,
            ..sms.clone()
        };
        let second = provider.send(&again).await;
        assert_eq!(second.class(), "ok", "{second:?}");
        let t = delivery_decides(provider.as_ref(), &again, &snapshot(2, false), &second).await;
        assert_eq!(final_status(&t), Some(Status::Sent), "{t:?}");
        assert_eq!(mock.deliveries_to(TO, code), 1, "{limit}: sent once");
    }
}

#[tokio::test]
async fn a_certain_refusal_ends_failed_and_sends_nothing() {
    sendonce::install_crypto_provider();
    let (mock, _, base) = checking_mock().await;
    let provider = whatsapp_at(&base, Duration::from_secs(2));
    // (what the mock answers, the class): each certainly sent nothing.
    let rows = [
        (400, error_body(131026), "permanent"),
        (400, error_body(131009), "permanent"),
        (401, error_body(190), "refused"),
        (404, error_body(132001), "refused"),
    ];
    for (i, (status, body, class)) in rows.into_iter().enumerate() {
        let code = format!("90000{i}");
        mock.push([Behaviour::Fail {
            status,
            body,
            retry_after: None,
        }]);
        let sms = code_message(&code);
        let outcome = provider.send(&sms).await;
        assert_eq!(outcome.class(), class, "{outcome:?}");
        let t = delivery_decides(provider.as_ref(), &sms, &snapshot(1, false), &outcome).await;
        assert_eq!(final_status(&t), Some(Status::Failed), "{t:?}");
        assert_eq!(mock.deliveries_to(TO, &code), 0);
    }
    // A code the template cannot carry never leaves.
    let outcome = provider.send(&code_message("1234567890123456")).await;
    assert_eq!(outcome.class(), "permanent");
    // The mock's own refusals of a token or a template it does not know.
    let other = Arc::new(
        WhatsAppProvider::new(WhatsAppSettings {
            base_url: format!("{base}/v21.0"),
            access_token: "another-token".into(),
            phone_number_id: PHONE_NUMBER_ID.into(),
            template_name: "another_template".into(),
            template_language: "en_US".into(),
            app_secret_set: true,
            verify_token_set: true,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        })
        .expect("provider"),
    );
    assert_eq!(other.send(&code_message("555666")).await.class(), "refused");
    assert!(mock.whatsapp_messages().is_empty());
}

#[tokio::test]
async fn a_send_carries_the_documented_template_message() {
    sendonce::install_crypto_provider();
    let (mock, _, base) = checking_mock().await;
    let provider = whatsapp_at(&base, Duration::from_secs(2));
    let sms = code_message("482913");
    let outcome = provider.send(&sms).await;
    let sent = mock.whatsapp_messages();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        outcome,
        SendOutcome::Accepted {
            provider_message_id: sent[0].id.clone(),
            http_status: Some(200)
        }
    );
    assert_eq!(sent[0].code, "482913");
    assert_eq!(sent[0].template, TEMPLATE);
    assert_eq!(sent[0].language, "en_US");
    assert_eq!(
        sent[0].biz_opaque_callback_data.as_deref(),
        Some(sms.message_id.to_string().as_str()),
        "our message id rides in biz_opaque_callback_data"
    );
    // Reconcile cannot ask Meta anything: never "not sent".
    let asked = provider
        .reconcile(
            &sms,
            &AttemptRef {
                started_at: time::OffsetDateTime::now_utc(),
                age: Duration::ZERO,
                sender: None,
            },
        )
        .await;
    assert!(matches!(asked, Reconciled::Unknown(_)), "{asked:?}");
    assert!(!provider.revoke("anything").await);
    assert!(provider.delivery_status(&sent[0].id).await.is_none());
}

/// Posts `body` to the webhook with `signature_header`, if any.
pub(crate) async fn post_webhook(
    app: &TestApp,
    body: &str,
    signature_header: Option<&str>,
) -> Answer {
    let mut req = app
        .request(Method::POST, WEBHOOK)
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(sig) = signature_header {
        req = req.header("X-Hub-Signature-256", sig);
    }
    answer(req.send().await.expect("POST webhook")).await
}

/// Posts `m`'s status `word`, signed with `secret`.
pub(crate) async fn post_status(
    app: &TestApp,
    m: &WhatsAppMessage,
    word: &str,
    at: i64,
    secret: &str,
) -> Answer {
    let body = notification(vec![status(m, word, at)]).to_string();
    post_webhook(app, &body, Some(&signature(secret, body.as_bytes()))).await
}

fn a_message(id: &str, ours: Option<String>) -> WhatsAppMessage {
    WhatsAppMessage {
        id: id.into(),
        to: TO.into(),
        code: "482913".into(),
        template: TEMPLATE.into(),
        language: "en_US".into(),
        biz_opaque_callback_data: ours,
    }
}

async fn the_handshake_echoes_the_challenge_for_the_verify_token(backend: Backend) {
    let app = spawn_whatsapp(backend).await;
    let shake = |token: &str, mode: &str| {
        format!("{WEBHOOK}?hub.mode={mode}&hub.challenge=1158201444&hub.verify_token={token}")
    };
    let ok = app.get(&shake(VERIFY_TOKEN, "subscribe")).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.bytes, b"1158201444");
    assert_eq!(
        ok.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("text/plain; charset=utf-8")
    );
    for path in [
        shake("not-the-token", "subscribe"),
        shake(VERIFY_TOKEN, "unsubscribe"),
        WEBHOOK.to_string(),
    ] {
        let refused = app.get(&path).await;
        assert_eq!(refused.status, 403, "{path}");
        assert_eq!(
            refused
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{path}"
        );
        assert!(!String::from_utf8_lossy(&refused.bytes).contains("1158201444"));
    }
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
}

async fn forged_notifications_are_refused_and_record_nothing(backend: Backend) {
    let app = spawn_whatsapp(backend).await;
    let m = a_message("wamid.HBgLFORGED", None);
    let body = notification(vec![status(&m, "delivered", 1_700_000_000)]).to_string();
    let good = signature(APP_SECRET, body.as_bytes());
    let forged_body = body.replace("delivered", "failed");
    let rows: Vec<(&str, Option<String>, &str)> = vec![
        ("no signature", None, &body),
        (
            "another secret",
            Some(signature("not-the-secret", body.as_bytes())),
            &body,
        ),
        (
            "the body changed after signing",
            Some(good.clone()),
            &forged_body,
        ),
        ("not sha256=", Some(good.replace("sha256=", "")), &body),
        ("garbage", Some("sha256=zz".into()), &body),
    ];
    for (what, sig, posted) in rows {
        let a = post_webhook(&app, posted, sig.as_deref()).await;
        assert_eq!(
            a.status,
            403,
            "{what}: {}",
            String::from_utf8_lossy(&a.bytes)
        );
    }
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
    // The same notification, signed: recorded (for no message: unmatched).
    let a = post_webhook(&app, &body, Some(&good)).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.json()["message_id"], Value::Null);
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 1);
}

async fn duplicated_statuses_are_recorded_once(backend: Backend) {
    let app = spawn_whatsapp(backend).await;
    let m = a_message("wamid.HBgLDUPLICATE", None);
    // Out of order and twice each, as Meta may deliver them.
    for word in ["read", "delivered", "sent", "read", "sent"] {
        let a = post_status(&app, &m, word, 1_700_000_000, APP_SECRET).await;
        assert_eq!(a.status, 200, "{word}");
    }
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 3);
    let again = post_status(&app, &m, "delivered", 1_700_000_000, APP_SECRET).await;
    assert_eq!(again.json()["duplicate"], true);
    // Several statuses in one notification: one acknowledgement each.
    let body = notification(vec![
        status(&a_message("wamid.B1", None), "sent", 1),
        status(&a_message("wamid.B2", None), "failed", 2),
    ])
    .to_string();
    let a = post_webhook(&app, &body, Some(&signature(APP_SECRET, body.as_bytes()))).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["receipts"].as_array().map(Vec::len), Some(2));
    // A notification without statuses (an incoming message) records no
    // receipt (its message is taken by the inbound route: below).
    let inbound = user_wrote("wamid.IN", "14155550123", "hello").to_string();
    let a = post_webhook(
        &app,
        &inbound,
        Some(&signature(APP_SECRET, inbound.as_bytes())),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["receipts"], json!([]));
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 5);
}

// ---- Verification level: `channels: ["whatsapp", "sms"]` through a running
// instance, on both backends, creations counted at the mock. ----

/// The mock's WhatsApp messages to `TO`.
fn whatsapp_codes(app: &TestApp) -> Vec<WhatsAppMessage> {
    app.mock
        .whatsapp_messages()
        .into_iter()
        .filter(|m| m.to == TO)
        .collect()
}

/// Starts `["whatsapp", "sms"]`, the SMS after `after` seconds.
async fn start_whatsapp_then_sms(app: &TestApp, key: &str, after: u32) -> String {
    started(
        app,
        key,
        json!({"to": TO, "channels": ["whatsapp", "sms"], "fallback_after_seconds": after}),
    )
    .await
}

async fn an_ambiguous_whatsapp_send_ends_unknown_and_is_never_resent(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let id = start_whatsapp_then_sms(&app, "wa-1", 10).await;
    messages_when(&app, &id, "the WhatsApp send ended unknown", |m| {
        m.first() == Some(&pair("whatsapp", "unknown"))
    })
    .await;
    let sent = whatsapp_codes(&app);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(app.mock.deliveries_to(TO, &sent[0].code), 1);
    assert!(
        sms_to(&app, TO).is_empty(),
        "no SMS before the step's delay"
    );
    // Past the delay, as for silence: one SMS, and WhatsApp never again.
    clock.advance(Duration::from_secs(11));
    let got = messages_when(&app, &id, "the SMS sent", |m| {
        m == [pair("whatsapp", "unknown"), pair("sms", "sent")]
    })
    .await;
    assert_eq!(got.len(), 2);
    clock.advance(Duration::from_secs(300));
    assert_eq!(sms_to(&app, TO).len(), 1);
    assert_eq!(whatsapp_codes(&app).len(), 1, "never resent");
    assert_eq!(app.mock.deliveries_to(TO, &sent[0].code), 1);
}

async fn a_throughput_limit_is_retried_then_sent_once(backend: Backend) {
    let app = spawn_whatsapp_with(backend, Clock::system()).await;
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: error_body(130429),
        retry_after: None,
    }]);
    let id = start_whatsapp_then_sms(&app, "wa-2", 30).await;
    messages_when(&app, &id, "the WhatsApp message sent", |m| {
        m == [pair("whatsapp", "sent")]
    })
    .await;
    let sent = whatsapp_codes(&app);
    assert_eq!(sent.len(), 1);
    assert_eq!(app.mock.deliveries_to(TO, &sent[0].code), 1);
    let calls = app
        .mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "whatsapp")
        .count();
    assert_eq!(calls, 2, "the refused call, then the one that sent");
    assert!(sms_to(&app, TO).is_empty());
}

async fn a_certain_refusal_fails_and_the_sms_goes_at_once(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: error_body(131026),
        retry_after: None,
    }]);
    let id = start_whatsapp_then_sms(&app, "wa-3", 60).await;
    messages_when(&app, &id, "WhatsApp failed, the SMS sent", |m| {
        m == [pair("whatsapp", "failed"), pair("sms", "sent")]
    })
    .await;
    assert!(whatsapp_codes(&app).is_empty());
    assert_eq!(sms_to(&app, TO).len(), 1);
}

/// Has the mock post its statuses to the instance.
fn statuses_to(app: &TestApp, outcome: Outcome, reversed: bool, duplicated: bool) {
    app.mock.whatsapp_webhook(Webhook {
        url: format!("{}{WEBHOOK}", app.base),
        app_secret: APP_SECRET.into(),
        outcome,
        reversed,
        duplicated,
    });
}

async fn statuses_land_right_whatever_their_order(backend: Backend) {
    // (the statuses Meta posts, reversed, duplicated, what the message ends)
    let rows = [
        (Outcome::Delivered, false, true, "delivered"),
        (Outcome::Read, true, true, "delivered"),
        (Outcome::Delivered, true, false, "delivered"),
        (Outcome::Failed, false, true, "undelivered"),
    ];
    for (i, (outcome, reversed, duplicated, want)) in rows.into_iter().enumerate() {
        let clock = manual_clock();
        let app = spawn_whatsapp_with(backend, clock.clone()).await;
        statuses_to(&app, outcome, reversed, duplicated);
        let id = start_whatsapp_then_sms(&app, &format!("wa-4-{i}"), 30).await;
        let posted = if duplicated { 2 } else { 1 }
            * match outcome {
                Outcome::Read => 3,
                _ => 2,
            };
        eventually("every status posted and answered", || async {
            let p = app.mock.whatsapp_posted();
            (p.len() == posted && p.iter().all(|(_, _, code)| *code == 200)).then_some(())
        })
        .await;
        let got = messages_when(&app, &id, want, |m| {
            m.first().is_some_and(|(c, s)| c == "whatsapp" && s == want)
        })
        .await;
        if want == "delivered" {
            // Delivered: nothing more is sent, whatever the time.
            clock.advance(Duration::from_secs(120));
            eventually("the fallback settled", || async {
                let n = app
                    .db
                    .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
                    .await;
                (n == 1).then_some(())
            })
            .await;
            assert!(sms_to(&app, TO).is_empty(), "{outcome:?}: {got:?}");
        } else {
            // Failed: the SMS at once.
            messages_when(&app, &id, "the SMS after the failure", |m| {
                m == [pair("whatsapp", "undelivered"), pair("sms", "sent")]
            })
            .await;
            assert_eq!(sms_to(&app, TO).len(), 1);
        }
        assert_eq!(whatsapp_codes(&app).len(), 1);
        // A `sent` after `delivered` never moved it back; each status once.
        let distinct = match outcome {
            Outcome::Read => 3,
            _ => 2,
        };
        assert_eq!(
            app.db.count("SELECT count(*) FROM receipts").await,
            distinct,
            "{outcome:?}"
        );
    }
}

async fn a_forged_status_changes_nothing(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    let id = start_whatsapp_then_sms(&app, "wa-5", 30).await;
    messages_when(&app, &id, "sent", |m| m == [pair("whatsapp", "sent")]).await;
    let m = whatsapp_codes(&app).remove(0);
    let forged = post_status(&app, &m, "delivered", 1, "not-the-app-secret").await;
    assert_eq!(forged.status, 403);
    let body = notification(vec![status(&m, "failed", 1)]).to_string();
    let unsigned = post_webhook(&app, &body, None).await;
    assert_eq!(unsigned.status, 403);
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
    assert_eq!(
        verification(&app, &id).await["messages"][0]["status"],
        "sent"
    );
    assert!(
        sms_to(&app, TO).is_empty(),
        "a forged failure sends nothing"
    );
    let real = post_status(&app, &m, "delivered", 1, APP_SECRET).await;
    assert_eq!(real.status, 200);
    messages_when(&app, &id, "delivered", |m| {
        m == [pair("whatsapp", "delivered")]
    })
    .await;
}

async fn a_status_of_an_ambiguous_send_finds_its_message_by_our_id(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let id = start_whatsapp_then_sms(&app, "wa-6", 30).await;
    messages_when(&app, &id, "unknown", |m| m == [pair("whatsapp", "unknown")]).await;
    let m = whatsapp_codes(&app).remove(0);
    let a = post_status(&app, &m, "delivered", 1, APP_SECRET).await;
    assert_eq!(a.status, 200);
    let key = verification(&app, &id).await["messages"][0]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_string();
    let message = app.get(&format!("/messages/{key}")).await.json();
    assert_eq!(
        a.json()["message_id"],
        message["id"],
        "matched by biz_opaque_callback_data"
    );
    assert_eq!(
        message["status"], "unknown",
        "kept in the history; the status stays"
    );
    // The report of delivery stops the rest, though the status stays
    // `unknown` (issue 40: a delivered report stops the next channel).
    clock.advance(Duration::from_secs(31));
    eventually("the step's row settled delivered", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
            .await;
        (n == 1).then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(300));
    assert!(
        sms_to(&app, TO).is_empty(),
        "no SMS after a delivery report"
    );
    assert_eq!(whatsapp_codes(&app).len(), 1);
}

/// A status that comes while the send is still waiting for its answer
/// (which is then lost: no provider id is ever recorded) stays unlinked,
/// but still stops the next channel (found by the three-channel chaos run,
/// issue 40).
async fn a_status_during_an_ambiguous_send_still_stops_the_next_channel(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    app.mock.push([Behaviour::AcceptThenHang]);
    let id = start_whatsapp_then_sms(&app, "wa-9", 30).await;
    let m = eventually("the message made at Meta", || async {
        whatsapp_codes(&app).into_iter().next()
    })
    .await;
    let a = post_status(&app, &m, "delivered", 1, APP_SECRET).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    messages_when(&app, &id, "the send ended unknown", |m| {
        m == [pair("whatsapp", "unknown")]
    })
    .await;
    clock.advance(Duration::from_secs(31));
    eventually("the step's row settled delivered", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
            .await;
        (n == 1).then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(300));
    assert!(
        sms_to(&app, TO).is_empty(),
        "no SMS after a delivery report"
    );
    // ... and the report is shown, though its message never got Meta's id.
    let v = verification(&app, &id).await;
    assert_eq!(v["messages"][0]["delivery_report"], "delivered", "{v}");
}

async fn whatsapp_without_its_token_is_refused_and_stores_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let a = crate::telegram_gateway::start(
        &app,
        "wa-7",
        json!({"to": TO, "channels": ["whatsapp", "sms"]}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.bytes));
    let text = String::from_utf8_lossy(&a.bytes).to_string();
    assert!(
        text.contains("channels") && text.contains("WHATSAPP_ACCESS_TOKEN"),
        "{text}"
    );
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 0);
    assert!(app.mock.whatsapp_messages().is_empty());
}

/// `["whatsapp", "telegram", "sms"]`: WhatsApp refuses the number for
/// certain, so Telegram goes at once; Telegram stays silent, so the SMS
/// goes after its delay. One code, never on WhatsApp, once on each of the
/// others, counted at the mocks.
async fn three_channels_move_on_from_a_whatsapp_refusal(backend: Backend) {
    let clock = manual_clock();
    let (mock, url, base) = checking_mock().await;
    mock.set_gateway_token(crate::telegram_gateway::TOKEN);
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
        ("WHATSAPP_APP_SECRET", APP_SECRET),
        ("TELEGRAM_GATEWAY_TOKEN", crate::telegram_gateway::TOKEN),
    ])
    .expect("receipt settings");
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings,
        mock: Some((mock, url)),
        fallbacks: vec![
            whatsapp_at(&base, Duration::from_secs(2)),
            crate::telegram_gateway::gateway_calling_back(&base, None),
        ],
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: error_body(131026),
        retry_after: None,
    }]);
    let id = started(
        &app,
        "wa-8",
        json!({"to": TO, "channels": ["whatsapp", "telegram", "sms"], "fallback_after_seconds": 10}),
    )
    .await;
    messages_when(&app, &id, "WhatsApp failed, Telegram sent at once", |m| {
        m == [pair("whatsapp", "failed"), pair("telegram", "sent")]
    })
    .await;
    assert!(sms_to(&app, TO).is_empty(), "the SMS waits for its step");
    clock.advance(Duration::from_secs(11));
    let got = messages_when(&app, &id, "the SMS after Telegram's silence", |m| {
        m.len() == 3 && m[2] == pair("sms", "sent")
    })
    .await;
    assert_eq!(got[0], pair("whatsapp", "failed"));
    assert!(whatsapp_codes(&app).is_empty(), "nothing made on WhatsApp");
    let telegram = app.mock.gateway_messages();
    assert_eq!(telegram.len(), 1);
    let code = telegram[0].code.clone().expect("the code");
    let bodies = sms_to(&app, TO);
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(bodies[0].contains(&code), "the same code: {bodies:?}");
    clock.advance(Duration::from_secs(300));
    assert_eq!(sms_to(&app, TO).len(), 1);
    assert_eq!(app.mock.gateway_messages().len(), 1);
}

/// A notification of what a WhatsApp user wrote to our number.
fn user_wrote(id: &str, from: &str, text: &str) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398",
        "changes": [{"field": "messages", "value": {"messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_NUMBER_ID},
        "contacts": [{"profile": {"name": "Ann"}, "wa_id": from}],
        "messages": [{"from": from, "id": id, "timestamp": "1749416383",
        "type": "text", "text": {"body": text}}]}}]}]})
}

async fn post_signed(app: &TestApp, body: &Value) -> Answer {
    let body = body.to_string();
    post_webhook(app, &body, Some(&signature(APP_SECRET, body.as_bytes()))).await
}

/// A WhatsApp user's STOP stops WhatsApp, and only WhatsApp, for that
/// number: the next verification's WhatsApp step fails at once without a
/// call (nothing made at the mock) and its SMS goes; a plain SMS still
/// goes. START lifts it: the next code goes by WhatsApp again. Taken once
/// under its `wamid` however often Meta delivers it, with one
/// `message.received` event.
async fn a_whatsapp_stop_opts_the_number_out_of_whatsapp_only(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_whatsapp_with(backend, clock.clone()).await;
    let stop = user_wrote("wamid.STOP1", &TO[1..], "STOP");
    for _ in 0..2 {
        let a = post_signed(&app, &stop).await;
        assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    }
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM opt_outs WHERE number = 'whatsapp:+14155550123'")
            .await,
        1
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM webhook_events WHERE type = 'message.received'")
            .await,
        1,
        "one event for a notification delivered twice"
    );
    // A forged STOP (another secret) changes nothing.
    let forged = user_wrote("wamid.STOP2", "447911123456", "STOP").to_string();
    let a = post_webhook(
        &app,
        &forged,
        Some(&signature("not-the-secret", forged.as_bytes())),
    )
    .await;
    assert_eq!(a.status, 403);
    assert_eq!(app.db.count("SELECT count(*) FROM opt_outs").await, 1);

    let id = start_whatsapp_then_sms(&app, "wa-stop-1", 60).await;
    messages_when(
        &app,
        &id,
        "WhatsApp refused for the opt-out, the SMS sent",
        |m| m == [pair("whatsapp", "failed"), pair("sms", "sent")],
    )
    .await;
    assert!(whatsapp_codes(&app).is_empty(), "nothing made on WhatsApp");
    assert_eq!(sms_to(&app, TO).len(), 1);
    // An SMS of its own still goes: the opt-out is WhatsApp's.
    let sent = app
        .post("wa-stop-sms", &sms(TO, "Your order shipped"))
        .await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.bytes));
    assert_eq!(sent.json()["status"], "sent");

    // START: WhatsApp again.
    let a = post_signed(&app, &user_wrote("wamid.START1", &TO[1..], "START")).await;
    assert_eq!(a.status, 200);
    assert_eq!(app.db.count("SELECT count(*) FROM opt_outs").await, 0);
    let id = start_whatsapp_then_sms(&app, "wa-stop-2", 60).await;
    messages_when(&app, &id, "the code sent by WhatsApp", |m| {
        m == [pair("whatsapp", "sent")]
    })
    .await;
    assert_eq!(whatsapp_codes(&app).len(), 1);
}

/// An opt-out of the bare number (the tenant's own list, an SMS STOP)
/// stops every channel to it, WhatsApp included.
async fn a_numbers_own_opt_out_stops_whatsapp_too(backend: Backend) {
    let app = spawn_whatsapp_with(backend, Clock::system()).await;
    let a = app
        .request(Method::POST, "/opt-outs")
        .bearer_auth(&app.api_key)
        .json(&json!({"number": TO}))
        .send()
        .await
        .expect("POST /opt-outs");
    assert!(a.status().is_success(), "{}", a.status());
    let id = start_whatsapp_then_sms(&app, "wa-own-1", 60).await;
    messages_when(&app, &id, "both steps refused", |m| {
        m == [pair("whatsapp", "failed"), pair("sms", "failed")]
    })
    .await;
    assert!(whatsapp_codes(&app).is_empty());
    assert!(sms_to(&app, TO).is_empty());
}

on_both_backends!(
    a_whatsapp_stop_opts_the_number_out_of_whatsapp_only,
    a_numbers_own_opt_out_stops_whatsapp_too,
    three_channels_move_on_from_a_whatsapp_refusal,
    whatsapp_without_its_token_is_refused_and_stores_nothing,
    an_ambiguous_whatsapp_send_ends_unknown_and_is_never_resent,
    a_throughput_limit_is_retried_then_sent_once,
    a_certain_refusal_fails_and_the_sms_goes_at_once,
    statuses_land_right_whatever_their_order,
    a_forged_status_changes_nothing,
    a_status_of_an_ambiguous_send_finds_its_message_by_our_id,
    a_status_during_an_ambiguous_send_still_stops_the_next_channel,
    the_handshake_echoes_the_challenge_for_the_verify_token,
    forged_notifications_are_refused_and_record_nothing,
    duplicated_statuses_are_recorded_once,
);
