//! The SMS provider: which one, and its address and credentials.

use std::time::Duration;

use crate::delivery::CircuitPolicy;
use crate::provider::TwilioSettings;
use crate::provider::twilio::DEFAULT_BASE_URL;

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError, ProviderKind};

/// A provider ready to be built.
#[derive(Clone)]
pub enum ProviderConfig {
    Simulated,
    Http {
        url: String,
        token: Option<String>,
        timeout: Duration,
        connect_timeout: Duration,
    },
    Twilio(TwilioSettings),
}

/// Tokens stay out of logs.
impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderConfig::Simulated => f.write_str("Simulated"),
            ProviderConfig::Http {
                url,
                token,
                timeout,
                connect_timeout,
            } => f
                .debug_struct("Http")
                .field("url", url)
                .field("token", &token.as_ref().map(|_| "***"))
                .field("timeout", timeout)
                .field("connect_timeout", connect_timeout)
                .finish(),
            ProviderConfig::Twilio(t) => f.debug_tuple("Twilio").field(t).finish(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ProviderSettings {
    /// The primary provider.
    pub kind: ProviderConfig,
    /// The providers that take over, in order, when the one before certainly
    /// did not send a message.
    pub fallbacks: Vec<ProviderConfig>,
    /// When a provider's circuit opens, and for how long.
    pub circuit: CircuitPolicy,
    /// Upper bound of connecting to the provider (the upper bound of a whole
    /// call is `delivery.provider_timeout`).
    pub connect_timeout: Duration,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            kind: ProviderConfig::Simulated,
            fallbacks: Vec::new(),
            circuit: CircuitPolicy::default(),
            connect_timeout: Duration::from_secs(3),
        }
    }
}

const CONNECT_TIMEOUT: DurationVar = DurationVar {
    var: "SENDONCE_PROVIDER_CONNECT_TIMEOUT",
    old: "SENDONCE_PROVIDER_CONNECT_TIMEOUT_MS",
    unit: Unit::Millis,
};

/// `prefix` and 32 hex digits (Twilio SIDs).
fn is_sid(value: &str, prefix: &str) -> bool {
    value.len() == 34
        && value.starts_with(prefix)
        && value[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn http_url(var: &'static str, url: &str, need_host: bool) -> Result<(), ConfigError> {
    let bad = |source| ConfigError::Url {
        var,
        expected: "an http(s) URL",
        source,
    };
    let u = reqwest::Url::parse(url).map_err(|e| bad(Some(e.into())))?;
    if !matches!(u.scheme(), "http" | "https") || (need_host && u.host().is_none()) {
        return Err(bad(None));
    }
    Ok(())
}

impl ProviderSettings {
    /// `timeout` is the resolved upper bound of one provider call.
    pub(super) fn from_args(
        a: &ConfigArgs,
        d: &Self,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let connect_timeout = positive_duration(
            CONNECT_TIMEOUT,
            &a.provider_connect_timeout,
            &a.provider_connect_timeout_ms,
            d.connect_timeout,
        )?
        .value;
        let mut kinds: Vec<ProviderConfig> = Vec::new();
        for (i, k) in a.provider.iter().enumerate() {
            if a.provider[..i].contains(k) {
                return Err(ConfigError::invalid(
                    "SENDONCE_PROVIDER",
                    "names a provider twice",
                ));
            }
            kinds.push(one(a, *k, timeout, connect_timeout)?);
        }
        let (kind, fallbacks) = if kinds.is_empty() {
            (d.kind.clone(), d.fallbacks.clone())
        } else {
            let kind = kinds.remove(0);
            (kind, kinds)
        };
        let circuit = circuit(a, &d.circuit)?;
        Ok(Self {
            kind,
            fallbacks,
            circuit,
            connect_timeout,
        })
    }

    /// Every provider, the primary first.
    pub fn all(&self) -> Vec<&ProviderConfig> {
        std::iter::once(&self.kind).chain(&self.fallbacks).collect()
    }
}

/// One provider of the list, configured by its own variables.
fn one(
    a: &ConfigArgs,
    kind: ProviderKind,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<ProviderConfig, ConfigError> {
    Ok(match kind {
        ProviderKind::Simulated => ProviderConfig::Simulated,
        ProviderKind::Http => {
            let url = given(&a.http_provider_url).ok_or(ConfigError::Missing {
                var: "SENDONCE_HTTP_PROVIDER_URL",
                needed_by: "SENDONCE_PROVIDER=http",
            })?;
            http_url("SENDONCE_HTTP_PROVIDER_URL", url, false)?;
            ProviderConfig::Http {
                url: url.to_string(),
                token: given(&a.http_provider_token).map(str::to_string),
                timeout,
                connect_timeout,
            }
        }
        ProviderKind::Twilio => ProviderConfig::Twilio(twilio(a, timeout, connect_timeout)?),
    })
}

fn circuit_duration(
    var: &'static str,
    v: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some(v) = given(v) else {
        return Ok(default);
    };
    humantime::parse_duration(v.trim()).map_err(|source| ConfigError::Duration {
        var,
        value: v.to_string(),
        source,
    })
}

fn circuit(a: &ConfigArgs, d: &CircuitPolicy) -> Result<CircuitPolicy, ConfigError> {
    let c = CircuitPolicy {
        failures: number_or("SENDONCE_CIRCUIT_FAILURES", &a.circuit_failures, d.failures)?,
        window: circuit_duration("SENDONCE_CIRCUIT_WINDOW", &a.circuit_window, d.window)?,
        open_for: circuit_duration("SENDONCE_CIRCUIT_OPEN_FOR", &a.circuit_open_for, d.open_for)?,
        refresh: circuit_duration("SENDONCE_CIRCUIT_REFRESH", &a.circuit_refresh, d.refresh)?,
    };
    if c.window.is_zero() {
        return Err(ConfigError::invalid(
            "SENDONCE_CIRCUIT_WINDOW",
            "must be greater than 0",
        ));
    }
    if c.open_for.is_zero() {
        return Err(ConfigError::invalid(
            "SENDONCE_CIRCUIT_OPEN_FOR",
            "must be greater than 0",
        ));
    }
    Ok(c)
}

fn twilio(
    a: &ConfigArgs,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<TwilioSettings, ConfigError> {
    let needed_by = "SENDONCE_PROVIDER=twilio";
    let account_sid = given(&a.twilio_account_sid).ok_or(ConfigError::Missing {
        var: "TWILIO_ACCOUNT_SID",
        needed_by,
    })?;
    if !is_sid(account_sid, "AC") {
        return Err(ConfigError::invalid(
            "TWILIO_ACCOUNT_SID",
            "must be AC followed by 32 hex digits",
        ));
    }
    let auth_token = given(&a.twilio_auth_token).ok_or(ConfigError::Missing {
        var: "TWILIO_AUTH_TOKEN",
        needed_by,
    })?;
    let messaging_service_sid = given(&a.twilio_messaging_service_sid);
    if messaging_service_sid.is_some_and(|s| !is_sid(s, "MG")) {
        return Err(ConfigError::invalid(
            "TWILIO_MESSAGING_SERVICE_SID",
            "must be MG followed by 32 hex digits",
        ));
    }
    let from = given(&a.twilio_from);
    if from.is_none() && messaging_service_sid.is_none() {
        return Err(ConfigError::Missing {
            var: "TWILIO_FROM or TWILIO_MESSAGING_SERVICE_SID",
            needed_by,
        });
    }
    let base_url = given(&a.twilio_base_url).unwrap_or(DEFAULT_BASE_URL);
    http_url("TWILIO_BASE_URL", base_url, true)?;
    Ok(TwilioSettings {
        base_url: base_url.to_string(),
        account_sid: account_sid.to_string(),
        auth_token: auth_token.to_string(),
        from: from.map(str::to_string),
        messaging_service_sid: messaging_service_sid.map(str::to_string),
        status_callback: super::server::public_url(a)?
            .map(|base| format!("{base}{}", crate::provider::twilio::STATUS_CALLBACK_PATH)),
        timeout,
        connect_timeout,
    })
}
