//! The chaos run's SMSC: the npm `smpp` package's server
//! (`testkit/smsc/smsc.js`, started through `scripts/smsc.sh run`, the one
//! the SMPP adapter's tests use), scripted over its stdin and reporting every
//! `submit_sm` it receives over its stdout, one JSON object a line. It never
//! de-duplicates: every submit is reported with the answer it got, and
//! [`created`] counts from those reports what may be on a phone.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

/// One `submit_sm` as the SMSC reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submit {
    pub session: u64,
    /// The destination as on the wire (E.164 without the `+`).
    pub dest: String,
    /// The part's text, decoded by its data_coding.
    pub text: String,
    /// The concatenation header: (reference, total, part number).
    pub udh: Option<(u64, u64, u64)>,
    /// `ok`, a status (`0x00000058`-style or `0x58`), `silent` or `drop`.
    pub answer: String,
    /// The SMSC's wall clock when it read the submit, in ms.
    pub at_ms: i64,
}

impl Submit {
    /// Taken by the SMSC: accepted, or held without an answer (`silent`,
    /// `drop`): it may be on the phone.
    pub fn taken(&self) -> bool {
        matches!(self.answer.as_str(), "ok" | "silent" | "drop")
    }

    /// Taken without an answer: the ESME cannot know.
    pub fn unanswered(&self) -> bool {
        matches!(self.answer.as_str(), "silent" | "drop")
    }

    fn from_event(e: &Value) -> Option<Submit> {
        let udh = if e["udh"].is_null() {
            None
        } else {
            Some((
                e["udh"]["ref"].as_u64()?,
                e["udh"]["total"].as_u64()?,
                e["udh"]["part"].as_u64()?,
            ))
        };
        Some(Submit {
            session: e["session"].as_u64()?,
            dest: e["dest"].as_str()?.to_string(),
            text: e["text"].as_str()?.to_string(),
            udh,
            answer: e["answer"].as_str()?.to_string(),
            at_ms: e["at_ms"].as_i64()?,
        })
    }
}

/// Messages created at the SMSC for one message `body`, from the submits
/// made to its destination: (created, unmatched). A single-part submit
/// taken whose text is `body` is one message; the parts taken under one
/// concatenation reference whose texts are all pieces of `body` are one
/// message (some parts are enough: they are on the phone), and a part taken
/// twice under the same reference counts once more for each repeat (the
/// phone got it twice). Submits taken that are neither are `unmatched`.
pub fn created(submits: &[&Submit], body: &str) -> (u32, u32) {
    let mut created = 0u32;
    let mut unmatched = 0u32;
    // Per reference: how often each part number was taken.
    let mut refs: BTreeMap<u64, BTreeMap<u64, u32>> = BTreeMap::new();
    for s in submits.iter().filter(|s| s.taken()) {
        match s.udh {
            None if s.text == body => created += 1,
            Some((reference, _, part)) if !s.text.is_empty() && body.contains(&s.text) => {
                *refs.entry(reference).or_default().entry(part).or_default() += 1;
            }
            _ => unmatched += 1,
        }
    }
    for parts in refs.values() {
        created += 1 + parts.values().map(|n| n - 1).sum::<u32>();
    }
    (created, unmatched)
}

#[derive(Default)]
struct Log {
    events: Vec<Value>,
    exited: bool,
}

/// The SMSC process, its reports so far, and its command channel.
pub struct Smsc {
    pub port: u16,
    _child: Child,
    stdin: tokio::sync::Mutex<(ChildStdin, u64)>,
    log: Arc<Mutex<Log>>,
    changed: Arc<Notify>,
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Smsc {
    /// Starts `scripts/smsc.sh run --port 0` in `root` (which installs the
    /// pinned package on its first run) and waits until it listens.
    pub async fn start(root: &Path) -> Result<Smsc, String> {
        let mut child = Command::new(root.join("scripts/smsc.sh"))
            .args(["run", "--port", "0"])
            .current_dir(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start scripts/smsc.sh: {e}"))?;
        let stdin = child.stdin.take().ok_or("smsc.sh: no stdin")?;
        let stdout = child.stdout.take().ok_or("smsc.sh: no stdout")?;
        let log = Arc::new(Mutex::new(Log::default()));
        let changed = Arc::new(Notify::new());
        let (l, c) = (Arc::clone(&log), Arc::clone(&changed));
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => lock(&l).events.push(v),
                    Err(e) => eprintln!("smsc.js wrote {line:?}: {e}"),
                }
                c.notify_waiters();
            }
            lock(&l).exited = true;
            c.notify_waiters();
        });
        let mut smsc = Smsc {
            port: 0,
            _child: child,
            stdin: tokio::sync::Mutex::new((stdin, 0)),
            log,
            changed,
        };
        let port = smsc
            .wait(Duration::from_secs(180), "the SMSC to listen", |events| {
                events
                    .iter()
                    .find(|e| e["event"] == "listening")
                    .and_then(|e| e["port"].as_u64())
            })
            .await?;
        smsc.port = u16::try_from(port).map_err(|e| e.to_string())?;
        Ok(smsc)
    }

    /// Sends one command and waits until the SMSC has carried it out.
    pub async fn cmd(&self, c: Value) -> Result<(), String> {
        let n = {
            let mut stdin = self.stdin.lock().await;
            let mut line = c.to_string();
            line.push('\n');
            stdin
                .0
                .write_all(line.as_bytes())
                .await
                .map_err(|e| format!("write to smsc.js: {e}"))?;
            stdin.1 += 1;
            stdin.1
        };
        self.wait(Duration::from_secs(10), &format!("command {c}"), |ev| {
            ev.iter()
                .rev()
                .any(|e| e["event"] == "done" && e["cmd"].as_u64() == Some(n))
                .then_some(())
        })
        .await
    }

    /// `answers`: for each submit, each (answer, probability) drawn in turn,
    /// else `ok`.
    pub async fn set_faults(&self, answers: &[(&str, f64)]) -> Result<(), String> {
        let faults: Vec<Value> = answers
            .iter()
            .filter(|(_, p)| *p > 0.0)
            .map(|(a, p)| json!([a, p]))
            .collect();
        self.cmd(json!({"cmd": "config", "answer": "ok", "faults": faults}))
            .await
    }

    /// Destroys every session (the SMSC drops them all at once).
    pub async fn drop_sessions(&self) -> Result<(), String> {
        self.cmd(json!({"cmd": "drop"})).await
    }

    async fn wait<T>(
        &self,
        limit: Duration,
        what: &str,
        check: impl Fn(&[Value]) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let log = lock(&self.log);
                if let Some(v) = check(&log.events) {
                    return Ok(v);
                }
                if log.exited {
                    return Err(format!("smsc.js exited while waiting for {what}"));
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(format!("timed out waiting for {what}"));
            }
        }
    }

    /// Every submit so far, by destination.
    pub fn submits(&self) -> HashMap<String, Vec<Submit>> {
        let mut by_dest: HashMap<String, Vec<Submit>> = HashMap::new();
        for s in lock(&self.log)
            .events
            .iter()
            .filter(|e| e["event"] == "submit")
            .filter_map(Submit::from_event)
        {
            by_dest.entry(s.dest.clone()).or_default().push(s);
        }
        by_dest
    }

    /// When each session that has closed closed (SMSC wall clock, ms).
    pub fn closed(&self) -> HashMap<u64, i64> {
        lock(&self.log)
            .events
            .iter()
            .filter(|e| e["event"] == "closed")
            .filter_map(|e| Some((e["session"].as_u64()?, e["at_ms"].as_i64()?)))
            .collect()
    }

    /// Binds (accepted or not) so far.
    pub fn binds(&self) -> usize {
        lock(&self.log)
            .events
            .iter()
            .filter(|e| e["event"] == "bind")
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit(text: &str, udh: Option<(u64, u64, u64)>, answer: &str) -> Submit {
        Submit {
            session: 1,
            dest: "14155550001".into(),
            text: text.into(),
            udh,
            answer: answer.into(),
            at_ms: 0,
        }
    }

    #[test]
    fn created_counts_each_message_once_and_each_repeat_again() {
        let body = "abcdef";
        let one = submit("abcdef", None, "ok");
        let throttled = submit("abcdef", None, "0x58");
        let silent = submit("abcdef", None, "silent");
        assert_eq!(created(&[&one], body), (1, 0));
        assert_eq!(created(&[&throttled, &one], body), (1, 0));
        assert_eq!(created(&[&one, &silent], body), (2, 0));
        // Three parts under one reference: one message.
        let p: Vec<Submit> = (1..=3)
            .map(|n| {
                submit(
                    &body[(n as usize - 1) * 2..n as usize * 2],
                    Some((7, 3, n)),
                    "ok",
                )
            })
            .collect();
        assert_eq!(created(&[&p[0], &p[1], &p[2]], body), (1, 0));
        // Only the first part taken (the rest refused): on the phone.
        let refused = submit("cd", Some((7, 3, 2)), "0x0B");
        assert_eq!(created(&[&p[0], &refused], body), (1, 0));
        // A part taken twice under one reference, or a second reference.
        assert_eq!(created(&[&p[0], &p[1], &p[1], &p[2]], body), (2, 0));
        let again = submit("ab", Some((8, 3, 1)), "ok");
        assert_eq!(created(&[&p[0], &p[1], &p[2], &again], body), (2, 0));
        // Another text to the same number: not this message's.
        let other = submit("zzz", None, "ok");
        assert_eq!(created(&[&one, &other], body), (1, 1));
    }
}
