//! The `http` provider: a JSON POST to a configured URL.
//!
//! Request: `{"to","from","body","reference"}` with `Idempotency-Key: <message
//! id>` (the same on every attempt of one message, which is what makes a
//! resend after an ambiguous outcome safe) and `Authorization: Bearer <token>`
//! when a token is configured. A 2xx JSON answer with a string `id` is
//! success; a 4xx answer's JSON `message`/`code` become the error. A `409`
//! is the IETF Idempotency-Key draft's "this key is still being processed":
//! ambiguous (the provider is acting on it), retried later under the same key.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;

use super::{OutgoingSms, Provider, ProviderError, SendOutcome, parse_retry_after};

pub mod receipts;
mod settings;

pub use receipts::{HttpReceipts, SECRET_HEADER, STATUS_PATH};
pub use settings::{ADAPTER, HttpSettings};

#[derive(Clone, Debug)]
pub struct HttpProvider {
    client: reqwest::Client,
    url: reqwest::Url,
    token: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    id: Option<serde_json::Value>,
    message: Option<serde_json::Value>,
    code: Option<serde_json::Value>,
}

impl HttpProvider {
    /// `timeout` bounds a whole attempt; `connect_timeout` the TCP/TLS connect,
    /// after which we know the request was never sent.
    pub fn new(
        url: &str,
        token: Option<String>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, ProviderError> {
        let what = "provider";
        let url = super::base_url(what, url)?;
        let client = super::http_client(timeout, connect_timeout)?;
        Ok(Self { client, url, token })
    }
}

fn json_string(v: Option<serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Classifies a transport error.
fn classify_error(e: &reqwest::Error) -> SendOutcome {
    if e.is_connect() {
        // Never connected: the provider cannot have seen the request.
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "could not connect to the provider".into(),
        }
    } else if e.is_builder() {
        // Failed while building the request: nothing was written.
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "the request could not be sent".into(),
        }
    } else if e.is_timeout() {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "the provider did not answer in time".into(),
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "the connection failed before the provider answered".into(),
        }
    }
}

#[async_trait]
impl Provider for HttpProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        true
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let to = match sms.phone() {
            Ok(to) => to,
            Err(refused) => return refused,
        };
        let key = sms.message_id.to_string();
        let mut req = self
            .client
            .post(self.url.clone())
            .header("Idempotency-Key", &key)
            .json(&serde_json::json!({
                "to": to,
                "from": sms.from,
                "body": sms.body,
                "reference": key,
            }));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return classify_error(&e),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = match super::read_body(resp, super::MAX_ANSWER_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return if status.is_success() || status.is_server_error() {
                    // The provider answered (or was answering) and the body
                    // was lost: it may well have sent.
                    SendOutcome::Ambiguous {
                        http_status: Some(status.as_u16()),
                        retry_after,
                        message: format!("reading the provider's answer failed: {}", e.describe()),
                    }
                } else {
                    classify_status(status, None, None, retry_after)
                };
            }
        };
        let answer: Option<Answer> = serde_json::from_slice(&body).ok();
        let (id, message, code) = match answer {
            Some(a) => (
                json_string(a.id),
                json_string(a.message),
                json_string(a.code),
            ),
            None => (None, None, None),
        };
        if status.is_success() {
            return match id {
                Some(id) if !id.is_empty() => SendOutcome::Accepted {
                    provider_message_id: id,
                    http_status: Some(status.as_u16()),
                },
                _ => SendOutcome::Ambiguous {
                    http_status: Some(status.as_u16()),
                    retry_after: None,
                    message: "the provider answered 2xx without a message id".into(),
                },
            };
        }
        classify_status(status, message, code, retry_after)
    }
}

/// Classifies a non-2xx status.
fn classify_status(
    status: StatusCode,
    message: Option<String>,
    code: Option<String>,
    retry_after: Option<Duration>,
) -> SendOutcome {
    let http_status = Some(status.as_u16());
    let message = message.map_or_else(
        || format!("the provider answered {status}"),
        |m| super::cut_error_text(&m),
    );
    match status.as_u16() {
        // Asked to come back later: the request was not acted on.
        408 | 425 | 429 => SendOutcome::Retryable {
            http_status,
            provider_code: code,
            retry_after,
            message,
        },
        // 503 with Retry-After is the documented "not now" answer.
        503 if retry_after.is_some() => SendOutcome::Retryable {
            http_status,
            provider_code: code,
            retry_after,
            message,
        },
        // The IETF Idempotency-Key draft's "a request with this key is
        // still being processed" (Stripe, Sinch): the provider is acting on
        // our message right now. Never a refusal: ask again (the same key)
        // later, and it answers what the first request did.
        409 => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        },
        // Bad or insufficient credentials: a refusal of everything we
        // send, not of this message.
        401 | 403 => SendOutcome::Refused {
            http_status,
            provider_code: code,
            message,
        },
        // 4xx: a permanent refusal. 3xx: we were redirected (a
        // misconfigured URL), and the provider did not act on this request.
        300..=499 => SendOutcome::Rejected {
            http_status,
            provider_code: code,
            message,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        let c = |s: u16, ra: Option<u64>| {
            classify_status(
                StatusCode::from_u16(s).unwrap(),
                None,
                None,
                ra.map(Duration::from_secs),
            )
        };
        assert!(matches!(c(400, None), SendOutcome::Rejected { .. }));
        assert!(matches!(c(404, None), SendOutcome::Rejected { .. }));
        assert!(matches!(c(401, None), SendOutcome::Refused { .. }));
        assert!(matches!(c(403, None), SendOutcome::Refused { .. }));
        assert!(matches!(c(408, None), SendOutcome::Retryable { .. }));
        assert!(matches!(c(425, None), SendOutcome::Retryable { .. }));
        assert!(
            matches!(c(429, Some(3)), SendOutcome::Retryable { retry_after: Some(d), .. } if d == Duration::from_secs(3))
        );
        assert!(matches!(c(503, Some(1)), SendOutcome::Retryable { .. }));
        assert!(matches!(c(503, None), SendOutcome::Ambiguous { .. }));
        assert!(matches!(c(500, None), SendOutcome::Ambiguous { .. }));
        assert!(matches!(c(302, None), SendOutcome::Rejected { .. }));
        // 409: the same key is still being processed (IETF draft), never
        // a refusal of the message.
        assert!(matches!(c(409, Some(1)), SendOutcome::Ambiguous { .. }));
        assert!(matches!(c(422, None), SendOutcome::Rejected { .. }));
        assert!(matches!(c(502, None), SendOutcome::Ambiguous { .. }));
    }
}
