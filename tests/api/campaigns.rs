//! Scheduled sends and cancel (issue 15), on both backends: a scheduled
//! message waits for its time under a moved clock, survives a crash, is
//! started once across three instances, and can be canceled until an
//! attempt may have reached the provider.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use serde_json::{Value, json};
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::delivery::futures_join_all;
use crate::helpers::*;

const START: time::OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00 UTC);

fn manual_clock() -> Clock {
    Clock::manual(START)
}

/// Test settings with the background scan effectively off, so the test
/// decides when a scheduler runs.
fn quiet_settings() -> sendonce::config::Settings {
    let mut s = test_settings();
    s.scheduler.poll_interval = Duration::from_secs(3600);
    s
}

async fn spawn_manual(backend: Backend) -> TestApp {
    spawn_with(TestOptions {
        backend,
        clock: manual_clock(),
        settings: quiet_settings(),
        ..TestOptions::default()
    })
    .await
}

fn sibling(first: &TestApp) -> TestOptions {
    TestOptions {
        settings: quiet_settings(),
        clock: first.clock.clone(),
        database: Some(first.database.clone()),
        mock: Some((first.mock.clone(), first.mock_url.clone())),
        api_key: Some(first.api_key.clone()),
        ..TestOptions::default()
    }
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .expect("format")
}

fn scheduled(to: &str, body: &str, at: time::OffsetDateTime) -> Value {
    json!({ "to": to, "body": body, "send_at": rfc3339(at) })
}

async fn cancel(app: &TestApp, key: &str) -> Answer {
    let req = app
        .request(reqwest::Method::POST, &format!("/messages/{key}/cancel"))
        .bearer_auth(&app.api_key);
    answer(req.send().await.expect("POST cancel")).await
}

/// Runs the scheduler once and returns how many messages it claimed.
async fn tick(app: &TestApp) -> usize {
    app.handle.scheduler.tick().await.expect("scheduler scan")
}

async fn a_scheduled_send_waits_for_its_time_and_is_sent_once(backend: Backend) {
    let app = spawn_manual(backend).await;
    let at = START + time::Duration::hours(1);
    let body = scheduled("+14155550100", "Your appointment is tomorrow", at);
    let first = app.post("REMIND-1", &body).await;
    assert_eq!(
        first.status,
        202,
        "{}",
        String::from_utf8_lossy(&first.bytes)
    );
    let m = first.json();
    assert_eq!(m["status"], "scheduled");
    assert_eq!(m["send_at"], rfc3339(at));
    assert_eq!(m["next_attempt_at"], rfc3339(at));
    assert_eq!(m["attempts"], 0);

    // The same request again: the message as it stands, marked a replay.
    let again = app.post("REMIND-1", &body).await;
    assert_eq!(again.status, 202);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["id"], m["id"]);
    // `send_at` is part of the fingerprint.
    let other = app
        .post(
            "REMIND-1",
            &scheduled(
                "+14155550100",
                "Your appointment is tomorrow",
                at + time::Duration::minutes(1),
            ),
        )
        .await;
    assert_eq!(other.status, 422);
    assert_eq!(other.slug(), "idempotency-key-reused");

    // Not due: nothing is claimed, nothing is sent.
    assert_eq!(tick(&app).await, 0);
    app.clock.advance(Duration::from_secs(59 * 60));
    assert_eq!(tick(&app).await, 0);
    assert_eq!(app.mock.call_count(), 0);
    assert_eq!(
        app.get("/messages/REMIND-1").await.json()["status"],
        "scheduled"
    );

    // Due: one instance's scheduler starts it.
    app.clock.advance(Duration::from_secs(60));
    assert_eq!(tick(&app).await, 1);
    let sent = app.wait_for_status("REMIND-1", "sent").await;
    assert_eq!(sent["attempts"], 1);
    assert_eq!(sent["send_at"], rfc3339(at));
    assert_eq!(
        app.mock
            .deliveries_to("+14155550100", "Your appointment is tomorrow"),
        1
    );
    assert_eq!(tick(&app).await, 0);
    // A replay now answers the final response.
    let replay = app.post("REMIND-1", &body).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.json()["status"], "sent");
    assert_eq!(app.mock.call_count(), 1);
}

async fn send_at_too_far_is_refused_and_a_past_one_sends_now(backend: Backend) {
    let app = spawn_manual(backend).await;
    let far = app
        .post(
            "FAR",
            &scheduled(
                "+14155550100",
                "hi",
                START + time::Duration::days(35) + time::Duration::seconds(1),
            ),
        )
        .await;
    assert_eq!(far.status, 400);
    assert_eq!(far.slug(), "validation");
    assert_eq!(far.json()["errors"][0]["field"], "send_at");
    let bad = app
        .post(
            "BAD",
            &json!({"to": "+14155550100", "body": "hi", "send_at": "2026-11-29 13:00"}),
        )
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        app.message_count().await,
        0,
        "a refused request stores nothing"
    );

    let edge = app
        .post(
            "EDGE",
            &scheduled("+14155550100", "edge", START + time::Duration::days(35)),
        )
        .await;
    assert_eq!(edge.status, 202);
    assert_eq!(edge.json()["status"], "scheduled");

    let past = app
        .post(
            "PAST",
            &scheduled("+14155550100", "late", START - time::Duration::hours(3)),
        )
        .await;
    assert_eq!(past.status, 201, "a time in the past means now");
    assert_eq!(past.json()["status"], "sent");
}

async fn scheduled_sends_survive_a_crash_and_three_instances_start_each_once(backend: Backend) {
    let mut a = spawn_manual(backend).await;
    let at = START + time::Duration::minutes(10);
    for i in 0..30 {
        let r = a
            .post(
                &format!("NIGHT-{i}"),
                &scheduled("+14155550100", &format!("notice {i}"), at),
            )
            .await;
        assert_eq!(r.status, 202);
    }
    // The instance that took them dies; the rows are the truth.
    a.crash().await;
    let b = spawn_with(sibling(&a)).await;
    let c = spawn_with(sibling(&a)).await;
    let d = spawn_with(sibling(&a)).await;
    a.clock.advance(Duration::from_secs(600));
    // Three schedulers scan at once, repeatedly, until everything is sent.
    let claimed = futures_join_all([&b, &c, &d].into_iter().map(|app| async move {
        let mut n = 0;
        for _ in 0..20 {
            n += tick(app).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        n
    }))
    .await;
    assert_eq!(
        claimed.iter().sum::<usize>(),
        30,
        "each claimed once: {claimed:?}"
    );
    for i in 0..30 {
        let m = b.wait_for_status(&format!("NIGHT-{i}"), "sent").await;
        assert_eq!(m["attempts"], 1);
        assert_eq!(
            b.mock.deliveries_to("+14155550100", &format!("notice {i}")),
            1
        );
    }
    assert_eq!(b.mock.call_count(), 30, "no message started twice");
}

async fn cancel_before_during_and_after_an_attempt(backend: Backend) {
    let app = spawn_manual(backend).await;
    let at = START + time::Duration::hours(2);

    // Before: a scheduled message.
    let body = scheduled("+14155550100", "reminder", at);
    assert_eq!(app.post("C-SCHEDULED", &body).await.status, 202);
    let canceled = cancel(&app, "C-SCHEDULED").await;
    assert_eq!(canceled.status, 200);
    assert_eq!(canceled.json()["status"], "canceled");
    assert_eq!(canceled.json()["next_attempt_at"], Value::Null);
    // A retried cancel answers the canceled message again.
    let again = cancel(&app, "C-SCHEDULED").await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["status"], "canceled");
    // Replays of the POST answer the canceled message.
    let replay = app.post("C-SCHEDULED", &body).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.bytes, canceled.bytes);
    assert_eq!(
        app.get("/messages/C-SCHEDULED").await.json()["status"],
        "canceled"
    );
    app.clock.advance(Duration::from_secs(3 * 3600));
    assert_eq!(tick(&app).await, 0, "a canceled message is never started");

    // Waiting for a retry, no attempt in flight: cancelable.
    app.mock.push([Behaviour::Fail {
        status: 503,
        body: json!({"error": "busy"}),
        retry_after: Some(120),
    }]);
    let first = app
        .post_with(
            Some("C-RETRY"),
            &json!({"to": "+14155550100", "body": "retry me"}),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(first.status, 202);
    eventually("the retry to be scheduled", || async {
        let m = app.get("/messages/C-RETRY").await.json();
        (m["next_attempt_at"].is_string()).then_some(())
    })
    .await;
    let canceled = cancel(&app, "C-RETRY").await;
    assert_eq!(canceled.status, 200);
    assert_eq!(canceled.json()["status"], "canceled");
    assert_eq!(canceled.json()["attempts"], 1);
    app.clock.advance(Duration::from_secs(300));
    assert_eq!(tick(&app).await, 0);
    assert_eq!(app.mock.call_count(), 1, "only the refused attempt");

    // During: an attempt in flight may reach the provider.
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let during = app
        .post_with(
            Some("C-DURING"),
            &json!({"to": "+14155550100", "body": "in flight"}),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(during.status, 202);
    eventually("the call to reach the provider", || async {
        (app.mock.call_count() == 2).then_some(())
    })
    .await;
    let refused = cancel(&app, "C-DURING").await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.slug(), "not-cancelable");
    gate.notify_one();
    app.wait_for_status("C-DURING", "sent").await;

    // After: final.
    let refused = cancel(&app, "C-DURING").await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.slug(), "not-cancelable");
    assert_eq!(app.get("/messages/C-DURING").await.json()["status"], "sent");

    // Unknown keys (and other tenants' keys) are not found.
    assert_eq!(cancel(&app, "NO-SUCH-KEY").await.status, 404);
}

/// Cancels race the schedulers of two instances over the same due
/// messages: each message ends either canceled and never sent, or sent once
/// and not canceled; never both.
async fn a_cancel_racing_the_scheduler_never_loses_a_send(backend: Backend) {
    let a = spawn_manual(backend).await;
    let b = spawn_with(sibling(&a)).await;
    let at = START + time::Duration::minutes(1);
    let n = 40;
    for i in 0..n {
        let r = a
            .post(
                &format!("RACE-{i}"),
                &scheduled("+14155550100", &format!("race {i}"), at),
            )
            .await;
        assert_eq!(r.status, 202);
    }
    a.clock.advance(Duration::from_secs(60));
    let cancels = futures_join_all((0..n).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        async move { (i, cancel(app, &format!("RACE-{i}")).await.status) }
    }));
    let scans = futures_join_all([&a, &b].into_iter().map(|app| async move {
        let mut claimed = 0;
        for _ in 0..10 {
            claimed += tick(app).await;
        }
        claimed
    }));
    let (cancels, _) = tokio::join!(cancels, scans);
    for (i, status) in cancels {
        let key = format!("RACE-{i}");
        let m = eventually(&format!("{key} to settle"), || async {
            let m = a.get(&format!("/messages/{key}")).await.json();
            matches!(m["status"].as_str(), Some("canceled" | "sent")).then_some(m)
        })
        .await;
        let delivered = a.mock.deliveries_to("+14155550100", &format!("race {i}"));
        match status {
            200 => {
                assert_eq!(m["status"], "canceled", "{key}");
                assert_eq!(delivered, 0, "{key} was canceled and sent");
            }
            409 => {
                assert_eq!(m["status"], "sent", "{key}");
                assert_eq!(delivered, 1, "{key}");
            }
            other => panic!("{key}: cancel answered {other}"),
        }
    }
}

async fn post_batch(app: &TestApp, body: &Value) -> Answer {
    let req = app
        .request(reqwest::Method::POST, "/messages/batch")
        .bearer_auth(&app.api_key)
        .json(body);
    answer(req.send().await.expect("POST /messages/batch")).await
}

fn item(key: &str, to: &str, body: &str) -> Value {
    json!({ "idempotency_key": key, "to": to, "body": body })
}

fn problem_slug(result: &Value) -> String {
    result["problem"]["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:sendonce:problem:"))
        .unwrap_or("")
        .to_string()
}

async fn a_batch_answers_each_item_as_its_own_post_in_order(backend: Backend) {
    let app = spawn_manual(backend).await;
    let old = app.post("OLD", &sms("+14155550100", "old")).await;
    assert_eq!(old.status, 201);
    let at = START + time::Duration::hours(1);
    let mut later = item("B-2", "+14155550101", "later");
    later["send_at"] = json!(rfc3339(at));
    let answer = post_batch(
        &app,
        &json!({ "messages": [
            item("B-1", "+14155550100", "new"),
            item("OLD", "+14155550100", "old"),
            item("OLD", "+14155550100", "not the old one"),
            item("B-BAD", "nope", "x"),
            { "to": "+14155550100", "body": "no key" },
            later,
            item("B-1", "+14155550100", "new"),
            item("B-1", "+14155550100", "another"),
            item("B-3", "+14155550100", ""),
        ]}),
    )
    .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.bytes)
    );
    let results = answer.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    let keys: Vec<&str> = results
        .iter()
        .map(|r| r["idempotency_key"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        keys,
        ["B-1", "OLD", "OLD", "B-BAD", "", "B-2", "B-1", "B-1", "B-3"]
    );
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [202, 201, 422, 400, 400, 202, 409, 422, 400]);
    assert_eq!(results[0]["message"]["status"], "processing");
    assert_eq!(
        results[1]["message"],
        old.json(),
        "a replay is the stored answer"
    );
    assert_eq!(problem_slug(&results[2]), "idempotency-key-reused");
    assert_eq!(problem_slug(&results[3]), "validation");
    assert_eq!(results[3]["problem"]["errors"][0]["field"], "to");
    assert_eq!(problem_slug(&results[4]), "missing-idempotency-key");
    assert_eq!(results[5]["message"]["status"], "scheduled");
    assert_eq!(results[5]["message"]["send_at"], rfc3339(at));
    assert_eq!(problem_slug(&results[6]), "idempotency-key-in-use");
    assert_eq!(problem_slug(&results[7]), "idempotency-key-reused");
    assert_eq!(results[8]["problem"]["errors"][0]["field"], "body");
    assert!(results[0].get("problem").is_none() && results[3].get("message").is_none());
    assert_eq!(
        app.message_count().await,
        3,
        "OLD, B-1 and B-2; nothing else stored"
    );

    // Any scheduler starts the new one; the scheduled one waits.
    assert_eq!(tick(&app).await, 1);
    let sent = app.wait_for_status("B-1", "sent").await;
    assert_eq!(sent["attempts"], 1);
    assert_eq!(app.mock.deliveries_to("+14155550100", "new"), 1);
    assert_eq!(app.get("/messages/B-2").await.json()["status"], "scheduled");

    // The same batch again: every item replays.
    let again = post_batch(
        &app,
        &json!({ "messages": [
            item("B-1", "+14155550100", "new"),
            {"idempotency_key": "B-2", "to": "+14155550101", "body": "later", "send_at": rfc3339(at)},
        ]}),
    )
    .await;
    let results = again.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    assert_eq!(results[0]["status"], 201);
    assert_eq!(results[0]["message"]["status"], "sent");
    assert_eq!(results[1]["status"], 202);
    assert_eq!(results[1]["message"]["status"], "scheduled");
    assert_eq!(app.message_count().await, 3);

    // A message whose key is `batch` is still reachable.
    assert_eq!(
        app.post("batch", &sms("+14155550100", "k")).await.status,
        201
    );
    assert_eq!(app.get("/messages/batch").await.json()["status"], "sent");
    assert_eq!(app.get("/messages/batch/attempts").await.status, 200);
    assert_eq!(cancel(&app, "batch").await.status, 409);
}

async fn a_rate_limited_batch_item_gets_429_and_the_others_go_on(backend: Backend) {
    let mut settings = quiet_settings();
    settings.limits.rates.number = sendonce::ratelimit::Rate {
        capacity: 2,
        per: Duration::from_secs(3600),
    };
    let app = spawn_with(TestOptions {
        backend,
        clock: manual_clock(),
        settings,
        ..TestOptions::default()
    })
    .await;
    let answer = post_batch(
        &app,
        &json!({ "messages": [
            item("R-1", "+14155550100", "one"),
            item("R-2", "+14155550100", "two"),
            item("R-3", "+14155550100", "three"),
            item("R-4", "+14155550199", "elsewhere"),
        ]}),
    )
    .await;
    assert_eq!(answer.status, 200);
    let results = answer.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [202, 202, 429, 202]);
    assert_eq!(problem_slug(&results[2]), "rate-limited");
    assert_eq!(app.message_count().await, 3);
    // A replay of a stored item is not a new send: no limit applies.
    let replay = post_batch(
        &app,
        &json!({ "messages": [item("R-1", "+14155550100", "one")] }),
    )
    .await;
    assert_eq!(
        replay.json()["results"][0]["status"],
        409,
        "still being sent"
    );
}

async fn oversized_batches_are_refused_whole(backend: Backend) {
    let app = spawn_manual(backend).await;
    let many: Vec<Value> = (0..1001)
        .map(|i| item(&format!("K-{i}"), "+14155550100", "hi"))
        .collect();
    let too_many = post_batch(&app, &json!({ "messages": many })).await;
    assert_eq!(too_many.status, 413);
    assert_eq!(too_many.slug(), "payload-too-large");
    let big = "x".repeat(1600);
    let heavy: Vec<Value> = (0..700)
        .map(|i| item(&format!("H-{i}"), "+14155550100", &big))
        .collect();
    let too_big = post_batch(&app, &json!({ "messages": heavy })).await;
    assert_eq!(too_big.status, 413);
    let empty = post_batch(&app, &json!({ "messages": [] })).await;
    assert_eq!(empty.status, 400);
    assert_eq!(empty.slug(), "validation");
    let not_a_list = post_batch(&app, &json!({ "messages": {"to": "+14155550100"} })).await;
    assert_eq!(not_a_list.status, 400);
    assert_eq!(app.message_count().await, 0);
}

async fn a_batch_of_a_thousand_is_written_at_once_and_each_sent_once(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let items: Vec<Value> = (0..1000)
        .map(|i| {
            item(
                &format!("IMPORT-{i:04}"),
                "+14155550100",
                &format!("order {i} confirmed"),
            )
        })
        .collect();
    let answer = post_batch(&app, &json!({ "messages": items })).await;
    assert_eq!(answer.status, 200);
    let results = answer.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    assert_eq!(results.len(), 1000);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(
            r["idempotency_key"],
            format!("IMPORT-{i:04}"),
            "request order"
        );
        assert_eq!(r["status"], 202);
    }
    // How long it takes is the benchmark's (`batch_once`, BENCHMARKS.md).
    assert_eq!(app.message_count().await, 1000);
    // Sent as fast as the machine goes (a debug build on shared cores took
    // over 10 s in CI): judged on progress, failing when it stops.
    while_progressing(
        "every message sent",
        1000,
        Duration::from_secs(15),
        || async {
            app.db
                .count("SELECT count(*) FROM messages WHERE status = 'sent'")
                .await
        },
    )
    .await;
    let stats = app.mock.stats();
    assert_eq!(stats.calls, 1000);
    assert_eq!(stats.max_deliveries_per_recipient_body, 1);
}

async fn spawn_quiet(backend: Backend, at: time::OffsetDateTime) -> TestApp {
    let app = spawn_with(TestOptions {
        backend,
        clock: Clock::manual(at),
        settings: quiet_settings(),
        ..TestOptions::default()
    })
    .await;
    let window = sendonce::domain::quiet::QuietHours::parse("21:00-08:00");
    let set = app
        .handle
        .store
        .set_quiet_hours(&app.tenant, window)
        .await
        .expect("set quiet hours");
    assert!(set);
    app
}

async fn quiet_hours_hold_messages_until_morning_where_the_recipient_is(backend: Backend) {
    // 12:00 UTC on 29 November: 21:00 in Tokyo, 07:00 in New York (EST),
    // 12:00 in London, 23:00 in Sydney and 20:00 in Perth.
    let app = spawn_quiet(backend, START).await;
    let async_ = [("prefer", "respond-async")];
    let tokyo = app
        .post_with(Some("Q-TOKYO"), &sms("+819012345678", "tokyo"), &async_)
        .await;
    let new_york = app
        .post_with(Some("Q-NY"), &sms("+12125550100", "new york"), &async_)
        .await;
    let australia = app
        .post_with(Some("Q-AU"), &sms("+61412345678", "australia"), &async_)
        .await;
    let london = app.post("Q-LONDON", &sms("+447911123456", "london")).await;
    let urgent = app
        .post(
            "Q-URGENT",
            &json!({"to": "+819012345678", "body": "urgent", "quiet_hours": false}),
        )
        .await;
    for (a, due) in [
        (&tokyo, "2026-11-29T23:00:00Z"),
        (&new_york, "2026-11-29T13:00:00Z"),
        // Region unknown from a mobile number: quiet anywhere in Australia
        // waits, so 08:00 in Perth (00:00 UTC), when Sydney is at 11:00.
        (&australia, "2026-11-30T00:00:00Z"),
    ] {
        assert_eq!(a.status, 202);
        let m = a.json();
        assert_eq!(m["status"], "scheduled");
        assert_eq!(m["next_attempt_at"], due);
        assert_eq!(m["waiting_for"], "quiet_hours");
        assert_eq!(m["send_at"], Value::Null);
    }
    assert_eq!(london.status, 201, "noon in London");
    assert_eq!(urgent.status, 201, "\"quiet_hours\": false sends at once");
    assert_eq!(
        app.get("/messages/Q-TOKYO").await.json()["waiting_for"],
        "quiet_hours",
        "GET shows why it waits"
    );

    // Each goes when its morning comes, not before.
    app.clock
        .advance(Duration::from_secs(3600) - Duration::from_secs(1));
    assert_eq!(tick(&app).await, 0);
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(tick(&app).await, 1);
    app.wait_for_status("Q-NY", "sent").await;
    app.clock.advance(Duration::from_secs(10 * 3600));
    assert_eq!(tick(&app).await, 1);
    app.wait_for_status("Q-TOKYO", "sent").await;
    assert_eq!(
        app.get("/messages/Q-AU").await.json()["status"],
        "scheduled"
    );
    app.clock.advance(Duration::from_secs(3600));
    assert_eq!(tick(&app).await, 1);
    app.wait_for_status("Q-AU", "sent").await;
    assert_eq!(app.mock.call_count(), 5);

    // A send_at inside the window waits for the window's end, and shows both.
    let at = START + time::Duration::days(1) + time::Duration::hours(2); // 23:00 Tokyo
    let late = app
        .post("Q-LATE", &scheduled("+819012345678", "late", at))
        .await;
    assert_eq!(late.status, 202);
    assert_eq!(late.json()["send_at"], rfc3339(at));
    assert_eq!(late.json()["next_attempt_at"], "2026-11-30T23:00:00Z");
    assert_eq!(late.json()["waiting_for"], "quiet_hours");
}

async fn quiet_hours_follow_new_york_across_the_march_change(backend: Backend) {
    // 06:30 UTC on 8 March 2026 is 01:30 EST, half an hour before clocks go
    // forward: the night ends at 08:00 EDT, 12:00 UTC (not 13:00).
    let app = spawn_quiet(backend, time::macros::datetime!(2026-03-08 06:30 UTC)).await;
    let a = app
        .post_with(
            Some("Q-DST"),
            &sms("+12125550100", "spring"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(a.status, 202);
    assert_eq!(a.json()["next_attempt_at"], "2026-03-08T12:00:00Z");
    // A batch item is held the same way; one with "quiet_hours": false is not.
    let batch = post_batch(
        &app,
        &json!({ "messages": [
            item("Q-B1", "+12125550100", "batched"),
            {"idempotency_key": "Q-B2", "to": "+12125550100", "body": "now", "quiet_hours": false},
        ]}),
    )
    .await;
    let results = batch.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    assert_eq!(results[0]["message"]["status"], "scheduled");
    assert_eq!(
        results[0]["message"]["next_attempt_at"],
        "2026-03-08T12:00:00Z"
    );
    assert_eq!(
        results[1]["message"]["status"], "processing",
        "{}",
        results[1]
    );
    app.clock.advance(Duration::from_secs(5 * 3600 + 30 * 60));
    assert_eq!(tick(&app).await, 3);
    app.wait_for_status("Q-DST", "sent").await;
    app.wait_for_status("Q-B1", "sent").await;
}

async fn verifications_ignore_quiet_hours(backend: Backend) {
    // 21:00 in Tokyo, inside the tenant's quiet hours: a one-time code is
    // sent at once anyway (no scheduler scan runs in this test).
    let app = spawn_quiet(backend, START).await;
    let started = app
        .request(reqwest::Method::POST, "/verifications")
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "LOGIN-1")
        .json(&json!({ "to": "+819012345678" }))
        .send()
        .await
        .expect("POST /verifications");
    assert_eq!(started.status(), 201);
    eventually("the code to reach the provider", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    let scheduled = app
        .db
        .count("SELECT count(*) FROM messages WHERE status = 'scheduled'")
        .await;
    assert_eq!(scheduled, 0);
}

on_both_backends!(
    a_scheduled_send_waits_for_its_time_and_is_sent_once,
    send_at_too_far_is_refused_and_a_past_one_sends_now,
    scheduled_sends_survive_a_crash_and_three_instances_start_each_once,
    cancel_before_during_and_after_an_attempt,
    a_cancel_racing_the_scheduler_never_loses_a_send,
    a_batch_answers_each_item_as_its_own_post_in_order,
    a_rate_limited_batch_item_gets_429_and_the_others_go_on,
    oversized_batches_are_refused_whole,
    a_batch_of_a_thousand_is_written_at_once_and_each_sent_once,
    quiet_hours_hold_messages_until_morning_where_the_recipient_is,
    quiet_hours_follow_new_york_across_the_march_change,
    verifications_ignore_quiet_hours,
);

/// The binary, SIGKILLed right after accepting scheduled sends and a batch:
/// a second process on the same database sends every one of them, once.
#[tokio::test]
async fn scheduled_sends_and_a_batch_survive_a_sigkill() {
    use crate::process::start_server;
    let database = fresh_database().await;
    let (mock, mock_url, _) = testkit::mock_provider::MockProvider::start()
        .await
        .expect("mock");
    let key = "so_campaigns-sigkill-key-aaaaaaaaaaaaa";
    let env = [
        ("SENDONCE_BOOTSTRAP_API_KEY", key),
        ("SENDONCE_POLL_INTERVAL_MS", "100"),
        // Twenty sends to one number: not what this test is about.
        ("SENDONCE_RATE_NUMBER_PER_HOUR", "0"),
        ("SENDONCE_RATE_PREFIX_PER_HOUR", "0"),
    ];
    let (mut first, _) = start_server(&database, &mock_url, &env).await;
    let client = reqwest::Client::new();
    let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(2);
    for i in 0..10 {
        let r = client
            .post(format!("{}/messages", first.base))
            .bearer_auth(key)
            .header("Idempotency-Key", format!("KILL-{i}"))
            .json(&scheduled("+14155550100", &format!("scheduled {i}"), at))
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status(), 202);
    }
    let later: Vec<Value> = (0..10)
        .map(|i| {
            let mut it = item(
                &format!("KILL-B-{i}"),
                "+14155550100",
                &format!("batched {i}"),
            );
            it["send_at"] = json!(rfc3339(at));
            it
        })
        .collect();
    let r = client
        .post(format!("{}/messages/batch", first.base))
        .bearer_auth(key)
        .json(&json!({ "messages": later }))
        .send()
        .await
        .expect("POST batch");
    assert_eq!(r.status(), 200);
    let results: Value = r.json().await.expect("results");
    for result in results["results"].as_array().expect("results") {
        assert_eq!(result["status"], 202, "{result}");
    }
    // SIGKILL: nothing is released, nothing is flushed.
    first.child.kill().await.expect("SIGKILL");
    assert_eq!(mock.call_count(), 0, "nothing was due yet");

    let (mut second, _) = start_server(&database, &mock_url, &env).await;
    eventually("all twenty to be delivered", || async {
        (mock.call_count() >= 20).then_some(())
    })
    .await;
    for i in 0..10 {
        assert_eq!(
            mock.deliveries_to("+14155550100", &format!("scheduled {i}")),
            1
        );
        assert_eq!(
            mock.deliveries_to("+14155550100", &format!("batched {i}")),
            1
        );
    }
    assert_eq!(mock.call_count(), 20);
    second.child.kill().await.expect("stop");
}

/// `sendonce tenant quiet-hours NAME 21:00-08:00` and `off`.
/// The whole batch's new rows are one round of writes: on Postgres every
/// row of a batch of 1,000 carries the same inserting transaction id
/// (`xmin`). Scheduled a day ahead, no claim rewrites them before the look.
#[tokio::test]
async fn a_batch_of_a_thousand_is_one_transaction() {
    let app = spawn_manual(Backend::Postgres).await;
    let at = START + time::Duration::days(1);
    let items: Vec<Value> = (0..1000)
        .map(|i| {
            let mut it = item(&format!("LATER-{i:04}"), "+14155550100", &format!("n {i}"));
            it["send_at"] = json!(rfc3339(at));
            it
        })
        .collect();
    let answer = post_batch(&app, &json!({ "messages": items })).await;
    assert_eq!(answer.status, 200);
    let results = answer.json()["results"]
        .as_array()
        .cloned()
        .expect("results");
    assert!(results.iter().all(|r| r["status"] == 202), "every item 202");
    assert_eq!(
        app.db
            .count("SELECT count(*) FROM messages WHERE status = 'scheduled'")
            .await,
        1000
    );
    assert_eq!(
        app.db
            .count("SELECT count(DISTINCT xmin::text) FROM messages")
            .await,
        1,
        "the batch's rows were written by more than one transaction"
    );
}

#[tokio::test]
async fn the_quiet_hours_command() {
    use crate::process::sendonce;
    let database = fresh_database().await;
    let store = store_for(&database);
    use sendonce::store::{MaintenanceStore, TenantStore};
    store.migrate().await.expect("migrate");
    let key = sendonce::apikey::generate();
    store
        .create_tenant("acme", &key.stored)
        .await
        .expect("tenant");
    let run = |args: &'static [&'static str]| {
        let mut cmd = sendonce(&database);
        cmd.args(args);
        async move { cmd.output().await.expect("run sendonce") }
    };
    let quiet = || async {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT quiet_hours FROM tenants WHERE name = 'acme'",
        )
        .fetch_one(store.pool())
        .await
        .expect("read")
    };
    let out = run(&["tenant", "quiet-hours", "acme", "21:00-08:00"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(quiet().await.as_deref(), Some("21:00-08:00"));
    let out = run(&["tenant", "quiet-hours", "acme", "9pm-8am"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("21:00-08:00"));
    assert_eq!(quiet().await.as_deref(), Some("21:00-08:00"), "unchanged");
    let out = run(&["tenant", "quiet-hours", "nobody", "off"]).await;
    assert!(!out.status.success());
    let out = run(&["tenant", "quiet-hours", "acme", "off"]).await;
    assert!(out.status.success());
    assert_eq!(quiet().await, None);
}
