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

on_both_backends!(
    a_provider_quoting_the_code_leaks_it_nowhere,
    a_provider_quoting_the_code_in_its_error_code_leaks_it_nowhere
);
