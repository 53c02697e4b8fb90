//! A one-time code must not leak through a provider's error text (issue 29,
//! finding 2): a provider that quotes the SMS in its refusal would put the
//! code into the attempt, the message's error and the events feed, where
//! whoever reads the failed send could approve the verification later.
//! Nor through its error *code* (issue 41, finding 1): the generic `http`
//! mock quotes the text in the code field as well.

use testkit::mock_provider::Behaviour;

use crate::helpers::*;

const TO: &str = "+14155550123";

async fn a_provider_quoting_the_code_leaks_it_nowhere(backend: Backend) {
    quoting_leaks_nothing(backend, Some(crate::twilio::twilio()), "Body").await;
}

async fn a_provider_quoting_the_code_in_its_error_code_leaks_it_nowhere(backend: Backend) {
    quoting_leaks_nothing(backend, None, "body").await;
}

/// The mock refuses the verification's SMS quoting it; `field` is where
/// the SMS is in the request the provider saw.
async fn quoting_leaks_nothing(backend: Backend, provider: Option<ProviderFactory>, field: &str) {
    let app = spawn_with(TestOptions {
        backend,
        provider,
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::RejectQuoting { status: 400 }]);
    let started = app
        .request(reqwest::Method::POST, "/verifications")
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "QUOTED")
        .json(&serde_json::json!({ "to": TO }))
        .send()
        .await
        .expect("POST /verifications");
    let started = answer(started).await;
    assert_eq!(
        started.status,
        201,
        "{}",
        String::from_utf8_lossy(&started.bytes)
    );
    let id = started.json()["id"].as_str().expect("id").to_string();
    let m = eventually("the send to fail", || async {
        let v = app.get(&format!("/verifications/{id}")).await.json();
        let m = v["messages"][0].clone();
        (m["status"] == "failed").then_some(m)
    })
    .await;
    // The code, as the provider saw it.
    let sent = app.mock.calls()[0].body[field]
        .as_str()
        .expect("the SMS")
        .to_string();
    let code: String = sent.chars().filter(char::is_ascii_digit).collect();
    assert!(code.len() >= 4, "{sent}");

    let key = m["idempotency_key"].as_str().expect("key");
    let message = app.get(&format!("/messages/{key}")).await;
    assert!(
        message.json()["error"]["message"]
            .as_str()
            .is_some_and(|e| e.contains("invalid message")),
        "the refusal is shown: {}",
        message.json()
    );
    for path in [
        format!("/messages/{key}"),
        format!("/messages/{key}/attempts"),
        format!("/messages/{key}/events"),
        format!("/verifications/{id}"),
        "/events".to_string(),
    ] {
        let a = app.get(&path).await;
        assert_eq!(a.status, 200, "{path}");
        let text = String::from_utf8_lossy(&a.bytes);
        assert!(!text.contains(&code), "{path} shows the code: {text}");
    }
    // The code is scrubbed, not dropped: what is left of it still tells.
    if field == "body" {
        let attempts = app.get(&format!("/messages/{key}/attempts")).await.json();
        let shown = attempts.to_string();
        assert!(
            shown.contains("BLOCKED_CONTENT:"),
            "the provider's code is shown: {shown}"
        );
    }
}

/// Issue 41: a receipt's error code and status word go through the same
/// scrub as a send's answer. A provider quoting a configured secret (the
/// receipt secret, its token) or the SMS (a code) in a receipt has neither
/// stored nor shown in the events, the message's error or the receipt's
/// identity.
async fn a_receipt_quoting_a_secret_or_the_code_shows_neither(backend: Backend) {
    const RECEIPT_SECRET: &str = "receipt-secret-0123456789";
    const TOKEN: &str = "provider-token";
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        RECEIPT_SECRET,
    )])
    .expect("receipt settings");
    settings.provider.secrets =
        sendonce::provider::Secrets::new([RECEIPT_SECRET.to_string(), TOKEN.to_string()]);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let body = "Code 482913, tap";
    let sent = app.post("DLR-QUOTE", &sms(TO, body)).await;
    assert_eq!(sent.status, 201);
    let pmid = sent.json()["provider_message_id"]
        .as_str()
        .expect("provider id")
        .to_string();
    let receipt = serde_json::json!({
        "id": pmid,
        "status": "undelivered",
        "event_id": "ev-quote",
        "error_code": format!("{RECEIPT_SECRET}/{TOKEN}: {body}"),
    });
    let posted = app
        .client
        .post(format!("{}/providers/http/status", app.base))
        .header("X-Receipt-Secret", RECEIPT_SECRET)
        .json(&receipt)
        .send()
        .await
        .expect("POST receipt");
    let posted = answer(posted).await;
    assert_eq!(
        posted.status,
        200,
        "{}",
        String::from_utf8_lossy(&posted.bytes)
    );
    assert_eq!(posted.json()["applied"], true);

    let leaks = |text: &str| {
        [RECEIPT_SECRET, TOKEN, "482913", body]
            .into_iter()
            .filter(|s| text.contains(s))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // The message shows its own body; its error, and every event, show
    // neither the body nor a secret.
    let m = app.get("/messages/DLR-QUOTE").await.json();
    assert_eq!(m["status"], "undelivered", "{m}");
    let error = m["error"].to_string();
    assert_eq!(leaks(&error), Vec::<String>::new(), "the error: {error}");
    let events = app.get("/messages/DLR-QUOTE/events").await;
    assert_eq!(events.status, 200);
    let text = String::from_utf8_lossy(&events.bytes);
    assert_eq!(leaks(&text), Vec::<String>::new(), "the events: {text}");
    // Stored without them, not only shown without them.
    let stored = app.handle.store.unmatched_receipts(10).await.expect("read");
    assert!(stored.is_empty(), "matched to its message");
    let code = m["error"]["provider_code"]
        .as_str()
        .expect("a code")
        .to_string();
    assert!(code.contains("[secret]"), "scrubbed, not dropped: {code}");
    let rows = app
        .handle
        .store
        .receipts(sendonce::domain::MessageId(
            m["id"]
                .as_str()
                .and_then(|id| id.strip_prefix("msg_"))
                .and_then(|id| uuid::Uuid::parse_str(id).ok())
                .expect("message id"),
        ))
        .await
        .expect("receipts");
    assert_eq!(rows.len(), 1, "{text}");
    let row = format!("{:?}", rows[0]);
    assert_eq!(leaks(&row), Vec::<String>::new(), "stored: {row}");
}

on_both_backends!(
    a_provider_quoting_the_code_leaks_it_nowhere,
    a_provider_quoting_the_code_in_its_error_code_leaks_it_nowhere,
    a_receipt_quoting_a_secret_or_the_code_shows_neither,
);
