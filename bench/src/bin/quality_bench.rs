//! Routes that follow quality (issue 43), measured: one sendonce instance
//! (the binary next to this one, on Postgres) routing `+966=http,twilio`,
//! `http` at one mock provider and `twilio` at another, both reporting every
//! delivery at once, with the quality settings shrunk so that a run takes
//! about a minute (window 60s, slow after 5s, cooldown 20s, a beat every
//! second, 50 samples, a floor of 5%).
//!
//! 1. **A provider degrading under load.** A steady load of unique sends to
//!    `+96650…` numbers (one slot every 1/`--rate` s, skipped while
//!    `--concurrency` requests are in flight, so the load never bursts to
//!    catch up; every key and body new) for `--shift-secs`; at
//!    `--degrade-at-secs` the `http` mock is restarted on its port with
//!    `MOCK_RECEIPTS=none` (it keeps accepting and reports nothing); with
//!    `--degrade-in-place` the `http` mock runs in this process instead and
//!    its receipts are turned off while it serves (no restart: no gap, no
//!    request cut mid-call, no provider id reused, exact counts).
//!    Measured: the time from the degradation to the shift (`GET /routes`
//!    polled every 200 ms for `twilio` first, and the stored `changed_at`),
//!    the share of new messages that started on each provider before the
//!    degradation, between it and the shift, and after the shift (SQL over
//!    `messages`: the floor keeps ≈ 5% on `http`), the errors, the audit
//!    row, and that every (To, Body) was created once: the mocks' creations
//!    (the first `http` mock read just before it was killed) against the
//!    messages sent, and each mock's own repeated (To, Body) count. Then,
//!    on the same database, the aggregate the evaluator runs once per beat
//!    is timed over the run's messages, and again over ~15 minutes of them
//!    (the run's rows copied back in time: `--seed-rows`) with the default
//!    window.
//! 2. **The cost of computing quality.** The same instance and load for
//!    `--cost-secs` (after `--warmup-secs` not measured) with
//!    `SENDONCE_ROUTE_QUALITY=on` (a beat every second: 30 times the default
//!    rate of evaluation) and `off` (the beat still reads the stored
//!    orders), alternating on/off `--rounds` times, each on a fresh
//!    database: sendonce's CPU (utime + stime from /proc) per send, the CPU
//!    of the Postgres backends serving the run's database per send, all of
//!    Postgres per send, and the machine's busy share.
//!
//! Prints tables; exits non-zero if the shift never happened, a request
//! failed, a (To, Body) was created twice, a message was left `processing`,
//! or sendonce's log has an ERROR line or a Postgres session stuck in an
//! aborted transaction. `scripts/quality-bench.sh`
//! builds the binaries and runs it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use hdrhistogram::Histogram;
use sendonce::store::postgres::PoolSettings;
use sendonce::store::{PgStore, QualityStore, QualityWindow};
use sendonce_bench::db::{Database, count_processing, create_database, drop_database};
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::stats::{machine_cpu, mock_stats, postgres_cpu, process_cpu, stat_cpu};
use serde_json::Value;
use sqlx::{Connection, PgConnection};
use testkit::mock_provider::{MockProvider, ReceiptConfig, ReceiptOrder};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::time::MissedTickBehavior;

/// The route under test.
const ROUTES: &str = "+966=http,twilio";
const PREFIX: &str = "+966";
/// The route's configured order, as `messages.route_order` writes one.
const CONFIGURED: &str = "http,twilio";
const RECEIPT_SECRET: &str = "quality-bench-receipt-secret-0123456789";
const TWILIO_SID: &str = "AC0123456789abcdef0123456789abcdef";
const TWILIO_TOKEN: &str = "quality-bench-twilio-token";

#[derive(Parser, Debug)]
#[command(about = "Measure routes that follow quality: a shift under load, and its cost")]
struct Args {
    /// New sends a second (paced; at most --concurrency in flight).
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Length of the degradation run's load, seconds.
    #[arg(long, default_value_t = 70)]
    shift_secs: u64,
    /// When (seconds into the load) the `http` mock stops reporting.
    #[arg(long, default_value_t = 20)]
    degrade_at_secs: u64,
    /// Measured seconds of each cost run.
    #[arg(long, default_value_t = 20)]
    cost_secs: u64,
    /// Unmeasured seconds of load before each cost run's measurement.
    #[arg(long, default_value_t = 3)]
    warmup_secs: u64,
    /// Pairs of cost runs (on, then off), interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Skip the degradation run.
    #[arg(long)]
    no_shift: bool,
    /// Degrade `http` in place instead of restarting its mock: the `http`
    /// mock runs in this process and its receipts are turned off while it
    /// keeps serving (no gap, no connection cut mid-request, no message id
    /// reused, and its counts span the whole run).
    #[arg(long)]
    degrade_in_place: bool,
    /// Skip the cost runs.
    #[arg(long)]
    no_cost: bool,
    /// Skip timing the aggregate query after the degradation run.
    #[arg(long)]
    no_query_timing: bool,
    /// Messages in the database when the aggregate is timed with the
    /// default 15-minute window (the run's rows copied back in time):
    /// 180,000 is 15 minutes at 200 a second.
    #[arg(long, default_value_t = 180_000)]
    seed_rows: i64,
    /// Worker threads of the driver's own runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Server for the run's own databases.
    #[arg(
        long,
        env = "TEST_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    admin_url: String,
    /// Where `sendonce` and `mock-provider` are (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quality_bench: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Interrupted: the run's future is dropped, and with it its processes
    // (killed on drop); its databases are left (named sendonce_q*).
    let outcome = runtime.block_on(async {
        tokio::select! {
            r = run(args) => r,
            () = sendonce::shutdown::signal() => Err("interrupted".to_string()),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("quality_bench: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------
// Small helpers

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn pct(n: i64, of: i64) -> String {
    if of <= 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * n as f64 / of as f64)
    }
}

fn us_per(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------
// The processes

struct Setup {
    bin_dir: PathBuf,
    log_dir: PathBuf,
    admin_url: String,
}

/// One sendonce instance and its two mocks.
struct Instance {
    service: Child,
    pid: u32,
    port: u16,
    mock_a: MockA,
    mock_a_port: u16,
    mock_b: Child,
    mock_b_port: u16,
    target: Arc<Target>,
    log: PathBuf,
}

/// The `http` provider's mock: a process, or in this process (then its
/// receipts can be turned off while it serves).
enum MockA {
    Process(Child),
    InProcess(MockProvider, tokio::task::JoinHandle<()>),
}

impl MockA {
    async fn stop(&mut self) {
        match self {
            MockA::Process(c) => procs::kill(c).await,
            MockA::InProcess(_, task) => task.abort(),
        }
    }

    async fn stats(&self, client: &reqwest::Client, port: u16) -> Value {
        match self {
            MockA::Process(_) => mock_stats(client, port).await.unwrap_or(Value::Null),
            MockA::InProcess(mock, _) => serde_json::to_value(mock.stats()).unwrap_or(Value::Null),
        }
    }
}

/// The in-process `http` mock's receipts: to sendonce at once, or none.
fn receipts_a(port: u16, reporting: bool) -> ReceiptConfig {
    ReceiptConfig {
        order: if reporting {
            ReceiptOrder::InOrder
        } else {
            ReceiptOrder::None
        },
        http_url: Some(format!("http://127.0.0.1:{port}/providers/http/status")),
        http_secret: Some(RECEIPT_SECRET.to_string()),
        ..ReceiptConfig::default()
    }
}

/// The `http` mock's settings: receipts to sendonce at once, or none.
fn mock_a_env(port: u16, reporting: bool) -> Vec<(&'static str, String)> {
    vec![
        (
            "MOCK_RECEIPTS",
            if reporting { "in-order" } else { "none" }.to_string(),
        ),
        (
            "MOCK_HTTP_RECEIPT_URL",
            format!("http://127.0.0.1:{port}/providers/http/status"),
        ),
        ("MOCK_RECEIPT_SECRET", RECEIPT_SECRET.to_string()),
    ]
}

/// Starts a mock on `port` and waits for its `/stats`, retrying the start a
/// few times (the port of a mock just killed may take a moment to free).
async fn start_mock(
    setup: &Setup,
    client: &reqwest::Client,
    port: u16,
    env: &[(&str, String)],
) -> Result<Child, String> {
    let base = format!("http://127.0.0.1:{port}");
    let mut last = String::new();
    for _ in 0..20 {
        let mut child = procs::spawn_mock(&setup.bin_dir, port, env)?;
        match procs::wait_ready(client, &base, "/stats", Some(&mut child)).await {
            Ok(()) => return Ok(child),
            Err(e) => {
                last = e;
                procs::kill(&mut child).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    Err(format!("mock-provider on {port}: {last}"))
}

async fn start_instance(
    setup: &Setup,
    db: &Database,
    quality_on: bool,
    label: &str,
    in_place: bool,
) -> Result<Instance, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let port = free_port().map_err(|e| e.to_string())?;
    let mock_b_port = free_port().map_err(|e| e.to_string())?;
    let (mock_a, mock_a_port) = if in_place {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let a_port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mock = MockProvider::default();
        mock.set_receipts(receipts_a(port, true));
        let task = mock.serve(listener);
        (MockA::InProcess(mock, task), a_port)
    } else {
        let a_port = free_port().map_err(|e| e.to_string())?;
        let child = start_mock(setup, &client, a_port, &mock_a_env(port, true)).await?;
        (MockA::Process(child), a_port)
    };
    // Twilio's receipts go to each message's StatusCallback, signed with
    // the auth token the request carried.
    let mock_b = start_mock(
        setup,
        &client,
        mock_b_port,
        &[("MOCK_RECEIPTS", "in-order".to_string())],
    )
    .await?;

    let mut migrate = Command::new(setup.bin_dir.join("sendonce"));
    migrate.env("DATABASE_URL", &db.url);
    procs::migrate(migrate).await?;

    let api_key = sendonce::apikey::generate().secret;
    let log_path = setup.log_dir.join(format!("sendonce-{label}.log"));
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(setup.bin_dir.join("sendonce"));
    cmd.env("DATABASE_URL", &db.url)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_PUBLIC_URL", format!("http://127.0.0.1:{port}"))
        .env("SENDONCE_ROUTES", ROUTES)
        .env(
            "SENDONCE_HTTP_PROVIDER_URL",
            format!("http://127.0.0.1:{mock_a_port}/messages"),
        )
        .env("SENDONCE_RECEIPT_SECRET", RECEIPT_SECRET)
        .env("TWILIO_BASE_URL", format!("http://127.0.0.1:{mock_b_port}"))
        .env("TWILIO_ACCOUNT_SID", TWILIO_SID)
        .env("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
        .env("TWILIO_FROM", "+14155550000")
        .env("SENDONCE_BOOTSTRAP_API_KEY", &api_key)
        // One tenant sending to one number range as fast as it can: what
        // the abuse limits exist to stop.
        .env("SENDONCE_RATE_TENANT_RPS", "0")
        .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
        .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0")
        .env(
            "SENDONCE_ROUTE_QUALITY",
            if quality_on { "on" } else { "off" },
        )
        .env("SENDONCE_ROUTE_QUALITY_WINDOW", "60s")
        .env("SENDONCE_ROUTE_QUALITY_SLOW_AFTER", "5s")
        .env("SENDONCE_ROUTE_QUALITY_COOLDOWN", "20s")
        .env("SENDONCE_ROUTE_QUALITY_EVERY", "1s")
        .env("SENDONCE_ROUTE_QUALITY_MIN_SAMPLES", "50")
        .env("SENDONCE_ROUTE_QUALITY_FLOOR", "5%")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .env_remove("SENDONCE_PROVIDER")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true);
    let mut service = cmd.spawn().map_err(|e| format!("start sendonce: {e}"))?;
    let pid = service.id().ok_or("sendonce has no pid")?;
    let base = format!("http://127.0.0.1:{port}");
    procs::wait_ready(&client, &base, "/readyz", Some(&mut service))
        .await
        .map_err(|e| format!("sendonce: {e}; log {}", log_path.display()))?;
    let target = Arc::new(Target {
        client,
        base,
        api_key,
        tag: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        next: AtomicU64::new(0),
    });
    Ok(Instance {
        service,
        pid,
        port,
        mock_a,
        mock_a_port,
        mock_b,
        mock_b_port,
        target,
        log: log_path,
    })
}

/// What an instance's log says went wrong: (lines with a Postgres session
/// stuck in an aborted transaction, ERROR lines, the first of either).
fn log_findings(path: &std::path::Path) -> (usize, usize, Option<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (mut aborted, mut errors, mut first) = (0, 0, None);
    for line in text.lines() {
        let a = line.contains("current transaction is aborted");
        let e = line.contains(" ERROR ");
        aborted += usize::from(a);
        errors += usize::from(e);
        if (a || e) && first.is_none() {
            first = Some(line.chars().take(300).collect());
        }
    }
    (aborted, errors, first)
}

impl Instance {
    async fn stop(&mut self) {
        procs::kill(&mut self.service).await;
        self.mock_a.stop().await;
        procs::kill(&mut self.mock_b).await;
    }
}

// ---------------------------------------------------------------------------
// The load

struct Target {
    client: reqwest::Client,
    base: String,
    api_key: String,
    /// Distinguishes this run's keys and bodies.
    tag: String,
    next: AtomicU64,
}

enum Outcome {
    /// 201, sent.
    Sent,
    /// 202: accepted, not yet sent when answered.
    Accepted,
}

impl Target {
    /// Send `n`: its own key, number and body.
    async fn send(&self, n: u64) -> Result<Outcome, String> {
        let key = format!("QB-{}-{n:08}", self.tag);
        let body = serde_json::json!({
            "to": format!("+96650{:07}", n % 10_000_000),
            "body": format!("Your sendonce code is {:06}. Ref {}-{n}", n % 1_000_000, self.tag),
        });
        let resp = self
            .client
            .post(format!("{}/messages", self.base))
            .header("authorization", format!("Bearer {}", self.api_key))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("transport: {}", short(&e)))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("transport: {}", short(&e)))?;
        match status {
            201 if contains(&bytes, br#""status":"sent""#) => Ok(Outcome::Sent),
            201 => Err(format!(
                "201 not sent: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(120)
                    .collect::<String>()
            )),
            202 => Ok(Outcome::Accepted),
            s => Err(format!(
                "HTTP {s}: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(120)
                    .collect::<String>()
            )),
        }
    }

    async fn get_json(&self, path: &str) -> Result<Value, String> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.api_key))
            .send()
            .await
            .map_err(|e| short(&e))?;
        if !resp.status().is_success() {
            return Err(format!("GET {path}: HTTP {}", resp.status()));
        }
        resp.json().await.map_err(|e| short(&e))
    }
}

fn short(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    s.truncate(80);
    s
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What one stretch of load did.
struct Load {
    sent: u64,
    accepted: u64,
    /// Slots not taken: `concurrency` requests were in flight.
    skipped: u64,
    errors: BTreeMap<String, u64>,
    hist: Histogram<u64>,
    elapsed: Duration,
}

impl Load {
    fn empty(elapsed: Duration) -> Self {
        Load {
            sent: 0,
            accepted: 0,
            skipped: 0,
            errors: BTreeMap::new(),
            hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("bounds"),
            elapsed,
        }
    }

    fn requests(&self) -> u64 {
        self.sent + self.accepted + self.error_count()
    }

    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    fn ms(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }

    fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Unique sends at a steady `rate` a second for `duration`: one slot every
/// 1/`rate`, taken by a new request unless `concurrency` are already in
/// flight (then it is skipped: the load never bursts to catch up).
async fn run_load(target: Arc<Target>, rate: f64, concurrency: usize, duration: Duration) -> Load {
    let concurrency = concurrency.max(1);
    let start = Instant::now();
    let end = start + duration;
    let slots = Arc::new(Semaphore::new(concurrency));
    let tally = Arc::new(std::sync::Mutex::new(Load::empty(duration)));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut started = 0u64;
    loop {
        tick.tick().await;
        if Instant::now() >= end {
            break;
        }
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        started += 1;
        let target = Arc::clone(&target);
        let tally = Arc::clone(&tally);
        tokio::spawn(async move {
            let n = target.next.fetch_add(1, Ordering::Relaxed);
            let t = Instant::now();
            let r = target.send(n).await;
            let us = (t.elapsed().as_micros() as u64).clamp(1, 120_000_000);
            if let Ok(mut l) = tally.lock() {
                let _ = l.hist.record(us);
                match r {
                    Ok(Outcome::Sent) => l.sent += 1,
                    Ok(Outcome::Accepted) => l.accepted += 1,
                    Err(e) => *l.errors.entry(e).or_default() += 1,
                }
            }
            drop(permit);
        });
    }
    // The requests still in flight.
    let _ = slots.acquire_many(concurrency as u32).await;
    let mut load = {
        let mut l = tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *l, Load::empty(duration))
    };
    load.skipped = ((duration.as_secs_f64() * rate) as u64).saturating_sub(started);
    load
}

/// Waits up to `limit` for no message to be `processing`.
async fn settle(url: &str, limit: Duration) -> Result<i64, String> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        let n = count_processing(&mut conn).await;
        if n == 0 || Instant::now() >= deadline {
            let _ = conn.close().await;
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------
// 1. A provider degrading under load

/// The route's first shift as `GET /routes` showed it.
struct Seen {
    /// Since the load started.
    at: Duration,
    order: Vec<String>,
    reason: String,
    changed_at: String,
    /// `http`'s quality in that answer.
    http_quality: Value,
}

/// Polls `GET /routes` every 200 ms until the route's first provider is
/// `twilio` or `stop`.
async fn watch(
    target: Arc<Target>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> (Option<Seen>, u64, u64) {
    let (mut polls, mut failed) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        polls += 1;
        match target.get_json("/routes").await {
            Ok(v) => {
                let route = v["data"]
                    .as_array()
                    .and_then(|a| a.iter().find(|r| r["prefix"] == PREFIX))
                    .cloned()
                    .unwrap_or(Value::Null);
                let names: Vec<String> = route["providers"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p["name"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                if names.first().map(String::as_str) == Some("twilio") {
                    let http_quality = route["providers"]
                        .as_array()
                        .and_then(|a| a.iter().find(|p| p["name"] == "http"))
                        .map(|p| p["quality"].clone())
                        .unwrap_or(Value::Null);
                    return (
                        Some(Seen {
                            at: start.elapsed(),
                            order: names,
                            reason: route["reason"].as_str().unwrap_or("").to_string(),
                            changed_at: route["changed_at"].as_str().unwrap_or("").to_string(),
                            http_quality,
                        }),
                        polls,
                        failed,
                    );
                }
            }
            Err(_) => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (None, polls, failed)
}

/// Messages by phase (before the degradation, between it and the shift,
/// after the shift) and the provider they started on.
#[derive(Default)]
struct Phases {
    /// phase -> started-on provider -> count
    started: BTreeMap<String, BTreeMap<String, i64>>,
    /// Of those, the ones that ended on another provider (failed over).
    moved: i64,
    /// (phase, provider it ended on) -> (messages, delivered, sent without
    /// a final receipt)
    receipts: BTreeMap<(String, String), (i64, i64, i64)>,
}

impl Phases {
    fn total(&self, phase: &str) -> i64 {
        self.started.get(phase).map_or(0, |m| m.values().sum())
    }

    fn on(&self, phase: &str, provider: &str) -> i64 {
        self.started
            .get(phase)
            .and_then(|m| m.get(provider))
            .copied()
            .unwrap_or(0)
    }
}

struct ShiftReport {
    load: Load,
    degrade_at: Duration,
    /// The `http` mock's restart: from the kill to the new one answering.
    restart_gap: Duration,
    seen: Option<Seen>,
    polls: (u64, u64),
    /// changed_at (stored) minus the degradation, seconds.
    to_shift_stored: Option<f64>,
    stored_order: Option<(String, String, i64)>,
    audit: Vec<Value>,
    phases: Phases,
    statuses: BTreeMap<String, i64>,
    processing: i64,
    messages: i64,
    sent_messages: i64,
    retried: i64,
    retried_attempts: BTreeMap<String, i64>,
    distinct_to_body: i64,
    id_taken: i64,
    /// Created by the first `http` mock (read just before the kill), the
    /// second, and Twilio's.
    created: (u64, u64, u64),
    mock_repeats: u64,
    queries: Vec<(String, i64, f64, f64)>,
    log: PathBuf,
}

fn stat_u64(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

async fn shift_run(
    args: &Args,
    setup: &Setup,
    admin: &mut PgConnection,
) -> Result<ShiftReport, String> {
    let db = create_database(admin, &setup.admin_url, "qshift").await?;
    let r = shift_on(args, setup, &db).await;
    drop_database(admin, &db).await;
    r
}

async fn shift_on(args: &Args, setup: &Setup, db: &Database) -> Result<ShiftReport, String> {
    let mut inst = start_instance(setup, db, true, "shift", args.degrade_in_place).await?;
    let target = Arc::clone(&inst.target);
    let start = Instant::now();
    let load = tokio::spawn(run_load(
        Arc::clone(&target),
        args.rate,
        args.concurrency,
        Duration::from_secs(args.shift_secs),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(Arc::clone(&target), start, Arc::clone(&stop)));

    tokio::time::sleep_until((start + Duration::from_secs(args.degrade_at_secs)).into()).await;
    let client = target.client.clone();
    let a1 = inst.mock_a.stats(&client, inst.mock_a_port).await;
    let degrade_epoch = epoch_now();
    let degrade_at = start.elapsed();
    let killed = Instant::now();
    match &mut inst.mock_a {
        MockA::Process(child) => {
            procs::kill(child).await;
            inst.mock_a = MockA::Process(
                start_mock(
                    setup,
                    &client,
                    inst.mock_a_port,
                    &mock_a_env(inst.port, false),
                )
                .await?,
            );
        }
        MockA::InProcess(mock, _) => mock.set_receipts(receipts_a(inst.port, false)),
    }
    let restart_gap = killed.elapsed();
    println!(
        "  t={:.1}s: http's mock {} ({} ms); it had created {}",
        degrade_at.as_secs_f64(),
        if args.degrade_in_place {
            "stopped reporting in place"
        } else {
            "restarted with MOCK_RECEIPTS=none"
        },
        restart_gap.as_millis(),
        stat_u64(&a1, "created")
    );

    let load = load.await.map_err(|e| e.to_string())?;
    stop.store(true, Ordering::Relaxed);
    let (seen, polls, failed) = watcher.await.map_err(|e| e.to_string())?;
    let processing = settle(&db.url, Duration::from_secs(15)).await?;
    // Receipts still on their way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a2 = inst.mock_a.stats(&client, inst.mock_a_port).await;
    let b = mock_stats(&client, inst.mock_b_port)
        .await
        .unwrap_or(Value::Null);
    let audit: Vec<Value> = target
        .get_json("/admin/audit?limit=50")
        .await
        .ok()
        .and_then(|v| v["data"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["action"] == "route.shift")
        .collect();
    inst.stop().await;

    let mut conn = PgConnection::connect(&db.url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let stored: Option<(f64, String, String, i64)> = sqlx::query_as(
        "SELECT CAST(EXTRACT(EPOCH FROM changed_at) AS float8), providers, reason, version \
         FROM route_orders WHERE prefix = $1",
    )
    .bind(PREFIX)
    .fetch_optional(&mut conn)
    .await
    .map_err(|e| format!("route_orders: {e}"))?;
    let shift_epoch = stored
        .as_ref()
        .filter(|(_, p, _, _)| p.starts_with("twilio"))
        .map(|(e, _, _, _)| *e);
    let rows: Vec<(String, String, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT CASE WHEN created_at < to_timestamp($1) THEN 'before' \
                     WHEN created_at < to_timestamp($2) THEN 'between' ELSE 'after' END, \
                split_part(COALESCE(route_order, $3), ',', 1), provider, count(*), \
                count(*) FILTER (WHERE status = 'delivered'), \
                count(*) FILTER (WHERE status = 'sent') \
         FROM messages GROUP BY 1, 2, 3",
    )
    .bind(degrade_epoch)
    .bind(shift_epoch.unwrap_or(1e12))
    .bind(CONFIGURED)
    .fetch_all(&mut conn)
    .await
    .map_err(|e| format!("phases: {e}"))?;
    let mut phases = Phases::default();
    for (phase, started, ended, n, delivered, sent) in rows {
        let r = phases
            .receipts
            .entry((phase.clone(), ended.clone()))
            .or_default();
        r.0 += n;
        r.1 += delivered;
        r.2 += sent;
        *phases
            .started
            .entry(phase)
            .or_default()
            .entry(started.clone())
            .or_default() += n;
        if started != ended {
            phases.moved += n;
        }
    }
    let statuses: BTreeMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM messages GROUP BY 1")
            .fetch_all(&mut conn)
            .await
            .map_err(|e| format!("statuses: {e}"))?
            .into_iter()
            .collect();
    let (messages, sent_messages, retried, distinct_to_body, id_taken): (i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE sent_at IS NOT NULL), \
                    count(*) FILTER (WHERE attempts > 1), \
                    count(DISTINCT (to_number, body)), \
                    count(*) FILTER (WHERE error::text LIKE '%provider_id_taken%') \
             FROM messages",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("counts: {e}"))?;
    // The attempts of the messages tried more than once: an `ambiguous` one
    // (no clear answer) could be a message created twice.
    let retried_attempts: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT COALESCE(a.outcome, 'open') || COALESCE(' (' || a.error || ')', ''), count(*) \
         FROM attempts a JOIN messages m ON m.id = a.message_id \
         WHERE m.attempts > 1 GROUP BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|e| format!("attempts: {e}"))?
    .into_iter()
    .map(|(k, n)| (k.chars().take(100).collect(), n))
    .collect();
    let _ = conn.close().await;

    let queries = if args.no_query_timing {
        Vec::new()
    } else {
        match time_queries(db, args.seed_rows).await {
            Ok(q) => q,
            Err(e) => {
                println!("  timing the aggregate failed: {e}");
                Vec::new()
            }
        }
    };
    Ok(ShiftReport {
        load,
        degrade_at,
        restart_gap,
        seen,
        polls: (polls, failed),
        to_shift_stored: shift_epoch.map(|s| s - degrade_epoch),
        stored_order: stored.map(|(_, p, r, v)| (p, r, v)),
        audit,
        phases,
        statuses,
        processing,
        messages,
        sent_messages,
        retried,
        retried_attempts,
        distinct_to_body,
        id_taken,
        // In place, the one mock's counts span the run: the second part
        // is what it created after the degradation.
        created: if args.degrade_in_place {
            (
                stat_u64(&a1, "created"),
                stat_u64(&a2, "created").saturating_sub(stat_u64(&a1, "created")),
                stat_u64(&b, "created"),
            )
        } else {
            (
                stat_u64(&a1, "created"),
                stat_u64(&a2, "created"),
                stat_u64(&b, "created"),
            )
        },
        mock_repeats: if args.degrade_in_place {
            stat_u64(&a2, "duplicate_recipient_bodies")
        } else {
            stat_u64(&a1, "duplicate_recipient_bodies")
                + stat_u64(&a2, "duplicate_recipient_bodies")
        } + stat_u64(&b, "duplicate_recipient_bodies"),
        queries,
        log: inst.log.clone(),
    })
}

/// Times the evaluator's aggregate (`QualityStore::route_quality`, the one
/// query each beat runs) on the stopped instance's database: over the run's
/// messages with the run's window, then over `seed_rows` messages (the
/// run's copied back in time, 70 s a copy) with the default 15-minute
/// window and 5-minute SLOW_AFTER. (label, rows in the window, median ms,
/// min ms).
async fn time_queries(
    db: &Database,
    seed_rows: i64,
) -> Result<Vec<(String, i64, f64, f64)>, String> {
    let store = PgStore::connect_lazy(
        &db.url,
        &PoolSettings {
            max_connections: 2,
            acquire_timeout: Duration::from_secs(10),
        },
    )
    .map_err(|e| e.to_string())?;
    let mut conn = PgConnection::connect(&db.url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut out = Vec::new();
    let clock = sendonce::clock::Clock::system();
    let time = |label: String, window: Duration, slow_after: Duration, rows: i64| {
        let store = &store;
        let clock = clock.clone();
        async move {
            let mut ms = Vec::new();
            for _ in 0..15 {
                let now = clock.now();
                let w = QualityWindow {
                    since: now - window,
                    judged_before: now - slow_after,
                    slow_after_micros: slow_after.as_micros() as i64,
                };
                let t = Instant::now();
                store
                    .route_quality(w)
                    .await
                    .map_err(|e| format!("route_quality: {e}"))?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
            Ok::<_, String>((label, rows, median(ms), min))
        }
    };
    let in_window: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE created_at >= now() - interval '60 seconds'",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    out.push(
        time(
            "the run's messages, window 60s (as in the run)".into(),
            Duration::from_secs(60),
            Duration::from_secs(5),
            in_window,
        )
        .await?,
    );
    // ~15 minutes of messages: the run's rows, copied 70 s further back
    // each time, until `seed_rows`.
    let base: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    if base > 0 && seed_rows > base {
        let seeded = Instant::now();
        sqlx::query("CREATE TEMP TABLE seed AS SELECT * FROM messages")
            .execute(&mut conn)
            .await
            .map_err(|e| format!("seed: {e}"))?;
        let mut total = base;
        while total + base <= seed_rows {
            sqlx::query(
                "UPDATE seed SET id = gen_random_uuid(), idempotency_key = idempotency_key || '~', \
                    provider_message_id = provider_message_id || '~', \
                    created_at = created_at - interval '70 seconds', \
                    updated_at = updated_at - interval '70 seconds', \
                    sent_at = sent_at - interval '70 seconds', \
                    delivery_status_at = delivery_status_at - interval '70 seconds', \
                    finalized_at = finalized_at - interval '70 seconds', \
                    prepared_token = NULL",
            )
            .execute(&mut conn)
            .await
            .map_err(|e| format!("seed: {e}"))?;
            sqlx::query("INSERT INTO messages SELECT * FROM seed")
                .execute(&mut conn)
                .await
                .map_err(|e| format!("seed: {e}"))?;
            total += base;
        }
        sqlx::query("ANALYZE messages")
            .execute(&mut conn)
            .await
            .map_err(|e| format!("analyze: {e}"))?;
        let in_window: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM messages WHERE created_at >= now() - interval '15 minutes'",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        println!(
            "  seeded {total} messages in {:.1} s for the 15-minute window",
            seeded.elapsed().as_secs_f64()
        );
        out.push(
            time(
                "~15 min of messages at the run's rate, window 15m (the default)".into(),
                Duration::from_secs(15 * 60),
                Duration::from_secs(300),
                in_window,
            )
            .await?,
        );
    }
    let _ = conn.close().await;
    store.pool().close().await;
    Ok(out)
}

fn print_shift(args: &Args, r: &ShiftReport) -> Vec<String> {
    let mut problems = Vec::new();
    let l = &r.load;
    println!();
    println!("## 1. A provider degrading under load");
    println!();
    println!(
        "load: {} requests in {:.1} s ({:.0}/s of {:.0}/s offered, at most {} in flight: {} slots skipped with all in flight): {} sent (201), {} accepted (202), {} errors; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        l.requests(),
        l.elapsed.as_secs_f64(),
        l.rate(),
        args.rate,
        args.concurrency,
        l.skipped,
        l.sent,
        l.accepted,
        l.error_count(),
        l.ms(0.5),
        l.ms(0.99),
        l.hist.max() as f64 / 1000.0
    );
    for (e, n) in &l.errors {
        println!("  error x{n}: {e}");
    }
    if l.error_count() > 0 {
        problems.push(format!("{} request errors", l.error_count()));
    }
    if args.degrade_in_place {
        println!(
            "degradation at t={:.1} s: http's mock (in this process) stopped reporting, in place",
            r.degrade_at.as_secs_f64()
        );
    } else {
        println!(
            "degradation at t={:.1} s: http's mock restarted with MOCK_RECEIPTS=none (down {} ms)",
            r.degrade_at.as_secs_f64(),
            r.restart_gap.as_millis()
        );
    }
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    match &r.seen {
        Some(s) => {
            println!(
                "| shift seen by GET /routes (200 ms polls) | t={:.1} s, **{:.1} s after the degradation** |",
                s.at.as_secs_f64(),
                (s.at.saturating_sub(r.degrade_at)).as_secs_f64()
            );
            println!(
                "| changed_at (GET /routes) | {} |",
                if s.changed_at.is_empty() {
                    "null"
                } else {
                    &s.changed_at
                }
            );
            let q = &s.http_quality;
            println!(
                "| http's quality in that answer | judged {}, slow {}, slow share {}, verdict {} |",
                q["judged"],
                q["slow"],
                q["slow_share"]
                    .as_f64()
                    .map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
                q["verdict"]
            );
            println!("| order then | {} ({}) |", s.order.join(", "), s.reason);
        }
        None => {
            println!(
                "| shift seen by GET /routes | **never** ({} polls) |",
                r.polls.0
            );
            problems.push("the route never shifted to twilio".into());
        }
    }
    match r.to_shift_stored {
        Some(d) => println!("| stored changed_at − degradation | **{d:.2} s** |"),
        None => println!("| stored changed_at − degradation | no shift stored |"),
    }
    if let Some((p, reason, v)) = &r.stored_order {
        println!("| route_orders at the end | {p} (version {v}): {reason} |");
    }
    println!(
        "| GET /routes polls (failed) | {} ({}) |",
        r.polls.0, r.polls.1
    );
    println!("| route.shift audit rows | {} |", r.audit.len());
    for a in &r.audit {
        println!(
            "|   audit | {} {} → {}: {} |",
            a["at"].as_str().unwrap_or(""),
            a["detail"]["from"],
            a["detail"]["to"],
            a["detail"]["reason"].as_str().unwrap_or("")
        );
    }
    println!();
    println!("| messages created | all | started on http | started on twilio | http share |");
    println!("|---|---:|---:|---:|---:|");
    for (phase, name) in [
        ("before", "before the degradation"),
        ("between", "degradation → shift"),
        ("after", "after the shift"),
    ] {
        let all = r.phases.total(phase);
        let http = r.phases.on(phase, "http");
        println!(
            "| {name} | {all} | {http} | {} | **{}** |",
            r.phases.on(phase, "twilio"),
            pct(http, all)
        );
    }
    println!(
        "| ended on another provider than they started on (failed over) | {} | | | |",
        r.phases.moved
    );
    println!();
    println!("| messages created | ended on | messages | delivered | sent, no final receipt |");
    println!("|---|---|---:|---:|---:|");
    for ((phase, provider), (n, delivered, sent)) in &r.phases.receipts {
        println!("| {phase} | {provider} | {n} | {delivered} | {sent} |");
    }
    println!();
    let (a1, a2, b) = r.created;
    let created = a1 + a2 + b;
    println!(
        "messages: {} stored, {} sent to a provider, {} with more than one attempt, {} distinct (To, Body); statuses {:?}; still processing {}",
        r.messages, r.sent_messages, r.retried, r.distinct_to_body, r.statuses, r.processing
    );
    println!(
        "attempts of the messages tried more than once: {:?}",
        r.retried_attempts
    );
    println!(
        "stored sent without the provider's id (provider_id_taken: a restarted mock numbers its messages from the start again): {}",
        r.id_taken
    );
    let ambiguous: i64 = r
        .retried_attempts
        .iter()
        .filter(|(k, _)| k.starts_with("ambiguous"))
        .map(|(_, n)| n)
        .sum();
    if ambiguous > 0 {
        if args.degrade_in_place {
            problems.push(format!(
                "{ambiguous} attempts were ambiguous: a message may have been created twice"
            ));
        } else {
            // Requests in flight when the mock was SIGKILLed: sent again
            // under the same key; whether the dead mock had created them
            // is not counted anywhere (its count was read just before).
            println!(
                "NOTE: {ambiguous} attempts were cut by the mock's SIGKILL (ambiguous), then sent again to the new mock under the same key: \
                 whether the killed mock had created them before dying cannot be counted (run with --degrade-in-place for an exact count)"
            );
        }
    }
    println!(
        "created at the mocks: http {a1} (before the degradation) + {a2} (after) + twilio {b} = {created}; (To, Body) created twice at one mock: {}",
        r.mock_repeats
    );
    let dup_db = r.messages - r.distinct_to_body;
    if dup_db != 0 {
        problems.push(format!("{dup_db} messages share a (To, Body)"));
    }
    if r.mock_repeats > 0 {
        problems.push(format!(
            "{} (To, Body) created twice at one mock",
            r.mock_repeats
        ));
    }
    if created as i64 != r.sent_messages {
        // The first mock's count is read just before it is killed: a
        // message it created in between is missing here (a shortfall),
        // one created twice would be an excess.
        println!(
            "NOTE: the mocks created {created} messages, the database sent {} ({:+})",
            r.sent_messages,
            created as i64 - r.sent_messages
        );
        if (created as i64) > r.sent_messages {
            problems.push(format!(
                "the mocks created {} more messages than were sent",
                created as i64 - r.sent_messages
            ));
        }
    }
    if r.processing > 0 {
        problems.push(format!("{} messages still processing", r.processing));
    }
    let (aborted, errors, first) = log_findings(&r.log);
    println!(
        "sendonce's log ({}): {aborted} lines 'current transaction is aborted', {errors} ERROR lines",
        r.log.display()
    );
    if aborted > 0 || errors > 0 {
        println!("  first: {}", first.unwrap_or_default());
        problems.push(format!(
            "degradation run: sendonce logged {aborted} aborted-transaction lines and {errors} ERROR lines"
        ));
    }
    if !r.queries.is_empty() {
        println!();
        println!(
            "The evaluator's aggregate (one per beat), timed on the run's database after the run (15 calls each):"
        );
        println!();
        println!("| over | messages in the window | median ms | min ms |");
        println!("|---|---:|---:|---:|");
        for (label, rows, med, min) in &r.queries {
            println!("| {label} | {rows} | {med:.1} | {min:.1} |");
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// 2. The cost of computing quality

struct CostRun {
    on: bool,
    load: Load,
    service: Duration,
    backends: Duration,
    postgres: Duration,
    /// Both mocks (they send the receipts).
    mocks: Duration,
    machine_busy: f64,
    load_avg: String,
    log: PathBuf,
}

/// CPU of the Postgres backends serving database `name`, by pid.
async fn backends(admin: &mut PgConnection, name: &str) -> HashMap<u32, Duration> {
    let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1")
        .bind(name)
        .fetch_all(&mut *admin)
        .await
        .unwrap_or_default();
    pids.into_iter()
        .map(|p| (p as u32, stat_cpu(p as u32, false)))
        .collect()
}

async fn cost_run(
    args: &Args,
    setup: &Setup,
    admin: &mut PgConnection,
    on: bool,
    n: usize,
) -> Result<CostRun, String> {
    let db = create_database(admin, &setup.admin_url, "qcost").await?;
    let r = async {
        let label = format!("cost-{}-{n}", if on { "on" } else { "off" });
        let mut inst = start_instance(setup, &db, on, &label, false).await?;
        let target = Arc::clone(&inst.target);
        let warm = run_load(
            Arc::clone(&target),
            args.rate,
            args.concurrency,
            Duration::from_secs(args.warmup_secs),
        )
        .await;
        let b0 = backends(admin, &db.name).await;
        let mocks_cpu = |inst: &Instance| {
            let a = match &inst.mock_a {
                MockA::Process(c) => c.id().map(process_cpu).unwrap_or_default(),
                MockA::InProcess(..) => Duration::ZERO,
            };
            a + inst.mock_b.id().map(process_cpu).unwrap_or_default()
        };
        let k0 = mocks_cpu(&inst);
        let (s0, p0, m0) = (process_cpu(inst.pid), postgres_cpu(), machine_cpu());
        let load = run_load(
            Arc::clone(&target),
            args.rate,
            args.concurrency,
            Duration::from_secs(args.cost_secs),
        )
        .await;
        let (s1, p1, m1) = (process_cpu(inst.pid), postgres_cpu(), machine_cpu());
        let k1 = mocks_cpu(&inst);
        let b1 = backends(admin, &db.name).await;
        let load_avg = loadavg();
        inst.stop().await;
        let mut load = load;
        for (k, v) in warm.errors {
            *load.errors.entry(format!("warm-up: {k}")).or_default() += v;
        }
        let backends: Duration = b1
            .iter()
            .map(|(pid, t)| t.saturating_sub(b0.get(pid).copied().unwrap_or_default()))
            .sum();
        Ok::<_, String>(CostRun {
            on,
            load,
            service: s1.saturating_sub(s0),
            mocks: k1.saturating_sub(k0),
            backends,
            postgres: p1.saturating_sub(p0),
            machine_busy: (m1.0 - m0.0) as f64 / (m1.1 - m0.1).max(1) as f64,
            load_avg,
            log: inst.log.clone(),
        })
    }
    .await;
    drop_database(admin, &db).await;
    r
}

fn print_cost(args: &Args, runs: &[CostRun]) -> Vec<String> {
    let mut problems = Vec::new();
    println!();
    println!("## 2. The cost of computing quality");
    println!();
    println!(
        "unique sends at {:.0}/s, concurrency {}, {} s measured after {} s of warm-up, each run on a fresh database; SENDONCE_ROUTE_QUALITY_EVERY=1s in both",
        args.rate, args.concurrency, args.cost_secs, args.warmup_secs
    );
    println!();
    println!(
        "| run | quality | sends | req/s | slots skipped | errors | p50 ms | p99 ms | sendonce CPU µs/send | its DB's backends µs/send | all Postgres µs/send | mocks µs/send | machine busy | load avg after |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (i, r) in runs.iter().enumerate() {
        let n = r.load.sent + r.load.accepted;
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0}% | {} |",
            i + 1,
            if r.on { "on" } else { "off" },
            n,
            r.load.rate(),
            r.load.skipped,
            r.load.error_count(),
            r.load.ms(0.5),
            r.load.ms(0.99),
            us_per(r.service, n),
            us_per(r.backends, n),
            us_per(r.postgres, n),
            us_per(r.mocks, n),
            r.machine_busy * 100.0,
            r.load_avg
        );
        for (e, k) in &r.load.errors {
            println!("  run {} error x{k}: {e}", i + 1);
        }
        if r.load.error_count() > 0 {
            problems.push(format!(
                "cost run {}: {} errors",
                i + 1,
                r.load.error_count()
            ));
        }
        let (aborted, errors, first) = log_findings(&r.log);
        if aborted > 0 || errors > 0 {
            println!("  run {} log: {}", i + 1, first.unwrap_or_default());
            problems.push(format!(
                "cost run {}: sendonce logged {aborted} aborted-transaction lines and {errors} ERROR lines",
                i + 1
            ));
        }
    }
    let mean = |on: bool, f: &dyn Fn(&CostRun) -> f64| {
        let v: Vec<f64> = runs.iter().filter(|r| r.on == on).map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let per = |d: fn(&CostRun) -> Duration| {
        move |r: &CostRun| us_per(d(r), r.load.sent + r.load.accepted)
    };
    println!();
    println!("| per send, mean of the runs | on | off | on / off |");
    println!("|---|---:|---:|---:|");
    for (name, f) in [
        ("sendonce CPU µs", per(|r| r.service)),
        ("its database's Postgres backends µs", per(|r| r.backends)),
        ("all Postgres µs", per(|r| r.postgres)),
    ] {
        let (a, b) = (mean(true, &f), mean(false, &f));
        // Each round's on run against the off run right after it.
        let pairs: Vec<String> = runs
            .chunks(2)
            .filter(|p| p.len() == 2 && p[0].on && !p[1].on)
            .map(|p| format!("{:.2}", f(&p[0]) / f(&p[1])))
            .collect();
        println!(
            "| {name} | {a:.0} | {b:.0} | **{:.3}** (rounds: {}) |",
            a / b,
            pairs.join(", ")
        );
    }
    problems
}

// ---------------------------------------------------------------------------

async fn run(args: Args) -> Result<bool, String> {
    sendonce::install_crypto_provider();
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), " (scripts/quality-bench.sh does)")?;
    let log_dir = procs::log_dir("quality-bench")?;
    let setup = Setup {
        bin_dir,
        log_dir,
        admin_url: args.admin_url.clone(),
    };
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .map_err(|e| format!("connect to {}: {e}", args.admin_url))?;
    println!(
        "quality_bench: route {ROUTES}; window 60s, slow after 5s, slow share 15%, cooldown 20s, every 1s, min samples 50, floor 5%; {} /s at concurrency {}; logs in {}; load average at start {}",
        args.rate,
        args.concurrency,
        setup.log_dir.display(),
        loadavg()
    );
    let mut problems = Vec::new();
    if !args.no_shift {
        println!(
            "degradation run: {} s of load, http degraded at {} s",
            args.shift_secs, args.degrade_at_secs
        );
        match shift_run(&args, &setup, &mut admin).await {
            Ok(r) => problems.extend(print_shift(&args, &r)),
            Err(e) => problems.push(format!("degradation run: {e}")),
        }
    }
    if !args.no_cost {
        let mut runs = Vec::new();
        for round in 0..args.rounds {
            for on in [true, false] {
                println!(
                    "cost run {} (quality {}), load average {}",
                    runs.len() + 1,
                    if on { "on" } else { "off" },
                    loadavg()
                );
                match cost_run(&args, &setup, &mut admin, on, round + 1).await {
                    Ok(r) => runs.push(r),
                    Err(e) => problems.push(format!("cost run: {e}")),
                }
            }
        }
        problems.extend(print_cost(&args, &runs));
    }
    println!();
    println!("load average at the end: {}", loadavg());
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    let ok = problems.is_empty();
    println!("quality_bench: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
