//! The `vonage` provider: Vonage's SMS API (`POST {base}/sms/json`).
//!
//! Send: form-encoded `api_key`, `api_secret`, `from` (the request's, else
//! `VONAGE_FROM`), `to` (E.164 digits, no `+`), `text`, `type=unicode` when
//! the body is not GSM-7 (the segment counter decides), `client-ref` (our
//! message id), `status-report-req=1`, `callback` (our receipt endpoint,
//! when the public URL is known) and `ttl` (what is left of the validity,
//! in milliseconds, within Vonage's range).
//!
//! The answer is `200` with `{"message-count", "messages": [...]}`, one
//! entry per part of a concatenated message, each with its own `status`
//! (`"0"` accepted, with a `message-id`) and `error-text`. Per part:
//!
//! | `status` | meaning | class |
//! |---|---|---|
//! | 0 | accepted | `Accepted` (the first part's `message-id` is the message's) |
//! | 1 | throttled | `Retryable` |
//! | 4, 8, 9 | invalid credentials, account barred, out of credit | `Refused` (the account; another provider may send) |
//! | 5 | internal error | `Ambiguous` (Vonage may have acted) |
//! | 2, 3, 6, 7 and any other | about the message (missing or invalid parameters, invalid message, barred number, ...) | `Rejected` |
//!
//! A concatenated message is accepted when every part is. When some parts
//! were accepted and others not, the accepted parts are on their way to the
//! phone: that is `Ambiguous` (the provider acted, and we cannot say the
//! message was sent), and since Vonage can neither de-duplicate on
//! `client-ref` nor be asked about it afterwards, the message ends
//! `unknown`: never resent, never moved to the next provider. With no part
//! accepted, the worst part decides (5, then a refusal of the message, then
//! of the account, then throttling).
//!
//! Transport: a connection that never opened is `Retryable`; a timeout, a
//! reset, a 5xx or an unreadable answer after the request was written is
//! `Ambiguous`. A 401/403 is `Refused`, 429 `Retryable`, another 3xx/4xx
//! `Rejected` (Vonage created nothing).
//!
//! Vonage does not de-duplicate on `client-ref` and has no lookup by it, so
//! [`Provider::dedupes_by_key`] is false and [`Provider::reconcile`] keeps
//! its default: an ambiguous answer ends `unknown`.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use serde::Deserialize;

use super::{OutgoingSms, Provider, ProviderError, SendOutcome, parse_retry_after};
use crate::domain::{Encoding, Phone, segments};

pub mod receipts;
mod settings;
pub mod signing;

pub use receipts::VonageReceipts;
pub use settings::ADAPTER;
pub use signing::{SignatureMethod, sign, verify};

/// Where this service receives Vonage's delivery receipts (its `callback`).
pub const STATUS_PATH: &str = "/providers/vonage/status";

/// Where the real API lives.
pub const DEFAULT_BASE_URL: &str = "https://rest.nexmo.com";

/// Vonage's `ttl` range, milliseconds (20 seconds to 7 days).
const TTL_MS: (u64, u64) = (20_000, 604_800_000);

/// What the adapter needs to know.
#[derive(Clone)]
pub struct VonageSettings {
    /// `https://rest.nexmo.com`, or a stand-in in tests.
    pub base_url: String,
    pub api_key: String,
    pub api_secret: String,
    /// The default sender when the request names none.
    pub from: String,
    /// Our receipt endpoint, passed as `callback`.
    pub callback: Option<String>,
    /// Upper bound of one call.
    pub timeout: Duration,
    /// Upper bound of connecting: until then, nothing was sent.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for VonageSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VonageSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("api_secret", &"***")
            .field("from", &self.from)
            .field("callback", &self.callback)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[derive(Clone, Debug)]
pub struct VonageProvider {
    client: reqwest::Client,
    settings: VonageSettings,
    /// `{base}/sms/json`.
    send_url: reqwest::Url,
}

/// Vonage's answer to a send.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Reply {
    #[serde(rename = "message-count", default)]
    pub message_count: Option<serde_json::Value>,
    #[serde(default)]
    pub messages: Vec<Part>,
}

/// One part of the answer.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Part {
    #[serde(default)]
    pub status: Option<serde_json::Value>,
    #[serde(rename = "message-id", default)]
    pub message_id: Option<String>,
    #[serde(rename = "error-text", default)]
    pub error_text: Option<String>,
}

/// A number or a string of digits (Vonage sends both as strings).
fn number(v: Option<&serde_json::Value>) -> Option<u64> {
    match v? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// What one part's status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PartClass {
    // In order of precedence when no part was accepted (the last wins).
    Accepted,
    Throttled,
    AccountRefused,
    MessageRejected,
    Unclear,
}

fn part_class(status: Option<u64>) -> PartClass {
    match status {
        Some(0) => PartClass::Accepted,
        Some(1) => PartClass::Throttled,
        Some(4 | 8 | 9) => PartClass::AccountRefused,
        Some(5) | None => PartClass::Unclear,
        Some(_) => PartClass::MessageRejected,
    }
}

/// Classifies a `2xx` answer to a send (`http_status`) by its parts.
pub fn classify_reply(reply: &Reply, http_status: u16) -> SendOutcome {
    let http_status = Some(http_status);
    let parts = &reply.messages;
    let count = number(reply.message_count.as_ref())
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(parts.len());
    if parts.is_empty() {
        return SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: "Vonage answered without any message status".into(),
        };
    }
    let classes: Vec<PartClass> = parts
        .iter()
        .map(|p| part_class(number(p.status.as_ref())))
        .collect();
    let accepted = classes.iter().filter(|c| **c == PartClass::Accepted).count();
    // The first part that was not accepted, for its code and text.
    let describe = |p: &Part| {
        let code = number(p.status.as_ref()).map(|c| c.to_string());
        let text = p
            .error_text
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(super::cut_error_text)
            .unwrap_or_else(|| match &code {
                Some(c) => format!("Vonage status {c}"),
                None => "Vonage answered a part without a status".into(),
            });
        (code, text)
    };
    if accepted == parts.len() && count == parts.len() {
        return match parts[0].message_id.as_deref().filter(|id| !id.is_empty()) {
            Some(id) => SendOutcome::Accepted {
                provider_message_id: id.to_string(),
                http_status,
            },
            None => SendOutcome::Ambiguous {
                http_status,
                retry_after: None,
                message: "Vonage accepted the message without a message-id".into(),
            },
        };
    }
    if accepted > 0 || count != parts.len() {
        let refused = parts
            .iter()
            .zip(&classes)
            .find(|(_, c)| **c != PartClass::Accepted)
            .map(|(p, _)| describe(p).1);
        return SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: match refused.filter(|_| accepted > 0) {
                Some(why) => format!(
                    "Vonage accepted {accepted} of the {count} parts of the message and refused \
                     another ({why}): the accepted parts may reach the phone"
                ),
                None => format!(
                    "Vonage answered {} of the {count} parts of the message",
                    parts.len()
                ),
            },
        };
    }
    // No part accepted: the worst part decides.
    let (i, worst) = classes
        .iter()
        .enumerate()
        .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))
        .map(|(i, c)| (i, *c))
        .unwrap_or((0, PartClass::Unclear));
    let (provider_code, message) = describe(&parts[i]);
    match worst {
        PartClass::Throttled => SendOutcome::Retryable {
            http_status,
            provider_code,
            retry_after: None,
            message,
        },
        PartClass::AccountRefused => SendOutcome::Refused {
            http_status,
            provider_code,
            message,
        },
        PartClass::MessageRejected => SendOutcome::Rejected {
            http_status,
            provider_code,
            message,
        },
        PartClass::Unclear | PartClass::Accepted => SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: match provider_code {
                Some(c) => format!("{message} (Vonage status {c})"),
                None => message,
            },
        },
    }
}

/// Classifies an answer that is not `2xx`.
pub fn classify_status(status: StatusCode, retry_after: Option<Duration>) -> SendOutcome {
    let http_status = Some(status.as_u16());
    let message = format!("Vonage answered {status}");
    match status.as_u16() {
        401 | 403 => SendOutcome::Refused {
            http_status,
            provider_code: None,
            message,
        },
        429 => SendOutcome::Retryable {
            http_status,
            provider_code: None,
            retry_after,
            message,
        },
        // A redirect or a refusal of the request: nothing was created.
        300..=499 => SendOutcome::Rejected {
            http_status,
            provider_code: None,
            message,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        },
    }
}

/// Classifies a transport error of the send.
fn classify_error(e: &reqwest::Error) -> SendOutcome {
    if e.is_connect() || e.is_builder() {
        // Never connected (or never built): Vonage cannot have seen it.
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "could not connect to Vonage".into(),
        }
    } else if e.is_timeout() {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "Vonage did not answer in time".into(),
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "the connection failed before Vonage answered".into(),
        }
    }
}

/// `ttl` for what is left of a message's validity: milliseconds, rounded
/// up, within Vonage's range.
fn ttl_ms(validity: Duration) -> u64 {
    let ms = u64::try_from(validity.as_millis()).unwrap_or(u64::MAX)
        + u64::from(!validity.subsec_nanos().is_multiple_of(1_000_000));
    ms.clamp(TTL_MS.0, TTL_MS.1)
}

impl VonageProvider {
    pub fn new(settings: VonageSettings) -> Result<Self, ProviderError> {
        let what = "Vonage base";
        let base = super::base_url(what, &settings.base_url)?;
        let send_url = super::endpoint(what, &base, &["sms", "json"])?;
        let client = super::http_client(settings.timeout, settings.connect_timeout)?;
        Ok(Self {
            client,
            settings,
            send_url,
        })
    }

    /// The form Vonage gets for `sms`.
    pub fn form(&self, sms: &OutgoingSms, to: &Phone) -> Vec<(&'static str, String)> {
        let from = sms
            .from
            .clone()
            .unwrap_or_else(|| self.settings.from.clone());
        let mut form = vec![
            ("api_key", self.settings.api_key.clone()),
            ("api_secret", self.settings.api_secret.clone()),
            ("from", from),
            ("to", to.trim_start_matches('+').to_string()),
            ("text", sms.body.clone()),
            ("client-ref", sms.message_id.to_string()),
            ("status-report-req", "1".into()),
        ];
        if segments::count(&sms.body).encoding == Encoding::Ucs2 {
            form.push(("type", "unicode".into()));
        }
        if let Some(callback) = &self.settings.callback {
            form.push(("callback", callback.clone()));
        }
        if let Some(validity) = sms.validity {
            form.push(("ttl", ttl_ms(validity).to_string()));
        }
        form
    }
}

#[async_trait]
impl Provider for VonageProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        // `client-ref` is echoed back, never de-duplicated on.
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let to = match sms.phone() {
            Ok(to) => to,
            Err(refused) => return refused,
        };
        let body = super::twilio::encode_form(&self.form(sms, to));
        let req = self
            .client
            .post(self.send_url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(body);
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return classify_error(&e),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        if !status.is_success() {
            return classify_status(status, retry_after);
        }
        let bytes = match super::read_body(resp, super::MAX_ANSWER_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return SendOutcome::Ambiguous {
                    http_status: Some(status.as_u16()),
                    retry_after: None,
                    message: format!("reading Vonage's answer failed: {}", e.describe()),
                };
            }
        };
        match serde_json::from_slice::<Reply>(&bytes) {
            Ok(reply) => classify_reply(&reply, status.as_u16()),
            Err(_) => SendOutcome::Ambiguous {
                http_status: Some(status.as_u16()),
                retry_after: None,
                message: "Vonage's answer is not the SMS API's JSON".into(),
            },
        }
    }

    fn sender(&self, from: Option<&str>) -> Option<String> {
        Some(from.unwrap_or(&self.settings.from).to_string())
    }
}

#[cfg(test)]
mod tests;
