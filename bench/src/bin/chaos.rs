//! The chaos run: sendonce instances as separate processes on one Postgres,
//! a mock provider that misbehaves at random, a load of unique keys plus
//! duplicates, and instances killed with SIGKILL (and restarted) while the
//! load runs. At the end it prints keys accepted, final, stuck, the most
//! provider deliveries of one key and the number of keys delivered twice,
//! and exits non-zero if any key is stuck, delivered twice, or acknowledged
//! and then lost.
//!
//! With `--two-providers` every instance runs `SENDONCE_PROVIDER=twilio,http`,
//! both aimed at the one mock (its Twilio API and its `/messages`), so the
//! faults hit both providers, messages fail over and circuits open and close;
//! a phone getting one SMS twice through either or both providers counts as a
//! duplicate (the mock counts deliveries by recipient and body over both
//! protocols; every key has its own body).
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
use sendonce_bench::db::{Database, count_processing, create_database, drop_database};
use sendonce_bench::pg::Cluster;
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::stats::mock_stats;
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
    /// Restart Postgres once, halfway through. The run then starts a
    /// throwaway cluster of its own (initdb and pg_ctl, on a free port; as
    /// root the server runs as user postgres) instead of using --admin-url,
    /// and restarts only that one.
    #[arg(long)]
    restart_postgres: bool,
    /// How long to wait for every key to be final after the load.
    #[arg(long, default_value_t = 120)]
    settle_secs: u64,
    /// Server for the run's own database (unused with --restart-postgres).
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
    /// Run every instance with two providers (Twilio first, then http),
    /// both on the mock, with a circuit that opens after 3 failures in a
    /// row and probes after 2 s.
    #[arg(long)]
    two_providers: bool,
    /// The instances' `DATABASE_URL` names these hosts (`h1:p1,h2:p2`, a
    /// highly available cluster, `scripts/ha.sh`) instead of the admin
    /// server alone, with `target_session_attrs=read-write`.
    #[arg(long)]
    hosts: Option<String>,
    /// A shell command run once during the load (a failover, `scripts/ha.sh`);
    /// the run then reports the time from it to the first acknowledged
    /// request sent after it.
    #[arg(long)]
    switch_cmd: Option<String>,
    /// When to run --switch-cmd, in ms after the load starts.
    #[arg(long, default_value_t = 3000)]
    switch_after_ms: u64,
}

struct Instance {
    port: u16,
    child: Option<Child>,
}

struct Run {
    args: Args,
    bin_dir: PathBuf,
    log_dir: PathBuf,
    database_url: String,
    mock_url: String,
    api_key: String,
    client: reqwest::Client,
    /// The run's own cluster (with --restart-postgres): the only one it
    /// restarts.
    cluster: Option<Cluster>,
}

impl Run {
    fn sendonce(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("sendonce"));
        if self.args.two_providers {
            cmd.env("SENDONCE_PROVIDER", "twilio,http")
                .env(
                    "TWILIO_BASE_URL",
                    self.mock_url.trim_end_matches("/messages"),
                )
                .env("TWILIO_ACCOUNT_SID", "AC0123456789abcdef0123456789abcdef")
                .env("TWILIO_AUTH_TOKEN", "chaos-twilio-token")
                .env("TWILIO_FROM", "+14155550000")
                .env("SENDONCE_CIRCUIT_FAILURES", "3")
                .env("SENDONCE_CIRCUIT_OPEN_FOR", "2s");
        } else {
            cmd.env("SENDONCE_PROVIDER", "http");
        }
        cmd.env("DATABASE_URL", &self.database_url)
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
        let base = format!("http://127.0.0.1:{port}");
        procs::wait_ready(&self.client, &base, "/healthz", None)
            .await
            .is_ok()
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

/// What the load saw from the clients' side.
#[derive(Default)]
struct Load {
    acknowledged: std::sync::Mutex<HashSet<String>>,
    reused: AtomicUsize,
    gave_up: AtomicUsize,
    /// When --switch-cmd started and returned, and the first
    /// acknowledgement of a request sent after it returned.
    switch_began: std::sync::Mutex<Option<Instant>>,
    switched_at: std::sync::Mutex<Option<Instant>>,
    first_ack_after_switch: std::sync::Mutex<Option<Duration>>,
    /// When each 201/202 came back.
    acks: std::sync::Mutex<Vec<Instant>>,
}

/// What the run saw at the end.
struct Outcome {
    load_secs: f64,
    kills: usize,
    pg_restarted: bool,
    processing: i64,
    statuses: HashMap<String, i64>,
    stored: HashSet<String>,
    stats: serde_json::Value,
    /// Messages by the provider that has them, and failovers recorded.
    by_provider: Vec<(String, i64)>,
    failovers: i64,
}

async fn run(args: Args) -> Result<bool, String> {
    sendonce::install_crypto_provider();
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), "")?;
    let log_dir = procs::log_dir("chaos")?;
    // With --restart-postgres, a cluster of its own: the one it restarts.
    let cluster = if args.restart_postgres {
        Some(Cluster::start().map_err(|e| format!("throwaway Postgres: {e}"))?)
    } else {
        None
    };
    let admin_url = cluster
        .as_ref()
        .map_or_else(|| args.admin_url.clone(), Cluster::admin_url);
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .map_err(|e| format!("connect to {admin_url}: {e}"))?;
    let mut db = create_database(&mut admin, &admin_url, "chaos").await?;
    if let Some(hosts) = &args.hosts {
        db.url = format!(
            "postgres://postgres@{hosts}/{}?target_session_attrs=read-write",
            db.name
        );
    }
    let outcome = run_on(args, bin_dir, log_dir, &db, cluster).await;
    drop_database(&mut admin, &db).await;
    outcome
}

async fn run_on(
    args: Args,
    bin_dir: PathBuf,
    log_dir: PathBuf,
    db: &Database,
    cluster: Option<Cluster>,
) -> Result<bool, String> {
    // The misbehaving provider.
    let mock_port = free_port().map_err(|e| e.to_string())?;
    let mut mock = procs::spawn_mock(&bin_dir, mock_port, &mock_faults(&args))?;
    let run = Arc::new(Run {
        bin_dir,
        log_dir,
        database_url: db.url.clone(),
        mock_url: format!("http://127.0.0.1:{mock_port}/messages"),
        api_key: sendonce::apikey::generate().secret,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?,
        args,
        cluster,
    });
    procs::migrate(run.sendonce()).await?;
    let instances = start_instances(&run).await?;
    let ports: Vec<u16> = instances.iter().map(|i| i.port).collect();
    let instances = Arc::new(Mutex::new(instances));
    println!(
        "chaos: {} keys x {} requests, {} instances, concurrency {}, logs in {}",
        run.args.keys,
        1 + run.args.duplicates,
        run.args.instances,
        run.args.concurrency,
        run.log_dir.display()
    );

    let load = Arc::new(Load::default());
    let load_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let killer = tokio::spawn(kill_loop(
        Arc::clone(&run),
        Arc::clone(&instances),
        Arc::clone(&load_done),
    ));
    let switcher = tokio::spawn(switch(Arc::clone(&run), Arc::clone(&load)));
    send_load(&run, &ports, &load).await;
    load_done.store(true, Ordering::SeqCst);
    let load_ended = Instant::now();
    let load_secs = started.elapsed().as_secs_f64();
    let (kills, pg_restarted) = killer.await.unwrap_or((0, false));
    let mut switch_ok = switcher.await.unwrap_or(false);
    // A switch after the last answer tested nothing under load: a failure,
    // not a pass (ask for more keys or an earlier --switch-after-ms).
    let began = load.switch_began.lock().ok().and_then(|a| *a);
    if run.args.switch_cmd.is_some() && began.is_none_or(|at| at >= load_ended) {
        eprintln!(
            "chaos: the switch began after the load ended ({load_secs:.1} s): nothing was tested under load"
        );
        switch_ok = false;
    }

    restart_missing(&run, &instances).await;
    let outcome = settle(&run, &db.url, mock_port).await?;
    let outcome = Outcome {
        load_secs,
        kills,
        pg_restarted,
        ..outcome
    };
    let ok = report(&run, &load, &outcome) && switch_ok;

    // Tidy up: stop everything (the caller drops the database).
    for inst in instances.lock().await.iter_mut() {
        if let Some(mut c) = inst.child.take() {
            procs::kill(&mut c).await;
        }
    }
    let _ = mock.start_kill();
    Ok(ok)
}

/// The mock provider's injected faults.
fn mock_faults(args: &Args) -> Vec<(&'static str, String)> {
    vec![
        ("MOCK_LATENCY_MS", "0-20".into()),
        ("MOCK_FAIL_500", args.fail_500.to_string()),
        ("MOCK_RATE_LIMIT", args.rate_limit.to_string()),
        ("MOCK_RETRY_AFTER_SECS", "1".into()),
        ("MOCK_HANG", args.hang.to_string()),
        ("MOCK_ACCEPT_THEN_DROP", args.accept_then_drop.to_string()),
        ("MOCK_ACCEPT_THEN_500", args.accept_then_500.to_string()),
    ]
}

/// Starts every instance on a free port and waits for each to be healthy.
async fn start_instances(run: &Run) -> Result<Vec<Instance>, String> {
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
                run.log_dir.display()
            ));
        }
    }
    Ok(instances)
}

/// Until the load is done: SIGKILL a random instance every so often and
/// start it again; once, after two kills, restart the run's own Postgres
/// (with --restart-postgres). Returns (kills, Postgres restarted).
async fn kill_loop(
    run: Arc<Run>,
    instances: Arc<Mutex<Vec<Instance>>>,
    load_done: Arc<AtomicBool>,
) -> (usize, bool) {
    let mut kills = 0usize;
    let mut pg_restarted = false;
    if run.args.kill_every_ms == 0 && run.cluster.is_none() {
        return (0, false);
    }
    while !load_done.load(Ordering::SeqCst) {
        let mean = run.args.kill_every_ms.max(100);
        let wait = rand::rng().random_range(mean / 2..=mean * 3 / 2);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if load_done.load(Ordering::SeqCst) {
            break;
        }
        if let Some(cluster) = &run.cluster
            && !pg_restarted
            && kills >= 2
        {
            pg_restarted = cluster.restart().await;
            continue;
        }
        if run.args.kill_every_ms == 0 {
            continue;
        }
        let mut list = instances.lock().await;
        let n = rand::rng().random_range(0..list.len());
        if let Some(mut child) = list[n].child.take() {
            procs::kill(&mut child).await; // SIGKILL
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
}

/// Runs --switch-cmd once, --switch-after-ms into the load. False if it
/// failed.
async fn switch(run: Arc<Run>, load: Arc<Load>) -> bool {
    let Some(cmd) = &run.args.switch_cmd else {
        return true;
    };
    tokio::time::sleep(Duration::from_millis(run.args.switch_after_ms)).await;
    if let Ok(mut at) = load.switch_began.lock() {
        *at = Some(Instant::now());
    }
    println!("chaos: switching: {cmd}");
    let status = Command::new("sh").arg("-c").arg(cmd).status().await;
    if let Ok(mut at) = load.switched_at.lock() {
        *at = Some(Instant::now());
    }
    match status {
        Ok(s) if s.success() => true,
        other => {
            eprintln!("chaos: {cmd}: {other:?}");
            false
        }
    }
}

/// Every key once plus its duplicates, shuffled, `concurrency` at a time.
async fn send_load(run: &Arc<Run>, ports: &[u16], load: &Arc<Load>) {
    let mut requests: Vec<usize> = (0..run.args.keys)
        .flat_map(|k| std::iter::repeat_n(k, 1 + run.args.duplicates))
        .collect();
    requests.shuffle(&mut rand::rng());
    let permits = Arc::new(Semaphore::new(run.args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for k in requests {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let run = Arc::clone(run);
        let ports = ports.to_vec();
        let load = Arc::clone(load);
        tasks.spawn(async move {
            let _permit = permit;
            send_one(&run, &ports, k, &load).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One request as a real client makes it: on a refused connection, a 5xx
/// or a 409, try again (maybe on another instance) until it gets an answer.
async fn send_one(run: &Run, ports: &[u16], k: usize, load: &Load) {
    let key = format!("CHAOS-{k:06}");
    let body = serde_json::json!({
        "to": format!("+1415555{:04}", k % 10_000),
        "body": format!("chaos message {k}"),
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let port = ports[rand::rng().random_range(0..ports.len())];
        let sent_at = Instant::now();
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
                if let Ok(mut a) = load.acknowledged.lock() {
                    a.insert(key.clone());
                }
                if let Ok(mut acks) = load.acks.lock() {
                    acks.push(Instant::now());
                }
                let switched = load.switched_at.lock().ok().and_then(|a| *a);
                if let Some(at) = switched.filter(|at| sent_at >= *at)
                    && let Ok(mut first) = load.first_ack_after_switch.lock()
                {
                    let took = Instant::now() - at;
                    *first = Some(first.map_or(took, |f| f.min(took)));
                }
                return;
            }
            Ok(422) => {
                load.reused.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ if Instant::now() > deadline => {
                load.gave_up.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Every instance up again for the rescue to finish.
async fn restart_missing(run: &Run, instances: &Mutex<Vec<Instance>>) {
    let mut list = instances.lock().await;
    for (n, inst) in list.iter_mut().enumerate() {
        if inst.child.is_none() {
            inst.child = run.start_instance(inst.port, n).await.ok();
        }
    }
}

/// Waits (up to --settle-secs) for nothing to be processing, then reads the
/// messages' states and the mock's counts.
async fn settle(run: &Run, database_url: &str, mock_port: u16) -> Result<Outcome, String> {
    let mut db = connect_writable(database_url).await?;
    let settle_deadline = Instant::now() + Duration::from_secs(run.args.settle_secs);
    let mut processing: i64;
    loop {
        processing = count_processing(&mut db).await;
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
    let stats = mock_stats(&run.client, mock_port).await?;
    let by_provider: Vec<(String, i64)> = sqlx::query_as(
        "SELECT provider, count(*) FROM messages GROUP BY provider ORDER BY provider",
    )
    .fetch_all(&mut db)
    .await
    .map_err(|e| e.to_string())?;
    let failovers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM message_events WHERE kind = 'failover'")
            .fetch_one(&mut db)
            .await
            .map_err(|e| e.to_string())?;
    Ok(Outcome {
        by_provider,
        failovers,
        load_secs: 0.0,
        kills: 0,
        pg_restarted: false,
        processing,
        statuses: by_status.into_iter().collect(),
        stored,
        stats,
    })
}

/// A connection to the writable host of a (maybe multi-host) URL.
async fn connect_writable(url: &str) -> Result<PgConnection, String> {
    use sendonce::store::postgres::connect::{Targets, writable};
    use sqlx::ConnectOptions;
    let targets = Targets::parse(url).map_err(|e| e.to_string())?;
    for host in &targets.hosts {
        if let Ok(mut conn) = host.connect().await
            && writable(&mut conn).await.unwrap_or(false)
        {
            return Ok(conn);
        }
    }
    Err(format!("no writable host in {url}"))
}

/// Prints the counts; true if nothing is stuck, duplicated, lost, refused
/// as a reused key or given up on.
fn report(run: &Run, load: &Load, o: &Outcome) -> bool {
    let acknowledged = load
        .acknowledged
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    let lost = acknowledged
        .iter()
        .filter(|k| !o.stored.contains(*k))
        .count();
    let final_count: i64 = o
        .statuses
        .iter()
        .filter(|(s, _)| s.as_str() != "processing")
        .map(|(_, n)| n)
        .sum();
    // Keys the http API got twice, and (To, Body) pairs delivered twice
    // over either or both protocols: each key has its own body.
    let duplicates = o.stats["duplicate_keys"].as_u64().unwrap_or(u64::MAX).max(
        o.stats["duplicate_recipient_bodies"]
            .as_u64()
            .unwrap_or(u64::MAX),
    );
    let max_sends = o.stats["max_deliveries_per_key"].as_u64().unwrap_or(0);
    let reused = load.reused.load(Ordering::SeqCst);
    let gave_up = load.gave_up.load(Ordering::SeqCst);

    println!(
        "chaos: load took {:.1} s; {} SIGKILLs; postgres restarted: {}",
        o.load_secs, o.kills, o.pg_restarted
    );
    println!("keys sent:          {}", run.args.keys);
    println!("keys acknowledged:  {}", acknowledged.len());
    println!("keys accepted:      {}", o.stored.len());
    println!("keys final:         {final_count}  {:?}", o.statuses);
    println!("keys stuck:         {}", o.processing);
    println!("keys lost:          {lost}  (acknowledged 201/202, no row)");
    println!("provider calls:     {}", o.stats["calls"]);
    println!("by provider:        {:?}", o.by_provider);
    println!("failovers:          {}", o.failovers);
    println!("max sends per key:  {max_sends}");
    println!(
        "duplicates:         {duplicates}  (keys delivered more than once, over both providers)"
    );
    println!("422 on a retry:     {reused}");
    println!("clients gave up:    {gave_up}");
    if run.args.switch_cmd.is_some() {
        let first = load.first_ack_after_switch.lock().ok().and_then(|f| *f);
        match first {
            Some(d) => println!(
                "switch to first ack: {:.2} s  (from the switch command's return to the first 201/202 to a request sent after it)",
                d.as_secs_f64()
            ),
            None => println!("switch to first ack: none"),
        }
        let switched = load.switch_began.lock().ok().and_then(|a| *a);
        let mut acks = load.acks.lock().map(|a| a.clone()).unwrap_or_default();
        acks.sort();
        let gap = switched.map(|at| {
            acks.windows(2)
                .filter(|w| w[1] >= at)
                .map(|w| w[1] - w[0].max(at))
                .max()
                .unwrap_or_default()
        });
        if let Some(gap) = gap {
            println!(
                "longest ack gap:    {:.2} s  (after the switch began: no request answered 201/202)",
                gap.as_secs_f64()
            );
        }
    }

    let ok = o.processing == 0 && duplicates == 0 && lost == 0 && reused == 0 && gave_up == 0;
    println!("chaos: {}", if ok { "PASS" } else { "FAIL" });
    ok
}
