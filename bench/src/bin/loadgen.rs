//! The benchmark: one sendonce instance on Postgres with the mock provider
//! answering at once, driven over HTTP/1.1 keep-alive at a fixed concurrency,
//! next to the floor (Postgres alone running the statements one new send
//! needs, with pgbench at the same concurrency).
//!
//! Mixes, each for a fixed time (or request count):
//! - `unique`: every request a new key;
//! - `replays`: replays only, of the 1,000 keys completed last (the measure
//!   issue 11's replay target was set on); every replay must be a 201 with
//!   `Idempotent-Replayed: true` and the very bytes of the first answer;
//! - `replay`: 90% replays of any key completed so far, 10% new keys;
//! - `burst`: 50 concurrent requests with one new key at a time; exactly one
//!   must create, the other 49 replay the same bytes;
//! - `get`: `GET /messages/{key}` of completed keys.
//!
//! It reports throughput, p50/p90/p99/max latency (HDR histogram), errors,
//! CPU per request by process, database transactions per request
//! (`pg_stat_database.xact_commit`), the coalesced writes per new send and
//! their batch sizes (the service's `/metrics`), peak RSS (VmHWM), and the
//! ratios to the two floors: the naive one (`floor_naive.sql`, the fixed
//! reference) and the one running sendonce's own statements (`floor.sql`).
//! Then, in the same run: a unique mix at `--high-concurrency` (no errors
//! allowed), a unique mix against an instance with the `simulated` provider,
//! and, with `--peer-python`, the unique mix against the FastAPI + Redis
//! `SET NX` peer of `bench/peer/`. Any error, mismatched replay, burst that did not create
//! exactly once, key the mock provider delivered twice, or message left
//! `processing` makes it exit non-zero; `--smoke` runs for a few seconds and
//! checks only that. Everything it starts listens on 127.0.0.1 and is killed
//! at the end; its databases are dropped.
//!
//! `scripts/bench.sh` builds the binaries and runs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rand::Rng;
use sendonce::store::postgres::PoolSettings;
use sendonce::store::{PgStore, TenantStore};
use sendonce_bench::db::{Database, count_processing, create_database, drop_database};
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::stats::{
    machine_cpu, mock_stats, postgres_cpu, process_cpu, stat_cpu, status_kb, tree_cpu,
};
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mix {
    Unique,
    Replays,
    Replay,
    Burst,
    Get,
}

#[derive(Parser, Debug)]
#[command(about = "Load-test sendonce against the Postgres floor")]
struct Args {
    /// Requests in flight at once (and pgbench clients for the floor).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per mix (and for the floor).
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Requests per mix instead of a duration (still stops after 10 minutes).
    #[arg(long)]
    requests: Option<u64>,
    /// Unique sends before measuring (not reported), to warm connections and caches.
    #[arg(long, default_value_t = 3)]
    warmup_secs: u64,
    /// Concurrent duplicates per key in the burst mix.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// Mixes to run, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "unique,replays,replay,burst,get"
    )]
    mixes: Vec<Mix>,
    /// Share of replays in the replay mix.
    #[arg(long, default_value_t = 0.9)]
    replay_share: f64,
    /// Skip the pgbench floor.
    #[arg(long)]
    no_floor: bool,
    #[arg(long, default_value = "pgbench")]
    pgbench: PathBuf,
    /// Worker threads of the load generator's own runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A few seconds at low concurrency, checking correctness only (CI).
    #[arg(long)]
    smoke: bool,
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
    /// Extra environment for the sendonce instance, NAME=VALUE (repeatable).
    #[arg(long = "service-env")]
    service_env: Vec<String>,
    /// Concurrency of the extra unique mix that must end without errors
    /// (0: skip it).
    #[arg(long, default_value_t = 256)]
    high_concurrency: usize,
    /// Skip the unique mix on an instance with the `simulated` provider.
    #[arg(long)]
    no_simulated: bool,
    /// Python of a venv with bench/peer/requirements.txt installed: runs the
    /// FastAPI + Redis peer (uvicorn, 2 workers) through the unique mix.
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Where the peer's app.py is.
    #[arg(long, default_value = "bench/peer")]
    peer_dir: PathBuf,
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    /// The JSON `sqlite_bench --report` wrote: its figures join the opening
    /// table (scripts/bench.sh runs it first).
    #[arg(long)]
    sqlite_report: Option<PathBuf>,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.smoke {
        args.concurrency = args.concurrency.min(8);
        args.duration_secs = args.duration_secs.min(2);
        args.warmup_secs = args.warmup_secs.min(1);
        args.requests = None;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------
// Measuring

/// Latencies (microseconds) and errors of one kind of request.
struct Tally {
    hist: Histogram<u64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
}

impl Tally {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds"),
            ok: 0,
            errors: BTreeMap::new(),
        }
    }

    fn record(&mut self, elapsed: Duration, result: Result<(), String>) {
        let _ = self
            .hist
            .record((elapsed.as_micros() as u64).clamp(1, 120_000_000));
        match result {
            Ok(()) => self.ok += 1,
            Err(e) => *self.errors.entry(e).or_default() += 1,
        }
    }

    fn merge(&mut self, other: &Tally) {
        let _ = self.hist.add(&other.hist);
        self.ok += other.ok;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    fn errors(&self) -> u64 {
        self.errors.values().sum()
    }

    fn count(&self) -> u64 {
        self.ok + self.errors()
    }
}

/// The processes whose CPU a mix accounts for.
#[derive(Clone, Copy)]
struct Pids {
    service: u32,
    mock: u32,
}

/// CPU used during a mix, by process.
#[derive(Clone, Copy, Default)]
struct Cpu {
    service: Duration,
    postgres: Duration,
    mock: Duration,
    loadgen: Duration,
    /// Share of the whole machine's CPU that was busy.
    machine_busy: f64,
}

struct CpuSnap {
    service: Duration,
    postgres: Duration,
    mock: Duration,
    loadgen: Duration,
    busy: u64,
    total: u64,
}

impl CpuSnap {
    fn take(p: Pids) -> Self {
        let (busy, total) = machine_cpu();
        Self {
            service: tree_cpu(p.service),
            postgres: postgres_cpu(),
            mock: process_cpu(p.mock),
            loadgen: process_cpu(std::process::id()),
            busy,
            total,
        }
    }

    fn since(&self, start: &CpuSnap) -> Cpu {
        Cpu {
            service: self.service.saturating_sub(start.service),
            postgres: self.postgres.saturating_sub(start.postgres),
            mock: self.mock.saturating_sub(start.mock),
            loadgen: self.loadgen.saturating_sub(start.loadgen),
            machine_busy: (self.busy - start.busy) as f64
                / (self.total - start.total).max(1) as f64,
        }
    }
}

/// One measured mix.
struct MixReport {
    name: String,
    tally: Tally,
    /// Sub-tallies (the replay mix's replays and new sends).
    parts: Vec<(String, Tally)>,
    elapsed: Duration,
    cpu: Cpu,
    /// What the database and the service's metrics counted during the mix.
    counts: Option<Counts>,
}

impl MixReport {
    /// A mix reported by its main tally alone.
    fn plain(name: impl Into<String>, m: Measured) -> Self {
        Self {
            name: name.into(),
            tally: m.main,
            parts: Vec::new(),
            elapsed: m.elapsed,
            cpu: m.cpu,
            counts: None,
        }
    }
}

/// Database transactions and coalesced writes during a mix.
#[derive(Clone, Default)]
struct Counts {
    /// `pg_stat_database.xact_commit` of the run's database (read-only
    /// transactions included; the statistics reach the view within about a
    /// second, so a 10 s mix is counted to within some 10%).
    commits: i64,
    /// (statements, rows) of coalesced claims and final writes.
    claims: (u64, u64),
    finishes: (u64, u64),
    /// Claim statements per batch size bucket (`le` 1, 2, 4, ... 128, +Inf).
    claim_buckets: Vec<u64>,
}

/// Counts at one moment: the database's commits and the service's /metrics.
struct CountSnap {
    commits: i64,
    metrics: String,
}

impl CountSnap {
    async fn take(conn: &mut PgConnection, db: &str, target: &Target) -> Option<Self> {
        let commits: i64 =
            sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
                .bind(db)
                .fetch_one(conn)
                .await
                .ok()?;
        let metrics = target
            .client
            .get(format!("{}/metrics", target.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(Self { commits, metrics })
    }

    fn since(&self, start: &CountSnap) -> Counts {
        let value = |text: &str, series: &str| -> u64 {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(series)?
                        .strip_prefix(' ')?
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or(0.0) as u64
        };
        let delta = |series: &str| {
            value(&self.metrics, series).saturating_sub(value(&start.metrics, series))
        };
        let kind = |k: &str| {
            (
                delta(&format!("sendonce_store_batch_size_count{{kind=\"{k}\"}}")),
                delta(&format!("sendonce_store_batch_size_sum{{kind=\"{k}\"}}")),
            )
        };
        let mut cumulative: Vec<u64> = ["1", "2", "4", "8", "16", "32", "64", "128", "+Inf"]
            .iter()
            .map(|le| {
                delta(&format!(
                    "sendonce_store_batch_size_bucket{{kind=\"claim\",le=\"{le}\"}}"
                ))
            })
            .collect();
        for i in (1..cumulative.len()).rev() {
            cumulative[i] = cumulative[i].saturating_sub(cumulative[i - 1]);
        }
        Counts {
            commits: self.commits - start.commits,
            claims: kind("claim"),
            finishes: kind("finish"),
            claim_buckets: cumulative,
        }
    }
}

impl MixReport {
    fn rps(&self) -> f64 {
        self.tally.count() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn row(name: &str, t: &Tally, elapsed: Duration, cpu: Option<Cpu>) -> String {
    let n = t.count();
    let rps = n as f64 / elapsed.as_secs_f64().max(1e-9);
    let per = |d: Duration| format!("{:.0}", d.as_micros() as f64 / n.max(1) as f64);
    let cpu = match cpu {
        Some(c) => format!(
            "{} | {} | {} | {} | {:.0}%",
            per(c.service),
            per(c.postgres),
            per(c.mock),
            per(c.loadgen),
            c.machine_busy * 100.0
        ),
        None => " | | | | ".into(),
    };
    format!(
        "| {name} | {n} | {rps:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {cpu} |",
        ms(t.hist.value_at_quantile(0.50)),
        ms(t.hist.value_at_quantile(0.90)),
        ms(t.hist.value_at_quantile(0.99)),
        ms(t.hist.max()),
        t.errors(),
    )
}

// ---------------------------------------------------------------------------
// The service under test

struct Target {
    client: reqwest::Client,
    base: String,
    api_key: String,
    /// Distinguishes this run's keys.
    run: String,
    next: AtomicU64,
}

/// A completed send: what a replay must send and get back.
#[derive(Clone)]
struct Sent {
    key: String,
    body: Vec<u8>,
    response: Vec<u8>,
}

struct Answer {
    status: u16,
    replayed: bool,
    bytes: Vec<u8>,
}

impl Target {
    fn new_key(&self, kind: &str) -> (String, Vec<u8>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let key = format!("BENCH-{}-{kind}-{n:08}", self.run);
        let body = format!(
            r#"{{"to":"+1415555{:04}","body":"Your sendonce code is {:06}"}}"#,
            n % 10_000,
            n % 1_000_000
        );
        (key, body.into_bytes())
    }

    async fn post(&self, key: &str, body: &[u8]) -> Result<Answer, String> {
        let resp = self
            .client
            .post(format!("{}/messages", self.base))
            .header("authorization", format!("Bearer {}", self.api_key))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| format!("transport: {}", short_error(&e)))?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().contains_key("idempotent-replayed");
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("transport: {}", short_error(&e)))?;
        Ok(Answer {
            status,
            replayed,
            bytes: bytes.to_vec(),
        })
    }

    async fn get(&self, key: &str) -> Result<u16, String> {
        let resp = self
            .client
            .get(format!("{}/messages/{key}", self.base))
            .header("authorization", format!("Bearer {}", self.api_key))
            .send()
            .await
            .map_err(|e| format!("transport: {}", short_error(&e)))?;
        let status = resp.status().as_u16();
        resp.bytes()
            .await
            .map_err(|e| format!("transport: {}", short_error(&e)))?;
        Ok(status)
    }

    /// A new send; `Ok` only for a fresh 201 whose message was sent.
    async fn send_new(&self, tally: &mut Tally, sent: &mut Vec<Sent>) {
        let (key, body) = self.new_key("u");
        let started = Instant::now();
        let result = self.post(&key, &body).await;
        let elapsed = started.elapsed();
        let result = match result {
            Ok(a)
                if a.status == 201 && !a.replayed && contains(&a.bytes, br#""status":"sent""#) =>
            {
                sent.push(Sent {
                    key,
                    body,
                    response: a.bytes,
                });
                Ok(())
            }
            Ok(a) => Err(unexpected(&a, "a new 201 sent")),
            Err(e) => Err(e),
        };
        tally.record(elapsed, result);
    }

    /// A replay of `s`: a 201 marked replayed with the first answer's bytes.
    async fn replay(&self, s: &Sent, tally: &mut Tally) {
        let started = Instant::now();
        let result = self.post(&s.key, &s.body).await;
        let elapsed = started.elapsed();
        let result = match result {
            Ok(a) if a.status == 201 && a.replayed && a.bytes == s.response => Ok(()),
            Ok(a) if a.status == 201 && a.replayed => Err("replay: other bytes".to_string()),
            Ok(a) => Err(unexpected(&a, "a replay")),
            Err(e) => Err(e),
        };
        tally.record(elapsed, result);
    }
}

fn short_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else {
        let mut s = e.to_string();
        s.truncate(80);
        s
    }
}

fn unexpected(a: &Answer, wanted: &str) -> String {
    format!(
        "HTTP {}{} (wanted {wanted})",
        a.status,
        if a.replayed { " replayed" } else { "" }
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// When a mix stops: a deadline, and optionally a number of requests.
struct Limit {
    deadline: Instant,
    remaining: Option<AtomicU64>,
}

impl Limit {
    fn new(args: &Args) -> Arc<Self> {
        let secs = if args.requests.is_some() {
            600
        } else {
            args.duration_secs
        };
        Arc::new(Self {
            deadline: Instant::now() + Duration::from_secs(secs),
            remaining: args.requests.map(AtomicU64::new),
        })
    }

    /// Takes `n` requests from the budget; false when the mix is over.
    fn take(&self, n: u64) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        match &self.remaining {
            None => true,
            Some(r) => r
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(n)
                })
                .is_ok(),
        }
    }
}

/// Runs `workers` copies of `work` until the limit, merging what they return.
async fn run_workers<F, Fut>(workers: usize, work: F) -> (Vec<(Tally, Tally, Vec<Sent>)>, Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (Tally, Tally, Vec<Sent>)> + Send + 'static,
{
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..workers {
        set.spawn(work());
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            out.push(r);
        }
    }
    (out, started.elapsed())
}

struct Measured {
    main: Tally,
    second: Tally,
    sent: Vec<Sent>,
    elapsed: Duration,
    cpu: Cpu,
}

async fn measure<F, Fut>(pids: Pids, workers: usize, work: F) -> Measured
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (Tally, Tally, Vec<Sent>)> + Send + 'static,
{
    let cpu0 = CpuSnap::take(pids);
    let (outs, elapsed) = run_workers(workers, work).await;
    let cpu = CpuSnap::take(pids).since(&cpu0);
    let mut m = Measured {
        main: Tally::new(),
        second: Tally::new(),
        sent: Vec::new(),
        elapsed,
        cpu,
    };
    for (a, b, s) in outs {
        m.main.merge(&a);
        m.second.merge(&b);
        m.sent.extend(s);
    }
    m
}

async fn unique_mix(
    target: &Arc<Target>,
    limit: Arc<Limit>,
    workers: usize,
    pids: Pids,
) -> Measured {
    measure(pids, workers, || {
        let target = Arc::clone(target);
        let limit = Arc::clone(&limit);
        async move {
            let mut tally = Tally::new();
            let mut sent = Vec::new();
            while limit.take(1) {
                target.send_new(&mut tally, &mut sent).await;
            }
            (tally, Tally::new(), sent)
        }
    })
    .await
}

async fn replay_mix(
    target: &Arc<Target>,
    pool: &Arc<Vec<Sent>>,
    share: f64,
    limit: Arc<Limit>,
    workers: usize,
    pids: Pids,
) -> Measured {
    measure(pids, workers, || {
        let target = Arc::clone(target);
        let pool = Arc::clone(pool);
        let limit = Arc::clone(&limit);
        async move {
            let mut replays = Tally::new();
            let mut fresh = Tally::new();
            let mut sent = Vec::new();
            while limit.take(1) {
                let pick = {
                    let mut rng = rand::rng();
                    (rng.random_bool(share)).then(|| rng.random_range(0..pool.len()))
                };
                match pick {
                    Some(i) => target.replay(&pool[i], &mut replays).await,
                    None => target.send_new(&mut fresh, &mut sent).await,
                }
            }
            (replays, fresh, sent)
        }
    })
    .await
}

async fn get_mix(
    target: &Arc<Target>,
    pool: &Arc<Vec<Sent>>,
    limit: Arc<Limit>,
    workers: usize,
    pids: Pids,
) -> Measured {
    measure(pids, workers, || {
        let target = Arc::clone(target);
        let pool = Arc::clone(pool);
        let limit = Arc::clone(&limit);
        async move {
            let mut tally = Tally::new();
            while limit.take(1) {
                let i = rand::rng().random_range(0..pool.len());
                let started = Instant::now();
                let result = match target.get(&pool[i].key).await {
                    Ok(200) => Ok(()),
                    Ok(s) => Err(format!("HTTP {s} (wanted 200)")),
                    Err(e) => Err(e),
                };
                tally.record(started.elapsed(), result);
            }
            (tally, Tally::new(), Vec::new())
        }
    })
    .await
}

/// Bursts of `burst` concurrent identical requests per new key. The second
/// tally counts bursts: ok when exactly one request created and every other
/// replayed the same bytes.
async fn burst_mix(
    target: &Arc<Target>,
    burst: usize,
    limit: Arc<Limit>,
    bursts_at_once: usize,
    pids: Pids,
) -> Measured {
    measure(pids, bursts_at_once, || {
        let target = Arc::clone(target);
        let limit = Arc::clone(&limit);
        async move {
            let mut tally = Tally::new();
            let mut bursts = Tally::new();
            let mut sent = Vec::new();
            while limit.take(burst as u64) {
                let (key, body) = target.new_key("b");
                let body = Arc::new(body);
                let started = Instant::now();
                let mut set = JoinSet::new();
                for _ in 0..burst {
                    let target = Arc::clone(&target);
                    let key = key.clone();
                    let body = Arc::clone(&body);
                    set.spawn(async move {
                        let t = Instant::now();
                        let r = target.post(&key, &body).await;
                        (t.elapsed(), r)
                    });
                }
                let mut created = 0;
                let mut bodies: Vec<Vec<u8>> = Vec::new();
                let mut bad = None;
                while let Some(joined) = set.join_next().await {
                    let Ok((elapsed, r)) = joined else { continue };
                    let result = match r {
                        Ok(a) if a.status == 201 => {
                            if !a.replayed {
                                created += 1;
                            }
                            if !bodies.contains(&a.bytes) {
                                bodies.push(a.bytes);
                            }
                            Ok(())
                        }
                        Ok(a) => Err(unexpected(&a, "201")),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = &result {
                        bad = Some(e.clone());
                    }
                    tally.record(elapsed, result);
                }
                let verdict = match (created, bodies.len(), bad) {
                    (_, _, Some(e)) => Err(format!("burst with an error: {e}")),
                    (1, 1, None) => Ok(()),
                    (c, 1, None) => Err(format!("burst created {c} times")),
                    (_, n, None) => Err(format!("burst answered {n} different bodies")),
                };
                if verdict.is_ok() {
                    sent.push(Sent {
                        key,
                        body: body.to_vec(),
                        response: bodies.pop().unwrap_or_default(),
                    });
                }
                bursts.record(started.elapsed(), verdict);
            }
            (tally, bursts, sent)
        }
    })
    .await
}

// ---------------------------------------------------------------------------
// Processes and databases

/// `sendonce migrate` against `url`.
async fn migrate(bin_dir: &Path, url: &str) -> Result<(), String> {
    let mut cmd = Command::new(bin_dir.join("sendonce"));
    cmd.env("DATABASE_URL", url);
    procs::migrate(cmd).await
}

// ---------------------------------------------------------------------------
// The floor

struct Floor {
    /// What it runs, for the table.
    name: &'static str,
    /// CPU per transaction: Postgres, pgbench; and the machine's busy share.
    postgres_us: f64,
    pgbench_us: f64,
    machine_busy: f64,
    tps: f64,
    latency_ms: f64,
    transactions: u64,
    failed: u64,
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::from("\\x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The two floors: the naive one (the fixed reference) and sendonce's own
/// statements.
const FLOORS: [(&str, &str, &str); 2] = [
    (
        "naive floor: pgbench, INSERT then UPDATE, 2 commits per send",
        "floor_naive.sql",
        include_str!("../floor_naive.sql"),
    ),
    (
        "floor: pgbench, sendonce's 4 statements per send",
        "floor.sql",
        include_str!("../floor.sql"),
    ),
];

/// pgbench running one floor script on a fresh, migrated database at the
/// run's concurrency.
async fn floor(
    args: &Args,
    admin: &mut PgConnection,
    bin_dir: &Path,
    log_dir: &Path,
    response: &[u8],
    (name, file, text): (&'static str, &str, &str),
) -> Result<Floor, String> {
    let db = create_database(admin, &args.admin_url, "floor").await?;
    let result = async {
        migrate(bin_dir, &db.url).await?;
        let key = sendonce::apikey::generate();
        let store = PgStore::connect_lazy(
            &db.url,
            &PoolSettings {
                // Two: the bootstrap holds one listening for the instances'
                // acknowledgements while its transaction uses the other.
                max_connections: 2,
                acquire_timeout: Duration::from_secs(5),
            },
        )
        .map_err(|e| e.to_string())?;
        store
            .ensure_bootstrap_key(
                "default",
                &key.stored,
                sendonce::clock::Clock::system().now(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let tenant: uuid::Uuid = sqlx::query_scalar("SELECT id FROM tenants LIMIT 1")
            .fetch_one(store.pool())
            .await
            .map_err(|e| e.to_string())?;
        store.pool().close().await;
        let script = log_dir.join(file);
        std::fs::write(&script, text).map_err(|e| e.to_string())?;
        let secs = args.duration_secs.max(1);
        let (busy0, total0) = machine_cpu();
        let (pg0, children0) = (postgres_cpu(), stat_cpu(std::process::id(), true));
        let out = Command::new(&args.pgbench)
            .args(["-n", "-M", "prepared"])
            .args(["-c", &args.concurrency.to_string()])
            .args(["-j", &args.concurrency.min(2).to_string()])
            .args(["-T", &secs.to_string()])
            .arg("-f")
            .arg(&script)
            .arg("-D")
            .arg(format!("keyhash={}", hex(&key.stored.hash)))
            .arg("-D")
            .arg(format!("tenant_id={tenant}"))
            .arg("-D")
            .arg(format!("fingerprint={}", hex(&[0x5a; 32])))
            .args(["-D", "to=+14155550100"])
            .args(["-D", "body=Your sendonce code is 123456"])
            .args(["-D", "owner=floor/1/abcdef12"])
            .arg("-D")
            .arg(format!("response={}", hex(response)))
            .arg(&db.url)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("{}: {e}", args.pgbench.display()))?;
        let (busy1, total1) = machine_cpu();
        let pgbench = stat_cpu(std::process::id(), true).saturating_sub(children0);
        let postgres = postgres_cpu().saturating_sub(pg0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let _ = std::fs::write(log_dir.join(format!("{file}.out")), &*stdout);
        let _ = std::fs::write(log_dir.join(format!("{file}.err")), &out.stderr);
        if !out.status.success() {
            return Err(format!(
                "pgbench {file} failed ({}); see {}",
                out.status,
                log_dir.join(format!("{file}.err")).display()
            ));
        }
        let field = |prefix: &str| -> Option<f64> {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|rest| rest.trim().split(' ').next())
                .and_then(|v| v.parse().ok())
        };
        let transactions =
            field("number of transactions actually processed: ").unwrap_or(0.0) as u64;
        let per = |d: Duration| d.as_micros() as f64 / transactions.max(1) as f64;
        Ok(Floor {
            name,
            postgres_us: per(postgres),
            pgbench_us: per(pgbench),
            machine_busy: (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64,
            tps: field("tps = ").ok_or("pgbench printed no tps")?,
            latency_ms: field("latency average = ").unwrap_or(0.0),
            transactions,
            failed: field("number of failed transactions: ").unwrap_or(0.0) as u64,
        })
    }
    .await;
    drop_database(admin, &db).await;
    result
}

// ---------------------------------------------------------------------------
// The run

async fn run(args: Args) -> Result<bool, String> {
    sendonce::install_crypto_provider();
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), " (scripts/bench.sh does)")?;
    let log_dir = procs::log_dir("bench")?;
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .map_err(|e| format!("connect to {}: {e}", args.admin_url))?;
    let db = create_database(&mut admin, &args.admin_url, "bench").await?;
    let outcome = run_on(&args, &bin_dir, &log_dir, &db, &mut admin).await;
    drop_database(&mut admin, &db).await;
    outcome
}

/// The processes under test and the client aimed at them.
struct Services {
    service: Child,
    mock: Child,
    mock_port: u16,
    pids: Pids,
    target: Arc<Target>,
}

/// What the service and the mock say after the mixes.
struct Check {
    processing: i64,
    messages: i64,
    duplicates: u64,
    delivered: i64,
    metric_created: i64,
    peak_rss_kb: Option<u64>,
}

async fn run_on(
    args: &Args,
    bin_dir: &Path,
    log_dir: &Path,
    db: &Database,
    admin: &mut PgConnection,
) -> Result<bool, String> {
    let mut services = start_services(args, bin_dir, log_dir, db, "http").await?;
    let target = Arc::clone(&services.target);
    let c = args.concurrency.max(1);
    print_header(args, c, log_dir);

    // Warm-up: its keys are the first replay/GET pool.
    let mut problems: Vec<String> = Vec::new();
    let warm = warm_up(&target, args, c, services.pids).await;
    let mut created = warm.main.ok;
    if warm.main.errors() > 0 {
        problems.push(format!("warm-up errors: {:?}", warm.main.errors));
    }
    let mut pool = warm.sent;

    let mut reports: Vec<MixReport> = Vec::new();
    for mix in &args.mixes {
        let before = CountSnap::take(admin, &db.name, &target).await;
        let (mut report, new) = run_mix(*mix, &target, args, &mut pool, c, services.pids).await;
        let after = CountSnap::take(admin, &db.name, &target).await;
        report.counts = before.zip(after).map(|(b, a)| a.since(&b));
        created += new;
        reports.push(report);
    }
    if args.high_concurrency > 0 && !args.smoke {
        let hc = args.high_concurrency;
        let limit = Arc::new(Limit {
            deadline: Instant::now() + Duration::from_secs(args.duration_secs.clamp(1, 5)),
            remaining: None,
        });
        let before = CountSnap::take(admin, &db.name, &target).await;
        let m = unique_mix(&target, limit, hc, services.pids).await;
        let after = CountSnap::take(admin, &db.name, &target).await;
        created += m.main.ok;
        pool.extend(m.sent);
        reports.push(MixReport {
            name: format!("unique sends at concurrency {hc}"),
            tally: m.main,
            parts: Vec::new(),
            elapsed: m.elapsed,
            cpu: m.cpu,
            counts: before.zip(after).map(|(b, a)| a.since(&b)),
        });
    }

    let check = check(&mut services, db).await?;
    problems.extend(check_problems(&check, created, &reports));
    if !args.no_simulated {
        match simulated_run(args, bin_dir, log_dir, admin).await {
            Ok(r) => reports.push(r),
            Err(e) => problems.push(format!("simulated provider run: {e}")),
        }
    }
    if let Some(python) = &args.peer_python {
        match peer_run(args, python, log_dir).await {
            Ok(r) => reports.push(r),
            Err(e) => problems.push(format!("peer run: {e}")),
        }
    }
    for r in reports.iter().skip(args.mixes.len()) {
        if r.tally.errors() > 0 {
            problems.push(format!("{}: {:?}", r.name, r.tally.errors));
        }
    }
    let floors = run_floor(args, admin, bin_dir, log_dir, &pool, &mut problems).await;
    print_table(&reports, &floors, &check);
    let peak_mb = check.peak_rss_kb.map(|kb| kb as f64 / 1024.0);
    if !args.smoke {
        let sqlite = match &args.sqlite_report {
            Some(path) => match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(v) => Some(v),
                Err(e) => {
                    problems.push(format!("SQLite report {}: {e}", path.display()));
                    None
                }
            },
            None => None,
        };
        print_opening(&reports, &floors, peak_mb, c, sqlite.as_ref());
        print_targets(&reports, &floors, peak_mb, c);
    }
    let ok = problems.is_empty();
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    println!("bench: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

/// The name of the unique mix on the `simulated` provider.
const SIMULATED: &str = "unique sends, simulated provider";
/// The name of the peer's unique mix.
const PEER: &str = "peer: FastAPI + Redis SET NX, uvicorn 2 workers (unique)";

/// A unique mix on a second instance, on a database of its own, with the
/// `simulated` provider (no HTTP call per send): the mock's cost is out of
/// the comparison.
async fn simulated_run(
    args: &Args,
    bin_dir: &Path,
    log_dir: &Path,
    admin: &mut PgConnection,
) -> Result<MixReport, String> {
    let db = create_database(admin, &args.admin_url, "benchsim").await?;
    let result = async {
        migrate(bin_dir, &db.url).await?;
        let mut services = start_services(args, bin_dir, log_dir, &db, "simulated").await?;
        let target = Arc::clone(&services.target);
        let c = args.concurrency.max(1);
        let warm = warm_up(&target, args, c, services.pids).await;
        let before = CountSnap::take(admin, &db.name, &target).await;
        let m = unique_mix(&target, Limit::new(args), c, services.pids).await;
        let after = CountSnap::take(admin, &db.name, &target).await;
        let mut conn = PgConnection::connect(&db.url)
            .await
            .map_err(|e| e.to_string())?;
        let processing = count_processing(&mut conn).await;
        procs::kill(&mut services.service).await;
        procs::kill(&mut services.mock).await;
        if warm.main.errors() > 0 || processing != 0 {
            return Err(format!(
                "warm-up errors {:?}, {processing} left processing",
                warm.main.errors
            ));
        }
        Ok(MixReport {
            name: SIMULATED.into(),
            tally: m.main,
            parts: Vec::new(),
            elapsed: m.elapsed,
            cpu: m.cpu,
            counts: before.zip(after).map(|(b, a)| a.since(&b)),
        })
    }
    .await;
    drop_database(admin, &db).await;
    result
}

/// The FastAPI + Redis `SET NX` peer (bench/peer/app.py) under uvicorn with
/// 2 workers, Redis with persistence off: the unique mix against it. Its CPU
/// is reported in the service column (uvicorn and its workers) and the mock
/// column (Redis).
async fn peer_run(args: &Args, python: &Path, log_dir: &Path) -> Result<MixReport, String> {
    let redis_port = free_port().map_err(|e| e.to_string())?;
    let mut redis = Command::new(&args.redis_server)
        .args(["--bind", "127.0.0.1", "--port", &redis_port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start {}: {e}", args.redis_server.display()))?;
    let port = free_port().map_err(|e| e.to_string())?;
    let api_key = uuid::Uuid::new_v4().simple().to_string();
    let log = std::fs::File::create(log_dir.join("peer.log")).map_err(|e| e.to_string())?;
    let mut peer = Command::new(python)
        .args(["-m", "uvicorn", "app:app", "--app-dir"])
        .arg(&args.peer_dir)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--workers",
            "2",
            "--log-level",
            "warning",
            "--no-access-log",
        ])
        .env("PEER_REDIS_PORT", redis_port.to_string())
        .env("PEER_API_KEY", &api_key)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start the peer with {}: {e}", python.display()))?;
    let result = async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(args.concurrency + 8)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| e.to_string())?;
        let base = format!("http://127.0.0.1:{port}");
        procs::wait_ready(&client, &base, "/readyz", Some(&mut peer))
            .await
            .map_err(|e| format!("{e}; logs in {}", log_dir.display()))?;
        let target = Arc::new(Target {
            client,
            base,
            api_key,
            run: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            next: AtomicU64::new(0),
        });
        let pids = Pids {
            service: peer.id().ok_or("the peer has no pid")?,
            mock: redis.id().unwrap_or(0),
        };
        let c = args.concurrency.max(1);
        let warm = warm_up(&target, args, c, pids).await;
        if warm.main.errors() > 0 {
            return Err(format!("warm-up errors {:?}", warm.main.errors));
        }
        let m = unique_mix(&target, Limit::new(args), c, pids).await;
        Ok(MixReport {
            name: PEER.into(),
            tally: m.main,
            parts: Vec::new(),
            elapsed: m.elapsed,
            cpu: m.cpu,
            counts: None,
        })
    }
    .await;
    // uvicorn's supervisor stops its workers on SIGTERM (a SIGKILL would
    // leave them running).
    procs::terminate(&mut peer, Duration::from_secs(10)).await;
    procs::kill(&mut redis).await;
    result
}

/// The mock provider (answering at once; its logs would only cost CPU) and
/// one sendonce instance on it (with `provider`), ready.
async fn start_services(
    args: &Args,
    bin_dir: &Path,
    log_dir: &Path,
    db: &Database,
    provider: &str,
) -> Result<Services, String> {
    let mock_port = free_port().map_err(|e| e.to_string())?;
    let mock = procs::spawn_mock(bin_dir, mock_port, &[])?;

    let api_key = sendonce::apikey::generate().secret;
    let port = free_port().map_err(|e| e.to_string())?;
    let log = std::fs::File::create(log_dir.join(format!("sendonce-{provider}.log")))
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin_dir.join("sendonce"));
    cmd.env("DATABASE_URL", &db.url)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_PROVIDER", provider)
        .env(
            "SENDONCE_HTTP_PROVIDER_URL",
            format!("http://127.0.0.1:{mock_port}/messages"),
        )
        .env("SENDONCE_BOOTSTRAP_API_KEY", &api_key)
        // The benchmark is one tenant sending to one number range as fast as
        // it can: exactly what the abuse limits exist to stop.
        .env("SENDONCE_RATE_TENANT_RPS", "0")
        .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
        .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0");
    for kv in &args.service_env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--service-env {kv}: want NAME=VALUE"))?;
        cmd.env(k, v);
    }
    let mut service = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start sendonce: {e}"))?;
    let pids = Pids {
        service: service.id().ok_or("sendonce has no pid")?,
        mock: mock.id().unwrap_or(0),
    };

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(args.concurrency.max(args.burst) + 8)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let base = format!("http://127.0.0.1:{port}");
    procs::wait_ready(&client, &base, "/readyz", Some(&mut service))
        .await
        .map_err(|e| format!("sendonce: {e}; logs in {}", log_dir.display()))?;
    let target = Arc::new(Target {
        client,
        base,
        api_key,
        run: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        next: AtomicU64::new(0),
    });
    Ok(Services {
        service,
        mock,
        mock_port,
        pids,
        target,
    })
}

fn print_header(args: &Args, c: usize, log_dir: &Path) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "sendonce bench{}: concurrency {c}, {} per mix, {} cores, load average before: {}, logs in {}",
        if args.smoke { " (smoke)" } else { "" },
        match args.requests {
            Some(n) => format!("{n} requests"),
            None => format!("{} s", args.duration_secs),
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split(' ').take(3).collect::<Vec<_>>().join(" "),
        log_dir.display()
    );
}

/// Unique sends before measuring; with no warm-up time, 200 sends still
/// seed the replay/GET pool.
async fn warm_up(target: &Arc<Target>, args: &Args, c: usize, pids: Pids) -> Measured {
    let limit = Arc::new(if args.warmup_secs == 0 {
        Limit {
            deadline: Instant::now() + Duration::from_secs(60),
            remaining: Some(AtomicU64::new(200)),
        }
    } else {
        Limit {
            deadline: Instant::now() + Duration::from_secs(args.warmup_secs),
            remaining: None,
        }
    });
    unique_mix(target, limit, c, pids).await
}

/// One measured mix; its new keys join `pool`. Returns the report and the
/// number of sends it created.
async fn run_mix(
    mix: Mix,
    target: &Arc<Target>,
    args: &Args,
    pool: &mut Vec<Sent>,
    c: usize,
    pids: Pids,
) -> (MixReport, u64) {
    let limit = Limit::new(args);
    match mix {
        Mix::Unique => {
            let mut m = unique_mix(target, limit, c, pids).await;
            pool.extend(std::mem::take(&mut m.sent));
            let created = m.main.ok;
            let report = MixReport::plain("unique sends", m);
            (report, created)
        }
        Mix::Replays => {
            let recent = pool[pool.len().saturating_sub(REPLAY_KEYS)..].to_vec();
            let m = replay_mix(target, &Arc::new(recent), 1.0, limit, c, pids).await;
            let report = MixReport::plain(REPLAYS, m);
            (report, 0)
        }
        Mix::Replay => {
            let shared = Arc::new(std::mem::take(pool));
            let m = replay_mix(target, &shared, args.replay_share, limit, c, pids).await;
            *pool = Arc::into_inner(shared).unwrap_or_default();
            pool.extend(m.sent);
            let created = m.second.ok;
            let mut all = Tally::new();
            all.merge(&m.main);
            all.merge(&m.second);
            let report = MixReport {
                name: format!("{:.0}% replays", args.replay_share * 100.0),
                tally: all,
                parts: vec![
                    ("of which replays".into(), m.main),
                    ("of which new sends".into(), m.second),
                ],
                elapsed: m.elapsed,
                cpu: m.cpu,
                counts: None,
            };
            (report, created)
        }
        Mix::Burst => {
            let at_once = (c / args.burst.max(1)).max(1);
            let m = burst_mix(target, args.burst.max(1), limit, at_once, pids).await;
            pool.extend(m.sent);
            let created = m.second.ok;
            let report = MixReport {
                name: format!("bursts of {} duplicates", args.burst),
                tally: m.main,
                parts: vec![("bursts (one send each)".into(), m.second)],
                elapsed: m.elapsed,
                cpu: m.cpu,
                counts: None,
            };
            (report, created)
        }
        Mix::Get => {
            let shared = Arc::new(std::mem::take(pool));
            let m = get_mix(target, &shared, limit, c, pids).await;
            *pool = Arc::into_inner(shared).unwrap_or_default();
            let report = MixReport::plain("GET by key", m);
            (report, 0)
        }
    }
}

/// After the mixes: waits (up to 15 s) for nothing to be processing, reads
/// the counts of the database, the mock and the service's /metrics, then
/// stops the service and the mock.
async fn check(services: &mut Services, db: &Database) -> Result<Check, String> {
    let peak_rss_kb = status_kb(services.pids.service, "VmHWM:");
    let mut conn = PgConnection::connect(&db.url)
        .await
        .map_err(|e| e.to_string())?;
    let settle = Instant::now() + Duration::from_secs(15);
    let (processing, messages) = loop {
        let processing = count_processing(&mut conn).await;
        if processing < 0 {
            return Err("counting processing messages failed".into());
        }
        if processing == 0 || Instant::now() > settle {
            let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            break (processing, messages);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(conn);
    let target = &services.target;
    let stats = mock_stats(&target.client, services.mock_port).await?;
    let metrics = target
        .client
        .get(format!("{}/metrics", target.base))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    // Stopped gracefully: under scripts/profile.sh it is callgrind that
    // must write its counts on the way out.
    procs::terminate(&mut services.service, Duration::from_secs(120)).await;
    procs::kill(&mut services.mock).await;
    Ok(Check {
        processing,
        messages,
        duplicates: stats["duplicate_keys"].as_u64().unwrap_or(u64::MAX),
        delivered: stats["keys_delivered"].as_i64().unwrap_or(-1),
        metric_created: created_in_metrics(&metrics),
        peak_rss_kb,
    })
}

/// The service's own count of created sends, from its /metrics text.
fn created_in_metrics(metrics: &str) -> i64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("sendonce_http_requests_total{")
                && l.contains(r#"route="/messages""#)
                && l.contains(r#"outcome="created""#)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(-1.0) as i64
}

/// Correctness: nothing left processing, one delivery per message, the
/// service's own count of created sends equal to ours, no errors.
fn check_problems(check: &Check, created: u64, reports: &[MixReport]) -> Vec<String> {
    let mut problems = Vec::new();
    if check.processing != 0 {
        problems.push(format!("{} messages still processing", check.processing));
    }
    if check.duplicates != 0 {
        problems.push(format!(
            "{} keys delivered more than once",
            check.duplicates
        ));
    }
    if check.delivered != check.messages {
        problems.push(format!(
            "{} messages stored but {} keys delivered",
            check.messages, check.delivered
        ));
    }
    if check.metric_created != i64::try_from(created).unwrap_or(-1) {
        problems.push(format!(
            "/metrics counts {} created sends, the load generator {created}",
            check.metric_created
        ));
    }
    for r in reports {
        for (what, t) in
            std::iter::once((&r.name, &r.tally)).chain(r.parts.iter().map(|(n, t)| (n, t)))
        {
            if t.errors() > 0 {
                problems.push(format!("{} / {what}: {:?}", r.name, t.errors));
            }
        }
    }
    problems
}

/// The floor, with a real final response as the stored body (unless
/// skipped or pgbench is missing).
async fn run_floor(
    args: &Args,
    admin: &mut PgConnection,
    bin_dir: &Path,
    log_dir: &Path,
    pool: &[Sent],
    problems: &mut Vec<String>,
) -> Vec<Floor> {
    if args.no_floor {
        return Vec::new();
    }
    if std::process::Command::new(&args.pgbench)
        .arg("--version")
        .output()
        .is_err()
    {
        println!("floor: skipped ({} not found)", args.pgbench.display());
        return Vec::new();
    }
    let response = pool.first().map(|s| s.response.clone()).unwrap_or_default();
    let mut floors = Vec::new();
    for script in FLOORS {
        match floor(args, admin, bin_dir, log_dir, &response, script).await {
            Ok(f) => {
                if f.failed > 0 {
                    problems.push(format!("{}: {} failed transactions", f.name, f.failed));
                }
                floors.push(f);
            }
            Err(e) => problems.push(format!("floor: {e}")),
        }
    }
    floors
}

fn print_table(reports: &[MixReport], floors: &[Floor], check: &Check) {
    println!();
    println!(
        "| mix | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | errors | CPU µs/req: service | postgres | mock | loadgen | machine busy |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in reports {
        println!("{}", row(&r.name, &r.tally, r.elapsed, Some(r.cpu)));
        for (name, t) in &r.parts {
            println!("{}", row(&format!("  {name}"), t, r.elapsed, None));
        }
    }
    for f in floors {
        println!(
            "| {} | {} | {:.0} | avg {:.2} | | | | {} | | {:.0} | | {:.0} (pgbench) | {:.0}% |",
            f.name,
            f.transactions,
            f.tps,
            f.latency_ms,
            f.failed,
            f.postgres_us,
            f.pgbench_us,
            f.machine_busy * 100.0
        );
    }
    println!();
    println!(
        "| mix | transactions (xact_commit) per request | coalesced statements (claim + final) per request | rows per claim statement | rows per final-write statement | claim statements by rows: 1 / 2 / ≤4 / ≤8 / ≤16 / ≤32 / ≤64 / ≤128 / more |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    for r in reports {
        let Some(c) = &r.counts else { continue };
        let n = r.tally.count().max(1) as f64;
        let rows = |(stmts, rows): (u64, u64)| rows as f64 / stmts.max(1) as f64;
        let buckets: Vec<String> = c.claim_buckets.iter().map(u64::to_string).collect();
        println!(
            "| {} | {:.2} | {:.2} | {:.1} | {:.1} | {} |",
            r.name,
            c.commits as f64 / n,
            (c.claims.0 + c.finishes.0) as f64 / n,
            rows(c.claims),
            rows(c.finishes),
            buckets.join(" / ")
        );
    }
    println!();
    println!(
        "messages stored: {}; delivered by the mock: {}; delivered twice: {}; still processing: {}",
        check.messages, check.delivered, check.duplicates, check.processing
    );
    let peak_mb = check.peak_rss_kb.map(|kb| kb as f64 / 1024.0);
    println!(
        "service peak RSS (VmHWM): {}",
        peak_mb.map_or("unknown".into(), |mb| format!("{mb:.1} MB"))
    );
}

/// Keys the `replays` mix replays: the most recent completed ones.
const REPLAY_KEYS: usize = 1000;
/// The `replays` mix's name in the report.
const REPLAYS: &str = "replays of 1,000 keys";

/// The table BENCHMARKS.md opens with (issue 44's figures and targets), with
/// the CPU each party spent per send: sendonce over the mock provider against
/// the naive Postgres floor, the FastAPI + Redis peer, and (from
/// `sqlite_bench --report`) sendonce on SQLite against its own naive floor.
fn print_opening(
    reports: &[MixReport],
    floors: &[Floor],
    peak_mb: Option<f64>,
    c: usize,
    sqlite: Option<&serde_json::Value>,
) {
    let unique = reports.iter().find(|r| r.name == "unique sends");
    let peer = reports.iter().find(|r| r.name == PEER);
    let replay = reports.iter().find(|r| r.name == REPLAYS);
    let high = reports
        .iter()
        .find(|r| r.name.starts_with("unique sends at concurrency"));
    let naive = floors.first();
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let per = |d: Duration, r: &MixReport| d.as_micros() as f64 / r.tally.count().max(1) as f64;
    let sendonce_cpu = |r: &MixReport| {
        format!(
            "sendonce {:.0} + Postgres {:.0} + mock {:.0} + load generator {:.0} = {:.0} µs",
            per(r.cpu.service, r),
            per(r.cpu.postgres, r),
            per(r.cpu.mock, r),
            per(r.cpu.loadgen, r),
            per(
                r.cpu.service + r.cpu.postgres + r.cpu.mock + r.cpu.loadgen,
                r
            ),
        )
    };
    println!();
    println!("| figure | measured | target | | CPU per send |");
    println!("|---|---|---|---|---|");
    if let (Some(u), Some(f)) = (unique, naive) {
        let ratio = u.rps() / f.tps;
        println!(
            "| unique sends / naive Postgres floor (2 statements, 2 commits per message) | {:.0} / {:.0} = **{ratio:.2}×** | ≥ 1.0× | {} | {}; floor: Postgres {:.0} + pgbench {:.0} = {:.0} µs |",
            u.rps(),
            f.tps,
            verdict(ratio >= 1.0),
            sendonce_cpu(u),
            f.postgres_us,
            f.pgbench_us,
            f.postgres_us + f.pgbench_us
        );
    }
    if let (Some(u), Some(p)) = (unique, peer) {
        let ratio = u.rps() / p.rps();
        println!(
            "| unique sends / FastAPI + Redis SET NX peer (uvicorn, 2 workers) | {:.0} / {:.0} = **{ratio:.2}×** | ≥ 2× | {} | peer: uvicorn {:.0} + Redis {:.0} + load generator {:.0} = {:.0} µs |",
            u.rps(),
            p.rps(),
            verdict(ratio >= 2.0),
            per(p.cpu.service, p),
            per(p.cpu.mock, p),
            per(p.cpu.loadgen, p),
            per(p.cpu.service + p.cpu.mock + p.cpu.loadgen, p)
        );
    }
    if let Some(u) = unique {
        let p99 = ms(u.tally.hist.value_at_quantile(0.99));
        println!(
            "| p99 of a unique send at c={c} | **{p99:.2} ms** | < 10 ms | {} | |",
            verdict(p99 < 10.0)
        );
    }
    if let (Some(u), Some(r)) = (unique, replay) {
        let ratio = r.rps() / u.rps();
        println!(
            "| replays of 1,000 keys / unique | {:.0} / {:.0} = **{ratio:.1}×** | ≥ 10× | {} | replay: sendonce {:.0} + Postgres {:.0} + load generator {:.0} µs |",
            r.rps(),
            u.rps(),
            verdict(ratio >= 10.0),
            per(r.cpu.service, r),
            per(r.cpu.postgres, r),
            per(r.cpu.loadgen, r)
        );
    }
    if let (Some(h), Some(f)) = (high, naive) {
        let ratio = h.rps() / f.tps;
        let errors = h.tally.errors();
        println!(
            "| {} | {:.0}/s, {errors} errors = **{ratio:.2}×** the floor | ≥ 1.5× the floor, 0 errors | {} | {} |",
            h.name,
            h.rps(),
            verdict(ratio >= 1.5 && errors == 0),
            sendonce_cpu(h)
        );
    }
    if let Some(s) = sqlite {
        let f = |k: &str| s.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let ratio = f("unique_per_second") / f("floor_per_second").max(1.0);
        println!(
            "| SQLite unique / its naive floor (WAL, synchronous=FULL, 2 transactions per message) | {:.0} / {:.0} = **{ratio:.2}×** (p99 {:.1} ms, {:.1} jobs per group commit, {:.2} commits per send) | ≥ 1.0× | {} | sendonce {:.0} + mock {:.0} + load generator {:.0} µs; floor: {:.0} µs (one process) |",
            f("unique_per_second"),
            f("floor_per_second"),
            f("unique_p99_ms"),
            f("jobs_per_commit"),
            f("commits_per_send"),
            verdict(ratio >= 1.0),
            f("service_cpu_us"),
            f("mock_cpu_us"),
            f("driver_cpu_us"),
            f("floor_cpu_us")
        );
    }
    if let Some(mb) = peak_mb {
        println!(
            "| peak RSS | **{mb:.1} MB** | < 64 MB | {} | |",
            verdict(mb < 64.0)
        );
    }
    println!();
}

/// The measured ratios and latencies next to the targets.
fn print_targets(reports: &[MixReport], floors: &[Floor], peak_mb: Option<f64>, c: usize) {
    let unique = reports.iter().find(|r| r.name == "unique sends");
    let simulated = reports.iter().find(|r| r.name == SIMULATED);
    let peer = reports.iter().find(|r| r.name == PEER);
    let replay = reports.iter().find(|r| r.name == REPLAYS);
    let replay_mix = reports.iter().find(|r| r.name.ends_with("% replays"));
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    if let Some(naive) = floors.first() {
        for u in [unique, simulated].into_iter().flatten() {
            let ratio = u.rps() / naive.tps;
            println!(
                "{} / naive floor: {:.0} / {:.0} = {ratio:.2} (target >= 1.0: {}; milestone 0.6: {})",
                u.name,
                u.rps(),
                naive.tps,
                verdict(ratio >= 1.0),
                verdict(ratio >= 0.6)
            );
        }
    }
    if let (Some(p), Some(u)) = (peer, simulated.or(unique)) {
        let ratio = u.rps() / p.rps();
        println!(
            "{} / FastAPI + Redis peer: {:.0} / {:.0} = {ratio:.2} (target >= 2: {})",
            u.name,
            u.rps(),
            p.rps(),
            verdict(ratio >= 2.0)
        );
    }
    if let (Some(u), Some(f)) = (unique, floors.get(1)) {
        println!(
            "unique sends / same-statements floor: {:.0} / {:.0} = {:.2}",
            u.rps(),
            f.tps,
            u.rps() / f.tps
        );
    }
    // The same comparisons in CPU: robust to other load on the machine. On
    // a saturated machine, floor CPU / send CPU is the most the ratio can be.
    if let Some(u) = unique {
        let n = u.tally.count().max(1) as f64;
        let c = &u.cpu;
        let send = (c.service + c.postgres + c.mock + c.loadgen).as_micros() as f64 / n;
        println!(
            "CPU per unique send: {send:.0} µs (service {:.0}, postgres {:.0}, mock {:.0}, loadgen {:.0})",
            c.service.as_micros() as f64 / n,
            c.postgres.as_micros() as f64 / n,
            c.mock.as_micros() as f64 / n,
            c.loadgen.as_micros() as f64 / n,
        );
        for f in floors.iter().take(2) {
            let txn = f.postgres_us + f.pgbench_us;
            println!(
                "  per message of the {}: {txn:.0} µs (postgres {:.0}, pgbench {:.0}); CPU ceiling of the ratio {:.2}",
                f.name,
                f.postgres_us,
                f.pgbench_us,
                txn / send.max(1.0)
            );
        }
    }
    if let (Some(u), Some(r)) = (unique, replay) {
        let ratio = r.rps() / u.rps();
        println!(
            "replays of 1,000 keys / unique sends: {:.0} / {:.0} = {ratio:.2} (target >= 5: {})",
            r.rps(),
            u.rps(),
            verdict(ratio >= 5.0)
        );
    }
    if let (Some(u), Some(r)) = (unique, replay_mix) {
        println!(
            "{} / unique sends: {:.0} / {:.0} = {:.2}",
            r.name,
            r.rps(),
            u.rps(),
            r.rps() / u.rps()
        );
    }
    for u in [unique, simulated].into_iter().flatten() {
        let p99 = ms(u.tally.hist.value_at_quantile(0.99));
        println!(
            "{} p99: {p99:.2} ms at concurrency {c} (target < 25 ms: {})",
            u.name,
            verdict(p99 < 25.0)
        );
    }
    if let Some(mb) = peak_mb {
        println!(
            "peak RSS: {mb:.1} MB (target < 100 MB: {})",
            verdict(mb < 100.0)
        );
    }
}
