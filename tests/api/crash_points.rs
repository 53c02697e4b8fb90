//! The real binary killed or paused at every crash and pause point of the
//! state table (`src/failpoint.rs`), over Twilio's wire format at a mock
//! that creates a message for every call it accepts: each run ends with at
//! most one message created for the key and a final answer that says so,
//! finished by a second instance on the same database. Where the first
//! instance stopped after its attempt started but before its request was
//! written, the second cannot tell that from a request Twilio has not
//! listed yet (Twilio documents no bound on how soon it lists a message):
//! it asks again, never resends, and the message ends `unknown` at its
//! retry deadline, nothing created.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testkit::mock_provider::{Behaviour, MockProvider};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::*;
use crate::process::free_port;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, DEFAULT_FROM};

const BIN: &str = env!("CARGO_BIN_EXE_sendonce");
const KEY: &str = "so_crash-points-key-aaaaaaaaaaaaaaaaaaaa";
const TO: &str = "+14155550177";

/// One `sendonce` process: Twilio at the mock, a 1 s provider timeout and
/// the shortest lease that allows (4 s).
struct Bin {
    child: Child,
    base: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

async fn start(database: &str, mock: &str, extra: &[(&str, &str)]) -> Bin {
    let port = free_port().await;
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", database)
        .env("RUST_LOG", "info")
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_BOOTSTRAP_API_KEY", KEY)
        .env("SENDONCE_PROVIDER", "twilio")
        .env("TWILIO_BASE_URL", mock)
        .env("TWILIO_ACCOUNT_SID", ACCOUNT)
        .env("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
        .env("TWILIO_FROM", DEFAULT_FROM)
        .env("SENDONCE_PROVIDER_TIMEOUT", "1s")
        .env("SENDONCE_LEASE", "4s")
        .env("SENDONCE_POLL_INTERVAL", "100ms")
        .env("SENDONCE_SHUTDOWN_GRACE", "200ms")
        // Long enough for a takeover to find what was sent (lease 4 s,
        // then the takeover wait of 3 s), short enough for a message
        // nobody can tell about to end `unknown` within the test.
        .env("SENDONCE_RETRY_DEADLINE", "15s")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
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
    async fn wait_for_line(&self, needle: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no line with {needle:?} within {limit:?}: {:?}",
                self.stderr.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("pid").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    async fn exited(&mut self, limit: Duration) {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .expect("the process ends")
            .expect("wait");
    }
}

async fn post(base: &str, key: &str, body: &str) -> Result<Answer, reqwest::Error> {
    let resp = reqwest::Client::new()
        .post(format!("{base}/messages"))
        .bearer_auth(KEY)
        .header("Idempotency-Key", key)
        .header("Prefer", "respond-async")
        .json(&sms(TO, body))
        .timeout(Duration::from_secs(10))
        .send()
        .await?;
    Ok(answer(resp).await)
}

async fn get(base: &str, key: &str) -> serde_json::Value {
    let resp = reqwest::Client::new()
        .get(format!("{base}/messages/{key}"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("GET");
    answer(resp).await.json()
}

/// Waits until `key` is final on `base` (failing on anything but `want`).
async fn final_on(base: &str, key: &str, want: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let m = get(base, key).await;
        match m["status"].as_str() {
            Some(s) if s == want => return m,
            Some("sent" | "failed" | "unknown" | "canceled") => panic!("{key} ended {m}"),
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} not {want} in time: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where the first instance stops, and how.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `SENDONCE_FAILPOINTS=<point>=kill`.
    Kill(&'static str),
    /// SIGKILLed by the test while the call is at Twilio (after the request
    /// was written, before the answer).
    KillMidCall,
    /// SIGTERM with the call in flight past the grace, then the failpoint
    /// kills the drain at `point`.
    SigtermThenKill(&'static str),
    /// `<point>=stop`, continued (SIGCONT) once the second instance has
    /// sent the message.
    Pause(&'static str),
}

impl Fault {
    /// The first instance stops with its attempt started and its request
    /// never written: nothing reaches Twilio.
    fn before_the_request(self) -> bool {
        matches!(
            self,
            Fault::Kill("claim.after" | "call.before_request")
                | Fault::Pause("claim.after" | "call.before_request")
        )
    }
}

async fn run_case(backend: Backend, fault: Fault) {
    sendonce::install_crypto_provider();
    let database = fresh_database_on(backend).await;
    let (mock, _, addr) = MockProvider::start().await.expect("mock");
    let mock_base = format!("http://{addr}");
    let body = format!("Your order shipped ({fault:?})");
    let env = match fault {
        Fault::Kill(p) | Fault::SigtermThenKill(p) => vec![format!("{p}=kill")],
        Fault::Pause(p) => vec![format!("{p}=stop")],
        Fault::KillMidCall => vec![],
    };
    let failpoints = env.join(",");
    let mut a = start(
        &database,
        &mock_base,
        &[("SENDONCE_FAILPOINTS", &failpoints)],
    )
    .await;
    // Twilio creates the message 300 ms after the request arrives, whatever
    // the caller does meanwhile (past the 200 ms grace of a SIGTERM).
    mock.push([Behaviour::Processing(Duration::from_millis(300))]);
    let first = post(&a.base, "K", &body).await;
    match fault {
        Fault::Kill(_) => a.exited(Duration::from_secs(20)).await,
        Fault::KillMidCall => {
            eventually("the call at Twilio", || async {
                (mock.call_count() == 1).then_some(())
            })
            .await;
            a.signal("-KILL");
            a.exited(Duration::from_secs(10)).await;
        }
        Fault::SigtermThenKill(_) => {
            eventually("the call at Twilio", || async {
                (mock.call_count() == 1).then_some(())
            })
            .await;
            a.signal("-TERM");
            a.exited(Duration::from_secs(20)).await;
        }
        Fault::Pause(_) => a.wait_for_line("failpoint", Duration::from_secs(20)).await,
    }
    // The client may have had its answer (202) or lost its connection; it
    // retries against the other instance either way.
    let b = start(&database, &mock_base, &[]).await;
    let retried = post(&b.base, "K", &body).await.expect("retry");
    // 409: the key is still being processed (by whoever holds it now).
    assert!(
        [201, 202, 409].contains(&retried.status),
        "{fault:?}: {} {}",
        retried.status,
        String::from_utf8_lossy(&retried.bytes)
    );
    if let Ok(first) = &first {
        assert_eq!(first.status, 202, "{fault:?}");
    }
    let nothing_written = fault.before_the_request();
    let m = final_on(
        &b.base,
        "K",
        if nothing_written { "unknown" } else { "sent" },
    )
    .await;
    if let Fault::Pause(_) = fault {
        a.signal("-CONT");
        // It goes on, finds its lease gone, and sends nothing.
        a.wait_for_line("lease lost", Duration::from_secs(20)).await;
    }
    if nothing_written {
        assert_eq!(
            mock.deliveries_to(TO, &body),
            0,
            "{fault:?}: nothing was written, nothing resent"
        );
        assert!(m["provider_message_id"].is_null(), "{fault:?}: {m}");
        assert_eq!(get(&b.base, "K").await["status"], "unknown");
        return;
    }
    assert_eq!(
        mock.deliveries_to(TO, &body),
        1,
        "{fault:?}: one message created at Twilio ({:?})",
        mock.calls().len()
    );
    let sids = mock.twilio_sids();
    assert_eq!(
        m["provider_message_id"],
        sids[0].as_str(),
        "{fault:?}: the answer names the message Twilio created"
    );
    // Replays on either instance give the same final answer.
    assert_eq!(get(&b.base, "K").await["status"], "sent");
}

macro_rules! cases {
    ($($name:ident: $fault:expr,)*) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    run_case(Backend::Postgres, $fault).await
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    run_case(Backend::Sqlite, $fault).await
                }
            )*
        }
    };
}

cases! {
    killed_before_the_claim_commits: Fault::Kill("claim.before"),
    killed_after_the_claim_commits: Fault::Kill("claim.after"),
    killed_before_the_request_is_written: Fault::Kill("call.before_request"),
    killed_after_the_request_is_written_before_the_answer: Fault::KillMidCall,
    killed_after_the_answer_before_the_final_write: Fault::Kill("finish.before"),
    killed_after_the_final_write: Fault::Kill("finish.after"),
    killed_during_the_drain_before_the_release: Fault::SigtermThenKill("shutdown.before_release"),
    killed_during_the_drain_after_the_release: Fault::SigtermThenKill("shutdown.after_release"),
    a_paused_owner_never_resumes_into_the_provider_call: Fault::Pause("call.before_request"),
    paused_after_the_claim_commits: Fault::Pause("claim.after"),
}

/// A receipt that overtook the send (Twilio's status callback for a message
/// whose answer the instance never got) is kept unlinked; the instance
/// finds the message by reconciling, writes its sid and is killed before it
/// looks for early receipts. The next instance links it: the message is
/// `delivered`, as Twilio said.
async fn an_early_receipt_survives_a_kill_after_the_final_write(backend: Backend) {
    sendonce::install_crypto_provider();
    let database = fresh_database_on(backend).await;
    let (mock, _, addr) = MockProvider::start().await.expect("mock");
    let mock_base = format!("http://{addr}");
    let body = "Your order shipped (early receipt)";
    let mut a = start(
        &database,
        &mock_base,
        &[("SENDONCE_FAILPOINTS", "finish.after=kill")],
    )
    .await;
    // Twilio creates the message and never answers: the call times out
    // and the instance finds the message by its list.
    mock.push([Behaviour::AcceptThenHang]);
    let first = post(&a.base, "R", body).await.expect("POST");
    assert_eq!(first.status, 202);
    let sid = eventually("the message at Twilio", || async {
        mock.twilio_sids().first().cloned()
    })
    .await;
    // Twilio's callback, before the instance knows the sid: kept unlinked.
    let url = format!("{}/providers/twilio/status", a.base);
    let params: Vec<(String, String)> = [
        ("AccountSid", ACCOUNT),
        ("ApiVersion", "2010-04-01"),
        ("MessageSid", sid.as_str()),
        ("MessageStatus", "delivered"),
        ("SmsSid", sid.as_str()),
        ("SmsStatus", "delivered"),
        ("To", TO),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let signed = sendonce::provider::twilio::signature(AUTH_TOKEN, &url, &params);
    let receipt = reqwest::Client::new()
        .post(&url)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("X-Twilio-Signature", signed)
        .body(sendonce::provider::twilio::encode_form(&params))
        .send()
        .await
        .expect("callback");
    assert_eq!(receipt.status().as_u16(), 200);
    // The sid written, then killed before the look.
    a.exited(Duration::from_secs(30)).await;
    let b = start(&database, &mock_base, &[]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let m = loop {
        let m = get(&b.base, "R").await;
        if m["status"] == "delivered" {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the early receipt never linked: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(m["provider_message_id"], sid.as_str());
    assert_eq!(mock.deliveries_to(TO, body), 1, "one message at Twilio");
}

mod early_receipt {
    use super::*;

    #[tokio::test]
    async fn postgres() {
        an_early_receipt_survives_a_kill_after_the_final_write(Backend::Postgres).await
    }

    #[tokio::test]
    async fn sqlite() {
        an_early_receipt_survives_a_kill_after_the_final_write(Backend::Sqlite).await
    }
}
