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
//! which lists the account's messages to that `To`, newest first, back to
//! [`CLOCK_SLACK`] before the attempt started, and looks for one from the
//! sender this attempt used with exactly our body, whatever its status
//! (`queued`/`accepted` ones included: Twilio's list filters on `DateSent`,
//! to the day, and a message not sent yet has none, so no `DateSent`
//! filter is used). Exactly one such message: sent, under its sid. None,
//! with the window read to its end: not known yet, asked again later and
//! never resent (Twilio documents no bound on how soon a message it
//! created is listed; past the retry deadline the message ends `unknown`).
//! Two, one we cannot judge, or a lookup that fails: nobody can tell
//! (`unknown`). Answers are read up to a size limit, error texts
//! cut to [`super::MAX_ERROR_TEXT`], and a `next_page_uri` is followed only
//! to the configured base URL's Messages list (the credentials go with it).
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

use super::{AttemptRef, OutgoingSms, Provider, Reconciled, SendOutcome, parse_retry_after};
use crate::domain::Phone;

/// Where this service receives Twilio's status callbacks (its `StatusCallback`).
pub const STATUS_CALLBACK_PATH: &str = "/providers/twilio/status";

/// Where the real API lives.
pub const DEFAULT_BASE_URL: &str = "https://api.twilio.com";

/// Twilio's "too many requests" error code.
const TOO_MANY_REQUESTS: i64 = 20429;

/// How far before an attempt's start a message it created may be dated.
/// Twilio's `date_created` has whole seconds (RFC 2822), so a message
/// created 0.9 s after the attempt started can show a time 0.1 s before it;
/// the rest covers Twilio's clock and ours disagreeing (NTP keeps them well
/// within a second). Kept small on purpose: any same-body message from the
/// same sender to the same number created in the slack is a candidate too,
/// and a second candidate makes the answer `unknown`.
pub const CLOCK_SLACK: time::Duration = time::Duration::seconds(5);

/// Messages asked for per page of the list (Twilio allows up to 1000).
pub const LIST_PAGE_SIZE: usize = 100;

/// Pages of the message list read while reconciling, at most.
pub const MAX_LOOKUP_PAGES: usize = 10;

/// The largest page of the message list read (bytes): a page of
/// [`LIST_PAGE_SIZE`] messages of 1600 characters, each escaped as `\uXXXX`,
/// stays under it.
pub const MAX_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// What Twilio puts before the body of a message sent from a trial account.
pub const TRIAL_PREFIX: &str = "Sent from your Twilio trial account - ";

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
#[derive(Clone, Debug, Default, Deserialize)]
struct TwilioMessage {
    sid: Option<String>,
    to: Option<String>,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    body: Option<String>,
    direction: Option<String>,
    date_created: Option<String>,
}

/// Who an attempt sends as: what [`TwilioProvider::form`] puts in `From` and
/// `MessagingServiceSid`. Recorded with each attempt as JSON
/// ([`Provider::sender`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Sender {
    pub from: Option<String>,
    pub messaging_service_sid: Option<String>,
}

#[derive(Deserialize)]
struct MessagePage {
    messages: Vec<TwilioMessage>,
    next_page_uri: Option<String>,
    /// Twilio's clock when it answered (its `Date` header).
    #[serde(skip)]
    date: Option<OffsetDateTime>,
}

impl TwilioProvider {
    pub fn new(settings: TwilioSettings) -> Result<Self, super::ProviderError> {
        let what = "Twilio base";
        let base_url = super::base_url(what, &settings.base_url)?;
        let messages_url = super::endpoint(
            what,
            &base_url,
            &[
                "2010-04-01",
                "Accounts",
                &settings.account_sid,
                "Messages.json",
            ],
        )?;
        let client = super::http_client(settings.timeout, settings.connect_timeout)?;
        Ok(Self {
            client,
            settings,
            messages_url,
            base_url,
        })
    }

    /// Who `sms` is sent as: the request's `from`, else `TWILIO_FROM`, and the
    /// messaging service when one is configured.
    pub fn sender(&self, sms: &OutgoingSms) -> Sender {
        self.sender_for(sms.from.as_deref())
    }

    fn sender_for(&self, from: Option<&str>) -> Sender {
        Sender {
            from: from
                .map(str::to_string)
                .or_else(|| self.settings.from.clone()),
            messaging_service_sid: self.settings.messaging_service_sid.clone(),
        }
    }

    /// Who `attempt` sent as: as recorded with it, else (an attempt made
    /// before senders were recorded) as this configuration would.
    fn sender_of(&self, sms: &OutgoingSms, attempt: &AttemptRef) -> Sender {
        attempt
            .sender
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_else(|| self.sender(sms))
    }

    /// The form Twilio gets for `sms`.
    pub fn form(&self, sms: &OutgoingSms, to: &Phone) -> Vec<(&'static str, String)> {
        let mut form = vec![("To", to.to_string()), ("Body", sms.body.clone())];
        let sender = self.sender(sms);
        if let Some(from) = sender.from {
            form.push(("From", from));
        }
        if let Some(service) = sender.messaging_service_sid {
            form.push(("MessagingServiceSid", service));
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
        let date = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .map(OffsetDateTime::from);
        let body = super::read_body(resp, MAX_PAGE_BYTES)
            .await
            .map_err(|e| format!("reading Twilio's message list failed: {}", e.describe()))?;
        if !status.is_success() {
            let detail = serde_json::from_slice::<TwilioError>(&body)
                .ok()
                .and_then(|e| e.message)
                .map(|m| super::cut_error_text(&m))
                .unwrap_or_default();
            return Err(
                format!("listing messages at Twilio answered {status} {detail}")
                    .trim_end()
                    .to_string(),
            );
        }
        let mut page: MessagePage = serde_json::from_slice(&body)
            .map_err(|e| format!("Twilio's message list could not be read: {e}"))?;
        page.date = date;
        Ok(page)
    }

    /// The address of the page `next` (a list's `next_page_uri`, a path from
    /// the API's root) names, only when it is this account's Messages list
    /// at the configured base URL: the credentials go with the request, so a
    /// page elsewhere is never fetched.
    fn next_page_url(&self, next: &str) -> Result<reqwest::Url, String> {
        let refused = || {
            "Twilio's next page of messages is not at the configured Twilio address; \
             it was not fetched"
                .to_string()
        };
        if !next.starts_with('/') || next.starts_with("//") {
            return Err(refused());
        }
        let base = self.base_url.as_str().trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}{next}")).map_err(|_| refused())?;
        let same_place = url.scheme() == self.messages_url.scheme()
            && url.host_str() == self.messages_url.host_str()
            && url.port_or_known_default() == self.messages_url.port_or_known_default()
            && url.username().is_empty()
            && url.password().is_none()
            && url.path() == self.messages_url.path();
        if same_place { Ok(url) } else { Err(refused()) }
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

/// Twilio errors that refuse the account rather than the message: 20003
/// (authentication failed), 20005 and 10001 (account not active, e.g.
/// suspended). Another provider may send the message.
const ACCOUNT_REFUSALS: [i64; 3] = [20003, 20005, 10001];

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
        }) if !m.is_empty() => super::cut_error_text(&match more_info {
            Some(info) if !info.is_empty() => format!("{m} ({info})"),
            _ => m.clone(),
        }),
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
    let account_refused = status == StatusCode::UNAUTHORIZED
        || code
            .as_deref()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| ACCOUNT_REFUSALS.contains(&c));
    if account_refused && status.is_client_error() {
        return SendOutcome::Refused {
            http_status,
            provider_code: code,
            message,
        };
    }
    match status.as_u16() {
        // A refusal of this request (21211, 21610, 21408, 21614, ...), or a
        // redirect: Twilio did not create a message.
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

#[async_trait]
impl Provider for TwilioProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        // Twilio documents no idempotency key for creating a message.
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let to = match sms.phone() {
            Ok(to) => to,
            Err(refused) => return refused,
        };
        let body = encode_form(&self.form(sms, to));
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
        let bytes = match super::read_body(resp, super::MAX_ANSWER_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return if status.is_success() || status.is_server_error() {
                    SendOutcome::Ambiguous {
                        http_status: Some(status.as_u16()),
                        retry_after,
                        message: format!("reading Twilio's answer failed: {}", e.describe()),
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

    fn sender(&self, from: Option<&str>) -> Option<String> {
        serde_json::to_string(&self.sender_for(from)).ok()
    }

    /// Lists the messages to `To` (newest first by creation; no `DateSent`
    /// filter, which would hide queued messages) until one created before
    /// the window, judging each against the sender the attempt used.
    ///
    /// The window starts [`CLOCK_SLACK`] before the attempt, read on both
    /// clocks that could be wrong ([`window_start`]). A window that starts
    /// too late can only hide our message, which is never "not sent" (an
    /// empty list is asked again): it cannot send twice.
    async fn reconcile(&self, sms: &OutgoingSms, attempt: &AttemptRef) -> Reconciled {
        // A recipient Twilio cannot reach was refused before any request.
        let to = match sms.phone() {
            Ok(to) => to,
            Err(refused) => return Reconciled::Answered(refused),
        };
        let sender = self.sender_of(sms, attempt);
        let mut url = self.messages_url.clone();
        url.query_pairs_mut()
            .append_pair("To", to)
            .append_pair("PageSize", &LIST_PAGE_SIZE.to_string());
        let mut tally = Tally::default();
        let mut not_before = None;
        for _ in 0..MAX_LOOKUP_PAGES {
            let page = match self.list_page(url).await {
                Ok(p) => p,
                Err(reason) => return Reconciled::Unknown(reason),
            };
            let not_before = *not_before
                .get_or_insert_with(|| window_start(attempt, page.date, self.settings.timeout));
            let mut past_window = false;
            for m in &page.messages {
                tally.add(m, compare(m, sms, &sender, not_before));
                past_window |= created(m).is_some_and(|at| at < not_before);
            }
            // Newest first: once one is older than the window, so is the rest.
            if past_window || tally.same.len() > 1 {
                return tally.verdict();
            }
            match page.next_page_uri.filter(|u| !u.is_empty()) {
                None => return tally.verdict(),
                Some(next) => match self.next_page_url(&next) {
                    Ok(u) => url = u,
                    Err(reason) => return Reconciled::Unknown(reason),
                },
            }
        }
        Reconciled::Unknown(format!(
            "more than {MAX_LOOKUP_PAGES} pages of messages to this number since the attempt"
        ))
    }
}

/// The earliest creation time, on Twilio's clock, of a message `attempt`
/// may have created: [`CLOCK_SLACK`] before the earlier of its start on
/// the wall clock of the instance that made it ([`AttemptRef::started_at`])
/// and, when Twilio told its time, Twilio's `now` less the attempt's age
/// and one `call` (the age runs from when this instance's call returned,
/// at most `call` after its request was written; for an inherited attempt
/// the age is smaller still, and the start on the wall clock decides).
pub fn window_start(
    attempt: &AttemptRef,
    twilio_now: Option<OffsetDateTime>,
    call: Duration,
) -> OffsetDateTime {
    let ours = attempt.started_at;
    let theirs = twilio_now.and_then(|now| {
        time::Duration::try_from(attempt.age + call)
            .ok()
            .map(|age| now - age)
    });
    theirs.map_or(ours, |t| t.min(ours)) - CLOCK_SLACK
}

mod lookup;
pub mod receipts;
mod settings;
mod signing;

pub use receipts::TwilioReceipts;
pub use settings::ADAPTER;

use lookup::{Tally, compare, created};
pub use signing::{signature, verify_signature};

#[cfg(test)]
mod tests;
