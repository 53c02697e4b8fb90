//! Many instances on one database, crashes, stale owners, shutdown, outages
//! and retention.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sendonce::clock::Clock;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::delivery::futures_join_all;
use crate::helpers::*;

/// Options for another instance sharing `first`'s database, mock and clock.
fn sibling(first: &TestApp, settings: sendonce::config::Settings) -> TestOptions {
    TestOptions {
        settings,
        clock: first.clock.clone(),
        database: Some(first.database.clone()),
        mock: Some((first.mock.clone(), first.mock_url.clone())),
        api_key: Some(first.api_key.clone()),
        ..TestOptions::default()
    }
}

fn manual_clock() -> Clock {
    Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC))
}

/// Test settings with the background scan effectively off, so the test
/// decides when a scheduler runs.
fn quiet_settings() -> sendonce::config::Settings {
    let mut s = test_settings();
    s.scheduler.poll_interval = Duration::from_secs(3600);
    s
}

async fn three_instances_two_hundred_posts_one_send(backend: Backend) {
    let a = spawn_app_on(backend).await;
    let b = spawn_with(sibling(&a, test_settings())).await;
    let c = spawn_with(sibling(&a, test_settings())).await;
    let instances = [&a, &b, &c];
    let gate = Arc::new(Notify::new());
    a.mock.push([Behaviour::Gate(gate.clone())]);
    let body = sms("+14155550100", "Your order 1 shipped");
    let requests = (0..200).map(|i| {
        let target = instances[i % 3];
        target.post("ORDER-1-SHIPPED", &body)
    });
    let release = async {
        eventually("the provider call", || async {
            (a.mock.call_count() == 1).then_some(())
        })
        .await;
        gate.notify_one();
    };
    let (answers, ()) = tokio::join!(futures_join_all(requests), release);
    assert_eq!(
        a.mock.call_count(),
        1,
        "one provider call across three instances"
    );
    let finals: Vec<&Answer> = answers.iter().filter(|x| x.status == 201).collect();
    assert!(answers.iter().all(|x| x.status == 201 || x.status == 409));
    assert!(
        finals.len() > 190,
        "waiting duplicates see the result: {} of 200",
        finals.len()
    );
    assert!(
        finals.iter().all(|x| x.bytes == finals[0].bytes),
        "all final responses identical"
    );
}

/// Settings with a short lease, so a lease really runs out during a test.
fn short_lease_settings() -> (sendonce::config::Settings, Duration) {
    let mut s = quiet_settings();
    let lease = Duration::from_secs(3);
    s.delivery.lease = lease;
    // The shortest lease a call may start under is the provider timeout
    // plus 1 s (and the configuration asks for twice that plus 2 s).
    s.delivery.provider_timeout = Duration::from_millis(500);
    (s, lease)
}

/// A clock `by` ahead of (or, negative, behind) [`manual_clock`].
fn skewed_clock(by: time::Duration) -> Clock {
    Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC) + by)
}

async fn a_crashed_instance_is_taken_over_and_the_message_sent_once(backend: Backend) {
    let clock = manual_clock();
    let (settings, lease) = short_lease_settings();
    let mut a = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: settings.clone(),
        ..TestOptions::default()
    })
    .await;
    // b's clock is five minutes (a hundred leases) ahead of a's: leases run
    // on the database's clock, so that gives b nothing early.
    let b = spawn_with(TestOptions {
        clock: skewed_clock(time::Duration::minutes(5)),
        ..sibling(&a, settings)
    })
    .await;
    a.mock.push([Behaviour::Hang]);
    let posted = Instant::now();
    let first = a
        .post_with(
            Some("CRASH"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(first.status, 202);
    eventually("a's call to reach the provider", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    a.crash().await;

    // Before the lease runs out nobody may take it.
    assert_eq!(b.handle.scheduler.tick().await.unwrap(), 0);
    assert!(
        posted.elapsed() < lease,
        "the scan ran while the lease was live"
    );
    // Once it ran out, b takes the message over, and not before.
    assert_eq!(b.claim_within(Duration::from_secs(15)).await, 1);
    assert!(posted.elapsed() + Duration::from_millis(2) >= lease);

    let m = eventually("b to finish it", || async {
        let got = b.get("/messages/CRASH").await.json();
        (got["status"] == "sent").then_some(got)
    })
    .await;
    let id = m["id"].as_str().unwrap();
    assert_eq!(m["attempts"], 2);
    assert_eq!(a.mock.call_count(), 2, "resent after the crash");
    assert_eq!(a.mock.deliveries_for(id), 1, "under the same key: one SMS");
    let calls = a.mock.calls();
    assert!(
        calls
            .iter()
            .all(|c| c.idempotency_key.as_deref() == Some(id))
    );
    let history = b.get("/messages/CRASH/attempts").await.json();
    assert_eq!(history["data"][0]["outcome"], "lost");
    assert_eq!(history["data"][1]["outcome"], "sent");
    // Two instances made the two attempts (owners are not shown to tenants).
    assert_eq!(
        b.db.count("SELECT count(DISTINCT lease_owner) FROM attempts")
            .await,
        2
    );
}

async fn a_stale_owner_cannot_overwrite_the_new_owners_result(backend: Backend) {
    let clock = manual_clock();
    // a's lease runs out while its call is in flight: the database's clock
    // steps forward (see `promise::step_database_clock`). a's call may take
    // 10 s, so it is still in flight when b claims however loaded the
    // machine is (with a shorter timeout, a's call could end first and a
    // retry and finish, rightly, before b's claim); b waits out only its
    // own provider timeout, so it resends while a's call is still open.
    let (settings, _) = short_lease_settings();
    let mut slow_settings = settings.clone();
    slow_settings.delivery.provider_timeout = Duration::from_secs(10);
    slow_settings.delivery.lease = Duration::from_secs(25);
    let a = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: slow_settings,
        // The provider's own HTTP client too (it timed out at 2 s, and a,
        // rightly, retried and finished before b's claim: "failed,
        // attempts=2" when CI was busy).
        provider_timeout: Duration::from_secs(10),
        ..TestOptions::default()
    })
    .await;
    // b's clock is five minutes behind a's: an expired lease is expired
    // whatever the claimer's clock says.
    let b = spawn_with(TestOptions {
        clock: skewed_clock(time::Duration::minutes(-5)),
        ..sibling(&a, settings)
    })
    .await;
    let slow = Arc::new(Notify::new());
    // a's call hangs until released; b's call is rejected outright.
    a.mock.push([
        Behaviour::Gate(slow.clone()),
        Behaviour::Fail {
            status: 400,
            body: serde_json::json!({"message": "invalid number"}),
            retry_after: None,
        },
    ]);
    let first = a
        .post_with(
            Some("STALE"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(first.status, 202);
    eventually("a's call", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;

    // a is alive but its lease ran out: b takes over.
    assert_eq!(crate::promise::step_database_clock(&a, 60).await, 1);
    assert_eq!(b.claim_within(Duration::from_secs(15)).await, 1);
    assert_eq!(b.takeovers(), 1, "b took it over");
    assert_eq!(a.takeovers(), 0);
    let m = a.wait_for_status("STALE", "failed").await;
    let final_bytes = a.get("/messages/STALE").await.bytes;

    // a's provider call now succeeds; its write is fenced off.
    slow.notify_one();
    eventually("a's task to end", || async {
        (a.handle.deliverer.in_flight() == 0).then_some(())
    })
    .await;
    let after = a.get("/messages/STALE").await;
    assert_eq!(after.json()["status"], "failed");
    assert_eq!(after.bytes, final_bytes, "the new owner's result stands");
    assert_eq!(m["error"]["message"], "invalid number");
    let replay = a.post("STALE", &sms("+14155550100", "hi")).await;
    assert_eq!(replay.json()["status"], "failed");
}

/// A shutdown releases at once what never reached a provider call, and
/// holds what it cut off mid-call for the provider timeout (the provider may
/// still be acting on it); another instance resumes both, each sent once.
async fn shutdown_releases_unfinished_sends_for_another_instance(backend: Backend) {
    let mut settings = test_settings();
    settings.server.shutdown_grace = Duration::from_millis(200);
    settings.delivery.max_concurrent_sends = 3;
    let mut a = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    a.mock
        .push([Behaviour::Hang, Behaviour::Hang, Behaviour::Hang]);
    let queued_body = sms("+14155550100", "queued");
    for i in 0..3 {
        let r = a
            .post_with(
                Some(&format!("DRAIN-{i}")),
                &sms("+14155550100", "hi"),
                &[("prefer", "respond-async")],
            )
            .await;
        assert_eq!(r.status, 202);
    }
    eventually("three calls in flight", || async {
        (a.mock.call_count() == 3).then_some(())
    })
    .await;
    // Waits for a send slot behind the three: never calls the provider.
    let queued = a
        .post_with(
            Some("DRAIN-QUEUED"),
            &queued_body,
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(queued.status, 202);
    a.stop().await;

    let processing =
        a.db.count("SELECT count(*) FROM messages WHERE status = 'processing'")
            .await;
    assert_eq!(processing, 4);
    // The one that never reached a call is due now, for anyone.
    let released =
        a.db.count(
            "SELECT count(*) FROM messages WHERE status = 'processing' \
             AND lease_owner IS NULL AND lease_token IS NULL AND next_attempt_at IS NOT NULL",
        )
        .await;
    assert_eq!(released, 1);
    // The three cut off keep their leases (no due time): nobody resumes
    // them before the provider timeout has passed.
    let held =
        a.db.count(
            "SELECT count(*) FROM messages WHERE status = 'processing' \
             AND lease_token IS NOT NULL AND next_attempt_at IS NULL",
        )
        .await;
    assert_eq!(held, 3);

    // Another instance resumes all four, under the same keys.
    let b = spawn_with(sibling(&a, test_settings())).await;
    b.wait_for_status("DRAIN-QUEUED", "sent").await;
    for i in 0..3 {
        b.wait_for_status(&format!("DRAIN-{i}"), "sent").await;
    }
    let stats = a.mock.stats();
    assert_eq!(stats.keys_delivered, 4);
    assert_eq!(stats.max_deliveries_per_key, 1);
}

async fn purged_keys_can_be_used_again(backend: Backend) {
    let clock = manual_clock();
    let mut settings = quiet_settings();
    settings.retention.period = Duration::from_secs(86_400);
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings: settings.clone(),
        ..TestOptions::default()
    })
    .await;
    let first = app.post("DAILY", &sms("+14155550100", "day one")).await;
    assert_eq!(first.status, 201);
    let purger = sendonce::delivery::Purger::new(
        app.handle.store.clone(),
        clock.clone(),
        settings.retention.period,
        Duration::from_secs(3600),
    );
    clock.advance(Duration::from_secs(86_399));
    assert_eq!(purger.purge_now().await.unwrap(), 0, "inside retention");
    assert_eq!(
        app.post("DAILY", &sms("+14155550100", "day two"))
            .await
            .status,
        422
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(purger.purge_now().await.unwrap(), 1);
    assert_eq!(app.get("/messages/DAILY").await.status, 404);
    let second = app.post("DAILY", &sms("+14155550100", "day two")).await;
    assert_eq!(second.status, 201);
    assert_ne!(second.json()["id"], first.json()["id"]);
}

on_both_backends!(
    three_instances_two_hundred_posts_one_send,
    a_crashed_instance_is_taken_over_and_the_message_sent_once,
    a_stale_owner_cannot_overwrite_the_new_owners_result,
    shutdown_releases_unfinished_sends_for_another_instance,
    purged_keys_can_be_used_again,
);
