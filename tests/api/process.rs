//! The binary as operators run it: configuration errors, the tenant command,
//! the first-run key, and SIGTERM with sends in flight.

use std::process::Stdio;
use std::time::Duration;

use testkit::mock_provider::{Behaviour, MockProvider};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_sendonce");

pub(crate) fn sendonce(database: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", database)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

pub(crate) async fn free_port() -> u16 {
    sendonce::install_crypto_provider();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn invalid_configuration_fails_with_one_line() {
    let out = sendonce("postgres://x@127.0.0.1:1/db")
        .env("SENDONCE_LISTEN", "not-an-address")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SENDONCE_LISTEN"), "{stderr}");
    assert!(!stderr.contains("panicked"));

    // An unreachable database is a one-line reason too, without the password.
    let out = sendonce("postgres://x:hunter2@127.0.0.1:1/db")
        .arg("migrate")
        .env("SENDONCE_DB_ACQUIRE_TIMEOUT_MS", "500")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("cannot reach the database"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// Durations by their new names and their old ones: a bad value stops the
/// binary with exit code 2 and one line naming the variable, then the cause.
#[tokio::test]
async fn a_bad_duration_names_its_variable_and_its_cause() {
    for (env, want) in [
        (
            &[("SENDONCE_LEASE_SECS", "30s")][..],
            "SENDONCE_LEASE_SECS=\"30s\" is not a whole number: invalid digit",
        ),
        (
            &[("SENDONCE_SHUTDOWN_GRACE", "soon")][..],
            "SENDONCE_SHUTDOWN_GRACE=\"soon\" is not a duration like 30s, 10m, 1h 30m or 250ms: ",
        ),
        (
            &[("SENDONCE_LEASE", "30s"), ("SENDONCE_LEASE_SECS", "30")][..],
            "both SENDONCE_LEASE and SENDONCE_LEASE_SECS are set",
        ),
        (
            &[("SENDONCE_ROUTES", "+966=smsc; *=simulated")][..],
            "SENDONCE_ROUTES is refused: the route +966 names no provider \"smsc\"",
        ),
        (
            &[("SENDONCE_ROUTES", "966=simulated")][..],
            "SENDONCE_ROUTES is refused: entry 1: \"966\" is not a prefix",
        ),
    ] {
        let out = sendonce("postgres://x@127.0.0.1:1/db")
            .arg("migrate")
            .envs(env.iter().copied())
            .env("SENDONCE_DB_ACQUIRE_TIMEOUT", "200ms")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(want), "{env:?}: {stderr}");
    }
}

#[tokio::test]
async fn tenant_create_prints_only_the_key_and_it_works() {
    let database = fresh_database().await;
    let out = sendonce(&database)
        .args(["tenant", "create", "acme"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let key = lines[0];
    assert!(key.starts_with("so_") && key.len() >= 3 + 22, "{key}");
    // Stored only as a hash.
    let store = store_for(&database);
    let raw: i64 = sqlx::query_scalar("SELECT count(*) FROM api_keys WHERE key_prefix = $1 AND key_hash <> convert_to($2, 'UTF8')")
        .bind(&key[..9])
        .bind(key)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(raw, 1);
    let dup = sendonce(&database)
        .args(["tenant", "create", "acme"])
        .output()
        .await
        .unwrap();
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));

    // The key authenticates against a running instance.
    let app = spawn_with(TestOptions {
        database: Some(database.clone()),
        api_key: Some(key.to_string()),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(
        app.post("CLI-KEY", &sms("+14155550100", "hi")).await.status,
        201
    );
}

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) base: String,
}

pub(crate) async fn start_server(
    database: &str,
    mock_url: &str,
    extra: &[(&str, &str)],
) -> (Server, String) {
    let port = free_port().await;
    let mut cmd = sendonce(database);
    cmd.env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_PROVIDER", "http")
        .env("SENDONCE_HTTP_PROVIDER_URL", mock_url)
        .env("SENDONCE_PROVIDER_TIMEOUT_MS", "5000")
        .env("SENDONCE_LEASE_SECS", "30");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&base).await;
    // On an empty store, the first line on stdout is the bootstrap key.
    let first_line = tokio::time::timeout(Duration::from_millis(200), stdout.next_line())
        .await
        .ok()
        .and_then(|l| l.ok().flatten())
        .unwrap_or_default();
    (Server { child, base }, first_line)
}

#[tokio::test]
async fn a_first_run_prints_a_usable_key_once() {
    let database = fresh_database().await;
    let (_mock, mock_url, _) = MockProvider::start().await.unwrap();
    let (mut server, line) = start_server(&database, &mock_url, &[]).await;
    let key = line.rsplit(' ').next().unwrap_or_default().to_string();
    assert!(
        line.contains("default") && key.starts_with("so_"),
        "{line:?}"
    );
    let a = answer(
        reqwest::Client::new()
            .post(format!("{}/messages", server.base))
            .bearer_auth(&key)
            .header("Idempotency-Key", "FIRST-RUN")
            .json(&sms("+14155550100", "hi"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 201);
    server.child.kill().await.unwrap();
    // A second start finds the tenant and prints nothing.
    let (mut again, line) = start_server(&database, &mock_url, &[]).await;
    assert_eq!(line, "");
    again.child.kill().await.unwrap();
}

#[tokio::test]
async fn sigterm_with_sends_in_flight_exits_0_and_strands_nothing() {
    let database = fresh_database().await;
    let (mock, mock_url, _) = MockProvider::start().await.unwrap();
    let key = "so_sigterm-test-key-aaaaaaaaaaaaaaaaaa";
    let (mut server, _) = start_server(
        &database,
        &mock_url,
        &[
            ("SENDONCE_BOOTSTRAP_API_KEY", key),
            ("SENDONCE_SHUTDOWN_GRACE_SECS", "1"),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let post = |k: String, prefer: &'static str| {
        client
            .post(format!("{}/messages", server.base))
            .bearer_auth(key)
            .header("Idempotency-Key", k)
            .header("Prefer", prefer)
            .json(&sms("+14155550100", "hi"))
            .send()
    };
    assert_eq!(post("DONE".into(), "wait=10").await.unwrap().status(), 201);
    mock.push((0..5).map(|_| Behaviour::Hang));
    for i in 0..5 {
        let r = post(format!("INFLIGHT-{i}"), "respond-async")
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    eventually("five calls in flight", || async {
        (mock.call_count() == 6).then_some(())
    })
    .await;

    let pid = server.child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .expect("the server exits within its grace period")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");

    let store = store_for(&database);
    // Every unfinished message is due for any instance, or (its call was
    // cut off mid-flight) held for the provider timeout, 5 s here, then
    // taken over: none is stranded.
    let stranded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE status = 'processing' \
         AND NOT (next_attempt_at IS NOT NULL AND lease_token IS NULL) \
         AND NOT (lease_token IS NOT NULL AND lease_expires_at <= now() + interval '5 seconds')",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(stranded, 0, "nothing is stranded");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE status = 'processing' AND lease_token IS NOT NULL",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(held, 5, "the five calls cut off are held, not released");
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE status = 'processing'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(waiting, 5);
    let done: String =
        sqlx::query_scalar("SELECT status FROM messages WHERE idempotency_key = 'DONE'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(done, "sent");
}

#[tokio::test]
async fn key_and_country_commands() {
    let database = fresh_database().await;
    let run = |args: &'static [&'static str]| {
        let mut cmd = sendonce(&database);
        cmd.args(args);
        async move {
            let out = cmd.output().await.unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        }
    };
    let (ok, first, _) = run(&["tenant", "create", "acme"]).await;
    assert!(ok);
    let (ok, second, _) = run(&["key", "create", "acme"]).await;
    assert!(ok);
    let (first, second) = (first.trim().to_string(), second.trim().to_string());
    assert_ne!(first, second);
    let (ok, list, _) = run(&["key", "list"]).await;
    assert!(ok);
    assert_eq!(list.lines().count(), 2);
    assert!(
        !list.contains(&first[3..]) && !list.contains(&second[3..]),
        "keys are never listed"
    );
    let (ok, _, err) = run(&["key", "create", "nobody"]).await;
    assert!(!ok && err.contains("no tenant"), "{err}");
    let (ok, _, err) = run(&["tenant", "allow-countries", "acme", "USA"]).await;
    assert!(!ok && err.contains("ISO 3166"), "{err}");
    let (ok, _, _) = run(&["tenant", "allow-countries", "acme", "us", "CA"]).await;
    assert!(ok);

    let app = spawn_with(TestOptions {
        database: Some(database.clone()),
        api_key: Some(second.clone()),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(app.post("US", &sms("+14155550100", "hi")).await.status, 201);
    let gb = app.post("GB", &sms("+442079460958", "hi")).await;
    assert_eq!(gb.status, 400);
    assert!(
        gb.json()["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("US, CA")
    );

    // Revoke the second key by its id: refused at once, the first still works.
    let id = list
        .lines()
        .find(|l| l.contains(&second[..9]))
        .and_then(|l| l.split('\t').next())
        .unwrap()
        .to_string();
    let mut cmd = sendonce(&database);
    let out = cmd.args(["key", "revoke", &id]).output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(
        app.post("AFTER", &sms("+14155550100", "hi")).await.status,
        401
    );
    let first_app = spawn_with(TestOptions {
        database: Some(database.clone()),
        api_key: Some(first.clone()),
        mock: Some((app.mock.clone(), app.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(
        first_app
            .post("FIRST", &sms("+14155550100", "hi"))
            .await
            .status,
        201
    );
}

/// Runs the server with debug logs, sends one OTP, and returns what it logged.
async fn logs_of_one_send(log_bodies: bool) -> (String, String) {
    let database = fresh_database().await;
    let port = free_port().await;
    let key = "so_log-test-key-aaaaaaaaaaaaaaaaaaaaaaa";
    let child = sendonce(&database)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_BOOTSTRAP_API_KEY", key)
        .env("SENDONCE_LOG_BODIES", log_bodies.to_string())
        .env("SENDONCE_LOG_FORMAT", "json")
        .env("RUST_LOG", "debug")
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually("the server", || async {
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let a = client
        .post(format!("{base}/messages"))
        .bearer_auth(key)
        .header("Idempotency-Key", "OTP-LOG")
        .json(&sms("+14155550100", "Your code is 918273"))
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 201);
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        key.to_string(),
    )
}

#[tokio::test]
async fn logs_carry_neither_keys_nor_bodies_unless_asked() {
    let (logs, key) = logs_of_one_send(false).await;
    assert!(logs.contains("simulated send"), "{logs}");
    assert!(
        !logs.contains(&key[3..]),
        "the API key leaked into the logs"
    );
    assert!(
        !logs.contains("918273"),
        "the one-time code leaked into the logs"
    );
    assert!(
        !logs.contains("4155550100"),
        "the full number leaked into the logs"
    );
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|_| panic!("SENDONCE_LOG_FORMAT=json gives JSON lines: {line}"));
    }
    // Store calls and provider calls run in spans that name the message.
    let in_span = |name: &str| {
        logs.lines().any(|l| {
            l.contains(&format!("\"name\":\"{name}\"")) && l.contains("\"message_id\":\"msg_")
        })
    };
    assert!(in_span("store.insert_message"), "no store span in:\n{logs}");
    assert!(in_span("store.finish"), "no store span in:\n{logs}");
    let (logs, _) = logs_of_one_send(true).await;
    assert!(
        logs.contains("918273"),
        "SENDONCE_LOG_BODIES=true logs bodies"
    );
}

/// Text logs written to a pipe or a file carry no ANSI colour codes
/// (issue 26): the server's stderr here is a pipe.
#[tokio::test]
async fn text_logs_to_a_pipe_are_plain() {
    let database = fresh_database().await;
    let port = free_port().await;
    let child = sendonce(&database)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_LOG_FORMAT", "text")
        .env("RUST_LOG", "info")
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually("the server", || async {
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("INFO"), "some log lines: {logs}");
    assert!(!logs.contains('\u{1b}'), "ANSI escapes in: {logs:?}");
}
