//! Connecting to the writable one of several Postgres hosts, the libpq way.
//!
//! `DATABASE_URL` may name several hosts,
//! `postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`
//! (`primary` is accepted too). sqlx takes one host per set of connect
//! options, so the URL is split into one [`PgConnectOptions`] per host and
//! the pool is pointed at one of them at a time:
//!
//! - every new connection is checked (`after_connect`): with
//!   `target_session_attrs` set, a server in recovery or read-only is
//!   refused, so no statement ever runs on a standby through a fresh
//!   connection, and the monitor is woken;
//! - a monitor task probes the current host every [`PROBE_EVERY`] over its
//!   own connection; when the host is gone (or, with
//!   `target_session_attrs`, no longer writable) it walks the hosts in
//!   order, and points the pool at the first one that will do
//!   (the pool's pending connects pick the new options up on their next try);
//! - idle connections opened before a switch are dropped on acquire
//!   (`before_acquire` compares their age with the time since the switch,
//!   no round trip).
//!
//! A statement that still reaches a demoted server fails there (Postgres
//! refuses writes in recovery: SQLSTATE 25006, mapped to "unavailable"),
//! and the caller takes the outage path: a fenced finishing write is
//! retried while its lease lasts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::Notify;

use crate::store::ConnectionStats;

/// How often the monitor checks that the current host is still writable.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The least time the monitor gives a host to connect and answer before
/// looking elsewhere: a busy primary is not a gone one.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What `DATABASE_URL` asks for: the hosts in order, and whether only a
/// writable server will do.
#[derive(Debug, Clone)]
pub struct Targets {
    pub hosts: Vec<PgConnectOptions>,
    pub writable_only: bool,
}

/// The query parameters the Postgres driver (sqlx) reads. It logs any other
/// one at WARN *with its value* ("ignoring unrecognized connect
/// parameter"), which would put an `sslpassword` in the logs: those are
/// dropped before the driver sees them, and named without their value.
const DRIVER_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// A Postgres URL split per host ([`split_url`]).
#[derive(Debug, PartialEq, Eq)]
pub struct SplitUrl {
    /// One URL per host, in order.
    pub urls: Vec<String>,
    /// `target_session_attrs=read-write` or `primary`.
    pub writable_only: bool,
    /// Parameters dropped because the driver does not read them (their
    /// names, never their values).
    pub ignored: Vec<String>,
}

/// Splits a (possibly multi-host) Postgres URL into one URL per host, reads
/// `target_session_attrs`, and drops the parameters the driver does not
/// read. Pure: tested as a table.
pub fn split_url(url: &str) -> Result<SplitUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "a postgres URL needs a scheme".to_string())?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let mut writable_only = false;
    let mut kept = Vec::new();
    let mut ignored = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => match value {
                "any" => writable_only = false,
                "read-write" | "primary" => writable_only = true,
                other => {
                    return Err(format!(
                        "target_session_attrs={other} is not supported: use read-write, primary or any"
                    ));
                }
            },
            _ if pair.is_empty() => {}
            _ => {
                let key = form_urlencoded::parse(pair.as_bytes())
                    .next()
                    .map(|(k, _)| k.into_owned())
                    .unwrap_or_default();
                if DRIVER_PARAMS.contains(&key.as_str()) || key.starts_with("options[") {
                    kept.push(pair);
                } else {
                    ignored.push(key);
                }
            }
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let hosts: Vec<&str> = if hostlist.is_empty() {
        vec![""]
    } else {
        hostlist.split(',').collect()
    };
    if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
        return Err("an empty host in the host list".to_string());
    }
    let urls = hosts
        .iter()
        .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
        .collect();
    Ok(SplitUrl {
        urls,
        writable_only,
        ignored,
    })
}

impl Targets {
    pub fn parse(url: &str) -> Result<Self, sqlx::Error> {
        let split = split_url(url).map_err(|e| sqlx::Error::Configuration(e.into()))?;
        for key in &split.ignored {
            // The name only: a value may be a secret (sslpassword).
            tracing::warn!(
                parameter = %key,
                "ignoring a database URL parameter the Postgres driver does not read"
            );
        }
        let writable_only = split.writable_only;
        let hosts = split
            .urls
            .iter()
            .map(|u| u.parse::<PgConnectOptions>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            hosts,
            writable_only,
        })
    }
}

/// The hosts, which one the pool uses, and the counts; shared by the pool's
/// hooks, the monitor and the store.
#[derive(Debug)]
pub struct HostState {
    targets: Targets,
    current: AtomicUsize,
    switched_at: Mutex<Option<Instant>>,
    connections_opened: AtomicU64,
    host_switches: AtomicU64,
    wake: Notify,
}

impl HostState {
    pub fn new(targets: Targets) -> Self {
        Self {
            targets,
            current: AtomicUsize::new(0),
            switched_at: Mutex::new(None),
            connections_opened: AtomicU64::new(0),
            host_switches: AtomicU64::new(0),
            wake: Notify::new(),
        }
    }

    pub fn current_options(&self) -> &PgConnectOptions {
        let i = self.current.load(Ordering::Acquire);
        &self.targets.hosts[i.min(self.targets.hosts.len() - 1)]
    }

    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            connections_opened: self.connections_opened.load(Ordering::Relaxed),
            host_switches: self.host_switches.load(Ordering::Relaxed),
        }
    }

    fn switch_to(&self, i: usize) {
        self.current.store(i, Ordering::Release);
        *self
            .switched_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.host_switches.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a connection `age` old was opened before the last switch.
    fn predates_switch(&self, age: Duration) -> bool {
        self.switched_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| age > at.elapsed())
    }
}

/// Whether a server will do: answers, and (with `target_session_attrs`)
/// accepts writes.
async fn usable(conn: &mut PgConnection, writable_only: bool) -> Result<bool, sqlx::Error> {
    if writable_only {
        writable(conn).await
    } else {
        conn.ping().await.map(|()| true)
    }
}

/// Whether the server accepts writes: not in recovery, not read-only.
pub async fn writable(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: bool = sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(conn)
    .await?;
    Ok(!read_only)
}

/// Adds the checks to the pool options.
pub fn hook(options: PgPoolOptions, state: &Arc<HostState>) -> PgPoolOptions {
    let on_connect = Arc::clone(state);
    let options = options.after_connect(move |conn, _meta| {
        let state = Arc::clone(&on_connect);
        Box::pin(async move {
            state.connections_opened.fetch_add(1, Ordering::Relaxed);
            if state.targets.writable_only && !writable(conn).await? {
                state.wake.notify_one();
                return Err(sqlx::Error::Protocol(
                    "the server does not accept writes (target_session_attrs)".into(),
                ));
            }
            Ok(())
        })
    });
    if state.targets.hosts.len() < 2 {
        return options;
    }
    let on_acquire = Arc::clone(state);
    options.before_acquire(move |_conn, meta| {
        let keep = !on_acquire.predates_switch(meta.age);
        Box::pin(async move { Ok(keep) })
    })
}

/// Starts the monitor when there is more than one host to choose from. It
/// ends when the pool is closed.
pub fn spawn_monitor(pool: &PgPool, state: &Arc<HostState>, connect_timeout: Duration) {
    if state.targets.hosts.len() < 2 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no runtime: the Postgres host monitor is not running");
        return;
    };
    runtime.spawn(monitor(pool.clone(), Arc::clone(state), connect_timeout));
}

async fn monitor(pool: PgPool, state: Arc<HostState>, connect_timeout: Duration) {
    let closed = pool.close_event();
    tokio::pin!(closed);
    let mut probe: Option<PgConnection> = None;
    loop {
        let current = state.current.load(Ordering::Acquire);
        if !probe_ok(&mut probe, &state.targets, current, connect_timeout).await {
            probe = None;
            if let Some((found, conn)) = find_usable(&state.targets, current, connect_timeout).await
            {
                probe = Some(conn);
                if found != current {
                    tracing::warn!(
                        from = %host_of(&state.targets.hosts[current]),
                        to = %host_of(&state.targets.hosts[found]),
                        "Postgres: switching host"
                    );
                    pool.set_connect_options(state.targets.hosts[found].clone());
                    state.switch_to(found);
                }
            }
        }
        tokio::select! {
            () = &mut closed => return,
            () = state.wake.notified() => {}
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

fn host_of(o: &PgConnectOptions) -> String {
    format!("{}:{}", o.get_host(), o.get_port())
}

/// Whether the probe connection (opened if needed) sees a usable server.
async fn probe_ok(
    probe: &mut Option<PgConnection>,
    targets: &Targets,
    current: usize,
    connect_timeout: Duration,
) -> bool {
    if probe.is_none() {
        *probe = connect(&targets.hosts[current], connect_timeout).await;
    }
    match probe {
        Some(conn) => matches!(
            tokio::time::timeout(connect_timeout, usable(conn, targets.writable_only)).await,
            Ok(Ok(true))
        ),
        None => false,
    }
}

async fn connect(host: &PgConnectOptions, timeout: Duration) -> Option<PgConnection> {
    match tokio::time::timeout(timeout, host.connect()).await {
        Ok(Ok(conn)) => Some(conn),
        _ => None,
    }
}

/// The first usable host, trying those after `current` first and
/// `current` last, with a connection to it.
async fn find_usable(
    targets: &Targets,
    current: usize,
    timeout: Duration,
) -> Option<(usize, PgConnection)> {
    let n = targets.hosts.len();
    for step in 1..=n {
        let i = (current + step) % n;
        let Some(mut conn) = connect(&targets.hosts[i], timeout).await else {
            continue;
        };
        if matches!(
            tokio::time::timeout(timeout, usable(&mut conn, targets.writable_only)).await,
            Ok(Ok(true))
        ) {
            return Some((i, conn));
        }
        let _ = conn.close().await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls_split_per_host() {
        let table: &[(&str, &[&str], bool)] = &[
            (
                "postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write",
                &["postgres://u:p@h1:5432/db", "postgres://u:p@h2:5433/db"],
                true,
            ),
            (
                "postgresql://h1,h2/db?sslmode=disable&target_session_attrs=primary&application_name=x",
                &[
                    "postgresql://h1/db?sslmode=disable&application_name=x",
                    "postgresql://h2/db?sslmode=disable&application_name=x",
                ],
                true,
            ),
            ("postgres://u@h:5432/db", &["postgres://u@h:5432/db"], false),
            (
                "postgres://u@[::1]:5432,h2?target_session_attrs=any",
                &["postgres://u@[::1]:5432", "postgres://u@h2"],
                false,
            ),
            (
                "postgres://a@b@h1,h2/db",
                &["postgres://a@b@h1/db", "postgres://a@b@h2/db"],
                false,
            ),
        ];
        for (url, hosts, writable_only) in table {
            let got = split_url(url).expect(url);
            assert_eq!(&got.urls, hosts, "{url}");
            assert_eq!(got.writable_only, *writable_only, "{url}");
            assert!(got.ignored.is_empty(), "{url}");
        }
    }

    #[test]
    fn parameters_the_driver_does_not_read_are_dropped_by_name() {
        let got = split_url(
            "postgres://u@h/db?sslkey=/k.pem&sslpassword=hunter2&ssl%70assword=x&sslcrl=/c&options[a]=b&connect_timeout=5",
        )
        .expect("a URL");
        assert_eq!(got.urls, ["postgres://u@h/db?sslkey=/k.pem&options[a]=b"]);
        assert_eq!(
            got.ignored,
            ["sslpassword", "sslpassword", "sslcrl", "connect_timeout"]
        );
    }

    /// Finding 10 of issue 29: the driver logged `sslpassword`'s value at
    /// WARN. Whatever the level, no log line of a parse holds it.
    #[test]
    fn no_log_of_a_parse_holds_the_sslpassword() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || sink.clone())
            .finish();
        let parsed = tracing::subscriber::with_default(subscriber, || {
            super::Targets::parse(
                "postgres://u:pw@h1,h2/db?sslmode=require&sslpassword=s3cr3t-Value&sslcert=/c.pem",
            )
        });
        let targets = parsed.expect("parsed");
        assert_eq!(targets.hosts.len(), 2);
        let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains("sslpassword"), "named: {logged}");
        assert!(!logged.contains("s3cr3t-Value"), "{logged}");
    }

    #[test]
    fn unsupported_attrs_and_empty_hosts_are_refused() {
        for url in [
            "postgres://h1,h2/db?target_session_attrs=standby",
            "postgres://h1,h2/db?target_session_attrs=read-only",
            "postgres://h1,,h2/db",
            "no-scheme",
        ] {
            assert!(split_url(url).is_err(), "{url}");
        }
    }
}
