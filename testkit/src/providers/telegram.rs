//! The mock's Telegram Bot API, written from
//! <https://core.telegram.org/bots/api>: `POST /bot<token>/sendMessage`
//! with `chat_id` and `text` (JSON or form), answered
//! `{"ok":true,"result":Message}` or
//! `{"ok":false,"error_code","description","parameters":{"retry_after"}}`
//! with the same HTTP status. As the real API, it does not de-duplicate:
//! every accepted call is a new message with the chat's next
//! `message_id` (counted per chat and text, `MockProvider::deliveries_to`
//! with the chat id as the recipient).
//!
//! Chats can be made unknown (400 `Bad Request: chat not found`) or to have
//! blocked the bot (403 `Forbidden: bot was blocked by the user`); a token
//! other than the one set is 401 `Unauthorized`. Scripted behaviours: a 429
//! is flood control with `parameters.retry_after` (the scripted
//! `retry_after`, else 1), another 4xx its `error_code`, a 5xx `500
//! Internal Server Error`; accept-then-drop, hang and the rest as for the
//! other protocols.

use std::collections::{HashMap, HashSet};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;

use crate::mock_provider::{Busy, Call, DropSwitch, MockProvider, Answer, Played, play, json_answer};

/// The Bot API's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router.route("/{bot}/sendMessage", post(send_message))
}

/// What only the Bot API keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    messages: Vec<TelegramMessage>,
    /// The bot's token, when the mock checks it.
    token: Option<String>,
    unknown: HashSet<i64>,
    blocked: HashSet<i64>,
    next_id: HashMap<i64, i64>,
}

/// A message the bot sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelegramMessage {
    pub chat_id: i64,
    pub message_id: i64,
    pub text: String,
}

impl MockProvider {
    /// Checks the token in the path (a mismatch: 401).
    pub fn set_telegram_token(&self, token: &str) {
        self.lock().protocol::<Protocol>().token = Some(token.into());
    }

    /// `chat` is unknown to the bot: 400 chat not found.
    pub fn telegram_unknown_chat(&self, chat: i64) {
        self.lock().protocol::<Protocol>().unknown.insert(chat);
    }

    /// `chat`'s user blocked the bot: 403.
    pub fn telegram_block(&self, chat: i64) {
        self.lock().protocol::<Protocol>().blocked.insert(chat);
    }

    /// The messages the bot sent, oldest first.
    pub fn telegram_messages(&self) -> Vec<TelegramMessage> {
        self.lock().protocol::<Protocol>().messages.clone()
    }

    fn telegram_create(&self, chat_id: i64, text: &str) -> TelegramMessage {
        let mut inner = self.lock();
        *inner
            .by_recipient_body
            .entry((chat_id.to_string(), text.to_string()))
            .or_default() += 1;
        let p = inner.protocol::<Protocol>();
        let next = p.next_id.entry(chat_id).or_insert(0);
        *next += 1;
        let m = TelegramMessage {
            chat_id,
            message_id: *next,
            text: text.to_string(),
        };
        p.messages.push(m.clone());
        m
    }
}

fn ok(m: &TelegramMessage) -> Response {
    json_answer(
        StatusCode::OK,
        &serde_json::json!({
            "ok": true,
            "result": {
                "message_id": m.message_id,
                "from": {"id": 1, "is_bot": true, "first_name": "sendonce"},
                "chat": {"id": m.chat_id, "type": "private"},
                "date": 1_700_000_000,
                "text": m.text,
            }
        }),
        None,
    )
}

fn error(code: u16, description: &str, retry_after: Option<u64>) -> Response {
    let mut body = serde_json::json!({"ok": false, "error_code": code, "description": description});
    if let Some(secs) = retry_after {
        body["parameters"] = serde_json::json!({ "retry_after": secs });
    }
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_answer(status, &body, None)
}

fn failure(status: u16, retry_after: Option<u64>) -> Response {
    match status {
        429 => {
            let secs = retry_after.unwrap_or(1);
            error(429, &format!("Too Many Requests: retry after {secs}"), Some(secs))
        }
        401 => error(401, "Unauthorized", None),
        403 => error(403, "Forbidden: bot was blocked by the user", None),
        400 => error(400, "Bad Request: chat not found", None),
        s @ 300..=499 => error(s, "Bad Request", None),
        _ => error(500, "Internal Server Error", None),
    }
}

async fn send_message(
    State(mock): State<MockProvider>,
    Path(bot): Path<String>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let params: HashMap<String, serde_json::Value> = if json_body {
        serde_json::from_slice(&body).unwrap_or_default()
    } else {
        form_urlencoded::parse(&body)
            .map(|(k, v)| (k.into_owned(), serde_json::Value::String(v.into_owned())))
            .collect()
    };
    let busy = Busy::new(&mock);
    let (behaviour, latency, token, unknown, blocked) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "telegram".into(),
            idempotency_key: None,
            authorization: None,
            body: serde_json::to_value(&params).unwrap_or(serde_json::Value::Null),
        });
        let (behaviour, latency) = inner.next_behaviour();
        let p = inner.protocol::<Protocol>();
        (behaviour, latency, p.token.clone(), p.unknown.clone(), p.blocked.clone())
    };
    let Some(given) = bot.strip_prefix("bot") else {
        return error(404, "Not Found", None);
    };
    if token.is_some_and(|t| t != given) {
        return error(401, "Unauthorized", None);
    }
    let chat_id = params.get("chat_id").and_then(|v| match v {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    });
    let Some(chat_id) = chat_id else {
        return error(400, "Bad Request: chat_id is empty", None);
    };
    let text = params.get("text").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    if text.is_empty() {
        return error(400, "Bad Request: message text is empty", None);
    }
    if unknown.contains(&chat_id) {
        return error(400, "Bad Request: chat not found", None);
    }
    if blocked.contains(&chat_id) {
        return error(403, "Forbidden: bot was blocked by the user", None);
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, text) = (mock.clone(), text.clone());
        move || mock.telegram_create(chat_id, &text)
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(record) => return ok(&record),
        Played::Lost => return failure(500, None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => ok(&create()),
        Answer::Fail { status, retry_after, .. } => failure(status, retry_after),
        Answer::AcceptThenFail { status } => {
            create();
            failure(status.max(500), None)
        }
        Answer::AcceptThenRetryLater { status, .. } => {
            create();
            failure(status.max(500), None)
        }
        Answer::RejectQuoting { status } => {
            error(status, &format!("Bad Request: can't parse entities in '{text}'"), None)
        }
    }
}
