//! The test SMSC from a package registry: the npm `smpp` package's server,
//! run by `testkit/smsc/smsc.js` (through `scripts/smsc.sh`) as a child
//! process and scripted over its stdin/stdout, one JSON object a line. It
//! never de-duplicates: every `submit_sm` it receives is reported, so a
//! message sent twice is counted twice.
//!
//! Without Node.js the tests that use it are skipped with a loud notice,
//! unless `SENDONCE_REQUIRE_SMSC` is set (CI), where they fail.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

pub struct NpmSmsc {
    pub port: u16,
    _child: Child,
    stdin: ChildStdin,
    events: Arc<Mutex<Vec<Value>>>,
    changed: Arc<Notify>,
    commands: u64,
}

/// How the SMSC is started.
#[derive(Default)]
pub struct Start {
    /// Listen on this port (0: any).
    pub port: u16,
    /// PEM files: serve SMPP over TLS.
    pub tls: Option<(String, String)>,
}

/// Whether Node.js can run the SMSC; `false` (skip) only when
/// `SENDONCE_REQUIRE_SMSC` is not set.
pub fn available(test: &str) -> bool {
    let node = std::process::Command::new("node").arg("--version").output();
    if node.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(
        std::env::var_os("SENDONCE_REQUIRE_SMSC").is_none(),
        "SENDONCE_REQUIRE_SMSC is set but Node.js is not installed"
    );
    eprintln!(
        "\n\n******** SKIPPED: {test} needs the npm smpp SMSC (scripts/smsc.sh), \
         and Node.js is not installed. Install nodejs and npm to run it. ********\n\n"
    );
    false
}

impl NpmSmsc {
    pub async fn start(how: Start) -> NpmSmsc {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut cmd = Command::new(format!("{root}/scripts/smsc.sh"));
        cmd.arg("run").arg("--port").arg(how.port.to_string());
        if let Some((key, cert)) = &how.tls {
            cmd.arg("--tls-key").arg(key).arg("--tls-cert").arg(cert);
        }
        let mut child = cmd
            .current_dir(root)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start scripts/smsc.sh");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let events = Arc::new(Mutex::new(Vec::new()));
        let changed = Arc::new(Notify::new());
        let (e, c) = (Arc::clone(&events), Arc::clone(&changed));
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|err| panic!("smsc.js wrote {line:?}: {err}"));
                e.lock().unwrap().push(v);
                c.notify_waiters();
            }
            e.lock().unwrap().push(json!({"event": "exited"}));
            c.notify_waiters();
        });
        let mut smsc = NpmSmsc {
            port: 0,
            _child: child,
            stdin,
            events,
            changed,
            commands: 0,
        };
        // The first run installs the package.
        let listening = smsc
            .wait(Duration::from_secs(120), "the SMSC to listen", |ev| {
                ev.iter()
                    .find(|e| e["event"] == "listening")
                    .map(|e| e["port"].as_u64().unwrap_or(0))
            })
            .await;
        smsc.port = u16::try_from(listening).expect("a port");
        smsc
    }

    /// Sends one command and waits until the SMSC has carried it out.
    pub async fn cmd(&mut self, c: Value) {
        let mut line = c.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to smsc.js");
        self.commands += 1;
        let n = self.commands;
        self.wait(Duration::from_secs(10), &format!("command {c}"), |ev| {
            ev.iter()
                .any(|e| e["event"] == "done" && e["cmd"].as_u64() == Some(n))
                .then_some(())
        })
        .await;
    }

    pub async fn config(&mut self, c: Value) {
        let mut c = c;
        c["cmd"] = json!("config");
        self.cmd(c).await;
    }

    /// One-shot answers to the next submits, before the configured one.
    pub async fn queue(&mut self, answers: &[&str]) {
        self.cmd(json!({"cmd": "queue", "answers": answers})).await;
    }

    pub async fn deliver(&mut self, message_id: &str, stat: &str) {
        self.cmd(json!({"cmd": "deliver", "message_id": message_id, "stat": stat}))
            .await;
    }

    /// Waits (with a deadline) until `check` over every event so far says
    /// something.
    pub async fn wait<T>(
        &self,
        limit: Duration,
        what: &str,
        check: impl Fn(&[Value]) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(v) = check(&self.events.lock().unwrap()) {
                return v;
            }
            if self
                .events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e["event"] == "exited")
            {
                panic!("smsc.js exited while waiting for {what} (see its output above)");
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "timed out waiting for {what}; the SMSC reported {:#?}",
                    self.events.lock().unwrap()
                );
            }
        }
    }

    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == kind)
            .cloned()
            .collect()
    }

    pub fn submits(&self) -> Vec<Value> {
        self.events("submit")
    }

    /// Submits the SMSC accepted (answered `ESME_ROK`) or took without
    /// answering, to `dest` with a part whose text is in `body`: what may be
    /// on the phone. A refused submit (throttled) created nothing.
    pub fn taken_to(&self, dest: &str) -> Vec<Value> {
        self.submits_to(dest)
            .into_iter()
            .filter(|s| s["answer"] == "ok" || s["answer"] == "silent")
            .collect()
    }

    /// Messages created at the SMSC per (destination, whole body): parts
    /// joined in order of their part number.
    pub fn created(&self, dest: &str, body: &str) -> usize {
        self.taken_to(dest)
            .iter()
            .filter(|s| {
                let t = s["text"].as_str().unwrap_or("");
                if s["udh"].is_null() {
                    t == body
                } else {
                    s["udh"]["part"] == 1 && body.starts_with(t)
                }
            })
            .count()
    }

    /// Every submit to `to` (E.164; on the wire without the `+`, TON 1).
    pub fn submits_to(&self, to: &str) -> Vec<Value> {
        let dest = to.trim_start_matches('+');
        self.submits()
            .into_iter()
            .filter(|s| s["dest"] == dest)
            .collect()
    }

    pub fn binds(&self) -> Vec<Value> {
        self.events("bind")
    }
}
