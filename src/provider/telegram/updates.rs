//! The bot's inbound updates (`POST /channels/telegram/updates`, the URL
//! given to `setWebhook`): who may post them, how one is read, and what it
//! does; declared in the registry (`Adapter::inbound`). Pure: the HTTP
//! layer's one inbound handler (`src/http/inbound.rs`) authenticates with
//! [`Inbound::admits`], reads with [`read`] and hands the store the
//! [`Update`] to take once.
//!
//! An update is taken once under the unique (bot, `update_id`) of its row,
//! kept at least [`KEEP`]; a row older than that is a restarted id (a new
//! update). What it does, decided here:
//!
//! | update | effect |
//! |---|---|
//! | `message` with a `text` | a `message.received` event (feed, webhooks) |
//! | text `/stop` (or a stop word: STOP, UNSUBSCRIBE, …) | also opts the chat out |
//! | text `/start` (or START, UNSTOP) | also opts the chat back in |
//! | anything else (edits, channel posts, callbacks, stickers, …) | recorded as taken, nothing else |

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::{BOT_TOKEN, bot_id};
pub use crate::domain::inbound::{Effect, Update};
use crate::provider::registry::{InboundRoute, VarError, Vars};

/// Where the bot's updates are posted.
pub const UPDATES_PATH: &str = "/channels/telegram/updates";

/// The tenant (by name) that owns the updates, and the webhook's secret.
pub const TENANT: &str = "TELEGRAM_TENANT";
pub const WEBHOOK_SECRET: &str = "TELEGRAM_WEBHOOK_SECRET";

/// The tenant that owns the bot's inbound updates and their events.
pub const DEFAULT_TENANT: &str = "default";

/// How long a taken update is kept (Telegram keeps an unconfirmed update
/// for 24 hours; ids restart after a week without updates).
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The largest update body read (bytes): far above a text message's.
pub const MAX_UPDATE_BYTES: usize = 64 * 1024;

/// The header Telegram sends the webhook's `secret_token` in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// Who owns the updates and how they are authenticated: set when a bot
/// token and a webhook secret are both configured.
#[derive(Clone)]
pub struct Inbound {
    /// The bot's id, the first half of the unique key of its updates.
    pub bot_id: i64,
    /// The tenant (by name) that owns the updates and their events.
    pub tenant: String,
    secret: String,
}

impl std::fmt::Debug for Inbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbound")
            .field("bot_id", &self.bot_id)
            .field("tenant", &self.tenant)
            .field("secret", &"***")
            .finish()
    }
}

impl Inbound {
    pub fn new(bot_id: i64, tenant: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            bot_id,
            tenant: tenant.into(),
            secret: secret.into(),
        }
    }

    /// From the adapter's variables: `None` without a bot token or a
    /// webhook secret (then every update is refused).
    pub fn configure(vars: &Vars) -> Result<Option<Self>, VarError> {
        let (Some(token), Some(secret)) = (vars.get(BOT_TOKEN), vars.get(WEBHOOK_SECRET)) else {
            return Ok(None);
        };
        let bot = bot_id(token.trim()).ok_or_else(|| {
            VarError::invalid(BOT_TOKEN, "is not a bot token (<bot id>:<secret>, as BotFather gives it)")
        })?;
        // setWebhook's secret_token: 1-256 of A-Z, a-z, 0-9, _ and -.
        let ok = (1..=256).contains(&secret.len())
            && secret.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(VarError::invalid(
                WEBHOOK_SECRET,
                "must be 1 to 256 characters of A-Z, a-z, 0-9, _ and - (setWebhook's secret_token)",
            ));
        }
        let tenant = vars.get(TENANT).unwrap_or(DEFAULT_TENANT).trim().to_string();
        Ok(Some(Self::new(bot, tenant, secret)))
    }

    /// Whether `given` (the header's value) is the secret, compared in
    /// constant time.
    pub fn admits(&self, given: Option<&[u8]>) -> bool {
        given.is_some_and(|g| bool::from(g.ct_eq(self.secret.as_bytes())))
    }
}

/// The registry's way to configure the route (`Adapter::inbound`).
pub fn configure_inbound(vars: &Vars) -> Result<Option<Arc<dyn InboundRoute>>, VarError> {
    Ok(Inbound::configure(vars)?.map(|i| Arc::new(i) as Arc<dyn InboundRoute>))
}

impl InboundRoute for Inbound {
    fn channel(&self) -> &'static str {
        super::NAME
    }

    fn source(&self) -> i64 {
        self.bot_id
    }

    fn tenant(&self) -> &str {
        &self.tenant
    }

    fn admits(&self, headers: &axum::http::HeaderMap, _body: &[u8]) -> bool {
        Inbound::admits(self, headers.get(SECRET_HEADER).map(|v| v.as_bytes()))
    }

    fn read(&self, body: &[u8]) -> Result<Vec<Update>, &'static str> {
        read(body).map(|u| vec![u]).map_err(|Malformed(m)| m)
    }
}

/// One update as Telegram sends it: only what is used is read.
#[derive(Debug, Deserialize)]
struct RawUpdate {
    update_id: i64,
    #[serde(default)]
    message: Option<RawMessage>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    message_id: i64,
    #[serde(default)]
    date: Option<i64>,
    chat: RawChat,
    #[serde(default)]
    from: Option<serde_json::Value>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawChat {
    id: i64,
}

/// Why an update body was refused (a 400, nothing stored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Reads an update: a JSON object with an integer `update_id`; a `message`
/// that is there must be a Message (`message_id`, `chat.id`).
pub fn read(body: &[u8]) -> Result<Update, Malformed> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| Malformed("the body is not JSON"))?;
    if !value.is_object() {
        return Err(Malformed("an update is a JSON object"));
    }
    if !value.get("update_id").is_some_and(|v| v.is_i64()) {
        return Err(Malformed("an update has an integer update_id"));
    }
    let raw: RawUpdate = serde_json::from_value(value)
        .map_err(|_| Malformed("the update's message is not a Telegram Message"))?;
    let effect = match raw.message {
        Some(RawMessage {
            message_id,
            date,
            chat,
            from,
            text: Some(text),
        }) => {
            let address = crate::domain::recipient::Chat::new(
                crate::domain::Channel::named(super::NAME),
                chat.id,
            )
            .as_str()
            .to_string();
            let event = serde_json::json!({
                "channel": "telegram",
                "from": address,
                "chat_id": chat.id,
                "sender": from,
                "text": text,
                "update_id": raw.update_id,
                "message_id": message_id,
                "date": date,
            });
            Effect::Received {
                address,
                event: event.to_string().into_bytes(),
                opt_out: keyword(&text),
            }
        }
        _ => Effect::None,
    };
    Ok(Update {
        event_id: raw.update_id,
        effect,
    })
}

/// `/stop` or `/start` (also as `/stop@our_bot`), else the SMS keywords
/// (STOP, START, …): `Some(true)` opts out, `Some(false)` back in.
pub fn keyword(text: &str) -> Option<bool> {
    let t = text.trim();
    if let Some(command) = t.strip_prefix('/') {
        let name = command
            .split(|c: char| c.is_whitespace() || c == '@')
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        return match name.as_str() {
            "stop" => Some(true),
            "start" => Some(false),
            _ => None,
        };
    }
    crate::domain::opt_out::keyword(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_read_as_a_table() {
        let text = |t: &str| {
            format!(
                r#"{{"update_id":10,"message":{{"message_id":5,"date":1,"chat":{{"id":42,"type":"private"}},"from":{{"id":42,"is_bot":false,"first_name":"Ann"}},"text":"{t}"}}}}"#
            )
        };
        /// Ok(Some(opt-out)): a text message; Ok(None): no effect; Err: refused.
        type Want = Result<Option<Option<bool>>, ()>;
        let rows: Vec<(String, Want)> = vec![
            (text("hello"), Ok(Some(None))),
            (text("/stop"), Ok(Some(Some(true)))),
            (text("/stop@sendonce_bot"), Ok(Some(Some(true)))),
            (text("STOP"), Ok(Some(Some(true)))),
            (text("/start"), Ok(Some(Some(false)))),
            (text("/start promo"), Ok(Some(Some(false)))),
            (text("/help"), Ok(Some(None))),
            (text("don't stop"), Ok(Some(None))),
            (r#"{"update_id":11,"edited_message":{"message_id":5,"chat":{"id":42},"text":"x"}}"#.into(), Ok(None)),
            (r#"{"update_id":12,"message":{"message_id":5,"chat":{"id":42},"sticker":{}}}"#.into(), Ok(None)),
            (r#"{"update_id":-3}"#.into(), Ok(None)),
            (r#"{"update_id":"13"}"#.into(), Err(())),
            (r#"{"update_id":1.5}"#.into(), Err(())),
            (r#"{"message":{}}"#.into(), Err(())),
            (r#"{"update_id":14,"message":{"chat":{"id":42},"text":"x"}}"#.into(), Err(())),
            (r#"[1]"#.into(), Err(())),
            ("not json".into(), Err(())),
        ];
        for (body, want) in rows {
            let got = read(body.as_bytes());
            match (want, got) {
                (Err(()), Err(_)) => {}
                (Ok(None), Ok(u)) => assert_eq!(u.effect, Effect::None, "{body}"),
                (Ok(Some(opt)), Ok(Update { effect: Effect::Received { address, event, opt_out }, event_id })) => {
                    assert_eq!(event_id, 10);
                    assert_eq!(address, "telegram:42");
                    assert_eq!(opt_out, opt, "{body}");
                    let e: serde_json::Value = serde_json::from_slice(&event).expect("json");
                    assert_eq!(e["chat_id"], 42);
                    assert_eq!(e["sender"]["first_name"], "Ann");
                    assert_eq!(e["from"], "telegram:42");
                }
                (want, got) => panic!("{body}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn the_secret_is_compared_whole() {
        let i = Inbound::new(1, "default", "s3cret-token");
        assert!(i.admits(Some(b"s3cret-token")));
        for wrong in [&b"s3cret-toke"[..], b"s3cret-tokenx", b"", b"S3CRET-TOKEN"] {
            assert!(!i.admits(Some(wrong)), "{wrong:?}");
        }
        assert!(!i.admits(None));
        assert!(!format!("{i:?}").contains("s3cret"));
    }

    #[test]
    fn inbound_needs_a_token_and_a_valid_secret() {
        let vars = |pairs: &[(&'static str, &'static str)]| {
            Vars::from_pairs(pairs.iter().copied())
        };
        assert!(Inbound::configure(&vars(&[])).expect("ok").is_none());
        assert!(Inbound::configure(&vars(&[(BOT_TOKEN, "5:x")])).expect("ok").is_none());
        let i = Inbound::configure(&vars(&[(BOT_TOKEN, "5:x"), (WEBHOOK_SECRET, "abc_-1")]))
            .expect("ok")
            .expect("on");
        assert_eq!((i.bot_id, i.tenant.as_str()), (5, "default"));
        let i = Inbound::configure(&vars(&[(BOT_TOKEN, "5:x"), (WEBHOOK_SECRET, "abc"), (TENANT, "acme")]))
            .expect("ok")
            .expect("on");
        assert_eq!(i.tenant, "acme");
        assert!(Inbound::configure(&vars(&[(BOT_TOKEN, "5:x"), (WEBHOOK_SECRET, "no spaces")])).is_err());
    }
}
