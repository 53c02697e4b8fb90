//! The `infobip` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::super::registry::{Channel, Adapter, Configured, Context, Receipts, Var, VarError, Vars};
use super::super::{Provider, ProviderError};
use super::receipts::{RECEIPT_SECRET, SECRET_PARAM};
use super::{InfobipProvider, InfobipSettings, STATUS_PATH};

/// The `infobip` adapter in the registry.
pub const ADAPTER: Adapter = Adapter {
    name: "infobip",
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: STATUS_PATH,
        get: false,
        configure: super::receipts::configure,
    }),
    channel: Channel::Sms,
    verify: None,
};

pub const API_KEY: &str = "INFOBIP_API_KEY";
pub const BASE_URL: &str = "INFOBIP_BASE_URL";
pub const FROM: &str = "INFOBIP_FROM";
pub const LOOKUP_AFTER: &str = "INFOBIP_LOOKUP_AFTER";
pub const IDEMPOTENCY_GRACE: &str = "INFOBIP_IDEMPOTENCY_GRACE";

/// How much longer than `SENDONCE_RETRY_DEADLINE` Infobip's idempotency
/// grace period must be to be relied on: no attempt starts after a
/// message's deadline, measured from before its first `messageId` was
/// written, and this absorbs the clocks involved stepping.
pub const GRACE_MARGIN: Duration = Duration::from_secs(3600);

const VARS: [Var; 6] = [
    Var {
        env: API_KEY,
        flag: "infobip-api-key",
        help: "Infobip API key, sent as `Authorization: App <key>`",
        secret: true,
    },
    Var {
        env: BASE_URL,
        flag: "infobip-base-url",
        help: "Your Infobip account's base URL (xxxxx.api.infobip.com; https:// when no scheme)",
        secret: false,
    },
    Var {
        env: FROM,
        flag: "infobip-from",
        help: "Default Infobip sender when a request names none",
        secret: false,
    },
    Var {
        env: RECEIPT_SECRET,
        flag: "infobip-receipt-secret",
        help: "Secret carried by the delivery report URL given to Infobip; reports without it are refused",
        secret: true,
    },
    Var {
        env: IDEMPOTENCY_GRACE,
        flag: "infobip-idempotency-grace",
        help: "Set only when Infobip enabled idempotency for your account: its grace period (e.g. 24h; at least SENDONCE_RETRY_DEADLINE plus 1h); then an unanswered send is resent under the same messageId",
        secret: false,
    },
    Var {
        env: LOOKUP_AFTER,
        flag: "infobip-lookup-after",
        help: "No longer has an effect (an empty log never means not sent); accepted so existing configurations start",
        secret: false,
    },
];

/// The account's base URL as `scheme://host[:port]`, without a trailing
/// slash: `value` with or without a scheme (`https://` when none; `http://`
/// only for stand-ins in tests). Anything but a bare host is refused: a
/// path, a query, a fragment or credentials would end up in every request.
pub fn base_url(value: &str) -> Result<String, String> {
    let value = value.trim();
    let with_scheme = if value.contains("://") {
        value.to_string()
    } else {
        format!("https://{value}")
    };
    let url = reqwest::Url::parse(&with_scheme)
        .map_err(|e| format!("is not a base URL (xxxxx.api.infobip.com): {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must be an https URL, or a host name".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials (the API key is INFOBIP_API_KEY)".into());
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err("must be the account's base URL only, without a path or query".into());
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// `INFOBIP_IDEMPOTENCY_GRACE`, in humantime syntax (`24h`): `None` when
/// unset (Infobip's idempotency not declared). Refused unless it exceeds
/// `retry_deadline` (`SENDONCE_RETRY_DEADLINE`) by at least
/// [`GRACE_MARGIN`]: a resend relies on Infobip refusing the repeat, which
/// it does only within the grace period from the first send.
pub fn idempotency_grace(
    value: Option<&str>,
    retry_deadline: Duration,
) -> Result<Option<Duration>, VarError> {
    let Some(v) = value else {
        return Ok(None);
    };
    let grace = humantime::parse_duration(v.trim()).map_err(|e| {
        VarError::invalid(
            IDEMPOTENCY_GRACE,
            format!("is not a duration ({v:?}, e.g. 24h): {e}"),
        )
    })?;
    let least = retry_deadline + GRACE_MARGIN;
    if grace < least {
        return Err(VarError::invalid(
            IDEMPOTENCY_GRACE,
            format!(
                "({}) must exceed SENDONCE_RETRY_DEADLINE ({}) by at least {}: a message is \
                 resent under its messageId until its retry deadline, and Infobip refuses the \
                 repeat only within the grace period; ask Infobip for a longer one, or shorten \
                 SENDONCE_RETRY_DEADLINE",
                humantime::format_duration(grace),
                humantime::format_duration(retry_deadline),
                humantime::format_duration(GRACE_MARGIN),
            ),
        ));
    }
    Ok(Some(grace))
}

/// Where Infobip posts delivery reports for a message: our endpoint under
/// the public URL, with the receipt secret as the `secret` query parameter.
pub fn delivery_url(public_url: &str, secret: &str) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair(SECRET_PARAM, secret);
    format!(
        "{}{STATUS_PATH}?{}",
        public_url.trim_end_matches('/'),
        q.finish()
    )
}

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let needed_by = "SENDONCE_PROVIDER=infobip";
    let api_key = vars.get(API_KEY).ok_or(VarError::Missing {
        var: API_KEY,
        needed_by,
    })?;
    let base = vars.get(BASE_URL).ok_or(VarError::Missing {
        var: BASE_URL,
        needed_by,
    })?;
    let base_url = base_url(base).map_err(|reason| VarError::invalid(BASE_URL, reason))?;
    let idempotency_grace = idempotency_grace(vars.get(IDEMPOTENCY_GRACE), ctx.retry_deadline)?;
    let mut warnings: Vec<String> = vars
        .get(LOOKUP_AFTER)
        .map(|_| {
            format!(
                "{LOOKUP_AFTER} no longer has an effect and is ignored: Infobip documents no bound \
                 on how soon a message shows in its logs, so an empty log never counts as not sent"
            )
        })
        .into_iter()
        .collect();
    // Checked (length) by the receipt route's own configuration.
    let secret = vars.get(RECEIPT_SECRET);
    let delivery_url = match (&ctx.public_url, secret) {
        (Some(public), Some(secret)) => Some(delivery_url(public, secret)),
        (public, secret) => {
            let missing = match (public, secret) {
                (None, None) => "SENDONCE_PUBLIC_URL and INFOBIP_RECEIPT_SECRET are",
                (None, _) => "SENDONCE_PUBLIC_URL is",
                _ => "INFOBIP_RECEIPT_SECRET is",
            };
            warnings.push(format!(
                "Infobip delivery reports are off: {missing} not set, so no notifyUrl goes with a \
                 message and its messages stay `sent` (set them to have reports)"
            ));
            None
        }
    };
    Ok(Arc::new(InfobipSettings {
        base_url,
        api_key: api_key.trim().to_string(),
        from: vars.get(FROM).map(str::to_string),
        delivery_url,
        idempotency_grace,
        warnings,
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

impl Configured for InfobipSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(InfobipProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}
