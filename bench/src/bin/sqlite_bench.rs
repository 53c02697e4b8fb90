//! The SQLite benchmark (issue 19): sendonce on its default SQLite store next
//! to the naive SQLite floor, in one run.
//!
//! - **Floor**: one process, one connection, WAL, `synchronous=FULL`; per
//!   message one transaction inserting its row and one updating it (two
//!   commits, two fsyncs), for `--seconds`; then the same with
//!   `--batch` messages per transaction.
//! - **sendonce**: the release binary on a fresh SQLite file with the mock
//!   provider answering at once, rate limits off, everything else default;
//!   `unique` (every request a new key, waiting for the final answer) and
//!   `replay` (1,000 completed keys replayed; each must be a 201 with
//!   `Idempotent-Replayed: true`) at `--concurrency`, for `--seconds` each
//!   after a 2 s warm-up.
//!
//! Prints a Markdown table. Any error or a replay that was not one makes it
//! exit 1.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::stats::process_cpu;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::process::Command;
use tokio::sync::Mutex;

#[derive(Parser, Debug)]
#[command(about = "sendonce on SQLite against the naive SQLite floor")]
struct Args {
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Messages per transaction in the batched floor.
    #[arg(long, default_value_t = 16)]
    batch: u64,
    /// Where `sendonce` and `mock-provider` are (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Extra `NAME=VALUE` settings for sendonce.
    #[arg(long = "service-env")]
    service_env: Vec<String>,
    /// Also write the figures `loadgen --sqlite-report` puts in the
    /// benchmark's opening table here, as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// sendonce runs under callgrind (scripts/profile.sh --sqlite): skip the
    /// floors, zero its counts before the unique sends and dump them after
    /// (`callgrind_control`), so the dump holds those sends alone.
    #[arg(long)]
    callgrind: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    sendonce::install_crypto_provider();
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sqlite_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let dir = procs::log_dir("sqlite-bench")?;
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), "cargo build --release")?;
    let seconds = Duration::from_secs(args.seconds);
    println!(
        "SQLite benchmark: concurrency {}, {} s per measurement, files and logs in {}",
        args.concurrency,
        args.seconds,
        dir.display()
    );
    if args.callgrind {
        let (unique, _) = service(args, &bin_dir, &dir, seconds).await?;
        println!("unique sends under callgrind: {}", unique.requests);
        return Ok(());
    }
    let floor1 = floor(&dir.join("floor-1.db"), 1, seconds, 1000).await?;
    let floor_n = floor(&dir.join("floor-n.db"), args.batch, seconds, 1000).await?;
    // The same pattern with automatic checkpoints off: what they cost.
    let floor_nockpt = floor(&dir.join("floor-0.db"), 1, seconds, 0).await?;

    let (unique, replay) = service(args, &bin_dir, &dir, seconds).await?;
    println!();
    println!("| what | requests | per second | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| naive SQLite floor, 1 message per transaction pair | {} | {:.0} | | | |",
        floor1.messages, floor1.per_second
    );
    println!(
        "| the same, `wal_autocheckpoint=0` (no checkpoints) | {} | {:.0} | | | |",
        floor_nockpt.messages, floor_nockpt.per_second
    );
    println!(
        "| naive SQLite floor, {} messages per transaction | {} | {:.0} | | | |",
        args.batch, floor_n.messages, floor_n.per_second
    );
    for (name, r) in [
        ("sendonce unique sends", &unique),
        ("sendonce replays of 1,000 keys", &replay),
    ] {
        println!(
            "| {name}, c={} | {} | {:.0} | {:.1} | {:.1} | {:.1} |",
            args.concurrency,
            r.requests,
            r.per_second,
            r.hist.value_at_quantile(0.5) as f64 / 1000.0,
            r.hist.value_at_quantile(0.99) as f64 / 1000.0,
            r.hist.max() as f64 / 1000.0
        );
    }
    println!();
    let per_send = |d: Duration| d.as_micros() as f64 / unique.requests.max(1) as f64;
    println!(
        "unique / floor: {:.2}; replay / unique: {:.2}; unique p99 {:.1} ms",
        unique.per_second / floor1.per_second,
        replay.per_second / unique.per_second,
        unique.hist.value_at_quantile(0.99) as f64 / 1000.0
    );
    println!(
        "CPU per unique send: service {:.0} µs, mock {:.0}, load generator {:.0}; \
         per floor message {:.0} µs (one process)",
        per_send(unique.cpu.service),
        per_send(unique.cpu.mock),
        per_send(unique.cpu.driver),
        floor1.cpu.as_micros() as f64 / floor1.messages.max(1) as f64
    );
    let g = unique.groups;
    println!(
        "group commits during the unique sends: {} for {} jobs ({:.1} jobs per commit, \
         {:.2} commits per send)",
        g.commits,
        g.jobs,
        g.jobs as f64 / g.commits.max(1) as f64,
        g.commits as f64 / unique.requests.max(1) as f64
    );
    if let Some(path) = &args.report {
        let report = serde_json::json!({
            "floor_per_second": floor1.per_second,
            "floor_cpu_us": floor1.cpu.as_micros() as f64 / floor1.messages.max(1) as f64,
            "unique_per_second": unique.per_second,
            "unique_p99_ms": unique.hist.value_at_quantile(0.99) as f64 / 1000.0,
            "service_cpu_us": per_send(unique.cpu.service),
            "mock_cpu_us": per_send(unique.cpu.mock),
            "driver_cpu_us": per_send(unique.cpu.driver),
            "replay_per_second": replay.per_second,
            "jobs_per_commit": g.jobs as f64 / g.commits.max(1) as f64,
            "commits_per_send": g.commits as f64 / unique.requests.max(1) as f64,
        });
        std::fs::write(path, report.to_string())
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// What one floor measured.
struct Floor {
    messages: u64,
    per_second: f64,
    /// This process's CPU while it ran (it runs nothing else then).
    cpu: Duration,
}

/// The naive floor: `per_txn` messages per insert transaction and per update
/// transaction.
async fn floor(
    path: &Path,
    per_txn: u64,
    time: Duration,
    autocheckpoint: u32,
) -> Result<Floor, String> {
    let _ = std::fs::remove_file(path);
    let mut c: SqliteConnection =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(|e| e.to_string())?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .pragma("wal_autocheckpoint", autocheckpoint.to_string())
            .connect()
            .await
            .map_err(|e| e.to_string())?;
    let e = |e: sqlx::Error| e.to_string();
    sqlx::query(
        "CREATE TABLE messages (id BLOB PRIMARY KEY, tenant_id BLOB NOT NULL, \
         idempotency_key TEXT NOT NULL, status TEXT NOT NULL, to_number TEXT NOT NULL, \
         body TEXT NOT NULL, response BLOB, created_at INTEGER NOT NULL, \
         UNIQUE (tenant_id, idempotency_key))",
    )
    .execute(&mut c)
    .await
    .map_err(e)?;
    let tenant = uuid::Uuid::new_v4();
    let cpu_before = process_cpu(std::process::id());
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < time {
        let ids: Vec<uuid::Uuid> = (0..per_txn).map(|_| uuid::Uuid::new_v4()).collect();
        let mut tx = c.begin().await.map_err(e)?;
        for id in &ids {
            sqlx::query(
                "INSERT INTO messages (id, tenant_id, idempotency_key, status, to_number, body, \
                 created_at) VALUES (?, ?, ?, 'processing', '+14155550100', 'Your code is 123456', ?)",
            )
            .bind(id.as_bytes().as_slice())
            .bind(tenant.as_bytes().as_slice())
            .bind(id.to_string())
            .bind(n as i64)
            .execute(&mut *tx)
            .await
            .map_err(e)?;
        }
        tx.commit().await.map_err(e)?;
        let mut tx = c.begin().await.map_err(e)?;
        for id in &ids {
            sqlx::query("UPDATE messages SET status = 'sent', response = ? WHERE id = ?")
                .bind(b"{\"status\":\"sent\"}".as_slice())
                .bind(id.as_bytes().as_slice())
                .execute(&mut *tx)
                .await
                .map_err(e)?;
        }
        tx.commit().await.map_err(e)?;
        n += per_txn;
    }
    Ok(Floor {
        messages: n,
        per_second: n as f64 / started.elapsed().as_secs_f64(),
        cpu: process_cpu(std::process::id()).saturating_sub(cpu_before),
    })
}

struct Measured {
    requests: u64,
    per_second: f64,
    hist: Histogram<u64>,
    cpu: Cpu,
    /// The writer's group commits and the jobs they carried (`/metrics`).
    groups: Groups,
}

/// The writer's group commits and their jobs, from the service's
/// `sendonce_store_batch_size{kind="group"}`.
#[derive(Clone, Copy, Default)]
struct Groups {
    commits: u64,
    jobs: u64,
}

impl Groups {
    async fn read(target: &Target) -> Result<Groups, String> {
        let text = target
            .client
            .get(format!("{}/metrics", target.base))
            .send()
            .await
            .map_err(|e| format!("/metrics: {e}"))?
            .text()
            .await
            .map_err(|e| format!("/metrics: {e}"))?;
        // A build from before the histogram (a before/after comparison
        // with --bin-dir) has none: zero.
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or(0)
        };
        Ok(Groups {
            commits: value("sendonce_store_batch_size_count{kind=\"group\"}"),
            jobs: value("sendonce_store_batch_size_sum{kind=\"group\"}"),
        })
    }

    fn since(&self, start: &Groups) -> Groups {
        Groups {
            commits: self.commits.saturating_sub(start.commits),
            jobs: self.jobs.saturating_sub(start.jobs),
        }
    }
}

/// CPU of each process during a measurement.
#[derive(Clone, Copy, Default)]
struct Cpu {
    service: Duration,
    mock: Duration,
    driver: Duration,
}

impl Cpu {
    fn take(service: Option<u32>, mock: Option<u32>) -> Self {
        Self {
            service: service.map(process_cpu).unwrap_or_default(),
            mock: mock.map(process_cpu).unwrap_or_default(),
            driver: process_cpu(std::process::id()),
        }
    }

    fn since(&self, start: &Cpu) -> Cpu {
        Cpu {
            service: self.service.saturating_sub(start.service),
            mock: self.mock.saturating_sub(start.mock),
            driver: self.driver.saturating_sub(start.driver),
        }
    }
}

async fn service(
    args: &Args,
    bin_dir: &Path,
    dir: &Path,
    time: Duration,
) -> Result<(Measured, Measured), String> {
    let db = dir.join("sendonce.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let mock_port = free_port().map_err(|e| e.to_string())?;
    let mut mock = procs::spawn_mock(bin_dir, mock_port, &[])?;
    let api_key = sendonce::apikey::generate().secret;
    let port = free_port().map_err(|e| e.to_string())?;
    let log = std::fs::File::create(dir.join("sendonce.log")).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin_dir.join("sendonce"));
    cmd.env("DATABASE_URL", format!("sqlite://{}", db.display()))
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_PROVIDER", "http")
        .env(
            "SENDONCE_HTTP_PROVIDER_URL",
            format!("http://127.0.0.1:{mock_port}/messages"),
        )
        .env("SENDONCE_BOOTSTRAP_API_KEY", &api_key)
        .env("SENDONCE_RATE_TENANT_RPS", "0")
        .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
        .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0");
    for kv in &args.service_env {
        let (k, v) = kv.split_once('=').ok_or("--service-env wants NAME=VALUE")?;
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start sendonce: {e}"))?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(args.concurrency + 8)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let base = format!("http://127.0.0.1:{port}");
    procs::wait_ready(&client, &base, "/readyz", Some(&mut child)).await?;
    let target = Arc::new(Target {
        client,
        base,
        api_key,
        next: AtomicU64::new(0),
        pids: (child.id(), mock.id()),
    });
    // Warm-up, then unique sends.
    load(
        &target,
        args.concurrency,
        Duration::from_secs(2),
        Kind::Unique,
    )
    .await?;
    let pid = child.id().map(|p| p.to_string()).unwrap_or_default();
    if args.callgrind {
        callgrind_control("-z", &pid).await?;
    }
    let before = Groups::read(&target).await?;
    let mut unique = load(&target, args.concurrency, time, Kind::Unique).await?;
    unique.groups = Groups::read(&target).await?.since(&before);
    if args.callgrind {
        callgrind_control("-d", &pid).await?;
        procs::terminate(&mut child, Duration::from_secs(120)).await;
        procs::kill(&mut mock).await;
        let none = Measured {
            requests: 0,
            per_second: 0.0,
            hist: Histogram::new(3).map_err(|e| e.to_string())?,
            cpu: Cpu::default(),
            groups: Groups::default(),
        };
        return Ok((unique, none));
    }
    // 1,000 completed keys, then replays of them.
    for i in 0..1000u64 {
        target.post(&format!("replay-{i}"), i, false).await?;
    }
    let replay = load(&target, args.concurrency, time, Kind::Replay).await?;
    procs::kill(&mut child).await;
    procs::kill(&mut mock).await;
    Ok((unique, replay))
}

/// `callgrind_control OPTION PID`: zero (`-z`) or dump (`-d`) the counts of
/// the callgrind running as `pid`.
async fn callgrind_control(option: &str, pid: &str) -> Result<(), String> {
    let status = Command::new("callgrind_control")
        .args([option, pid])
        .stdout(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("callgrind_control {option} {pid}: {status}"))
    }
}

struct Target {
    client: reqwest::Client,
    base: String,
    api_key: String,
    next: AtomicU64,
    /// sendonce's and the mock's process ids, for their CPU.
    pids: (Option<u32>, Option<u32>),
}

impl Target {
    /// Sends `key` to a number chosen by `number` (a replay must repeat its
    /// original's body); `replay`: the answer must be a replay.
    async fn post(&self, key: &str, number: u64, replay: bool) -> Result<(), String> {
        let r = self
            .client
            .post(format!("{}/messages", self.base))
            .bearer_auth(&self.api_key)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(format!(
                "{{\"to\":\"+1415555{:04}\",\"body\":\"Your code is 123456\"}}",
                number % 10_000
            ))
            .send()
            .await
            .map_err(|e| format!("{key}: {e}"))?;
        let status = r.status().as_u16();
        let replayed = r.headers().contains_key("idempotent-replayed");
        let _ = r.bytes().await;
        if status != 201 {
            return Err(format!("{key}: answered {status}"));
        }
        if replay && !replayed {
            return Err(format!("{key}: a replay without Idempotent-Replayed"));
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Unique,
    Replay,
}

async fn load(
    target: &Arc<Target>,
    c: usize,
    time: Duration,
    kind: Kind,
) -> Result<Measured, String> {
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
    ));
    let cpu_before = Cpu::take(target.pids.0, target.pids.1);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..c {
        let (target, hist) = (Arc::clone(target), Arc::clone(&hist));
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            let mut local =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
            while started.elapsed() < time {
                let (key, number, replay) = match kind {
                    Kind::Unique => (
                        format!("u-{}", uuid::Uuid::new_v4().simple()),
                        target.next.fetch_add(1, Ordering::Relaxed),
                        false,
                    ),
                    Kind::Replay => {
                        let k = (w as u64 * 7919 + i * 31) % 1000;
                        (format!("replay-{k}"), k, true)
                    }
                };
                let t = Instant::now();
                target.post(&key, number, replay).await?;
                let _ = local.record(t.elapsed().as_micros() as u64);
                i += 1;
            }
            hist.lock().await.add(&local).map_err(|e| e.to_string())?;
            Ok::<u64, String>(i)
        }));
    }
    let mut requests = 0;
    for t in tasks {
        requests += t.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = Cpu::take(target.pids.0, target.pids.1).since(&cpu_before);
    let hist = Arc::try_unwrap(hist)
        .map_err(|_| "histogram still shared".to_string())?
        .into_inner();
    Ok(Measured {
        requests,
        per_second: requests as f64 / elapsed,
        hist,
        cpu,
        groups: Groups::default(),
    })
}
