//! The `telegram` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;

use super::super::registry::{
    Adapter, Address, Channel, Configured, Context, Inbound, Var, VarError, Vars, http_url,
};
use super::super::{Provider, ProviderError};
use super::updates::{TENANT, WEBHOOK_SECRET};
use super::{TelegramProvider, TelegramSettings, bot_id};

/// The `telegram` adapter in the registry: a channel of its own, on when
/// its bot token is set.
pub const ADAPTER: Adapter = Adapter {
    name: super::NAME,
    vars: &VARS,
    configure,
    receipts: None,
    channel: Channel::Own {
        name: "telegram",
        enabled_by: BOT_TOKEN,
        address: Address::Chat,
    },
    verify: None,
    inbound: Some(Inbound {
        path: super::updates::UPDATES_PATH,
        configure: super::updates::configure_inbound,
        keep: super::updates::KEEP,
        max_bytes: super::updates::MAX_UPDATE_BYTES,
    }),
};

pub const BOT_TOKEN: &str = "TELEGRAM_BOT_TOKEN";
pub const BOT_API_URL: &str = "TELEGRAM_BOT_API_URL";

/// Where the real Bot API lives.
pub const DEFAULT_BOT_API_URL: &str = "https://api.telegram.org";


const VARS: [Var; 4] = [
    Var {
        env: BOT_TOKEN,
        flag: "telegram-bot-token",
        help: "Telegram bot token (from BotFather): turns on telegram:<chat_id> addresses",
        secret: true,
    },
    Var {
        env: BOT_API_URL,
        flag: "telegram-bot-api-url",
        help: "Telegram Bot API address (default https://api.telegram.org; tests point it at a stand-in)",
        secret: false,
    },
    Var {
        env: TENANT,
        flag: "telegram-tenant",
        help: "The tenant that owns the bot's inbound updates and events (default `default`)",
        secret: false,
    },
    Var {
        env: WEBHOOK_SECRET,
        flag: "telegram-webhook-secret",
        help: "The secret_token given to setWebhook: updates without it in X-Telegram-Bot-Api-Secret-Token are refused",
        secret: true,
    },
];

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let token = vars.get(BOT_TOKEN).ok_or(VarError::Missing {
        var: BOT_TOKEN,
        needed_by: "the telegram channel",
    })?;
    if bot_id(token.trim()).is_none() {
        return Err(VarError::invalid(
            BOT_TOKEN,
            "is not a bot token (<bot id>:<secret>, as BotFather gives it)",
        ));
    }
    let api_url = vars.get(BOT_API_URL).unwrap_or(DEFAULT_BOT_API_URL);
    http_url(BOT_API_URL, api_url, true)?;
    Ok(Arc::new(TelegramSettings {
        api_url: api_url.to_string(),
        token: token.trim().to_string(),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

impl Configured for TelegramSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(TelegramProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
