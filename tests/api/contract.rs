//! Every line of the HTTP contract of POST /messages and GET /messages/{key}.

use serde_json::json;
use std::sync::Arc;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::helpers::*;

async fn first_post_sends_and_answers_201_with_the_message(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.allow_sender("ACME").await;
    let body = json!({
        "to": "+14155550100",
        "body": "Your order 92831 is confirmed",
        "from": "ACME",
        "metadata": {"order": "92831"}
    });
    let a = app.post("ORDER-92831-CONFIRMATION-SMS", &body).await;
    assert_eq!(a.status, 201);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(
        a.header("location"),
        Some("/messages/ORDER-92831-CONFIRMATION-SMS")
    );
    assert_eq!(a.header("idempotent-replayed"), None);
    let m = a.json();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["idempotency_key"], "ORDER-92831-CONFIRMATION-SMS");
    assert_eq!(m["status"], "sent");
    assert_eq!(m["to"], "+14155550100");
    assert_eq!(m["from"], "ACME");
    assert_eq!(m["body"], "Your order 92831 is confirmed");
    assert_eq!(m["segments"], 1);
    assert_eq!(m["encoding"], "gsm7");
    assert_eq!(m["metadata"], json!({"order": "92831"}));
    assert_eq!(m["provider"], "http");
    assert_eq!(m["provider_message_id"], "prov_1");
    assert_eq!(m["attempts"], 1);
    assert_eq!(m["error"], serde_json::Value::Null);
    for t in ["created_at", "updated_at", "sent_at"] {
        let s = m[t].as_str().unwrap();
        assert!(s.ends_with('Z'), "{t} = {s} is not RFC 3339 UTC");
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap();
    }

    // What the provider received: our wire format, our key, our token.
    let calls = app.mock.calls();
    assert_eq!(calls.len(), 1);
    let id = m["id"].as_str().unwrap();
    assert_eq!(calls[0].idempotency_key.as_deref(), Some(id));
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some("Bearer provider-token")
    );
    assert_eq!(
        calls[0].body,
        json!({"to": "+14155550100", "from": "ACME", "body": "Your order 92831 is confirmed", "reference": id})
    );
}

async fn replay_is_byte_for_byte_and_never_calls_the_provider(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let body = sms("+14155550100", "Your code is 123456");
    let first = app.post("OTP-1", &body).await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let again = app.post("OTP-1", &body).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.bytes, first.bytes);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.header("location"), Some("/messages/OTP-1"));
    }
    // The quoted structured-field form names the same key.
    let quoted = app.post("\"OTP-1\"", &body).await;
    assert_eq!(quoted.bytes, first.bytes);
    assert_eq!(quoted.header("idempotent-replayed"), Some("true"));
    // Same request in another key order is the same request.
    let reordered = json!({"body": "Your code is 123456", "to": "+14155550100"});
    assert_eq!(app.post("OTP-1", &reordered).await.bytes, first.bytes);
    assert_eq!(app.mock.call_count(), 1);
    assert_eq!(app.message_count().await, 1);
}

async fn same_key_with_another_request_is_422_and_sends_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    assert_eq!(
        app.post("K", &sms("+14155550100", "hello")).await.status,
        201
    );
    let other_to = app.post("K", &sms("+14155550101", "hello")).await;
    assert_eq!(other_to.status, 422);
    assert_eq!(other_to.slug(), "idempotency-key-reused");
    let other_body = app.post("K", &sms("+14155550100", "hello!")).await;
    assert_eq!(other_body.slug(), "idempotency-key-reused");
    assert_eq!(app.mock.call_count(), 1);
    let m = app.get("/messages/K").await.json();
    assert_eq!(m["to"], "+14155550100");
}

async fn same_key_with_another_request_is_422_while_the_first_still_runs(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let first = app
        .post_with(
            Some("K"),
            &sms("+14155550100", "hello"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(first.status, 202);
    let other = app.post("K", &sms("+14155550101", "hello")).await;
    assert_eq!(other.slug(), "idempotency-key-reused");
    gate.notify_one();
    app.wait_for_status("K", "sent").await;
    assert_eq!(app.mock.call_count(), 1);
}

async fn authentication_is_required(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let body = sms("+14155550100", "hi");
    let none = app
        .request(reqwest::Method::POST, "/messages")
        .header("Idempotency-Key", "A")
        .json(&body)
        .send()
        .await
        .unwrap();
    let none = answer(none).await;
    assert_eq!(none.status, 401);
    assert_eq!(none.slug(), "unauthorized");
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    for bad in [
        "so_not-a-real-key-aaaaaaaaaaaaaaaaaaaa",
        "not-even-prefixed",
    ] {
        let wrong = app
            .request(reqwest::Method::POST, "/messages")
            .bearer_auth(bad)
            .header("Idempotency-Key", "A")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer(wrong).await.slug(), "unauthorized");
    }
    let get = app
        .request(reqwest::Method::GET, "/messages/A")
        .send()
        .await
        .unwrap();
    assert_eq!(answer(get).await.slug(), "unauthorized");
    assert_eq!(app.message_count().await, 0);
    assert_eq!(app.mock.call_count(), 0);
}

async fn idempotency_key_is_required_and_checked(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let body = sms("+14155550100", "hi");
    let missing = app.post_with(None, &body, &[]).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.slug(), "missing-idempotency-key");
    let long = "k".repeat(256);
    for bad in ["", "has space", "\"unterminated", "\"a\"b", long.as_str()] {
        let a = app.post(bad, &body).await;
        assert_eq!(a.status, 400, "{bad:?}");
        assert_eq!(a.slug(), "invalid-idempotency-key", "{bad:?}");
    }
    assert_eq!(app.post(&"k".repeat(255), &body).await.status, 201);
    assert_eq!(app.message_count().await, 1);
}

async fn bad_bodies_are_rejected_and_store_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let cases = [
        (json!({"body": "hi"}), vec!["to"]),
        (json!({"to": "+14155550100"}), vec!["body"]),
        (json!({"to": "0044", "body": "hi"}), vec!["to"]),
        (json!({"to": "+14155550100", "body": " \n "}), vec!["body"]),
        (
            json!({"to": "+14155550100", "body": "x".repeat(1601)}),
            vec!["body"],
        ),
        (
            json!({"to": "+14155550100", "body": "hi", "from": "WAY-TOO-LONG-ID"}),
            vec!["from"],
        ),
        (
            json!({"to": "+14155550100", "body": "hi", "validity_seconds": 0}),
            vec!["validity_seconds"],
        ),
        (
            json!({"to": "+14155550100", "body": "hi", "validity_seconds": 36001}),
            vec!["validity_seconds"],
        ),
        (
            json!({"to": "+14155550100", "body": "hi", "metadata": {"a": 1}}),
            vec!["metadata.a"],
        ),
        (
            json!({"to": "+14155550100", "body": "hi", "unknown": true}),
            vec!["unknown"],
        ),
        (
            json!({"to": 14155550100u64, "body": ["hi"]}),
            vec!["body", "to"],
        ),
    ];
    for (i, (body, fields)) in cases.iter().enumerate() {
        let a = app.post(&format!("BAD-{i}"), body).await;
        assert_eq!(a.status, 400, "{body}");
        assert_eq!(a.slug(), "validation", "{body}");
        let got: Vec<String> = a.json()["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                assert!(e["message"].is_string());
                e["field"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(&got, fields, "{body}");
    }

    let raw = |ct: &'static str, body: Vec<u8>| {
        app.request(reqwest::Method::POST, "/messages")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "RAW")
            .header("content-type", ct)
            .body(body)
            .send()
    };
    let malformed = answer(raw("application/json", b"{\"to\":".to_vec()).await.unwrap()).await;
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.slug(), "malformed-json");
    let form = answer(
        raw("application/x-www-form-urlencoded", b"to=1".to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(form.status, 415);
    assert_eq!(form.slug(), "unsupported-media-type");
    let mut huge = br#"{"to":"+14155550100","body":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 70 * 1024));
    huge.extend(br#""}"#);
    let too_large = answer(raw("application/json", huge).await.unwrap()).await;
    assert_eq!(too_large.status, 413);
    assert_eq!(too_large.slug(), "payload-too-large");

    assert_eq!(app.message_count().await, 0);
    assert_eq!(app.mock.call_count(), 0);
}

async fn get_by_key_is_tenant_scoped_and_percent_decoded(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let key = "ORDER/92831 CONFIRMATION";
    // Spaces are not allowed in keys; slashes and other visible ASCII are.
    assert_eq!(app.post(key, &sms("+14155550100", "hi")).await.status, 400);
    let key = "ORDER/92831?CONFIRMATION#1";
    let created = app.post(key, &sms("+14155550100", "hi")).await;
    assert_eq!(created.status, 201);
    let location = created.header("location").unwrap().to_string();
    assert_eq!(location, "/messages/ORDER%2F92831%3FCONFIRMATION%231");
    let got = app.get(&location).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["idempotency_key"], key);
    assert_eq!(got.json()["id"], created.json()["id"]);

    let missing = app.get("/messages/NEVER-USED").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.slug(), "not-found");

    // Another tenant on the same database cannot see it, and may use the
    // same key for its own message.
    let other = spawn_with(TestOptions {
        backend,
        database: Some(app.database.clone()),
        mock: Some((app.mock.clone(), app.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    let hidden = other.get(&location).await;
    assert_eq!(hidden.status, 404);
    assert_eq!(
        hidden.bytes, missing.bytes,
        "same answer as a key that never existed"
    );
    let own = other.post(key, &sms("+14155550199", "other tenant")).await;
    assert_eq!(own.status, 201);
    assert_ne!(own.json()["id"], created.json()["id"]);
    assert_eq!(app.mock.call_count(), 2);
}

async fn respond_async_answers_202_then_the_message_completes(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let a = app
        .post_with(
            Some("ASYNC"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(a.status, 202);
    assert_eq!(a.header("location"), Some("/messages/ASYNC"));
    assert_eq!(a.json()["status"], "processing");
    assert_eq!(a.json()["provider_message_id"], serde_json::Value::Null);

    // A duplicate that may not wait finds it still running: 409.
    let dup = app
        .post_with(
            Some("ASYNC"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.slug(), "idempotency-key-in-use");
    assert_eq!(dup.header("retry-after"), Some("1"));
    // A duplicate with a short wait also gets 409 while the gate is shut.
    let dup = app
        .post_with(
            Some("ASYNC"),
            &sms("+14155550100", "hi"),
            &[("prefer", "wait=1")],
        )
        .await;
    assert_eq!(dup.status, 409);

    gate.notify_one();
    let m = app.wait_for_status("ASYNC", "sent").await;
    assert_eq!(m["provider_message_id"], "prov_1");
    // Now a replay gets the final response.
    let replay = app.post("ASYNC", &sms("+14155550100", "hi")).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.json()["status"], "sent");
    assert_eq!(app.mock.call_count(), 1);
}

async fn a_waiting_duplicate_gets_the_result_when_it_arrives(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let first = app
        .post_with(
            Some("W"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(first.status, 202);
    let dup = {
        let app = &app;
        async move { app.post("W", &sms("+14155550100", "hi")).await }
    };
    let release = async {
        eventually("the mock to hold the call", || async {
            (app.mock.call_count() == 1).then_some(())
        })
        .await;
        gate.notify_one();
    };
    let (dup, ()) = tokio::join!(dup, release);
    assert_eq!(dup.status, 201);
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    assert_eq!(dup.json()["status"], "sent");
}

async fn segments_and_encoding_are_computed(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let m = app
        .post("S1", &sms("+14155550100", &"a".repeat(161)))
        .await
        .json();
    assert_eq!(
        (m["segments"].as_u64(), m["encoding"].as_str()),
        (Some(2), Some("gsm7"))
    );
    let m = app
        .post("S2", &sms("+14155550100", "Код: 123456"))
        .await
        .json();
    assert_eq!(
        (m["segments"].as_u64(), m["encoding"].as_str()),
        (Some(1), Some("ucs2"))
    );
}

async fn health_and_readiness(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let h = answer(
        app.request(reqwest::Method::GET, "/healthz")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(h.status, 200);
    let r = answer(
        app.request(reqwest::Method::GET, "/readyz")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    let unknown = answer(
        app.request(reqwest::Method::GET, "/nope")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(unknown.slug(), "not-found");
    let wrong = answer(
        app.request(reqwest::Method::DELETE, "/messages")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.slug(), "method-not-allowed");
}

async fn attempts_are_recorded_and_listed(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.mock.push([Behaviour::Fail {
        status: 500,
        body: json!({}),
        retry_after: None,
    }]);
    assert_eq!(
        app.post("H", &sms("+14155550100", "hi")).await.json()["status"],
        "sent"
    );
    let a = app.get("/messages/H/attempts").await;
    assert_eq!(a.status, 200);
    let list = a.json()["data"].as_array().unwrap().clone();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["number"], 1);
    assert_eq!(list[0]["outcome"], "ambiguous");
    assert_eq!(list[0]["http_status"], 500);
    assert_eq!(list[1]["outcome"], "sent");
    assert_eq!(list[1]["provider_message_id"], "prov_1");
    assert!(list.iter().all(|x| x["finished_at"].is_string()));
    assert_eq!(app.get("/messages/NOPE/attempts").await.status, 404);
}

on_both_backends!(
    first_post_sends_and_answers_201_with_the_message,
    replay_is_byte_for_byte_and_never_calls_the_provider,
    same_key_with_another_request_is_422_and_sends_nothing,
    same_key_with_another_request_is_422_while_the_first_still_runs,
    authentication_is_required,
    idempotency_key_is_required_and_checked,
    bad_bodies_are_rejected_and_store_nothing,
    get_by_key_is_tenant_scoped_and_percent_decoded,
    respond_async_answers_202_then_the_message_completes,
    a_waiting_duplicate_gets_the_result_when_it_arrives,
    segments_and_encoding_are_computed,
    health_and_readiness,
    attempts_are_recorded_and_listed,
);

through_pgbouncer!(
    first_post_sends_and_answers_201_with_the_message,
    replay_is_byte_for_byte_and_never_calls_the_provider,
    same_key_with_another_request_is_422_and_sends_nothing,
    same_key_with_another_request_is_422_while_the_first_still_runs,
    authentication_is_required,
    idempotency_key_is_required_and_checked,
    bad_bodies_are_rejected_and_store_nothing,
    get_by_key_is_tenant_scoped_and_percent_decoded,
    respond_async_answers_202_then_the_message_completes,
    a_waiting_duplicate_gets_the_result_when_it_arrives,
    segments_and_encoding_are_computed,
    health_and_readiness,
    attempts_are_recorded_and_listed,
);
