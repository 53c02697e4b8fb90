//! Delivery receipts: authentication, de-duplication, forward-only status,
//! unknown messages, receipts that overtake the send, and the mock sending
//! them back on its own.

use std::collections::BTreeMap;
use std::time::Duration;

use sendonce::domain::{Encoding, IdempotencyKey, MessageId, Phone, Status};
use sendonce::provider::twilio::signature;
use sendonce::store::{Claim, Finish, Lease, NewMessage, NewReceipt, StoredResponse};
use serde_json::json;
use testkit::mock_provider::{ReceiptConfig, ReceiptOrder};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::helpers::*;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, spawn_twilio};

const SECRET: &str = "receipt-secret-0123456789";

/// How a test callback is signed.
enum Sign<'a> {
    Valid,
    Missing,
    Garbage,
    /// Signed for another URL than the one it is posted to.
    ForUrl(&'a str),
    /// Signed with another auth token.
    WithToken(&'a str),
}

async fn callback(
    app: &TestApp,
    params: &[(&str, &str)],
    token: Option<&str>,
    sign: Sign<'_>,
) -> Answer {
    let url = format!("{}/providers/twilio/status", app.base);
    let owned: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sig = match sign {
        Sign::Valid => Some(signature(AUTH_TOKEN, &url, &owned)),
        Sign::Missing => None,
        Sign::Garbage => Some("bm90IGEgc2lnbmF0dXJl".to_string()),
        Sign::ForUrl(other) => Some(signature(AUTH_TOKEN, other, &owned)),
        Sign::WithToken(t) => Some(signature(t, &url, &owned)),
    };
    let mut req = app
        .client
        .post(&url)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(sendonce::provider::twilio::encode_form(&owned));
    if let Some(sig) = sig {
        req = req.header("X-Twilio-Signature", sig);
    }
    if let Some(token) = token {
        req = req.header("I-Twilio-Idempotency-Token", token);
    }
    answer(req.send().await.expect("callback")).await
}

fn status_params<'a>(sid: &'a str, status: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("AccountSid", ACCOUNT),
        ("ApiVersion", "2010-04-01"),
        ("MessageSid", sid),
        ("MessageStatus", status),
        ("SmsSid", sid),
        ("SmsStatus", status),
        ("To", "+14155550100"),
    ]
}

async fn receipt_count(app: &TestApp) -> i64 {
    app.db.count("SELECT count(*) FROM receipts").await
}

/// Sends a message through Twilio; returns the first answer and its sid.
async fn sent(app: &TestApp, key: &str) -> (Answer, String) {
    let a = app
        .post(key, &sms("+14155550100", "Your code is 1234"))
        .await;
    assert_eq!(a.status, 201);
    let sid = a.json()["provider_message_id"]
        .as_str()
        .expect("sid")
        .to_string();
    (a, sid)
}

async fn a_signed_callback_moves_sent_to_delivered_but_never_the_replay(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let (first, sid) = sent(&app, "DLR-1").await;
    let a = callback(
        &app,
        &status_params(&sid, "delivered"),
        Some("tok-1"),
        Sign::Valid,
    )
    .await;
    assert_eq!(a.status, 200);
    let ack = a.json();
    assert_eq!(ack["duplicate"], false);
    assert_eq!(ack["applied"], true);
    assert!(ack["message_id"].as_str().unwrap().starts_with("msg_"));

    let m = app.get("/messages/DLR-1").await.json();
    assert_eq!(m["status"], "delivered");
    assert!(m["delivery_status_at"].is_string());
    assert!(m["error"].is_null());

    let replay = app
        .post("DLR-1", &sms("+14155550100", "Your code is 1234"))
        .await;
    assert_eq!(replay.status, 201);
    assert_eq!(
        replay.bytes, first.bytes,
        "a receipt never changes a replay"
    );
    assert_eq!(replay.json()["status"], "sent");

    let events = app.get("/messages/DLR-1/events").await.json();
    let data = events["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{events}");
    assert_eq!(data[0]["type"], "attempt");
    assert_eq!(data[0]["outcome"], "sent");
    assert_eq!(data[1]["type"], "receipt");
    assert_eq!(data[1]["provider_status"], "delivered");
    assert_eq!(data[1]["status"], "delivered");
    assert_eq!(data[1]["applied"], true);
    // Stored under what the signature covers, not the unsigned token.
    assert_eq!(data[1]["event_id"], format!("{sid}:delivered:"));
}

async fn bad_or_missing_signatures_are_403_and_change_nothing(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let (_, sid) = sent(&app, "DLR-FORGED").await;
    let params = status_params(&sid, "undelivered");
    for sign in [
        Sign::Missing,
        Sign::Garbage,
        Sign::ForUrl("https://evil.example.com/providers/twilio/status"),
        Sign::WithToken("another-accounts-token"),
    ] {
        let a = callback(&app, &params, None, sign).await;
        assert_eq!(a.status, 403);
        assert_eq!(a.slug(), "forbidden");
    }
    // Signed, then tampered with: one parameter changed in transit.
    let url = format!("{}/providers/twilio/status", app.base);
    let owned: Vec<(String, String)> = status_params(&sid, "delivered")
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sig = signature(AUTH_TOKEN, &url, &owned);
    let tampered = app
        .client
        .post(&url)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("X-Twilio-Signature", sig)
        .body(sendonce::provider::twilio::encode_form(&params))
        .send()
        .await
        .unwrap();
    assert_eq!(tampered.status(), 403);

    assert_eq!(receipt_count(&app).await, 0, "nothing recorded");
    assert_eq!(
        app.get("/messages/DLR-FORGED").await.json()["status"],
        "sent"
    );
}

async fn a_duplicate_receipt_changes_nothing_the_second_time(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let (_, sid) = sent(&app, "DLR-DUP").await;
    let params = status_params(&sid, "delivered");
    let first = callback(&app, &params, Some("tok-A"), Sign::Valid).await;
    assert_eq!(first.json()["applied"], true);
    let updated = app.get("/messages/DLR-DUP").await.json()["updated_at"].clone();
    let again = callback(&app, &params, Some("tok-A"), Sign::Valid).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["duplicate"], true);
    assert_eq!(again.json()["applied"], false);
    assert_eq!(receipt_count(&app).await, 1);
    assert_eq!(
        app.get("/messages/DLR-DUP").await.json()["updated_at"],
        updated
    );

    // Without Twilio's token the identity is MessageSid:MessageStatus.
    let sent_params = status_params(&sid, "sent");
    assert_eq!(
        callback(&app, &sent_params, None, Sign::Valid).await.json()["duplicate"],
        false
    );
    assert_eq!(
        callback(&app, &sent_params, None, Sign::Valid).await.json()["duplicate"],
        true
    );
    assert_eq!(receipt_count(&app).await, 2);
}

async fn out_of_order_receipts_never_move_the_status_back(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let (_, sid) = sent(&app, "DLR-ORDER").await;
    for (token, status, applied) in [
        ("t-delivered", "delivered", true),
        ("t-sent", "sent", false),
        ("t-queued", "queued", false),
        ("t-undelivered", "undelivered", false),
    ] {
        let a = callback(&app, &status_params(&sid, status), Some(token), Sign::Valid).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["applied"], applied, "{status}");
    }
    let m = app.get("/messages/DLR-ORDER").await.json();
    assert_eq!(m["status"], "delivered");
    let events = app.get("/messages/DLR-ORDER/events").await.json();
    let receipts: Vec<&serde_json::Value> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "receipt")
        .collect();
    let statuses: Vec<&str> = receipts
        .iter()
        .map(|e| e["provider_status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["delivered", "sent", "queued", "undelivered"]);
}

async fn undelivered_records_twilios_error_code(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let (_, sid) = sent(&app, "DLR-UNDELIVERED").await;
    let mut params = status_params(&sid, "undelivered");
    params.push(("ErrorCode", "30003"));
    let a = callback(&app, &params, Some("t-1"), Sign::Valid).await;
    assert_eq!(a.json()["applied"], true);
    let m = app.get("/messages/DLR-UNDELIVERED").await.json();
    assert_eq!(m["status"], "undelivered");
    assert_eq!(m["error"]["code"], "delivery_failed");
    assert_eq!(m["error"]["provider_code"], "30003");
    // A late `delivered` does not undo it either.
    let a = callback(
        &app,
        &status_params(&sid, "delivered"),
        Some("t-2"),
        Sign::Valid,
    )
    .await;
    assert_eq!(a.json()["applied"], false);
    assert_eq!(
        app.get("/messages/DLR-UNDELIVERED").await.json()["status"],
        "undelivered"
    );
}

async fn a_receipt_for_an_unknown_message_is_recorded_for_inspection(backend: Backend) {
    let app = spawn_twilio(backend).await;
    let a = callback(
        &app,
        &status_params("SMffffffffffffffffffffffffffffffff", "delivered"),
        Some("t-unknown"),
        Sign::Valid,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["message_id"], serde_json::Value::Null);
    assert_eq!(a.json()["applied"], false);
    let unmatched = app.handle.store.unmatched_receipts(10).await.unwrap();
    assert_eq!(unmatched.len(), 1);
    assert_eq!(
        unmatched[0].provider_message_id,
        "SMffffffffffffffffffffffffffffffff"
    );
    assert_eq!(unmatched[0].status, Some(Status::Delivered));

    // Missing fields in an authentic callback: 400, nothing recorded.
    let a = callback(&app, &[("AccountSid", ACCOUNT)], None, Sign::Valid).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.slug(), "validation");
    assert_eq!(receipt_count(&app).await, 1);
}

async fn http_receipts_need_the_shared_secret(backend: Backend) {
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        SECRET,
    )])
    .unwrap();
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let a = app.post("HTTP-DLR", &sms("+14155550100", "hi")).await;
    let id = a.json()["provider_message_id"]
        .as_str()
        .unwrap()
        .to_string();
    let receipt = json!({"id": id, "status": "delivered", "event_id": "ev-1"});
    let post = |secret: Option<&str>, body: String, content_type: &str| {
        let mut req = app
            .client
            .post(format!("{}/providers/http/status", app.base))
            .header("Content-Type", content_type)
            .body(body);
        if let Some(s) = secret {
            req = req.header("X-Receipt-Secret", s);
        }
        async move { answer(req.send().await.unwrap()).await }
    };
    for secret in [None, Some("wrong-secret-0123456789"), Some("")] {
        let a = post(secret, receipt.to_string(), "application/json").await;
        assert_eq!(a.status, 403);
        assert_eq!(a.slug(), "forbidden");
    }
    assert_eq!(receipt_count(&app).await, 0);

    let a = post(Some(SECRET), receipt.to_string(), "text/plain").await;
    assert_eq!(a.status, 415);
    let a = post(Some(SECRET), "{".into(), "application/json").await;
    assert_eq!(a.slug(), "malformed-json");
    let a = post(
        Some(SECRET),
        json!({"id": id}).to_string(),
        "application/json",
    )
    .await;
    assert_eq!(a.slug(), "validation");
    let problem = a.json();
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["event_id", "status"]);

    let a = post(Some(SECRET), receipt.to_string(), "application/json").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["applied"], true);
    let a = post(Some(SECRET), receipt.to_string(), "application/json").await;
    assert_eq!(a.json()["duplicate"], true);
    assert_eq!(
        app.get("/messages/HTTP-DLR").await.json()["status"],
        "delivered"
    );
    assert_eq!(receipt_count(&app).await, 1);
    let metrics = answer(
        app.request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.bytes).into_owned();
    for (outcome, n) in [("applied", 1), ("duplicate", 1)] {
        let line =
            format!("sendonce_receipts_total{{provider=\"http\",outcome=\"{outcome}\"}} {n}");
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
}

async fn the_mock_sends_receipts_back_in_every_order(backend: Backend) {
    let app = spawn_twilio(backend).await;
    for (i, order) in [
        ReceiptOrder::InOrder,
        ReceiptOrder::OutOfOrder,
        ReceiptOrder::Duplicated,
    ]
    .into_iter()
    .enumerate()
    {
        app.mock.set_receipts(ReceiptConfig {
            order,
            ..ReceiptConfig::default()
        });
        let key = format!("MOCK-DLR-{i}");
        let a = app.post(&key, &sms("+14155550100", &format!("m{i}"))).await;
        assert_eq!(a.json()["status"], "sent");
        app.wait_for_status(&key, "delivered").await;
        let events = eventually("both receipts recorded", || async {
            let e = app.get(&format!("/messages/{key}/events")).await.json();
            let receipts = e["data"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["type"] == "receipt")
                .count();
            (receipts == 2).then_some(e)
        })
        .await;
        let applied = events["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["applied"] == true)
            .count();
        assert_eq!(applied, 1, "{order:?}: {events}");
    }
    // Two distinct events per message: the duplicated run's repeat of its
    // final receipt was not recorded again.
    eventually("every receipt of the duplicated run answered", || async {
        (app.db.count("SELECT count(*) FROM receipts").await == 6).then_some(())
    })
    .await;

    // The `http` protocol's receipts too.
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        SECRET,
    )])
    .unwrap();
    let http = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    http.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::Duplicated,
        final_status: Some("undelivered".into()),
        error_code: Some("30005".into()),
        http_url: Some(format!("{}/providers/http/status", http.base)),
        http_secret: Some(SECRET.into()),
    });
    http.post("MOCK-HTTP", &sms("+14155550100", "hi")).await;
    let m = http.wait_for_status("MOCK-HTTP", "undelivered").await;
    assert_eq!(m["error"]["provider_code"], "30005");
}

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00 UTC);

fn new_message(tenant_id: Uuid, key: &str) -> NewMessage {
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164("+14155550100").unwrap().into(),
        from: None,
        body: "hi".into(),
        segments: 1,
        encoding: Encoding::Gsm7,
        metadata: BTreeMap::new(),
        validity_seconds: None,
        provider: "twilio".into(),
        route: None,
        route_order: None,
        sender: None,
        created_at: T0,
        expires_at: None,
        deadline_at: T0 + time::Duration::hours(1),
        cost: None,
    }
}

fn receipt(event: &str, pmid: &str, status: &str, at: OffsetDateTime) -> NewReceipt {
    NewReceipt {
        provider: "twilio".into(),
        event_id: event.into(),
        provider_message_id: pmid.into(),
        provider_status: status.into(),
        status: sendonce::http::receipts::delivery_status(status),
        error_code: None,
        received_at: at,
        message_id: None,
    }
}

/// The write that makes a message `sent` as provider message `pmid`.
fn sent_as(id: MessageId, lease: &Lease, pmid: &str) -> Finish {
    Finish {
        id,
        lease_token: lease.token,
        status: Status::Sent,
        provider_message_id: Some(pmid.into()),
        error: None,
        sent_at: Some(T0),
        updated_at: T0,
        response: StoredResponse {
            status_code: 201,
            body: b"{}".to_vec(),
        },
        attempt: None,
        opt_out: None,
    }
}

async fn a_receipt_that_overtakes_the_send_is_applied_when_the_send_is_recorded(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();

    // The receipt arrives first: nothing has that id yet.
    let early = store
        .record_receipt(&receipt("e1", "SM-early", "delivered", T0))
        .await
        .unwrap();
    assert_eq!(early.message_id, None);
    assert!(!early.applied);

    let m = new_message(tenant, "EARLY");
    let lease = Lease::new("a", Duration::from_secs(60));
    let Claim::Created(record) = store.insert_message(&m, &lease).await.unwrap() else {
        panic!("created");
    };
    let done = store
        .finish(&sent_as(record.id, &lease, "SM-early"))
        .await
        .unwrap();
    assert!(done);
    assert!(
        store
            .attach_receipts("twilio", "SM-early", T0 + time::Duration::seconds(1))
            .await
            .unwrap()
    );
    let after = store.message_by_id(record.id).await.unwrap().unwrap();
    assert_eq!(after.status, Status::Delivered);
    assert_eq!(after.delivery_status_at, Some(T0));
    assert_eq!(
        after.response.unwrap().body,
        b"{}".to_vec(),
        "frozen response untouched"
    );
    let linked = store.receipts(record.id).await.unwrap();
    assert_eq!(linked.len(), 1);
    assert!(linked[0].applied);
    assert!(store.unmatched_receipts(10).await.unwrap().is_empty());
    // Attaching again changes nothing.
    assert!(
        !store
            .attach_receipts("twilio", "SM-early", T0)
            .await
            .unwrap()
    );

    // Concurrent redeliveries of one event: recorded once.
    let redelivered = receipt("e2", "SM-early", "sent", T0);
    let results =
        crate::delivery::futures_join_all((0..10).map(|_| store.record_receipt(&redelivered)))
            .await;
    let fresh = results
        .into_iter()
        .map(|r| r.unwrap())
        .filter(|o| !o.duplicate)
        .count();
    assert_eq!(fresh, 1);
    assert_eq!(store.receipts(record.id).await.unwrap().len(), 2);

    // Unmatched receipts are purged after retention, the others with their message.
    store
        .record_receipt(&receipt("e3", "SM-nobody", "sent", T0))
        .await
        .unwrap();
    let purged = store
        .purge_unmatched_receipts(T0 + time::Duration::seconds(1), 100)
        .await
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(store.receipts(record.id).await.unwrap().len(), 2);
}

/// The send's instance stopped between writing the provider id and looking
/// for receipts that overtook it: the next pass over unlinked receipts, on
/// any instance, links and applies them; older ones and others' are left.
async fn a_receipt_a_stopped_instance_left_unlinked_is_linked_on_the_next_pass(backend: Backend) {
    let url = fresh_database_on(backend).await;
    let (store, _) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    let hour = time::Duration::hours(1);
    // Early receipts: one for the message below, one two hours older than
    // the pass for another message below, one for no message at all.
    for (event, pmid, at) in [
        ("o1", "SM-orphan", T0),
        ("o2", "SM-old", T0 - hour * 2),
        ("o3", "SM-nobody", T0),
    ] {
        let early = store
            .record_receipt(&receipt(event, pmid, "delivered", at))
            .await
            .unwrap();
        assert_eq!(early.message_id, None);
    }
    let mut ids = Vec::new();
    for (key, pmid) in [("ORPHAN", "SM-orphan"), ("OLD", "SM-old")] {
        let lease = Lease::new("a", Duration::from_secs(60));
        let Claim::Created(record) = store
            .insert_message(&new_message(tenant, key), &lease)
            .await
            .unwrap()
        else {
            panic!("created");
        };
        // Written, and then the instance stopped: nobody looked.
        assert!(
            store
                .finish(&sent_as(record.id, &lease, pmid))
                .await
                .unwrap()
        );
        ids.push(record.id);
    }
    let status = |id| {
        let store = &store;
        async move { store.message_by_id(id).await.unwrap().unwrap().status }
    };
    assert_eq!(status(ids[0]).await, Status::Sent);
    let pass = sendonce::delivery::orphans::Orphans {
        store: std::sync::Arc::clone(&store),
        clock: sendonce::clock::Clock::manual(T0 + time::Duration::minutes(1)),
        interval: Duration::from_secs(1),
        window: Duration::from_secs(3600),
    };
    assert_eq!(pass.run_once().await.unwrap(), 1);
    assert_eq!(status(ids[0]).await, Status::Delivered);
    let linked = store.receipts(ids[0]).await.unwrap();
    assert_eq!(linked.len(), 1);
    assert!(linked[0].applied);
    // Outside the window, or no message: left for `receipts unmatched`.
    assert_eq!(status(ids[1]).await, Status::Sent);
    assert_eq!(store.unmatched_receipts(10).await.unwrap().len(), 2);
    assert_eq!(pass.run_once().await.unwrap(), 0, "nothing twice");
}

on_both_backends!(
    a_signed_callback_moves_sent_to_delivered_but_never_the_replay,
    bad_or_missing_signatures_are_403_and_change_nothing,
    a_duplicate_receipt_changes_nothing_the_second_time,
    out_of_order_receipts_never_move_the_status_back,
    undelivered_records_twilios_error_code,
    a_receipt_for_an_unknown_message_is_recorded_for_inspection,
    http_receipts_need_the_shared_secret,
    the_mock_sends_receipts_back_in_every_order,
    a_receipt_that_overtakes_the_send_is_applied_when_the_send_is_recorded,
    a_receipt_a_stopped_instance_left_unlinked_is_linked_on_the_next_pass,
);
