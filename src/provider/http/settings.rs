//! The `http` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::super::registry::{Channel, 
    Adapter, Configured, Context, Receipts, Var, VarError, Vars, http_url,
};
use super::super::{Provider, ProviderError};
use super::HttpProvider;
use super::receipts::RECEIPT_SECRET;

/// The `http` adapter in the registry.
pub const ADAPTER: Adapter = Adapter {
    name: "http",
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: super::receipts::STATUS_PATH,
        configure: super::receipts::configure,
        get: false,
    }),
    channel: Channel::Sms,
    verify: None,
};

pub const URL: &str = "SENDONCE_HTTP_PROVIDER_URL";
pub const TOKEN: &str = "SENDONCE_HTTP_PROVIDER_TOKEN";

const VARS: [Var; 3] = [
    Var {
        env: URL,
        flag: "http-provider-url",
        help: "URL the `http` provider POSTs to",
        secret: false,
    },
    Var {
        env: TOKEN,
        flag: "http-provider-token",
        help: "Bearer token for the `http` provider",
        secret: true,
    },
    Var {
        env: RECEIPT_SECRET,
        flag: "receipt-secret",
        help: "Shared secret the `http` provider sends in `X-Receipt-Secret` with receipts",
        secret: true,
    },
];

/// What the `http` client is built from.
#[derive(Clone)]
pub struct HttpSettings {
    pub url: String,
    pub token: Option<String>,
    /// `SENDONCE_RECEIPT_SECRET` is set: the provider's receipts can be
    /// taken.
    pub receipt_secret_set: bool,
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

/// The token stays out of logs.
impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let url = vars.get(URL).ok_or(VarError::Missing {
        var: URL,
        needed_by: "SENDONCE_PROVIDER=http",
    })?;
    http_url(URL, url, false)?;
    Ok(Arc::new(HttpSettings {
        url: url.to_string(),
        token: vars.get(TOKEN).map(str::to_string),
        receipt_secret_set: vars.get(RECEIPT_SECRET).is_some(),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

impl Configured for HttpSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(HttpProvider::new(
            &self.url,
            self.token.clone(),
            self.timeout,
            self.connect_timeout,
        )?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        if self.receipt_secret_set {
            return Vec::new();
        }
        vec![format!(
            "http provider delivery reports are off: {RECEIPT_SECRET} is not set, so every \
             receipt posted to {} is refused and messages stay `sent`",
            super::receipts::STATUS_PATH
        )]
    }
}
