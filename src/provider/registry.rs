//! The one list of adapters, and what an adapter hands the rest of the
//! service.
//!
//! An adapter is one folder under `src/provider/` and its name in the
//! `adapters!` list of `src/provider/mod.rs` ([`ADAPTERS`]). Its [`Adapter`] says everything the service needs to know
//! about it, and nothing outside the folder names it:
//!
//! - `name`: the word in `SENDONCE_PROVIDER`, the name stored with messages,
//!   attempts and receipts, and the `provider` label of the metrics;
//! - `vars`: the variables it reads, each also a `--flag` (the command line
//!   is built from them);
//! - `configure`: parses its variables into its settings when
//!   `SENDONCE_PROVIDER` names it; the settings build the client
//!   ([`Configured::build`], a [`Provider`]), which sends, classifies the
//!   answer and reconciles;
//! - `receipts`: its receipt endpoint, if it has one: a path, and a parser
//!   that authenticates a request and reads the receipt out of it
//!   ([`ReceiptRoute`]). It is set up whether or not the adapter sends
//!   (receipts for messages it sent arrive after it left the list).
//!
//! How an adapter keeps its promise of exactly once is its own:
//! [`Provider::dedupes_by_key`] (the provider de-duplicates on our message
//! id, so a resend after an ambiguous answer is safe) and
//! [`Provider::reconcile`] (it can be asked afterwards whether it sent;
//! those that cannot answer `Unknown`). Its testkit mock is one module of
//! `testkit/src/providers/`.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::receipts::ReceiptRoute;
use super::{Provider, ProviderError};

pub use super::ADAPTERS;

/// The adapter called `name`, if there is one.
pub fn adapter(name: &str) -> Option<&'static Adapter> {
    ADAPTERS.iter().find(|a| a.name == name)
}

/// The SMS adapter called `name` (what `SENDONCE_PROVIDER` and routes may
/// name), if there is one.
pub fn sms_adapter(name: &str) -> Option<&'static Adapter> {
    adapter(name).filter(|a| a.channel == Channel::Sms)
}

/// The adapters of channels of their own whose variable is set, configured.
pub fn channel_adapters(vars: &Vars, ctx: &Context) -> Result<Vec<Arc<dyn Configured>>, VarError> {
    let mut on = Vec::new();
    for a in ADAPTERS {
        if let Channel::Own { enabled_by, .. } = a.channel
            && vars.get(enabled_by).is_some()
        {
            on.push((a.configure)(vars, ctx)?);
        }
    }
    Ok(on)
}

/// Every adapter's name, in order.
pub fn names() -> impl Iterator<Item = &'static str> {
    ADAPTERS.iter().map(|a| a.name)
}

/// What `--provider` takes: the SMS adapters' names, shown in `--help`;
/// a channel of its own is taken too but not shown, so that the
/// configuration refuses it saying what turns it on.
pub fn provider_values() -> impl Iterator<Item = clap::builder::PossibleValue> {
    ADAPTERS
        .iter()
        .map(|a| clap::builder::PossibleValue::new(a.name).hide(a.channel != Channel::Sms))
}

/// What the service knows about one adapter.
pub struct Adapter {
    /// `SENDONCE_PROVIDER`'s word for it, stored with its messages and
    /// receipts and used as its metric label: lower-case letters and `_`,
    /// starting with a letter.
    pub name: &'static str,
    /// The variables it reads (each also a `--flag`).
    pub vars: &'static [Var],
    /// Its settings, from its variables, when `SENDONCE_PROVIDER` names it.
    pub configure: ConfigureFn,
    /// Its receipt endpoint, if it has one.
    pub receipts: Option<Receipts>,
    /// Which addresses it carries, and what turns it on.
    pub channel: Channel,
    /// The verification channel it serves (a name in a verification's
    /// `channels`), if any: the SMS adapters serve `sms` through routes and
    /// declare nothing here.
    pub verify: Option<VerifyChannel>,
    /// Its inbound route (what users write to the channel), if it has one.
    pub inbound: Option<Inbound>,
}

/// A channel's inbound route, declared by its adapter (issue 40): the HTTP
/// layer serves every one the same way (authenticate, read, hand the store
/// the update to take once), and nothing outside the adapter's folder
/// names the channel.
pub struct Inbound {
    /// Where updates are posted (`/channels/<name>/...`). It may be the
    /// adapter's receipt path (Meta posts a WhatsApp number's statuses and
    /// the messages its users write to one webhook): then the receipts
    /// handler takes the updates too, after the receipts.
    pub path: &'static str,
    /// Who owns the updates and how they are authenticated, from the
    /// adapter's variables; `None` when they are not set (then every
    /// update is refused, 401).
    pub configure: ConfigureInboundFn,
    /// How long a taken update's id is kept: a row older than that is a
    /// restarted id (a new update).
    pub keep: Duration,
    /// The largest body read (bytes).
    pub max_bytes: usize,
}

/// Parses an adapter's inbound route from its variables.
pub type ConfigureInboundFn = fn(&Vars) -> Result<Option<Arc<dyn InboundRoute>>, VarError>;

/// A configured inbound route.
pub trait InboundRoute: std::fmt::Debug + Send + Sync + 'static {
    /// The channel (its adapter's name, the first part of an update's
    /// unique key).
    fn channel(&self) -> &'static str;
    /// The source of the updates (a bot's id): the second part.
    fn source(&self) -> i64;
    /// The tenant (by name) that owns the updates and their events.
    fn tenant(&self) -> &str;
    /// Whether the request authenticates it (constant time): a secret in
    /// its headers, or a signature of its body.
    fn admits(&self, headers: &axum::http::HeaderMap, body: &[u8]) -> bool;
    /// Reads and decides the updates a request carries (none, one or
    /// several); `Err`: why it is refused (a 400, nothing stored).
    fn read(&self, body: &[u8]) -> Result<Vec<crate::domain::inbound::Update>, &'static str>;
}

/// Every adapter's configured inbound route.
pub fn inbound_routes(vars: &Vars) -> Result<Vec<Arc<dyn InboundRoute>>, VarError> {
    let mut out = Vec::new();
    for a in ADAPTERS {
        if let Some(i) = &a.inbound
            && let Some(r) = (i.configure)(vars)?
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// What a channel of verifications needs, declared by the adapter that
/// serves it (issue 40): the rest of the service reads it from here and
/// names no channel.
#[derive(Clone, Debug)]
pub struct VerifyChannel {
    /// The channel's name in `channels` (`telegram`, `whatsapp`).
    pub name: &'static str,
    /// The digits a code on it may have.
    pub code_digits: std::ops::RangeInclusive<u32>,
    /// Whether the provider is handed the code alone (its own text carries
    /// it) rather than the verification's rendered template.
    pub code_only: bool,
    /// Whether a message on it is priced only where the price table names
    /// the adapter (else it costs nothing and is not charged).
    pub priced_when_listed: bool,
}

/// The channels a verification may name: `sms`, then every channel an
/// adapter declares, in the registry's order.
pub fn verify_channels() -> Vec<crate::domain::Channel> {
    std::iter::once(crate::domain::Channel::SMS)
        .chain(
            ADAPTERS
                .iter()
                .filter_map(|a| a.verify.as_ref())
                .map(|v| crate::domain::Channel::named(v.name)),
        )
        .collect()
}

/// The adapter serving verification channel `c` and what `c` needs;
/// `None` for `sms` (every SMS adapter serves it).
pub fn verify_adapter(
    c: crate::domain::Channel,
) -> Option<(&'static Adapter, &'static VerifyChannel)> {
    ADAPTERS.iter().find_map(|a| {
        a.verify
            .as_ref()
            .filter(|v| v.name == c.as_str())
            .map(|v| (a, v))
    })
}

/// The verification channel of a message sent through `provider`: the one
/// its adapter declares, else `sms`.
pub fn verify_channel_of(provider: &str) -> crate::domain::Channel {
    adapter(provider)
        .and_then(|a| a.verify.as_ref())
        .map_or(crate::domain::Channel::SMS, |v| {
            crate::domain::Channel::named(v.name)
        })
}

/// Which addresses an adapter carries ([`Recipient::channel`]), and what
/// turns it on.
///
/// [`Recipient::channel`]: crate::domain::Recipient::channel
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Phone numbers: on when `SENDONCE_PROVIDER` (or a route of
    /// `SENDONCE_ROUTES`) names it, in the order named.
    Sms,
    /// The addresses of a channel of its own (`telegram:<chat_id>`): on
    /// when its variable `enabled_by` is set, and then the one adapter of
    /// that channel. `SENDONCE_PROVIDER` and routes cannot name it: a chat
    /// never falls back to SMS, nor a number to a chat.
    Own {
        name: &'static str,
        enabled_by: &'static str,
        /// The form of its addresses.
        address: Address,
    },
}

/// The form of a channel's addresses, declared by its adapter (issue 40).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Address {
    /// A phone number, with the checks an SMS number gets (the Gateway's
    /// Telegram account of a number, WhatsApp): reached by a verification's
    /// steps, stored as the number.
    Phone,
    /// `<channel>:<chat id>`, a chat on the channel's own account (the bot):
    /// what a message's `to` may name, stored so; an opt-out of it is the
    /// chat's.
    Chat,
}

/// The channels whose addresses are chats (`Address::Chat`): what a `to`
/// of `<channel>:<chat id>` may name. Worked out once from the registry's
/// constant table.
pub fn chat_channels() -> &'static [crate::domain::Channel] {
    static CHATS: std::sync::OnceLock<Vec<crate::domain::Channel>> = std::sync::OnceLock::new();
    CHATS.get_or_init(|| {
        ADAPTERS
            .iter()
            .filter_map(|a| match a.channel {
                Channel::Own {
                    name,
                    address: Address::Chat,
                    ..
                } => Some(crate::domain::Channel::named(name)),
                _ => None,
            })
            .collect()
    })
}

impl Channel {
    /// The channel's name, as [`Recipient::channel`] says it.
    ///
    /// [`Recipient::channel`]: crate::domain::Recipient::channel
    pub fn name(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Own { name, .. } => name,
        }
    }
}

/// Parses an adapter's settings from its variables.
pub type ConfigureFn = fn(&Vars, &Context) -> Result<Arc<dyn Configured>, VarError>;

/// Parses an adapter's receipt endpoint from its variables.
pub type ConfigureReceiptsFn = fn(&Vars, &Context) -> Result<Arc<dyn ReceiptRoute>, VarError>;

/// An adapter's receipt endpoint.
pub struct Receipts {
    /// Where receipts are posted (`/providers/<name>/status`).
    pub path: &'static str,
    /// How receipts are authenticated and read, from the adapter's
    /// variables (set up whether the adapter sends or not).
    pub configure: ConfigureReceiptsFn,
    /// Whether the provider may also call the path with `GET`, the receipt
    /// in the query string (Vonage lets the account choose the method).
    pub get: bool,
}

/// One variable an adapter reads; also the `--flag` of the same name.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    pub env: &'static str,
    pub flag: &'static str,
    pub help: &'static str,
    /// Kept out of `--help` and logs.
    pub secret: bool,
}

/// The adapters' variables as given, by variable name; blank ones count as
/// unset.
#[derive(Clone, Default)]
pub struct Vars(BTreeMap<&'static str, String>);

impl Vars {
    /// `var`'s value, when given and not blank.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.0
            .get(var)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// Sets `var` (one of some adapter's [`Var::env`]).
    pub fn set(&mut self, var: &'static str, value: impl Into<String>) {
        self.0.insert(var, value.into());
    }

    /// Every adapter variable's name.
    pub fn known() -> impl Iterator<Item = &'static Var> {
        ADAPTERS.iter().flat_map(|a| a.vars.iter())
    }

    /// `pairs` as variables; a name no adapter reads is left out.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vars {
        let mut vars = Vars::default();
        for (name, value) in pairs {
            if let Some(v) = Vars::known().find(|v| v.env == name) {
                vars.set(v.env, value);
            }
        }
        vars
    }
}

/// Names only: values may be secrets.
impl std::fmt::Debug for Vars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// What every adapter's settings may use beside its own variables.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Upper bound of one provider call.
    pub timeout: Duration,
    /// Upper bound of connecting to the provider.
    pub connect_timeout: Duration,
    /// `SENDONCE_PUBLIC_URL` without a trailing slash: where providers
    /// call back.
    pub public_url: Option<String>,
    /// `SENDONCE_LOG_BODIES`.
    pub log_bodies: bool,
    /// `SENDONCE_RETRY_DEADLINE`: no attempt of a message starts later
    /// than this after it was accepted (a window of the provider's that a
    /// resend relies on must outlast it).
    pub retry_deadline: Duration,
}

/// One adapter's settings, ready to build its client.
pub trait Configured: std::fmt::Debug + Send + Sync + 'static {
    /// The adapter's name.
    fn name(&self) -> &'static str;
    /// The client.
    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError>;
    /// The settings themselves, for whoever knows their type (tests).
    fn as_any(&self) -> &dyn Any;
    /// What an operator should hear at start about these settings, though
    /// they are allowed (a variable that no longer has an effect).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Why an adapter's variables were refused. Mapped into the configuration's
/// error (`config::ConfigError`) with the same words.
#[derive(Debug, thiserror::Error)]
pub enum VarError {
    #[error("{needed_by} needs {var}")]
    Missing {
        var: &'static str,
        needed_by: &'static str,
    },
    #[error("{var} is not {expected}")]
    Url {
        var: &'static str,
        expected: &'static str,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    #[error("{var} {reason}")]
    Invalid { var: &'static str, reason: String },
}

impl VarError {
    pub fn invalid(var: &'static str, reason: impl Into<String>) -> Self {
        VarError::Invalid {
            var,
            reason: reason.into(),
        }
    }
}

/// Checks that `url` (the value of `var`) is an http(s) URL, with a host
/// when `need_host`.
pub fn http_url(var: &'static str, url: &str, need_host: bool) -> Result<(), VarError> {
    let bad = |source| VarError::Url {
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

/// Every adapter's receipt endpoint, with its secrets, by adapter.
#[derive(Clone, Debug)]
pub struct ReceiptRoutes(Vec<(&'static str, Arc<dyn ReceiptRoute>)>);

impl ReceiptRoutes {
    /// Every adapter's endpoint that has one, from the adapters' variables.
    pub fn configure(vars: &Vars, ctx: &Context) -> Result<Self, VarError> {
        let mut routes = Vec::new();
        for a in ADAPTERS {
            if let Some(r) = &a.receipts {
                routes.push((a.name, (r.configure)(vars, ctx)?));
            }
        }
        Ok(ReceiptRoutes(routes))
    }

    /// [`ReceiptRoutes::configure`] from `(variable, value)` pairs (tests).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, VarError> {
        Self::configure(&Vars::from_pairs(pairs), &Context::default())
    }

    /// What every endpoint's settings should make an operator hear at start.
    pub fn warnings(&self) -> Vec<String> {
        self.0.iter().flat_map(|(_, r)| r.warnings()).collect()
    }

    /// Adapter `name`'s endpoint.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn ReceiptRoute>> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, r)| r)
    }
}

/// What no variable gives: every endpoint there, refusing every receipt.
impl Default for ReceiptRoutes {
    fn default() -> Self {
        Self::configure(&Vars::default(), &Context::default())
            .unwrap_or_else(|_| ReceiptRoutes(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_variables_are_unique() {
        let names: Vec<&str> = names().collect();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "{n} twice");
            assert!(
                n.starts_with(|c: char| c.is_ascii_lowercase())
                    && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{n}"
            );
        }
        let vars: Vec<&Var> = Vars::known().collect();
        for (i, v) in vars.iter().enumerate() {
            assert!(
                !vars[..i].iter().any(|o| o.env == v.env || o.flag == v.flag),
                "{v:?} twice"
            );
        }
        let paths: Vec<&str> = ADAPTERS
            .iter()
            .filter_map(|a| a.receipts.as_ref().map(|r| r.path))
            .collect();
        for (i, p) in paths.iter().enumerate() {
            assert!(!paths[..i].contains(p), "{p} twice");
        }
    }

    #[test]
    fn vars_hide_their_values() {
        let mut v = Vars::from_pairs([("TWILIO_AUTH_TOKEN", "hunter2"), ("NOT_OURS", "x")]);
        assert_eq!(v.get("TWILIO_AUTH_TOKEN"), Some("hunter2"));
        assert_eq!(v.get("NOT_OURS"), None);
        v.set("TWILIO_FROM", "  ");
        assert_eq!(v.get("TWILIO_FROM"), None);
        assert!(!format!("{v:?}").contains("hunter2"));
    }
}
