//! The Vonage adapter end to end, against the mock's Vonage SMS API: the
//! classes of its per-part statuses, the exactly-once rule (Vonage neither
//! de-duplicates on `client-ref` nor can be asked about it: an ambiguous
//! answer, or a message accepted only in part, ends `unknown` and is never
//! resent), and its delivery receipts by form, JSON and query string.

use std::sync::Arc;
use std::time::Duration;

use sendonce::provider::vonage::{SignatureMethod, sign};
use sendonce::provider::{HttpProvider, Provider, VonageProvider, VonageSettings};
use serde_json::{Value, json};
use testkit::mock_provider::{Behaviour, MockProvider, ReceiptConfig, ReceiptOrder};
use testkit::providers::vonage::ReceiptStyle;

use crate::helpers::*;

pub const API_KEY: &str = "vonage-key";
pub const API_SECRET: &str = "vonage-api-secret";
pub const SIGNATURE_SECRET: &str = "vonage-signature-secret";
pub const FROM: &str = "AcmeInc";
/// The recipient, in our E.164 and in Vonage's digits.
const TO: &str = "+14155550123";
const TO_DIGITS: &str = "14155550123";

pub fn settings(base_url: &str, callback: Option<String>) -> VonageSettings {
    VonageSettings {
        base_url: base_url.to_string(),
        api_key: API_KEY.into(),
        api_secret: API_SECRET.into(),
        from: FROM.into(),
        callback,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
    }
}

/// The receipt settings: signed with `SIGNATURE_SECRET` (sha256), or
/// unsigned ones allowed, or neither.
#[derive(Clone, Copy)]
enum Receipts {
    Signed,
    UnsignedAllowed,
    Closed,
}

/// Vonage aimed at the mock, with the instance's public URL as `callback`.
pub fn vonage() -> ProviderFactory {
    vonage_with(Receipts::Signed)
}

fn vonage_with(receipts: Receipts) -> ProviderFactory {
    Box::new(move |mock, app, settings_| {
        let pairs: &[(&str, &str)] = match receipts {
            Receipts::Signed => &[
                ("VONAGE_SIGNATURE_SECRET", SIGNATURE_SECRET),
                ("VONAGE_SIGNATURE_METHOD", "sha256"),
            ],
            Receipts::UnsignedAllowed => &[("VONAGE_RECEIPTS_UNSIGNED", "true")],
            Receipts::Closed => &[],
        };
        settings_.provider.receipts =
            sendonce::provider::registry::ReceiptRoutes::from_pairs(pairs.iter().copied())
                .expect("receipt settings");
        settings_.server.public_url = Some(app.to_string());
        let s = settings(mock, Some(format!("{app}/providers/vonage/status")));
        Arc::new(VonageProvider::new(s).expect("vonage provider"))
    })
}

async fn spawn_vonage(backend: Backend, receipts: Receipts) -> TestApp {
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(vonage_with(receipts)),
        ..TestOptions::default()
    })
    .await;
    app.mock
        .set_vonage_signing(SIGNATURE_SECRET, SignatureMethod::HmacSha256);
    app
}

/// Vonage first, the `http` provider (a second mock) after it.
async fn spawn_with_fallback(backend: Backend) -> (TestApp, MockProvider) {
    let (second, url, _) = MockProvider::start().await.expect("second mock");
    let fallback: Arc<dyn Provider> = Arc::new(
        HttpProvider::new(&url, None, Duration::from_secs(2), Duration::from_secs(1))
            .expect("http provider"),
    );
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(vonage()),
        fallbacks: vec![fallback],
        ..TestOptions::default()
    })
    .await;
    (app, second)
}

/// A scripted Vonage status for every part (in a `200`).
fn status(code: &str, text: &str) -> Behaviour {
    Behaviour::Fail {
        status: 400,
        body: json!({"vonage-status": code, "message": text}),
        retry_after: None,
    }
}

fn vonage_calls(app: &TestApp) -> Vec<Value> {
    app.mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "vonage")
        .map(|c| c.body)
        .collect()
}

async fn attempts(app: &TestApp, key: &str) -> Vec<(String, String)> {
    let a = app.get(&format!("/messages/{key}/attempts")).await.json();
    a["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap_or("?").to_string(),
                a["outcome"].as_str().unwrap_or("open").to_string(),
            )
        })
        .collect()
}

async fn accepted_with_our_id_as_client_ref(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    let a = app.post("V-OK", &sms(TO, "Your order 4711 shipped")).await;
    assert_eq!(a.status, 201);
    let m = a.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["provider"], "vonage");
    let ids: Vec<String> = app.mock.vonage_messages()[0].part_ids.clone();
    assert_eq!(m["provider_message_id"], ids[0]);
    let calls = vonage_calls(&app);
    assert_eq!(calls.len(), 1);
    let form = &calls[0];
    assert_eq!(form["api_key"], API_KEY);
    assert_eq!(form["api_secret"], API_SECRET);
    assert_eq!(form["from"], FROM);
    assert_eq!(form["to"], TO_DIGITS);
    assert_eq!(form["text"], "Your order 4711 shipped");
    assert_eq!(form["client-ref"], m["id"]);
    assert_eq!(form["status-report-req"], "1");
    assert_eq!(
        form["callback"],
        format!("{}/providers/vonage/status", app.base)
    );
    assert!(form.get("type").is_none(), "GSM-7: no type");
    // A body that is not GSM-7 goes as unicode.
    let a = app
        .post("V-UNICODE", &sms(TO, "Заказ 4711 отправлен"))
        .await;
    assert_eq!(a.json()["status"], "sent");
    assert_eq!(vonage_calls(&app)[1]["type"], "unicode");
    assert_eq!(
        app.mock.deliveries_to(TO_DIGITS, "Your order 4711 shipped"),
        1
    );
}

async fn account_refusals_move_on_or_fail_on_the_last(backend: Backend) {
    let (app, second) = spawn_with_fallback(backend).await;
    app.mock.push([status("4", "Bad Credentials")]);
    let m = app.post("V-REFUSED", &sms(TO, "hello")).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["provider"], "http");
    assert_eq!(
        attempts(&app, "V-REFUSED").await,
        [
            ("vonage".to_string(), "refused".to_string()),
            ("http".to_string(), "sent".to_string())
        ]
    );
    assert_eq!(second.deliveries_to(TO, "hello"), 1);
    assert_eq!(app.mock.created(), 0);

    // On the last provider: failed, after one call.
    let app = spawn_vonage(backend, Receipts::Signed).await;
    for (code, key) in [("4", "V-4"), ("8", "V-8"), ("9", "V-9")] {
        app.mock.push([status(code, "refused")]);
        let m = app.post(key, &sms(TO, "hello")).await.json();
        assert_eq!(m["status"], "failed", "{code}: {m}");
        assert_eq!(m["error"]["provider_code"], code);
        assert_eq!(attempts(&app, key).await.len(), 1, "{code}");
    }
    assert_eq!(app.mock.created(), 0);
}

async fn throttling_is_retried(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    // A 429 is Vonage's status 1 in a 200.
    app.mock.push([Behaviour::Fail {
        status: 429,
        body: json!({}),
        retry_after: None,
    }]);
    let m = app.post("V-THROTTLED", &sms(TO, "hi")).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["attempts"], 2);
    let a = app.get("/messages/V-THROTTLED/attempts").await.json();
    assert_eq!(a["data"][0]["outcome"], "retryable");
    assert_eq!(a["data"][0]["provider_code"], "1");
    assert_eq!(app.mock.deliveries_to(TO_DIGITS, "hi"), 1);
}

async fn refusals_of_the_message_fail_at_once(backend: Backend) {
    let (app, second) = spawn_with_fallback(backend).await;
    for code in ["2", "3", "6", "7", "15"] {
        app.mock.push([status(code, "Invalid Message")]);
        let key = format!("V-REJ-{code}");
        let m = app.post(&key, &sms(TO, "hi")).await.json();
        assert_eq!(m["status"], "failed", "{code}: {m}");
        assert_eq!(m["error"]["code"], "provider_rejected");
        assert_eq!(m["error"]["provider_code"], code);
        assert_eq!(
            attempts(&app, &key).await,
            [("vonage".to_string(), "rejected".to_string())],
            "no other provider"
        );
    }
    assert_eq!(second.call_count(), 0);
    assert_eq!(vonage_calls(&app).len(), 5);
}

async fn an_ambiguous_answer_ends_unknown_and_is_never_resent(backend: Backend) {
    let (app, second) = spawn_with_fallback(backend).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let m = app.post("V-DROP", &sms(TO, "Order 7 shipped")).await.json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(m["error"]["code"], "outcome_unknown");
    assert_eq!(app.mock.deliveries_to(TO_DIGITS, "Order 7 shipped"), 1);
    assert_eq!(vonage_calls(&app).len(), 1, "never resent");
    assert_eq!(second.call_count(), 0, "never moved on");
    // Status 5 (internal error) and a 500 alike.
    app.mock.push([
        status("5", "Internal Error"),
        Behaviour::AcceptThenFail { status: 500 },
    ]);
    let m = app.post("V-5", &sms(TO, "five")).await.json();
    assert_eq!(m["status"], "unknown", "{m}");
    let m = app.post("V-500", &sms(TO, "five hundred")).await.json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(vonage_calls(&app).len(), 3);
    assert_eq!(second.call_count(), 0);
    // Later attempts at nothing: a replay answers the same, sends nothing.
    let again = app.post("V-DROP", &sms(TO, "Order 7 shipped")).await.json();
    assert_eq!(again["status"], "unknown");
    assert_eq!(vonage_calls(&app).len(), 3);
}

async fn a_message_accepted_in_part_ends_unknown(backend: Backend) {
    let (app, second) = spawn_with_fallback(backend).await;
    let long = "Your parcel 4711 is on its way. ".repeat(8);
    app.mock.vonage_partial(1, 1);
    let m = app.post("V-PARTIAL", &sms(TO, &long)).await.json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(m["segments"], 2);
    assert_eq!(
        vonage_calls(&app).len(),
        1,
        "one set of parts, never resent"
    );
    assert_eq!(app.mock.vonage_messages().len(), 1);
    assert_eq!(second.call_count(), 0, "never moved on");
    let a = app.get("/messages/V-PARTIAL/attempts").await.json();
    assert_eq!(a["data"][0]["outcome"], "ambiguous");
    let why = a["data"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
        + a["data"][0]["message"].as_str().unwrap_or_default();
    assert!(why.contains("1 of the 2 parts"), "{a}");
    // Every part accepted: sent.
    let m = app.post("V-WHOLE", &sms(TO, &long)).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(app.mock.vonage_messages()[1].part_ids.len(), 2);
}

/// Posts a receipt for `id` as Vonage would, in `style`, signed with
/// `secret` (none: unsigned).
async fn post_receipt(
    app: &TestApp,
    style: ReceiptStyle,
    id: &str,
    client_ref: &str,
    status: &str,
    secret: Option<&str>,
) -> Answer {
    let mut params: Vec<(String, String)> = [
        ("msisdn", TO_DIGITS),
        ("to", FROM),
        ("network-code", "23410"),
        ("messageId", id),
        ("price", "0.03330000"),
        ("status", status),
        ("scts", "2001011400"),
        ("err-code", "0"),
        ("client-ref", client_ref),
        ("message-timestamp", "2020-01-01 12:00:00"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(secret) = secret {
        params.push(("timestamp".into(), "1764680000".into()));
        params.push(("nonce".into(), uuid::Uuid::new_v4().to_string()));
        let sig = sign(SignatureMethod::HmacSha256, secret, &params);
        params.push(("sig".into(), sig));
    }
    let url = format!("{}/providers/vonage/status", app.base);
    let form = sendonce::provider::twilio::encode_form(&params);
    let req = match style {
        ReceiptStyle::Form => app
            .client
            .post(&url)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form),
        ReceiptStyle::Json => {
            let object: serde_json::Map<String, Value> = params
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            app.client
                .post(&url)
                .header("Content-Type", "application/json")
                .body(Value::Object(object).to_string())
        }
        ReceiptStyle::Query => app.client.get(format!("{url}?{form}")),
    };
    answer(req.send().await.expect("receipt")).await
}

async fn receipts_by_form_json_and_query_are_matched_once(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    for (i, style) in [ReceiptStyle::Form, ReceiptStyle::Json, ReceiptStyle::Query]
        .into_iter()
        .enumerate()
    {
        let key = format!("V-DLR-{i}");
        let m = app.post(&key, &sms(TO, &format!("m{i}"))).await.json();
        assert_eq!(m["status"], "sent");
        let id = m["provider_message_id"].as_str().expect("id").to_string();
        let our = m["id"].as_str().expect("our id").to_string();
        let before = app.db.count("SELECT count(*) FROM receipts").await;
        // Forged: signed with another secret. 403, nothing recorded.
        let a = post_receipt(&app, style, &id, &our, "delivered", Some("forged")).await;
        assert_eq!(a.status, 403, "{style:?}");
        // Not signed at all.
        let a = post_receipt(&app, style, &id, &our, "delivered", None).await;
        assert_eq!(a.status, 403, "{style:?}");
        assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, before);
        assert_eq!(
            app.get(&format!("/messages/{key}")).await.json()["status"],
            "sent"
        );
        // Authentic.
        let a = post_receipt(&app, style, &id, &our, "delivered", Some(SIGNATURE_SECRET)).await;
        assert_eq!(a.status, 200, "{style:?}: {:?}", a.bytes);
        assert_eq!(a.json()["applied"], true);
        assert_eq!(a.json()["message_id"], our.as_str());
        // The same receipt again (fresh nonce and signature): a duplicate.
        let a = post_receipt(&app, style, &id, &our, "delivered", Some(SIGNATURE_SECRET)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["duplicate"], true, "{style:?}");
        assert_eq!(
            app.db.count("SELECT count(*) FROM receipts").await,
            before + 1
        );
        assert_eq!(
            app.get(&format!("/messages/{key}")).await.json()["status"],
            "delivered"
        );
    }
    // Undelivered with Vonage's words and error code.
    let m = app.post("V-DLR-FAILED", &sms(TO, "x")).await.json();
    let id = m["provider_message_id"].as_str().expect("id").to_string();
    let our = m["id"].as_str().expect("our id").to_string();
    let a = post_receipt(
        &app,
        ReceiptStyle::Form,
        &id,
        &our,
        "expired",
        Some(SIGNATURE_SECRET),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        app.get("/messages/V-DLR-FAILED").await.json()["status"],
        "undelivered"
    );
}

async fn the_mock_sends_signed_receipts_to_the_callback(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    for (i, style) in [ReceiptStyle::Form, ReceiptStyle::Json, ReceiptStyle::Query]
        .into_iter()
        .enumerate()
    {
        app.mock.set_vonage_receipt_style(style);
        app.mock.set_receipts(ReceiptConfig {
            order: ReceiptOrder::Duplicated,
            ..ReceiptConfig::default()
        });
        let key = format!("V-MOCK-DLR-{i}");
        let m = app.post(&key, &sms(TO, &format!("d{i}"))).await.json();
        assert_eq!(m["status"], "sent");
        app.wait_for_status(&key, "delivered").await;
    }
    app.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::InOrder,
        final_status: Some("undelivered".into()),
        error_code: Some("6".into()),
        ..ReceiptConfig::default()
    });
    app.post("V-MOCK-FAILED", &sms(TO, "f")).await;
    let m = app.wait_for_status("V-MOCK-FAILED", "undelivered").await;
    assert_eq!(m["error"]["provider_code"], "6");
}

async fn receipt_events(app: &TestApp, key: &str) -> Vec<Value> {
    let e = app.get(&format!("/messages/{key}/events")).await.json();
    e["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["type"] == "receipt")
        .collect()
}

/// Every part's receipts find the message when they all arrive before the
/// send's answer is saved (found by issue 42's ten runs: under load the
/// second part's receipts stayed unlinked; reproduced every time by holding
/// the answer 1.5 s).
async fn parts_receipts_that_overtake_the_send_find_the_message(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    app.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::InOrder,
        ..ReceiptConfig::default()
    });
    app.mock
        .push([Behaviour::AcceptThenDelay(Duration::from_millis(1500))]);
    let long = "Your parcel 4712 is on its way. ".repeat(8);
    let m = app.post("V-PARTS-EARLY", &sms(TO, &long)).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    app.wait_for_status("V-PARTS-EARLY", "delivered").await;
    let got = eventually("every part's receipts on the message", || async {
        let got = receipt_events(&app, "V-PARTS-EARLY").await;
        (got.len() == 4).then_some(got)
    })
    .await;
    assert_eq!(got.len(), 4);
    let unmatched = app
        .db
        .count("SELECT count(*) FROM receipts WHERE message_id IS NULL")
        .await;
    assert_eq!(unmatched, 0);
}

/// Vonage sends a receipt per part, each with its part's id: the parts
/// after the first find the message by `client-ref` (our id, signed).
async fn every_parts_receipts_find_the_message_by_client_ref(backend: Backend) {
    let app = spawn_vonage(backend, Receipts::Signed).await;
    app.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::InOrder,
        ..ReceiptConfig::default()
    });
    let long = "Your parcel 4711 is on its way. ".repeat(8);
    let m = app.post("V-PARTS", &sms(TO, &long)).await.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(app.mock.vonage_messages()[0].part_ids.len(), 2);
    app.wait_for_status("V-PARTS", "delivered").await;
    // accepted and delivered for each of the two parts. (Once, under a
    // loaded full run, only 3 of 4 were there after 10 s: a failed wait
    // says what the mock's posts were answered and what was recorded.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = receipt_events(&app, "V-PARTS").await;
        if got.len() == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every part's receipts on the message: {} of 4 after 10 s; recorded {got:?}; \
             the mock's receipt posts were answered {:?}",
            got.len(),
            app.mock.receipt_answers()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unmatched = app
        .db
        .count("SELECT count(*) FROM receipts WHERE message_id IS NULL")
        .await;
    assert_eq!(unmatched, 0);

    // A message that ended `unknown` (accepted in part): a receipt for its
    // accepted part is kept on it, and changes nothing.
    app.mock.set_receipts(ReceiptConfig::default());
    app.mock.vonage_partial(1, 1);
    let m = app.post("V-PARTS-UNKNOWN", &sms(TO, &long)).await.json();
    assert_eq!(m["status"], "unknown", "{m}");
    let our = m["id"].as_str().expect("our id").to_string();
    let part = app.mock.vonage_messages()[1].part_ids[0].clone();
    let a = post_receipt(
        &app,
        ReceiptStyle::Form,
        &part,
        &our,
        "delivered",
        Some(SIGNATURE_SECRET),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["message_id"], our.as_str());
    assert_eq!(a.json()["applied"], false);
    assert_eq!(receipt_events(&app, "V-PARTS-UNKNOWN").await.len(), 1);
    assert_eq!(
        app.get("/messages/V-PARTS-UNKNOWN").await.json()["status"],
        "unknown"
    );
    // A client-ref that is no message of ours: unmatched, kept.
    let a = post_receipt(
        &app,
        ReceiptStyle::Form,
        "0AFFFFFFFFFFFFFF",
        "msg_0123456789abcdef0123456789abcdef",
        "delivered",
        Some(SIGNATURE_SECRET),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["message_id"], Value::Null);
}

async fn unsigned_receipts_are_refused_without_the_flag(backend: Backend) {
    for (receipts, want) in [(Receipts::Closed, 403), (Receipts::UnsignedAllowed, 200)] {
        let app = spawn_vonage(backend, receipts).await;
        let m = app.post("V-UNSIGNED", &sms(TO, "u")).await.json();
        let id = m["provider_message_id"].as_str().expect("id").to_string();
        let our = m["id"].as_str().expect("our id").to_string();
        let a = post_receipt(&app, ReceiptStyle::Form, &id, &our, "delivered", None).await;
        assert_eq!(a.status, want);
        let status = app.get("/messages/V-UNSIGNED").await.json()["status"].clone();
        assert_eq!(status, if want == 200 { "delivered" } else { "sent" });
        // Without a secret, a signed receipt cannot be checked either.
        if want == 403 {
            let a = post_receipt(
                &app,
                ReceiptStyle::Query,
                &id,
                &our,
                "delivered",
                Some(SIGNATURE_SECRET),
            )
            .await;
            assert_eq!(a.status, 403);
        }
    }
}

on_both_backends!(
    accepted_with_our_id_as_client_ref,
    account_refusals_move_on_or_fail_on_the_last,
    throttling_is_retried,
    refusals_of_the_message_fail_at_once,
    an_ambiguous_answer_ends_unknown_and_is_never_resent,
    a_message_accepted_in_part_ends_unknown,
    receipts_by_form_json_and_query_are_matched_once,
    the_mock_sends_signed_receipts_to_the_callback,
    every_parts_receipts_find_the_message_by_client_ref,
    parts_receipts_that_overtake_the_send_find_the_message,
    unsigned_receipts_are_refused_without_the_flag,
);

/// Bad Vonage settings stop the binary at start: exit 2, one line naming
/// the variable.
#[tokio::test]
async fn configuration_errors_exit_2_naming_the_variable() {
    for (env, want) in [
        (
            &[
                ("SENDONCE_PROVIDER", "vonage"),
                ("VONAGE_API_SECRET", "s"),
                ("VONAGE_FROM", "Acme"),
            ][..],
            "VONAGE_API_KEY",
        ),
        (
            &[
                ("SENDONCE_PROVIDER", "vonage"),
                ("VONAGE_API_KEY", "k"),
                ("VONAGE_API_SECRET", "s"),
            ][..],
            "VONAGE_FROM",
        ),
        (
            &[("VONAGE_SIGNATURE_METHOD", "sha384")][..],
            "VONAGE_SIGNATURE_METHOD",
        ),
        (
            &[("VONAGE_RECEIPTS_UNSIGNED", "yes")][..],
            "VONAGE_RECEIPTS_UNSIGNED",
        ),
        (
            &[
                ("SENDONCE_PROVIDER", "vonage"),
                ("VONAGE_API_KEY", "k"),
                ("VONAGE_API_SECRET", "s"),
                ("VONAGE_FROM", "Acme"),
                ("VONAGE_BASE_URL", "ftp://rest.nexmo.com"),
            ][..],
            "VONAGE_BASE_URL",
        ),
    ] {
        let out = crate::process::sendonce("postgres://x@127.0.0.1:1/db")
            .envs(env.iter().copied())
            .env("SENDONCE_DB_ACQUIRE_TIMEOUT", "200ms")
            .output()
            .await
            .expect("run sendonce");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(want), "{env:?}: {stderr}");
    }
}
