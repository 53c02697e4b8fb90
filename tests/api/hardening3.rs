//! Issue 29 (hardening III): limits that a batch or a resend walked past.
//! Each test failed on the code before its fix.

use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::ratelimit::{Limits, Rate};
use serde_json::{Value, json};

use crate::helpers::*;

fn limited(limits: Limits) -> (TestOptions, Clock) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let mut settings = test_settings();
    settings.limits.rates = limits;
    settings.verify.resend_cooldown = Duration::from_secs(30);
    (
        TestOptions {
            settings,
            clock: clock.clone(),
            ..TestOptions::default()
        },
        clock,
    )
}

async fn post(app: &TestApp, path: &str, key: Option<&str>, body: Option<Value>) -> Answer {
    let mut req = app
        .request(reqwest::Method::POST, path)
        .bearer_auth(&app.api_key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    answer(req.send().await.expect("POST")).await
}

/// Finding 4: a batch counted once against the tenant's request rate, so at
/// 1 request a second 3,000 messages went in in 3 s. Each item is a request
/// now: the items past the rate get 429 (with the wait in the problem, as a
/// batch item has no header of its own) and nothing of them is stored.
async fn a_batch_counts_each_item_against_the_tenant_rate(backend: Backend) {
    let (opts, _clock) = limited(Limits {
        tenant: Rate {
            capacity: 3,
            per: Duration::from_secs(3),
        },
        ..Limits::NONE
    });
    let app = spawn_with(TestOptions { backend, ..opts }).await;
    let items: Vec<Value> = (0..5)
        .map(|i| {
            json!({
                "idempotency_key": format!("ITEM-{i}"),
                "to": format!("+1415555010{i}"),
                "body": "your order shipped",
            })
        })
        .collect();
    let r = post(
        &app,
        "/messages/batch",
        None,
        Some(json!({ "messages": items })),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    let results = r.json()["results"].as_array().expect("results").clone();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [202, 202, 202, 429, 429]);
    for refused in &results[3..] {
        assert_eq!(
            refused["problem"]["type"],
            "urn:sendonce:problem:rate-limited"
        );
        assert!(refused["problem"]["retry_after"].as_u64().unwrap() >= 1);
        assert!(
            refused["idempotency_key"]
                .as_str()
                .unwrap()
                .starts_with("ITEM-")
        );
    }
    assert_eq!(app.db.count("SELECT count(*) FROM messages").await, 3);
    // The batch used the rate up: the next request waits like any other.
    let next = app.post("AFTER", &sms("+14155550200", "x")).await;
    assert_eq!(next.status, 429);
}

/// Finding 3: resends walked past the per-number limit (50 SMS to one
/// number in 2.5 minutes at the default 10 an hour). Every SMS of a
/// verification, start or resend, now takes a permit from the same
/// per-number bucket as `POST /messages`; a retried resend already answered
/// is still a replay, and a refused one sends nothing.
async fn resends_count_against_the_destination_limits(backend: Backend) {
    let (opts, clock) = limited(Limits {
        number: Rate {
            capacity: 3,
            per: Duration::from_secs(3600),
        },
        ..Limits::NONE
    });
    let app = spawn_with(TestOptions { backend, ..opts }).await;
    let to = "+14155550100";
    let started = post(
        &app,
        "/verifications",
        Some("v1"),
        Some(json!({ "to": to })),
    )
    .await;
    assert_eq!(
        started.status,
        201,
        "{}",
        String::from_utf8_lossy(&started.bytes)
    );
    let id = started.json()["id"].as_str().unwrap().to_string();
    let resend = |key: &'static str| {
        let path = format!("/verifications/{id}/resend");
        let app = &app;
        async move { post(app, &path, Some(key), None).await }
    };
    for key in ["r1", "r2"] {
        clock.advance(Duration::from_secs(31));
        let r = resend(key).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.bytes));
    }
    clock.advance(Duration::from_secs(31));
    let refused = resend("r3").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.slug(), "rate-limited");
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("destination number")
    );
    // A retry of an answered resend is a replay, limit or not.
    let replay = resend("r2").await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    // A POST /messages to the number shares the bucket; so does a new start.
    assert_eq!(app.post("M", &sms(to, "hello")).await.status, 429);
    let second = post(
        &app,
        "/verifications",
        Some("v2"),
        Some(json!({ "to": to })),
    )
    .await;
    assert_eq!(second.status, 429);
    // Three SMS in all were created for the number: the start and two resends.
    let sent = within(Duration::from_secs(10), "three messages", || async {
        let n = app.mock.created_to(to);
        (n >= 3).then_some(n)
    })
    .await;
    assert_eq!(sent, 3);
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM messages WHERE to_number = '+14155550100'")
            .await,
        3
    );
}

/// Finding 7: `/verifications` and its check took duplicate JSON keys, the
/// last winning (the code went to the second `to`). Refused now, as in
/// every other body, and nothing changes.
async fn verification_bodies_refuse_duplicate_keys(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let raw = |path: String, key: &'static str, body: &'static str| {
        let app = &app;
        async move {
            let req = app
                .request(reqwest::Method::POST, &path)
                .bearer_auth(&app.api_key)
                .header("content-type", "application/json")
                .header("Idempotency-Key", key)
                .body(body);
            answer(req.send().await.expect("POST")).await
        }
    };
    let twice = raw(
        "/verifications".into(),
        "dup-start",
        r#"{"to": "+14155550100", "to": "+14155550101"}"#,
    )
    .await;
    assert_eq!(
        twice.status,
        400,
        "{}",
        String::from_utf8_lossy(&twice.bytes)
    );
    assert_eq!(twice.slug(), "validation");
    assert_eq!(twice.json()["errors"][0]["field"], "to");
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 0);
    assert_eq!(app.db.count("SELECT count(*) FROM messages").await, 0);

    let started = post(
        &app,
        "/verifications",
        Some("ok-start"),
        Some(json!({ "to": "+14155550100" })),
    )
    .await;
    assert_eq!(started.status, 201);
    let id = started.json()["id"].as_str().unwrap().to_string();
    let check = raw(
        format!("/verifications/{id}/check"),
        "dup-check",
        r#"{"code": "000000", "code": "111111"}"#,
    )
    .await;
    assert_eq!(check.status, 400);
    assert_eq!(check.slug(), "validation");
    let v = app.get(&format!("/verifications/{id}")).await.json();
    assert_eq!(v["checks_remaining"], 5, "a refused check counts nothing");
}

on_both_backends!(
    a_batch_counts_each_item_against_the_tenant_rate,
    resends_count_against_the_destination_limits,
    verification_bodies_refuse_duplicate_keys,
);
