//! The `telegram_gateway` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;

use super::super::registry::{
    Adapter, Address, Channel, Configured, Context, Receipts, Var, VarError, Vars, VerifyChannel, http_url,
};
use super::super::receipts::ReceiptRoute;
use super::super::{Provider, ProviderError};
use super::reports::GatewayReports;
use super::{GatewayProvider, GatewaySettings, REPORTS_PATH};

/// The `telegram_gateway` adapter in the registry: a channel of its own
/// (verification codes to a number's Telegram account), on when its token
/// is set. No route or `SENDONCE_PROVIDER` names it: a verification whose
/// channels start with `telegram` is what sends through it.
pub const ADAPTER: Adapter = Adapter {
    name: super::NAME,
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: REPORTS_PATH,
        configure: configure_reports,
        get: false,
    }),
    channel: Channel::Own {
        name: super::NAME,
        enabled_by: TOKEN,
        address: Address::Phone,
    },
    verify: Some(VerifyChannel {
        name: "telegram",
        code_digits: super::CODE_DIGITS,
        code_only: true,
        priced_when_listed: true,
    }),
    inbound: None,
};

pub const TOKEN: &str = "TELEGRAM_GATEWAY_TOKEN";
pub const URL: &str = "TELEGRAM_GATEWAY_URL";

/// Where the real Gateway API lives.
pub const DEFAULT_URL: &str = "https://gatewayapi.telegram.org";

const VARS: [Var; 2] = [
    Var {
        env: TOKEN,
        flag: "telegram-gateway-token",
        help: "Telegram Gateway API token: turns on \"channels\": [\"telegram\", ...] for verifications",
        secret: true,
    },
    Var {
        env: URL,
        flag: "telegram-gateway-url",
        help: "Telegram Gateway API address (default https://gatewayapi.telegram.org; tests point it at a stand-in)",
        secret: false,
    },
];

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let token = vars.get(TOKEN).ok_or(VarError::Missing {
        var: TOKEN,
        needed_by: "the telegram verification channel",
    })?;
    let url = vars.get(URL).unwrap_or(DEFAULT_URL);
    http_url(URL, url, true)?;
    Ok(Arc::new(GatewaySettings {
        url: url.to_string(),
        token: token.trim().to_string(),
        callback_url: super::callback_url(ctx.public_url.as_deref()),
        public_url: ctx.public_url.clone(),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

/// The reports endpoint, keyed with the token (set up whether or not the
/// Gateway sends).
fn configure_reports(vars: &Vars, _ctx: &Context) -> Result<Arc<dyn ReceiptRoute>, VarError> {
    Ok(Arc::new(GatewayReports::new(vars.get(TOKEN))))
}

impl Configured for GatewaySettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(GatewayProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        if self.callback_url.is_some() {
            return Vec::new();
        }
        let why = match &self.public_url {
            None => "SENDONCE_PUBLIC_URL is not set".to_string(),
            Some(url) => format!(
                "SENDONCE_PUBLIC_URL ({url}) is not https, or too long for the Gateway's 256 bytes"
            ),
        };
        vec![format!(
            "Telegram Gateway delivery reports are off: {why}, so no callback_url goes with a \
             code and a fallback to SMS must first ask the Gateway (checkVerificationStatus) \
             whether it was delivered"
        )]
    }
}
