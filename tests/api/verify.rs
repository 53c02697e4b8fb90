//! Verifications (one-time codes), on both backends: the lifecycle, the
//! limits on checks and resends, idempotency, secrecy of the code, and the
//! SMS-pumping defence shared between instances.

use std::time::{Duration, Instant};

use reqwest::Method;
use sendonce::clock::Clock;
use sendonce::ratelimit::Rate;
use serde_json::{Value, json};
use testkit::mock_provider::MockProvider;

use crate::helpers::*;

const TO: &str = "+14155550100";

fn manual_clock() -> Clock {
    Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC))
}

async fn app_with(backend: Backend, clock: Clock) -> TestApp {
    spawn_with(TestOptions {
        backend,
        clock,
        ..TestOptions::default()
    })
    .await
}

async fn call(app: &TestApp, path: &str, key: Option<&str>, body: Option<Value>) -> Answer {
    let mut req = app.request(Method::POST, path).bearer_auth(&app.api_key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    answer(req.send().await.expect("POST")).await
}

async fn start_with(app: &TestApp, key: &str, body: Value) -> Answer {
    call(app, "/verifications", Some(key), Some(body)).await
}

/// Starts a verification to `to`; returns its resource.
async fn start(app: &TestApp, key: &str, to: &str) -> Value {
    let a = start_with(app, key, json!({ "to": to })).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()
}

async fn check(app: &TestApp, id: &str, code: &str, key: Option<&str>) -> Answer {
    call(
        app,
        &format!("/verifications/{id}/check"),
        key,
        Some(json!({ "code": code })),
    )
    .await
}

async fn resend(app: &TestApp, id: &str, key: &str) -> Answer {
    call(app, &format!("/verifications/{id}/resend"), Some(key), None).await
}

/// The bodies of the messages the provider received for `to`, in order
/// (a repeated call under one idempotency key is one message: the provider
/// de-duplicates it).
fn bodies_to(app: &TestApp, to: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    app.mock
        .calls()
        .into_iter()
        .filter(|c| c.body["to"] == to)
        .filter(|c| seen.insert(c.idempotency_key.clone()))
        .filter_map(|c| c.body["body"].as_str().map(str::to_string))
        .collect()
}

/// Waits until the verification's `n`th message is final (before a test
/// moves the clock past its lease).
async fn wait_sent(app: &TestApp, id: &str, n: usize) {
    eventually(&format!("message {n} of {id} to be sent"), || async {
        let v = app.get(&format!("/verifications/{id}")).await.json();
        (v["messages"][n - 1]["status"] == "sent").then_some(())
    })
    .await;
}

/// The code in the `n`th SMS (from 1) to `to`, once it has been sent.
async fn code_sent(app: &TestApp, to: &str, n: usize) -> String {
    let body = eventually(&format!("SMS {n} to {to}"), || async {
        bodies_to(app, to).get(n - 1).cloned()
    })
    .await;
    body.chars().filter(char::is_ascii_digit).collect()
}

/// A code that is not `code` (same length).
fn wrong(code: &str) -> String {
    code.chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect()
}

/// This instance's count of a verification event for US numbers.
async fn events(app: &TestApp, event: &str) -> u64 {
    let text = app.get("/metrics").await;
    let text = String::from_utf8_lossy(&text.bytes).into_owned();
    let series = format!("sendonce_verify_events_total{{event=\"{event}\",country=\"US\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

async fn approval_answers_valid_once_and_never_shows_the_code(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let a = start_with(&app, "v-1", json!({ "to": TO })).await;
    assert_eq!(a.status, 201);
    let v = a.json();
    let id = id_of(&v);
    assert!(id.starts_with("ver_"));
    assert_eq!(
        a.header("location"),
        Some(format!("/verifications/{id}").as_str())
    );
    assert_eq!(v["status"], "pending");
    assert_eq!(v["to"], TO);
    assert_eq!(v["sends"], 1);
    assert_eq!(v["checks_remaining"], 5);
    assert!(v["approved_at"].is_null());
    assert!(v["resend_available_at"].is_string());
    assert!(v.get("code").is_none() && v.get("valid").is_none());
    assert_eq!(v["messages"][0]["body"], "Your verification code is ******");
    let code = code_sent(&app, TO, 1).await;
    assert_eq!(code.len(), 6);
    assert!(!String::from_utf8_lossy(&a.bytes).contains(&code));

    let bad = check(&app, &id, &wrong(&code), None).await;
    assert_eq!(bad.status, 200);
    assert_eq!(bad.json()["valid"], false);
    assert_eq!(bad.json()["status"], "pending");
    assert_eq!(bad.json()["checks_remaining"], 4);

    let good = check(&app, &id, &code, None).await;
    assert_eq!(good.status, 200);
    let g = good.json();
    assert_eq!(g["valid"], true);
    assert_eq!(g["status"], "approved");
    assert!(g["approved_at"].is_string());
    assert!(g["resend_available_at"].is_null());

    let again = check(&app, &id, &code, None).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.slug(), "verification-not-pending");
    for (event, n) in [("start", 1), ("send", 1), ("check", 2), ("approval", 1)] {
        assert_eq!(events(&app, event).await, n, "{event}");
    }

    // The provider saw the SMS before the send's final write: wait for it.
    wait_sent(&app, &id, 1).await;
    let got = app.get(&format!("/verifications/{id}")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["status"], "approved");
    assert_eq!(got.json()["messages"][0]["status"], "sent");
    assert!(got.json().get("valid").is_none());
    // The message itself, under its derived key, shows no code either.
    let key = got.json()["messages"][0]["idempotency_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(key, format!("{id}:send:1"));
    let msg = app.get(&format!("/messages/{key}")).await;
    assert_eq!(msg.status, 200);
    assert!(!String::from_utf8_lossy(&msg.bytes).contains(&code));
    assert_eq!(msg.json()["metadata"]["verification_id"], id.as_str());

    // A custom template and length.
    let a = start_with(
        &app,
        "v-2",
        json!({ "to": "+14155550101", "code_length": 8, "template": "{code} is your Acme code" }),
    )
    .await;
    assert_eq!(a.status, 201);
    assert_eq!(
        a.json()["messages"][0]["body"],
        "******** is your Acme code"
    );
    let body = eventually("the templated SMS", || async {
        bodies_to(&app, "+14155550101").first().cloned()
    })
    .await;
    assert!(
        body.ends_with(" is your Acme code") && body.len() == 8 + 18,
        "{body}"
    );
}

async fn wrong_codes_to_the_limit_refuse_even_the_right_one(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    for left in (1..=4).rev() {
        let a = check(&app, &id, &wrong(&code), None).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["checks_remaining"], left);
        assert_eq!(a.json()["status"], "pending");
    }
    let fifth = check(&app, &id, &wrong(&code), None).await;
    assert_eq!(fifth.status, 200);
    assert_eq!(fifth.json()["valid"], false);
    assert_eq!(fifth.json()["status"], "max_attempts_reached");
    assert_eq!(fifth.json()["checks_remaining"], 0);
    assert_eq!(events(&app, "max_attempts").await, 1);
    assert_eq!(events(&app, "approval").await, 0);
    let right = check(&app, &id, &code, None).await;
    assert_eq!(right.status, 409);
    assert_eq!(right.slug(), "verification-not-pending");
    let r = resend(&app, &id, "r1").await;
    assert_eq!(r.slug(), "verification-not-pending");
    // Bad input changes nothing.
    let id2 = id_of(&start(&app, "v2", "+14155550101").await);
    for body in [
        json!({ "code": "12ab56" }),
        json!({ "code": 123456 }),
        json!({}),
    ] {
        let a = call(
            &app,
            &format!("/verifications/{id2}/check"),
            None,
            Some(body),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.slug(), "validation");
    }
    let got = app.get(&format!("/verifications/{id2}")).await;
    assert_eq!(got.json()["checks_remaining"], 5);
}

async fn expiry_under_a_moved_clock(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let a = start_with(&app, "v", json!({ "to": TO, "ttl_seconds": 60 })).await;
    assert_eq!(a.status, 201);
    let id = id_of(&a.json());
    let code = code_sent(&app, TO, 1).await;
    wait_sent(&app, &id, 1).await;
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        app.get(&format!("/verifications/{id}")).await.json()["status"],
        "pending"
    );
    clock.advance(Duration::from_secs(1));
    let got = app.get(&format!("/verifications/{id}")).await;
    assert_eq!(got.json()["status"], "expired");
    assert!(got.json()["resend_available_at"].is_null());
    let late = check(&app, &id, &code, None).await;
    assert_eq!(late.status, 409);
    assert_eq!(late.slug(), "verification-not-pending");
    assert_eq!(resend(&app, &id, "r").await.status, 409);
    assert_eq!(events(&app, "expiry").await, 1);
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM verifications WHERE status = 'expired'")
            .await,
        1
    );
}

/// Nobody checks or resends: the sweep expires it on its own once its time
/// has run out (and not before), with its `verification.expired` event in
/// the feed.
async fn an_unchecked_verification_expires_on_its_own(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let a = start_with(&app, "v", json!({ "to": TO, "ttl_seconds": 60 })).await;
    let id = id_of(&a.json());
    wait_sent(&app, &id, 1).await;
    let expired = "SELECT count(*) FROM verifications WHERE status = 'expired'";
    clock.advance(Duration::from_secs(59));
    // The sweep runs every 50 ms here: let several pass at 59 s.
    let pending_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < pending_until {
        assert_eq!(app.db.count(expired).await, 0, "expired before its time");
        tokio::task::yield_now().await;
    }
    clock.advance(Duration::from_secs(1));
    eventually("the sweep expires it", || async {
        (app.db.count(expired).await == 1).then_some(())
    })
    .await;
    let event = eventually("its event in the feed", || async {
        let feed = app.get("/events").await.json();
        feed["data"].as_array().and_then(|d| {
            d.iter()
                .find(|e| e["type"] == "verification.expired")
                .cloned()
        })
    })
    .await;
    assert_eq!(event["data"]["id"], id.as_str());
    assert_eq!(event["data"]["status"], "expired");
    assert_eq!(events(&app, "expiry").await, 1);
    // A late check finds it expired and changes nothing.
    assert_eq!(check(&app, &id, "000000", None).await.status, 409);
    assert_eq!(events(&app, "expiry").await, 1);
}

async fn resend_cooldown_and_limit_keep_the_code_and_the_counter(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    wait_sent(&app, &id, 1).await;
    // Two wrong checks before any resend.
    for _ in 0..2 {
        check(&app, &id, &wrong(&code), None).await;
    }
    clock.advance(Duration::from_secs(10));
    let early = resend(&app, &id, "r-early").await;
    assert_eq!(early.status, 429);
    assert_eq!(early.slug(), "resend-too-soon");
    assert_eq!(early.header("retry-after"), Some("20"));
    for n in 2..=5 {
        clock.advance(Duration::from_secs(30));
        let r = resend(&app, &id, &format!("r{n}")).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.bytes));
        let v = r.json();
        assert_eq!(v["sends"], n);
        assert_eq!(v["messages"].as_array().unwrap().len(), n as usize);
        // A resend never resets the check counter.
        assert_eq!(v["checks_remaining"], 3);
        assert_eq!(code_sent(&app, TO, n as usize).await, code, "the same code");
        wait_sent(&app, &id, n as usize).await;
    }
    clock.advance(Duration::from_secs(30));
    let over = resend(&app, &id, "r6").await;
    assert_eq!(over.status, 429);
    assert_eq!(over.slug(), "max-sends-reached");
    assert_eq!(events(&app, "send").await, 5);
    assert_eq!(bodies_to(&app, TO).len(), 5);
    // The code still works, with the counter where the wrong checks left it.
    let ok = check(&app, &id, &code, None).await;
    assert_eq!(ok.json()["valid"], true);
    assert_eq!(ok.json()["checks_remaining"], 3);
}

async fn cancel_ends_it(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    let path = format!("/verifications/{id}/cancel");
    let c = call(&app, &path, None, None).await;
    assert_eq!(c.status, 200);
    assert_eq!(c.json()["status"], "canceled");
    assert_eq!(call(&app, &path, None, None).await.status, 200);
    let late = check(&app, &id, &code, None).await;
    assert_eq!(late.slug(), "verification-not-pending");
    // An approved one cannot be canceled.
    let id2 = id_of(&start(&app, "v2", "+14155550101").await);
    let code2 = code_sent(&app, "+14155550101", 1).await;
    assert_eq!(check(&app, &id2, &code2, None).await.json()["valid"], true);
    let c = call(&app, &format!("/verifications/{id2}/cancel"), None, None).await;
    assert_eq!(c.status, 409);
    assert_eq!(c.slug(), "verification-not-pending");
}

async fn another_tenants_verification_is_not_found(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let other = spawn_with(TestOptions {
        backend,
        database: Some(app.database.clone()),
        mock: Some((app.mock.clone(), app.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    assert_eq!(other.get(&format!("/verifications/{id}")).await.status, 404);
    assert_eq!(check(&other, &id, &code, None).await.status, 404);
    assert_eq!(resend(&other, &id, "r").await.status, 404);
    let c = call(&other, &format!("/verifications/{id}/cancel"), None, None).await;
    assert_eq!(c.status, 404);
    // The same key is the other tenant's own.
    let mine = start(&other, "v", TO).await;
    assert_ne!(id_of(&mine), id);
    for path in ["/verifications/nope", "/verifications/ver_123"] {
        assert_eq!(app.get(path).await.status, 404);
    }
    assert_eq!(
        app.get(&format!("/verifications/{id}")).await.json()["status"],
        "pending"
    );
}

async fn start_check_and_resend_are_idempotent(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let first = start_with(&app, "k", json!({ "to": TO })).await;
    let id = id_of(&first.json());
    let again = start_with(&app, "k", json!({ "to": TO })).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(id_of(&again.json()), id);
    let other = start_with(&app, "k", json!({ "to": TO, "code_length": 8 })).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.slug(), "idempotency-key-reused");
    let missing = call(&app, "/verifications", None, Some(json!({ "to": TO }))).await;
    assert_eq!(missing.slug(), "missing-idempotency-key");
    let code = code_sent(&app, TO, 1).await;
    wait_sent(&app, &id, 1).await;

    // A retried check replays its first answer and counts once.
    let c1 = check(&app, &id, &wrong(&code), Some("c1")).await;
    let c2 = check(&app, &id, &wrong(&code), Some("c1")).await;
    assert_eq!(c1.json()["checks_remaining"], 4);
    assert_eq!(c2.bytes, c1.bytes);
    assert_eq!(c2.header("idempotent-replayed"), Some("true"));
    let reused = check(&app, &id, &code, Some("c1")).await;
    assert_eq!(reused.status, 422);
    let g = app.get(&format!("/verifications/{id}")).await;
    assert_eq!(g.json()["checks_remaining"], 4);

    // A retried resend sends once.
    clock.advance(Duration::from_secs(30));
    let r1 = resend(&app, &id, "r1").await;
    assert_eq!(r1.status, 201);
    let r2 = resend(&app, &id, "r1").await;
    assert_eq!(r2.status, 201);
    assert_eq!(r2.bytes, r1.bytes);
    assert_eq!(r2.header("idempotent-replayed"), Some("true"));
    assert_eq!(code_sent(&app, TO, 2).await, code);
    wait_sent(&app, &id, 2).await;
    assert_eq!(resend(&app, &id, "").await.status, 400);

    // The approving check, retried, is still the one that approved.
    let a1 = check(&app, &id, &code, Some("c2")).await;
    let a2 = check(&app, &id, &code, Some("c2")).await;
    assert_eq!(a1.json()["valid"], true);
    assert_eq!(a2.bytes, a1.bytes);
    assert_eq!(bodies_to(&app, TO).len(), 2);
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 1);
}

async fn retried_starts_never_send_a_second_code(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let answers = futures_join(&app, 8).await;
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
            id_of(&a.json())
        })
        .collect();
    assert_eq!(ids.len(), 1);
    code_sent(&app, TO, 1).await;
    // Give a second send every chance to show: wait for the one message to
    // be final, then count.
    let id = ids.into_iter().next().unwrap();
    eventually("the send to be final", || async {
        let v = app.get(&format!("/verifications/{id}")).await.json();
        (v["messages"][0]["status"] == "sent").then_some(())
    })
    .await;
    assert_eq!(bodies_to(&app, TO).len(), 1);
    assert_eq!(app.message_count().await, 1);
}

async fn racing_starts_with_one_key_and_two_bodies_answer_201_or_422(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        // Two destinations in two prefixes: two different prefix locks.
        let to = if i % 2 == 0 { TO } else { "+442079460958" };
        let req = app
            .request(Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "raced")
            .json(&json!({ "to": to }));
        set.spawn(async move { answer(req.send().await.expect("POST")).await });
    }
    let answers = set.join_all().await;
    let mut statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    statuses.sort_unstable();
    assert!(
        statuses.iter().all(|s| [201, 422].contains(s)),
        "{statuses:?}"
    );
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 1);
    assert_eq!(app.message_count().await, 1);
}

/// Concurrent checks and resends each decide from the row they read and
/// write only if it is still so (the others read again): every wrong check
/// counts once, and one resend per cooldown goes out.
async fn racing_checks_and_resends_each_count_once(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    wait_sent(&app, &id, 1).await;
    clock.advance(Duration::from_secs(30));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..6 {
        let (path, body) = if i < 4 {
            (format!("/verifications/{id}/resend"), None)
        } else {
            (
                format!("/verifications/{id}/check"),
                Some(json!({ "code": wrong(&code) })),
            )
        };
        let mut req = app
            .request(Method::POST, &path)
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", format!("k{i}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        set.spawn(async move { (i, answer(req.send().await.expect("POST")).await) });
    }
    let mut resends = Vec::new();
    let mut checks = Vec::new();
    for (i, a) in set.join_all().await {
        if i < 4 {
            resends.push(a.status);
        } else {
            assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
            checks.push(a.json()["checks_remaining"].as_u64().expect("a count"));
        }
    }
    resends.sort_unstable();
    assert_eq!(resends, [201, 429, 429, 429], "one resend per cooldown");
    checks.sort_unstable();
    assert_eq!(checks, [3, 4], "each wrong check counted once");
    let v = app.get(&format!("/verifications/{id}")).await.json();
    assert_eq!(
        (v["sends"].as_u64(), v["checks_remaining"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(app.message_count().await, 2);
    assert_eq!(events(&app, "send").await, 2);
}

async fn futures_join(app: &TestApp, n: usize) -> Vec<Answer> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let req = app
            .request(Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "same")
            .json(&json!({ "to": TO }));
        set.spawn(async move { answer(req.send().await.expect("POST")).await });
    }
    set.join_all().await
}

/// Everything the database holds for the verification flow, as text.
async fn database_text(app: &TestApp) -> Vec<u8> {
    match &app.db {
        Db::Pg(pool) => {
            let mut all = Vec::new();
            for table in [
                "verifications",
                "verification_ops",
                "messages",
                "attempts",
                "verify_secrets",
            ] {
                let text: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT string_agg(t::text, '|') FROM {table} t"
                )))
                .fetch_one(pool)
                .await
                .expect("dump");
                all.extend(text.unwrap_or_default().into_bytes());
            }
            all
        }
        Db::Sqlite(pool) => {
            // The file itself, and its write-ahead log: every byte on disk.
            sqlx::query("PRAGMA wal_checkpoint(FULL)")
                .execute(pool)
                .await
                .expect("checkpoint");
            let path = app.database.trim_start_matches("sqlite://").to_string();
            let mut all = std::fs::read(&path).expect("db file");
            if let Ok(wal) = std::fs::read(format!("{path}-wal")) {
                all.extend(wal);
            }
            all
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn the_code_is_in_no_answer_or_database_row(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let mut answers: Vec<u8> = Vec::new();
    // Ten digits: no chance of meeting them by accident in ids or hex.
    let a = start_with(&app, "v", json!({ "to": TO, "code_length": 10 })).await;
    answers.extend(&a.bytes);
    let id = id_of(&a.json());
    let code = code_sent(&app, TO, 1).await;
    assert_eq!(code.len(), 10);
    wait_sent(&app, &id, 1).await;
    clock.advance(Duration::from_secs(30));
    let r = resend(&app, &id, "r").await;
    assert_eq!(r.status, 201);
    answers.extend(&r.bytes);
    assert_eq!(code_sent(&app, TO, 2).await, code);
    wait_sent(&app, &id, 2).await;
    for key in [Some("c"), None] {
        answers.extend(check(&app, &id, &wrong(&code), key).await.bytes);
    }
    let ok = check(&app, &id, &code, Some("ok")).await;
    assert_eq!(ok.json()["valid"], true);
    answers.extend(&ok.bytes);
    for path in [
        format!("/verifications/{id}"),
        format!("/messages/{id}:send:1"),
        format!("/messages/{id}:send:1/attempts"),
        format!("/messages/{id}:send:2"),
    ] {
        let a = app.get(&path).await;
        assert_eq!(a.status, 200, "{path}");
        answers.extend(a.bytes);
    }
    let metrics = app.get("/metrics").await;
    answers.extend(metrics.bytes);
    assert!(!contains(&answers, &code), "the code in an API answer");
    let db = database_text(&app).await;
    assert!(contains(&db, &id[4..]) || backend == Backend::Sqlite);
    assert!(!contains(&db, &code), "the code in the database");
}

/// The real binary, logging at `trace` (every level), through one
/// verification: start, resend, a wrong and a right check. Not one line
/// holds the code.
async fn the_code_is_in_no_log_line_at_any_level(backend: Backend) {
    let database = fresh_database_on(backend).await;
    let (mock, mock_url, _) = MockProvider::start().await.expect("mock");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let key = "so_verify-log-key-aaaaaaaaaaaaaaaaaaaaaa";
    sendonce::install_crypto_provider();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sendonce"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &database)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_BOOTSTRAP_API_KEY", key)
        .env("SENDONCE_PROVIDER", "http")
        .env("SENDONCE_HTTP_PROVIDER_URL", &mock_url)
        .env("SENDONCE_VERIFY_RESEND_COOLDOWN", "0s")
        .env("RUST_LOG", "trace")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sendonce");
    // Read the logs while the server runs: at trace level they outgrow a
    // pipe's buffer, and a server blocked on writing a log line answers
    // nothing.
    let drain = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| {
        tokio::spawn(async move {
            let mut out = Vec::new();
            if let Some(mut p) = pipe {
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut p, &mut out).await;
            }
            out
        })
    };
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually("the server", || async {
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status() == 200)
            .map(|_| ())
    })
    .await;
    let post = |path: String, idem: Option<&'static str>, body: Option<Value>| {
        let mut req = client.post(format!("{base}{path}")).bearer_auth(key);
        if let Some(k) = idem {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move { answer(req.send().await.expect("POST")).await }
    };
    let a = post(
        "/verifications".into(),
        Some("log-1"),
        Some(json!({ "to": TO, "code_length": 10 })),
    )
    .await;
    assert_eq!(a.status, 201);
    let id = id_of(&a.json());
    let sent = |n: usize| {
        let mock = mock.clone();
        async move {
            eventually("an SMS", || async {
                let calls = mock.calls();
                calls
                    .get(n)
                    .and_then(|c| c.body["body"].as_str())
                    .map(|b| b.chars().filter(char::is_ascii_digit).collect::<String>())
            })
            .await
        }
    };
    let code = sent(0).await;
    assert_eq!(code.len(), 10);
    let r = post(format!("/verifications/{id}/resend"), Some("log-r"), None).await;
    assert_eq!(r.status, 201);
    assert_eq!(sent(1).await, code);
    let w = post(
        format!("/verifications/{id}/check"),
        Some("log-c"),
        Some(json!({ "code": wrong(&code) })),
    )
    .await;
    assert_eq!(w.json()["valid"], false);
    let ok = post(
        format!("/verifications/{id}/check"),
        None,
        Some(json!({ "code": code })),
    )
    .await;
    assert_eq!(ok.json()["valid"], true);
    let pid = child.id().expect("pid").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exit in time")
        .expect("exit status");
    let mut logs = stderr.await.expect("stderr");
    logs.extend(stdout.await.expect("stdout"));
    let text = String::from_utf8_lossy(&logs);
    // The logs are there, down to the store's debug spans...
    assert!(text.contains("store.check_verification"), "{text}");
    assert!(text.contains("TRACE"), "{text}");
    // ...and the code is in none of them.
    assert!(!contains(&logs, &code), "the code in a log line");
}

async fn limits_are_shared_between_instances(backend: Backend) {
    let mut settings = test_settings();
    settings.limits.rates.number = Rate {
        capacity: 2,
        per: Duration::from_secs(3600),
    };
    let a = spawn_with(TestOptions {
        backend,
        settings: settings.clone(),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        backend,
        settings,
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        api_key: Some(a.api_key.clone()),
        ..TestOptions::default()
    })
    .await;
    start(&a, "1", TO).await;
    start(&b, "2", TO).await;
    for app in [&a, &b] {
        let refused = start_with(app, "3", json!({ "to": TO })).await;
        assert_eq!(refused.status, 429);
        assert_eq!(refused.slug(), "rate-limited");
        let secs: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((3500..=3600).contains(&secs), "{secs}");
    }
    // A replay is not a new start, and another number has its own count.
    assert_eq!(start_with(&b, "1", json!({ "to": TO })).await.status, 201);
    start(&b, "4", "+14155550101").await;
    assert_eq!(a.db.count("SELECT count(*) FROM verifications").await, 3);
}

/// An instance dies mid-send; another, which never saw the code, resends the
/// sealed message after the lease: same code, same message, one SMS.
async fn a_rescuer_resends_the_sealed_code_after_a_crash(backend: Backend) {
    let clock = manual_clock();
    let mut quiet = test_settings();
    quiet.scheduler.poll_interval = Duration::from_secs(3600);
    // Leases run on the database's clock: a short one really runs out (and
    // a call never starts under less than the provider timeout plus 1 s).
    quiet.delivery.lease = Duration::from_secs(3);
    quiet.delivery.provider_timeout = Duration::from_millis(500);
    let mut a = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: quiet.clone(),
        provider_timeout: Duration::from_millis(500),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: quiet,
        provider_timeout: Duration::from_millis(500),
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        api_key: Some(a.api_key.clone()),
        ..TestOptions::default()
    })
    .await;
    a.mock.push([testkit::mock_provider::Behaviour::Hang]);
    let id = id_of(&start(&a, "v", TO).await);
    let code = code_sent(&a, TO, 1).await;
    a.crash().await;
    assert_eq!(b.claim_within(Duration::from_secs(15)).await, 1);
    wait_sent(&b, &id, 1).await;
    let calls = a.mock.calls();
    assert_eq!(calls.len(), 2, "resent by the rescuer");
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    assert_eq!(
        calls[1].body["body"], calls[0].body["body"],
        "the same code"
    );
    let ok = check(&b, &id, &code, None).await;
    assert_eq!(ok.json()["valid"], true);
}

async fn the_country_allow_list_applies(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let gb = vec!["GB".to_string()];
    assert!(
        app.handle
            .store
            .set_allowed_countries(&app.tenant, Some(&gb))
            .await
            .expect("allow-list")
    );
    let refused = start_with(&app, "us", json!({ "to": TO })).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.slug(), "validation");
    assert_eq!(refused.json()["errors"][0]["field"], "to");
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 0);
    start(&app, "gb", "+442079460958").await;
}

async fn a_prefix_with_few_approvals_is_paused(backend: Backend) {
    let clock = manual_clock();
    let mut settings = test_settings();
    settings.verify.pause_min_starts = 3;
    settings.verify.pause_min_approval_percent = 50;
    settings.verify.pause_duration = Duration::from_secs(600);
    let app = spawn_with(TestOptions {
        backend,
        settings: settings.clone(),
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    let other = spawn_with(TestOptions {
        backend,
        settings,
        clock: clock.clone(),
        database: Some(app.database.clone()),
        mock: Some((app.mock.clone(), app.mock_url.clone())),
        api_key: Some(app.api_key.clone()),
        ..TestOptions::default()
    })
    .await;
    // One approved, three left to expire: 25 % approved.
    let id = id_of(&start(&app, "ok", "+14155550100").await);
    let code = code_sent(&app, "+14155550100", 1).await;
    assert_eq!(check(&app, &id, &code, None).await.json()["valid"], true);
    let mut ids = vec![id];
    for (i, to) in ["+14155550101", "+14155550102", "+14155550123"]
        .iter()
        .enumerate()
    {
        let a = start_with(
            &app,
            &format!("x{i}"),
            json!({ "to": to, "ttl_seconds": 30 }),
        )
        .await;
        assert_eq!(a.status, 201);
        ids.push(id_of(&a.json()));
    }
    // Still pending: not judged yet.
    ids.push(id_of(&start(&app, "y", "+14155550199").await));
    for id in &ids {
        wait_sent(&app, id, 1).await;
    }
    clock.advance(Duration::from_secs(31));
    // Judged on the other instance: the state is in the store.
    let paused = start_with(&other, "z", json!({ "to": "+14155559999" })).await;
    assert_eq!(paused.status, 429);
    assert_eq!(paused.slug(), "destination-paused");
    assert_eq!(paused.header("retry-after"), Some("600"));
    let again = start_with(&app, "z2", json!({ "to": "+14155550000" })).await;
    assert_eq!(again.slug(), "destination-paused");
    // Another prefix is not paused; an existing key still replays.
    start(&app, "gb", "+442079460958").await;
    assert_eq!(
        start_with(&app, "ok", json!({ "to": "+14155550100" }))
            .await
            .status,
        201
    );
    let text = other.get("/metrics").await;
    assert!(
        String::from_utf8_lossy(&text.bytes)
            .contains("sendonce_verify_events_total{event=\"pause\",country=\"US\"} 1"),
        "{}",
        String::from_utf8_lossy(&text.bytes)
    );
    // The pause ends; the starts that caused it are not judged again.
    clock.advance(Duration::from_secs(600));
    assert_eq!(
        start_with(&app, "after", json!({ "to": TO })).await.status,
        201
    );
}

async fn retention_purges_verifications_and_frees_their_keys(backend: Backend) {
    let clock = manual_clock();
    let app = app_with(backend, clock.clone()).await;
    let id = id_of(&start(&app, "v", TO).await);
    let code = code_sent(&app, TO, 1).await;
    wait_sent(&app, &id, 1).await;
    assert_eq!(
        check(&app, &id, &code, Some("c")).await.json()["valid"],
        true
    );
    let purger = sendonce::delivery::Purger::new(
        app.handle.store.clone(),
        clock.clone(),
        Duration::from_secs(30 * 86_400),
        Duration::from_secs(3600),
    );
    purger.purge_now().await.expect("purge");
    assert_eq!(app.get(&format!("/verifications/{id}")).await.status, 200);
    clock.advance(Duration::from_secs(31 * 86_400));
    purger.purge_now().await.expect("purge");
    assert_eq!(app.get(&format!("/verifications/{id}")).await.status, 404);
    assert_eq!(
        app.db.count("SELECT count(*) FROM verification_ops").await,
        0
    );
    assert_eq!(app.message_count().await, 0);
    // The key is free: a new verification, a new code.
    let again = start(&app, "v", TO).await;
    assert_ne!(id_of(&again), id);
}

on_both_backends!(
    retention_purges_verifications_and_frees_their_keys,
    approval_answers_valid_once_and_never_shows_the_code,
    wrong_codes_to_the_limit_refuse_even_the_right_one,
    expiry_under_a_moved_clock,
    an_unchecked_verification_expires_on_its_own,
    resend_cooldown_and_limit_keep_the_code_and_the_counter,
    cancel_ends_it,
    another_tenants_verification_is_not_found,
    start_check_and_resend_are_idempotent,
    retried_starts_never_send_a_second_code,
    racing_starts_with_one_key_and_two_bodies_answer_201_or_422,
    racing_checks_and_resends_each_count_once,
    the_code_is_in_no_answer_or_database_row,
    the_code_is_in_no_log_line_at_any_level,
    limits_are_shared_between_instances,
    the_country_allow_list_applies,
    a_rescuer_resends_the_sealed_code_after_a_crash,
    a_prefix_with_few_approvals_is_paused,
);
