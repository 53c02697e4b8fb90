//! The `twilio` provider: Twilio's Programmable Messaging REST API
//! (`2010-04-01`).
//!
//! Send: `POST {base}/2010-04-01/Accounts/{AccountSid}/Messages.json`,
//! form-encoded, HTTP Basic auth (account SID : auth token), with `To`,
//! `Body`, `From` (the request's `from`, else `TWILIO_FROM`) and/or
//! `MessagingServiceSid`, `ValidityPeriod` (what is left of the message's
//! validity) and `StatusCallback` (our receipt endpoint, when the public URL
//! is known). The answer's `sid` is the provider message id.
//!
//! Twilio documents no idempotency key for creating a message, so this
//! adapter does not de-duplicate: an ambiguous outcome (5xx, a timeout or a
//! reset after the request was written) is settled by [`Provider::reconcile`],
//! which lists the account's messages to that `To` since the attempt started
//! and looks for the same body. Only when Twilio shows no such message is a
//! resend safe; when the lookup itself fails, nobody can tell (`unknown`).
//!
//! Classes: 2xx with a `sid` accepted; 429 or error 20429 retryable (with
//! `Retry-After`); connection failures before the request was sent
//! retryable; every other 4xx (21211 invalid `To`, 21610 unsubscribed
//! recipient, 21408 region not enabled, 21614 not a mobile number, ...) and
//! 3xx rejected; 5xx, timeouts and resets ambiguous. Twilio's error body
//! `{code, message, more_info, status}` becomes the error's provider code and
//! message.
//!
//! Status callbacks are signed: `X-Twilio-Signature` is the base64 HMAC-SHA1,
//! keyed with the auth token, of the full callback URL followed by every POST
//! parameter's name and value, sorted by name ([`signature`],
//! [`verify_signature`]).

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use serde::Deserialize;
use sha1::Sha1;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc2822;

use super::{OutgoingSms, Provider, Reconciled, SendOutcome, parse_retry_after};

/// Where the real API lives.
pub const DEFAULT_BASE_URL: &str = "https://api.twilio.com";

/// Twilio's "too many requests" error code.
const TOO_MANY_REQUESTS: i64 = 20429;

/// How far before an attempt's start a message it created may be dated:
/// Twilio's clock and ours disagree a little.
const CLOCK_SLACK: time::Duration = time::Duration::minutes(10);

/// Pages of the message list read while reconciling, at most.
const MAX_LOOKUP_PAGES: usize = 10;

/// What the adapter needs to know.
#[derive(Clone)]
pub struct TwilioSettings {
    /// `https://api.twilio.com`, or a stand-in in tests.
    pub base_url: String,
    /// `AC` and 32 hex digits.
    pub account_sid: String,
    pub auth_token: String,
    /// The default sender when the request names none.
    pub from: Option<String>,
    /// `MG` and 32 hex digits: sent with every message when set.
    pub messaging_service_sid: Option<String>,
    /// Our receipt endpoint, passed as `StatusCallback`.
    pub status_callback: Option<String>,
    /// Upper bound of one call.
    pub timeout: Duration,
    /// Upper bound of connecting: until then, nothing was sent.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for TwilioSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwilioSettings")
            .field("base_url", &self.base_url)
            .field("account_sid", &self.account_sid)
            .field("auth_token", &"***")
            .field("from", &self.from)
            .field("messaging_service_sid", &self.messaging_service_sid)
            .field("status_callback", &self.status_callback)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[derive(Clone, Debug)]
pub struct TwilioProvider {
    client: reqwest::Client,
    settings: TwilioSettings,
    /// `{base}/2010-04-01/Accounts/{sid}/Messages.json`.
    messages_url: reqwest::Url,
    /// `{base}`, for the list's relative `next_page_uri`.
    base_url: reqwest::Url,
}

/// Twilio's error body.
#[derive(Deserialize)]
struct TwilioError {
    code: Option<serde_json::Value>,
    message: Option<String>,
    more_info: Option<String>,
}

/// The fields of a Message resource the adapter reads.
#[derive(Deserialize)]
struct TwilioMessage {
    sid: Option<String>,
    to: Option<String>,
    body: Option<String>,
    direction: Option<String>,
    date_created: Option<String>,
}

#[derive(Deserialize)]
struct MessagePage {
    messages: Vec<TwilioMessage>,
    next_page_uri: Option<String>,
}

impl TwilioProvider {
    pub fn new(settings: TwilioSettings) -> Result<Self, super::ProviderError> {
        let what = "Twilio base";
        let base_url =
            reqwest::Url::parse(&settings.base_url).map_err(|e| super::ProviderError::Url {
                what,
                source: e.into(),
            })?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(super::ProviderError::NotHttp { what });
        }
        let mut messages_url = base_url.clone();
        messages_url
            .path_segments_mut()
            .map_err(|()| super::ProviderError::NotHttp { what })?
            .pop_if_empty()
            .extend([
                "2010-04-01",
                "Accounts",
                &settings.account_sid,
                "Messages.json",
            ]);
        crate::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            // A POST must not silently turn into a GET elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(super::ProviderError::Client)?;
        Ok(Self {
            client,
            settings,
            messages_url,
            base_url,
        })
    }

    /// The form Twilio gets for `sms`.
    pub fn form(&self, sms: &OutgoingSms) -> Vec<(&'static str, String)> {
        let mut form = vec![("To", sms.to.clone()), ("Body", sms.body.clone())];
        if let Some(from) = sms.from.as_ref().or(self.settings.from.as_ref()) {
            form.push(("From", from.clone()));
        }
        if let Some(service) = &self.settings.messaging_service_sid {
            form.push(("MessagingServiceSid", service.clone()));
        }
        if let Some(validity) = sms.validity {
            form.push(("ValidityPeriod", validity_period(validity).to_string()));
        }
        if let Some(callback) = &self.settings.status_callback {
            form.push(("StatusCallback", callback.clone()));
        }
        form
    }

    /// One page of the account's messages to `to`, newest first.
    async fn list_page(&self, url: reqwest::Url) -> Result<MessagePage, String> {
        let resp = self
            .client
            .get(url)
            .basic_auth(&self.settings.account_sid, Some(&self.settings.auth_token))
            .header(ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("listing messages at Twilio failed: {}", transport(&e)))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading Twilio's message list failed: {}", transport(&e)))?;
        if !status.is_success() {
            let detail = serde_json::from_slice::<TwilioError>(&body)
                .ok()
                .and_then(|e| e.message)
                .unwrap_or_default();
            return Err(
                format!("listing messages at Twilio answered {status} {detail}")
                    .trim_end()
                    .to_string(),
            );
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("Twilio's message list could not be read: {e}"))
    }
}

/// `application/x-www-form-urlencoded` of `pairs`, in order.
pub fn encode_form<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        form.append_pair(name.as_ref(), value.as_ref());
    }
    form.finish()
}

/// `ValidityPeriod`: whole seconds, 1 to 36000 (Twilio's range), rounded up
/// so that a message is never given less time than it has.
fn validity_period(validity: Duration) -> u64 {
    let secs = validity.as_secs() + u64::from(validity.subsec_nanos() > 0);
    secs.clamp(1, 36_000)
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

/// Classifies a transport error of the send.
fn classify_error(e: &reqwest::Error) -> SendOutcome {
    if e.is_connect() || e.is_builder() {
        // Never connected (or never built): Twilio cannot have seen it.
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "could not connect to Twilio".into(),
        }
    } else if e.is_timeout() {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "Twilio did not answer in time".into(),
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "the connection failed before Twilio answered".into(),
        }
    }
}

fn code_string(code: Option<&serde_json::Value>) -> Option<String> {
    match code? {
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Classifies a non-2xx answer with Twilio's error body, if it had one.
fn classify_status(
    status: StatusCode,
    error: Option<TwilioError>,
    retry_after: Option<Duration>,
) -> SendOutcome {
    let http_status = Some(status.as_u16());
    let code = error.as_ref().and_then(|e| code_string(e.code.as_ref()));
    let message = match &error {
        Some(TwilioError {
            message: Some(m),
            more_info,
            ..
        }) if !m.is_empty() => match more_info {
            Some(info) if !info.is_empty() => format!("{m} ({info})"),
            _ => m.clone(),
        },
        _ => format!("Twilio answered {status}"),
    };
    let too_many = status == StatusCode::TOO_MANY_REQUESTS
        || code
            .as_deref()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| c == TOO_MANY_REQUESTS);
    if too_many {
        return SendOutcome::Retryable {
            http_status,
            provider_code: code,
            retry_after,
            message,
        };
    }
    match status.as_u16() {
        // A refusal of this request (21211, 21610, 21408, 21614, bad
        // credentials, ...), or a redirect: Twilio did not create a message.
        300..=499 => SendOutcome::Rejected {
            http_status,
            provider_code: code,
            message,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message: match code {
                Some(c) => format!("{message} (Twilio error {c})"),
                None => message,
            },
        },
    }
}

/// Whether a listed message is the one `sms` may have created.
fn is_match(m: &TwilioMessage, sms: &OutgoingSms, not_before: OffsetDateTime) -> bool {
    if m.to.as_deref() != Some(sms.to.as_str()) {
        return false;
    }
    if m.direction
        .as_deref()
        .is_some_and(|d| !d.starts_with("outbound"))
    {
        return false;
    }
    // Trial accounts prefix the body; Twilio never changes the rest.
    let same_body = m
        .body
        .as_deref()
        .is_some_and(|b| b == sms.body || b.ends_with(sms.body.as_str()));
    if !same_body {
        return false;
    }
    // A date we cannot read does not rule it out: when in doubt, the
    // message counts as sent (never send twice).
    match m
        .date_created
        .as_deref()
        .map(|d| OffsetDateTime::parse(d, &Rfc2822))
    {
        Some(Ok(created)) => created >= not_before,
        _ => true,
    }
}

#[async_trait]
impl Provider for TwilioProvider {
    fn name(&self) -> &'static str {
        "twilio"
    }

    fn dedupes_by_key(&self) -> bool {
        // Twilio documents no idempotency key for creating a message.
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let body = encode_form(&self.form(sms));
        let req = self
            .client
            .post(self.messages_url.clone())
            .basic_auth(&self.settings.account_sid, Some(&self.settings.auth_token))
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
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return if status.is_success() || status.is_server_error() {
                    SendOutcome::Ambiguous {
                        http_status: Some(status.as_u16()),
                        retry_after,
                        message: format!("reading Twilio's answer failed: {}", transport(&e)),
                    }
                } else {
                    classify_status(status, None, retry_after)
                };
            }
        };
        if status.is_success() {
            let sid = serde_json::from_slice::<TwilioMessage>(&bytes)
                .ok()
                .and_then(|m| m.sid)
                .filter(|s| !s.is_empty());
            return match sid {
                Some(sid) => SendOutcome::Accepted {
                    provider_message_id: sid,
                    http_status: Some(status.as_u16()),
                },
                None => SendOutcome::Ambiguous {
                    http_status: Some(status.as_u16()),
                    retry_after: None,
                    message: "Twilio answered 2xx without a message sid".into(),
                },
            };
        }
        classify_status(status, serde_json::from_slice(&bytes).ok(), retry_after)
    }

    async fn reconcile(&self, sms: &OutgoingSms, since: OffsetDateTime) -> Reconciled {
        let not_before = since - CLOCK_SLACK;
        let date = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            not_before.year(),
            u8::from(not_before.month()),
            not_before.day(),
            not_before.hour(),
            not_before.minute(),
            not_before.second()
        );
        let mut url = self.messages_url.clone();
        url.query_pairs_mut()
            .append_pair("To", &sms.to)
            .append_pair("DateSent>", &date)
            .append_pair("PageSize", "100");
        for _ in 0..MAX_LOOKUP_PAGES {
            let page = match self.list_page(url).await {
                Ok(p) => p,
                Err(reason) => return Reconciled::Unknown(reason),
            };
            if let Some(found) = page.messages.iter().find(|m| is_match(m, sms, not_before)) {
                return match found.sid.clone().filter(|s| !s.is_empty()) {
                    Some(sid) => Reconciled::Sent {
                        provider_message_id: sid,
                    },
                    None => {
                        Reconciled::Unknown("Twilio lists a matching message without a sid".into())
                    }
                };
            }
            match page.next_page_uri.filter(|u| !u.is_empty()) {
                None => return Reconciled::NotSent,
                Some(next) => match self.base_url.join(&next) {
                    Ok(u) => url = u,
                    Err(_) => {
                        return Reconciled::Unknown(
                            "Twilio's next page of messages has an unusable address".into(),
                        );
                    }
                },
            }
        }
        Reconciled::Unknown(format!(
            "more than {MAX_LOOKUP_PAGES} pages of messages to this number since the attempt"
        ))
    }
}

/// The MAC Twilio computes for a request to `url` with POST `params`.
fn mac(auth_token: &str, url: &str, params: &[(String, String)]) -> Option<Hmac<Sha1>> {
    // Sorted by name, then value; a repeated identical pair counts once
    // (as in Twilio's own validators).
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut mac = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()).ok()?;
    mac.update(url.as_bytes());
    for (name, value) in sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    Some(mac)
}

/// `X-Twilio-Signature` for a request to `url` with POST `params`: base64 of
/// HMAC-SHA1(auth token, url + every name and value, sorted by name).
pub fn signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    mac(auth_token, url, params)
        .map(|m| BASE64.encode(m.finalize().into_bytes()))
        .unwrap_or_default()
}

/// Whether `given` is the right signature, compared in constant time.
pub fn verify_signature(
    auth_token: &str,
    url: &str,
    params: &[(String, String)],
    given: &str,
) -> bool {
    let Ok(given) = BASE64.decode(given.trim()) else {
        return false;
    };
    mac(auth_token, url, params).is_some_and(|m| m.verify_slice(&given).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sms(body: &str) -> OutgoingSms {
        OutgoingSms {
            message_id: crate::domain::MessageId::new(),
            to: "+14155550100".into(),
            from: None,
            body: body.into(),
            validity: None,
        }
    }

    #[test]
    fn signature_matches_twilios_documented_example() {
        // From Twilio's security documentation ("Validating signatures").
        let params: Vec<(String, String)> = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+14158675309"),
            ("Digits", "1234"),
            ("From", "+14158675309"),
            ("To", "+18005551212"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let token = "12345";
        let sig = signature(token, url, &params);
        assert_eq!(sig, "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
        assert!(verify_signature(token, url, &params, &sig));
        assert!(!verify_signature("54321", url, &params, &sig));
        assert!(!verify_signature(token, url, &params[1..], &sig));
        assert!(!verify_signature(token, url, &params, "not base64!"));
        assert!(!verify_signature(token, url, &params, ""));

        // Repeated names: values sorted, identical pairs once.
        let repeated: Vec<(String, String)> = [
            ("Sid", "CA123"),
            ("SidAccount", "AC123"),
            ("Digits", "5678"),
            ("Digits", "1234"),
            ("Digits", "1234"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            signature(token, url, &repeated),
            "IK+Dwps556ElfBT0I3Rgjkr1wJU="
        );
    }

    #[test]
    fn error_classes() {
        let err = |code: i64| {
            Some(TwilioError {
                code: Some(serde_json::json!(code)),
                message: Some("nope".into()),
                more_info: Some(format!("https://www.twilio.com/docs/errors/{code}")),
            })
        };
        let c = |s: u16, e| classify_status(StatusCode::from_u16(s).unwrap(), e, None);
        for code in [21211, 21610, 21408, 21614] {
            match c(400, err(code)) {
                SendOutcome::Rejected {
                    provider_code,
                    message,
                    ..
                } => {
                    assert_eq!(provider_code, Some(code.to_string()));
                    assert!(message.starts_with("nope ("), "{message}");
                }
                other => panic!("{code}: {other:?}"),
            }
        }
        assert!(matches!(c(429, err(20429)), SendOutcome::Retryable { .. }));
        assert!(matches!(c(400, err(20429)), SendOutcome::Retryable { .. }));
        assert!(matches!(c(401, err(20003)), SendOutcome::Rejected { .. }));
        assert!(matches!(c(404, None), SendOutcome::Rejected { .. }));
        assert!(matches!(c(500, err(20500)), SendOutcome::Ambiguous { .. }));
        assert!(matches!(c(503, None), SendOutcome::Ambiguous { .. }));
    }

    #[test]
    fn validity_rounds_up_within_twilios_range() {
        assert_eq!(validity_period(Duration::from_millis(300)), 1);
        assert_eq!(validity_period(Duration::from_millis(1_500)), 2);
        assert_eq!(validity_period(Duration::from_secs(300)), 300);
        assert_eq!(validity_period(Duration::from_secs(99_999)), 36_000);
        assert_eq!(validity_period(Duration::ZERO), 1);
    }

    #[test]
    fn matching_a_listed_message() {
        let since = time::macros::datetime!(2026-03-02 10:00:00 UTC);
        let listed = |to: &str, body: &str, created: &str| TwilioMessage {
            sid: Some("SM1".into()),
            to: Some(to.into()),
            body: Some(body.into()),
            direction: Some("outbound-api".into()),
            date_created: Some(created.into()),
        };
        let s = sms("Your code is 1234");
        let nb = since - CLOCK_SLACK;
        let recent = "Mon, 02 Mar 2026 10:00:01 +0000";
        assert!(is_match(
            &listed("+14155550100", "Your code is 1234", recent),
            &s,
            nb
        ));
        assert!(is_match(
            &listed(
                "+14155550100",
                "Sent from your Twilio trial account - Your code is 1234",
                recent
            ),
            &s,
            nb
        ));
        assert!(!is_match(
            &listed("+14155550100", "Your code is 9999", recent),
            &s,
            nb
        ));
        assert!(!is_match(
            &listed("+14155550199", "Your code is 1234", recent),
            &s,
            nb
        ));
        assert!(!is_match(
            &listed(
                "+14155550100",
                "Your code is 1234",
                "Mon, 02 Mar 2026 09:00:00 +0000"
            ),
            &s,
            nb
        ));
        assert!(is_match(
            &listed("+14155550100", "Your code is 1234", "garbled"),
            &s,
            nb
        ));
    }
}
