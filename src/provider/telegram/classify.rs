//! What the Bot API's answers to `sendMessage` mean: pure functions of the
//! HTTP status and the documented body (`{"ok":true,"result":Message}` or
//! `{"ok":false,"error_code","description","parameters":{"retry_after"}}`),
//! tested as tables.
//!
//! | answer | class |
//! |---|---|
//! | `ok: true` with `result.message_id` | `Accepted`, id `<chat_id>:<message_id>` |
//! | `ok: true` without a message id, or a 2xx that is not the Bot API's JSON | `Ambiguous` |
//! | 429 | `Retryable`, after `parameters.retry_after` (else `Retry-After`) |
//! | 401, 404 (a wrong or revoked token: the bot's URL does not exist) | `Refused` |
//! | 403 (blocked by the user, kicked, deactivated user) | `Rejected`; the chat is opted out ([`opts_out`]) |
//! | 400 (chat not found, empty text, ...) and any other 3xx/4xx | `Rejected` |
//! | 5xx, or a body whose `error_code` is 5xx | `Ambiguous` |
//!
//! The body's `error_code` decides when there is one (it is the HTTP
//! status the Bot API answered with); else the HTTP status.

use std::time::Duration;

use serde::Deserialize;

use crate::domain::{AttemptOutcome, Recipient};
use crate::provider::{SendOutcome, cut_error_text};

/// The Bot API's answer envelope.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub result: Option<SentMessage>,
    #[serde(default)]
    pub error_code: Option<i64>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<ResponseParameters>,
}

/// The part of a `Message` a send needs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SentMessage {
    #[serde(default)]
    pub message_id: Option<i64>,
}

/// `ResponseParameters`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResponseParameters {
    #[serde(default)]
    pub retry_after: Option<u64>,
    #[serde(default)]
    pub migrate_to_chat_id: Option<i64>,
}

/// The provider code of a 403 (the user blocked the bot, ...).
pub const BLOCKED: &str = "403";

/// Classifies an answer: its HTTP status, its body if it parsed as the
/// Bot API's envelope, `Retry-After` if one came.
pub fn classify(
    chat_id: i64,
    http_status: u16,
    reply: Option<&Reply>,
    retry_after_header: Option<Duration>,
) -> SendOutcome {
    let status = Some(http_status);
    let Some(reply) = reply else {
        return match http_status {
            200..=299 | 500..=599 => SendOutcome::Ambiguous {
                http_status: status,
                retry_after: retry_after_header,
                message: format!(
                    "the Bot API answered {http_status} with a body that is not its JSON"
                ),
            },
            _ => by_code(i64::from(http_status), status, None, retry_after_header),
        };
    };
    if reply.ok && (200..=299).contains(&http_status) {
        return match reply.result.as_ref().and_then(|m| m.message_id) {
            Some(id) => SendOutcome::Accepted {
                provider_message_id: format!("{chat_id}:{id}"),
                http_status: status,
            },
            None => SendOutcome::Ambiguous {
                http_status: status,
                retry_after: None,
                message: "the Bot API said ok without a message_id".into(),
            },
        };
    }
    let code = reply.error_code.unwrap_or(i64::from(http_status));
    let retry_after = reply
        .parameters
        .as_ref()
        .and_then(|p| p.retry_after)
        .map(Duration::from_secs)
        .or(retry_after_header);
    by_code(code, status, Some(reply), retry_after)
}

fn by_code(
    code: i64,
    http_status: Option<u16>,
    reply: Option<&Reply>,
    retry_after: Option<Duration>,
) -> SendOutcome {
    let mut message = reply
        .and_then(|r| r.description.as_deref())
        .filter(|d| !d.is_empty())
        .map(cut_error_text)
        .unwrap_or_else(|| format!("the Bot API answered error {code}"));
    if let Some(to) = reply
        .and_then(|r| r.parameters.as_ref())
        .and_then(|p| p.migrate_to_chat_id)
    {
        message = format!("{message} (the group is now the supergroup telegram:{to})");
    }
    let provider_code = Some(code.to_string());
    match code {
        429 => SendOutcome::Retryable {
            http_status,
            provider_code,
            retry_after,
            message,
        },
        401 | 404 => SendOutcome::Refused {
            http_status,
            provider_code,
            message,
        },
        300..=499 => SendOutcome::Rejected {
            http_status,
            provider_code,
            message,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        },
    }
}

/// Classifies a transport error of the send: before the connection opened
/// nothing was sent; after, the Bot API may have sent it.
pub fn transport(connect: bool, timeout: bool) -> SendOutcome {
    let message = if connect {
        "could not connect to the Bot API"
    } else if timeout {
        "the Bot API did not answer in time"
    } else {
        "the connection failed before the Bot API answered"
    };
    if connect {
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: message.into(),
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: message.into(),
        }
    }
}

/// Whether a finished attempt to `to` means its chat opted out: the Bot
/// API refused it with 403 (the user blocked the bot, the bot was removed
/// from the group, the user is deactivated): every later message to the
/// chat would be refused alike.
pub fn opts_out(to: &Recipient, outcome: AttemptOutcome, provider_code: Option<&str>) -> bool {
    to.chat().is_some()
        && outcome == AttemptOutcome::Rejected
        && provider_code == Some(BLOCKED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(body: &str) -> Option<Reply> {
        serde_json::from_str(body).ok()
    }

    #[test]
    fn answers_classify_as_a_table() {
        let secs = Duration::from_secs;
        // (status, body, Retry-After, class, provider id or code, retry_after)
        type Row = (u16, &'static str, Option<Duration>, &'static str, Option<&'static str>, Option<Duration>);
        let rows: &[Row] = &[
            (200, r#"{"ok":true,"result":{"message_id":7,"chat":{"id":42,"type":"private"},"date":1,"text":"hi"}}"#, None, "ok", Some("42:7"), None),
            (200, r#"{"ok":true,"result":{"chat":{"id":42}}}"#, None, "ambiguous", None, None),
            (200, r#"{"ok":true}"#, None, "ambiguous", None, None),
            (200, "<html>", None, "ambiguous", None, None),
            (429, r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 5","parameters":{"retry_after":5}}"#, None, "retryable", Some("429"), Some(secs(5))),
            (429, r#"{"ok":false,"error_code":429,"description":"Too Many Requests"}"#, Some(secs(3)), "retryable", Some("429"), Some(secs(3))),
            (429, "", Some(secs(2)), "retryable", Some("429"), Some(secs(2))),
            (400, r#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#, None, "permanent", Some("400"), None),
            (400, r#"{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-1001}}"#, None, "permanent", Some("400"), None),
            (403, r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#, None, "permanent", Some("403"), None),
            (401, r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#, None, "refused", Some("401"), None),
            (404, r#"{"ok":false,"error_code":404,"description":"Not Found"}"#, None, "refused", Some("404"), None),
            (401, "", None, "refused", Some("401"), None),
            (500, r#"{"ok":false,"error_code":500,"description":"Internal Server Error"}"#, None, "ambiguous", None, None),
            (502, "<html>bad gateway</html>", None, "ambiguous", None, None),
            (409, r#"{"ok":false,"error_code":409,"description":"Conflict"}"#, None, "permanent", Some("409"), None),
            // The body's error_code decides over the HTTP status.
            (200, r#"{"ok":false,"error_code":403,"description":"Forbidden: user is deactivated"}"#, None, "permanent", Some("403"), None),
        ];
        for (status, body, header, class, id_or_code, retry) in rows {
            let got = classify(42, *status, reply(body).as_ref(), *header);
            assert_eq!(got.class(), *class, "{status} {body}: {got:?}");
            match &got {
                SendOutcome::Accepted { provider_message_id, .. } => {
                    assert_eq!(Some(provider_message_id.as_str()), *id_or_code)
                }
                SendOutcome::Rejected { provider_code, .. }
                | SendOutcome::Refused { provider_code, .. } => {
                    assert_eq!(provider_code.as_deref(), *id_or_code, "{body}")
                }
                SendOutcome::Retryable { provider_code, retry_after, .. } => {
                    assert_eq!(provider_code.as_deref(), *id_or_code, "{body}");
                    assert_eq!(retry_after, retry, "{body}");
                }
                SendOutcome::Ambiguous { .. } => assert_eq!(*id_or_code, None),
            }
        }
        let migrated = classify(42, 400, reply(rows[8].1).as_ref(), None);
        assert!(
            matches!(&migrated, SendOutcome::Rejected { message, .. } if message.contains("telegram:-1001")),
            "{migrated:?}"
        );
    }

    #[test]
    fn transport_errors_before_and_after_the_request() {
        assert_eq!(transport(true, false).class(), "retryable");
        assert_eq!(transport(false, true).class(), "ambiguous");
        assert_eq!(transport(false, false).class(), "ambiguous");
    }

    #[test]
    fn only_a_refused_chat_opts_out() {
        let chat = Recipient::from_stored("telegram:42", crate::provider::registry::chat_channels()).expect("chat");
        let number = Recipient::from_stored("+14155550100", &[]).expect("number");
        // (recipient, outcome, code, opts out)
        let rows = [
            (&chat, AttemptOutcome::Rejected, Some("403"), true),
            (&chat, AttemptOutcome::Rejected, Some("400"), false),
            (&chat, AttemptOutcome::Refused, Some("403"), false),
            (&chat, AttemptOutcome::Sent, None, false),
            (&number, AttemptOutcome::Rejected, Some("403"), false),
        ];
        for (to, outcome, code, want) in rows {
            assert_eq!(opts_out(to, outcome, code), want, "{to} {outcome:?} {code:?}");
        }
    }
}
