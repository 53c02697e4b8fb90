//! The Infobip adapter end to end, against the mock's Infobip (written from
//! Infobip's SMS API reference; it de-duplicates nothing unless a test turns
//! on the idempotency Infobip enables per account on request): the send,
//! its classes, an ambiguous answer reconciled by our id (found: sent,
//! never resent; nothing in the logs: asked again, never resent, `unknown`
//! at the retry deadline; lookups failing: asked again, never resent, never
//! failed), idempotency declared (resent under the same id, the repeat
//! refused), and delivery reports (batched, duplicated, forged).
//!
//! Time that matters to the service (the retry deadline, rechecks) runs on
//! a hand-moved clock, with the scheduler driven by hand: nothing waits for
//! time to pass.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::domain::MessageId;
use sendonce::provider::infobip::delivery_url;
use sendonce::provider::{
    AttemptRef, InfobipProvider, InfobipSettings, OutgoingSms, Provider, Reconciled, SendOutcome,
};
use serde_json::json;
use testkit::mock_provider::{Behaviour, MockProvider, ReceiptConfig, ReceiptOrder};

use crate::helpers::*;

pub const API_KEY: &str = "infobip-test-api-key";
pub const RECEIPT_SECRET: &str = "infobip-receipt-secret-0123";
pub const DEFAULT_FROM: &str = "InfoSMS";
const TO: &str = "+14155550100";

/// The Infobip provider aimed at the mock, its delivery reports coming
/// back to this instance with the receipt secret.
pub fn infobip() -> ProviderFactory {
    infobip_declaring(None)
}

/// The adapter's settings aimed at `base_url`, idempotency declared with
/// `grace` when given.
pub fn settings(base_url: &str, grace: Option<Duration>) -> InfobipSettings {
    InfobipSettings {
        base_url: base_url.to_string(),
        api_key: API_KEY.into(),
        from: Some(DEFAULT_FROM.into()),
        delivery_url: None,
        idempotency_grace: grace,
        warnings: Vec::new(),
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
    }
}

/// As [`infobip`], with Infobip's idempotency declared with `grace`
/// (`INFOBIP_IDEMPOTENCY_GRACE`) when given.
pub fn infobip_declaring(grace: Option<Duration>) -> ProviderFactory {
    Box::new(move |mock, app, s| {
        s.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
            "INFOBIP_RECEIPT_SECRET",
            RECEIPT_SECRET,
        )])
        .expect("receipt settings");
        s.provider.secrets = sendonce::provider::Secrets::from_vars(
            &sendonce::provider::registry::Vars::from_pairs([
                ("INFOBIP_RECEIPT_SECRET", RECEIPT_SECRET),
                ("INFOBIP_API_KEY", API_KEY),
            ]),
        );
        s.server.public_url = Some(app.to_string());
        let settings = InfobipSettings {
            delivery_url: Some(delivery_url(app, RECEIPT_SECRET)),
            ..settings(mock, grace)
        };
        Arc::new(InfobipProvider::new(settings).expect("infobip provider"))
    })
}

async fn spawn_infobip(backend: Backend) -> TestApp {
    spawn_with(TestOptions {
        backend,
        provider: Some(infobip()),
        ..TestOptions::default()
    })
    .await
}

/// An instance on a hand-moved clock whose scheduler only runs when the
/// test ticks it; Infobip's idempotency declared with `grace` when given.
async fn spawn_infobip_on_a_manual_clock(backend: Backend, grace: Option<Duration>) -> TestApp {
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    spawn_with(TestOptions {
        backend,
        settings,
        clock: Clock::manual(time::OffsetDateTime::now_utc()),
        provider: Some(infobip_declaring(grace)),
        ..TestOptions::default()
    })
    .await
}

fn infobip_calls(app: &TestApp) -> Vec<serde_json::Value> {
    app.mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "infobip")
        .map(|c| c.body)
        .collect()
}

/// The `messageId` each send carried.
fn sent_ids(app: &TestApp) -> Vec<String> {
    infobip_calls(app)
        .iter()
        .map(|b| {
            b["messages"][0]["destinations"][0]["messageId"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Posts without waiting for the outcome (it may need the clock moved).
async fn post_now(app: &TestApp, key: &str, body: &str) {
    let a = app
        .post_with(Some(key), &sms(TO, body), &[("prefer", "wait=1")])
        .await;
    assert!(a.status == 201 || a.status == 202, "{}", a.status);
}

/// Moves the clock on by `by` and runs the scheduler once; waits until the
/// mock saw `lookups` log lookups in all and the run ended.
async fn advance_and_recheck(app: &TestApp, by: Duration, lookups: usize) {
    app.clock.advance(by);
    assert_eq!(
        app.handle.scheduler.tick().await.expect("scheduler scan"),
        1,
        "the recheck is due"
    );
    settled(app, lookups).await;
}

/// Waits until the mock saw `lookups` log lookups in all (an ambiguous
/// answer is looked up once the provider timeout is over) and the run that
/// made them ended (wrote its recheck or its outcome).
async fn settled(app: &TestApp, lookups: usize) {
    eventually(&format!("{lookups} log lookups"), || async {
        (app.mock.stats().lookups >= lookups).then_some(())
    })
    .await;
    eventually("the run to end", || async {
        let leased = app
            .db
            .count("SELECT count(*) FROM messages WHERE lease_owner IS NOT NULL")
            .await;
        (leased == 0).then_some(())
    })
    .await;
}

async fn sends_json_with_our_id_and_keeps_it(backend: Backend) {
    let app = spawn_infobip(backend).await;
    let m = app
        .post("ORDER-1", &sms(TO, "Your order 92831 is confirmed."))
        .await
        .json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["provider"], "infobip");
    let id = m["id"].as_str().unwrap();
    assert_eq!(m["provider_message_id"], id, "Infobip's id is ours");
    let calls = app.mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("App {API_KEY}").as_str())
    );
    let msg = &calls[0].body["messages"][0];
    assert_eq!(msg["destinations"][0]["to"], "14155550100");
    assert_eq!(msg["destinations"][0]["messageId"], id);
    assert_eq!(msg["content"]["text"], "Your order 92831 is confirmed.");
    assert_eq!(msg["sender"], DEFAULT_FROM);
    let url = msg["webhooks"]["delivery"]["url"].as_str().unwrap();
    assert_eq!(
        url,
        format!(
            "{}/providers/infobip/status?secret={RECEIPT_SECRET}",
            app.base
        )
    );
    assert_eq!(
        app.mock.deliveries_to(TO, "Your order 92831 is confirmed."),
        1
    );
    assert_eq!(app.mock.stats().lookups, 0, "an answer needs no lookup");
}

async fn bad_credentials_are_refused(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock.push([Behaviour::Fail {
        status: 401,
        body: json!({"requestError": {"serviceException": {
            "messageId": "UNAUTHORIZED", "text": "Invalid login details"}}}),
        retry_after: None,
    }]);
    let m = app.post("REFUSED", &sms(TO, "hi")).await.json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["attempts"], 1);
    let attempts = app.get("/messages/REFUSED/attempts").await.json();
    assert_eq!(attempts["data"][0]["outcome"], "refused");
    assert_eq!(attempts["data"][0]["provider_code"], "UNAUTHORIZED");
    assert_eq!(app.mock.created(), 0);
    assert_eq!(
        app.mock.call_count(),
        1,
        "nothing resent to a refusing account"
    );
}

/// Issue 41, finding 8: Infobip quoting the request (the delivery report
/// URL, `INFOBIP_RECEIPT_SECRET` in its query) in its refusal shows the
/// tenant neither the secret nor the URL's query, anywhere.
async fn a_refusal_quoting_the_report_url_shows_no_secret(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock.push([Behaviour::RejectQuoting { status: 400 }]);
    let m = app.post("QUOTED-URL", &sms(TO, "hello there")).await.json();
    assert_eq!(m["status"], "failed", "{m}");
    let quoted = app.mock.calls()[0].body["messages"][0]["webhooks"]["delivery"]["url"]
        .as_str()
        .expect("the report URL was sent")
        .to_string();
    assert!(quoted.contains(RECEIPT_SECRET), "{quoted}");
    let shown = m["error"]["message"]
        .as_str()
        .expect("an error")
        .to_string();
    assert!(
        shown.contains("/providers/infobip/status?[query]"),
        "the refusal is still shown: {shown}"
    );
    for path in [
        "/messages/QUOTED-URL",
        "/messages/QUOTED-URL/attempts",
        "/messages/QUOTED-URL/events",
        "/events",
    ] {
        let a = app.get(path).await;
        assert_eq!(a.status, 200, "{path}");
        let text = String::from_utf8_lossy(&a.bytes);
        assert!(
            !text.contains(RECEIPT_SECRET),
            "{path} shows the secret: {text}"
        );
        assert!(!text.contains("secret="), "{path} shows the query: {text}");
    }
}

async fn throttling_is_retried(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock.push([Behaviour::Fail {
        status: 429,
        body: json!({"requestError": {"serviceException": {
            "messageId": "TOO_MANY_REQUESTS", "text": "Too many requests"}}}),
        retry_after: None,
    }]);
    let m = app.post("THROTTLED", &sms(TO, "hi")).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["attempts"], 2);
    let attempts = app.get("/messages/THROTTLED/attempts").await.json();
    assert_eq!(attempts["data"][0]["outcome"], "retryable");
    assert_eq!(attempts["data"][0]["provider_code"], "TOO_MANY_REQUESTS");
    assert_eq!(app.mock.deliveries_to(TO, "hi"), 1);
    let ids = sent_ids(&app);
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1], "the same messageId on every attempt");
    assert_eq!(app.mock.stats().lookups, 0);
}

async fn a_rejected_destination_fails(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock.infobip_reject_next("REJECTED_DESTINATION");
    let m = app.post("REJECTED", &sms(TO, "hi")).await.json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["attempts"], 1);
    assert_eq!(m["error"]["code"], "provider_rejected");
    assert_eq!(m["error"]["provider_code"], "REJECTED_DESTINATION");
    // A malformed request (400) is a refusal of the message too.
    app.mock.push([Behaviour::Fail {
        status: 400,
        body: json!({"message": "Bad request"}),
        retry_after: None,
    }]);
    let m = app.post("BAD", &sms(TO, "hi")).await.json();
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(m["error"]["provider_code"], "BAD_REQUEST");
    assert_eq!(app.mock.created(), 0);
    assert_eq!(app.mock.call_count(), 2, "no retry");
    assert_eq!(app.mock.stats().lookups, 0);
}

async fn accepted_then_dropped_is_found_and_not_resent(backend: Backend) {
    let app = spawn_infobip(backend).await;
    for (key, behaviour) in [
        ("DROP", Behaviour::AcceptThenDrop),
        ("FIVE-HUNDRED", Behaviour::AcceptThenFail { status: 500 }),
    ] {
        let body = format!("Your order {key} shipped");
        let calls = app.mock.call_count();
        let lookups = app.mock.stats().lookups;
        app.mock.push([behaviour]);
        let m = app.post(key, &sms(TO, &body)).await.json();
        assert_eq!(m["status"], "sent", "{key}: {m}");
        assert_eq!(m["attempts"], 1, "{key}: found, not resent");
        assert_eq!(m["provider_message_id"], m["id"], "{key}");
        assert_eq!(app.mock.call_count(), calls + 1, "{key}: one send");
        assert_eq!(app.mock.stats().lookups, lookups + 1, "{key}: one lookup");
        assert_eq!(app.mock.deliveries_to(TO, &body), 1, "{key}");
        let attempts = app.get(&format!("/messages/{key}/attempts")).await.json();
        assert_eq!(attempts["data"][0]["outcome"], "ambiguous", "{key}");
    }
    assert_eq!(app.mock.infobip_messages().len(), 2);
}

/// Two messages to the same number with the same text, both answered by a
/// dropped connection at once: each is found under its own id, so neither
/// waits on the other (a lookup by our id cannot return another message's
/// SMS, unlike a lookup by content).
async fn same_text_twice_at_once_each_is_found_by_its_own_id(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock
        .push([Behaviour::AcceptThenDrop, Behaviour::AcceptThenDrop]);
    let body = sms(TO, "Your parcel is at the door");
    let (a, b) = tokio::join!(app.post("TWIN-A", &body), app.post("TWIN-B", &body));
    assert!(a.status == 201 || a.status == 202, "{}", a.status);
    assert!(b.status == 201 || b.status == 202, "{}", b.status);
    let a = app.wait_for_status("TWIN-A", "sent").await;
    let b = app.wait_for_status("TWIN-B", "sent").await;
    assert_eq!(a["provider_message_id"], a["id"]);
    assert_eq!(b["provider_message_id"], b["id"]);
    assert_eq!(
        (a["attempts"].clone(), b["attempts"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(app.mock.call_count(), 2, "neither resent");
    assert_eq!(app.mock.deliveries_to(TO, "Your parcel is at the door"), 2);
}

async fn nothing_in_the_logs_is_never_resent_and_ends_unknown_at_the_deadline(backend: Backend) {
    let app = spawn_infobip_on_a_manual_clock(backend, None).await;
    // The connection drops before Infobip creates anything: its logs will
    // never show it, but an empty log cannot tell that from one that lags.
    app.mock.infobip_drop_before_create(1);
    post_now(&app, "NOTHING", "hello").await;
    settled(&app, 1).await;
    let m = app.get("/messages/NOTHING").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(app.mock.stats().lookups, 1, "looked up once");
    // Minutes later, the log still empty: asked again, never resent.
    for n in 2..=3 {
        advance_and_recheck(&app, Duration::from_secs(120), n).await;
        let m = app.get("/messages/NOTHING").await.json();
        assert_eq!(m["status"], "processing", "lookup {n}: {m}");
        assert_eq!(app.mock.call_count(), 1, "lookup {n}: never resent");
    }
    // Past the retry deadline: nobody can tell, so `unknown`, never failed.
    advance_and_recheck(&app, Duration::from_secs(15 * 60), 4).await;
    let m = app.wait_for_status("NOTHING", "unknown").await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["error"]["code"], "outcome_unknown", "{m}");
    assert_eq!(app.mock.call_count(), 1);
    assert_eq!(app.mock.created(), 0);
}

async fn failing_lookups_keep_it_in_flight_and_never_resend(backend: Backend) {
    let app = spawn_infobip_on_a_manual_clock(backend, None).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    app.mock.infobip_fail_lookups(1000);
    post_now(&app, "BLIND", "hello").await;
    settled(&app, 1).await;
    let m = app.get("/messages/BLIND").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(app.mock.stats().lookups, 1);
    // Well past the lookup delay, every lookup failing: asked again each
    // time, never resent, never failed.
    for n in 2..=4 {
        advance_and_recheck(&app, Duration::from_secs(90), n).await;
        let m = app.get("/messages/BLIND").await.json();
        assert_eq!(m["status"], "processing", "lookup {n}: {m}");
        assert_eq!(app.mock.call_count(), 1, "lookup {n}: never resent");
    }
    // Once the logs answer: found, sent, the one message.
    app.mock.infobip_fail_lookups(0);
    advance_and_recheck(&app, Duration::from_secs(1), 5).await;
    let m = app.wait_for_status("BLIND", "sent").await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(app.mock.call_count(), 1);
    assert_eq!(app.mock.deliveries_to(TO, "hello"), 1);
}

async fn a_duplicate_id_answer_without_declared_idempotency_is_looked_up(backend: Backend) {
    let app = spawn_infobip_on_a_manual_clock(backend, None).await;
    // Infobip refuses the id (its idempotency is on for this account, but
    // the operator did not declare it): that says a message with our id
    // reached Infobip, not that it was accepted, so it is looked up.
    app.mock
        .infobip_reject_next("REJECTED_DUPLICATE_MESSAGE_ID");
    post_now(&app, "DUP", "hello").await;
    settled(&app, 1).await;
    let m = app.get("/messages/DUP").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(app.mock.call_count(), 1, "not resent");
    // The logs show only the repeat's refusal: nothing of a first send.
    advance_and_recheck(&app, Duration::from_secs(120), 2).await;
    assert_eq!(app.mock.call_count(), 1, "never resent");
    assert_eq!(
        app.mock.infobip_logged(
            app.get("/messages/DUP").await.json()["id"]
                .as_str()
                .unwrap()
        ),
        ["REJECTED_DUPLICATE_MESSAGE_ID"]
    );
    assert_eq!(app.mock.created(), 0);
}

/// `INFOBIP_IDEMPOTENCY_GRACE` declared, and the mock's idempotency on as
/// Infobip documents it: an ambiguous answer is resent under the same
/// `messageId`, never looked up, and the one message is all there is.
async fn declared_idempotency_resends_under_the_same_id(backend: Backend) {
    let grace = Duration::from_secs(24 * 3600);
    let app = spawn_infobip_on_a_manual_clock(backend, Some(grace)).await;
    app.mock.infobip_set_idempotency(Some(grace));
    // Created, the answer lost: the resend is refused as a repeat, which
    // with idempotency declared means Infobip has it.
    app.mock.push([Behaviour::AcceptThenDrop]);
    post_now(&app, "DECLARED-1", "created once").await;
    eventually("the first send", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    eventually("its retry to be written", || async {
        let due = app
            .db
            .count("SELECT count(*) FROM messages WHERE next_attempt_at IS NOT NULL")
            .await;
        (due == 1).then_some(())
    })
    .await;
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(app.handle.scheduler.tick().await.expect("scan"), 1);
    let m = app.wait_for_status("DECLARED-1", "sent").await;
    assert_eq!(m["attempts"], 2, "{m}");
    assert_eq!(m["provider_message_id"], m["id"], "{m}");
    let ids = sent_ids(&app);
    assert_eq!(ids, [ids[0].clone(), ids[0].clone()], "the same messageId");
    let id = m["id"].as_str().unwrap();
    assert_eq!(
        app.mock.infobip_logged(id),
        ["PENDING_ACCEPTED", "REJECTED_DUPLICATE_MESSAGE_ID"]
    );
    assert_eq!(app.mock.deliveries_to(TO, "created once"), 1);
    assert_eq!(app.mock.stats().lookups, 0, "resent, never looked up");

    // Nothing created, the answer lost: the resend creates the one message.
    app.mock.infobip_drop_before_create(1);
    post_now(&app, "DECLARED-2", "created on the resend").await;
    eventually("the first send", || async {
        (app.mock.call_count() == 3).then_some(())
    })
    .await;
    eventually("its retry to be written", || async {
        let due = app
            .db
            .count("SELECT count(*) FROM messages WHERE next_attempt_at IS NOT NULL")
            .await;
        (due == 1).then_some(())
    })
    .await;
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(app.handle.scheduler.tick().await.expect("scan"), 1);
    let m = app.wait_for_status("DECLARED-2", "sent").await;
    assert_eq!(m["attempts"], 2, "{m}");
    assert_eq!(app.mock.deliveries_to(TO, "created on the resend"), 1);

    // After an ambiguous attempt, a refusal of the repeat says nothing of
    // the first: `unknown`, never `failed`.
    app.mock.push([Behaviour::AcceptThenDrop]);
    post_now(&app, "DECLARED-3", "refused on the resend").await;
    eventually("the first send", || async {
        (app.mock.call_count() == 5).then_some(())
    })
    .await;
    eventually("its retry to be written", || async {
        let due = app
            .db
            .count("SELECT count(*) FROM messages WHERE next_attempt_at IS NOT NULL")
            .await;
        (due == 1).then_some(())
    })
    .await;
    app.mock.infobip_reject_next("REJECTED_DESTINATION");
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(app.handle.scheduler.tick().await.expect("scan"), 1);
    let m = app.wait_for_status("DECLARED-3", "unknown").await;
    assert_eq!(m["error"]["code"], "provider_rejected", "{m}");
    assert_eq!(m["error"]["provider_code"], "REJECTED_DESTINATION", "{m}");
    assert_eq!(app.mock.deliveries_to(TO, "refused on the resend"), 1);
}

/// Posts a delivery report body to the Infobip endpoint with `secret` as
/// the query parameter (none: no parameter).
async fn post_reports(app: &TestApp, secret: Option<&str>, body: &serde_json::Value) -> Answer {
    let mut url = format!("{}/providers/infobip/status", app.base);
    if let Some(s) = secret {
        url.push_str(&format!("?secret={s}"));
    }
    let req = app
        .client
        .post(url)
        .header("Content-Type", "application/json")
        .body(body.to_string());
    answer(req.send().await.expect("report POST")).await
}

fn report(id: &str, group: &str, name: &str) -> serde_json::Value {
    json!({
        "bulkId": "b-1", "messageId": id, "to": "14155550100", "sender": DEFAULT_FROM,
        "messageCount": 1,
        "status": {"groupId": 0, "groupName": group, "id": 0, "name": name, "description": "d"},
        "error": {"groupId": 0, "groupName": "OK", "id": 0, "name": "NO_ERROR",
                  "description": "No Error", "permanent": false},
    })
}

async fn delivery_reports_are_matched_batched_and_deduplicated(backend: Backend) {
    let app = spawn_infobip(backend).await;
    let a = app.post("R-A", &sms(TO, "one")).await.json();
    let b = app.post("R-B", &sms(TO, "two")).await.json();
    let (a_id, b_id) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let receipts = || app.db.count("SELECT count(*) FROM receipts");

    // The mock posts one request with both reports, to the URL each
    // message carried.
    assert_eq!(app.mock.infobip_report_all("delivered").await, Some(200));
    assert_eq!(app.wait_for_status("R-A", "delivered").await["id"], a_id);
    assert_eq!(app.wait_for_status("R-B", "delivered").await["id"], b_id);
    assert_eq!(receipts().await, 2);

    // The same batch again: both duplicates, nothing changes.
    let both = json!({"results": [
        report(a_id, "DELIVERED", "DELIVERED_TO_HANDSET"),
        report(b_id, "DELIVERED", "DELIVERED_TO_HANDSET"),
    ]});
    let again = post_reports(&app, Some(RECEIPT_SECRET), &both).await;
    assert_eq!(again.status, 200);
    let acks = again.json();
    assert_eq!(acks["receipts"].as_array().unwrap().len(), 2, "{acks}");
    for ack in acks["receipts"].as_array().unwrap() {
        assert_eq!(ack["duplicate"], true, "{acks}");
        assert_eq!(ack["applied"], false, "{acks}");
    }
    assert_eq!(receipts().await, 2);

    // One report alone is answered as one receipt.
    let c = app.post("R-C", &sms(TO, "three")).await.json();
    let c_id = c["id"].as_str().unwrap();
    let one = json!({"results": [report(c_id, "UNDELIVERABLE", "UNDELIVERABLE_NOT_DELIVERED")]});
    let a = post_reports(&app, Some(RECEIPT_SECRET), &one).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["message_id"], c_id);
    assert_eq!(a.json()["applied"], true);
    assert_eq!(
        app.get("/messages/R-C").await.json()["status"],
        "undelivered"
    );

    // A report for a message we do not know is kept, unmatched.
    let stranger = json!({"results": [report("not-ours", "DELIVERED", "DELIVERED_TO_HANDSET")]});
    let a = post_reports(&app, Some(RECEIPT_SECRET), &stranger).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["message_id"], serde_json::Value::Null);

    // A pending report is recorded and changes nothing; an intermediate
    // DELIVERED_TO_OPERATOR is not a delivery.
    let d = app.post("R-D", &sms(TO, "four")).await.json();
    let d_id = d["id"].as_str().unwrap();
    let not_yet = json!({"results": [
        report(d_id, "PENDING", "PENDING_WAITING_DELIVERY"),
        report(d_id, "DELIVERED", "DELIVERED_TO_OPERATOR"),
    ]});
    let a = post_reports(&app, Some(RECEIPT_SECRET), &not_yet).await;
    assert_eq!(a.status, 200, "{:?}", a.json());
    assert_eq!(app.get("/messages/R-D").await.json()["status"], "sent");
}

async fn forged_reports_are_refused_and_change_nothing(backend: Backend) {
    let app = spawn_infobip(backend).await;
    let m = app.post("F-1", &sms(TO, "hi")).await.json();
    let id = m["id"].as_str().unwrap();
    let body = json!({"results": [report(id, "UNDELIVERABLE", "UNDELIVERABLE_NOT_DELIVERED")]});
    for (what, secret) in [
        ("no secret", None),
        ("a wrong secret", Some("not-the-receipt-secret-0123")),
        ("a prefix of it", Some(&RECEIPT_SECRET[..10])),
        ("empty", Some("")),
    ] {
        let a = post_reports(&app, secret, &body).await;
        assert_eq!(a.status, 403, "{what}");
    }
    // Basic credentials with the wrong password are no better.
    let a = app
        .client
        .post(format!("{}/providers/infobip/status", app.base))
        .basic_auth("infobip", Some("wrong-password-0123456789"))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 403);
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
    assert_eq!(app.get("/messages/F-1").await.json()["status"], "sent");

    // The secret as the Basic password is accepted.
    let a = app
        .client
        .post(format!("{}/providers/infobip/status", app.base))
        .basic_auth("infobip", Some(RECEIPT_SECRET))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(
        app.get("/messages/F-1").await.json()["status"],
        "undelivered"
    );

    // A batch with one unreadable report is refused whole.
    let m = app.post("F-2", &sms(TO, "hi")).await.json();
    let id = m["id"].as_str().unwrap();
    let half = json!({"results": [
        report(id, "DELIVERED", "DELIVERED_TO_HANDSET"),
        {"status": {"groupName": "DELIVERED"}},
    ]});
    let a = post_reports(&app, Some(RECEIPT_SECRET), &half).await;
    assert_eq!(a.status, 400, "missing fields, as on every receipt route");
    assert_eq!(app.get("/messages/F-2").await.json()["status"], "sent");
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 1);
}

async fn the_mock_reports_to_the_url_each_message_carried(backend: Backend) {
    let app = spawn_infobip(backend).await;
    app.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::Duplicated,
        ..ReceiptConfig::default()
    });
    app.post("AUTO", &sms(TO, "hi")).await;
    app.wait_for_status("AUTO", "delivered").await;
    // sent, delivered, delivered again: two receipts stored.
    eventually("both receipts", || async {
        (app.db.count("SELECT count(*) FROM receipts").await == 2).then_some(())
    })
    .await;
}

on_both_backends!(
    sends_json_with_our_id_and_keeps_it,
    bad_credentials_are_refused,
    a_refusal_quoting_the_report_url_shows_no_secret,
    throttling_is_retried,
    a_rejected_destination_fails,
    accepted_then_dropped_is_found_and_not_resent,
    same_text_twice_at_once_each_is_found_by_its_own_id,
    nothing_in_the_logs_is_never_resent_and_ends_unknown_at_the_deadline,
    failing_lookups_keep_it_in_flight_and_never_resend,
    a_duplicate_id_answer_without_declared_idempotency_is_looked_up,
    declared_idempotency_resends_under_the_same_id,
    delivery_reports_are_matched_batched_and_deduplicated,
    forged_reports_are_refused_and_change_nothing,
    the_mock_reports_to_the_url_each_message_carried,
);

fn outgoing(body: &str) -> OutgoingSms {
    OutgoingSms {
        message_id: MessageId::new(),
        to: sendonce::domain::Recipient::from_stored(TO, &[]).expect("E.164"),
        from: None,
        body: body.into(),
        validity: None,
        attempt: 1,
        prepared: None,
    }
}

fn aged(age: Duration) -> AttemptRef {
    AttemptRef {
        started_at: time::OffsetDateTime::now_utc(),
        age,
        sender: None,
    }
}

/// The adapter against the mock directly: the mock de-duplicates nothing
/// unless its idempotency is on, and the adapter's lookup answers by its
/// rules (found; nothing yet, at any age; the attempt's own rejection; a
/// repeat's refusal; a failing lookup; an attempt too old for Infobip's
/// logs).
#[tokio::test]
async fn the_adapter_and_the_mock_follow_infobips_rules() {
    sendonce::install_crypto_provider();
    let (mock, url, _) = MockProvider::start().await.unwrap();
    let base = url.trim_end_matches("/messages");
    let p = InfobipProvider::new(settings(base, None)).unwrap();
    let declared =
        InfobipProvider::new(settings(base, Some(Duration::from_secs(24 * 3600)))).unwrap();
    assert!(!p.dedupes_by_key() && !p.rejection_covers_earlier_attempts());
    assert!(declared.dedupes_by_key() && !declared.rejection_covers_earlier_attempts());
    let first = outgoing("Your code is 4821");
    let accepted = SendOutcome::Accepted {
        provider_message_id: first.message_id.to_string(),
        http_status: Some(200),
    };
    assert_eq!(p.send(&first).await, accepted);
    // The same id again, idempotency off (Infobip's default): a second
    // message.
    assert_eq!(p.send(&first).await, accepted);
    assert_eq!(mock.deliveries_to(TO, "Your code is 4821"), 2);
    // With it on: the repeat refused, nothing created; ambiguous unless
    // declared, accepted under our id when declared.
    mock.infobip_set_idempotency(Some(Duration::from_secs(3600)));
    match p.send(&first).await {
        SendOutcome::Ambiguous { message, .. } => {
            assert!(
                message.contains("REJECTED_DUPLICATE_MESSAGE_ID"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(declared.send(&first).await, accepted);
    assert_eq!(mock.deliveries_to(TO, "Your code is 4821"), 2);
    // The same text under another id is another message.
    let second = outgoing("Your code is 4821");
    assert_eq!(p.send(&second).await.class(), "ok");
    assert_eq!(mock.deliveries_to(TO, "Your code is 4821"), 3);

    // Found by its id, at once.
    let now = aged(Duration::ZERO);
    let sent = |sms: &OutgoingSms| Reconciled::Sent {
        provider_message_id: sms.message_id.to_string(),
    };
    assert_eq!(p.reconcile(&first, &now).await, sent(&first));
    // Never created: not known yet, at any age (the log may lag).
    let never = outgoing("never sent");
    for age in [0, 60, 3600] {
        let got = p.reconcile(&never, &aged(Duration::from_secs(age))).await;
        assert!(matches!(got, Reconciled::Pending(_)), "{age} s: {got:?}");
    }
    // Logs lagging: nothing yet, however late.
    mock.infobip_set_log_lag(Duration::from_secs(3600));
    let late = aged(Duration::from_secs(3600));
    assert!(matches!(
        p.reconcile(&second, &late).await,
        Reconciled::Pending(_)
    ));
    mock.infobip_set_log_lag(Duration::ZERO);
    // Rejected before it could be sent: the attempt's own answer.
    let refused = outgoing("refused");
    mock.infobip_reject_next("REJECTED_DESTINATION");
    assert_eq!(p.send(&refused).await.class(), "permanent");
    match p.reconcile(&refused, &now).await {
        Reconciled::Answered(SendOutcome::Rejected { provider_code, .. }) => {
            assert_eq!(provider_code.as_deref(), Some("REJECTED_DESTINATION"));
        }
        other => panic!("{other:?}"),
    }
    // A failing lookup: asked again, whatever the age.
    mock.infobip_fail_lookups(1);
    assert!(matches!(
        p.reconcile(&first, &late).await,
        Reconciled::Pending(_)
    ));
    // Older than Infobip's logs are kept: nobody can tell.
    let old = aged(Duration::from_secs(48 * 3600));
    assert!(matches!(
        p.reconcile(&first, &old).await,
        Reconciled::Unknown(_)
    ));
    // A recipient Infobip cannot reach: refused before any request, as the
    // send would have answered.
    let chat = OutgoingSms {
        to: sendonce::domain::Recipient::from_stored(
            "telegram:42",
            sendonce::provider::registry::chat_channels(),
        )
        .expect("a chat"),
        ..outgoing("to a chat")
    };
    assert!(matches!(
        p.reconcile(&chat, &now).await,
        Reconciled::Answered(SendOutcome::Refused { .. })
    ));
}

/// `INFOBIP_IDEMPOTENCY_GRACE` shorter than `SENDONCE_RETRY_DEADLINE` plus
/// an hour stops the binary at start (exit code 2, one line naming both):
/// a resend relies on Infobip refusing the repeat, which it does only within
/// the grace period. `INFOBIP_LOOKUP_AFTER` is still taken, whatever it says.
#[tokio::test]
async fn the_binary_refuses_a_grace_period_the_deadline_could_outlast() {
    let infobip = [
        ("SENDONCE_PROVIDER", "infobip"),
        ("INFOBIP_API_KEY", "k"),
        ("INFOBIP_BASE_URL", "xk3e9.api.infobip.com"),
    ];
    // (extra variables, refused)
    let table: [(&[(&str, &str)], bool); 5] = [
        (&[("INFOBIP_IDEMPOTENCY_GRACE", "30m")], true),
        (&[("INFOBIP_IDEMPOTENCY_GRACE", "75m")], false),
        (
            &[
                ("INFOBIP_IDEMPOTENCY_GRACE", "2h"),
                ("SENDONCE_RETRY_DEADLINE", "2h"),
            ],
            true,
        ),
        (&[("INFOBIP_IDEMPOTENCY_GRACE", "24h")], false),
        (&[("INFOBIP_LOOKUP_AFTER", "2h")], false),
    ];
    for (extra, refused) in table {
        let out = crate::process::sendonce("postgres://x@127.0.0.1:1/db")
            .arg("migrate")
            .envs(infobip.iter().chain(extra.iter()).copied())
            .env("SENDONCE_DB_ACQUIRE_TIMEOUT", "200ms")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        if refused {
            assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
            assert!(
                stderr.contains("INFOBIP_IDEMPOTENCY_GRACE")
                    && stderr.contains("SENDONCE_RETRY_DEADLINE"),
                "{extra:?}: {stderr}"
            );
        } else {
            // Past the configuration: it fails on the unreachable database.
            assert!(
                stderr.contains("cannot reach the database"),
                "{extra:?}: {stderr}"
            );
        }
    }
}
