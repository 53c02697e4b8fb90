//! What the Gateway API's answers mean: pure functions of the HTTP status
//! and the documented body (`{"ok":true,"result":...}` or
//! `{"ok":false,"error":"ERROR_NAME"}`), tested as tables.
//!
//! What the documentation (<https://core.telegram.org/gateway/api>) gives
//! us, and what it does not:
//! - `ok: false` is "an unsuccessful request": that call did nothing. Its
//!   `error` names only `ACCESS_TOKEN_INVALID` (as an example); every other
//!   name below (`FLOOD_WAIT_*`, `BALANCE_*`, `PHONE_NUMBER_*`) is not
//!   documented, so a name only chooses between trying again and giving up,
//!   never between "sent" and "not sent".
//! - A `request_id` from `checkSendAbility` makes one send free, "while
//!   repeated calls will result in an error": no error name, nothing about
//!   whether that error means the first went out, nothing about a repeat
//!   racing the first. So the adapter never repeats a send that may have
//!   gone out ([`Provider::dedupes_by_key`] is false), and no answer is read
//!   as "a repeat": an ambiguous send is settled by
//!   `checkVerificationStatus` ([`status`]).
//!
//! `checkSendAbility` ([`check`]) never sends anything, so no answer of it
//! is ambiguous:
//!
//! | answer | outcome |
//! |---|---|
//! | `ok` with `result.request_id` | the token the send carries |
//! | a bad or missing token, a balance too low (`ACCESS_TOKEN_*`, `BALANCE_*`, 401) | `Refused` |
//! | 429 or `FLOOD_WAIT[_n]`, 5xx, a body that is not the API's JSON, no answer | `Retryable` |
//! | any other error (`PHONE_NUMBER_NOT_FOUND`: the number cannot receive, `PHONE_NUMBER_INVALID`) | `Rejected` |
//!
//! `sendVerificationMessage` ([`send`]):
//!
//! | answer | class |
//! |---|---|
//! | `ok` with `result.request_id` | `Accepted`, id the request id |
//! | `ok` without a request id, 5xx, a 2xx that is not the API's JSON, no answer after the request was written | `Ambiguous` |
//! | 429 or `FLOOD_WAIT[_n]` | `Retryable` |
//! | `ACCESS_TOKEN_*`, `BALANCE_*`, 401 | `Refused` |
//! | any other error (a repeat's among them) | `Rejected` (after an earlier ambiguous attempt: `unknown`) |
//!
//! `checkVerificationStatus` ([`status`]), after an ambiguous send:
//!
//! | answer | reconciled |
//! |---|---|
//! | `ok` with `result.delivery_status` ("Returned only if a verification message was sent to the user") | `Sent`, id the request id |
//! | `ok` without it, an error, no answer | `Pending`: asked again, never sent again |
//!
//! [`Provider::dedupes_by_key`]: crate::provider::Provider::dedupes_by_key

use std::time::Duration;

use serde::Deserialize;

use crate::provider::{Reconciled, SendOutcome, cut_error_text};

/// The Gateway's answer envelope: `result` is a `RequestStatus` for the
/// send and the checks, `true` for a revoke.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<String>,
}

impl Reply {
    /// `result` as a `RequestStatus`, if it is one.
    pub fn request_status(&self) -> Option<RequestStatus> {
        self.result
            .as_ref()
            .and_then(|r| RequestStatus::deserialize(r).ok())
    }

    /// Whether a revoke was received: `ok` with `result` true ("Returns
    /// True if the revocation request was received").
    pub fn revoked(&self) -> bool {
        self.ok && self.result == Some(serde_json::Value::Bool(true))
    }
}

/// The parts of a `RequestStatus` the adapter reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RequestStatus {
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub delivery_status: Option<DeliveryStatus>,
}

/// A `DeliveryStatus`: `sent`, `delivered`, `read`, `expired`, `revoked`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DeliveryStatus {
    #[serde(default)]
    pub status: String,
}

/// What the API's error word says.
#[derive(Debug, PartialEq, Eq)]
enum Word {
    /// Our account cannot send at all.
    Account,
    /// Too many requests; after this long, if it says.
    Flood(Option<Duration>),
    /// Anything else: about this number or request.
    Other,
}

fn word(error: &str) -> Word {
    let e = error.to_ascii_uppercase();
    if e.starts_with("ACCESS_TOKEN") || e.starts_with("BALANCE") {
        Word::Account
    } else if let Some(rest) = e.strip_prefix("FLOOD_WAIT") {
        Word::Flood(
            rest.trim_start_matches('_')
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs),
        )
    } else {
        Word::Other
    }
}

/// An error answer (`ok: false`), as both calls read it.
struct Refusal {
    http_status: Option<u16>,
    /// The API's error word, if it said one.
    code: Option<String>,
    message: String,
    word: Word,
    retry_after: Option<Duration>,
}

impl Refusal {
    fn of(http_status: u16, reply: &Reply, retry_after: Option<Duration>) -> Self {
        let code = reply
            .error
            .as_deref()
            .filter(|e| !e.is_empty())
            .map(cut_error_text);
        let message = code.clone().unwrap_or_else(|| {
            format!("the Gateway API answered {http_status} without an error")
        });
        Refusal {
            http_status: Some(http_status),
            word: code.as_deref().map_or(Word::Other, word),
            code,
            message,
            retry_after,
        }
    }

    /// What both calls make of it: the account refused (401, `ACCESS_TOKEN_*`,
    /// `BALANCE_*`) or flood control; `Err(self)` for the rest.
    fn common(self) -> Result<SendOutcome, Self> {
        match (self.http_status, &self.word) {
            (Some(401), _) | (_, Word::Account) => Ok(SendOutcome::Refused {
                http_status: self.http_status,
                provider_code: self.code,
                message: self.message,
            }),
            (_, Word::Flood(after)) => Ok(SendOutcome::Retryable {
                http_status: self.http_status,
                provider_code: self.code,
                retry_after: after.or(self.retry_after),
                message: self.message,
            }),
            _ => Err(self),
        }
    }

    fn retryable(self) -> SendOutcome {
        SendOutcome::Retryable {
            http_status: self.http_status,
            provider_code: self.code,
            retry_after: self.retry_after,
            message: self.message,
        }
    }

    fn rejected(self, message: String) -> SendOutcome {
        SendOutcome::Rejected {
            http_status: self.http_status,
            provider_code: self.code,
            message,
        }
    }
}

/// The answer to `checkSendAbility`: the request id to send with, or how
/// the send ends without one (nothing was sent).
pub fn check(
    http_status: u16,
    reply: Option<&Reply>,
    retry_after: Option<Duration>,
) -> Result<String, SendOutcome> {
    let status = Some(http_status);
    let retry = |message: String, retry_after| SendOutcome::Retryable {
        http_status: status,
        provider_code: None,
        retry_after,
        message,
    };
    let Some(r) = reply else {
        return Err(retry(
            format!("checkSendAbility answered {http_status} with a body that is not the API's JSON"),
            retry_after,
        ));
    };
    if r.ok && (200..300).contains(&http_status) {
        return match r.request_status().and_then(|s| s.request_id) {
            Some(id) if !id.is_empty() => Ok(id),
            _ => Err(retry(
                "checkSendAbility said ok without a request_id".into(),
                None,
            )),
        };
    }
    Err(match Refusal::of(http_status, r, retry_after).common() {
        Ok(outcome) => outcome,
        Err(e) if http_status == 429 || (500..=599).contains(&http_status) => e.retryable(),
        Err(e) => {
            let message = format!("the number cannot get a Telegram code: {}", e.message);
            e.rejected(message)
        }
    })
}

/// The answer to `sendVerificationMessage`.
pub fn send(
    http_status: u16,
    reply: Option<&Reply>,
    retry_after: Option<Duration>,
) -> SendOutcome {
    let status = Some(http_status);
    let Some(r) = reply else {
        return match http_status {
            200..=299 | 500..=599 => SendOutcome::Ambiguous {
                http_status: status,
                retry_after,
                message: format!(
                    "the Gateway API answered {http_status} with a body that is not its JSON"
                ),
            },
            429 => SendOutcome::Retryable {
                http_status: status,
                provider_code: None,
                retry_after,
                message: "the Gateway API answered 429".into(),
            },
            401 => SendOutcome::Refused {
                http_status: status,
                provider_code: None,
                message: "the Gateway API refused the token (401)".into(),
            },
            _ => SendOutcome::Rejected {
                http_status: status,
                provider_code: None,
                message: format!("the Gateway API answered {http_status}"),
            },
        };
    };
    if r.ok && (200..300).contains(&http_status) {
        return match r.request_status().and_then(|s| s.request_id) {
            Some(id) if !id.is_empty() => SendOutcome::Accepted {
                provider_message_id: id,
                http_status: status,
            },
            _ => SendOutcome::Ambiguous {
                http_status: status,
                retry_after: None,
                message: "sendVerificationMessage said ok without a request_id".into(),
            },
        };
    }
    match Refusal::of(http_status, r, retry_after).common() {
        Ok(outcome) => outcome,
        Err(e) if http_status == 429 => e.retryable(),
        Err(e) if (500..=599).contains(&http_status) => SendOutcome::Ambiguous {
            http_status: e.http_status,
            retry_after: e.retry_after,
            message: e.message,
        },
        Err(e) => {
            let message = e.message.clone();
            e.rejected(message)
        }
    }
}

/// The answer to `checkVerificationStatus` for `request_id`, asked after
/// an ambiguous send: whether the Gateway sent a message under it.
pub fn status(request_id: &str, http_status: u16, reply: Option<&Reply>) -> Reconciled {
    let Some(r) = reply.filter(|r| r.ok && (200..300).contains(&http_status)) else {
        let word = reply.and_then(|r| r.error.clone());
        return Reconciled::Pending(format!(
            "checkVerificationStatus answered {http_status}{}: asking again, never sending again",
            word.map(|w| format!(" {}", cut_error_text(&w)))
                .unwrap_or_default()
        ));
    };
    match r.request_status().and_then(|s| s.delivery_status) {
        Some(_) => Reconciled::Sent {
            provider_message_id: request_id.to_string(),
        },
        None => Reconciled::Pending(
            "the Gateway shows no message sent under the request id yet: asking again, \
             never sending again"
                .into(),
        ),
    }
}

/// A transport error of a call: before the connection opened nothing was
/// sent; after, a send may have been (a check never sends: retried).
pub fn transport(method: &str, connect: bool, timeout: bool, sends: bool) -> SendOutcome {
    let message = if connect {
        format!("could not connect to the Gateway API ({method})")
    } else if timeout {
        format!("the Gateway API did not answer {method} in time")
    } else {
        format!("the connection failed before the Gateway API answered {method}")
    };
    if connect || !sends {
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message,
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(body: &str) -> Option<Reply> {
        serde_json::from_str(body).ok()
    }

    #[test]
    fn checks_classify_as_a_table() {
        let secs = Duration::from_secs;
        // (status, body, Retry-After, the token or the class, provider code)
        type Row = (u16, &'static str, Option<Duration>, Result<&'static str, &'static str>, Option<&'static str>);
        let rows: &[Row] = &[
            (200, r#"{"ok":true,"result":{"request_id":"r1","phone_number":"+1","request_cost":0.01}}"#, None, Ok("r1"), None),
            (200, r#"{"ok":true,"result":{}}"#, None, Err("retryable"), None),
            (200, "<html>", None, Err("retryable"), None),
            (400, r#"{"ok":false,"error":"PHONE_NUMBER_NOT_FOUND"}"#, None, Err("permanent"), Some("PHONE_NUMBER_NOT_FOUND")),
            (400, r#"{"ok":false,"error":"PHONE_NUMBER_INVALID"}"#, None, Err("permanent"), Some("PHONE_NUMBER_INVALID")),
            (401, r#"{"ok":false,"error":"ACCESS_TOKEN_INVALID"}"#, None, Err("refused"), Some("ACCESS_TOKEN_INVALID")),
            (400, r#"{"ok":false,"error":"BALANCE_NOT_ENOUGH"}"#, None, Err("refused"), Some("BALANCE_NOT_ENOUGH")),
            (429, r#"{"ok":false,"error":"FLOOD_WAIT_7"}"#, Some(secs(1)), Err("retryable"), Some("FLOOD_WAIT_7")),
            (500, r#"{"ok":false,"error":"INTERNAL_ERROR"}"#, None, Err("retryable"), Some("INTERNAL_ERROR")),
            (502, "bad gateway", None, Err("retryable"), None),
        ];
        for (status, body, after, want, code) in rows {
            let got = check(*status, reply(body).as_ref(), *after);
            match (&got, want) {
                (Ok(token), Ok(w)) => assert_eq!(token, w, "{body}"),
                (Err(o), Err(class)) => {
                    assert_eq!(o.class(), *class, "{body}: {o:?}");
                    let provider_code = match o {
                        SendOutcome::Rejected { provider_code, .. }
                        | SendOutcome::Refused { provider_code, .. }
                        | SendOutcome::Retryable { provider_code, .. } => provider_code.as_deref(),
                        _ => None,
                    };
                    assert_eq!(provider_code, *code, "{body}");
                }
                _ => panic!("{body}: {got:?}"),
            }
        }
        let flood = check(429, reply(r#"{"ok":false,"error":"FLOOD_WAIT_7"}"#).as_ref(), Some(secs(1)));
        assert!(matches!(flood, Err(SendOutcome::Retryable { retry_after: Some(d), .. }) if d == secs(7)), "{flood:?}");
    }

    #[test]
    fn sends_classify_as_a_table() {
        // (status, body, class, provider message id)
        let rows: &[(u16, &str, &str, Option<&str>)] = &[
            (200, r#"{"ok":true,"result":{"request_id":"r1","delivery_status":{"status":"sent","updated_at":1}}}"#, "ok", Some("r1")),
            // A repeat's error (its name is not documented) is a refusal
            // of this call like any other: after an earlier ambiguous
            // attempt, delivery ends the message `unknown`, never `failed`.
            (400, r#"{"ok":false,"error":"REQUEST_ID_ALREADY_USED"}"#, "permanent", None),
            (200, r#"{"ok":true,"result":{}}"#, "ambiguous", None),
            (200, "not json", "ambiguous", None),
            (500, r#"{"ok":false,"error":"INTERNAL_ERROR"}"#, "ambiguous", None),
            (503, "", "ambiguous", None),
            (429, r#"{"ok":false,"error":"FLOOD_WAIT_3"}"#, "retryable", None),
            (429, "", "retryable", None),
            (401, r#"{"ok":false,"error":"ACCESS_TOKEN_INVALID"}"#, "refused", None),
            (401, "", "refused", None),
            (400, r#"{"ok":false,"error":"PHONE_NUMBER_NOT_FOUND"}"#, "permanent", None),
            (400, r#"{"ok":false,"error":"CODE_INVALID"}"#, "permanent", None),
            (400, r#"{"ok":false,"error":"REQUEST_ID_INVALID"}"#, "permanent", None),
        ];
        for (status, body, class, id) in rows {
            let got = send(*status, reply(body).as_ref(), None);
            assert_eq!(got.class(), *class, "{body}: {got:?}");
            if let Some(id) = id {
                assert!(matches!(&got, SendOutcome::Accepted { provider_message_id, .. } if provider_message_id == id), "{got:?}");
            }
        }
    }

    #[test]
    fn status_lookups_reconcile_as_a_table() {
        // (status, body, sent?)
        let rows: &[(u16, &str, bool)] = &[
            (200, r#"{"ok":true,"result":{"request_id":"r1","delivery_status":{"status":"sent","updated_at":1}}}"#, true),
            (200, r#"{"ok":true,"result":{"request_id":"r1","delivery_status":{"status":"read","updated_at":1}}}"#, true),
            // No delivery status: no message went to the user yet.
            (200, r#"{"ok":true,"result":{"request_id":"r1","request_cost":0.01}}"#, false),
            (400, r#"{"ok":false,"error":"REQUEST_ID_INVALID"}"#, false),
            (500, "oops", false),
            (200, "not json", false),
        ];
        for (status, body, sent) in rows {
            let got = super::status("r1", *status, reply(body).as_ref());
            if *sent {
                assert_eq!(
                    got,
                    Reconciled::Sent {
                        provider_message_id: "r1".into()
                    },
                    "{body}"
                );
            } else {
                // Never "not sent": that would send again.
                assert!(matches!(got, Reconciled::Pending(_)), "{body}: {got:?}");
            }
        }
    }

    #[test]
    fn a_revoke_is_received_when_the_result_is_true() {
        let rows: &[(&str, bool)] = &[
            (r#"{"ok":true,"result":true}"#, true),
            (r#"{"ok":true,"result":false}"#, false),
            (r#"{"ok":false,"error":"REQUEST_ID_INVALID"}"#, false),
            (r#"{"ok":true}"#, false),
        ];
        for (body, want) in rows {
            assert_eq!(reply(body).is_some_and(|r| r.revoked()), *want, "{body}");
        }
    }

    #[test]
    fn transport_errors_are_ambiguous_only_for_a_send_that_was_written() {
        assert_eq!(transport("sendVerificationMessage", true, false, true).class(), "retryable");
        assert_eq!(transport("sendVerificationMessage", false, true, true).class(), "ambiguous");
        assert_eq!(transport("sendVerificationMessage", false, false, true).class(), "ambiguous");
        assert_eq!(transport("checkSendAbility", false, true, false).class(), "retryable");
    }
}
