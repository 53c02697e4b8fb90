//! Test harness: a fresh Postgres database per test, instances bound to port
//! 0, the mock provider as the only fake, and helpers that wait on conditions
//! with a deadline instead of sleeping.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use sendonce::app::{App, Handle};
use sendonce::clock::Clock;
pub use sendonce::config::Backend;
use sendonce::config::Settings;
use sendonce::provider::{HttpProvider, Provider};
use sendonce::store::postgres::PoolSettings;
use sendonce::store::{MaintenanceStore, PgStore, SqliteStore, Store};
use sqlx::{Connection, PgConnection, PgPool, SqlitePool};
use testkit::mock_provider::MockProvider;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The server that hosts test databases: `TEST_DATABASE_URL` (the README's
/// test command sets it to its throwaway cluster unless given one), else
/// the Postgres on 127.0.0.1:5432.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// What the name of every database the tests make starts with:
/// `SENDONCE_TEST_DB_PREFIX` (scripts/test.sh sets one of its own per run
/// unless given one), else `sendonce_t_`. 1 to 30 lower-case letters, digits
/// and `_`, starting with a letter, so that a name (prefix, process id, 16
/// random hex digits) stays within Postgres's 63 bytes and needs no quoting.
pub fn database_prefix() -> String {
    let prefix =
        std::env::var("SENDONCE_TEST_DB_PREFIX").unwrap_or_else(|_| "sendonce_t_".to_string());
    let fits = (1..=30).contains(&prefix.len())
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    assert!(
        fits,
        "SENDONCE_TEST_DB_PREFIX must be 1 to 30 lower-case letters, digits and _, \
         starting with a letter (got {prefix:?})"
    );
    prefix
}

/// Creates an empty Postgres database with the schema applied; returns its URL.
pub async fn fresh_database() -> String {
    fresh_database_on(Backend::Postgres).await
}

/// Creates an empty database of either kind, schema applied; returns its URL.
pub async fn fresh_database_on(backend: Backend) -> String {
    if backend == Backend::Sqlite {
        let path =
            std::env::temp_dir().join(format!("sendonce-t-{}.db", uuid::Uuid::new_v4().simple()));
        let url = format!("sqlite://{}", path.display());
        open_store(&url, Duration::from_secs(5))
            .0
            .migrate()
            .await
            .expect("migrate");
        return url;
    }
    let admin = admin_url();
    let mut conn = PgConnection::connect(&admin)
        .await
        .expect("connect to the test Postgres (set TEST_DATABASE_URL)");
    // The run's prefix, then the test process's id: scripts/test.sh drops
    // only databases under its own prefix whose process is gone, never
    // another run's on the same server.
    let random = uuid::Uuid::new_v4().simple().to_string();
    let name = format!(
        "{}{}_{}",
        database_prefix(),
        std::process::id(),
        &random[..16]
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let mut url = reqwest::Url::parse(&admin).expect("admin URL");
    url.set_path(&name);
    let url = url.to_string();
    // Connecting forks a server process: on a loaded 2-core machine the
    // first connections of a new database took more than the 2 s the tests'
    // stores allow (`migrate: PoolTimedOut`), so the migration waits longer.
    let store = pg_store(&url, Duration::from_secs(20));
    store.migrate().await.expect("migrate");
    url
}

pub fn store_for(url: &str) -> PgStore {
    pg_store(url, Duration::from_secs(2))
}

tokio::task_local! {
    /// Set by `pooler::through_pgbouncer` around a test: every Postgres
    /// store it opens goes through this PgBouncer (`host`, `port`) in
    /// transaction mode, with the database's own URL as the direct one.
    pub static POOLER: (String, u16);
}

fn pg_store(url: &str, acquire_timeout: Duration) -> PgStore {
    let settings = PoolSettings {
        max_connections: 4,
        acquire_timeout,
    };
    match POOLER.try_with(Clone::clone) {
        Ok((host, port)) => {
            let mut pooled = reqwest::Url::parse(url).expect("database URL");
            pooled.set_host(Some(&host)).expect("pooler host");
            pooled.set_port(Some(port)).expect("pooler port");
            PgStore::connect_lazy_via(
                pooled.as_str(),
                sendonce::config::Pooler::Transaction,
                Some(url),
                &settings,
            )
            .expect("store")
        }
        Err(_) => PgStore::connect_lazy(url, &settings).expect("store"),
    }
}

/// A direct handle on a test database, for checks the API cannot make.
#[derive(Clone)]
pub enum Db {
    Pg(PgPool),
    Sqlite(SqlitePool),
}

impl Db {
    /// Runs a query returning one integer (written in SQL both databases speak).
    pub async fn count(&self, sql: &'static str) -> i64 {
        match self {
            Db::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.expect(sql),
            Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.expect(sql),
        }
    }

    /// Every message's status, lease owner, seconds left on its lease (by
    /// the database's clock) and attempts: what a failed wait reports.
    pub async fn lease_report(&self) -> String {
        let report: Result<Option<String>, sqlx::Error> = match self {
            Db::Pg(p) => {
                sqlx::query_scalar(
                    "SELECT string_agg(format('%s owner=%s left=%s attempts=%s', status, \
                        coalesce(lease_owner, '-'), \
                        coalesce(extract(epoch FROM lease_expires_at - now())::text, '-'), \
                        attempts), '; ') FROM messages",
                )
                .fetch_one(p)
                .await
            }
            Db::Sqlite(p) => {
                sqlx::query_scalar(
                    "SELECT group_concat(status || ' owner=' || coalesce(lease_owner, '-') \
                        || ' left=' || coalesce((lease_expires_at \
                        - CAST(unixepoch('subsec') * 1000000 AS INTEGER)) / 1000000.0, '-') \
                        || ' attempts=' || attempts, '; ') FROM messages",
                )
                .fetch_one(p)
                .await
            }
        };
        match report {
            Ok(r) => r.unwrap_or_else(|| "no messages".into()),
            Err(e) => format!("(no report: {e})"),
        }
    }
}

/// Opens the store a URL names, with a direct handle on its database.
pub fn open_store(url: &str, acquire_timeout: Duration) -> (Arc<dyn Store>, Db) {
    match Backend::of(url) {
        Some(Backend::Sqlite) => {
            let s = SqliteStore::connect_lazy(url, 4, acquire_timeout).expect("store");
            let db = Db::Sqlite(s.pool().clone());
            (Arc::new(s), db)
        }
        _ => {
            let s = pg_store(url, acquire_timeout);
            let db = Db::Pg(s.pool().clone());
            (Arc::new(s), db)
        }
    }
}

/// Settings for tests: fast retries and scans, short provider timeouts.
pub fn test_settings() -> Settings {
    let mut s = Settings::default();
    s.delivery.retry.base = Duration::from_millis(10);
    s.delivery.retry.cap = Duration::from_millis(50);
    s.delivery.retry.max_attempts = 5;
    s.delivery.provider_timeout = Duration::from_secs(2);
    s.delivery.lease = Duration::from_secs(10);
    s.scheduler.poll_interval = Duration::from_millis(50);
    s.server.shutdown_grace = Duration::from_secs(2);
    // Abuse limits have tests of their own; elsewhere they would only get in
    // the way of sending many messages to one test number.
    s.limits.rates = sendonce::ratelimit::Limits::NONE;
    s.verify.starts_per_prefix_per_hour = 0;
    s
}

pub struct TestOptions {
    pub backend: Backend,
    pub settings: Settings,
    pub clock: Clock,
    /// Share a database with other instances.
    pub database: Option<String>,
    /// Use this mock (shared with other instances) instead of a new one.
    pub mock: Option<(MockProvider, String)>,
    pub provider_timeout: Duration,
    /// Act as this existing tenant instead of creating a new one.
    pub api_key: Option<String>,
    pub db_acquire_timeout: Option<Duration>,
    /// Builds the provider instead of the `http` one aimed at the mock.
    pub provider: Option<ProviderFactory>,
    /// Serve `/metrics` on a listener of its own (`Handle::metrics_addr`).
    pub separate_metrics: bool,
    /// Providers that take over, in order, after the one above.
    pub fallbacks: Vec<Arc<dyn Provider>>,
}

/// Builds a provider from the mock's base URL (`http://host:port`) and the
/// instance's own, and may adjust the instance's settings.
pub type ProviderFactory = Box<dyn FnOnce(&str, &str, &mut Settings) -> Arc<dyn Provider> + Send>;

impl Default for TestOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Postgres,
            settings: test_settings(),
            clock: Clock::system(),
            database: None,
            mock: None,
            provider_timeout: Duration::from_secs(2),
            api_key: None,
            db_acquire_timeout: None,
            provider: None,
            separate_metrics: false,
            fallbacks: Vec::new(),
        }
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub api_key: String,
    /// The tenant's name (when this instance created it).
    pub tenant: String,
    pub database: String,
    pub db: Db,
    pub handle: Handle,
    pub mock: MockProvider,
    pub mock_url: String,
    pub clock: Clock,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_with(TestOptions::default()).await
}

pub async fn spawn_app_on(backend: Backend) -> TestApp {
    spawn_with(TestOptions {
        backend,
        ..TestOptions::default()
    })
    .await
}

pub async fn spawn_with(opts: TestOptions) -> TestApp {
    sendonce::install_crypto_provider();
    if std::env::var("TEST_LOG").is_ok() {
        sendonce::telemetry::init(sendonce::config::LogFormat::Text);
    }
    let database = match opts.database {
        Some(d) => d,
        None => fresh_database_on(opts.backend).await,
    };
    let (mock, mock_url) = match opts.mock {
        Some(m) => m,
        None => {
            let (mock, url, _) = MockProvider::start().await.expect("mock provider");
            (mock, url)
        }
    };
    let (store, db) = open_store(
        &database,
        opts.db_acquire_timeout.unwrap_or(Duration::from_secs(2)),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut settings = opts.settings;
    let provider: Arc<dyn Provider> = match opts.provider {
        Some(build) => build(
            mock_url.trim_end_matches("/messages"),
            &format!("http://{}", listener.local_addr().expect("address")),
            &mut settings,
        ),
        None => Arc::new(
            HttpProvider::new(
                &mock_url,
                Some("provider-token".into()),
                opts.provider_timeout,
                Duration::from_secs(1),
            )
            .expect("provider"),
        ),
    };
    let tenant = format!("t-{}", uuid::Uuid::new_v4().simple());
    let api_key = match opts.api_key {
        Some(k) => k,
        None => {
            let key = sendonce::apikey::generate();
            store
                .create_tenant(&tenant, &key.stored)
                .await
                .expect("tenant");
            key.secret
        }
    };
    let providers = std::iter::once(provider).chain(opts.fallbacks).collect();
    let mut app =
        App::build_routed(settings, store, providers, opts.clock.clone(), listener).expect("app");
    if opts.separate_metrics {
        let metrics = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        app = app.with_metrics_listener(metrics);
    }
    let handle = app.handle().expect("handle");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        app.run(async {
            let _ = rx.await;
        })
        .await
        .expect("app run");
    });
    // The instance's scheduler scans once as it starts, holding the free
    // send slots while it waits for the database. A test that runs the
    // scheduler itself (`tick`) found no free slot while that first scan
    // was still under way on a loaded machine, and claimed nothing
    // (`campaigns::postgres::a_scheduled_send_waits_for_its_time_and_is_sent_once`:
    // 0 claimed, 1 expected, once in ten runs of the suite; reproduced every
    // time by making the first scan take 1.5 s). So the instance is handed
    // over once that scan is done.
    within(
        Duration::from_secs(30),
        "the instance's scan at start",
        || async { (handle.scheduler.scans() >= 1).then_some(()) },
    )
    .await;
    TestApp {
        base: format!("http://{}", handle.addr),
        client: reqwest::Client::new(),
        api_key,
        tenant,
        database,
        db,
        handle,
        mock,
        mock_url,
        clock: opts.clock,
        shutdown: Some(tx),
        task: Some(task),
    }
}

/// The attempt a reconciliation asks about: started at `since` (on this
/// machine's clock), its sender not recorded.
pub fn attempt_at(since: time::OffsetDateTime) -> sendonce::provider::AttemptRef {
    sendonce::provider::AttemptRef {
        started_at: since,
        age: Duration::try_from(time::OffsetDateTime::now_utc() - since).unwrap_or(Duration::ZERO),
        sender: None,
    }
}

/// A request body for `to` with `body`.
pub fn sms(to: &str, body: &str) -> serde_json::Value {
    serde_json::json!({ "to": to, "body": body })
}

pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub bytes: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.bytes).expect("JSON body")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem slug of an error answer, after checking its media type.
    pub fn slug(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "status {}",
            self.status
        );
        let body = self.json();
        assert_eq!(body["status"].as_u64(), Some(u64::from(self.status)));
        assert!(body["title"].is_string() && body["detail"].is_string());
        body["type"]
            .as_str()
            .and_then(|t| t.strip_prefix("urn:sendonce:problem:"))
            .expect("problem type")
            .to_string()
    }
}

impl TestApp {
    /// Runs this instance's scheduler until it claims something, up to
    /// `limit`: a lease runs out in the database's clock, in real time, not
    /// by moving a test's clock. Returns how many messages it claimed. A
    /// takeover by the instance's own background scheduler counts too: its
    /// first scan runs when its task is first polled, which on a busy
    /// machine can be after the lease ran out (it took the message, and
    /// this loop then found nothing: "failed owner=- attempts=2").
    pub async fn claim_within(&self, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        let before = self.takeovers();
        loop {
            let n = self.handle.scheduler.tick().await.expect("scheduler scan");
            if n > 0 {
                return n;
            }
            let by_loop = self.takeovers().saturating_sub(before);
            if by_loop > 0 {
                return usize::try_from(by_loop).expect("a count");
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "nothing was claimed within {limit:?}; messages: {}",
                    self.db.lease_report().await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// This instance's count of messages taken over from an expired lease.
    pub fn takeovers(&self) -> u64 {
        let text = self.handle.deliverer.metrics().render(0, None);
        text.lines()
            .find_map(|l| l.strip_prefix("sendonce_rescuer_takeovers_total "))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }

    pub async fn post_with(
        &self,
        key: Option<&str>,
        body: &serde_json::Value,
        extra: &[(&str, &str)],
    ) -> Answer {
        let mut req = self
            .client
            .post(format!("{}/messages", self.base))
            .bearer_auth(&self.api_key)
            .json(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        for (name, value) in extra {
            req = req.header(*name, *value);
        }
        answer(req.send().await.expect("POST /messages")).await
    }

    pub async fn post(&self, key: &str, body: &serde_json::Value) -> Answer {
        self.post_with(Some(key), body, &[]).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        let req = self
            .client
            .get(format!("{}{}", self.base, path))
            .bearer_auth(&self.api_key);
        answer(req.send().await.expect("GET")).await
    }

    /// Raw request builder for odd requests.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.base, path))
    }

    /// Puts `sender` on this instance's tenant's list of allowed senders.
    pub async fn allow_sender(&self, sender: &str) {
        let changed = self
            .handle
            .store
            .edit_senders(&self.tenant, sender, true)
            .await
            .expect("edit senders");
        assert_eq!(changed, Some(true), "tenant {} exists", self.tenant);
    }

    /// Rows in `messages`.
    pub async fn message_count(&self) -> i64 {
        self.db.count("SELECT count(*) FROM messages").await
    }

    /// Waits until GET shows the message in `status`.
    pub async fn wait_for_status(&self, key: &str, status: &str) -> serde_json::Value {
        let path = format!("/messages/{key}");
        eventually(&format!("{key} to be {status}"), || async {
            let a = self.get(&path).await;
            (a.status == 200 && a.json()["status"] == status).then(|| a.json())
        })
        .await
    }

    /// Stops the instance gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("app task");
        }
    }

    /// Stops every task of the instance at once, releasing nothing, as a
    /// crash would (the process's database connections stay as they were).
    pub async fn crash(&mut self) {
        self.handle.deliverer.halt().await;
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.shutdown.take();
    }
}

pub async fn answer(resp: reqwest::Response) -> Answer {
    Answer {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        bytes: resp.bytes().await.expect("body").to_vec(),
    }
}

/// Waits until the server at `base` answers `/healthz` with 200.
pub async fn wait_healthy(base: &str) {
    let client = reqwest::Client::new();
    eventually("the server to answer /healthz", || async {
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status() == 200)
            .map(|_| ())
    })
    .await;
}

/// Polls `check` until it yields a value, failing after 10 seconds.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(Duration::from_secs(10), what, check).await
}

/// Polls `count` until it reaches `total`, failing only when it has not
/// moved for `stall`: for work whose speed is the machine's (a thousand
/// sends of a debug build on shared cores), where a deadline for the whole
/// would fail a slow machine and not a stuck one.
pub async fn while_progressing<F, Fut>(what: &str, total: i64, stall: Duration, mut count: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    let mut last = -1;
    let mut moved = tokio::time::Instant::now();
    loop {
        let now = count().await;
        if now >= total {
            return;
        }
        if now != last {
            last = now;
            moved = tokio::time::Instant::now();
        }
        assert!(
            moved.elapsed() < stall,
            "{what}: stuck at {now} of {total} for {stall:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `check` until it yields a value, failing after `limit`.
pub async fn within<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
