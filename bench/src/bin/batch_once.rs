//! A one-off measurement of `POST /messages/batch` (issue 15): one sendonce
//! instance on Postgres with the mock provider, `--rounds` batches of
//! `--items` new messages (1,000 by default) posted one after the other.
//! For each batch it reports the request's wall time and checks that every
//! item answered 202 in request order; then it waits until every message is
//! `sent` and reports how long the instance took to deliver them all, the
//! database transactions the whole run took per message
//! (`pg_stat_database.xact_commit`, flushed by Postgres at most once a
//! second, so read after a pause), and that the mock provider delivered no
//! key twice. Exit status non-zero on any of those failing.
//!
//! Run after `cargo build --release -p sendonce -p testkit -p sendonce-bench`:
//! `target/release/batch_once` (the lead runs it; `BENCHMARKS.md` has the
//! figure).

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use sendonce_bench::db::{create_database, drop_database};
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::stats::mock_stats;
use sqlx::{Connection, PgConnection};
use tokio::process::Command;

#[derive(Parser, Debug)]
#[command(about = "Time POST /messages/batch with 1,000 items")]
struct Args {
    /// Items per batch (at most 1,000).
    #[arg(long, default_value_t = 1000)]
    items: usize,
    /// Batches, one after the other.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
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
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("batch_once: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("batch_once: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn commits(conn: &mut PgConnection, db: &str) -> Result<i64, String> {
    sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
        .bind(db)
        .fetch_one(conn)
        .await
        .map_err(|e| e.to_string())
}

async fn run(args: Args) -> Result<bool, String> {
    sendonce::install_crypto_provider();
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), "")?;
    let log_dir = procs::log_dir("batch")?;
    let mut admin = PgConnection::connect(&args.admin_url)
        .await
        .map_err(|e| format!("connect to {}: {e}", args.admin_url))?;
    let db = create_database(&mut admin, &args.admin_url, "batch").await?;
    let outcome = measure(&args, &bin_dir, &log_dir, &db, &mut admin).await;
    drop_database(&mut admin, &db).await;
    outcome
}

async fn measure(
    args: &Args,
    bin_dir: &std::path::Path,
    log_dir: &std::path::Path,
    db: &sendonce_bench::db::Database,
    admin: &mut PgConnection,
) -> Result<bool, String> {
    let mut migrate = Command::new(bin_dir.join("sendonce"));
    migrate.env("DATABASE_URL", &db.url);
    procs::migrate(migrate).await?;
    let mock_port = free_port().map_err(|e| e.to_string())?;
    let mut mock = procs::spawn_mock(bin_dir, mock_port, &[])?;
    let api_key = sendonce::apikey::generate().secret;
    let port = free_port().map_err(|e| e.to_string())?;
    let log = std::fs::File::create(log_dir.join("sendonce.log")).map_err(|e| e.to_string())?;
    let mut service = Command::new(bin_dir.join("sendonce"))
        .env("DATABASE_URL", &db.url)
        .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SENDONCE_PROVIDER", "http")
        .env(
            "SENDONCE_HTTP_PROVIDER_URL",
            format!("http://127.0.0.1:{mock_port}/messages"),
        )
        .env("SENDONCE_BOOTSTRAP_API_KEY", &api_key)
        .env("SENDONCE_RATE_TENANT_RPS", "0")
        .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
        .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start sendonce: {e}"))?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let base = format!("http://127.0.0.1:{port}");
    procs::wait_ready(&client, &base, "/readyz", Some(&mut service)).await?;

    let mut ok = true;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let before = commits(admin, &db.name).await?;
    let started = Instant::now();
    let mut times = Vec::new();
    for round in 0..args.rounds {
        let keys: Vec<String> = (0..args.items)
            .map(|i| format!("BATCH-{}-{round}-{i:04}", &run[..8]))
            .collect();
        let items: Vec<serde_json::Value> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                serde_json::json!({
                    "idempotency_key": key,
                    "to": "+14155550100",
                    "body": format!("Order {round}-{i} confirmed"),
                })
            })
            .collect();
        let body = serde_json::json!({ "messages": items });
        let t = Instant::now();
        let resp = client
            .post(format!("{base}/messages/batch"))
            .bearer_auth(&api_key)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let answer: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
        let took = t.elapsed();
        times.push(took);
        let results = answer["results"].as_array().cloned().unwrap_or_default();
        let in_order = results.len() == keys.len()
            && results
                .iter()
                .zip(&keys)
                .all(|(r, k)| r["idempotency_key"] == **k && r["status"] == 202);
        if !status.is_success() || !in_order {
            println!("PROBLEM: batch {round}: {status}, every item 202 in order: {in_order}");
            ok = false;
        }
        println!(
            "batch {round}: {} items in {:.1} ms",
            args.items,
            took.as_secs_f64() * 1000.0
        );
    }
    let total = (args.items * args.rounds) as i64;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut conn = PgConnection::connect(&db.url)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE status = 'sent'")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if sent == total {
            break;
        }
        if Instant::now() > deadline {
            println!("PROBLEM: only {sent} of {total} sent within 300 s");
            ok = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = started.elapsed();
    drop(conn);
    // Postgres publishes backends' counters at most once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = commits(admin, &db.name).await?;
    let stats = mock_stats(&client, mock_port).await?;
    let duplicates = stats["duplicate_keys"].as_u64().unwrap_or(u64::MAX);
    if duplicates != 0 {
        println!("PROBLEM: the mock delivered {duplicates} keys twice");
        ok = false;
    }
    let mut sorted = times.clone();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    println!(
        "batch of {}: median {:.1} ms, max {:.1} ms; {total} messages all sent {:.2} s after the first batch ({:.0}/s); {:.2} transactions per message over the whole run",
        args.items,
        median.as_secs_f64() * 1000.0,
        sorted.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
        drained.as_secs_f64(),
        total as f64 / drained.as_secs_f64().max(1e-9),
        (after - before) as f64 / total.max(1) as f64,
    );
    procs::kill(&mut service).await;
    procs::kill(&mut mock).await;
    println!("batch_once: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
