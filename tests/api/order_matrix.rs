//! Every situation of a verification's steps, for three-step orders that
//! put each channel first, in the middle and last (issue 40), through a
//! running instance on both backends, with creations counted per channel
//! at one mock that makes a message for every call it accepts (the `http`
//! SMS endpoint, the Gateway, WhatsApp's Cloud API):
//!
//! | situation | what must hold |
//! |---|---|
//! | silence | each step after the one before's delay, once, the same code; nothing after the last |
//! | the first step refused for certain | nothing made on it; the second at once, the third after its delay |
//! | the first step reported delivered | nothing else, however long it waits |
//! | the first step's delivery reported after the move | the third step never goes |
//! | canceled in the middle | nothing after the cancel |
//! | approved in the middle | nothing after the approval |
//!
//! The orders' own rules (a revoke where the channel can, the Gateway asked
//! before moving on, WhatsApp's statuses) are each channel's tests; here
//! the one state machine is held to the same table for every order.

use std::time::Duration;

use reqwest::Method;
use sendonce::clock::Clock;
use serde_json::{Value, json};
use testkit::mock_provider::Behaviour;
use testkit::providers::whatsapp::error_body;

use crate::helpers::*;
use crate::telegram_gateway::{
    TOKEN, check, gateway_calling_back, manual_clock, pair, report, started, verification,
};
use crate::whatsapp::{APP_SECRET, TO, checking_mock, post_status, whatsapp_at};

const RECEIPT_SECRET: &str = "order-matrix-receipt-secret-0123";
/// Each step's `fallback_after_seconds`.
const DELAY: u64 = 10;

const ORDERS: [[&str; 3]; 3] = [
    ["whatsapp", "telegram", "sms"],
    ["sms", "whatsapp", "telegram"],
    ["telegram", "sms", "whatsapp"],
];

/// SMS (`http`, its receipts keyed), the Gateway and WhatsApp on one mock.
async fn spawn_all(backend: Backend, clock: Clock) -> TestApp {
    let (mock, url, base) = checking_mock().await;
    mock.set_gateway_token(TOKEN);
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
        ("WHATSAPP_APP_SECRET", APP_SECRET),
        ("TELEGRAM_GATEWAY_TOKEN", TOKEN),
        ("SENDONCE_RECEIPT_SECRET", RECEIPT_SECRET),
    ])
    .expect("receipt settings");
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        mock: Some((mock, url)),
        fallbacks: vec![
            whatsapp_at(&base, Duration::from_secs(2)),
            gateway_calling_back(&base, None),
        ],
        ..TestOptions::default()
    })
    .await
}

/// Messages made at the mock on `channel` for `TO`.
fn made(app: &TestApp, channel: &str) -> Vec<String> {
    match channel {
        "sms" => crate::telegram_gateway::sms_to(app, TO),
        "telegram" => app
            .mock
            .gateway_messages()
            .into_iter()
            .filter_map(|m| m.code)
            .collect(),
        "whatsapp" => app
            .mock
            .whatsapp_messages()
            .into_iter()
            .filter(|m| m.to == TO)
            .map(|m| m.code)
            .collect(),
        other => panic!("no channel {other}"),
    }
}

/// What a step's message shows once the next step went after its
/// silence: the Gateway's is revoked first (`undelivered`, its report
/// `revoked`); an SMS or a WhatsApp message cannot be withdrawn and stays
/// `sent`.
fn moved_on(channel: &str) -> &'static str {
    if channel == "telegram" {
        "undelivered"
    } else {
        "sent"
    }
}

/// Messages made per channel, in the order's order: the Gateway's and
/// WhatsApp's lists are of messages made; an SMS is made for every message
/// the mock created for `TO` that is neither (a refused call makes none).
fn counts(app: &TestApp, order: &[&str; 3]) -> Vec<usize> {
    let telegram = made(app, "telegram").len();
    let whatsapp = made(app, "whatsapp").len();
    let sms = app.mock.created_to(TO) as usize - telegram - whatsapp;
    order
        .iter()
        .map(|c| match *c {
            "telegram" => telegram,
            "whatsapp" => whatsapp,
            _ => sms,
        })
        .collect()
}

/// A refusal the channel's provider documents as final for this code.
fn refusal(channel: &str) -> Behaviour {
    let body = match channel {
        "sms" => json!({"error": "invalid destination"}),
        "telegram" => json!({"ok": false, "error": "PHONE_NUMBER_NOT_FOUND"}),
        "whatsapp" => error_body(131026),
        other => panic!("no channel {other}"),
    };
    Behaviour::Fail {
        status: if channel == "sms" { 422 } else { 400 },
        body,
        retry_after: None,
    }
}

/// Posts a signed `delivered` report of the step on `channel`.
async fn deliver(app: &TestApp, clock: &Clock, id: &str, step: usize, channel: &str) {
    let now = clock.now().unix_timestamp();
    let answered = match channel {
        "sms" => {
            let v = verification(app, id).await;
            let key = v["messages"][step]["idempotency_key"]
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
            r.status().as_u16()
        }
        "telegram" => {
            let request_id = app.mock.gateway_messages()[0].request_id.clone();
            app.mock.gateway_set_status(&request_id, "delivered");
            report(app, &request_id, now, TOKEN).await.status
        }
        "whatsapp" => {
            let m = app.mock.whatsapp_messages()[0].clone();
            post_status(app, &m, "delivered", now, APP_SECRET)
                .await
                .status
        }
        other => panic!("no channel {other}"),
    };
    assert_eq!(answered, 200, "the {channel} report");
}

/// Starts `order` (its key names the case).
async fn start(app: &TestApp, key: &str, order: &[&str; 3]) -> String {
    started(
        app,
        key,
        json!({"to": TO, "channels": order, "fallback_after_seconds": DELAY}),
    )
    .await
}

/// Waits until the verification shows `want` (channel, status) pairs;
/// fails with what it last showed.
async fn shows(app: &TestApp, id: &str, what: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want.iter().map(|(c, s)| pair(c, s)).collect();
    let mut last = Value::Null;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        last = verification(app, id).await;
        let got: Vec<(String, String)> = last["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                pair(
                    m["channel"].as_str().unwrap_or(""),
                    m["status"].as_str().unwrap_or(""),
                )
            })
            .collect();
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: wanted {want:?}, the verification showed {last}");
}

/// Lets every timer run out and waits for the passes to have seen the
/// end: the verification no longer pending and no step's row still
/// waiting (a pass settles each once it sees the end). A step that went
/// after the end would show by then as a message row.
async fn long_after(app: &TestApp, clock: &Clock, id: &str) -> Value {
    clock.advance(Duration::from_secs(900));
    let waiting = "SELECT count(*) FROM verification_fallbacks WHERE state = 'waiting'";
    eventually("the verification ended and its rows settled", || async {
        let v = verification(app, id).await;
        (v["status"] != "pending" && app.db.count(waiting).await == 0).then_some(v)
    })
    .await
}

/// An instance with `order` started under `key`, its first step silent
/// and its second sent after the first's delay.
async fn at_step_two(backend: Backend, order: &[&str; 3], key: &str) -> (TestApp, Clock, String) {
    let clock = manual_clock();
    let app = spawn_all(backend, clock.clone()).await;
    let id = start(&app, key, order).await;
    shows(&app, &id, "step 1 sent", &[(order[0], "sent")]).await;
    clock.advance(Duration::from_secs(DELAY + 1));
    shows(
        &app,
        &id,
        "step 2 sent",
        &[(order[0], moved_on(order[0])), (order[1], "sent")],
    )
    .await;
    (app, clock, id)
}

async fn silence(backend: Backend, order: &[&str; 3], n: usize) {
    let clock = manual_clock();
    let app = spawn_all(backend, clock.clone()).await;
    let id = start(&app, &format!("silence-{n}"), order).await;
    shows(&app, &id, "step 1 sent", &[(order[0], "sent")]).await;
    clock.advance(Duration::from_secs(DELAY + 1));
    shows(
        &app,
        &id,
        "step 2 sent",
        &[(order[0], moved_on(order[0])), (order[1], "sent")],
    )
    .await;
    assert_eq!(counts(&app, order), [1, 1, 0], "{order:?}");
    clock.advance(Duration::from_secs(DELAY + 1));
    shows(
        &app,
        &id,
        "step 3 sent",
        &[
            (order[0], moved_on(order[0])),
            (order[1], moved_on(order[1])),
            (order[2], "sent"),
        ],
    )
    .await;
    long_after(&app, &clock, &id).await;
    assert_eq!(counts(&app, order), [1, 1, 1], "{order:?}");
    // One code on every channel.
    let codes: Vec<String> = order.iter().map(|c| made(&app, c).remove(0)).collect();
    let code: String = codes[0].chars().filter(char::is_ascii_digit).collect();
    assert!(codes.iter().all(|c| c.contains(&code)), "{codes:?}");
}

async fn first_refused(backend: Backend, order: &[&str; 3], n: usize) {
    let clock = manual_clock();
    let app = spawn_all(backend, clock.clone()).await;
    app.mock.push([refusal(order[0])]);
    let id = start(&app, &format!("refused-{n}"), order).await;
    // The second step at once: no clock moved.
    shows(
        &app,
        &id,
        "step 1 failed, step 2 sent at once",
        &[(order[0], "failed"), (order[1], "sent")],
    )
    .await;
    assert_eq!(counts(&app, order), [0, 1, 0], "{order:?}");
    clock.advance(Duration::from_secs(DELAY + 1));
    shows(
        &app,
        &id,
        "step 3 after step 2's delay",
        &[
            (order[0], "failed"),
            (order[1], moved_on(order[1])),
            (order[2], "sent"),
        ],
    )
    .await;
    long_after(&app, &clock, &id).await;
    assert_eq!(counts(&app, order), [0, 1, 1], "{order:?}");
}

async fn first_delivered(backend: Backend, order: &[&str; 3], n: usize) {
    let clock = manual_clock();
    let app = spawn_all(backend, clock.clone()).await;
    let id = start(&app, &format!("delivered-{n}"), order).await;
    shows(&app, &id, "step 1 sent", &[(order[0], "sent")]).await;
    deliver(&app, &clock, &id, 0, order[0]).await;
    shows(&app, &id, "step 1 delivered", &[(order[0], "delivered")]).await;
    let v = long_after(&app, &clock, &id).await;
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(counts(&app, order), [1, 0, 0], "{order:?}");
}

async fn first_delivered_after_the_move(backend: Backend, order: &[&str; 3], n: usize) {
    let (app, clock, id) = at_step_two(backend, order, &format!("late-{n}")).await;
    // The first step's report, after the move: the rest stops for good.
    deliver(&app, &clock, &id, 0, order[0]).await;
    eventually("step 2's row settled as delivered", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM verification_fallbacks WHERE state = 'delivered'")
            .await;
        (n >= 1).then_some(())
    })
    .await;
    let v = long_after(&app, &clock, &id).await;
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(counts(&app, order), [1, 1, 0], "{order:?}");
}

async fn canceled_in_the_middle(backend: Backend, order: &[&str; 3], n: usize) {
    let (app, clock, id) = at_step_two(backend, order, &format!("cancel-{n}")).await;
    let c = crate::telegram_gateway::post_to(
        &app,
        &format!("/verifications/{id}/cancel"),
        None,
        json!({}),
    )
    .await;
    assert_eq!(c.status, 200, "{}", String::from_utf8_lossy(&c.bytes));
    assert_eq!(c.json()["status"], "canceled");
    let v = long_after(&app, &clock, &id).await;
    assert_eq!(v["status"], "canceled");
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(counts(&app, order), [1, 1, 0], "{order:?}");
}

async fn approved_in_the_middle(backend: Backend, order: &[&str; 3], n: usize) {
    let (app, clock, id) = at_step_two(backend, order, &format!("approve-{n}")).await;
    let code: String = made(&app, order[1])
        .remove(0)
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let a = check(&app, &id, &code).await;
    assert_eq!(
        a.json()["status"],
        "approved",
        "{}",
        String::from_utf8_lossy(&a.bytes)
    );
    let v = long_after(&app, &clock, &id).await;
    assert_eq!(v["status"], "approved");
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(counts(&app, order), [1, 1, 0], "{order:?}");
}

macro_rules! matrix {
    ($($name:ident),+) => {
        $(
            async fn $name(backend: Backend) {
                for (n, order) in ORDERS.iter().enumerate() {
                    super::$name(backend, order, n).await;
                }
            }
        )+
        on_both_backends!($($name),+);
    };
}

mod every_order {
    use super::*;

    matrix!(
        silence,
        first_refused,
        first_delivered,
        first_delivered_after_the_move,
        canceled_in_the_middle,
        approved_in_the_middle
    );
}
