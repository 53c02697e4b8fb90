//! The `telegram_gateway` adapter: verification codes to a phone number's
//! Telegram account through the Telegram Gateway API (issue 28), the first
//! channel of a verification started with `"channels": ["telegram", ...]`.
//!
//! The code stays ours (made, MAC'd and sealed as for SMS; the message's
//! body is the code alone, passed as `code`), so checks stay in sendonce.
//! A send is two calls ([`Provider::prepare`], then [`Provider::send`]):
//!
//! 1. `checkSendAbility` with the number: its `request_id` (or why the
//!    number cannot get a code: the message fails, nothing was sent, and
//!    the verification's next channel goes at once). Delivery writes the
//!    request id with the message, fenced on its lease, before step 2.
//! 2. `sendVerificationMessage` with the number, that `request_id`, the
//!    code, `ttl` (what is left of the verification, 30 to 3600 s) and,
//!    when `SENDONCE_PUBLIC_URL` is https, `callback_url` (the Gateway
//!    takes https only).
//!
//! The Gateway documents no de-duplication of sends: a `request_id` makes
//! one send free of charge, "while repeated calls will result in an error"
//! (no error name, nothing about whether that error means the first went
//! out, nor about a repeat racing the first). So [`Provider::dedupes_by_key`]
//! is false: a send that may have gone out is never made again. An
//! ambiguous send (no answer after the request was written, a 5xx) is
//! settled by `checkVerificationStatus` with its request id
//! ([`Provider::reconcile`]): a `delivery_status` ("Returned only if a
//! verification message was sent to the user") means sent; none yet, or
//! no answer, means ask again later, until the message's deadline ends it
//! `unknown`. Never "not sent": that would send again.
//!
//! Reports come to [`REPORTS_PATH`] ([`reports`]); the verification's
//! fallback asks `checkVerificationStatus` too before it moves a code on
//! from silence ([`Provider::delivery_status`]): a report may have been
//! lost (the Gateway gives up after 10 tries), refused, or never asked for
//! (no https public URL). When a verification ends, or falls back to the
//! next channel, its message is revoked (`revokeVerificationMessage`,
//! best effort: [`Provider::revoke`]; "Returns True if the revocation
//! request was received"). Requests carry the token as
//! `Authorization: Bearer`, never logged.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::receipts::Receipt;
use super::{AttemptRef, OutgoingSms, Provider, ProviderError, Reconciled, SendOutcome, parse_retry_after};
use crate::domain::Status;

pub mod classify;
pub mod reports;
mod settings;

pub use settings::{ADAPTER, DEFAULT_URL, TOKEN, URL};

/// The adapter's name, stored with its messages.
pub const NAME: &str = "telegram_gateway";

/// Where the Gateway posts delivery reports.
pub const REPORTS_PATH: &str = "/channels/telegram/gateway/reports";

/// The shortest and longest `ttl` the Gateway takes (seconds).
pub const TTL_SECONDS: std::ops::RangeInclusive<u64> = 30..=3600;

/// The fewest and most digits of a code the Gateway takes.
pub const CODE_DIGITS: std::ops::RangeInclusive<u32> = 4..=8;

/// What the adapter needs to know.
#[derive(Clone)]
pub struct GatewaySettings {
    /// `https://gatewayapi.telegram.org`, or a stand-in in tests.
    pub url: String,
    pub token: String,
    /// Where reports go (https only), if anywhere.
    pub callback_url: Option<String>,
    /// `SENDONCE_PUBLIC_URL`, to say at start why there is no
    /// `callback_url`.
    pub public_url: Option<String>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewaySettings")
            .field("url", &self.url)
            .field("token", &"***")
            .field("callback_url", &self.callback_url)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The reports URL under `public_url`, when that is https (the Gateway
/// takes no other) and the whole fits its 256 bytes.
pub fn callback_url(public_url: Option<&str>) -> Option<String> {
    let base = public_url?.trim_end_matches('/');
    let url = format!("{base}{REPORTS_PATH}");
    (base.starts_with("https://") && url.len() <= 256).then_some(url)
}

#[derive(Clone)]
pub struct GatewayProvider {
    client: reqwest::Client,
    check_url: reqwest::Url,
    send_url: reqwest::Url,
    revoke_url: reqwest::Url,
    status_url: reqwest::Url,
    bearer: String,
    callback_url: Option<String>,
}

/// Never the token.
impl std::fmt::Debug for GatewayProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayProvider")
            .field("send_url", &self.send_url.as_str())
            .field("callback_url", &self.callback_url)
            .finish()
    }
}

impl GatewayProvider {
    pub fn new(settings: GatewaySettings) -> Result<Self, ProviderError> {
        let what = "Telegram Gateway API";
        let base = super::base_url(what, &settings.url)?;
        Ok(Self {
            client: super::http_client(settings.timeout, settings.connect_timeout)?,
            check_url: super::endpoint(what, &base, &["checkSendAbility"])?,
            send_url: super::endpoint(what, &base, &["sendVerificationMessage"])?,
            revoke_url: super::endpoint(what, &base, &["revokeVerificationMessage"])?,
            status_url: super::endpoint(what, &base, &["checkVerificationStatus"])?,
            bearer: format!("Bearer {}", settings.token),
            callback_url: settings.callback_url,
        })
    }

    /// One call: its HTTP status, its body as the API's envelope if it
    /// parsed, and `Retry-After`; `Err`: the transport failed (`connect`:
    /// before anything was written).
    async fn call(
        &self,
        url: &reqwest::Url,
        params: serde_json::Value,
    ) -> Result<(u16, Option<classify::Reply>, Option<Duration>), (bool, bool)> {
        let resp = self
            .client
            .post(url.clone())
            .header(AUTHORIZATION, &self.bearer)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(params.to_string())
            .send()
            .await
            .map_err(|e| (e.is_connect() || e.is_builder(), e.is_timeout()))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = super::read_body(resp, super::MAX_ANSWER_BYTES)
            .await
            .map_err(|_| (false, false))?;
        Ok((status, serde_json::from_slice(&body).ok(), retry_after))
    }
}

#[async_trait]
impl Provider for GatewayProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn channel(&self) -> &'static str {
        NAME
    }

    fn dedupes_by_key(&self) -> bool {
        // A repeat "will result in an error", the documentation says, but
        // not that the error means the first went out, nor what a repeat
        // racing the first does: never relied on.
        false
    }

    fn prepares(&self) -> bool {
        true
    }

    async fn prepare(&self, sms: &OutgoingSms) -> Option<Result<String, SendOutcome>> {
        let phone = match sms.phone() {
            Ok(p) => p.as_str().to_string(),
            Err(refused) => return Some(Err(refused)),
        };
        let answer = self
            .call(&self.check_url, serde_json::json!({ "phone_number": phone }))
            .await;
        Some(match answer {
            Ok((status, reply, after)) => classify::check(status, reply.as_ref(), after),
            Err((connect, timeout)) => Err(classify::transport(
                "checkSendAbility",
                connect,
                timeout,
                false,
            )),
        })
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let phone = match sms.phone() {
            Ok(p) => p.as_str().to_string(),
            Err(refused) => return refused,
        };
        let Some(request_id) = sms.prepared.as_deref() else {
            // Delivery always prepares first; a send without a request id
            // could be repeated, so none is made.
            return SendOutcome::Retryable {
                http_status: None,
                provider_code: None,
                retry_after: None,
                message: "no request id from checkSendAbility yet".into(),
            };
        };
        let ttl = sms
            .validity
            .map_or(*TTL_SECONDS.end(), |v| v.as_secs())
            .clamp(*TTL_SECONDS.start(), *TTL_SECONDS.end());
        let mut params = serde_json::json!({
            "phone_number": phone,
            "request_id": request_id,
            "code": sms.body,
            "ttl": ttl,
        });
        if let Some(url) = &self.callback_url {
            params["callback_url"] = serde_json::Value::String(url.clone());
        }
        match self.call(&self.send_url, params).await {
            Ok((status, reply, after)) => classify::send(status, reply.as_ref(), after),
            Err((connect, timeout)) => {
                classify::transport("sendVerificationMessage", connect, timeout, true)
            }
        }
    }

    async fn revoke(&self, prepared: &str) -> bool {
        let answer = self
            .call(
                &self.revoke_url,
                serde_json::json!({ "request_id": prepared }),
            )
            .await;
        matches!(answer, Ok((200..=299, Some(r), _)) if r.revoked())
    }

    /// Asks `checkVerificationStatus` about the send's request id. A send
    /// starts only once its request id is written with the message, so an
    /// attempt with none sent nothing.
    async fn reconcile(&self, sms: &OutgoingSms, _attempt: &AttemptRef) -> Reconciled {
        let Some(request_id) = sms.prepared.as_deref() else {
            return Reconciled::NotSent;
        };
        let answer = self
            .call(
                &self.status_url,
                serde_json::json!({ "request_id": request_id }),
            )
            .await;
        match answer {
            Ok((status, reply, _)) => classify::status(request_id, status, reply.as_ref()),
            Err(_) => Reconciled::Pending(
                "checkVerificationStatus could not be asked: asking again, never sending again"
                    .into(),
            ),
        }
    }

    async fn delivery_status(&self, request_id: &str) -> Option<(Receipt, Option<Status>)> {
        let answer = self
            .call(
                &self.status_url,
                serde_json::json!({ "request_id": request_id }),
            )
            .await;
        let Ok((200..=299, Some(reply), _)) = answer else {
            return None;
        };
        let word = reply
            .request_status()
            .and_then(|s| s.delivery_status)
            .map(|d| d.status)
            .filter(|w| !w.is_empty() && w.len() <= super::receipts::MAX_STATUS_LEN)?;
        let status = reports::report_status(&word);
        Some((
            Receipt {
                provider_message_id: request_id.to_string(),
                status: word,
                error_code: None,
                message_id: None,
            },
            status,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_asked_for_only_at_an_https_public_url() {
        let rows = [
            (None, None),
            (Some("http://example.com"), None),
            (
                Some("https://example.com/"),
                Some("https://example.com/channels/telegram/gateway/reports"),
            ),
            (Some(&*format!("https://{}.com", "a".repeat(240))), None),
        ];
        for (public, want) in rows {
            assert_eq!(callback_url(public).as_deref(), want, "{public:?}");
        }
    }

    #[test]
    fn settings_never_show_the_token() {
        let s = GatewaySettings {
            url: DEFAULT_URL.into(),
            token: "very-secret".into(),
            callback_url: None,
            public_url: None,
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        assert!(!format!("{s:?}").contains("very-secret"));
        let p = GatewayProvider::new(s).expect("provider");
        assert_eq!(p.send_url.path(), "/sendVerificationMessage");
        assert!(!format!("{p:?}").contains("very-secret"), "{p:?}");
    }
}
