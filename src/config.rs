//! Configuration: environment variables and matching `--flags`, validated once
//! at start. An invalid value stops the process with a one-line reason.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::apikey;
use crate::delivery::{DeliverySettings, RetryPolicy};
use crate::http::WaitSettings;
use crate::http::server::ConnectionLimits;
use crate::ratelimit::{Limits, Rate};

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
    /// Inspect delivery receipts.
    Receipts {
        #[command(subcommand)]
        command: ReceiptsCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// List receipts that matched no message, newest first: received at,
    /// provider, provider message id, provider status, event id.
    Unmatched {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its new API key as the only line on stdout.
    Create { name: String },
    /// List tenants.
    List,
    /// Limit a tenant's destinations to these countries (ISO 3166-1 codes,
    /// e.g. `US CA`); with none, allow every country again.
    AllowCountries {
        name: String,
        countries: Vec<String>,
    },
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
    Twilio,
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
    /// Twilio's API address (tests point it at a stand-in).
    #[arg(
        long,
        env = "TWILIO_BASE_URL",
        default_value = crate::provider::twilio::DEFAULT_BASE_URL,
        global = true
    )]
    pub twilio_base_url: String,
    /// Twilio account SID (AC...), the Basic auth user.
    #[arg(long, env = "TWILIO_ACCOUNT_SID", global = true)]
    pub twilio_account_sid: Option<String>,
    /// Twilio auth token: Basic auth password, and the key of X-Twilio-Signature.
    #[arg(long, env = "TWILIO_AUTH_TOKEN", global = true, hide_env_values = true)]
    pub twilio_auth_token: Option<String>,
    /// Default Twilio sender when a request names none.
    #[arg(long, env = "TWILIO_FROM", global = true)]
    pub twilio_from: Option<String>,
    /// Twilio Messaging Service SID (MG...), sent with every message.
    #[arg(long, env = "TWILIO_MESSAGING_SERVICE_SID", global = true)]
    pub twilio_messaging_service_sid: Option<String>,
    /// This service's public base URL (https://sms.example.com): receipt
    /// callbacks are built from it and Twilio signatures are checked against it.
    #[arg(long, env = "SENDONCE_PUBLIC_URL", global = true)]
    pub public_url: Option<String>,
    /// Shared secret the `http` provider sends in `X-Receipt-Secret` with receipts.
    #[arg(
        long,
        env = "SENDONCE_RECEIPT_SECRET",
        global = true,
        hide_env_values = true
    )]
    pub receipt_secret: Option<String>,
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
    /// Log message bodies (off: bodies may hold one-time codes).
    #[arg(
        long,
        env = "SENDONCE_LOG_BODIES",
        default_value_t = false,
        global = true
    )]
    pub log_bodies: bool,
    /// Most SMS segments one message may take.
    #[arg(
        long,
        env = "SENDONCE_MAX_SEGMENTS",
        default_value_t = 10,
        global = true
    )]
    pub max_segments: u32,
    /// POST /messages per tenant per second, steady rate (0: no limit).
    #[arg(
        long,
        env = "SENDONCE_RATE_TENANT_RPS",
        default_value_t = 100,
        global = true
    )]
    pub rate_tenant_rps: u32,
    /// POST /messages per tenant in a burst.
    #[arg(
        long,
        env = "SENDONCE_RATE_TENANT_BURST",
        default_value_t = 200,
        global = true
    )]
    pub rate_tenant_burst: u32,
    /// New messages per destination number per hour, per tenant (0: no limit).
    #[arg(
        long,
        env = "SENDONCE_RATE_NUMBER_PER_HOUR",
        default_value_t = 10,
        global = true
    )]
    pub rate_number_per_hour: u32,
    /// New messages per destination prefix (number less its last 4 digits) per hour, per tenant (0: no limit).
    #[arg(
        long,
        env = "SENDONCE_RATE_PREFIX_PER_HOUR",
        default_value_t = 100,
        global = true
    )]
    pub rate_prefix_per_hour: u32,
    /// The whole request head must arrive within this, in ms (slow clients are cut off).
    #[arg(
        long,
        env = "SENDONCE_HEADER_READ_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub header_read_timeout_ms: u64,
    /// The whole request body must arrive within this, in ms.
    #[arg(
        long,
        env = "SENDONCE_BODY_READ_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub body_read_timeout_ms: u64,
}

/// `prefix` and 32 hex digits (Twilio SIDs).
fn is_sid(value: &str, prefix: &str) -> bool {
    value.len() == 34
        && value.starts_with(prefix)
        && value[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The Twilio provider and receipt settings.
impl ConfigArgs {
    /// `SENDONCE_PUBLIC_URL` without a trailing slash.
    fn public_url(&self) -> Result<Option<String>, String> {
        let Some(url) = self.public_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        match reqwest::Url::parse(url) {
            Ok(u)
                if matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.query().is_none() =>
            {
                Ok(Some(url.trim_end_matches('/').to_string()))
            }
            _ => {
                Err("SENDONCE_PUBLIC_URL is not an http(s) URL like https://sms.example.com".into())
            }
        }
    }

    fn twilio(
        &self,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<crate::provider::TwilioSettings, String> {
        let nonempty = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let account_sid = nonempty(&self.twilio_account_sid)
            .ok_or("SENDONCE_PROVIDER=twilio needs TWILIO_ACCOUNT_SID")?;
        if !is_sid(&account_sid, "AC") {
            return Err("TWILIO_ACCOUNT_SID must be AC followed by 32 hex digits".into());
        }
        let auth_token = nonempty(&self.twilio_auth_token)
            .ok_or("SENDONCE_PROVIDER=twilio needs TWILIO_AUTH_TOKEN")?;
        let messaging_service_sid = nonempty(&self.twilio_messaging_service_sid);
        if messaging_service_sid
            .as_deref()
            .is_some_and(|s| !is_sid(s, "MG"))
        {
            return Err("TWILIO_MESSAGING_SERVICE_SID must be MG followed by 32 hex digits".into());
        }
        let from = nonempty(&self.twilio_from);
        if from.is_none() && messaging_service_sid.is_none() {
            return Err(
                "SENDONCE_PROVIDER=twilio needs TWILIO_FROM or TWILIO_MESSAGING_SERVICE_SID".into(),
            );
        }
        match reqwest::Url::parse(&self.twilio_base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => return Err("TWILIO_BASE_URL is not an http(s) URL".into()),
        }
        Ok(crate::provider::TwilioSettings {
            base_url: self.twilio_base_url.clone(),
            account_sid,
            auth_token,
            from,
            messaging_service_sid,
            status_callback: self
                .public_url()?
                .map(|base| format!("{base}{}", crate::http::receipts::TWILIO_STATUS_PATH)),
            timeout,
            connect_timeout,
        })
    }

    fn receipts(&self) -> Result<crate::http::receipts::ReceiptSettings, String> {
        let secret = self.receipt_secret.clone().filter(|s| !s.is_empty());
        if secret.as_deref().is_some_and(|s| s.len() < 16) {
            return Err("SENDONCE_RECEIPT_SECRET must be at least 16 characters".into());
        }
        Ok(crate::http::receipts::ReceiptSettings {
            public_url: self.public_url()?,
            twilio_auth_token: self.twilio_auth_token.clone().filter(|t| !t.is_empty()),
            http_secret: secret,
        })
    }
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
    Twilio(crate::provider::TwilioSettings),
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
    /// How delivery receipts are authenticated.
    pub receipts: crate::http::receipts::ReceiptSettings,
    pub connection: ConnectionLimits,
    pub limits: Limits,
    pub max_segments: u32,
    pub log_bodies: bool,
    pub body_read_timeout: Duration,
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
            receipts: crate::http::receipts::ReceiptSettings::default(),
            connection: ConnectionLimits::default(),
            limits: Limits {
                tenant: Rate {
                    capacity: 200,
                    per: Duration::from_secs(2),
                },
                number: Rate {
                    capacity: 10,
                    per: Duration::from_secs(3600),
                },
                prefix: Rate {
                    capacity: 100,
                    per: Duration::from_secs(3600),
                },
            },
            max_segments: 10,
            log_bodies: false,
            body_read_timeout: Duration::from_secs(10),
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
            ProviderKind::Twilio => {
                ProviderConfig::Twilio(self.twilio(provider_timeout, connect_timeout)?)
            }
        };
        let receipts = self.receipts()?;
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
                receipts,
                connection: ConnectionLimits {
                    header_read_timeout: Duration::from_millis(positive(
                        "SENDONCE_HEADER_READ_TIMEOUT_MS",
                        self.header_read_timeout_ms,
                    )?),
                    ..ConnectionLimits::default()
                },
                limits: Limits {
                    tenant: tenant_rate(self.rate_tenant_rps, self.rate_tenant_burst)?,
                    number: hourly(self.rate_number_per_hour),
                    prefix: hourly(self.rate_prefix_per_hour),
                },
                max_segments: if self.max_segments == 0 {
                    return Err("SENDONCE_MAX_SEGMENTS must be at least 1".into());
                } else {
                    self.max_segments
                },
                log_bodies: self.log_bodies,
                body_read_timeout: Duration::from_millis(positive(
                    "SENDONCE_BODY_READ_TIMEOUT_MS",
                    self.body_read_timeout_ms,
                )?),
            },
            db_max_connections: self.db_max_connections,
            db_acquire_timeout: Duration::from_millis(positive(
                "SENDONCE_DB_ACQUIRE_TIMEOUT_MS",
                self.db_acquire_timeout_ms,
            )?),
        })
    }
}

/// A per-hour limit (0: none).
fn hourly(n: u32) -> Rate {
    if n == 0 {
        Rate::UNLIMITED
    } else {
        Rate {
            capacity: n,
            per: Duration::from_secs(3600),
        }
    }
}

/// A steady rate with a burst: the bucket holds `burst` and refills at `rps`.
fn tenant_rate(rps: u32, burst: u32) -> Result<Rate, String> {
    if rps == 0 {
        return Ok(Rate::UNLIMITED);
    }
    if burst < rps {
        return Err("SENDONCE_RATE_TENANT_BURST must not be below SENDONCE_RATE_TENANT_RPS".into());
    }
    Ok(Rate {
        capacity: burst,
        per: Duration::from_secs_f64(f64::from(burst) / f64::from(rps)),
    })
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

    #[test]
    fn twilio_and_receipt_settings() {
        let sid = "AC0123456789abcdef0123456789abcdef";
        let twilio = ["--provider", "twilio", "--twilio-account-sid", sid];
        let mut ok = twilio.to_vec();
        ok.extend([
            "--twilio-auth-token",
            "tok",
            "--twilio-from",
            "+14155550000",
            "--public-url",
            "https://sms.example.com/",
            "--receipt-secret",
            "0123456789abcdef",
        ]);
        let c = args(&ok).unwrap();
        let ProviderConfig::Twilio(t) = &c.provider else {
            panic!("{:?}", c.provider);
        };
        assert_eq!(t.base_url, "https://api.twilio.com");
        assert_eq!(
            t.status_callback.as_deref(),
            Some("https://sms.example.com/providers/twilio/status")
        );
        assert!(!format!("{:?}", c.provider).contains("tok\""));
        let r = &c.settings.receipts;
        assert_eq!(r.public_url.as_deref(), Some("https://sms.example.com"));
        assert_eq!(r.twilio_auth_token.as_deref(), Some("tok"));
        assert_eq!(r.http_secret.as_deref(), Some("0123456789abcdef"));

        let with = |extra: &[&'static str]| {
            let mut v = twilio.to_vec();
            v.extend_from_slice(extra);
            args(&v)
        };
        for (extra, want) in [
            (&["--twilio-from", "+1"][..], "TWILIO_AUTH_TOKEN"),
            (&["--twilio-auth-token", "t"][..], "TWILIO_FROM"),
            (
                &[
                    "--twilio-auth-token",
                    "t",
                    "--twilio-messaging-service-sid",
                    "MG1",
                ][..],
                "TWILIO_MESSAGING_SERVICE_SID",
            ),
            (
                &[
                    "--twilio-auth-token",
                    "t",
                    "--twilio-from",
                    "+1",
                    "--twilio-base-url",
                    "ftp://x",
                ][..],
                "TWILIO_BASE_URL",
            ),
            (
                &[
                    "--twilio-auth-token",
                    "t",
                    "--twilio-from",
                    "+1",
                    "--public-url",
                    "nope",
                ][..],
                "SENDONCE_PUBLIC_URL",
            ),
        ] {
            let err = with(extra).unwrap_err();
            assert!(err.contains(want), "{extra:?}: {err}");
        }
        let err = args(&["--provider", "twilio", "--twilio-account-sid", "AC12"]).unwrap_err();
        assert!(err.contains("TWILIO_ACCOUNT_SID"), "{err}");
        let err = args(&["--receipt-secret", "short"]).unwrap_err();
        assert!(err.contains("SENDONCE_RECEIPT_SECRET"), "{err}");
    }
}
