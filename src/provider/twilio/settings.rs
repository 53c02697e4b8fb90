//! The `twilio` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;

use super::super::registry::{Channel, 
    Adapter, Configured, Context, Receipts, Var, VarError, Vars, http_url,
};
use super::super::{Provider, ProviderError};
use super::receipts::AUTH_TOKEN;
use super::{DEFAULT_BASE_URL, STATUS_CALLBACK_PATH, TwilioProvider, TwilioSettings};

/// The `twilio` adapter in the registry.
pub const ADAPTER: Adapter = Adapter {
    name: "twilio",
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: STATUS_CALLBACK_PATH,
        configure: super::receipts::configure,
        get: false,
    }),
    channel: Channel::Sms,
    verify: None,
};

pub const BASE_URL: &str = "TWILIO_BASE_URL";
pub const ACCOUNT_SID: &str = "TWILIO_ACCOUNT_SID";
pub const FROM: &str = "TWILIO_FROM";
pub const MESSAGING_SERVICE_SID: &str = "TWILIO_MESSAGING_SERVICE_SID";

const VARS: [Var; 5] = [
    Var {
        env: BASE_URL,
        flag: "twilio-base-url",
        help: "Twilio's API address (tests point it at a stand-in)",
        secret: false,
    },
    Var {
        env: ACCOUNT_SID,
        flag: "twilio-account-sid",
        help: "Twilio account SID (AC...), the Basic auth user",
        secret: false,
    },
    Var {
        env: AUTH_TOKEN,
        flag: "twilio-auth-token",
        help: "Twilio auth token: Basic auth password, and the key of X-Twilio-Signature",
        secret: true,
    },
    Var {
        env: FROM,
        flag: "twilio-from",
        help: "Default Twilio sender when a request names none",
        secret: false,
    },
    Var {
        env: MESSAGING_SERVICE_SID,
        flag: "twilio-messaging-service-sid",
        help: "Twilio Messaging Service SID (MG...), sent with every message",
        secret: false,
    },
];

/// `prefix` and 32 hex digits (Twilio SIDs).
fn is_sid(value: &str, prefix: &str) -> bool {
    value.len() == 34
        && value.starts_with(prefix)
        && value[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let needed_by = "SENDONCE_PROVIDER=twilio";
    let account_sid = vars.get(ACCOUNT_SID).ok_or(VarError::Missing {
        var: ACCOUNT_SID,
        needed_by,
    })?;
    if !is_sid(account_sid, "AC") {
        return Err(VarError::invalid(
            ACCOUNT_SID,
            "must be AC followed by 32 hex digits",
        ));
    }
    let auth_token = vars.get(AUTH_TOKEN).ok_or(VarError::Missing {
        var: AUTH_TOKEN,
        needed_by,
    })?;
    let messaging_service_sid = vars.get(MESSAGING_SERVICE_SID);
    if messaging_service_sid.is_some_and(|s| !is_sid(s, "MG")) {
        return Err(VarError::invalid(
            MESSAGING_SERVICE_SID,
            "must be MG followed by 32 hex digits",
        ));
    }
    let from = vars.get(FROM);
    if from.is_none() && messaging_service_sid.is_none() {
        return Err(VarError::Missing {
            var: "TWILIO_FROM or TWILIO_MESSAGING_SERVICE_SID",
            needed_by,
        });
    }
    let base_url = vars.get(BASE_URL).unwrap_or(DEFAULT_BASE_URL);
    http_url(BASE_URL, base_url, true)?;
    Ok(Arc::new(TwilioSettings {
        base_url: base_url.to_string(),
        account_sid: account_sid.to_string(),
        auth_token: auth_token.to_string(),
        from: from.map(str::to_string),
        messaging_service_sid: messaging_service_sid.map(str::to_string),
        status_callback: ctx
            .public_url
            .as_ref()
            .map(|base| format!("{base}{STATUS_CALLBACK_PATH}")),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

impl Configured for TwilioSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(TwilioProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        if self.status_callback.is_some() {
            return Vec::new();
        }
        vec![
            "Twilio delivery reports are off: SENDONCE_PUBLIC_URL is not set, so no \
             StatusCallback goes with a message and its messages stay `sent` (set it to have \
             reports)"
                .to_string(),
        ]
    }
}
