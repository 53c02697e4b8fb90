//! Issue 42, item 2: the local outbox. With the simulated provider, what
//! would have been sent (recipient, body with its code, time, message id
//! and key) is read with `sendonce outbox` and on `/console/outbox`; with a
//! real provider both say the outbox is only for the simulated provider and
//! show nothing. On both stores.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncBufReadExt;

use crate::console::Browser;
use crate::helpers::*;

fn simulated(backend: Backend, database: Option<String>) -> TestOptions {
    TestOptions {
        backend,
        database,
        provider: Some(Box::new(|_, _, _| {
            Arc::new(sendonce::provider::SimulatedProvider::default())
        })),
        ..TestOptions::default()
    }
}

fn outbox_command(database: &str, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_sendonce"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", database)
        .arg("outbox")
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    c
}

async fn run(mut c: tokio::process::Command) -> (bool, String, String) {
    let out = c.output().await.expect("run sendonce outbox");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn send(app: &TestApp, key: &str, to: &str, body: &str) {
    let sent = answer(
        app.request(reqwest::Method::POST, "/messages")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&json!({"to": to, "body": body}))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.bytes));
    assert_eq!(sent.json()["status"], "sent");
}

async fn the_simulated_providers_sends_are_read_locally_codes_included(backend: Backend) {
    let app = spawn_with(simulated(backend, None)).await;
    send(
        &app,
        "ORDER-1",
        "+14155550100",
        "Your order 1\nis confirmed.",
    )
    .await;
    let started = answer(
        app.request(reqwest::Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "LOGIN-1")
            .json(&json!({"to": "+14155550101", "code_length": 6}))
            .send()
            .await
            .expect("start"),
    )
    .await;
    assert_eq!(
        started.status,
        201,
        "{}",
        String::from_utf8_lossy(&started.bytes)
    );
    let ver = started.json()["id"].as_str().expect("id").to_string();

    // The console page: both messages, the code in the clear.
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    // The code's SMS goes out on its own task: read until it is there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let page = loop {
        let page = b.get("/console/outbox").await;
        let html = String::from_utf8_lossy(&page.bytes).into_owned();
        if page.status == 200 && html.contains("+14155550101") {
            break html;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the code's SMS in the outbox: {} {html}",
            page.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        page.contains("ORDER-1") && page.contains("Your order 1\nis confirmed."),
        "{page}"
    );
    assert!(
        page.contains("+14155550100") && page.contains("sim_"),
        "{page}"
    );
    assert!(page.contains(r#"<pre class="body" dir="auto">"#), "{page}");
    let row = page.split("+14155550101").nth(1).expect("the code's row");
    let body = row
        .split(r#"<pre class="body" dir="auto">"#)
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .expect("its body");
    let code: String = body.chars().filter(char::is_ascii_digit).collect();
    assert_eq!(code.len(), 6, "{body}");
    assert!(!body.contains('*'), "the code is not masked: {body}");
    // It is the code: the check approves.
    let checked = answer(
        app.request(
            reqwest::Method::POST,
            &format!("/verifications/{ver}/check"),
        )
        .bearer_auth(&app.api_key)
        .json(&json!({"code": code}))
        .send()
        .await
        .expect("check"),
    )
    .await;
    assert_eq!(
        checked.json()["status"],
        "approved",
        "{}",
        String::from_utf8_lossy(&checked.bytes)
    );

    // The command: the same, one a line, with the tenant and the time.
    let (ok, out, err) = run(outbox_command(&app.database, &[])).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("\tORDER-1\t") && lines[0].ends_with("\tYour order 1\\nis confirmed."),
        "{out}"
    );
    assert!(
        lines[1].contains("+14155550101") && lines[1].contains(&code),
        "{out}"
    );
    for l in &lines {
        let fields: Vec<&str> = l.split('\t').collect();
        assert_eq!(fields.len(), 7, "{l}");
        assert_eq!(fields[1], app.tenant);
        assert!(
            time::OffsetDateTime::parse(fields[0], &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{l}"
        );
        assert!(
            fields[3].starts_with("msg_") && fields[5].starts_with("sim_"),
            "{l}"
        );
    }
    let (ok, out, _) = run(outbox_command(
        &app.database,
        &["--tenant", &app.tenant, "--limit", "1"],
    ))
    .await;
    assert!(
        ok && out.lines().count() == 1 && out.contains(&code),
        "{out}"
    );
    let (ok, _, err) = run(outbox_command(&app.database, &["--tenant", "nobody"])).await;
    assert!(!ok && err.contains("no tenant"), "{err}");

    // --follow prints what is sent after it started.
    let mut follow = outbox_command(&app.database, &["--follow", "--limit", "1"]);
    follow.stdout(std::process::Stdio::piped());
    let mut child = follow.spawn().expect("outbox --follow");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a first line in time")
        .expect("read");
    assert!(first.is_some_and(|l| l.contains(&code)));
    send(
        &app,
        "ORDER-2",
        "+14155550102",
        "Your order 2 is confirmed.",
    )
    .await;
    let next = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the new send printed in time")
        .expect("read")
        .unwrap_or_default();
    assert!(
        next.contains("ORDER-2") && next.contains("Your order 2 is confirmed."),
        "{next}"
    );
    child.kill().await.expect("stop --follow");
}

async fn a_real_providers_sends_are_never_shown(backend: Backend) {
    // The default test app sends through the `http` provider (a mock).
    let app = spawn_app_on(backend).await;
    let sent = answer(
        app.request(reqwest::Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "LOGIN-2")
            .json(&json!({"to": "+14155550103", "code_length": 6}))
            .send()
            .await
            .expect("start"),
    )
    .await;
    assert_eq!(sent.status, 201);
    send(
        &app,
        "ORDER-3",
        "+14155550104",
        "Your order 3 is confirmed.",
    )
    .await;
    let code_sms = eventually("the code's SMS", || async {
        app.mock.calls().into_iter().find_map(|c| {
            c.body["body"]
                .as_str()
                .filter(|b| b.contains("code"))
                .map(str::to_string)
        })
    })
    .await;
    let code: String = code_sms.chars().filter(char::is_ascii_digit).collect();

    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let page = b.get("/console/outbox").await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8_lossy(&page.bytes).into_owned();
    assert!(
        html.contains("only for the simulated provider") && html.contains("http"),
        "{html}"
    );
    for hidden in ["+14155550103", "+14155550104", "ORDER-3", code.as_str()] {
        assert!(!html.contains(hidden), "{hidden} shown: {html}");
    }

    // The command configured with a real provider refuses.
    let mut real = outbox_command(&app.database, &[]);
    real.env("SENDONCE_PROVIDER", "http")
        .env("SENDONCE_HTTP_PROVIDER_URL", &app.mock_url);
    let (ok, out, err) = run(real).await;
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("only for the simulated provider") && err.contains("http"),
        "{err}"
    );
    // Configured with the simulated one, it still shows no message another
    // provider sent.
    let (ok, out, err) = run(outbox_command(&app.database, &[])).await;
    assert!(ok, "{err}");
    assert!(out.contains("the outbox is empty"), "{out}");
    for hidden in ["+14155550103", "+14155550104", code.as_str()] {
        assert!(!out.contains(hidden), "{hidden} shown: {out}");
    }
}

on_both_backends!(
    the_simulated_providers_sends_are_read_locally_codes_included,
    a_real_providers_sends_are_never_shown,
);
