//! The database: which one, and its connection pool.

use std::time::Duration;

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError, Pooler};

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

#[derive(Clone)]
pub struct DatabaseSettings {
    /// `postgres://...` or `sqlite://...` (checked: [`Backend::of`] knows it).
    pub url: String,
    /// Connections per instance.
    pub max_connections: u32,
    /// How long a request waits for a connection before answering 503.
    pub acquire_timeout: Duration,
    /// What sits between sendonce and Postgres at `url`.
    pub pooler: Pooler,
    /// A direct connection's URL for what needs a session of its own
    /// (LISTEN, migrations, acknowledgements); `None`: `url` itself.
    /// Required with [`Pooler::Transaction`].
    pub direct_url: Option<String>,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            // Created if missing, in the working directory.
            url: "sqlite://sendonce.db".into(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(2),
            pooler: Pooler::None,
            direct_url: None,
        }
    }
}

/// The URL's password stays out of logs.
impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("pooler", &self.pooler)
            .field("direct_url", &self.direct_url.as_deref().map(redact_url))
            .finish()
    }
}

const ACQUIRE_TIMEOUT: DurationVar = DurationVar {
    var: "SENDONCE_DB_ACQUIRE_TIMEOUT",
    old: "SENDONCE_DB_ACQUIRE_TIMEOUT_MS",
    unit: Unit::Millis,
};

impl DatabaseSettings {
    pub fn backend(&self) -> Backend {
        // `from_args` refuses any other URL; a hand-built one defaults to SQLite.
        Backend::of(&self.url).unwrap_or(Backend::Sqlite)
    }

    pub(super) fn from_args(a: &ConfigArgs, d: &Self) -> Result<Self, ConfigError> {
        let url = given(&a.database_url).map_or_else(|| d.url.clone(), |u| u.trim().to_string());
        if Backend::of(&url).is_none() {
            return Err(ConfigError::Url {
                var: "DATABASE_URL",
                expected: "a postgres:// or sqlite:// URL",
                source: None,
            });
        }
        let max_connections = number_or(
            "SENDONCE_DB_MAX_CONNECTIONS",
            &a.db_max_connections,
            d.max_connections,
        )?;
        if max_connections == 0 {
            return Err(ConfigError::invalid(
                "SENDONCE_DB_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        let pooler = a.database_pooler.unwrap_or(d.pooler);
        let direct_url = given(&a.database_direct_url)
            .map(|u| u.trim().to_string())
            .or_else(|| d.direct_url.clone());
        check_direct(&url, pooler, direct_url.as_deref())?;
        Ok(Self {
            url,
            pooler,
            direct_url,
            max_connections,
            acquire_timeout: positive_duration(
                ACQUIRE_TIMEOUT,
                &a.db_acquire_timeout,
                &a.db_acquire_timeout_ms,
                d.acquire_timeout,
            )?
            .value,
        })
    }
}

/// A direct URL must be a Postgres one, and a transaction pooler needs
/// one: LISTEN, the migrations' advisory lock and the acknowledgements'
/// listener live in a session, which a transaction pooler does not keep.
fn check_direct(url: &str, pooler: Pooler, direct_url: Option<&str>) -> Result<(), ConfigError> {
    const VAR: &str = "SENDONCE_DATABASE_DIRECT_URL";
    let postgres = Backend::of(url) == Some(Backend::Postgres);
    match direct_url {
        Some(direct) if Backend::of(direct) != Some(Backend::Postgres) => Err(ConfigError::Url {
            var: VAR,
            expected: "a postgres:// URL",
            source: None,
        }),
        Some(_) if !postgres => Err(ConfigError::invalid(
            VAR,
            "only applies when DATABASE_URL is a postgres:// URL",
        )),
        None if pooler == Pooler::Transaction => Err(ConfigError::invalid(
            VAR,
            "is required with SENDONCE_DATABASE_POOLER=transaction (LISTEN and migrations need a session of their own)",
        )),
        _ if pooler == Pooler::Transaction && !postgres => Err(ConfigError::invalid(
            "SENDONCE_DATABASE_POOLER",
            "transaction only applies when DATABASE_URL is a postgres:// URL",
        )),
        _ => Ok(()),
    }
}

/// The database URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            // libpq and sqlx also take the password (and the client key's
            // passphrase) as query parameters.
            let secret = |k: &str| {
                k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword")
            };
            if u.query_pairs().any(|(k, _)| secret(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret(&k) {
                            "***".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "<unparseable URL>".into(),
    }
}
