//! The bot's inbound updates, `POST /channels/telegram/updates`: each taken
//! once under the unique (bot, update_id), also when delivered concurrently
//! to two instances and after a restart; an id whose row is older than 7
//! days is new (ids restart, never a high-water mark); `/stop` opts the
//! chat out and `/start` back in; a wrong secret, a malformed or an
//! oversized body store nothing.

use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::delivery::Purger;
use sendonce::provider::telegram::updates::Inbound;
use serde_json::{Value, json};
use testkit::mock_provider::MockProvider;

use crate::delivery::futures_join_all;
use crate::helpers::*;
use crate::telegram::{TOKEN, bot};

pub(crate) const SECRET: &str = "tg-webhook-secret_1";
const BOT_ID: i64 = 123_456_789;
const OWNER: &str = "tg-owner";

/// A database with the tenant that owns the bot's updates; its API key.
pub(crate) async fn owned_database(backend: Backend) -> (String, String) {
    let database = fresh_database_on(backend).await;
    let (store, _) = open_store(&database, Duration::from_secs(2));
    let key = sendonce::apikey::generate();
    store
        .create_tenant(OWNER, &key.stored)
        .await
        .expect("tenant");
    (database, key.secret)
}

/// An instance taking the bot's updates (and sending through the bot, on
/// `mock`), on `database` as the owner.
pub(crate) async fn spawn_inbound(
    backend: Backend,
    database: &str,
    key: &str,
    clock: Clock,
    mock: Option<(MockProvider, String)>,
) -> TestApp {
    let mut settings = test_settings();
    settings.provider.inbound = vec![std::sync::Arc::new(Inbound::new(BOT_ID, OWNER, SECRET))];
    let (mock, url) = match mock {
        Some(m) => m,
        None => {
            let (mock, url, _) = MockProvider::start().await.expect("mock");
            (mock, url)
        }
    };
    let base = url.trim_end_matches("/messages").to_string();
    spawn_with(TestOptions {
        backend,
        clock,
        settings,
        database: Some(database.to_string()),
        api_key: Some(key.to_string()),
        mock: Some((mock, url)),
        fallbacks: vec![bot(&base)],
        ..TestOptions::default()
    })
    .await
}

pub(crate) fn text_update(update_id: i64, chat: i64, text: &str) -> Value {
    json!({
        "update_id": update_id,
        "message": {
            "message_id": 7,
            "date": 1_700_000_000,
            "chat": {"id": chat, "type": "private", "first_name": "Ann"},
            "from": {"id": chat, "is_bot": false, "first_name": "Ann", "username": "ann"},
            "text": text,
        }
    })
}

pub(crate) async fn post_update(app: &TestApp, secret: Option<&str>, body: &[u8]) -> Answer {
    let mut req = app
        .request(reqwest::Method::POST, "/channels/telegram/updates")
        .header("Content-Type", "application/json")
        .body(body.to_vec());
    if let Some(s) = secret {
        req = req.header("X-Telegram-Bot-Api-Secret-Token", s);
    }
    answer(req.send().await.expect("POST update")).await
}

async fn deliver(app: &TestApp, update: &Value) -> Answer {
    post_update(app, Some(SECRET), update.to_string().as_bytes()).await
}

async fn received_events(app: &TestApp) -> i64 {
    app.db
        .count("SELECT count(*) FROM webhook_events WHERE type = 'message.received'")
        .await
}

async fn stored_updates(app: &TestApp) -> i64 {
    app.db.count("SELECT count(*) FROM inbound_updates").await
}

async fn one_update_delivered_five_times_concurrently_is_one_event(backend: Backend) {
    let (database, key) = owned_database(backend).await;
    let a = spawn_inbound(backend, &database, &key, Clock::system(), None).await;
    // Two instances on Postgres; SQLite has one writer, one instance.
    let b = match backend {
        Backend::Postgres => {
            Some(spawn_inbound(backend, &database, &key, Clock::system(), None).await)
        }
        Backend::Sqlite => None,
    };
    let update = text_update(1000, 42, "hello there");
    let answers = futures_join_all((0..5).map(|i| {
        let app = match (&b, i % 2) {
            (Some(b), 1) => b,
            _ => &a,
        };
        let update = update.clone();
        async move { deliver(app, &update).await }
    }))
    .await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    }
    let new = answers
        .iter()
        .filter(|a| a.json()["duplicate"] == false)
        .count();
    assert_eq!(new, 1, "exactly one delivery took it");
    assert_eq!(received_events(&a).await, 1);
    assert_eq!(stored_updates(&a).await, 1);
    // The event, in the owner's feed.
    // (Postgres's feed shows a transaction once every older one ended.)
    let events: Vec<Value> = eventually("the event in the feed", || async {
        let feed = a.get("/events").await.json();
        let events: Vec<Value> = feed["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|e| e["type"] == "message.received")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let data = &events[0]["data"];
    assert_eq!(data["from"], "telegram:42", "{data}");
    assert_eq!(data["chat_id"], 42);
    assert_eq!(data["text"], "hello there");
    assert_eq!(data["sender"]["username"], "ann");

    // After a restart of the service, the same update is still a repeat.
    let mut a = a;
    a.stop().await;
    if let Some(mut b) = b {
        b.stop().await;
    }
    let c = spawn_inbound(backend, &database, &key, Clock::system(), None).await;
    let again = deliver(&c, &update).await;
    assert_eq!(
        (again.status, again.json()["duplicate"].clone()),
        (200, json!(true))
    );
    // A lower id than any seen is a new update: no high-water mark.
    let lower = deliver(&c, &text_update(3, 42, "an older id")).await;
    assert_eq!(lower.json()["duplicate"], false);
    assert_eq!(received_events(&c).await, 2);
}

async fn only_the_secret_gets_in_and_bad_bodies_store_nothing(backend: Backend) {
    let (database, key) = owned_database(backend).await;
    let app = spawn_inbound(backend, &database, &key, Clock::system(), None).await;
    let update = text_update(5, 42, "/stop").to_string();
    for secret in [
        None,
        Some("wrong"),
        Some("tg-webhook-secret_"),
        Some("tg-webhook-secret_12"),
    ] {
        let a = post_update(&app, secret, update.as_bytes()).await;
        assert_eq!(a.status, 401, "{secret:?}");
        assert_eq!(a.slug(), "unauthorized");
    }
    // (body, status)
    let big = format!(
        r#"{{"update_id":6,"message":{{"message_id":1,"chat":{{"id":42}},"text":"{}"}}}}"#,
        "a".repeat(70 * 1024)
    );
    let bad: [(&[u8], u16); 5] = [
        (b"not json", 400),
        (b"[]", 400),
        (br#"{"update_id":"7"}"#, 400),
        (br#"{"update_id":8,"message":{"text":"no chat"}}"#, 400),
        (big.as_bytes(), 413),
    ];
    for (body, status) in bad {
        let a = post_update(&app, Some(SECRET), body).await;
        assert_eq!(
            a.status,
            status,
            "{}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
    }
    assert_eq!(stored_updates(&app).await, 0);
    assert_eq!(received_events(&app).await, 0);
    let list = app.get("/opt-outs").await.json();
    assert_eq!(list["data"].as_array().map(Vec::len), Some(0), "{list}");
    // An update that is no text message is taken, and does nothing else.
    let edit = json!({"update_id": 9, "edited_message": {"message_id": 1, "chat": {"id": 42}, "text": "x"}});
    assert_eq!(deliver(&app, &edit).await.json()["duplicate"], false);
    assert_eq!(
        (stored_updates(&app).await, received_events(&app).await),
        (1, 0)
    );
}

async fn stop_opts_the_chat_out_and_start_back_in(backend: Backend) {
    let (database, key) = owned_database(backend).await;
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_telegram_token(TOKEN);
    let app = spawn_inbound(backend, &database, &key, Clock::system(), Some((mock, url))).await;
    assert_eq!(
        deliver(&app, &text_update(20, 42, "/stop")).await.status,
        200
    );
    let m = app
        .post("TG-STOPPED", &json!({"to": "telegram:42", "body": "news"}))
        .await
        .json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["code"], "recipient_opted_out");
    assert_eq!(
        app.mock.telegram_messages().len(),
        0,
        "the bot was never called"
    );
    let list = app.get("/opt-outs").await.json();
    assert_eq!(list["data"][0]["number"], "telegram:42", "{list}");
    assert_eq!(list["data"][0]["source"], "inbound");
    // The same /stop again changes nothing; /start opts back in.
    assert_eq!(
        deliver(&app, &text_update(20, 42, "/stop")).await.json()["duplicate"],
        true
    );
    assert_eq!(
        deliver(&app, &text_update(21, 42, "/start")).await.json()["duplicate"],
        false
    );
    let m = app
        .post("TG-BACK", &json!({"to": "telegram:42", "body": "news"}))
        .await
        .json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(app.mock.deliveries_to("42", "news"), 1);
    // STOP as a word works as /stop.
    deliver(&app, &text_update(22, 43, "STOP")).await;
    let m = app
        .post("TG-STOP-WORD", &json!({"to": "telegram:43", "body": "x"}))
        .await
        .json();
    assert_eq!(m["error"]["code"], "recipient_opted_out", "{m}");
    assert_eq!(received_events(&app).await, 3);
}

/// Posts `body` to `/messages` as the tenant whose key is `key`.
async fn post_as(app: &TestApp, key: &str, idem: &str, body: &Value) -> Value {
    let req = app
        .request(reqwest::Method::POST, "/messages")
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(body);
    answer(req.send().await.expect("POST /messages"))
        .await
        .json()
}

/// The bot is the installation's: a chat's `/stop` opts it out for every
/// tenant (also one made after it), `/start` back in for every tenant.
async fn stop_opts_the_chat_out_for_every_tenant(backend: Backend) {
    let (database, key) = owned_database(backend).await;
    let (mock, url, _) = MockProvider::start().await.expect("mock");
    mock.set_telegram_token(TOKEN);
    let app = spawn_inbound(backend, &database, &key, Clock::system(), Some((mock, url))).await;
    let other = sendonce::apikey::generate();
    app.handle
        .store
        .create_tenant("tg-other", &other.stored)
        .await
        .expect("tenant");
    assert_eq!(
        deliver(&app, &text_update(30, 42, "/stop")).await.status,
        200
    );
    let later = sendonce::apikey::generate();
    app.handle
        .store
        .create_tenant("tg-later", &later.stored)
        .await
        .expect("tenant");
    for (who, k) in [("other", &other.secret), ("later", &later.secret)] {
        let m = post_as(
            &app,
            k,
            &format!("TG-{who}"),
            &json!({"to": "telegram:42", "body": "news"}),
        )
        .await;
        assert_eq!(m["status"], "failed", "{who}: {m}");
        assert_eq!(m["error"]["code"], "recipient_opted_out", "{who}: {m}");
        let list = app
            .request(reqwest::Method::GET, "/opt-outs")
            .bearer_auth(k)
            .send()
            .await
            .expect("GET");
        let list = answer(list).await.json();
        assert_eq!(list["data"][0]["number"], "telegram:42", "{who}: {list}");
        assert_eq!(list["data"][0]["source"], "inbound", "{who}: {list}");
    }
    assert_eq!(
        app.mock.telegram_messages().len(),
        0,
        "no tenant's message reached the bot"
    );
    // /start opts the chat back in for every tenant.
    deliver(&app, &text_update(31, 42, "/start")).await;
    for (who, k) in [("other", &other.secret), ("later", &later.secret)] {
        let m = post_as(
            &app,
            k,
            &format!("TG-{who}-back"),
            &json!({"to": "telegram:42", "body": "news"}),
        )
        .await;
        assert_eq!(m["status"], "sent", "{who}: {m}");
    }
    assert_eq!(app.mock.deliveries_to("42", "news"), 2);
}

async fn an_id_seen_8_days_ago_is_a_new_update(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-20 12:00:00 UTC));
    let (database, key) = owned_database(backend).await;
    let app = spawn_inbound(backend, &database, &key, clock.clone(), None).await;
    let update = text_update(777, 42, "hi");
    assert_eq!(deliver(&app, &update).await.json()["duplicate"], false);
    // Within the 7 days Telegram's re-sends are repeats.
    clock.advance(Duration::from_secs(6 * 24 * 3600));
    assert_eq!(deliver(&app, &update).await.json()["duplicate"], true);
    // 8 days after it was taken (the repeat did not refresh it): ids
    // restart, the same id is a new update, whether or not the purge ran.
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert_eq!(deliver(&app, &update).await.json()["duplicate"], false);
    assert_eq!(received_events(&app).await, 2);
    assert_eq!(stored_updates(&app).await, 1);
    // The purge takes rows older than 7 days, and keeps younger ones.
    deliver(&app, &text_update(778, 42, "another")).await;
    clock.advance(Duration::from_secs(7 * 24 * 3600 + 1));
    deliver(&app, &text_update(779, 42, "a fresh one")).await;
    Purger::new(
        app.handle.store.clone(),
        clock.clone(),
        Duration::from_secs(30 * 24 * 3600),
        Duration::from_secs(3600),
    )
    .purge_now()
    .await
    .expect("purge");
    assert_eq!(
        stored_updates(&app).await,
        1,
        "only the update of the last 7 days is kept"
    );
}

on_both_backends!(
    one_update_delivered_five_times_concurrently_is_one_event,
    only_the_secret_gets_in_and_bad_bodies_store_nothing,
    stop_opts_the_chat_out_and_start_back_in,
    stop_opts_the_chat_out_for_every_tenant,
    an_id_seen_8_days_ago_is_a_new_update,
);
