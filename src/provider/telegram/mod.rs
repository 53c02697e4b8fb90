//! The `telegram` adapter: a Telegram bot, the channel of `telegram:<chat_id>`
//! addresses (issue 28). It is an adapter like the SMS ones (its folder,
//! its name in the `adapters!` list, its variables as flags), with a
//! channel of its own (`registry::Channel::Own`): it is on when
//! `TELEGRAM_BOT_TOKEN` is set, carries chats only, and is the only
//! adapter a chat goes through (delivery picks providers by the address's
//! channel, `Recipient::channel`).
//!
//! Send: `POST {TELEGRAM_BOT_API_URL}/bot<token>/sendMessage` with JSON
//! `{"chat_id", "text"}`; classified in [`classify`]. The Bot API has no
//! idempotency key and cannot be asked whether it sent a message, so
//! [`Provider::dedupes_by_key`] is false and [`Provider::reconcile`] keeps
//! its default: a timeout or a 5xx after the request was written ends the
//! message `unknown`, never resent. The token is part of the URL: it is
//! never logged, and transport errors are described without their URL.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};

use super::{OutgoingSms, Provider, ProviderError, SendOutcome, parse_retry_after};

pub mod classify;
pub mod updates;
mod settings;

pub use settings::{ADAPTER, BOT_API_URL, BOT_TOKEN, DEFAULT_BOT_API_URL};
pub use updates::{DEFAULT_TENANT, TENANT, WEBHOOK_SECRET};

/// The adapter's name and its channel's.
pub const NAME: &str = "telegram";

/// The longest text one Telegram message carries (`sendMessage`'s `text`,
/// characters): more than a message's body may have (1600), so a body
/// always goes as one Telegram message (what `Recipient::segments` counts
/// for a chat).
pub const MAX_TEXT: usize = 4096;

/// What the adapter needs to know.
#[derive(Clone)]
pub struct TelegramSettings {
    /// `https://api.telegram.org`, or a stand-in in tests.
    pub api_url: String,
    /// `<bot_id>:<secret>`, as BotFather gives it.
    pub token: String,
    /// Upper bound of one call.
    pub timeout: Duration,
    /// Upper bound of connecting: until then, nothing was sent.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for TelegramSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramSettings")
            .field("api_url", &self.api_url)
            .field("bot", &bot_id(&self.token))
            .field("token", &"***")
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The bot's id: the numeric part of its token before the `:`.
pub fn bot_id(token: &str) -> Option<i64> {
    let (id, secret) = token.split_once(':')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || secret.is_empty() {
        return None;
    }
    id.parse().ok().filter(|id| *id > 0)
}

#[derive(Clone, Debug)]
pub struct TelegramProvider {
    client: reqwest::Client,
    /// `{base}/bot<token>/sendMessage`.
    send_url: reqwest::Url,
}

impl TelegramProvider {
    pub fn new(settings: TelegramSettings) -> Result<Self, ProviderError> {
        let what = "Telegram Bot API";
        let base = super::base_url(what, &settings.api_url)?;
        let bot = format!("bot{}", settings.token);
        let send_url = super::endpoint(what, &base, &[&bot, "sendMessage"])?;
        let client = super::http_client(settings.timeout, settings.connect_timeout)?;
        Ok(Self { client, send_url })
    }
}

#[async_trait]
impl Provider for TelegramProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn channel(&self) -> &'static str {
        ADAPTER.channel.name()
    }

    fn dedupes_by_key(&self) -> bool {
        // sendMessage has no idempotency key: a resend is a second message.
        false
    }

    fn opts_out(
        &self,
        to: &crate::domain::Recipient,
        outcome: crate::domain::AttemptOutcome,
        provider_code: Option<&str>,
    ) -> bool {
        classify::opts_out(to, outcome, provider_code)
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let Some(chat) = sms.to.chat() else {
            return SendOutcome::Refused {
                http_status: None,
                provider_code: None,
                message: format!(
                    "the Telegram bot sends to Telegram chats only; it cannot reach a {} recipient",
                    sms.to.channel()
                ),
            };
        };
        let body = serde_json::json!({ "chat_id": chat.id(), "text": sms.body }).to_string();
        let req = self
            .client
            .post(self.send_url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(body);
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return classify::transport(e.is_connect() || e.is_builder(), e.is_timeout()),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        match super::read_body(resp, super::MAX_ANSWER_BYTES).await {
            Ok(bytes) => {
                let reply = serde_json::from_slice::<classify::Reply>(&bytes).ok();
                classify::classify(chat.id(), status, reply.as_ref(), retry_after)
            }
            Err(e) if (200..300).contains(&status) || status >= 500 => SendOutcome::Ambiguous {
                http_status: Some(status),
                retry_after: None,
                message: format!("reading the Bot API's answer failed: {}", e.describe()),
            },
            Err(_) => classify::classify(chat.id(), status, None, retry_after),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_fits_one_telegram_message() {
        assert!(crate::domain::request::BODY_MAX_CHARS <= MAX_TEXT as u64);
    }

    #[test]
    fn the_bot_id_is_the_tokens_numeric_prefix() {
        let rows = [
            ("123456789:AAE-abc_def", Some(123_456_789)),
            ("1:x", Some(1)),
            ("0:x", None),
            (":x", None),
            ("12a:x", None),
            ("123456789", None),
            ("123456789:", None),
            ("-5:x", None),
        ];
        for (token, want) in rows {
            assert_eq!(bot_id(token), want, "{token}");
        }
    }

    #[test]
    fn settings_never_show_the_token() {
        let s = TelegramSettings {
            api_url: "https://api.telegram.org".into(),
            token: "42:very-secret".into(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(shown.contains("42"), "{shown}");
        let p = TelegramProvider::new(s).expect("provider");
        assert_eq!(p.send_url.path(), "/bot42:very-secret/sendMessage");
        assert_eq!(p.channel(), "telegram");
    }
}
