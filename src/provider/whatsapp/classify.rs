//! What the Cloud API's answers to `POST /{phone-number-id}/messages` mean:
//! pure functions of the HTTP status and the documented body, tested as
//! tables.
//!
//! A send is answered `{"messaging_product":"whatsapp","contacts":[...],
//! "messages":[{"id":"wamid...."}]}`, or with Graph API's error object
//! `{"error":{"message","type","code","error_data":{"details"},
//! "error_subcode","fbtrace_id"}}`. Meta asks that errors be handled by
//! their `code` "instead of subcodes or HTTP response status codes", so
//! the code decides first; the HTTP status only where the code is unknown
//! or absent (docs/providers.md cites each row):
//!
//! | answer | class |
//! |---|---|
//! | 2xx with `messages[0].id` | `Accepted`, id the `wamid` |
//! | 2xx without an id, or not the API's JSON | `Ambiguous` (it may have been taken) |
//! | 130429 (throughput), 131056 (pair rate), 4 (app call rate), 80007 (account rate) | `Retryable`: "Message failed to send", retried with backoff |
//! | 0, 3, 10, 190, 200-299 (token, permissions), 33, 368, 131031, 131042, 131045, 131048, 133010 (the account or its number cannot send) | `Refused` |
//! | 132000, 132001, 132005, 132007, 132012, 132015, 132016 (the template cannot be sent) | `Refused`: no message can go until the operator fixes it |
//! | 1, 2, 131000 (unknown error, service down or overloaded) | `Ambiguous`: Meta does not say nothing was sent |
//! | any other code with a 4xx (131026, 131008, 131009, 100, ...) | `Rejected`: this message was refused |
//! | any other code, or none, with a 5xx; a timeout or a connection cut after the request was written | `Ambiguous` |
//! | no body: 429 `Retryable`, 401/403 `Refused`, other 4xx and 3xx `Rejected` | |
//! | could not connect (nothing written) | `Retryable` |
//!
//! An ambiguous send is never made again (Meta documents no idempotency
//! key, nor a lookup): the message ends `unknown`.

use std::time::Duration;

use serde::Deserialize;

use crate::provider::{SendOutcome, cut_error_text};

/// The answer's parts the adapter reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub messages: Vec<SentMessage>,
    #[serde(default)]
    pub error: Option<GraphError>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SentMessage {
    #[serde(default)]
    pub id: Option<String>,
}

/// Graph API's error object.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GraphError {
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub code: Option<serde_json::Value>,
    #[serde(default)]
    pub error_data: Option<ErrorData>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ErrorData {
    #[serde(default)]
    pub details: Option<String>,
}

impl GraphError {
    /// The code, a JSON number (or a number in a string).
    pub fn code(&self) -> Option<i64> {
        match self.code.as_ref()? {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    fn text(&self) -> String {
        let message = self.message.as_deref().unwrap_or("").trim();
        let details = self
            .error_data
            .as_ref()
            .and_then(|d| d.details.as_deref())
            .unwrap_or("")
            .trim();
        let text = match (message.is_empty(), details.is_empty()) {
            (false, false) => format!("{message}: {details}"),
            (false, true) => message.to_string(),
            (true, false) => details.to_string(),
            (true, true) => "the WhatsApp Cloud API refused the message".to_string(),
        };
        cut_error_text(&text)
    }
}

/// What an error code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A rate limit: this message was not sent; try again later.
    RateLimited,
    /// The account, its token or its number cannot send anything now.
    Account,
    /// The template cannot be sent (missing, paused, disabled, or its
    /// parameters do not fit).
    Template,
    /// Meta does not say whether anything was sent.
    Unknown,
    /// Any other code: read with the HTTP status.
    Other,
}

/// The kind of error `code`.
pub fn kind(code: i64) -> Kind {
    match code {
        130429 | 131056 | 4 | 80007 => Kind::RateLimited,
        0 | 3 | 10 | 190 | 200..=299 | 33 | 368 | 131031 | 131042 | 131045 | 131048 | 133010 => {
            Kind::Account
        }
        132000 | 132001 | 132005 | 132007 | 132012 | 132015 | 132016 => Kind::Template,
        1 | 2 | 131000 => Kind::Unknown,
        _ => Kind::Other,
    }
}

/// The answer to a send.
pub fn send(http_status: u16, reply: Option<&Reply>, retry_after: Option<Duration>) -> SendOutcome {
    let status = Some(http_status);
    let ok = (200..300).contains(&http_status);
    if ok && let Some(r) = reply.filter(|r| r.error.is_none()) {
        return match r.messages.first().and_then(|m| m.id.clone()) {
            Some(id) if !id.trim().is_empty() => SendOutcome::Accepted {
                provider_message_id: id,
                http_status: status,
            },
            _ => SendOutcome::Ambiguous {
                http_status: status,
                retry_after: None,
                message: "the WhatsApp Cloud API answered without a message id".into(),
            },
        };
    }
    let Some(error) = reply.and_then(|r| r.error.as_ref()) else {
        return without_error_object(http_status, retry_after);
    };
    let code = error.code();
    let provider_code = code.map(|c| c.to_string());
    let message = error.text();
    let by_status = || match http_status {
        200..=299 | 500..=599 => SendOutcome::Ambiguous {
            http_status: status,
            retry_after,
            message: message.clone(),
        },
        429 => SendOutcome::Retryable {
            http_status: status,
            provider_code: provider_code.clone(),
            retry_after,
            message: message.clone(),
        },
        401 | 403 => SendOutcome::Refused {
            http_status: status,
            provider_code: provider_code.clone(),
            message: message.clone(),
        },
        _ => SendOutcome::Rejected {
            http_status: status,
            provider_code: provider_code.clone(),
            message: message.clone(),
        },
    };
    match code.map(kind) {
        Some(Kind::RateLimited) => SendOutcome::Retryable {
            http_status: status,
            provider_code,
            retry_after,
            message,
        },
        Some(Kind::Account | Kind::Template) => SendOutcome::Refused {
            http_status: status,
            provider_code,
            message,
        },
        Some(Kind::Unknown) => SendOutcome::Ambiguous {
            http_status: status,
            retry_after,
            message: match provider_code {
                Some(c) => format!("{message} (code {c})"),
                None => message,
            },
        },
        Some(Kind::Other) | None => by_status(),
    }
}

/// An answer without Graph API's error object: its HTTP status alone.
fn without_error_object(http_status: u16, retry_after: Option<Duration>) -> SendOutcome {
    let status = Some(http_status);
    match http_status {
        200..=299 | 500..=599 => SendOutcome::Ambiguous {
            http_status: status,
            retry_after,
            message: format!(
                "the WhatsApp Cloud API answered {http_status} with a body that is not its JSON"
            ),
        },
        429 => SendOutcome::Retryable {
            http_status: status,
            provider_code: None,
            retry_after,
            message: "the WhatsApp Cloud API answered 429".into(),
        },
        401 | 403 => SendOutcome::Refused {
            http_status: status,
            provider_code: None,
            message: format!("the WhatsApp Cloud API refused the token ({http_status})"),
        },
        _ => SendOutcome::Rejected {
            http_status: status,
            provider_code: None,
            message: format!("the WhatsApp Cloud API answered {http_status}"),
        },
    }
}

/// A code the template cannot carry (none, or longer than its 15
/// characters): refused before any request, nothing sent.
pub fn code_refusal(body: &str) -> Option<SendOutcome> {
    let code = body.trim();
    let fits = !code.is_empty()
        && code.chars().count() <= super::MAX_CODE_CHARS
        && !code.chars().any(char::is_whitespace);
    (!fits).then(|| SendOutcome::Rejected {
        http_status: None,
        provider_code: None,
        message: format!(
            "a WhatsApp authentication template carries a code of 1 to {} characters, \
             without spaces; this message's body is not one",
            super::MAX_CODE_CHARS
        ),
    })
}

/// A transport error: before the connection opened nothing was sent;
/// after, the message may have been.
pub fn transport(connect: bool, timeout: bool) -> SendOutcome {
    if connect {
        return SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "could not connect to the WhatsApp Cloud API".into(),
        };
    }
    SendOutcome::Ambiguous {
        http_status: None,
        retry_after: None,
        message: if timeout {
            "the WhatsApp Cloud API did not answer in time".into()
        } else {
            "the connection failed before the WhatsApp Cloud API answered".into()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(body: &str) -> Option<Reply> {
        serde_json::from_str(body).ok()
    }

    fn error(code: i64) -> String {
        serde_json::json!({"error": {
            "message": format!("(#{code}) title"), "type": "OAuthException", "code": code,
            "error_data": {"messaging_product": "whatsapp", "details": "details"},
            "error_subcode": 2494055, "fbtrace_id": "Az8or2yhqkZfEZ-_4Qn_Bam"
        }})
        .to_string()
    }

    #[test]
    fn sends_classify_as_a_table() {
        let ok = r#"{"messaging_product":"whatsapp","contacts":[{"input":"+14155550123","wa_id":"14155550123"}],"messages":[{"id":"wamid.HBgL"}]}"#;
        // (HTTP status, body, class, provider code)
        let rows: Vec<(u16, String, &str, Option<&str>)> = vec![
            (200, ok.into(), "ok", None),
            (200, r#"{"messaging_product":"whatsapp","messages":[{"id":"wamid.X","message_status":"accepted"}]}"#.into(), "ok", None),
            (200, r#"{"messaging_product":"whatsapp","messages":[]}"#.into(), "ambiguous", None),
            (200, r#"{"messages":[{"id":""}]}"#.into(), "ambiguous", None),
            (200, "<html>".into(), "ambiguous", None),
            // Rate limits: "Message failed to send", retried.
            (400, error(130429), "retryable", Some("130429")),
            (429, error(130429), "retryable", Some("130429")),
            (400, error(131056), "retryable", Some("131056")),
            (400, error(4), "retryable", Some("4")),
            (400, error(80007), "retryable", Some("80007")),
            // The account, its token, its number: refused.
            (401, error(190), "refused", Some("190")),
            (401, error(0), "refused", Some("0")),
            (500, error(3), "refused", Some("3")),
            (403, error(10), "refused", Some("10")),
            (403, error(200), "refused", Some("200")),
            (400, error(131031), "refused", Some("131031")),
            (400, error(131042), "refused", Some("131042")),
            (400, error(368), "refused", Some("368")),
            (400, error(133010), "refused", Some("133010")),
            // The template.
            (404, error(132001), "refused", Some("132001")),
            (400, error(132000), "refused", Some("132000")),
            (400, error(132015), "refused", Some("132015")),
            // Meta does not say nothing went.
            (500, error(131000), "ambiguous", None),
            (400, error(1), "ambiguous", None),
            (503, error(2), "ambiguous", None),
            // This message refused.
            (400, error(131026), "permanent", Some("131026")),
            (400, error(131008), "permanent", Some("131008")),
            (400, error(131009), "permanent", Some("131009")),
            (400, error(100), "permanent", Some("100")),
            // An unknown code: its HTTP status.
            (400, error(999_999), "permanent", Some("999999")),
            (502, error(999_999), "ambiguous", None),
            (429, error(999_999), "retryable", Some("999999")),
            (401, error(999_999), "refused", Some("999999")),
            (200, error(999_999), "ambiguous", None),
            // No error object.
            (500, "".into(), "ambiguous", None),
            (503, "Service Unavailable".into(), "ambiguous", None),
            (429, "".into(), "retryable", None),
            (401, "".into(), "refused", None),
            (404, "".into(), "permanent", None),
            (302, "".into(), "permanent", None),
            // A code sent as a string is still the code.
            (400, r#"{"error":{"message":"x","code":"131056"}}"#.into(), "retryable", Some("131056")),
        ];
        for (status, body, class, code) in rows {
            let got = send(status, reply(&body).as_ref(), None);
            assert_eq!(got.class(), class, "{status} {body}: {got:?}");
            let provider_code = match &got {
                SendOutcome::Rejected { provider_code, .. }
                | SendOutcome::Refused { provider_code, .. }
                | SendOutcome::Retryable { provider_code, .. } => provider_code.as_deref(),
                _ => None,
            };
            assert_eq!(provider_code, code, "{status} {body}");
        }
        let accepted = send(200, reply(ok).as_ref(), None);
        assert_eq!(
            accepted,
            SendOutcome::Accepted {
                provider_message_id: "wamid.HBgL".into(),
                http_status: Some(200)
            }
        );
    }

    #[test]
    fn a_rate_limit_keeps_retry_after_and_the_error_text() {
        let after = Some(Duration::from_secs(7));
        let got = send(400, reply(&error(130429)).as_ref(), after);
        assert_eq!(
            got,
            SendOutcome::Retryable {
                http_status: Some(400),
                provider_code: Some("130429".into()),
                retry_after: after,
                message: "(#130429) title: details".into(),
            }
        );
    }

    #[test]
    fn codes_the_template_cannot_carry_are_refused_before_any_request() {
        for ok in ["482913", "1234", "ABCDEFGHIJKLMNO"] {
            assert_eq!(code_refusal(ok), None, "{ok}");
        }
        for bad in ["", "   ", "1234567890123456", "12 34", "Your code is 482913"] {
            assert_eq!(
                code_refusal(bad).map(|o| o.class()),
                Some("permanent"),
                "{bad}"
            );
        }
    }

    #[test]
    fn transport_errors_are_ambiguous_once_the_request_may_have_been_written() {
        assert_eq!(transport(true, false).class(), "retryable");
        assert_eq!(transport(false, true).class(), "ambiguous");
        assert_eq!(transport(false, false).class(), "ambiguous");
    }
}
