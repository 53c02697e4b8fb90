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
//! (`queued`/`accepted` ones included: Twilio's `date_sent` is null until
//! the carrier has it, so no `DateSent` filter is used). Exactly one such
//! message: sent, under its sid. None, with the window read to its end: a
//! resend is safe. Two, one we cannot judge, or a lookup that fails: nobody
//! can tell (`unknown`). Answers are read up to a size limit, error texts
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

use super::{OutgoingSms, Provider, Reconciled, SendOutcome, parse_retry_after};

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
/// `MessagingServiceSid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sender {
    pub from: Option<String>,
    pub messaging_service_sid: Option<String>,
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

    /// Who `sms` is sent as: the request's `from`, else `TWILIO_FROM`, and the
    /// messaging service when one is configured.
    pub fn sender(&self, sms: &OutgoingSms) -> Sender {
        Sender {
            from: sms.from.clone().or_else(|| self.settings.from.clone()),
            messaging_service_sid: self.settings.messaging_service_sid.clone(),
        }
    }

    /// The form Twilio gets for `sms`.
    pub fn form(&self, sms: &OutgoingSms) -> Vec<(&'static str, String)> {
        let mut form = vec![("To", sms.to.clone()), ("Body", sms.body.clone())];
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
        serde_json::from_slice(&body)
            .map_err(|e| format!("Twilio's message list could not be read: {e}"))
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

/// How a listed message compares with the one an attempt may have created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    /// To, direction, sender and body are ours, created within the window.
    Same,
    /// Nothing rules it out, but something needed to tell is missing (a
    /// redacted body, no sender, no readable date): it may be ours.
    Maybe,
    /// Certainly not the message this attempt created.
    Other,
}

impl Match {
    fn and(self, other: Match) -> Match {
        match (self, other) {
            (Match::Other, _) | (_, Match::Other) => Match::Other,
            (Match::Maybe, _) | (_, Match::Maybe) => Match::Maybe,
            _ => Match::Same,
        }
    }
}

/// `Same` when `listed` is `ours`, `Other` when it is something else,
/// `Maybe` when Twilio did not show it.
fn field(listed: Option<&str>, ours: impl Fn(&str) -> bool) -> Match {
    match listed {
        None | Some("") => Match::Maybe,
        Some(v) if ours(v) => Match::Same,
        Some(_) => Match::Other,
    }
}

/// When a listed message was created, if Twilio says so readably.
fn created(m: &TwilioMessage) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(m.date_created.as_deref()?, &Rfc2822).ok()
}

/// Whether `m` is the message `sms`, sent as `sender` by an attempt that
/// started at `not_before` + [`CLOCK_SLACK`], may have created. Its status
/// does not matter: a `queued`, `accepted`, `scheduled` or `sending`
/// message was created as surely as a `delivered` one.
fn compare(
    m: &TwilioMessage,
    sms: &OutgoingSms,
    sender: &Sender,
    not_before: OffsetDateTime,
) -> Match {
    let to = field(m.to.as_deref(), |to| to == sms.to);
    // What a create through the API makes; `outbound-reply`/`outbound-call`
    // come from TwiML, never from this adapter.
    let direction = field(m.direction.as_deref(), |d| d == "outbound-api");
    // Equal, or with the trial-account prefix: nothing else (a message that
    // merely ends with ours is someone else's, e.g. "Your code is 1234"
    // against our "1234").
    let body = field(m.body.as_deref(), |b| {
        b == sms.body || b.strip_prefix(TRIAL_PREFIX) == Some(sms.body.as_str())
    });
    let service = match &sender.messaging_service_sid {
        Some(ours) => field(m.messaging_service_sid.as_deref(), |s| s == ours),
        None => Match::Same,
    };
    let from = match (&sender.from, m.from.as_deref()) {
        (None, _) => Match::Same,
        (Some(ours), Some(f)) if !f.is_empty() => field(Some(f), |f| f == ours),
        // No sender shown: only a message sent through a messaging service
        // lacks one, while the service chooses it.
        (Some(_), _) => match (
            m.messaging_service_sid.as_deref().filter(|s| !s.is_empty()),
            &sender.messaging_service_sid,
        ) {
            (Some(theirs), Some(ours)) => field(Some(theirs), |s| s == ours),
            (Some(_), None) => Match::Other,
            (None, _) => Match::Maybe,
        },
    };
    let when = match created(m) {
        Some(at) if at >= not_before => Match::Same,
        Some(_) => Match::Other,
        None => Match::Maybe,
    };
    [to, direction, body, service, from, when]
        .into_iter()
        .fold(Match::Same, Match::and)
}

/// What the listed messages read so far say.
#[derive(Debug, Default)]
struct Tally {
    /// Sids of the messages that are ours by every field.
    same: Vec<String>,
    /// Messages that may be ours (or are, but show no sid).
    maybe: usize,
}

impl Tally {
    fn add(&mut self, m: &TwilioMessage, verdict: Match) {
        match (verdict, m.sid.as_deref().filter(|s| !s.is_empty())) {
            (Match::Same, Some(sid)) => self.same.push(sid.to_string()),
            (Match::Same | Match::Maybe, _) => self.maybe += 1,
            (Match::Other, _) => {}
        }
    }

    /// The answer once the whole window has been read: exactly one message
    /// that is ours and none that may be, sent; none at all, not sent;
    /// anything else, nobody can tell which (never a guess).
    fn verdict(self) -> Reconciled {
        match (self.same.as_slice(), self.maybe) {
            ([], 0) => Reconciled::NotSent,
            ([sid], 0) => Reconciled::Sent {
                provider_message_id: sid.clone(),
            },
            (same, maybe) => {
                let mut reason = format!(
                    "Twilio lists {} messages that may be this one",
                    same.len() + maybe
                );
                if !same.is_empty() {
                    let shown: Vec<&str> = same.iter().take(3).map(String::as_str).collect();
                    reason.push_str(&format!(" ({}", shown.join(", ")));
                    if same.len() > shown.len() {
                        reason.push_str(", ...");
                    }
                    reason.push(')');
                }
                Reconciled::Unknown(reason)
            }
        }
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

    /// `since` is when this attempt started. Lists the messages to `To`
    /// (newest first by creation; no `DateSent` filter, which would hide
    /// queued messages) until one created before the window, judging each.
    async fn reconcile(&self, sms: &OutgoingSms, since: OffsetDateTime) -> Reconciled {
        let not_before = since - CLOCK_SLACK;
        let sender = self.sender(sms);
        let mut url = self.messages_url.clone();
        url.query_pairs_mut()
            .append_pair("To", &sms.to)
            .append_pair("PageSize", &LIST_PAGE_SIZE.to_string());
        let mut tally = Tally::default();
        for _ in 0..MAX_LOOKUP_PAGES {
            let page = match self.list_page(url).await {
                Ok(p) => p,
                Err(reason) => return Reconciled::Unknown(reason),
            };
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

    /// A listed message like the one `sms("Your code is 1234")` creates when
    /// sent as `+14155550000`, a second after 10:00:00.
    fn listed() -> TwilioMessage {
        TwilioMessage {
            sid: Some("SM1".into()),
            to: Some("+14155550100".into()),
            from: Some("+14155550000".into()),
            messaging_service_sid: None,
            body: Some("Your code is 1234".into()),
            direction: Some("outbound-api".into()),
            date_created: Some("Mon, 02 Mar 2026 10:00:01 +0000".into()),
        }
    }

    #[test]
    fn matching_a_listed_message() {
        use Match::*;
        let since = time::macros::datetime!(2026-03-02 10:00:00 UTC);
        let nb = since - CLOCK_SLACK;
        let by_number = Sender {
            from: Some("+14155550000".into()),
            messaging_service_sid: None,
        };
        const SERVICE: &str = "MG0123456789abcdef0123456789abcdef";
        let by_service = Sender {
            from: None,
            messaging_service_sid: Some(SERVICE.into()),
        };
        let both = Sender {
            from: Some("+14155550000".into()),
            messaging_service_sid: Some(SERVICE.into()),
        };
        let ours = sms("Your code is 1234");
        type Edit = fn(&mut TwilioMessage);
        let table: &[(&str, &Sender, Edit, Match)] = &[
            ("ours", &by_number, |_| {}, Same),
            (
                "trial prefix",
                &by_number,
                |m| m.body = Some(format!("{TRIAL_PREFIX}Your code is 1234")),
                Same,
            ),
            (
                "another prefix",
                &by_number,
                |m| m.body = Some("Hi! Your code is 1234".into()),
                Other,
            ),
            (
                "ends with ours only",
                &by_number,
                |m| m.body = Some("Your code is 91234".into()),
                Other,
            ),
            (
                "another body",
                &by_number,
                |m| m.body = Some("Your code is 9999".into()),
                Other,
            ),
            (
                "body with more after ours",
                &by_number,
                |m| m.body = Some("Your code is 1234.".into()),
                Other,
            ),
            (
                "redacted body",
                &by_number,
                |m| m.body = Some(String::new()),
                Maybe,
            ),
            ("no body", &by_number, |m| m.body = None, Maybe),
            (
                "another number",
                &by_number,
                |m| m.to = Some("+14155550199".into()),
                Other,
            ),
            (
                "inbound",
                &by_number,
                |m| m.direction = Some("inbound".into()),
                Other,
            ),
            (
                "outbound-reply",
                &by_number,
                |m| m.direction = Some("outbound-reply".into()),
                Other,
            ),
            ("no direction", &by_number, |m| m.direction = None, Maybe),
            (
                "another sender",
                &by_number,
                |m| m.from = Some("+14155559999".into()),
                Other,
            ),
            (
                "alphanumeric sender",
                &by_number,
                |m| m.from = Some("ACME".into()),
                Other,
            ),
            ("no sender shown", &by_number, |m| m.from = None, Maybe),
            (
                "no sender shown, through a service we did not use",
                &by_number,
                |m| {
                    m.from = None;
                    m.messaging_service_sid = Some(SERVICE.into())
                },
                Other,
            ),
            (
                "created at the start",
                &by_number,
                |m| m.date_created = Some("Mon, 02 Mar 2026 10:00:00 +0000".into()),
                Same,
            ),
            (
                "created in the slack",
                &by_number,
                |m| m.date_created = Some("Mon, 02 Mar 2026 09:59:55 +0000".into()),
                Same,
            ),
            (
                "created before the slack",
                &by_number,
                |m| m.date_created = Some("Mon, 02 Mar 2026 09:59:54 +0000".into()),
                Other,
            ),
            (
                "an hour before",
                &by_number,
                |m| m.date_created = Some("Mon, 02 Mar 2026 09:00:00 +0000".into()),
                Other,
            ),
            (
                "garbled date",
                &by_number,
                |m| m.date_created = Some("garbled".into()),
                Maybe,
            ),
            ("no date", &by_number, |m| m.date_created = None, Maybe),
            (
                "garbled date, other body",
                &by_number,
                |m| {
                    m.date_created = None;
                    m.body = Some("x".into())
                },
                Other,
            ),
            (
                "service, sender not chosen yet",
                &by_service,
                |m| {
                    m.from = None;
                    m.messaging_service_sid = Some(SERVICE.into())
                },
                Same,
            ),
            (
                "service, sender chosen",
                &by_service,
                |m| m.messaging_service_sid = Some(SERVICE.into()),
                Same,
            ),
            (
                "another service",
                &by_service,
                |m| m.messaging_service_sid = Some("MGffffffffffffffffffffffffffffffff".into()),
                Other,
            ),
            ("no service shown", &by_service, |_| {}, Maybe),
            (
                "number and service",
                &both,
                |m| m.messaging_service_sid = Some(SERVICE.into()),
                Same,
            ),
            (
                "number and service, no sender yet",
                &both,
                |m| {
                    m.from = None;
                    m.messaging_service_sid = Some(SERVICE.into())
                },
                Same,
            ),
            (
                "number and service, another sender",
                &both,
                |m| {
                    m.from = Some("+14155559999".into());
                    m.messaging_service_sid = Some(SERVICE.into())
                },
                Other,
            ),
        ];
        for (name, sender, edit, want) in table {
            let mut m = listed();
            edit(&mut m);
            assert_eq!(compare(&m, &ours, sender, nb), *want, "{name}");
        }
        // The request's own `from` is the sender when it has one.
        let mut m = listed();
        m.from = Some("ACME".into());
        let acme = Sender {
            from: Some("ACME".into()),
            messaging_service_sid: None,
        };
        assert_eq!(compare(&m, &ours, &acme, nb), Same);
    }

    #[test]
    fn the_verdict_takes_exactly_one_candidate() {
        let tally = |same: &[&str], maybe: usize| Tally {
            same: same.iter().map(|s| s.to_string()).collect(),
            maybe,
        };
        assert_eq!(tally(&[], 0).verdict(), Reconciled::NotSent);
        assert_eq!(
            tally(&["SM1"], 0).verdict(),
            Reconciled::Sent {
                provider_message_id: "SM1".into()
            }
        );
        for (same, maybe) in [(&["SM1", "SM2"][..], 0), (&["SM1"][..], 1), (&[][..], 1)] {
            match tally(same, maybe).verdict() {
                Reconciled::Unknown(reason) => {
                    for sid in same {
                        assert!(reason.contains(sid), "{reason}");
                    }
                }
                other => panic!("{same:?} {maybe}: {other:?}"),
            }
        }
        // A sid-less message that is ours by every field is no answer.
        let mut t = Tally::default();
        t.add(
            &TwilioMessage {
                sid: None,
                ..listed()
            },
            Match::Same,
        );
        assert!(matches!(t.verdict(), Reconciled::Unknown(_)));
    }

    #[test]
    fn next_pages_are_followed_only_to_the_configured_list() {
        let provider = |base: &str| {
            TwilioProvider::new(TwilioSettings {
                base_url: base.into(),
                account_sid: "AC0123456789abcdef0123456789abcdef".into(),
                auth_token: "token".into(),
                from: None,
                messaging_service_sid: None,
                status_callback: None,
                timeout: Duration::from_secs(1),
                connect_timeout: Duration::from_secs(1),
            })
            .unwrap()
        };
        let list = "/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Messages.json";
        let twilio = provider("https://api.twilio.com");
        let next = format!("{list}?To=%2B14155550100&PageSize=100&Page=1&PageToken=PAx");
        assert_eq!(
            twilio.next_page_url(&next).unwrap().as_str(),
            format!("https://api.twilio.com{next}")
        );
        // A base URL with a path (a proxy) keeps it.
        let proxied = provider("https://proxy.example/twilio/");
        assert_eq!(
            proxied.next_page_url(&next).unwrap().as_str(),
            format!("https://proxy.example/twilio{next}")
        );
        for refused in [
            format!("https://evil.example{list}"),
            format!("http://api.twilio.com{list}"),
            format!("https://api.twilio.com:8443{list}"),
            format!("//evil.example{list}"),
            format!("/\\evil.example{list}"),
            format!("@evil.example{list}"),
            format!("{list}/../../../../Accounts/ACother/Messages.json"),
            "/2010-04-01/Accounts/ACother/Messages.json".to_string(),
            "/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Calls.json".to_string(),
            "Messages.json?Page=1".to_string(),
            String::new(),
        ] {
            assert!(twilio.next_page_url(&refused).is_err(), "{refused}");
        }
    }
}
