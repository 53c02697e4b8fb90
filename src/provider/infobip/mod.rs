//! The `infobip` provider: Infobip's SMS API (v3).
//!
//! Send: `POST {base}/sms/3/messages`, JSON, `Authorization: App <key>`, one
//! message to one destination: `{"messages":[{"sender", "destinations":
//! [{"to", "messageId"}], "content":{"text"}, "options":{"validityPeriod"},
//! "webhooks":{"delivery":{"url"}}}]}`. The destination's `messageId` is our
//! message id, the same on every attempt, so Infobip's id of the message is
//! ours and an unanswered send can be asked about by that id. The delivery
//! URL (our receipt endpoint carrying `INFOBIP_RECEIPT_SECRET`) goes with
//! each message when `SENDONCE_PUBLIC_URL` is set.
//!
//! Classes: a 2xx whose message status is in the `PENDING` group (or any
//! other group that says Infobip has the message) accepted, under the
//! answer's `messageId`; a status of the `REJECTED` group about the message
//! (`REJECTED_DESTINATION`, `REJECTED_INVALID_DESTINATION`, `MISSING_TO`,
//! `REJECTED_DND`, ...) rejected; `REJECTED_NOT_ENOUGH_CREDITS` and
//! `REJECTED_PREPAID_PACKAGE_EXPIRED` refused (the account, not the message);
//! `REJECTED_SYSTEM_ERROR` retryable (Infobip's own error: it did not act).
//! HTTP 401/403 refused; 429 retryable with `Retry-After` when given; other
//! 4xx and 3xx rejected; 5xx, timeouts and resets after the request was
//! written ambiguous; connection failures before it retryable. Infobip's
//! error body `{"requestError":{"serviceException":{"messageId","text"}}}`
//! becomes the provider code and message.
//!
//! Idempotency: Infobip documents it as opt-in, "enabled for your channels"
//! on request, keyed on the `messageId` we assign: "Retries with the same
//! messageId within the configured grace period are rejected during
//! processing, so they do not send another copy of the message." Unless
//! the operator declares it (`INFOBIP_IDEMPOTENCY_GRACE`, the grace period
//! Infobip configured), [`Provider::dedupes_by_key`] is false: a repeated
//! `messageId` may create a second message, so an ambiguous answer is
//! looked up, never resent blindly, and a `REJECTED_DUPLICATE_MESSAGE_ID`
//! answer is ambiguous too (looked up). Declared, an ambiguous answer is
//! resent under the same `messageId` (the configuration makes sure the
//! grace period outlasts the retry deadline by an hour), and
//! `REJECTED_DUPLICATE_MESSAGE_ID` means Infobip accepted a message with
//! our id within the period: accepted under it. A refusal of a repeat says
//! nothing of an earlier attempt, so
//! [`Provider::rejection_covers_earlier_attempts`] is false either way.
//!
//! Reconcile: `GET {base}/sms/3/logs?messageId=<our id>` (logs are kept 48
//! hours; `/sms/3/reports` is not used: each report is returned only once,
//! and taking it would steal it from whoever else reads them), read by each
//! entry's status (`lookup.rs`): an entry of any group but `REJECTED`:
//! sent, under our id; a `REJECTED` one: the attempt's own refusal
//! ([`Reconciled::Answered`], classified as a send answer's status);
//! `REJECTED_DUPLICATE_MESSAGE_ID` entries say nothing of the first send.
//! Infobip documents no bound on how soon a message shows in its logs, so
//! no entry never means "not sent": asked again later, never resent, never
//! moved to another provider (past the retry deadline: `unknown`). A lookup
//! that fails (5xx, 401, a timeout, an unreadable answer): asked again.
//! `INFOBIP_LOOKUP_AFTER`, which made an empty log "not sent" after a
//! delay, is accepted and ignored (a warning at start).

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde::Deserialize;

use super::{AttemptRef, OutgoingSms, Provider, Reconciled, SendOutcome, parse_retry_after};
use crate::domain::Phone;

mod classify;
mod lookup;
pub mod receipts;
mod settings;

use classify::{classify_accepted, classify_error, classify_status};

pub use receipts::InfobipReceipts;
pub use settings::{
    ADAPTER, GRACE_MARGIN, IDEMPOTENCY_GRACE, LOOKUP_AFTER, base_url, delivery_url,
    idempotency_grace,
};

/// Where this service receives Infobip's delivery reports.
pub const STATUS_PATH: &str = "/providers/infobip/status";

/// The send endpoint, under the account's base URL.
pub const SEND_PATH: &str = "/sms/3/messages";

/// The log lookup, under the account's base URL.
pub const LOGS_PATH: &str = "/sms/3/logs";

/// The status of a send Infobip refused as a repeat of a `messageId` it
/// has (its idempotency, when enabled).
pub const DUPLICATE_MESSAGE_ID: &str = "REJECTED_DUPLICATE_MESSAGE_ID";

/// How long Infobip keeps message logs.
pub const LOG_RETENTION: Duration = Duration::from_secs(48 * 3600);

/// An attempt older than this is not looked up as if its log could still
/// be there: an empty answer would mean nothing.
pub const LOOKUP_HORIZON: Duration = Duration::from_secs(47 * 3600);

/// The largest log answer read (bytes).
pub const MAX_LOG_BYTES: usize = 256 * 1024;

/// What the adapter needs to know.
#[derive(Clone)]
pub struct InfobipSettings {
    /// `https://xxxxx.api.infobip.com` (no trailing slash), or a stand-in.
    pub base_url: String,
    pub api_key: String,
    /// The default sender when the request names none.
    pub from: Option<String>,
    /// Our receipt endpoint with its secret, sent as `webhooks.delivery.url`.
    pub delivery_url: Option<String>,
    /// The grace period of Infobip's idempotency, when the operator
    /// declares that Infobip enabled it (`INFOBIP_IDEMPOTENCY_GRACE`):
    /// then a resend under the same `messageId` is safe.
    pub idempotency_grace: Option<Duration>,
    /// What the operator should hear at start (a variable that no longer
    /// has an effect).
    pub warnings: Vec<String>,
    /// Upper bound of one call.
    pub timeout: Duration,
    /// Upper bound of connecting: until then, nothing was sent.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for InfobipSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InfobipSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &"***")
            .field("from", &self.from)
            .field("delivery_url", &self.delivery_url.as_ref().map(|_| "***"))
            .field("idempotency_grace", &self.idempotency_grace)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[derive(Debug)]
pub struct InfobipProvider {
    client: reqwest::Client,
    settings: InfobipSettings,
    send_url: reqwest::Url,
    logs_url: reqwest::Url,
}

/// A message status object (send answer, log, report).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub group_id: Option<i64>,
    pub group_name: Option<String>,
    pub id: Option<i64>,
    pub name: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendAnswer {
    #[serde(default)]
    messages: Vec<SentMessage>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SentMessage {
    message_id: Option<String>,
    status: Option<Status>,
}

#[derive(Debug, Deserialize)]
struct LogsAnswer {
    results: Vec<LogEntry>,
}

/// One entry of Infobip's logs: a message, with its status.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogEntry {
    message_id: Option<String>,
    status: Option<Status>,
}

/// Infobip's error body, in its two shapes: `requestError.serviceException`
/// and the newer `{errorCode, description}`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ErrorBody {
    request_error: Option<RequestError>,
    error_code: Option<String>,
    description: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestError {
    service_exception: Option<ServiceException>,
    policy_exception: Option<ServiceException>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceException {
    message_id: Option<String>,
    text: Option<String>,
}

impl ErrorBody {
    /// The error's code and text, if it had any.
    fn parts(&self) -> (Option<String>, Option<String>) {
        let exception = self
            .request_error
            .as_ref()
            .and_then(|r| r.service_exception.as_ref().or(r.policy_exception.as_ref()));
        let code = exception
            .and_then(|e| e.message_id.clone())
            .or_else(|| self.error_code.clone())
            .filter(|c| !c.is_empty());
        let text = exception
            .and_then(|e| e.text.clone())
            .or_else(|| self.description.clone())
            .filter(|t| !t.is_empty());
        (code, text)
    }
}

impl InfobipProvider {
    pub fn new(settings: InfobipSettings) -> Result<Self, super::ProviderError> {
        let what = "Infobip base";
        let base = super::base_url(what, &settings.base_url)?;
        let at = |path: &str| {
            base.join(path).map_err(|e| super::ProviderError::Url {
                what,
                source: e.into(),
            })
        };
        let send_url = at(SEND_PATH)?;
        let logs_url = at(LOGS_PATH)?;
        let client = super::http_client(settings.timeout, settings.connect_timeout)?;
        Ok(Self {
            client,
            settings,
            send_url,
            logs_url,
        })
    }

    fn authorization(&self) -> String {
        format!("App {}", self.settings.api_key)
    }

    /// Who `from` (the request's) is sent as: it, else `INFOBIP_FROM`.
    fn sender_for(&self, from: Option<&str>) -> Option<String> {
        from.map(str::to_string)
            .or_else(|| self.settings.from.clone())
    }

    /// The request body Infobip gets for `sms`.
    pub fn body(&self, sms: &OutgoingSms, to: &Phone) -> serde_json::Value {
        let mut message = serde_json::json!({
            // E.164 without the `+`, as Infobip's examples write numbers.
            "destinations": [{
                "to": to.trim_start_matches('+'),
                "messageId": sms.message_id.to_string(),
            }],
            "content": { "text": sms.body },
        });
        if let Some(sender) = self.sender_for(sms.from.as_deref()) {
            message["sender"] = serde_json::Value::String(sender);
        }
        if let Some(validity) = sms.validity {
            message["options"] = serde_json::json!({
                "validityPeriod": { "amount": validity_seconds(validity), "timeUnit": "SECONDS" }
            });
        }
        if let Some(url) = &self.settings.delivery_url {
            message["webhooks"] = serde_json::json!({ "delivery": { "url": url } });
        }
        serde_json::json!({ "messages": [message] })
    }

    /// Infobip's log entries for message `id`, or why they could not be read.
    async fn logs(&self, id: &str) -> Result<Vec<LogEntry>, String> {
        let mut url = self.logs_url.clone();
        url.query_pairs_mut()
            .append_pair("messageId", id)
            .append_pair("limit", "10");
        let resp = self
            .client
            .get(url)
            .header(AUTHORIZATION, self.authorization())
            .header(ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("looking up the message at Infobip failed: {}", transport(&e)))?;
        let status = resp.status();
        let body = super::read_body(resp, MAX_LOG_BYTES)
            .await
            .map_err(|e| format!("reading Infobip's logs failed: {}", e.describe()))?;
        if !status.is_success() {
            let (code, text) = serde_json::from_slice::<ErrorBody>(&body)
                .unwrap_or_default()
                .parts();
            let detail = [code, text.map(|t| super::cut_error_text(&t))]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            return Err(
                format!("looking up the message at Infobip answered {status} {detail}")
                    .trim_end()
                    .to_string(),
            );
        }
        serde_json::from_slice::<LogsAnswer>(&body)
            .map(|a| a.results)
            .map_err(|e| format!("Infobip's logs could not be read: {e}"))
    }
}

/// `validityPeriod` in whole seconds, rounded up so that a message is never
/// given less time than it has (Infobip's validity runs up to 48 hours).
fn validity_seconds(validity: Duration) -> u64 {
    let secs = validity.as_secs() + u64::from(validity.subsec_nanos() > 0);
    secs.clamp(1, 48 * 3600)
}

fn transport(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "connection error"
    }
}

#[async_trait]
impl Provider for InfobipProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        // Only where the operator declares Infobip's opt-in idempotency
        // enabled: otherwise a repeated `messageId` may be a second message.
        self.settings.idempotency_grace.is_some()
    }

    fn rejection_covers_earlier_attempts(&self) -> bool {
        // Infobip's idempotency refuses a repeat whatever became of the
        // first send: the refusal says nothing of it.
        false
    }

    fn sender(&self, from: Option<&str>) -> Option<String> {
        self.sender_for(from)
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let to = match sms.phone() {
            Ok(to) => to,
            Err(refused) => return refused,
        };
        let ours = sms.message_id.to_string();
        let idempotent = self.dedupes_by_key();
        let req = self
            .client
            .post(self.send_url.clone())
            .header(AUTHORIZATION, self.authorization())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(self.body(sms, to).to_string());
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
        let bytes = match super::read_body(resp, super::MAX_ANSWER_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return if status.is_success() || status.is_server_error() {
                    SendOutcome::Ambiguous {
                        http_status: Some(status.as_u16()),
                        retry_after,
                        message: format!("reading Infobip's answer failed: {}", e.describe()),
                    }
                } else {
                    classify_status(status, None, retry_after, &ours, idempotent)
                };
            }
        };
        if !status.is_success() {
            let error = serde_json::from_slice(&bytes).ok();
            return classify_status(status, error, retry_after, &ours, idempotent);
        }
        let answer = serde_json::from_slice::<SendAnswer>(&bytes).ok();
        let first = answer.and_then(|a| a.messages.into_iter().next());
        match first {
            Some(m) => classify_accepted(
                status.as_u16(),
                m.message_id,
                m.status.as_ref(),
                &ours,
                idempotent,
            ),
            None => SendOutcome::Ambiguous {
                http_status: Some(status.as_u16()),
                retry_after: None,
                message: "Infobip answered 2xx without the message".into(),
            },
        }
    }

    /// Asks Infobip's logs for our id and reads them by status
    /// (`lookup.rs`): found, sent; its own rejection shown, that answer; no
    /// entry yet, or a lookup that fails: asked again, never resent.
    async fn reconcile(&self, sms: &OutgoingSms, attempt: &AttemptRef) -> Reconciled {
        // A recipient Infobip cannot reach was refused before any request.
        if let Err(refused) = sms.phone() {
            return Reconciled::Answered(refused);
        }
        let ours = sms.message_id.to_string();
        if attempt.age > LOOKUP_HORIZON {
            return Reconciled::Unknown(format!(
                "the attempt was made more than {} hours ago and Infobip keeps logs for {} hours: \
                 its logs cannot tell any more",
                LOOKUP_HORIZON.as_secs() / 3600,
                LOG_RETENTION.as_secs() / 3600
            ));
        }
        match self.logs(&ours).await {
            Ok(entries) => lookup::read_logs(&entries, &ours, sms.attempt),
            Err(reason) => Reconciled::Pending(format!("{reason}; asking again, never resending")),
        }
    }
}

#[cfg(test)]
mod tests;
