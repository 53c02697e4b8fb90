//! A verification's SMS is stored sealed (`sendonce-sealed:…`): nothing
//! ever shows that form (issue 26), only the masked text the verification
//! resource shows; and a client's body that starts like one is refused
//! rather than looping until `unknown` (issue 29, finding 13).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::console::Browser;
use crate::helpers::*;

const MARK: &str = "sendonce-sealed:";

/// Every log line at every level written on this thread (the test's
/// runtime, where the app's tasks run).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }
}

/// A receiver keeping every webhook body it gets.
async fn receiver() -> (Arc<Mutex<Vec<String>>>, String) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let keep = Arc::clone(&keep);
            async move {
                keep.lock().expect("hits").push(body);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (got, url)
}

async fn a_sealed_body_is_shown_nowhere(backend: Backend) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let mut settings = test_settings();
    settings.webhooks.allow_private = true;
    settings.webhooks.poll_interval = Duration::from_millis(50);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let (hooks, url) = receiver().await;
    let made = answer(
        app.request(reqwest::Method::POST, "/webhook-endpoints")
            .bearer_auth(&app.api_key)
            .json(&json!({ "url": url }))
            .send()
            .await
            .expect("POST /webhook-endpoints"),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));

    let started = answer(
        app.request(reqwest::Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "LOGIN-SEALED")
            .json(&json!({ "to": "+14155550100", "code_length": 6 }))
            .send()
            .await
            .expect("POST /verifications"),
    )
    .await;
    assert_eq!(started.status, 201);
    let ver = started.json()["id"].as_str().expect("id").to_string();
    let sent = eventually("the code's SMS sent", || async {
        let v = app.get(&format!("/verifications/{ver}")).await.json();
        (v["messages"][0]["status"] == "sent").then(|| v["messages"][0].clone())
    })
    .await;
    let masked = sent["body"].as_str().expect("masked body").to_string();
    assert!(masked.contains("******"), "{masked}");
    let key = sent["idempotency_key"].as_str().expect("key").to_string();
    let hooks = eventually("the message.sent webhook", || async {
        let got = hooks.lock().expect("hits").clone();
        got.iter()
            .any(|b| b.contains("message.sent"))
            .then_some(got)
    })
    .await;

    // The message's own answer shows the verification's masked text.
    let message = app.get(&format!("/messages/{key}")).await;
    assert_eq!(message.status, 200);
    assert_eq!(message.json()["body"], masked.as_str());
    let event = hooks
        .iter()
        .find(|b| b.contains("message.sent"))
        .and_then(|b| serde_json::from_str::<Value>(b).ok())
        .expect("a JSON webhook");
    assert_eq!(event["data"]["body"], masked.as_str());

    let mut seen = hooks.clone();
    for path in [
        format!("/messages/{key}"),
        format!("/messages/{key}/attempts"),
        format!("/messages/{key}/events"),
        format!("/verifications/{ver}"),
        "/events".to_string(),
    ] {
        let a = app.get(&path).await;
        assert_eq!(a.status, 200, "{path}");
        seen.push(String::from_utf8_lossy(&a.bytes).into_owned());
    }
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let message_id = message.json()["id"].as_str().expect("id").to_string();
    for path in [
        "/console/overview".to_string(),
        format!("/console/search?q={ver}"),
        format!("/console/verifications/{ver}"),
        "/console/search?q=%2B14155550100".to_string(),
        format!("/console/messages/{message_id}"),
    ] {
        let a = b.get(&path).await;
        assert!(matches!(a.status, 200 | 303), "{path}: {}", a.status);
        seen.push(String::from_utf8_lossy(&a.bytes).into_owned());
    }
    let timeline = seen.last().expect("the timeline");
    assert!(timeline.contains("******"), "the timeline shows the text");
    for text in &seen {
        assert!(!text.contains(MARK), "a sealed body shown: {text}");
    }
    let logs = logs.text();
    assert!(
        logs.contains("TRACE") || logs.contains("DEBUG"),
        "logs captured"
    );
    assert!(!logs.contains(MARK), "a sealed body logged");
}

async fn a_body_that_looks_sealed_is_refused(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let looks_sealed = "sendonce-sealed:v1:QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo";
    let a = app
        .post("LOOKS-SEALED", &sms("+14155550100", looks_sealed))
        .await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(a.json()["errors"][0]["field"], "body", "{}", a.json());
    let batch = answer(
        app.request(reqwest::Method::POST, "/messages/batch")
            .bearer_auth(&app.api_key)
            .json(&json!({ "messages": [
                { "idempotency_key": "B-SEALED", "to": "+14155550100", "body": looks_sealed },
            ]}))
            .send()
            .await
            .expect("POST /messages/batch"),
    )
    .await;
    assert_eq!(batch.status, 200);
    let item = &batch.json()["results"][0];
    assert_eq!(item["status"], 400, "{item}");
    assert_eq!(item["problem"]["errors"][0]["field"], "body", "{item}");
    assert_eq!(app.message_count().await, 0, "nothing stored");
    // Said plainly, it is an ordinary body.
    let ok = app
        .post(
            "SAYS-SEALED",
            &sms("+14155550100", "not sendonce-sealed: at the start"),
        )
        .await;
    assert_eq!(ok.status, 201);
}

on_both_backends!(
    a_sealed_body_is_shown_nowhere,
    a_body_that_looks_sealed_is_refused
);
