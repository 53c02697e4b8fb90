//! The HTTP server: address, connection limits, request timeouts, how long a
//! request waits for its outcome, the public URL, shutdown.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::apikey;

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError};

/// Limits a connection must keep to.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// The whole request head must arrive within this.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes.
    pub max_head_bytes: usize,
    /// Most connections open at once; further clients wait in the
    /// listen backlog until one closes.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
            max_connections: 1024,
        }
    }
}

/// How long a request may wait for a send's outcome.
#[derive(Clone, Debug)]
pub struct WaitSettings {
    /// Default wait when the client states no preference.
    pub default: Duration,
    /// Largest wait a client may ask for with `Prefer: wait=N`.
    pub max: Duration,
}

#[derive(Clone)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    /// Where `GET /metrics` is served instead of `listen`; `None`: on `listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// Handed to `http::server::serve`: header timeout, head size, and how
    /// many connections are served at once.
    pub connection: ConnectionLimits,
    /// The whole request body must arrive within this.
    pub body_read_timeout: Duration,
    /// On SIGTERM, how long in-flight work may finish.
    pub shutdown_grace: Duration,
    pub wait: WaitSettings,
    /// `SENDONCE_PUBLIC_URL` without a trailing slash: where providers call
    /// back (receipts), and what they sign.
    pub public_url: Option<String>,
    /// Ensures tenant `default` accepts exactly this key.
    pub bootstrap_api_key: Option<String>,
}

/// The bootstrap key stays out of logs.
impl std::fmt::Debug for ServerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSettings")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field("connection", &self.connection)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("wait", &self.wait)
            .field("public_url", &self.public_url)
            .field(
                "bootstrap_api_key",
                &self.bootstrap_api_key.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            metrics_listen: None,
            connection: ConnectionLimits::default(),
            body_read_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(20),
            wait: WaitSettings {
                default: Duration::from_secs(10),
                max: Duration::from_secs(30),
            },
            public_url: None,
            bootstrap_api_key: None,
        }
    }
}

const HEADER_READ_TIMEOUT: DurationVar = DurationVar {
    var: "SENDONCE_HEADER_READ_TIMEOUT",
    old: "SENDONCE_HEADER_READ_TIMEOUT_MS",
    unit: Unit::Millis,
};
const BODY_READ_TIMEOUT: DurationVar = DurationVar {
    var: "SENDONCE_BODY_READ_TIMEOUT",
    old: "SENDONCE_BODY_READ_TIMEOUT_MS",
    unit: Unit::Millis,
};
const SHUTDOWN_GRACE: DurationVar = DurationVar {
    var: "SENDONCE_SHUTDOWN_GRACE",
    old: "SENDONCE_SHUTDOWN_GRACE_SECS",
    unit: Unit::Secs,
};
const SYNC_WAIT: DurationVar = DurationVar {
    var: "SENDONCE_SYNC_WAIT",
    old: "SENDONCE_SYNC_WAIT_MS",
    unit: Unit::Millis,
};
const MAX_WAIT: DurationVar = DurationVar {
    var: "SENDONCE_MAX_WAIT",
    old: "SENDONCE_MAX_WAIT_MS",
    unit: Unit::Millis,
};

/// `SENDONCE_PUBLIC_URL` without a trailing slash.
pub(super) fn public_url(a: &ConfigArgs) -> Result<Option<String>, ConfigError> {
    let Some(url) = given(&a.public_url) else {
        return Ok(None);
    };
    let bad = |source| ConfigError::Url {
        var: "SENDONCE_PUBLIC_URL",
        expected: "an http(s) URL like https://sms.example.com",
        source,
    };
    let u = reqwest::Url::parse(url).map_err(|e| bad(Some(e.into())))?;
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() || u.query().is_some() {
        return Err(bad(None));
    }
    Ok(Some(url.trim_end_matches('/').to_string()))
}

impl ServerSettings {
    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        let listen = match given(&a.listen) {
            None => d.listen,
            Some(v) => v.parse().map_err(|source| ConfigError::Address {
                var: "SENDONCE_LISTEN",
                value: v.to_string(),
                source,
            })?,
        };
        let metrics_listen = match given(&a.metrics_listen) {
            None => d.metrics_listen,
            Some(v) => Some(v.parse().map_err(|source| ConfigError::Address {
                var: "SENDONCE_METRICS_LISTEN",
                value: v.to_string(),
                source,
            })?),
        };
        if metrics_listen == Some(listen) {
            return Err(ConfigError::invalid(
                "SENDONCE_METRICS_LISTEN",
                "must differ from SENDONCE_LISTEN",
            ));
        }
        let max_connections = number_or(
            "SENDONCE_MAX_CONNECTIONS",
            &a.max_connections,
            d.connection.max_connections,
        )?;
        if max_connections == 0 {
            return Err(ConfigError::invalid(
                "SENDONCE_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        let header_read_timeout = positive_duration(
            HEADER_READ_TIMEOUT,
            &a.header_read_timeout,
            &a.header_read_timeout_ms,
            d.connection.header_read_timeout,
        )?
        .value;
        let wait_default =
            super::parse::duration(SYNC_WAIT, &a.sync_wait, &a.sync_wait_ms, d.wait.default)?;
        let wait_max = super::parse::duration(MAX_WAIT, &a.max_wait, &a.max_wait_ms, d.wait.max)?;
        if wait_max.value < wait_default.value {
            return Err(ConfigError::invalid(
                wait_max.var,
                format!("must not be below {}", wait_default.var),
            ));
        }
        let bootstrap_api_key = a.bootstrap_api_key.clone();
        if let Some(key) = &bootstrap_api_key
            && !apikey::well_formed(key)
        {
            return Err(ConfigError::invalid(
                "SENDONCE_BOOTSTRAP_API_KEY",
                format!(
                    "must start with so_ and have at least {} more letters, digits, - or _",
                    apikey::MIN_KEY_LEN - apikey::PREFIX.len()
                ),
            ));
        }
        // A bootstrap key is live with every scope: one that reads as a
        // test-mode key would be shown and taken for one (issue 41, finding 10).
        if let Some(key) = &bootstrap_api_key
            && key.starts_with(apikey::TEST_PREFIX)
        {
            return Err(ConfigError::invalid(
                "SENDONCE_BOOTSTRAP_API_KEY",
                format!(
                    "starts with {}, which marks a test-mode key, but the bootstrap key is a \
                     live key with every scope: use a key starting so_ but not {} (sendonce key \
                     create makes one; make test keys with the admin API's \"test\": true)",
                    apikey::TEST_PREFIX,
                    apikey::TEST_PREFIX
                ),
            ));
        }
        if let Some(key) = &bootstrap_api_key
            && apikey::estimated_bits(key) < apikey::MIN_BOOTSTRAP_BITS
        {
            return Err(ConfigError::invalid(
                "SENDONCE_BOOTSTRAP_API_KEY",
                format!(
                    "looks typed, not random (about {:.0} random bits, at least {:.0} needed): \
                     use 32 random base64url characters after so_ (sendonce key create makes one)",
                    apikey::estimated_bits(key),
                    apikey::MIN_BOOTSTRAP_BITS
                ),
            ));
        }
        Ok(Self {
            listen,
            metrics_listen,
            connection: ConnectionLimits {
                header_read_timeout,
                max_connections,
                ..d.connection
            },
            body_read_timeout: positive_duration(
                BODY_READ_TIMEOUT,
                &a.body_read_timeout,
                &a.body_read_timeout_ms,
                d.body_read_timeout,
            )?
            .value,
            shutdown_grace: super::parse::duration(
                SHUTDOWN_GRACE,
                &a.shutdown_grace,
                &a.shutdown_grace_secs,
                d.shutdown_grace,
            )?
            .value,
            wait: WaitSettings {
                default: wait_default.value,
                max: wait_max.value,
            },
            public_url: public_url(a)?,
            bootstrap_api_key,
        })
    }
}
