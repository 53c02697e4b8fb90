//! The real binary SIGKILLed at every crash point of a verification's move
//! to its next channel (issue 40), for both orders of two channels and for
//! `["whatsapp", "telegram", "sms"]` (an instance killed at the point of
//! each move, the next one started with the same point), and finished by a
//! last instance on the same database: one message per step, counted at
//! mocks that create one for every call they accept (the `http` SMS
//! endpoint, per number and text; the Gateway and WhatsApp, per number and
//! code), and the code any of them carried approves once.
//!
//! The points: `fallback.before_move` (the step's message revoked and asked
//! about, the move not written: the next pass decides again) and
//! `fallback.after_move` (the move committed, the next step's message
//! inserted and leased by the dead instance: taken over when its lease
//! ends). The points of a send itself (`claim.*`, `call.*`, `finish.*`)
//! are the same for a step's message as for any message
//! (`crash_points.rs`).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::mock_provider::MockProvider;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::*;
use crate::process::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_sendonce");
const KEY: &str = "so_fallback-crashes-key-aaaaaaaaaaaaaaaa";
const TOKEN: &str = "fallback-crashes-gateway-token";
const TO: &str = "+14155550166";

struct Bin {
    child: Child,
    base: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// One `sendonce`: the `http` SMS provider, the Gateway and WhatsApp at the mock, a
/// 1 s provider timeout, a 4 s lease, passes every 100 ms.
async fn start(database: &str, mock: &str, failpoints: &str) -> Bin {
    let port = free_port().await;
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", database)
        .env("RUST_LOG", "info")
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_BOOTSTRAP_API_KEY", KEY)
        .env("SENDONCE_PROVIDER", "http")
        .env("SENDONCE_HTTP_PROVIDER_URL", format!("{mock}/messages"))
        .env("TELEGRAM_GATEWAY_TOKEN", TOKEN)
        .env("TELEGRAM_GATEWAY_URL", mock)
        .env("WHATSAPP_ACCESS_TOKEN", "fallback-crashes-whatsapp-token")
        .env("WHATSAPP_PHONE_NUMBER_ID", "106540352242922")
        .env("WHATSAPP_TEMPLATE_NAME", "verification_code")
        .env("WHATSAPP_BASE_URL", format!("{mock}/v21.0"))
        .env("SENDONCE_PROVIDER_TIMEOUT", "1s")
        .env("SENDONCE_LEASE", "4s")
        .env("SENDONCE_POLL_INTERVAL", "100ms")
        .env("SENDONCE_SHUTDOWN_GRACE", "200ms")
        .env("SENDONCE_FAILPOINTS", failpoints)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if failpoints.is_empty() {
        cmd.env_remove("SENDONCE_FAILPOINTS");
    }
    let mut child = cmd.spawn().expect("sendonce");
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let lines = Arc::clone(&stderr);
    let mut reader = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = reader.next_line().await {
            lines.lock().unwrap().push(line);
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&base).await;
    Bin {
        child,
        base,
        stderr,
    }
}

impl Bin {
    async fn killed_at(&mut self, point: &str) {
        let line = format!("failpoint {point}:");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self
            .stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(&line))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the instance did not reach {point}: {:?}",
                self.stderr.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the process ends")
            .expect("wait");
    }
}

async fn call(base: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> Answer {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(KEY)
        .timeout(Duration::from_secs(10));
    if let Some(b) = body {
        req = req.header("Idempotency-Key", "fallback-crash").json(&b);
    }
    answer(req.send().await.expect("request")).await
}

/// The SMS bodies the `http` endpoint was called with for `TO`.
fn sms_calls(mock: &MockProvider) -> Vec<String> {
    mock.calls()
        .into_iter()
        .filter(|c| c.endpoint == "http" && c.body["to"] == TO)
        .filter_map(|c| c.body["body"].as_str().map(str::to_string))
        .collect()
}

async fn run_case(backend: Backend, channels: &[&str], point: &str) {
    sendonce::install_crypto_provider();
    let database = fresh_database_on(backend).await;
    let (mock, _, addr) = MockProvider::start().await.expect("mock");
    mock.set_gateway_token(TOKEN);
    let mock_base = format!("http://{addr}");
    let armed = format!("{point}=kill");
    let mut a = start(&database, &mock_base, &armed).await;
    let started = call(
        &a.base,
        reqwest::Method::POST,
        "/verifications",
        Some(json!({"to": TO, "channels": channels, "fallback_after_seconds": 5})),
    )
    .await;
    assert_eq!(
        started.status,
        201,
        "{}",
        String::from_utf8_lossy(&started.bytes)
    );
    let id = started.json()["id"].as_str().expect("id").to_string();
    // The first step goes out, nothing reports it, and after 5 s the move
    // to the second step reaches the point. Each later move is reached by
    // an instance started with the same point, on the same database.
    a.killed_at(point).await;
    for _ in 2..channels.len() {
        let mut next = start(&database, &mock_base, &armed).await;
        next.killed_at(point).await;
    }
    let b = start(&database, &mock_base, "").await;
    let v = eventually("every step sent by the last instance", || async {
        let v = call(
            &b.base,
            reqwest::Method::GET,
            &format!("/verifications/{id}"),
            None,
        )
        .await
        .json();
        let statuses: Vec<&str> = v["messages"]
            .as_array()
            .map(|m| m.iter().filter_map(|x| x["status"].as_str()).collect())
            .unwrap_or_default();
        (statuses.len() == channels.len() && statuses.last() == Some(&"sent")).then_some(v)
    })
    .await;
    let got: Vec<&str> = v["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["channel"].as_str())
        .collect();
    assert_eq!(got, channels, "{v}");
    // One message per step at the providers, the same code on each.
    let bodies = sms_calls(&mock);
    assert_eq!(bodies.len(), 1, "{point} {channels:?}: {bodies:?}");
    let code: String = bodies[0].chars().filter(char::is_ascii_digit).collect();
    let gateway = mock.gateway_messages();
    assert_eq!(gateway.len(), 1, "{point} {channels:?}: {gateway:?}");
    assert_eq!(gateway[0].code.as_deref(), Some(code.as_str()));
    let whatsapp = mock.whatsapp_messages();
    let want_whatsapp = usize::from(channels.contains(&"whatsapp"));
    assert_eq!(
        whatsapp.len(),
        want_whatsapp,
        "{point} {channels:?}: {whatsapp:?}"
    );
    if let Some(w) = whatsapp.first() {
        assert_eq!(w.code, code);
    }
    // Counted per (number, code): the Gateway's and WhatsApp's (an SMS's
    // text carries more than the code).
    let by_code = channels.iter().filter(|c| **c != "sms").count();
    assert_eq!(mock.deliveries_to(TO, &code) as usize, by_code);
    // No step more: the last row waits for the end, and nothing more goes.
    let rows = call(
        &b.base,
        reqwest::Method::GET,
        &format!("/verifications/{id}"),
        None,
    )
    .await;
    assert_eq!(
        rows.json()["messages"].as_array().map(Vec::len),
        Some(channels.len())
    );
    let checked = reqwest::Client::new()
        .post(format!("{}/verifications/{id}/check", b.base))
        .bearer_auth(KEY)
        .json(&json!({ "code": code }))
        .send()
        .await
        .expect("check");
    assert_eq!(answer(checked).await.json()["status"], "approved");
    assert_eq!(sms_calls(&mock).len(), 1);
    assert_eq!(mock.gateway_messages().len(), 1);
    assert_eq!(mock.whatsapp_messages().len(), want_whatsapp);
}

macro_rules! cases {
    ($($name:ident: $channels:expr, $point:expr;)+) => {
        $(
            async fn $name(backend: Backend) {
                run_case(backend, &$channels, $point).await;
            }
        )+
        on_both_backends!($($name),+);
    };
}

cases! {
    sms_then_telegram_killed_before_the_move: ["sms", "telegram"], "fallback.before_move";
    sms_then_telegram_killed_after_the_move: ["sms", "telegram"], "fallback.after_move";
    telegram_then_sms_killed_before_the_move: ["telegram", "sms"], "fallback.before_move";
    telegram_then_sms_killed_after_the_move: ["telegram", "sms"], "fallback.after_move";
    three_steps_killed_before_each_move: ["whatsapp", "telegram", "sms"], "fallback.before_move";
    three_steps_killed_after_each_move: ["whatsapp", "telegram", "sms"], "fallback.after_move";
}
