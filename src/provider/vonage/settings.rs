//! The `vonage` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;

use super::super::registry::{Channel, 
    Adapter, Configured, Context, Receipts, Var, VarError, Vars, http_url,
};
use super::super::{Provider, ProviderError};
use super::receipts::{RECEIPTS_UNSIGNED, SIGNATURE_METHOD, SIGNATURE_SECRET};
use super::{DEFAULT_BASE_URL, STATUS_PATH, VonageProvider, VonageSettings};

/// The `vonage` adapter in the registry.
pub const ADAPTER: Adapter = Adapter {
    name: "vonage",
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: STATUS_PATH,
        configure: super::receipts::configure,
        // Vonage calls the receipt URL with the method the account chose:
        // GET (query string) or POST (form or JSON).
        get: true,
    }),
    channel: Channel::Sms,
    verify: None,
};

pub const API_KEY: &str = "VONAGE_API_KEY";
pub const API_SECRET: &str = "VONAGE_API_SECRET";
pub const FROM: &str = "VONAGE_FROM";
pub const BASE_URL: &str = "VONAGE_BASE_URL";

const VARS: [Var; 7] = [
    Var {
        env: API_KEY,
        flag: "vonage-api-key",
        help: "Vonage API key (api_key of every send)",
        secret: false,
    },
    Var {
        env: API_SECRET,
        flag: "vonage-api-secret",
        help: "Vonage API secret (api_secret of every send)",
        secret: true,
    },
    Var {
        env: FROM,
        flag: "vonage-from",
        help: "Default Vonage sender (number or alphanumeric ID) when a request names none",
        secret: false,
    },
    Var {
        env: BASE_URL,
        flag: "vonage-base-url",
        help: "Vonage SMS API address (default https://rest.nexmo.com; tests point it at a stand-in)",
        secret: false,
    },
    Var {
        env: SIGNATURE_SECRET,
        flag: "vonage-signature-secret",
        help: "Vonage signature secret: the key delivery receipts' `sig` is checked with",
        secret: true,
    },
    Var {
        env: SIGNATURE_METHOD,
        flag: "vonage-signature-method",
        help: "How Vonage signs: md5hash (default), md5, sha1, sha256 or sha512",
        secret: false,
    },
    Var {
        env: RECEIPTS_UNSIGNED,
        flag: "vonage-receipts-unsigned",
        help: "true: take Vonage receipts without a signature when no signature secret is set (UNSAFE: anyone can forge them)",
        secret: false,
    },
];

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let needed_by = "SENDONCE_PROVIDER=vonage";
    let need = |var: &'static str| vars.get(var).ok_or(VarError::Missing { var, needed_by });
    let api_key = need(API_KEY)?;
    let api_secret = need(API_SECRET)?;
    let from = need(FROM)?;
    let base_url = vars.get(BASE_URL).unwrap_or(DEFAULT_BASE_URL);
    http_url(BASE_URL, base_url, true)?;
    Ok(Arc::new(VonageSettings {
        base_url: base_url.to_string(),
        api_key: api_key.to_string(),
        api_secret: api_secret.to_string(),
        from: from.to_string(),
        callback: ctx
            .public_url
            .as_ref()
            .map(|base| format!("{base}{STATUS_PATH}")),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

impl Configured for VonageSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(VonageProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        if self.callback.is_some() {
            return Vec::new();
        }
        vec![
            "Vonage delivery reports are off: SENDONCE_PUBLIC_URL is not set, so no callback \
             goes with a message and its messages stay `sent` (set it to have reports)"
                .to_string(),
        ]
    }
}
