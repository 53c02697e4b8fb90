//! Configuration: environment variables and matching `--flags`, validated once
//! at start. An invalid value stops the process with a one-line reason.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::apikey;
use crate::delivery::{DeliverySettings, RetryPolicy};
use crate::http::WaitSettings;

#[derive(Debug, Parser)]
#[command(
    name = "sendonce",
    version,
    about = "Exactly-once SMS/OTP sending over HTTP"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API (the default). Applies pending migrations first.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Manage API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its new API key as the only line on stdout.
    Create { name: String },
    /// List tenants.
    List,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create another API key for a tenant and print it as the only line on stdout.
    Create { tenant: String },
    /// Revoke an API key by its id (see `key list`); it is refused at once.
    Revoke { key_id: uuid::Uuid },
    /// List API keys (id, tenant, prefix, state), never the keys themselves.
    List,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    Simulated,
    Http,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, Args)]
pub struct ConfigArgs {
    /// postgres://user:password@host/db, or sqlite://path (default: sqlite://sendonce.db,
    /// created if missing, in the working directory).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Address to listen on.
    #[arg(
        long,
        env = "SENDONCE_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: String,
    /// SMS provider.
    #[arg(
        long,
        env = "SENDONCE_PROVIDER",
        value_enum,
        default_value = "simulated",
        global = true
    )]
    pub provider: ProviderKind,
    /// URL the `http` provider POSTs to.
    #[arg(long, env = "SENDONCE_HTTP_PROVIDER_URL", global = true)]
    pub http_provider_url: Option<String>,
    /// Bearer token for the `http` provider.
    #[arg(
        long,
        env = "SENDONCE_HTTP_PROVIDER_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub http_provider_token: Option<String>,
    /// Ensures tenant `default` exists with exactly this API key.
    #[arg(
        long,
        env = "SENDONCE_BOOTSTRAP_API_KEY",
        global = true,
        hide_env_values = true
    )]
    pub bootstrap_api_key: Option<String>,
    /// Ceiling of the first retry's delay (full jitter below it), in ms.
    #[arg(
        long,
        env = "SENDONCE_RETRY_BASE_MS",
        default_value_t = 500,
        global = true
    )]
    pub retry_base_ms: u64,
    /// Largest delay between two attempts, in ms.
    #[arg(
        long,
        env = "SENDONCE_RETRY_CAP_MS",
        default_value_t = 60_000,
        global = true
    )]
    pub retry_cap_ms: u64,
    /// Attempts in all, the first included.
    #[arg(
        long,
        env = "SENDONCE_RETRY_MAX_ATTEMPTS",
        default_value_t = 6,
        global = true
    )]
    pub retry_max_attempts: u32,
    /// No attempt starts later than this after a message was accepted, in seconds.
    #[arg(
        long,
        env = "SENDONCE_RETRY_DEADLINE_SECS",
        default_value_t = 900,
        global = true
    )]
    pub retry_deadline_secs: u64,
    /// Largest provider Retry-After honoured, in seconds.
    #[arg(
        long,
        env = "SENDONCE_RETRY_AFTER_MAX_SECS",
        default_value_t = 900,
        global = true
    )]
    pub retry_after_max_secs: u64,
    /// Upper bound of one provider call, in ms.
    #[arg(
        long,
        env = "SENDONCE_PROVIDER_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub provider_timeout_ms: u64,
    /// Upper bound of connecting to the provider, in ms.
    #[arg(
        long,
        env = "SENDONCE_PROVIDER_CONNECT_TIMEOUT_MS",
        default_value_t = 3_000,
        global = true
    )]
    pub provider_connect_timeout_ms: u64,
    /// Simultaneous provider calls per instance; more wait their turn.
    #[arg(
        long,
        env = "SENDONCE_MAX_CONCURRENT_SENDS",
        default_value_t = 64,
        global = true
    )]
    pub max_concurrent_sends: usize,
    /// How long POST /messages waits for the outcome by default, in ms.
    #[arg(
        long,
        env = "SENDONCE_SYNC_WAIT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub sync_wait_ms: u64,
    /// Largest wait a client may ask for with `Prefer: wait=N`, in ms.
    #[arg(
        long,
        env = "SENDONCE_MAX_WAIT_MS",
        default_value_t = 30_000,
        global = true
    )]
    pub max_wait_ms: u64,
    /// Lease on a message being delivered, in seconds.
    #[arg(long, env = "SENDONCE_LEASE_SECS", default_value_t = 30, global = true)]
    pub lease_secs: u64,
    /// How often each instance looks for due retries and expired leases, in ms.
    #[arg(
        long,
        env = "SENDONCE_POLL_INTERVAL_MS",
        default_value_t = 1_000,
        global = true
    )]
    pub poll_interval_ms: u64,
    /// Messages are kept this many days, then purged and their keys free again.
    #[arg(
        long,
        env = "SENDONCE_RETENTION_DAYS",
        default_value_t = 30,
        global = true
    )]
    pub retention_days: u64,
    /// How often the purge runs, in seconds.
    #[arg(
        long,
        env = "SENDONCE_PURGE_INTERVAL_SECS",
        default_value_t = 3_600,
        global = true
    )]
    pub purge_interval_secs: u64,
    /// On SIGTERM, how long in-flight sends may finish before their leases are released, in seconds.
    #[arg(
        long,
        env = "SENDONCE_SHUTDOWN_GRACE_SECS",
        default_value_t = 20,
        global = true
    )]
    pub shutdown_grace_secs: u64,
    /// Database connections per instance.
    #[arg(
        long,
        env = "SENDONCE_DB_MAX_CONNECTIONS",
        default_value_t = 16,
        global = true
    )]
    pub db_max_connections: u32,
    /// How long a request waits for a database connection before answering 503, in ms.
    #[arg(
        long,
        env = "SENDONCE_DB_ACQUIRE_TIMEOUT_MS",
        default_value_t = 2_000,
        global = true
    )]
    pub db_acquire_timeout_ms: u64,
    /// Log format.
    #[arg(
        long,
        env = "SENDONCE_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
}

/// Where messages are kept when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://sendonce.db";

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of(url: &str) -> Option<Backend> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Some(Backend::Sqlite)
        } else {
            None
        }
    }
}

/// Validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    pub listen: SocketAddr,
    pub provider: ProviderConfig,
    pub bootstrap_api_key: Option<String>,
    pub settings: Settings,
    pub db_max_connections: u32,
    pub db_acquire_timeout: Duration,
}

#[derive(Clone, Debug)]
pub enum ProviderConfig {
    Simulated,
    Http {
        url: String,
        token: Option<String>,
        timeout: Duration,
        connect_timeout: Duration,
    },
}

/// What a running app needs besides its store, provider and listener.
#[derive(Clone, Debug)]
pub struct Settings {
    pub delivery: DeliverySettings,
    pub wait: WaitSettings,
    pub poll_interval: Duration,
    pub retention: Duration,
    pub purge_interval: Duration,
    pub shutdown_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            delivery: DeliverySettings {
                retry: RetryPolicy::default(),
                lease: Duration::from_secs(30),
                provider_timeout: Duration::from_secs(10),
                max_concurrent_sends: 64,
            },
            wait: WaitSettings {
                default: Duration::from_secs(10),
                max: Duration::from_secs(30),
            },
            poll_interval: Duration::from_secs(1),
            retention: Duration::from_secs(30 * 86_400),
            purge_interval: Duration::from_secs(3_600),
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

impl ConfigArgs {
    /// Validates everything; the error is one line naming the setting.
    pub fn validate(&self) -> Result<Config, String> {
        let database_url = self
            .database_url
            .clone()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_string());
        if Backend::of(&database_url).is_none() {
            return Err("DATABASE_URL must be a postgres:// or sqlite:// URL".into());
        }
        let listen: SocketAddr = self.listen.parse().map_err(|_| {
            "SENDONCE_LISTEN is not a socket address like 127.0.0.1:8080".to_string()
        })?;
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(format!("{name} must be greater than 0"))
            } else {
                Ok(v)
            }
        };
        let provider_timeout = Duration::from_millis(positive(
            "SENDONCE_PROVIDER_TIMEOUT_MS",
            self.provider_timeout_ms,
        )?);
        let connect_timeout = Duration::from_millis(positive(
            "SENDONCE_PROVIDER_CONNECT_TIMEOUT_MS",
            self.provider_connect_timeout_ms,
        )?);
        let provider = match self.provider {
            ProviderKind::Simulated => ProviderConfig::Simulated,
            ProviderKind::Http => {
                let url = self
                    .http_provider_url
                    .clone()
                    .filter(|u| !u.is_empty())
                    .ok_or("SENDONCE_PROVIDER=http needs SENDONCE_HTTP_PROVIDER_URL")?;
                match reqwest::Url::parse(&url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    _ => return Err("SENDONCE_HTTP_PROVIDER_URL is not an http(s) URL".into()),
                }
                ProviderConfig::Http {
                    url,
                    token: self.http_provider_token.clone().filter(|t| !t.is_empty()),
                    timeout: provider_timeout,
                    connect_timeout,
                }
            }
        };
        if let Some(key) = &self.bootstrap_api_key
            && !apikey::well_formed(key)
        {
            return Err(format!(
                "SENDONCE_BOOTSTRAP_API_KEY must start with so_ and have at least {} more letters, digits, - or _",
                apikey::MIN_KEY_LEN - apikey::PREFIX.len()
            ));
        }
        let lease = Duration::from_secs(positive("SENDONCE_LEASE_SECS", self.lease_secs)?);
        if lease < provider_timeout * 2 + Duration::from_secs(2) {
            return Err(
                "SENDONCE_LEASE_SECS must be at least twice SENDONCE_PROVIDER_TIMEOUT_MS plus 2 s, \
                 so a lease always outlives a provider call"
                    .into(),
            );
        }
        let base = Duration::from_millis(positive("SENDONCE_RETRY_BASE_MS", self.retry_base_ms)?);
        let cap = Duration::from_millis(positive("SENDONCE_RETRY_CAP_MS", self.retry_cap_ms)?);
        if cap < base {
            return Err("SENDONCE_RETRY_CAP_MS must not be below SENDONCE_RETRY_BASE_MS".into());
        }
        if self.retry_max_attempts == 0 {
            return Err("SENDONCE_RETRY_MAX_ATTEMPTS must be at least 1".into());
        }
        let wait_default = Duration::from_millis(self.sync_wait_ms);
        let wait_max = Duration::from_millis(self.max_wait_ms);
        if wait_max < wait_default {
            return Err("SENDONCE_MAX_WAIT_MS must not be below SENDONCE_SYNC_WAIT_MS".into());
        }
        if self.max_concurrent_sends == 0 {
            return Err("SENDONCE_MAX_CONCURRENT_SENDS must be at least 1".into());
        }
        if self.db_max_connections == 0 {
            return Err("SENDONCE_DB_MAX_CONNECTIONS must be at least 1".into());
        }
        let days = positive("SENDONCE_RETENTION_DAYS", self.retention_days)?;
        Ok(Config {
            database_url,
            listen,
            provider,
            bootstrap_api_key: self.bootstrap_api_key.clone(),
            settings: Settings {
                delivery: DeliverySettings {
                    retry: RetryPolicy {
                        base,
                        cap,
                        max_attempts: self.retry_max_attempts,
                        deadline: Duration::from_secs(positive(
                            "SENDONCE_RETRY_DEADLINE_SECS",
                            self.retry_deadline_secs,
                        )?),
                        max_retry_after: Duration::from_secs(self.retry_after_max_secs),
                    },
                    lease,
                    provider_timeout,
                    max_concurrent_sends: self.max_concurrent_sends,
                },
                wait: WaitSettings {
                    default: wait_default,
                    max: wait_max,
                },
                poll_interval: Duration::from_millis(positive(
                    "SENDONCE_POLL_INTERVAL_MS",
                    self.poll_interval_ms,
                )?),
                retention: Duration::from_secs(days.saturating_mul(86_400)),
                purge_interval: Duration::from_secs(positive(
                    "SENDONCE_PURGE_INTERVAL_SECS",
                    self.purge_interval_secs,
                )?),
                shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            },
            db_max_connections: self.db_max_connections,
            db_acquire_timeout: Duration::from_millis(positive(
                "SENDONCE_DB_ACQUIRE_TIMEOUT_MS",
                self.db_acquire_timeout_ms,
            )?),
        })
    }
}

/// The database URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable URL>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_database_is_an_sqlite_file() {
        let c = Cli::try_parse_from(["sendonce"]).unwrap().config;
        let c = ConfigArgs {
            database_url: None,
            ..c
        }
        .validate()
        .unwrap();
        assert_eq!(c.database_url, "sqlite://sendonce.db");
        assert_eq!(Backend::of(&c.database_url), Some(Backend::Sqlite));
        assert_eq!(Backend::of("mysql://x"), None);
    }

    fn args(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["sendonce", "--database-url", "postgres://u:secret@h/db"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .config
            .validate()
    }

    #[test]
    fn defaults_are_valid() {
        let c = args(&[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert!(matches!(c.provider, ProviderConfig::Simulated));
        assert_eq!(c.settings.wait.default, Duration::from_secs(10));
        assert_eq!(c.settings.retention, Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn invalid_settings_are_one_line_reasons() {
        for (extra, want) in [
            (&["--listen", "nope"][..], "SENDONCE_LISTEN"),
            (&["--provider", "http"][..], "SENDONCE_HTTP_PROVIDER_URL"),
            (
                &["--provider", "http", "--http-provider-url", "ftp://x"][..],
                "SENDONCE_HTTP_PROVIDER_URL",
            ),
            (
                &["--bootstrap-api-key", "short"][..],
                "SENDONCE_BOOTSTRAP_API_KEY",
            ),
            (&["--lease-secs", "5"][..], "SENDONCE_LEASE_SECS"),
            (
                &["--retry-max-attempts", "0"][..],
                "SENDONCE_RETRY_MAX_ATTEMPTS",
            ),
            (&["--sync-wait-ms", "60000"][..], "SENDONCE_MAX_WAIT_MS"),
        ] {
            let err = args(extra).unwrap_err();
            assert!(err.contains(want), "{extra:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }
}
