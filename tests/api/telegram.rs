//! The Telegram bot channel end to end, against the mock's Bot API (which,
//! as the real one, does not de-duplicate: counted per chat and text):
//! `telegram:<chat_id>` goes by `sendMessage` through the bot and never
//! through an SMS provider; flood control waits `retry_after`; a blocked
//! bot fails the message and opts the chat out in the same write; an
//! answer lost after the request was written ends `unknown`, sent once.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::provider::{Provider, TelegramProvider, TelegramSettings};
use serde_json::{Value, json};
use testkit::mock_provider::{Behaviour, MockProvider};

use crate::helpers::*;

pub const TOKEN: &str = "123456789:AAE-test-token";

/// The bot, aimed at the mock at `base` (`http://host:port`).
pub fn bot(base: &str) -> Arc<dyn Provider> {
    Arc::new(
        TelegramProvider::new(TelegramSettings {
            api_url: base.to_string(),
            token: TOKEN.into(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        })
        .expect("telegram provider"),
    )
}

/// An instance with the `http` SMS provider and the bot, both on one mock.
pub async fn spawn_bot(
    backend: Backend,
    clock: Clock,
    settings: sendonce::config::Settings,
) -> TestApp {
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_telegram_token(TOKEN);
    let base = url.trim_end_matches("/messages").to_string();
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        mock: Some((mock, url)),
        fallbacks: vec![bot(&base)],
        ..TestOptions::default()
    })
    .await
}

fn calls(app: &TestApp, endpoint: &str) -> usize {
    app.mock
        .calls()
        .iter()
        .filter(|c| c.endpoint == endpoint)
        .count()
}

async fn attempts(app: &TestApp, key: &str) -> Vec<(String, String, Value)> {
    let a = app.get(&format!("/messages/{key}/attempts")).await.json();
    a["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap_or("?").to_string(),
                a["outcome"].as_str().unwrap_or("open").to_string(),
                a["provider_code"].clone(),
            )
        })
        .collect()
}

async fn a_chat_gets_one_message_through_the_bot(backend: Backend) {
    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    let text = "Your order 4711 shipped: привет";
    let a = app
        .post("TG-OK", &json!({"to": "telegram:42", "body": text}))
        .await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    let m = a.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["to"], "telegram:42");
    assert_eq!(m["provider"], "telegram");
    assert_eq!(m["provider_message_id"], "42:1");
    assert_eq!(m["segments"], 1, "one Telegram message whatever its length");
    assert_eq!(m["encoding"], "utf8");
    assert_eq!(
        m["cost"]["amount"], "0.00",
        "a bot message is free, whatever the price table's `*,*` row says"
    );
    assert_eq!(app.mock.deliveries_to("42", text), 1);
    let sent = app.mock.telegram_messages();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat_id, 42);
    assert_eq!(
        calls(&app, "http"),
        0,
        "no SMS provider is asked about a chat"
    );
    assert_eq!(
        attempts(&app, "TG-OK").await,
        [("telegram".to_string(), "sent".to_string(), Value::Null)]
    );
    let events = app.get("/messages/TG-OK/events").await;
    assert_eq!(events.status, 200);
    // A replay answers the same and sends nothing.
    let again = app
        .post("TG-OK", &json!({"to": "telegram:42", "body": text}))
        .await;
    assert_eq!(again.json()["provider_message_id"], "42:1");
    assert_eq!(app.mock.deliveries_to("42", text), 1);
    // A number still goes by SMS, never through the bot.
    let m = app.post("SMS-OK", &sms("+14155550100", "hi")).await.json();
    assert_eq!(
        (m["status"].as_str(), m["provider"].as_str()),
        (Some("sent"), Some("http"))
    );
    assert_eq!(
        m["cost"]["amount"], "0.10",
        "an SMS costs what the table says"
    );
    assert_eq!(calls(&app, "telegram"), 1);
    // The next message to the chat has the chat's next message id.
    let m = app
        .post("TG-2", &json!({"to": "telegram:42", "body": "second"}))
        .await
        .json();
    assert_eq!(m["provider_message_id"], "42:2");
}

async fn flood_control_waits_retry_after(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    let app = spawn_bot(backend, clock.clone(), settings).await;
    app.mock.push([Behaviour::Fail {
        status: 429,
        body: json!({}),
        retry_after: Some(7),
    }]);
    let a = app
        .post_with(
            Some("TG-FLOOD"),
            &json!({"to": "telegram:42", "body": "hi"}),
            &[("prefer", "wait=1")],
        )
        .await;
    assert_eq!(a.status, 202, "a 7 s wait does not fit a 1 s one");
    let m = app.get("/messages/TG-FLOOD").await.json();
    assert_eq!(m["status"], "processing");
    assert_eq!(
        m["next_attempt_at"], "2026-11-29T12:00:07Z",
        "retry_after, not our backoff"
    );
    clock.advance(Duration::from_secs(6));
    assert_eq!(app.handle.scheduler.tick().await.unwrap(), 0, "not due yet");
    assert_eq!(calls(&app, "telegram"), 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(app.handle.scheduler.tick().await.unwrap(), 1, "due now");
    let m = app.wait_for_status("TG-FLOOD", "sent").await;
    assert_eq!(m["attempts"], 2);
    assert_eq!(app.mock.deliveries_to("42", "hi"), 1);
    let a = attempts(&app, "TG-FLOOD").await;
    assert_eq!((a[0].1.as_str(), &a[0].2), ("retryable", &json!("429")));
}

async fn a_blocked_bot_fails_and_opts_the_chat_out(backend: Backend) {
    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    app.mock.telegram_block(43);
    let m = app
        .post("TG-BLOCKED", &json!({"to": "telegram:43", "body": "hi"}))
        .await
        .json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["code"], "provider_rejected");
    assert_eq!(m["error"]["provider_code"], "403");
    let list = app.get("/opt-outs").await.json();
    let data = list["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(data.len(), 1, "{list}");
    assert_eq!(data[0]["number"], "telegram:43");
    assert_eq!(data[0]["source"], "provider");
    // The next message to the chat never reaches the Bot API.
    let m = app
        .post("TG-AFTER", &json!({"to": "telegram:43", "body": "again"}))
        .await
        .json();
    assert_eq!(m["status"], "failed");
    assert_eq!(m["error"]["code"], "recipient_opted_out");
    assert_eq!(calls(&app, "telegram"), 1);
    // Opting the chat back in through the API lets it through.
    let a = app
        .request(reqwest::Method::DELETE, "/opt-outs/telegram:43")
        .bearer_auth(&app.api_key)
        .send()
        .await
        .expect("DELETE");
    assert_eq!(a.status().as_u16(), 204);

    // A chat the bot does not know: failed, not opted out.
    app.mock.telegram_unknown_chat(44);
    let m = app
        .post("TG-UNKNOWN", &json!({"to": "telegram:44", "body": "hi"}))
        .await
        .json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["provider_code"], "400");
    let list = app.get("/opt-outs").await.json();
    assert_eq!(list["data"].as_array().map(Vec::len), Some(0), "{list}");
    assert_eq!(calls(&app, "http"), 0);
}

/// The bot is the installation's: a chat that blocked it is opted out for
/// every tenant, and another tenant's message never reaches sendMessage.
async fn a_blocked_bot_opts_the_chat_out_for_every_tenant(backend: Backend) {
    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    let other = sendonce::apikey::generate();
    app.handle
        .store
        .create_tenant("tg-other", &other.stored)
        .await
        .expect("tenant");
    app.mock.telegram_block(43);
    let m = app
        .post("TG-BLOCKED", &json!({"to": "telegram:43", "body": "hi"}))
        .await
        .json();
    assert_eq!(m["error"]["provider_code"], "403", "{m}");
    let req = app
        .request(reqwest::Method::POST, "/messages")
        .bearer_auth(&other.secret)
        .header("Idempotency-Key", "TG-OTHER")
        .json(&json!({"to": "telegram:43", "body": "hello"}));
    let m = answer(req.send().await.expect("POST")).await.json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["code"], "recipient_opted_out", "{m}");
    assert_eq!(calls(&app, "telegram"), 1, "only the first tenant's call");
    let list = app
        .request(reqwest::Method::GET, "/opt-outs")
        .bearer_auth(&other.secret)
        .send()
        .await
        .expect("GET");
    let list = answer(list).await.json();
    assert_eq!(list["data"][0]["number"], "telegram:43", "{list}");
    assert_eq!(list["data"][0]["source"], "provider", "{list}");
}

async fn a_lost_answer_ends_unknown_and_is_never_resent(backend: Backend) {
    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let m = app
        .post(
            "TG-DROP",
            &json!({"to": "telegram:42", "body": "Order 7 shipped"}),
        )
        .await
        .json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(m["error"]["code"], "outcome_unknown");
    assert_eq!(app.mock.deliveries_to("42", "Order 7 shipped"), 1);
    assert_eq!(calls(&app, "telegram"), 1, "never resent");
    // A 5xx after the message was created, alike.
    app.mock.push([Behaviour::AcceptThenFail { status: 500 }]);
    let m = app
        .post(
            "TG-500",
            &json!({"to": "telegram:42", "body": "five hundred"}),
        )
        .await
        .json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(app.mock.deliveries_to("42", "five hundred"), 1);
    assert_eq!(calls(&app, "telegram"), 2);
    assert_eq!(calls(&app, "http"), 0, "never moved to SMS");
    let again = app
        .post(
            "TG-DROP",
            &json!({"to": "telegram:42", "body": "Order 7 shipped"}),
        )
        .await
        .json();
    assert_eq!(again["status"], "unknown");
    assert_eq!(calls(&app, "telegram"), 2);
}

async fn a_refused_token_fails_the_chat_without_sms(backend: Backend) {
    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    app.mock.set_telegram_token("999:another-bot");
    let m = app
        .post("TG-401", &json!({"to": "telegram:42", "body": "hi"}))
        .await
        .json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["provider_code"], "401");
    let a = attempts(&app, "TG-401").await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].1, "refused");
    assert_eq!(calls(&app, "http"), 0, "a chat has no next provider");
    assert_eq!(app.mock.created(), 0);
}

async fn chats_are_refused_without_a_bot_and_checked_with_one(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let a = app
        .post("TG-NOBOT", &json!({"to": "telegram:42", "body": "hi"}))
        .await;
    assert_eq!(a.status, 400);
    let body = a.json();
    assert_eq!(a.slug(), "validation");
    assert_eq!(body["errors"][0]["field"], "to", "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("TELEGRAM_BOT_TOKEN"),
        "{body}"
    );
    assert_eq!(app.message_count().await, 0);

    let app = spawn_bot(backend, Clock::system(), test_settings()).await;
    // (body, the field refused)
    let refused = [
        (json!({"to": "telegram:abc", "body": "hi"}), "to"),
        (
            json!({"to": "telegram:42", "body": "a".repeat(1601)}),
            "body",
        ),
        (json!({"to": "telegram:42", "body": ""}), "body"),
        (
            json!({"to": "telegram:42", "body": "hi", "from": "Acme"}),
            "from",
        ),
    ];
    for (i, (body, field)) in refused.iter().enumerate() {
        let a = app.post(&format!("TG-BAD-{i}"), body).await;
        assert_eq!(a.status, 400, "{body}");
        let answer = a.json();
        assert_eq!(answer["errors"][0]["field"], *field, "{answer}");
    }
    assert_eq!(app.message_count().await, 0);
    let a = app
        .post(
            "TG-MAX",
            &json!({"to": "telegram:42", "body": "я".repeat(1600)}),
        )
        .await;
    assert_eq!(a.json()["status"], "sent");
    assert_eq!(app.mock.created(), 1);
}

on_both_backends!(
    a_chat_gets_one_message_through_the_bot,
    flood_control_waits_retry_after,
    a_blocked_bot_fails_and_opts_the_chat_out,
    a_blocked_bot_opts_the_chat_out_for_every_tenant,
    a_lost_answer_ends_unknown_and_is_never_resent,
    a_refused_token_fails_the_chat_without_sms,
    chats_are_refused_without_a_bot_and_checked_with_one,
);
