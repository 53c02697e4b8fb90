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

on_both_backends!(
    a_scheduled_send_waits_for_its_time_and_is_sent_once,
    send_at_too_far_is_refused_and_a_past_one_sends_now,
    scheduled_sends_survive_a_crash_and_three_instances_start_each_once,
    cancel_before_during_and_after_an_attempt,
    a_cancel_racing_the_scheduler_never_loses_a_send,
);
