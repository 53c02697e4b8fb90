//! The `smpp` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::super::registry::{Adapter, Channel, Configured, Context, Var, VarError, Vars};
use super::super::{Provider, ProviderError};
use super::SmppProvider;

/// The `smpp` adapter in the registry. Its receipts arrive as `deliver_sm`
/// on its own sessions, not over HTTP: no receipt route.
pub const ADAPTER: Adapter = Adapter {
    name: "smpp",
    vars: &VARS,
    configure,
    receipts: None,
    channel: Channel::Sms,
    verify: None,
};

pub const HOST: &str = "SMPP_HOST";
pub const PORT: &str = "SMPP_PORT";
pub const SYSTEM_ID: &str = "SMPP_SYSTEM_ID";
pub const PASSWORD: &str = "SMPP_PASSWORD";
pub const SYSTEM_TYPE: &str = "SMPP_SYSTEM_TYPE";
pub const SOURCE_ADDR: &str = "SMPP_SOURCE_ADDR";
pub const TLS: &str = "SMPP_TLS";
pub const TLS_CA_FILE: &str = "SMPP_TLS_CA_FILE";
pub const BINDS: &str = "SMPP_BINDS";
pub const WINDOW: &str = "SMPP_WINDOW";
pub const RATE: &str = "SMPP_RATE";
pub const RESPONSE_TIMEOUT: &str = "SMPP_RESPONSE_TIMEOUT";
pub const ENQUIRE_LINK_INTERVAL: &str = "SMPP_ENQUIRE_LINK_INTERVAL";

const fn var(env: &'static str, flag: &'static str, help: &'static str) -> Var {
    Var {
        env,
        flag,
        help,
        secret: false,
    }
}

const VARS: [Var; 13] = [
    var(HOST, "smpp-host", "SMSC host name or address"),
    var(PORT, "smpp-port", "SMSC port (default 2775)"),
    var(SYSTEM_ID, "smpp-system-id", "SMPP system_id of the account"),
    Var {
        env: PASSWORD,
        flag: "smpp-password",
        help: "SMPP password of the account",
        secret: true,
    },
    var(SYSTEM_TYPE, "smpp-system-type", "SMPP system_type (default empty)"),
    var(
        SOURCE_ADDR,
        "smpp-source-addr",
        "Default source address when a request names no from",
    ),
    var(TLS, "smpp-tls", "Connect with TLS: true or false (default false)"),
    var(
        TLS_CA_FILE,
        "smpp-tls-ca-file",
        "PEM file of the CA certificates to trust for SMPP_TLS instead of the platform's roots",
    ),
    var(
        BINDS,
        "smpp-binds",
        "Transceiver sessions per instance (default 1)",
    ),
    var(
        WINDOW,
        "smpp-window",
        "Requests awaiting their response per session (default 10)",
    ),
    var(RATE, "smpp-rate", "submit_sm per second per instance (default 50)"),
    var(
        RESPONSE_TIMEOUT,
        "smpp-response-timeout",
        "Wait for a response, seconds (default 30); none: the send is ambiguous",
    ),
    var(
        ENQUIRE_LINK_INTERVAL,
        "smpp-enquire-link-interval",
        "Seconds between enquire_link (default 30)",
    ),
];

/// What the adapter needs to know.
#[derive(Clone)]
pub struct SmppSettings {
    pub host: String,
    pub port: u16,
    pub system_id: String,
    pub password: String,
    pub system_type: String,
    pub source_addr: Option<String>,
    pub tls: bool,
    /// `SMPP_TLS_CA_FILE`: trust these CA certificates (PEM) instead of
    /// the platform's roots (an SMSC with a private CA; the tests' own).
    pub tls_ca_file: Option<String>,
    pub binds: usize,
    pub window: usize,
    /// Submits per second per instance.
    pub rate: u32,
    pub response_timeout: Duration,
    pub enquire_link_interval: Duration,
    /// Connecting.
    pub connect_timeout: Duration,
    /// The most a send waits before its first submit is written (a bound
    /// session, a turn under the rate, room in the window); past it the
    /// send is retryable, nothing written. A quarter of the service's
    /// provider call timeout, so the wait never reads as "no answer".
    pub queue_wait: Duration,
}

impl SmppSettings {
    /// The defaults, for `host:port` and an account (tests).
    pub fn new(host: &str, port: u16, system_id: &str, password: &str) -> Self {
        SmppSettings {
            host: host.into(),
            port,
            system_id: system_id.into(),
            password: password.into(),
            system_type: String::new(),
            source_addr: None,
            tls: false,
            tls_ca_file: None,
            binds: 1,
            window: 10,
            rate: 50,
            response_timeout: Duration::from_secs(30),
            enquire_link_interval: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            queue_wait: Duration::from_millis(500),
        }
    }
}

impl std::fmt::Debug for SmppSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmppSettings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("system_id", &self.system_id)
            .field("password", &"***")
            .field("system_type", &self.system_type)
            .field("source_addr", &self.source_addr)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("binds", &self.binds)
            .field("window", &self.window)
            .field("rate", &self.rate)
            .field("response_timeout", &self.response_timeout)
            .field("enquire_link_interval", &self.enquire_link_interval)
            .field("queue_wait", &self.queue_wait)
            .finish()
    }
}

fn number<T: std::str::FromStr + PartialOrd + Copy>(
    vars: &Vars,
    var: &'static str,
    default: T,
    min: T,
    max: T,
    what: &str,
) -> Result<T, VarError> {
    match vars.get(var) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(VarError::invalid(var, format!("must be {what}"))),
        },
    }
}

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let needed_by = "SENDONCE_PROVIDER=smpp";
    let required = |var: &'static str| vars.get(var).ok_or(VarError::Missing { var, needed_by });
    let host = required(HOST)?;
    let system_id = required(SYSTEM_ID)?;
    if system_id.len() > 15 {
        return Err(VarError::invalid(SYSTEM_ID, "must be at most 15 characters"));
    }
    let password = required(PASSWORD)?;
    if password.len() > 8 {
        return Err(VarError::invalid(PASSWORD, "must be at most 8 characters"));
    }
    let system_type = vars.get(SYSTEM_TYPE).unwrap_or("");
    if system_type.len() > 12 {
        return Err(VarError::invalid(
            SYSTEM_TYPE,
            "must be at most 12 characters",
        ));
    }
    let tls = match vars.get(TLS).map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(VarError::invalid(TLS, "must be true or false")),
    };
    let tls_ca_file = vars.get(TLS_CA_FILE).map(str::to_string);
    if let Some(path) = &tls_ca_file {
        ca_certificates(path).map_err(|e| VarError::invalid(TLS_CA_FILE, e))?;
    }
    let secs = |var, default| -> Result<Duration, VarError> {
        number::<u64>(vars, var, default, 1, 3600, "whole seconds from 1 to 3600")
            .map(Duration::from_secs)
    };
    Ok(Arc::new(SmppSettings {
        host: host.to_string(),
        port: number(vars, PORT, 2775, 1, u16::MAX, "a port number")?,
        system_id: system_id.to_string(),
        password: password.to_string(),
        system_type: system_type.to_string(),
        source_addr: vars.get(SOURCE_ADDR).map(str::to_string),
        tls,
        tls_ca_file,
        binds: number(vars, BINDS, 1, 1, 64, "from 1 to 64")?,
        window: number(vars, WINDOW, 10, 1, 1000, "from 1 to 1000")?,
        rate: number(vars, RATE, 50, 1, 100_000, "from 1 to 100000")?,
        response_timeout: secs(RESPONSE_TIMEOUT, 30)?,
        enquire_link_interval: secs(ENQUIRE_LINK_INTERVAL, 30)?,
        connect_timeout: ctx.connect_timeout.max(Duration::from_secs(1)),
        queue_wait: ctx.timeout / 4,
    }))
}

impl Configured for SmppSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(SmppProvider::new(self.clone())))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The certificates of a PEM file, at least one.
pub fn ca_certificates(
    path: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {path}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path} holds no certificate"));
    }
    Ok(certs)
}
