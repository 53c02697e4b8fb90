//! The chaos run: sendonce instances as separate processes on one Postgres,
//! a mock provider that misbehaves at random, a load of unique keys plus
//! duplicates, and instances killed with SIGKILL (and restarted) while the
//! load runs. At the end it prints keys accepted, final, stuck, the most
//! provider deliveries of one key and the number of keys delivered twice,
//! and exits non-zero if any key is stuck, delivered twice, or acknowledged
//! and then lost.
//!
//! `scripts/chaos.sh` builds the binaries and runs it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::Rng;
use rand::seq::SliceRandom;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, Semaphore};

#[derive(Parser, Debug)]
#[command(about = "Kill sendonce instances under load and count duplicates and stuck keys")]
struct Args {
    /// Unique idempotency keys to send.
    #[arg(long, default_value_t = 3000)]
    keys: usize,
    /// Extra requests per key with the same key and body (duplicates).
    #[arg(long, default_value_t = 2)]
    duplicates: usize,
    /// sendonce instances.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Mean time between two SIGKILLs, in ms (0: no kills).
    #[arg(long, default_value_t = 800)]
    kill_every_ms: u64,
    /// Restart Postgres once, halfway through (needs pg_ctlcluster and root).
    #[arg(long)]
    restart_postgres: bool,
    /// How long to wait for every key to be final after the load.
    #[arg(long, default_value_t = 120)]
    settle_secs: u64,
    /// Server for the run's own database.
    #[arg(
        long,
        env = "TEST_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    admin_url: String,
    /// Where `sendonce` and `mock-provider` are (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Injected provider faults (probabilities).
    #[arg(long, default_value_t = 0.05)]
    fail_500: f64,
    #[arg(long, default_value_t = 0.05)]
    rate_limit: f64,
    #[arg(long, default_value_t = 0.01)]
    hang: f64,
    #[arg(long, default_value_t = 0.03)]
    accept_then_drop: f64,
    #[arg(long, default_value_t = 0.02)]
    accept_then_500: f64,
}

struct Instance {
    port: u16,
    child: Option<Child>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Run {
    args: Args,
    bin_dir: PathBuf,
    log_dir: PathBuf,
    database_url: String,
    mock_url: String,
    api_key: String,
    client: reqwest::Client,
}

impl Run {
    fn sendonce(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("sendonce"));
        cmd.env("DATABASE_URL", &self.database_url)
            .env("SENDONCE_PROVIDER", "http")
            .env("SENDONCE_HTTP_PROVIDER_URL", &self.mock_url)
            .env("SENDONCE_BOOTSTRAP_API_KEY", &self.api_key)
            .env("SENDONCE_PROVIDER_TIMEOUT_MS", "1000")
            .env("SENDONCE_LEASE_SECS", "4")
            .env("SENDONCE_POLL_INTERVAL_MS", "200")
            .env("SENDONCE_RETRY_BASE_MS", "50")
            .env("SENDONCE_RETRY_CAP_MS", "1000")
            .env("SENDONCE_RETRY_MAX_ATTEMPTS", "30")
            .env("SENDONCE_RETRY_DEADLINE_SECS", "600")
            .env("SENDONCE_RETRY_AFTER_MAX_SECS", "2")
            .env("SENDONCE_SYNC_WAIT_MS", "2000")
            .env("SENDONCE_SHUTDOWN_GRACE_SECS", "1")
            .env("SENDONCE_DB_MAX_CONNECTIONS", "8")
            // The run is one tenant hammering one number range on purpose.
            .env("SENDONCE_RATE_TENANT_RPS", "0")
            .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
            .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    async fn start_instance(&self, port: u16, n: usize) -> std::io::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("instance-{n}.log")))?;
        self.sendonce()
            .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
    }

    async fn wait_healthy(&self, port: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = self
                .client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                && r.status() == 200
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    sendonce::install_crypto_provider();
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .ok_or("no binary directory")?
            .to_path_buf(),
    };
    for bin in ["sendonce", "mock-provider"] {
        if !bin_dir.join(bin).exists() {
            return Err(format!(
                "{} not found in {}: build it first",
                bin,
                bin_dir.display()
            ));
        }
    }
    let log_dir = std::env::temp_dir().join(format!("sendonce-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;

    // A database of its own.
    let db_name = format!("sendonce_chaos_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .map_err(|e| format!("connect to {}: {e}", args.admin_url))?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
        .execute(&mut admin)
        .await
        .map_err(|e| e.to_string())?;
    let mut url = reqwest::Url::parse(&args.admin_url).map_err(|e| e.to_string())?;
    url.set_path(&db_name);
    let database_url = url.to_string();

    // The misbehaving provider.
    let mock_port = free_port().map_err(|e| e.to_string())?;
    let mut mock = Command::new(bin_dir.join("mock-provider"))
        .env("MOCK_LISTEN", format!("127.0.0.1:{mock_port}"))
        .env("MOCK_LATENCY_MS", "0-20")
        .env("MOCK_FAIL_500", args.fail_500.to_string())
        .env("MOCK_RATE_LIMIT", args.rate_limit.to_string())
        .env("MOCK_RETRY_AFTER_SECS", "1")
        .env("MOCK_HANG", args.hang.to_string())
        .env("MOCK_ACCEPT_THEN_DROP", args.accept_then_drop.to_string())
        .env("MOCK_ACCEPT_THEN_500", args.accept_then_500.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start mock-provider: {e}"))?;

    let key = sendonce::apikey::generate().secret;
    let run = Arc::new(Run {
        bin_dir,
        log_dir: log_dir.clone(),
        database_url: database_url.clone(),
        mock_url: format!("http://127.0.0.1:{mock_port}/messages"),
        api_key: key,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?,
        args,
    });

    let migrate = run
        .sendonce()
        .arg("migrate")
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !migrate.status.success() {
        return Err(format!(
            "migrate: {}",
            String::from_utf8_lossy(&migrate.stderr)
        ));
    }
    let mut instances = Vec::new();
    for n in 0..run.args.instances {
        let port = free_port().map_err(|e| e.to_string())?;
        let child = run
            .start_instance(port, n)
            .await
            .map_err(|e| e.to_string())?;
        instances.push(Instance {
            port,
            child: Some(child),
        });
    }
    for i in &instances {
        if !run.wait_healthy(i.port).await {
            return Err(format!(
                "instance on {} did not start; logs in {}",
                i.port,
                log_dir.display()
            ));
        }
    }
    let ports: Vec<u16> = instances.iter().map(|i| i.port).collect();
    let instances = Arc::new(Mutex::new(instances));
    println!(
        "chaos: {} keys x {} requests, {} instances, concurrency {}, logs in {}",
        run.args.keys,
        1 + run.args.duplicates,
        run.args.instances,
        run.args.concurrency,
        log_dir.display()
    );

    // The load: every key once plus its duplicates, shuffled.
    let mut requests: Vec<usize> = (0..run.args.keys)
        .flat_map(|k| std::iter::repeat_n(k, 1 + run.args.duplicates))
        .collect();
    requests.shuffle(&mut rand::rng());
    let acknowledged = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let reused = Arc::new(AtomicUsize::new(0));
    let gave_up = Arc::new(AtomicUsize::new(0));
    let load_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let killer = {
        let run = Arc::clone(&run);
        let instances = Arc::clone(&instances);
        let load_done = Arc::clone(&load_done);
        tokio::spawn(async move {
            let mut kills = 0usize;
            let mut pg_restarted = false;
            if run.args.kill_every_ms == 0 && !run.args.restart_postgres {
                return (0, false);
            }
            while !load_done.load(Ordering::SeqCst) {
                let mean = run.args.kill_every_ms.max(100);
                let wait = rand::rng().random_range(mean / 2..=mean * 3 / 2);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if load_done.load(Ordering::SeqCst) {
                    break;
                }
                if run.args.restart_postgres && !pg_restarted && kills >= 2 {
                    pg_restarted = restart_postgres().await;
                    continue;
                }
                if run.args.kill_every_ms == 0 {
                    continue;
                }
                let mut list = instances.lock().await;
                let n = rand::rng().random_range(0..list.len());
                if let Some(mut child) = list[n].child.take() {
                    let _ = child.start_kill(); // SIGKILL
                    let _ = child.wait().await;
                    kills += 1;
                }
                let port = list[n].port;
                drop(list);
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(child) = run.start_instance(port, n).await {
                    instances.lock().await[n].child = Some(child);
                }
            }
            (kills, pg_restarted)
        })
    };

    let permits = Arc::new(Semaphore::new(run.args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for k in requests {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let run = Arc::clone(&run);
        let ports = ports.clone();
        let acknowledged = Arc::clone(&acknowledged);
        let reused = Arc::clone(&reused);
        let gave_up = Arc::clone(&gave_up);
        tasks.spawn(async move {
            let _permit = permit;
            let key = format!("CHAOS-{k:06}");
            let body = serde_json::json!({
                "to": format!("+1415555{:04}", k % 10_000),
                "body": format!("chaos message {k}"),
            });
            // A real client: on a refused connection, a 5xx or a 409, try
            // again (maybe on another instance) until it gets an answer.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let port = ports[rand::rng().random_range(0..ports.len())];
                let resp = run
                    .client
                    .post(format!("http://127.0.0.1:{port}/messages"))
                    .bearer_auth(&run.api_key)
                    .header("Idempotency-Key", &key)
                    .json(&body)
                    .send()
                    .await;
                match resp.map(|r| r.status().as_u16()) {
                    Ok(201 | 202) => {
                        if let Ok(mut a) = acknowledged.lock() {
                            a.insert(key.clone());
                        }
                        return;
                    }
                    Ok(422) => {
                        reused.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    _ if Instant::now() > deadline => {
                        gave_up.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    load_done.store(true, Ordering::SeqCst);
    let load_secs = started.elapsed().as_secs_f64();
    let (kills, pg_restarted) = killer.await.unwrap_or((0, false));

    // Every instance up again for the rescue to finish.
    {
        let mut list = instances.lock().await;
        for (n, inst) in list.iter_mut().enumerate() {
            if inst.child.is_none() {
                inst.child = run.start_instance(inst.port, n).await.ok();
            }
        }
    }
    let mut db = PgConnection::connect(&database_url)
        .await
        .map_err(|e| e.to_string())?;
    let settle_deadline = Instant::now() + Duration::from_secs(run.args.settle_secs);
    let mut processing: i64;
    loop {
        processing =
            sqlx::query_scalar("SELECT count(*) FROM messages WHERE status = 'processing'")
                .fetch_one(&mut db)
                .await
                .unwrap_or(-1);
        if processing == 0 || Instant::now() > settle_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let by_status: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM messages GROUP BY status ORDER BY status")
            .fetch_all(&mut db)
            .await
            .map_err(|e| e.to_string())?;
    let stored: HashSet<String> = sqlx::query_scalar("SELECT idempotency_key FROM messages")
        .fetch_all(&mut db)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let stats: serde_json::Value = run
        .client
        .get(format!("http://127.0.0.1:{mock_port}/stats"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;

    let acknowledged = acknowledged.lock().map(|a| a.clone()).unwrap_or_default();
    let lost = acknowledged.iter().filter(|k| !stored.contains(*k)).count();
    let statuses: HashMap<String, i64> = by_status.into_iter().collect();
    let final_count: i64 = statuses
        .iter()
        .filter(|(s, _)| s.as_str() != "processing")
        .map(|(_, n)| n)
        .sum();
    let duplicates = stats["duplicate_keys"].as_u64().unwrap_or(u64::MAX);
    let max_sends = stats["max_deliveries_per_key"].as_u64().unwrap_or(0);

    println!(
        "chaos: load took {load_secs:.1} s; {kills} SIGKILLs; postgres restarted: {pg_restarted}"
    );
    println!("keys sent:          {}", run.args.keys);
    println!("keys acknowledged:  {}", acknowledged.len());
    println!("keys accepted:      {}", stored.len());
    println!("keys final:         {final_count}  {statuses:?}");
    println!("keys stuck:         {processing}");
    println!("keys lost:          {lost}  (acknowledged 201/202, no row)");
    println!("provider calls:     {}", stats["calls"]);
    println!("max sends per key:  {max_sends}");
    println!("duplicates:         {duplicates}  (keys delivered more than once)");
    println!("422 on a retry:     {}", reused.load(Ordering::SeqCst));
    println!("clients gave up:    {}", gave_up.load(Ordering::SeqCst));

    // Tidy up: stop everything, drop the database.
    for inst in instances.lock().await.iter_mut() {
        if let Some(mut c) = inst.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
    let _ = mock.start_kill();
    drop(db);
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;

    let ok = processing == 0
        && duplicates == 0
        && lost == 0
        && reused.load(Ordering::SeqCst) == 0
        && gave_up.load(Ordering::SeqCst) == 0;
    println!("chaos: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

/// Restarts the machine's Postgres cluster (Debian's pg_ctlcluster).
async fn restart_postgres() -> bool {
    let Ok(versions) = std::fs::read_dir("/etc/postgresql") else {
        return false;
    };
    let mut ok = false;
    for v in versions.flatten() {
        let version = v.file_name().to_string_lossy().to_string();
        let status = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &version, "main", "restart"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        ok |= status.map(|s| s.success()).unwrap_or(false);
    }
    ok
}
