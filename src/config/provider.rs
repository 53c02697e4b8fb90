//! The SMS providers: which ones, in order, each configured by its own
//! variables (read by its adapter, `src/provider/registry.rs`), their
//! receipt endpoints, and the circuit breaker.

use std::sync::Arc;
use std::time::Duration;

use crate::delivery::CircuitPolicy;
use crate::delivery::destinations::Routes;
use crate::provider::registry::ReceiptRoutes;
use crate::provider::registry::{self, Configured, Context, VarError};

use super::parse::{DurationVar, Unit, given, number_or, positive_duration};
use super::{ConfigArgs, ConfigError};

/// A provider ready to be built: its adapter's settings.
pub type ProviderConfig = Arc<dyn Configured>;

#[derive(Clone, Debug)]
pub struct ProviderSettings {
    /// The primary provider.
    pub kind: ProviderConfig,
    /// The providers that take over, in order, when the one before certainly
    /// did not send a message.
    pub fallbacks: Vec<ProviderConfig>,
    /// Routes by destination (`SENDONCE_ROUTES`): then `kind` and
    /// `fallbacks` are every provider the routes name.
    pub routes: Option<Routes>,
    /// The adapters of channels of their own that are on (a Telegram bot,
    /// when `TELEGRAM_BOT_TOKEN` is set): each carries its channel's
    /// addresses only, beside the SMS providers above.
    pub channels: Vec<ProviderConfig>,
    /// The inbound routes of channels of their own that are configured
    /// (the Telegram bot's updates: a bot token and
    /// `TELEGRAM_WEBHOOK_SECRET`; else refused).
    pub inbound: Vec<Arc<dyn registry::InboundRoute>>,
    /// Every adapter's receipt endpoint (whether it sends or not: receipts
    /// arrive after a provider left the list).
    pub receipts: ReceiptRoutes,
    /// When a provider's circuit opens, and for how long.
    pub circuit: CircuitPolicy,
    /// Route orders that follow measured quality (`SENDONCE_ROUTE_QUALITY*`).
    pub quality: super::quality::QualitySettings,
    /// Upper bound of connecting to the provider (the upper bound of a whole
    /// call is `delivery.provider_timeout`).
    pub connect_timeout: Duration,
    /// Every adapter secret configured: taken out of provider answers
    /// before a tenant or a log sees them.
    pub secrets: crate::provider::Secrets,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            kind: Arc::new(crate::provider::SimulatedProvider::default()),
            fallbacks: Vec::new(),
            routes: None,
            channels: Vec::new(),
            inbound: Vec::new(),
            receipts: ReceiptRoutes::default(),
            circuit: CircuitPolicy::default(),
            quality: super::quality::QualitySettings::default(),
            connect_timeout: Duration::from_secs(3),
            secrets: crate::provider::Secrets::default(),
        }
    }
}

impl From<VarError> for ConfigError {
    fn from(e: VarError) -> Self {
        match e {
            VarError::Missing { var, needed_by } => ConfigError::Missing { var, needed_by },
            VarError::Url {
                var,
                expected,
                source,
            } => ConfigError::Url {
                var,
                expected,
                source,
            },
            VarError::Invalid { var, reason } => ConfigError::Invalid { var, reason },
        }
    }
}

const CONNECT_TIMEOUT: DurationVar = DurationVar {
    var: "SENDONCE_PROVIDER_CONNECT_TIMEOUT",
    old: "SENDONCE_PROVIDER_CONNECT_TIMEOUT_MS",
    unit: Unit::Millis,
};

impl ProviderSettings {
    /// `timeout` is the resolved upper bound of one provider call,
    /// `retry_deadline` the resolved `SENDONCE_RETRY_DEADLINE`.
    pub(super) fn from_args(
        a: &ConfigArgs,
        d: &Self,
        timeout: Duration,
        retry_deadline: Duration,
    ) -> Result<Self, ConfigError> {
        let connect_timeout = positive_duration(
            CONNECT_TIMEOUT,
            &a.provider_connect_timeout,
            &a.provider_connect_timeout_ms,
            d.connect_timeout,
        )?
        .value;
        let ctx = Context {
            timeout,
            connect_timeout,
            public_url: super::server::public_url(a)?,
            log_bodies: a.log_bodies,
            retry_deadline,
        };
        let vars = &a.adapters.0;
        // None listed: the default list, configured by the same variables
        // (SENDONCE_LOG_BODIES reaches the default simulated provider).
        let routes = match given(&a.routes) {
            Some(_) if !a.provider.is_empty() => {
                return Err(ConfigError::invalid(
                    "SENDONCE_ROUTES",
                    "replaces SENDONCE_PROVIDER: set only one of them",
                ));
            }
            Some(v) => Some(
                Routes::parse(v, |name| registry::sms_adapter(name).map(|a| a.name)).map_err(
                    |e| ConfigError::invalid("SENDONCE_ROUTES", format!("is refused: {e}")),
                )?,
            ),
            None => None,
        };
        let names: Vec<&str> = if let Some(r) = &routes {
            r.providers()
        } else if a.provider.is_empty() {
            std::iter::once(&d.kind)
                .chain(&d.fallbacks)
                .map(|p| p.name())
                .collect()
        } else {
            a.provider.iter().map(String::as_str).collect()
        };
        let mut kinds: Vec<ProviderConfig> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ConfigError::invalid(
                    "SENDONCE_PROVIDER",
                    "names a provider twice",
                ));
            }
            let adapter = registry::sms_adapter(name).ok_or_else(|| {
                let why = match registry::adapter(name).map(|a| a.channel) {
                    Some(registry::Channel::Own { enabled_by, .. }) => format!(
                        "names {name:?}, a channel of its own and not an SMS provider: \
                         it is on when {enabled_by} is set"
                    ),
                    _ => format!("names no provider {name:?}"),
                };
                ConfigError::invalid("SENDONCE_PROVIDER", why)
            })?;
            let configured = (adapter.configure)(vars, &ctx).map_err(|e| match (&routes, e) {
                // The routes asked for it, not SENDONCE_PROVIDER.
                (Some(_), registry::VarError::Missing { var, .. }) => {
                    ConfigError::invalid(var, format!("is needed: SENDONCE_ROUTES names {name}"))
                }
                (_, e) => ConfigError::from(e),
            })?;
            kinds.push(configured);
        }
        if kinds.is_empty() {
            return Err(ConfigError::invalid(
                "SENDONCE_PROVIDER",
                "names no provider",
            ));
        }
        let kind = kinds.remove(0);
        let fallbacks = kinds;
        let channels = registry::channel_adapters(vars, &ctx)?;
        let inbound = registry::inbound_routes(vars)?;
        let receipts = ReceiptRoutes::configure(vars, &ctx)?;
        let circuit = circuit(a, &d.circuit)?;
        let quality = super::quality::from_args(a, &d.quality)?;
        Ok(Self {
            quality,
            kind,
            fallbacks,
            routes,
            channels,
            inbound,
            receipts,
            circuit,
            connect_timeout,
            secrets: crate::provider::Secrets::from_vars(vars),
        })
    }

    /// Every provider, the primary first, then the channels of their own.
    pub fn all(&self) -> Vec<&ProviderConfig> {
        std::iter::once(&self.kind)
            .chain(&self.fallbacks)
            .chain(&self.channels)
            .collect()
    }
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
