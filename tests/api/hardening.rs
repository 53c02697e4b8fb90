//! Hardening: every bad input is a documented 4xx that changes nothing,
//! tenants cannot see each other, abuse limits, opt-outs and HTTP hygiene.

use std::time::Duration;

use sendonce::clock::Clock;
use sendonce::ratelimit::{Limits, Rate};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

/// Row counts of every table a request could touch.
async fn snapshot(app: &TestApp) -> Vec<i64> {
    vec![
        app.db.count("SELECT count(*) FROM messages").await,
        app.db.count("SELECT count(*) FROM attempts").await,
        app.db.count("SELECT count(*) FROM opt_outs").await,
        app.db.count("SELECT count(*) FROM tenants").await,
        app.db.count("SELECT count(*) FROM api_keys").await,
    ]
}

async fn raw_post(app: &TestApp, key: &str, content_type: Option<&str>, body: Vec<u8>) -> Answer {
    let mut req = app
        .request(reqwest::Method::POST, "/messages")
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", key)
        .body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    answer(req.send().await.unwrap()).await
}

async fn every_bad_input_is_a_documented_4xx_and_changes_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.handle
        .store
        .set_allowed_countries(&app.tenant, Some(&["US".to_string()]))
        .await
        .unwrap();
    let ok = |extra: serde_json::Value| {
        let mut base = json!({"to": "+14155550100", "body": "Your code is 123456"});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                base.as_object_mut().unwrap().remove(k);
            } else {
                base[k] = v.clone();
            }
        }
        serde_json::to_vec(&base).unwrap()
    };
    let json_ct = Some("application/json");
    let eleven_segments = "a".repeat(153 * 10 + 1);
    let mut metadata_17 = serde_json::Map::new();
    for i in 0..17 {
        metadata_17.insert(format!("k{i}"), json!("v"));
    }
    // (what, content type, body, status, problem slug, fields in `errors`)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Vec<u8>,
        u16,
        &'a str,
        Vec<&'a str>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("to missing", json_ct, ok(json!({"to": null})), 400, "validation", vec!["to"]),
        ("to wrong type", json_ct, ok(json!({"to": 14155550100u64})), 400, "validation", vec!["to"]),
        ("to too long", json_ct, ok(json!({"to": format!("+1{}", "5".repeat(40))})), 400, "validation", vec!["to"]),
        ("to empty", json_ct, ok(json!({"to": ""})), 400, "validation", vec!["to"]),
        ("to control character", json_ct, ok(json!({"to": "+1415555\u{0}0100"})), 400, "validation", vec!["to"]),
        ("to invalid number", json_ct, ok(json!({"to": "+1415555"})), 400, "validation", vec!["to"]),
        ("to no such country code", json_ct, ok(json!({"to": "+999123456789"})), 400, "validation", vec!["to"]),
        ("to wrong country", json_ct, ok(json!({"to": "+442079460958"})), 400, "validation", vec!["to"]),
        ("body missing", json_ct, ok(json!({"body": null})), 400, "validation", vec!["body"]),
        ("body wrong type", json_ct, ok(json!({"body": ["hi"]})), 400, "validation", vec!["body"]),
        ("body empty", json_ct, ok(json!({"body": ""})), 400, "validation", vec!["body"]),
        ("body only whitespace", json_ct, ok(json!({"body": " \n\t "})), 400, "validation", vec!["body"]),
        ("body too long", json_ct, ok(json!({"body": "a".repeat(1601)})), 400, "validation", vec!["body"]),
        ("body too many segments", json_ct, ok(json!({"body": eleven_segments})), 400, "validation", vec!["body"]),
        ("body NUL", json_ct, ok(json!({"body": "code\u{0}123"})), 400, "validation", vec!["body"]),
        ("body bell", json_ct, ok(json!({"body": "code\u{7}123"})), 400, "validation", vec!["body"]),
        ("body escape", json_ct, ok(json!({"body": "\u{1b}[31mred"})), 400, "validation", vec!["body"]),
        ("body DEL", json_ct, ok(json!({"body": "a\u{7f}"})), 400, "validation", vec!["body"]),
        ("body C1 control", json_ct, ok(json!({"body": "a\u{85}b"})), 400, "validation", vec!["body"]),
        ("from wrong type", json_ct, ok(json!({"from": 5})), 400, "validation", vec!["from"]),
        ("from too long", json_ct, ok(json!({"from": "ACMEINCLIMITED"})), 400, "validation", vec!["from"]),
        ("from empty", json_ct, ok(json!({"from": ""})), 400, "validation", vec!["from"]),
        ("from control character", json_ct, ok(json!({"from": "AC\u{1}ME"})), 400, "validation", vec!["from"]),
        ("from invalid number", json_ct, ok(json!({"from": "+1234"})), 400, "validation", vec!["from"]),
        ("from only digits", json_ct, ok(json!({"from": "12345"})), 400, "validation", vec!["from"]),
        ("validity wrong type", json_ct, ok(json!({"validity_seconds": "60"})), 400, "validation", vec!["validity_seconds"]),
        ("validity zero", json_ct, ok(json!({"validity_seconds": 0})), 400, "validation", vec!["validity_seconds"]),
        ("validity too long", json_ct, ok(json!({"validity_seconds": 36001})), 400, "validation", vec!["validity_seconds"]),
        ("validity fraction", json_ct, ok(json!({"validity_seconds": 1.5})), 400, "validation", vec!["validity_seconds"]),
        ("validity negative", json_ct, ok(json!({"validity_seconds": -5})), 400, "validation", vec!["validity_seconds"]),
        ("metadata wrong type", json_ct, ok(json!({"metadata": "x"})), 400, "validation", vec!["metadata"]),
        ("metadata too many", json_ct, ok(json!({"metadata": metadata_17})), 400, "validation", vec!["metadata"]),
        ("metadata value type", json_ct, ok(json!({"metadata": {"a": 1}})), 400, "validation", vec!["metadata.a"]),
        ("metadata value too long", json_ct, ok(json!({"metadata": {"a": "v".repeat(501)}})), 400, "validation", vec!["metadata.a"]),
        ("metadata key too long", json_ct, ok(json!({"metadata": {"k".repeat(41): "v"}})), 400, "validation", vec!["metadata"]),
        ("metadata empty key", json_ct, ok(json!({"metadata": {"": "v"}})), 400, "validation", vec!["metadata"]),
        ("unknown field", json_ct, ok(json!({"priority": "high"})), 400, "validation", vec!["priority"]),
        ("not an object", json_ct, b"[1,2]".to_vec(), 400, "validation", vec![""]),
        ("duplicate key", json_ct, br#"{"to":"+14155550100","to":"+14155550101","body":"hi"}"#.to_vec(), 400, "validation", vec!["to"]),
        ("duplicate metadata key", json_ct, br#"{"to":"+14155550100","body":"hi","metadata":{"a":"1","a":"2"}}"#.to_vec(), 400, "validation", vec!["metadata.a"]),
        ("bad JSON", json_ct, br#"{"to":"+14155550100","body":"#.to_vec(), 400, "malformed-json", vec![]),
        ("trailing garbage", json_ct, br#"{"to":"+14155550100","body":"hi"} x"#.to_vec(), 400, "malformed-json", vec![]),
        ("lone surrogate", json_ct, br#"{"to":"+14155550100","body":"\ud800"}"#.to_vec(), 400, "malformed-json", vec![]),
        ("invalid UTF-8", json_ct, b"{\"to\":\"+14155550100\",\"body\":\"\xc3\x28\"}".to_vec(), 400, "malformed-json", vec![]),
        ("byte order mark", json_ct, b"\xef\xbb\xbf{\"to\":\"+14155550100\",\"body\":\"hi\"}".to_vec(), 400, "malformed-json", vec![]),
        ("empty body", json_ct, vec![], 400, "malformed-json", vec![]),
        ("huge body", json_ct, ok(json!({"body": "a".repeat(70 * 1024)})), 413, "payload-too-large", vec![]),
        ("form content type", Some("application/x-www-form-urlencoded"), b"to=%2B14155550100&body=hi".to_vec(), 415, "unsupported-media-type", vec![]),
        ("text content type", Some("text/plain"), ok(json!({})), 415, "unsupported-media-type", vec![]),
        ("no content type", None, ok(json!({})), 415, "unsupported-media-type", vec![]),
    ];
    let before = snapshot(&app).await;
    for (i, (what, ct, body, status, slug, fields)) in cases.into_iter().enumerate() {
        let a = raw_post(&app, &format!("BAD-{i}"), ct, body).await;
        assert_eq!(
            a.status,
            status,
            "{what}: {}",
            String::from_utf8_lossy(&a.bytes)
        );
        assert_eq!(a.slug(), slug, "{what}");
        if slug == "validation" {
            let got: Vec<String> = a.json()["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["field"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(got, fields, "{what}");
        }
        let text = String::from_utf8_lossy(&a.bytes).to_lowercase();
        for leak in [
            "sqlx", "postgres", "sqlite", "panicked", "select ", "insert ",
        ] {
            assert!(!text.contains(leak), "{what}: the answer mentions {leak}");
        }
    }
    assert_eq!(
        snapshot(&app).await,
        before,
        "a rejected request changes nothing"
    );
    assert_eq!(app.mock.call_count(), 0);

    // Unicode that is fine: emoji, RTL text, combining marks, a zero-width joiner.
    for (i, body) in [
        "👍🏽 ok",
        "שלום עולם",
        "e\u{301}",
        "a\u{200d}b",
        "Für 5€ @ Straße",
    ]
    .iter()
    .enumerate()
    {
        let a = app
            .post(&format!("UNICODE-{i}"), &sms("+14155550100", body))
            .await;
        assert_eq!(a.status, 201, "{body}");
        assert_eq!(a.json()["body"], *body, "stored and returned as sent");
    }
}

async fn tenants_cannot_see_or_touch_each_other(backend: Backend) {
    let a = spawn_app_on(backend).await;
    let b = spawn_with(TestOptions {
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    let body = sms("+14155550100", "Order 92831 confirmed");
    let mine = a.post("ORDER-92831-CONFIRMATION-SMS", &body).await;
    assert_eq!(mine.status, 201);

    // Reading: the same 404, byte for byte, as a key that never existed.
    let never = b.get("/messages/NEVER-USED-KEY").await;
    for path in [
        "/messages/ORDER-92831-CONFIRMATION-SMS",
        "/messages/ORDER-92831-CONFIRMATION-SMS/attempts",
    ] {
        let hidden = b.get(path).await;
        assert_eq!(hidden.status, 404, "{path}");
        assert_eq!(hidden.bytes, never.bytes, "{path}");
    }
    // Replaying: b's identical request is b's own new message, not a's replay.
    let theirs = b.post("ORDER-92831-CONFIRMATION-SMS", &body).await;
    assert_eq!(theirs.status, 201);
    assert_eq!(theirs.header("idempotent-replayed"), None);
    assert_ne!(theirs.json()["id"], mine.json()["id"]);
    // Conflicting: another body under the key is no 422 for b (that would
    // tell b the key is in use elsewhere).
    let other = b
        .post("ANOTHER-SHARED-KEY", &sms("+14155550101", "x"))
        .await;
    assert_eq!(other.status, 201);
    let a_other = a
        .post("ANOTHER-SHARED-KEY", &sms("+14155550102", "y"))
        .await;
    assert_eq!(a_other.status, 201);
    // a's message is untouched.
    let again = a.post("ORDER-92831-CONFIRMATION-SMS", &body).await;
    assert_eq!(again.bytes, mine.bytes);
    assert_eq!(a.mock.call_count(), 4);
}

async fn a_revoked_key_is_refused_at_once(backend: Backend) {
    let app = spawn_app_on(backend).await;
    assert_eq!(app.post("K1", &sms("+14155550100", "hi")).await.status, 201);
    let keys = app.handle.store.list_keys().await.unwrap();
    let key = keys.iter().find(|k| k.tenant_name == app.tenant).unwrap();
    assert!(
        app.handle
            .store
            .revoke_key(key.id, app.clock.now())
            .await
            .unwrap()
    );
    let refused = app.post("K2", &sms("+14155550100", "hi")).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.slug(), "unauthorized");
    assert_eq!(app.get("/messages/K1").await.status, 401);
}

fn limited(limits: Limits) -> (TestOptions, Clock) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let mut settings = test_settings();
    settings.limits.rates = limits;
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    (
        TestOptions {
            settings,
            clock: clock.clone(),
            ..TestOptions::default()
        },
        clock,
    )
}

async fn the_tenant_request_rate_is_limited_with_retry_after(backend: Backend) {
    let (opts, clock) = limited(Limits {
        tenant: Rate {
            capacity: 2,
            per: Duration::from_secs(2),
        },
        ..Limits::NONE
    });
    let app = spawn_with(TestOptions { backend, ..opts }).await;
    assert_eq!(app.post("R1", &sms("+14155550100", "a")).await.status, 201);
    assert_eq!(app.post("R2", &sms("+14155550101", "b")).await.status, 201);
    let before = snapshot(&app).await;
    let refused = app.post("R3", &sms("+14155550102", "c")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.slug(), "rate-limited");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        snapshot(&app).await,
        before,
        "checked before anything is stored"
    );
    clock.advance(Duration::from_secs(1));
    // Not charged against the key: the same key goes through once allowed.
    assert_eq!(app.post("R3", &sms("+14155550102", "c")).await.status, 201);
}

async fn destination_limits_count_new_sends_not_replays(backend: Backend) {
    let (opts, clock) = limited(Limits {
        number: Rate {
            capacity: 2,
            per: Duration::from_secs(3600),
        },
        prefix: Rate {
            capacity: 3,
            per: Duration::from_secs(3600),
        },
        ..Limits::NONE
    });
    let app = spawn_with(TestOptions { backend, ..opts }).await;
    let first = app.post("OTP-1", &sms("+14155552671", "code 1")).await;
    assert_eq!(first.status, 201);
    assert_eq!(
        app.post("OTP-2", &sms("+14155552671", "code 2"))
            .await
            .status,
        201
    );
    let refused = app.post("OTP-3", &sms("+14155552671", "code 3")).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("destination number")
    );
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1700..=1800).contains(&wait), "about half an hour: {wait}");
    // A replay is not a new send: it is answered, not limited.
    for _ in 0..3 {
        let replay = app.post("OTP-1", &sms("+14155552671", "code 1")).await;
        assert_eq!(replay.bytes, first.bytes);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    // The range +1415555____ allows 3 new sends an hour.
    assert_eq!(
        app.post("OTP-4", &sms("+14155559999", "x")).await.status,
        201
    );
    let refused = app.post("OTP-5", &sms("+14155558888", "y")).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("destination prefix")
    );
    assert_eq!(
        app.post("OTP-6", &sms("+14165551234", "z")).await.status,
        201,
        "another range"
    );
    assert_eq!(app.mock.call_count(), 4);
    clock.advance(Duration::from_secs(1800));
    assert_eq!(
        app.post("OTP-3", &sms("+14155552671", "code 3"))
            .await
            .status,
        201
    );
}

async fn opted_out_numbers_are_never_sent_to(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let post_json = |path: &str, body: serde_json::Value| {
        app.request(reqwest::Method::POST, path)
            .bearer_auth(&app.api_key)
            .json(&body)
            .send()
    };
    let added = answer(
        post_json("/opt-outs", json!({"number": "+1 415 555 2671"}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(added.status, 201);
    assert_eq!(added.json()["number"], "+14155552671");
    let again = answer(
        post_json("/opt-outs", json!({"number": "+14155552671"}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(again.status, 200);
    let bad = answer(
        post_json("/opt-outs", json!({"number": "12"}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(bad.slug(), "validation");

    let m = app
        .post("TO-OPTED-OUT", &sms("+14155552671", "promo"))
        .await
        .json();
    assert_eq!(m["status"], "failed");
    assert_eq!(m["error"]["code"], "recipient_opted_out");
    assert_eq!(app.mock.call_count(), 0, "no provider call");

    let list = app.get("/opt-outs").await.json();
    assert_eq!(list["data"][0]["number"], "+14155552671");
    assert_eq!(list["data"][0]["source"], "api");
    let del = answer(
        app.request(reqwest::Method::DELETE, "/opt-outs/+14155552671")
            .bearer_auth(&app.api_key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(del.status, 204);
    assert_eq!(
        app.post("AFTER-OPT-IN", &sms("+14155552671", "hi"))
            .await
            .json()["status"],
        "sent"
    );

    // An inbound STOP opts the sender out; START opts back in.
    let stop = answer(
        post_json("/inbound", json!({"from": "+14155550123", "body": "Stop"}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(stop.json()["action"], "opted_out");
    let m = app
        .post("AFTER-STOP", &sms("+14155550123", "hi"))
        .await
        .json();
    assert_eq!(m["error"]["code"], "recipient_opted_out");
    let list = app.get("/opt-outs").await.json();
    assert_eq!(list["data"][0]["source"], "inbound");
    let start = answer(
        post_json("/inbound", json!({"from": "+14155550123", "body": "START"}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(start.json()["action"], "opted_in");
    let chat = answer(
        post_json(
            "/inbound",
            json!({"from": "+14155550123", "body": "thanks!"}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(chat.json()["action"], "none");
    assert_eq!(
        app.post("AFTER-START", &sms("+14155550123", "hi"))
            .await
            .json()["status"],
        "sent"
    );
}

on_both_backends!(
    every_bad_input_is_a_documented_4xx_and_changes_nothing,
    tenants_cannot_see_or_touch_each_other,
    a_revoked_key_is_refused_at_once,
    the_tenant_request_rate_is_limited_with_retry_after,
    destination_limits_count_new_sends_not_replays,
    opted_out_numbers_are_never_sent_to,
);

async fn hygiene_app() -> TestApp {
    let mut settings = test_settings();
    settings.server.connection.header_read_timeout = Duration::from_millis(300);
    settings.server.body_read_timeout = Duration::from_millis(300);
    spawn_with(TestOptions {
        settings,
        ..TestOptions::default()
    })
    .await
}

async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let app = hygiene_app().await;
    let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
    s.write_all(b"POST /messages HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // The rest of the head never comes: the server must close the connection.
    let got = tokio::time::timeout(Duration::from_secs(5), read_all(&mut s))
        .await
        .expect("the server closed the connection within its header timeout");
    assert!(!got.contains("201"), "{got}");
}

#[tokio::test]
async fn slow_bodies_get_408_and_store_nothing() {
    let app = hygiene_app().await;
    let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
    let head = format!(
        "POST /messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nIdempotency-Key: SLOW\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"to\":",
        app.api_key
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let got = read_all(&mut s).await;
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request-timeout"), "{got}");
    assert_eq!(app.message_count().await, 0);
}

#[tokio::test]
async fn an_answer_before_the_body_was_read_closes_the_connection_and_says_so() {
    let app = spawn_app().await;
    // A wrong key is answered from the head alone; the body never comes.
    let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
    s.write_all(
        b"POST /messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer so_wrong\r\n\
          Idempotency-Key: EARLY\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("the server closed the connection after answering")
        .unwrap();
    let got = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(got.starts_with("http/1.1 401"), "{got}");
    assert!(got.contains("\r\nconnection: close\r\n"), "{got}");

    // A request whose body was read keeps the connection for the next one.
    let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
    let body = r#"{"to":"+14155550100","body":"hi"}"#;
    let both = format!(
        "POST /messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nIdempotency-Key: KEPT\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}\
         GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        app.api_key,
        body.len()
    );
    s.write_all(both.as_bytes()).await.unwrap();
    let got = read_all(&mut s).await.to_ascii_lowercase();
    let second = got
        .find("http/1.1 200")
        .expect("the second request was answered");
    assert!(got.starts_with("http/1.1 201"), "{got}");
    assert!(!got[..second].contains("connection: close"), "{got}");
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let app = spawn_app().await;
    let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
    let one = |key: &str, path: &str| {
        let body = r#"{"to":"+14155550100","body":"hi"}"#;
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            app.api_key,
            body.len()
        )
    };
    let get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let all = format!(
        "{}{}{get}",
        one("PIPE-1", "/messages"),
        one("PIPE-1", "/messages")
    );
    s.write_all(all.as_bytes()).await.unwrap();
    let got = read_all(&mut s).await;
    let statuses: Vec<&str> = got
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &got[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, vec!["201", "201", "200"], "{got}");
    assert_eq!(
        got.matches("idempotent-replayed: true").count(),
        1,
        "the second is the replay"
    );
}

#[tokio::test]
async fn answers_carry_security_headers_and_long_uris_are_refused() {
    let app = spawn_app().await;
    let a = app.post("HDR", &sms("+14155550100", "hi")).await;
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-store"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(a.header(name), Some(value), "{name}");
    }
    assert!(a.header("content-security-policy").is_some());
    let long = format!("/messages/{}", "k".repeat(3000));
    let refused = app.get(&long).await;
    assert_eq!(refused.status, 414);
    assert_eq!(refused.slug(), "uri-too-long");
    assert_eq!(refused.header("x-content-type-options"), Some("nosniff"));
}

/// An instance with an `http` receipt secret and the given body deadline.
async fn receipt_app(body_read_timeout: Duration) -> TestApp {
    let mut settings = test_settings();
    settings.server.body_read_timeout = body_read_timeout;
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
        ("SENDONCE_RECEIPT_SECRET", "receipt-secret-0123456789"),
        ("TWILIO_AUTH_TOKEN", "twilio-token"),
    ])
    .unwrap();
    spawn_with(TestOptions {
        settings,
        ..TestOptions::default()
    })
    .await
}

#[tokio::test]
async fn receipt_bodies_have_a_deadline() {
    let app = receipt_app(Duration::from_millis(300)).await;
    for (path, auth, content_type) in [
        (
            "/providers/http/status",
            "X-Receipt-Secret: receipt-secret-0123456789",
            "application/json",
        ),
        (
            "/providers/twilio/status",
            "X-Twilio-Signature: c2lnbmF0dXJl",
            "application/x-www-form-urlencoded",
        ),
    ] {
        let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\nContent-Type: {content_type}\r\n\
             Content-Length: 100\r\n\r\n{{\"id\":"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        // The rest of the body never comes: 408 within the deadline (with
        // room for a slow machine), not a connection held open.
        let got = tokio::time::timeout(Duration::from_secs(3), read_all(&mut s))
            .await
            .expect("answered within the body deadline");
        assert!(got.starts_with("HTTP/1.1 408"), "{path}: {got}");
    }
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
}

#[tokio::test]
async fn unauthenticated_http_receipts_are_refused_before_their_body() {
    // A long body deadline: the refusal must not wait for it.
    let app = receipt_app(Duration::from_secs(30)).await;
    for auth in ["X-Receipt-Secret: wrong", "X-Other: none"] {
        let mut s = TcpStream::connect(app.handle.addr).await.unwrap();
        let head = format!(
            "POST /providers/http/status HTTP/1.1\r\nHost: x\r\n{auth}\r\n\
             Content-Type: application/json\r\nContent-Length: 50000\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("refused without waiting for the body")
            .unwrap();
        let got = String::from_utf8_lossy(&buf[..n]);
        assert!(got.starts_with("HTTP/1.1 403"), "{auth}: {got}");
    }
    assert_eq!(app.db.count("SELECT count(*) FROM receipts").await, 0);
}

/// A `GET /healthz` on `s`, answered within `within` (None: not answered).
async fn healthz_within(s: &mut TcpStream, within: Duration) -> Option<String> {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut out)).await {
        Ok(_) if !out.is_empty() => Some(String::from_utf8_lossy(&out).into_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn open_connections_are_capped() {
    let mut settings = test_settings();
    settings.server.connection.max_connections = 2;
    settings.server.connection.header_read_timeout = Duration::from_secs(30);
    let app = spawn_with(TestOptions {
        settings,
        ..TestOptions::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(app.handle.addr).await.unwrap());
    }
    // Both slots are held by connections that send nothing: a third is
    // connected by the kernel but not served.
    let mut third = TcpStream::connect(app.handle.addr).await.unwrap();
    assert_eq!(
        healthz_within(&mut third, Duration::from_millis(500)).await,
        None,
        "served beyond the cap"
    );
    // One slot frees up: the waiting connection is served.
    drop(idle.pop());
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut got))
        .await
        .expect("served once a slot was free")
        .unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // And the service goes on.
    drop(idle);
    for _ in 0..3 {
        assert_eq!(app.get("/healthz").await.status, 200);
    }
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_header_timeout() {
    let app = hygiene_app().await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(TcpStream::connect(app.handle.addr).await.unwrap());
    }
    for s in &mut idle {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("closed within the header timeout");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    // A kept-alive connection that goes quiet after a request is closed too
    // (it would otherwise hold one of the `max_connections` slots).
    let mut kept = TcpStream::connect(app.handle.addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), kept.read_to_end(&mut got))
        .await
        .expect("closed within the header timeout after its request")
        .unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200"));
    assert_eq!(app.get("/healthz").await.status, 200);
}
