//! The promise on the Telegram Gateway's path (issue 39): a code goes out
//! on one channel at a time, nothing goes after its verification ended, and
//! one Gateway send is one message, counted at a Gateway mock that makes a
//! message for every accepted call (the worst case the Gateway's
//! documentation leaves open for a repeated `request_id`) and an SMS
//! endpoint that never de-duplicates. Each test is named after the hole it
//! closes; each failed on the code before the fix.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::helpers::*;
use crate::telegram_gateway::*;

/// `sendVerificationMessage` answered 429 `FLOOD_WAIT_20`: nothing sent,
/// the retry due 20 s later.
fn flood_wait_20() -> Behaviour {
    Behaviour::Fail {
        status: 429,
        body: json!({"ok": false, "error": "FLOOD_WAIT_20"}),
        retry_after: None,
    }
}

/// The verification's Telegram message waits for its retry: it holds a
/// request id, no lease, and a due time.
async fn telegram_retry_waiting(app: &TestApp) {
    let waiting = "SELECT count(*) FROM messages WHERE provider = 'telegram_gateway' \
         AND status = 'processing' AND prepared_token IS NOT NULL \
         AND lease_token IS NULL AND next_attempt_at IS NOT NULL";
    eventually("the Telegram send waiting for its retry", || async {
        (app.db.count(waiting).await == 1).then_some(())
    })
    .await;
}

/// Nothing of any verification is left to send.
async fn nothing_processing(app: &TestApp) {
    eventually("no message left processing", || async {
        (app.db
            .count("SELECT count(*) FROM messages WHERE status = 'processing'")
            .await
            == 0)
            .then_some(())
    })
    .await;
}

/// Hole 1: the first `sendVerificationMessage` is answered FLOOD_WAIT_20;
/// the fallback comes due at 5 s and sends the SMS; at 20 s the retry must
/// not put the code on Telegram too.
async fn a_telegram_code_waiting_for_its_retry_never_goes_after_its_sms(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    app.mock.push([flood_wait_20()]);
    let id = started(
        &app,
        "p2-flood",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 5}),
    )
    .await;
    telegram_retry_waiting(&app).await;
    clock.advance(Duration::from_secs(6));
    messages_when(&app, &id, "the SMS after the fallback", |m| {
        m.len() == 2 && m[1].1 == "sent"
    })
    .await;
    // The retry long due: it must not be made.
    clock.advance(Duration::from_secs(30));
    nothing_processing(&app).await;
    assert!(
        app.mock.gateway_messages().is_empty(),
        "the code went on Telegram after its SMS: {:?}",
        app.mock.gateway_messages()
    );
    assert_eq!(sms_to(&app, TO).len(), 1);
    let v = verification(&app, &id).await;
    assert_eq!(v["messages"][0]["status"], "canceled", "{v}");
}

/// Hole 1, the end: the verification canceled at 3 s, its Telegram
/// message waiting for a retry at 20 s: nothing is sent after the cancel.
async fn a_telegram_code_waiting_for_its_retry_never_goes_after_a_cancel(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    app.mock.push([flood_wait_20()]);
    let id = started(
        &app,
        "p2-cancel",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 300}),
    )
    .await;
    telegram_retry_waiting(&app).await;
    clock.advance(Duration::from_secs(3));
    let c = post_to(
        &app,
        &format!("/verifications/{id}/cancel"),
        None,
        json!({}),
    )
    .await;
    assert_eq!(c.status, 200, "{}", String::from_utf8_lossy(&c.bytes));
    clock.advance(Duration::from_secs(30));
    nothing_processing(&app).await;
    assert!(
        app.mock.gateway_messages().is_empty(),
        "the code went on Telegram after the verification was canceled"
    );
    assert!(sms_to(&app, TO).is_empty());
    let got = messages_when(&app, &id, "the Telegram message final", |m| {
        m.len() == 1 && m[0].1 != "processing"
    })
    .await;
    assert_eq!(got, [pair("telegram", "canceled")]);
}

/// The end, with the send already under way: its `checkSendAbility` is
/// being answered when the verification is canceled; the send that would
/// follow it must not be made.
async fn a_send_under_way_when_the_verification_ends_is_not_made(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let gate = Arc::new(Notify::new());
    app.mock
        .push_gateway_check([Behaviour::Gate(Arc::clone(&gate))]);
    let id = started(
        &app,
        "p2-underway",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 300}),
    )
    .await;
    eventually("the check under way", || async {
        (app.mock.gateway_checks().len() == 1).then_some(())
    })
    .await;
    let c = post_to(
        &app,
        &format!("/verifications/{id}/cancel"),
        None,
        json!({}),
    )
    .await;
    assert_eq!(c.status, 200);
    gate.notify_one();
    nothing_processing(&app).await;
    assert!(
        app.mock.gateway_messages().is_empty(),
        "the code went on Telegram after the verification was canceled"
    );
    assert!(sms_to(&app, TO).is_empty());
}

/// Hole 2: the revoke takes its time; a signed `delivered` report arrives
/// meanwhile and is answered 200: the SMS must not follow.
async fn a_delivered_report_during_the_fallback_stops_the_sms(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = sent_on_telegram(&app, "p2-race").await;
    let request_id = app.mock.gateway_messages()[0].request_id.clone();
    let held = app.mock.gateway_hold_revokes();
    clock.advance(Duration::from_secs(11));
    eventually("the fallback's revoke under way", || async {
        (app.mock.gateway_revoke_calls() >= 1).then_some(())
    })
    .await;
    app.mock.gateway_set_status(&request_id, "delivered");
    let r = report(&app, &request_id, clock.now().unix_timestamp(), TOKEN).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    drop(held);
    let settled = "SELECT count(*) FROM verification_fallbacks WHERE state <> 'waiting'";
    eventually("the fallback row settled", || async {
        (app.db.count(settled).await == 1).then_some(())
    })
    .await;
    let v = verification(&app, &id).await;
    assert_eq!(
        v["messages"].as_array().map(Vec::len),
        Some(1),
        "an SMS after a delivered report: {v}"
    );
    assert!(sms_to(&app, TO).is_empty());
    assert_eq!(v["messages"][0]["status"], "delivered");
}

/// Hole 3: an ambiguous `sendVerificationMessage` (the connection drops
/// after the Gateway made the message) is settled by asking the Gateway,
/// never by sending again: one message on the phone.
async fn an_ambiguous_gateway_send_is_looked_up_never_sent_again(backend: Backend) {
    let app = spawn_gateway(backend, sendonce::clock::Clock::system()).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let id = started(
        &app,
        "p2-dropped",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 500}),
    )
    .await;
    let got = messages_when(&app, &id, "the Telegram message final", |m| {
        m.len() == 1 && m[0].1 != "processing"
    })
    .await;
    let sent = app.mock.gateway_messages();
    let code = sent[0].code.clone().expect("code");
    assert_eq!(
        app.mock.deliveries_to(TO, &code),
        1,
        "one Gateway send, one message on the phone: {sent:?}"
    );
    assert_eq!(got, [pair("telegram", "sent")]);
    let sends = app
        .mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "telegram_gateway")
        .count();
    assert_eq!(sends, 1, "sent once, then looked up");
    assert!(sms_to(&app, TO).is_empty());
}

/// Hole 4: after an ambiguous send the Gateway refuses anything more with
/// the request id; the code it delivered must not end `failed`, nor the SMS
/// go at once.
async fn a_delivered_code_never_ends_failed_after_an_ambiguous_send(backend: Backend) {
    let app = spawn_gateway(backend, sendonce::clock::Clock::system()).await;
    app.mock.gateway_refuse_repeats("REQUEST_ID_INVALID");
    app.mock.push([Behaviour::AcceptThenDrop]);
    let id = started(
        &app,
        "p2-refused",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 500}),
    )
    .await;
    let got = messages_when(&app, &id, "the Telegram message final", |m| {
        !m.is_empty() && m[0].1 != "processing"
    })
    .await;
    assert_eq!(got, [pair("telegram", "sent")], "a delivered code ended so");
    assert!(sms_to(&app, TO).is_empty(), "the SMS went at once");
}

/// Seen in the code: the Gateway answers a revoke with `{"ok":true,
/// "result":true}` ("Returns True if the revocation request was
/// received"); the adapter must read it as revoked.
async fn the_documented_revoke_answer_is_read_as_revoked(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = started(
        &app,
        "p2-revoke",
        json!({"to": TO, "channels": ["telegram"]}),
    )
    .await;
    messages_when(&app, &id, "the Telegram message sent", |m| {
        m == [pair("telegram", "sent")]
    })
    .await;
    let request_id = app.mock.gateway_messages()[0].request_id.clone();
    let gateway = gateway_calling_back(app.mock_url.trim_end_matches("/messages"), None);
    assert!(
        gateway.revoke(&request_id).await,
        "a revoke the Gateway received was read as failed"
    );
    assert_eq!(app.mock.gateway_revoked(), [request_id]);
}

/// Seen in the code: with the host's clock minutes off, every report is
/// refused as stale; a code the Gateway delivered must not fall back to
/// SMS for that (the Gateway is asked before the fallback moves on).
async fn a_delivered_code_does_not_fall_back_when_reports_are_refused(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    let id = sent_on_telegram(&app, "p2-skew").await;
    let request_id = app.mock.gateway_messages()[0].request_id.clone();
    app.mock.gateway_set_status(&request_id, "delivered");
    // Stamped by the Gateway's (true) clock: ours is days off.
    let true_now = time::OffsetDateTime::now_utc().unix_timestamp();
    let r = report(&app, &request_id, true_now, TOKEN).await;
    assert_eq!(r.status, 403, "a report this far off our clock is refused");
    clock.advance(Duration::from_secs(11));
    let settled = "SELECT count(*) FROM verification_fallbacks WHERE state <> 'waiting'";
    eventually("the fallback row settled", || async {
        (app.db.count(settled).await == 1).then_some(())
    })
    .await;
    assert!(
        sms_to(&app, TO).is_empty(),
        "a delivered code fell back to SMS"
    );
    let got = messages_when(&app, &id, "the delivery learned", |m| {
        m == [pair("telegram", "delivered")]
    })
    .await;
    assert_eq!(got.len(), 1);
}

/// Found by the Gateway chaos run: a pass reads the Telegram message
/// waiting for its retry, revokes it (slowly); meanwhile the retry sends it.
/// The move must not go on from what the pass read: the message it
/// revoked was not yet there. The next pass revokes the message that is
/// there, then the SMS goes.
async fn a_telegram_send_made_during_the_fallback_is_revoked_before_its_sms(backend: Backend) {
    let clock = manual_clock();
    let app = spawn_gateway(backend, clock.clone()).await;
    app.mock.push([flood_wait_20()]);
    let id = started(
        &app,
        "p2-during",
        json!({"to": TO, "channels": ["telegram", "sms"], "fallback_after_seconds": 5}),
    )
    .await;
    telegram_retry_waiting(&app).await;
    let held = app.mock.gateway_hold_revokes();
    clock.advance(Duration::from_secs(6));
    eventually("the fallback's revoke under way", || async {
        (app.mock.gateway_revoke_calls() >= 1).then_some(())
    })
    .await;
    // The retry comes due while the revoke is held, and sends.
    clock.advance(Duration::from_secs(20));
    eventually("the retry sent on Telegram", || async {
        (app.mock.gateway_messages().len() == 1).then_some(())
    })
    .await;
    drop(held);
    messages_when(&app, &id, "the SMS", |m| m.len() == 2 && m[1].1 == "sent").await;
    let sent = app.mock.gateway_messages();
    assert_eq!(
        sent[0].status, "revoked",
        "the SMS went while the Telegram message sent meanwhile was never revoked: {sent:?}"
    );
    assert_eq!(sms_to(&app, TO).len(), 1);
}

on_both_backends!(
    a_telegram_send_made_during_the_fallback_is_revoked_before_its_sms,
    a_telegram_code_waiting_for_its_retry_never_goes_after_its_sms,
    a_telegram_code_waiting_for_its_retry_never_goes_after_a_cancel,
    a_send_under_way_when_the_verification_ends_is_not_made,
    a_delivered_report_during_the_fallback_stops_the_sms,
    an_ambiguous_gateway_send_is_looked_up_never_sent_again,
    a_delivered_code_never_ends_failed_after_an_ambiguous_send,
    the_documented_revoke_answer_is_read_as_revoked,
    a_delivered_code_does_not_fall_back_when_reports_are_refused,
);
