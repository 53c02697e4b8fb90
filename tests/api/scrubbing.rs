//! A one-time code must not leak through a provider's error text (issue 29,
//! finding 2): a provider that quotes the SMS in its refusal would put the
//! code into the attempt, the message's error and the events feed, where
//! whoever reads the failed send could approve the verification later.

use testkit::mock_provider::Behaviour;

use crate::helpers::*;

const TO: &str = "+14155550123";

async fn a_provider_quoting_the_code_leaks_it_nowhere(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(crate::twilio::twilio()),
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
    let sent = app.mock.calls()[0].body["Body"]
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
}

on_both_backends!(a_provider_quoting_the_code_leaks_it_nowhere);
