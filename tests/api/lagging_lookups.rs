//! A provider's log or message list may lag without bound (neither Infobip
//! nor Twilio documents how soon a message it created shows there), so an
//! empty lookup never means "not sent": the holes of issue 39 this closes,
//! each counted at mocks that do not de-duplicate (Infobip's idempotency is
//! off unless Infobip enables it; Twilio has none), per (number, text) over
//! both providers.
//!
//! - Hole 5: a message that waited for a send slot looked older than its
//!   attempt (its age ran from its insert, on the wall clock); Infobip
//!   accepted it, the connection dropped, the log lagged past
//!   `INFOBIP_LOOKUP_AFTER`, and the message moved on to `http`: two SMS.
//! - Hole 6: the same window, stepped past by the service's clock: resent
//!   at Infobip under the same `messageId`, which Infobip creates again
//!   wherever its idempotency is off: two SMS.
//! - A log entry is read by its status: a `REJECTED` one is the attempt's
//!   own refusal (never `sent`), classified as a send answer would be.
//! - A `REJECTED_DUPLICATE_MESSAGE_ID` delivery report is about a repeat,
//!   not the message: recorded, nothing changes.
//! - Twilio: a message created by a dropped request, not listed yet, is
//!   never resent.
//!
//! Time that matters to the service runs on a hand-moved clock, the
//! scheduler driven by hand: nothing waits for time to pass.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use serde_json::json;
use testkit::mock_provider::{Behaviour, MockProvider};
use tokio::sync::Notify;

use crate::failover::secondary;
use crate::helpers::*;
use crate::infobip::{RECEIPT_SECRET, infobip};

const TO: &str = "+14155550123";

/// An Infobip instance on a hand-moved clock whose scheduler runs only when
/// the test ticks it, with `slots` send slots and `fallbacks` after
/// Infobip; its `http` fallback's mock, when it has one.
async fn spawn_on_a_manual_clock(
    backend: Backend,
    slots: usize,
    with_fallback: bool,
) -> (TestApp, Option<MockProvider>) {
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    settings.delivery.max_concurrent_sends = slots;
    let (second, fallbacks) = if with_fallback {
        let (mock, provider) = secondary().await;
        (Some(mock), vec![provider])
    } else {
        (None, Vec::new())
    };
    let app = spawn_with(TestOptions {
        backend,
        settings,
        clock: Clock::manual(time::OffsetDateTime::now_utc()),
        provider: Some(infobip()),
        fallbacks,
        ..TestOptions::default()
    })
    .await;
    (app, second)
}

/// Posts without waiting for the outcome.
async fn post_async(app: &TestApp, key: &str, body: &str) {
    let a = app
        .post_with(Some(key), &sms(TO, body), &[("prefer", "respond-async")])
        .await;
    assert!(a.status == 201 || a.status == 202, "{}", a.status);
}

/// Waits until the mock saw `lookups` lookups in all and no message is
/// leased (the run that made them wrote its recheck or its outcome).
async fn settled(app: &TestApp, lookups: usize) {
    eventually(&format!("{lookups} lookups"), || async {
        (app.mock.stats().lookups >= lookups).then_some(())
    })
    .await;
    idle(app).await;
}

/// Waits until no message is leased.
async fn idle(app: &TestApp) {
    eventually("the runs to end", || async {
        let leased = app
            .db
            .count("SELECT count(*) FROM messages WHERE lease_owner IS NOT NULL")
            .await;
        (leased == 0).then_some(())
    })
    .await;
}

/// Moves the clock on by `by`, runs the scheduler once (it claims the one
/// message due) and waits for its run to end.
async fn tick(app: &TestApp, by: Duration) {
    app.clock.advance(by);
    assert_eq!(
        app.handle.scheduler.tick().await.expect("scheduler scan"),
        1,
        "the message is due again"
    );
    idle(app).await;
}

/// SMS with `body` created for `TO` at both mocks.
fn sms_created(app: &TestApp, second: Option<&MockProvider>, body: &str) -> u32 {
    app.mock.deliveries_to(TO, body) + second.map_or(0, |m| m.deliveries_to(TO, body))
}

async fn hole_5_a_wait_for_a_send_slot_does_not_move_an_accepted_message_on(backend: Backend) {
    let (app, second) = spawn_on_a_manual_clock(backend, 1, true).await;
    let second = second.expect("the http fallback's mock");
    let body = "Your code is 7741 (waited for a slot)";
    // The one send slot is held by another message whose answer is slow;
    // ours waits for it, its attempt started at its insert.
    let gate = Arc::new(Notify::new());
    app.mock
        .push([Behaviour::Gate(gate.clone()), Behaviour::AcceptThenDrop]);
    app.mock.infobip_set_log_lag(Duration::from_secs(3600));
    post_async(&app, "SLOW", "holds the only slot").await;
    eventually("the first send to hold the slot", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    post_async(&app, "WAITS", body).await;
    eventually("the second send to wait for the slot", || async {
        (app.handle.deliverer.queued() == 1).then_some(())
    })
    .await;
    // A brownout's queue: a minute goes by on the service's clock.
    app.clock.advance(Duration::from_secs(61));
    gate.notify_one();
    // Infobip accepts ours and the connection drops; its log lags behind
    // by far more than INFOBIP_LOOKUP_AFTER (60 s).
    settled(&app, 1).await;
    assert_eq!(app.mock.infobip_messages().len(), 2, "both created");
    assert_eq!(
        sms_created(&app, Some(&second), body),
        1,
        "the message Infobip accepted was sent again through http"
    );
    assert_eq!(second.call_count(), 0, "moved on to http");
    let m = app.get("/messages/WAITS").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(m["provider"], "infobip", "{m}");
    // Asked again, never resent, while the log lags.
    tick(&app, Duration::from_secs(120)).await;
    assert_eq!(sms_created(&app, Some(&second), body), 1);
    // The log catches up: sent, under our id, one SMS.
    app.mock.infobip_set_log_lag(Duration::ZERO);
    tick(&app, Duration::from_secs(1)).await;
    let m = app.wait_for_status("WAITS", "sent").await;
    assert_eq!(m["provider_message_id"], m["id"], "{m}");
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(sms_created(&app, Some(&second), body), 1);
    assert_eq!(second.call_count(), 0);
}

async fn hole_6_a_clock_stepped_forward_does_not_resend_at_infobip(backend: Backend) {
    let (app, _) = spawn_on_a_manual_clock(backend, 64, false).await;
    let body = "Your code is 5512 (clock stepped)";
    app.mock.push([Behaviour::AcceptThenDrop]);
    app.mock.infobip_set_log_lag(Duration::from_secs(3600));
    post_async(&app, "STEPPED", body).await;
    eventually("the send", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    // The host's clock steps a minute forward while the service waits out
    // its own call before asking.
    app.clock.advance(Duration::from_secs(61));
    settled(&app, 1).await;
    // Whatever was decided, the next run acts on it.
    tick(&app, Duration::from_secs(1)).await;
    assert_eq!(
        app.mock.deliveries_to(TO, body),
        1,
        "resent under the same messageId, and Infobip (idempotency off) created it again"
    );
    let m = app.get("/messages/STEPPED").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(m["attempts"], 1, "{m}");
    app.mock.infobip_set_log_lag(Duration::ZERO);
    tick(&app, Duration::from_secs(1)).await;
    let m = app.wait_for_status("STEPPED", "sent").await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(app.mock.deliveries_to(TO, body), 1);
}

async fn a_rejected_log_entry_is_the_attempts_own_refusal(backend: Backend) {
    let (second, fallback) = secondary().await;
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(infobip()),
        fallbacks: vec![fallback],
        ..TestOptions::default()
    })
    .await;
    // Rejected (the destination), the answer lost: the log says why.
    app.mock.infobip_reject_then_drop("REJECTED_DESTINATION");
    let m = app
        .post("REJECTED-LOGGED", &sms(TO, "never sent"))
        .await
        .json();
    assert_eq!(app.mock.stats().lookups, 1, "looked up once: {m}");
    assert_eq!(m["status"], "failed", "a rejected message is not sent: {m}");
    assert_eq!(m["error"]["code"], "provider_rejected", "{m}");
    assert_eq!(m["error"]["provider_code"], "REJECTED_DESTINATION", "{m}");
    assert_eq!(sms_created(&app, Some(&second), "never sent"), 0);
    assert_eq!(
        second.call_count(),
        0,
        "a refusal of the message goes nowhere else"
    );

    // The account refused (no credit), the answer lost: Infobip certainly
    // did not send it, so the next provider may.
    app.mock
        .infobip_reject_then_drop("REJECTED_NOT_ENOUGH_CREDITS");
    let m = app
        .post("REFUSED-LOGGED", &sms(TO, "sent elsewhere"))
        .await
        .json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["provider"], "http", "{m}");
    assert_eq!(app.mock.deliveries_to(TO, "sent elsewhere"), 0);
    assert_eq!(second.deliveries_to(TO, "sent elsewhere"), 1);
    let attempts = crate::failover::attempts(&app, "REFUSED-LOGGED").await;
    assert_eq!(
        crate::failover::providers_and_outcomes(&attempts),
        vec![
            ("infobip".into(), "refused".into()),
            ("http".into(), "sent".into())
        ]
    );
}

async fn a_duplicate_message_id_report_changes_nothing(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(infobip()),
        ..TestOptions::default()
    })
    .await;
    let m = app.post("DUP-REPORT", &sms(TO, "hello")).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    let id = m["id"].as_str().unwrap();
    // A repeat of our id was refused: its report is about the repeat.
    let report = json!({"results": [{
        "bulkId": "b-2", "messageId": id, "to": "14155550123", "messageCount": 1,
        "status": {"groupId": 5, "groupName": "REJECTED", "id": 23,
                   "name": "REJECTED_DUPLICATE_MESSAGE_ID",
                   "description": "Rejected duplicate message ID"},
        "error": {"groupId": 0, "groupName": "OK", "id": 0, "name": "NO_ERROR",
                  "description": "No Error", "permanent": false},
    }]});
    let a = app
        .client
        .post(format!(
            "{}/providers/infobip/status?secret={RECEIPT_SECRET}",
            app.base
        ))
        .header("Content-Type", "application/json")
        .body(report.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(
        app.db.count("SELECT count(*) FROM receipts").await,
        1,
        "recorded"
    );
    let m = app.get("/messages/DUP-REPORT").await.json();
    assert_eq!(
        m["status"], "sent",
        "the repeat's refusal undelivered the message: {m}"
    );
    // A real outcome still applies afterwards.
    assert_eq!(app.mock.infobip_report_all("delivered").await, Some(200));
    app.wait_for_status("DUP-REPORT", "delivered").await;
}

async fn twilio_a_lagging_list_never_resends(backend: Backend) {
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        clock: Clock::manual(time::OffsetDateTime::now_utc()),
        provider: Some(crate::twilio::twilio()),
        ..TestOptions::default()
    })
    .await;
    let body = "Your code is 9930 (list lagging)";
    // Created, the connection dropped, and Twilio's list does not show it
    // yet (it documents no bound on how soon it does).
    app.mock.push([Behaviour::AcceptThenDrop]);
    app.mock.twilio_set_list_lag(Duration::from_secs(3600));
    post_async(&app, "LAGGING", body).await;
    settled(&app, 1).await;
    tick(&app, Duration::from_secs(1)).await;
    assert_eq!(
        app.mock.deliveries_to(TO, body),
        1,
        "a message Twilio created but did not list yet was sent again"
    );
    let m = app.get("/messages/LAGGING").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    // The list catches up: found, sent, one SMS.
    app.mock.twilio_set_list_lag(Duration::ZERO);
    tick(&app, Duration::from_secs(1)).await;
    let m = app.wait_for_status("LAGGING", "sent").await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(app.mock.deliveries_to(TO, body), 1);
}

/// A message whose lookup shows nothing yet is asked about until its retry
/// deadline; an instance that takes one over past that deadline ends it at
/// once instead of first waiting out the previous owner's call (no attempt
/// may start any more, so nothing in flight can be sent twice): under
/// instances hit faster than that wait, messages had stayed `processing`
/// minutes past their deadline.
async fn a_takeover_past_the_deadline_ends_at_once(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    // The takeover wait is then 2 x 5 s + 1 s.
    settings.delivery.provider_timeout = Duration::from_secs(5);
    settings.delivery.lease = Duration::from_secs(12);
    let mut a = spawn_with(TestOptions {
        backend,
        settings: settings.clone(),
        clock: clock.clone(),
        provider: Some(crate::twilio::twilio()),
        ..TestOptions::default()
    })
    .await;
    a.mock.push([Behaviour::Hang]);
    post_async(&a, "HELD", "held past its deadline").await;
    eventually("a's call", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    a.crash().await;
    let b = spawn_with(TestOptions {
        settings,
        clock: clock.clone(),
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        api_key: Some(a.api_key.clone()),
        provider: Some(crate::twilio::twilio()),
        ..TestOptions::default()
    })
    .await;
    clock.advance(Duration::from_secs(16 * 60));
    assert_eq!(b.claim_within(Duration::from_secs(30)).await, 1);
    let m = within(
        Duration::from_secs(6),
        "the message to end within less than the takeover wait",
        || async {
            let m = b.get("/messages/HELD").await.json();
            (m["status"] == "unknown").then_some(m)
        },
    )
    .await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(a.mock.call_count(), 1, "never resent");
}

on_both_backends!(
    a_takeover_past_the_deadline_ends_at_once,
    hole_5_a_wait_for_a_send_slot_does_not_move_an_accepted_message_on,
    hole_6_a_clock_stepped_forward_does_not_resend_at_infobip,
    a_rejected_log_entry_is_the_attempts_own_refusal,
    a_duplicate_message_id_report_changes_nothing,
    twilio_a_lagging_list_never_resends,
);
