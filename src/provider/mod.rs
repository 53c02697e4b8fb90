//! SMS providers behind one trait, and how their answers are classified.
//!
//! Every outcome of a provider call falls in exactly one class, and the class
//! alone decides what delivery does next:
//!
//! | class       | meaning                                   | next step                         |
//! |-------------|-------------------------------------------|-----------------------------------|
//! | `Accepted`  | the provider took the message             | `sent`                            |
//! | `Rejected`  | a refusal of this message (4xx but        | `failed`, no retry, no other      |
//! |             | 401/403/408/425/429)                      | provider                          |
//! | `Refused`   | the provider refuses to send anything for | next provider, else `failed`      |
//! |             | us (bad credentials, suspended account);  |                                   |
//! |             | it did not act                            |                                   |
//! | `Retryable` | the provider certainly did not act        | next provider, else retry with    |
//! |             |                                           | backoff / Retry-After             |
//! | `Ambiguous` | it may have acted (timeout after sending, | retry only through a provider     |
//! |             | 5xx, connection reset mid-response)       | that de-duplicates on our key;    |
//! |             |                                           | otherwise reconcile or `unknown`  |

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::domain::{MessageId, Phone, Recipient};

pub mod receipts;
pub mod registry;
pub mod testmode;

/// Declares each adapter's folder and lists it in [`ADAPTERS`]: adding a
/// provider is its folder and its name here.
macro_rules! adapters {
    ($($name:ident),+ $(,)?) => {
        $(pub mod $name;)+

        /// Every adapter (`src/provider/<name>/`), in the order the command
        /// line lists their variables.
        pub static ADAPTERS: &[Adapter] = &[$($name::ADAPTER),+];

        /// Each adapter's heading over its variables in `sendonce --help`
        /// (`Provider twilio`), in [`ADAPTERS`]' order.
        pub static HELP_HEADINGS: &[&str] = &[$(concat!("Provider ", stringify!($name))),+];
    };
}

adapters!(
    simulated,
    http,
    twilio,
    infobip,
    vonage,
    smpp,
    telegram,
    telegram_gateway,
    whatsapp
);

pub use http::HttpProvider;
pub use infobip::{InfobipProvider, InfobipSettings};
pub use registry::{Adapter, Configured};
pub use simulated::SimulatedProvider;
pub use telegram::{TelegramProvider, TelegramSettings};
pub use twilio::{TwilioProvider, TwilioSettings};
pub use vonage::{VonageProvider, VonageSettings};

/// Why a provider could not be built. `Display` is one line; the cause (a
/// URL parse error, reqwest's) is the `source()`.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("invalid {what} URL")]
    Url {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("the {what} URL must be an http or https URL that can take a path")]
    NotHttp { what: &'static str },
    #[error("building the HTTP client")]
    Client(#[source] reqwest::Error),
}

/// One SMS as handed to a provider.
#[derive(Clone, Debug)]
pub struct OutgoingSms {
    /// Our message id: passed as the provider-side idempotency key, the same
    /// on every attempt of one message.
    pub message_id: MessageId,
    /// Who it goes to. An SMS adapter sends to [`OutgoingSms::phone`].
    pub to: Recipient,
    pub from: Option<String>,
    pub body: String,
    /// What is left of the message's validity period, if it has one.
    pub validity: Option<Duration>,
    /// The attempt's number (1 for the first).
    pub attempt: u32,
    /// What the provider's first call handed out for this message
    /// ([`Provider::prepare`]), stored with the message before the send.
    pub prepared: Option<String>,
}

impl OutgoingSms {
    /// The number an SMS adapter sends to. A recipient of another channel
    /// is refused (the adapter did not act; delivery moves on to the next
    /// provider, or ends the message), never sent as if it were a number.
    pub fn phone(&self) -> Result<&Phone, SendOutcome> {
        self.to.phone().ok_or_else(|| SendOutcome::Refused {
            http_status: None,
            provider_code: None,
            message: format!(
                "this provider sends SMS only; it cannot reach a {} recipient",
                self.to.channel()
            ),
        })
    }
}

/// The class of one provider call's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    Accepted {
        provider_message_id: String,
        http_status: Option<u16>,
    },
    Rejected {
        http_status: Option<u16>,
        provider_code: Option<String>,
        message: String,
    },
    /// The provider refuses to send anything for this account (bad
    /// credentials, a suspended account): it did not act, and nothing about
    /// the message itself was refused, so another provider may send it.
    Refused {
        http_status: Option<u16>,
        provider_code: Option<String>,
        message: String,
    },
    Retryable {
        http_status: Option<u16>,
        provider_code: Option<String>,
        retry_after: Option<Duration>,
        message: String,
    },
    Ambiguous {
        http_status: Option<u16>,
        retry_after: Option<Duration>,
        message: String,
    },
}

impl SendOutcome {
    /// The outcome's class, as a metric label: `ok`, `permanent`,
    /// `refused`, `retryable` or `ambiguous`.
    pub fn class(&self) -> &'static str {
        match self {
            SendOutcome::Accepted { .. } => "ok",
            SendOutcome::Rejected { .. } => "permanent",
            SendOutcome::Refused { .. } => "refused",
            SendOutcome::Retryable { .. } => "retryable",
            SendOutcome::Ambiguous { .. } => "ambiguous",
        }
    }
}

impl SendOutcome {
    /// This outcome with the message text `body` and every run of four or
    /// more digits in it (a one-time code, an order number) taken out of
    /// the provider's error text: a provider that quotes the SMS in its
    /// error must not leak a code into the attempt, the message's error,
    /// the events, webhooks, the console or the logs (issue 29, finding 2).
    /// The provider's error code is scrubbed the same way: a provider may
    /// quote the SMS there too (issue 41, finding 1).
    ///
    /// Every configured secret in `secrets`, and the query of any URL, are
    /// taken out as well: a provider that quotes the request (the delivery
    /// report URL carrying `INFOBIP_RECEIPT_SECRET`, a credential) must not
    /// show a secret to the tenant (issue 41, finding 8).
    pub fn scrubbed(self, body: &str, secrets: &Secrets) -> SendOutcome {
        let clean = |m: String| secrets.scrub(&scrub(&m, body));
        let clean_code = |c: Option<String>| c.map(|c| secrets.scrub(&scrub(&c, body)));
        match self {
            SendOutcome::Accepted { .. } => self,
            SendOutcome::Rejected {
                http_status,
                provider_code,
                message,
            } => SendOutcome::Rejected {
                http_status,
                provider_code: clean_code(provider_code),
                message: clean(message),
            },
            SendOutcome::Refused {
                http_status,
                provider_code,
                message,
            } => SendOutcome::Refused {
                http_status,
                provider_code: clean_code(provider_code),
                message: clean(message),
            },
            SendOutcome::Retryable {
                http_status,
                provider_code,
                retry_after,
                message,
            } => SendOutcome::Retryable {
                http_status,
                provider_code: clean_code(provider_code),
                retry_after,
                message: clean(message),
            },
            SendOutcome::Ambiguous {
                http_status,
                retry_after,
                message,
            } => SendOutcome::Ambiguous {
                http_status,
                retry_after,
                message: clean(message),
            },
        }
    }

    /// Whether the answer tells that the provider is working: it accepted
    /// the message or refused something about the message itself. Anything
    /// else (it refused everything, was not reachable, or gave no clear
    /// answer) is a failure for its circuit breaker.
    pub fn provider_works(&self) -> bool {
        matches!(
            self,
            SendOutcome::Accepted { .. } | SendOutcome::Rejected { .. }
        )
    }
}

/// What a provider says about a send whose outcome we did not see.
///
/// A provider's log or message list may lag behind its answers without
/// bound unless its documentation bounds it (neither Infobip nor Twilio
/// does): an empty lookup is `Pending`, never `NotSent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconciled {
    /// It has the message: it was sent once, under this id.
    Sent { provider_message_id: String },
    /// It certainly has no such message: sending again is safe. Only a
    /// lookup its provider documents as complete may answer it; no adapter
    /// does today (an attempt an adapter refused before any request says
    /// so with [`Reconciled::Answered`]).
    NotSent,
    /// The provider shows this attempt's own answer, as a send would have
    /// returned it (Infobip's log entry with a `REJECTED` status): the
    /// attempt is decided as if the provider had answered it. Never
    /// `Ambiguous`.
    Answered(SendOutcome),
    /// Not yet known: the provider is still acting on the request, its
    /// lookup shows nothing yet (it may lag), or its one candidate could
    /// still turn out to be another in-flight message's. Nothing is sent;
    /// the question is asked again later (and past the retry deadline the
    /// message ends `unknown`).
    Pending(String),
    /// Nobody can tell.
    Unknown(String),
}

/// The attempt a reconciliation asks about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRef {
    /// When it started, on the wall clock of the instance that started it
    /// (a fresh message's insert, before its wait for a send slot). Only
    /// for a window on the provider's own clock that must not start late
    /// (Twilio's message list): never an age.
    pub started_at: OffsetDateTime,
    /// At least this long ago its request was written, on a clock that
    /// cannot step (`crate::clock::Stamp`): a lower bound, for every window
    /// an adapter judges by age. For this instance's own call it runs from
    /// when the call returned; for an attempt it inherited (a takeover, a
    /// recheck) from its own claim, less the provider timeout and the lease
    /// freshness (the previous owner may have written its request that
    /// long after our claim), saturating at zero.
    pub age: Duration,
    /// Who it sent as, in the provider's words ([`Provider::sender`]), when
    /// that was recorded (attempts made before it was are not).
    pub sender: Option<String>,
}

/// What the service hands a provider when it starts it ([`Provider::start`]).
#[derive(Clone)]
pub struct ProviderRuntime {
    /// Cancelled when the service stops, after its sends have drained.
    pub stop: tokio_util::sync::CancellationToken,
    /// Where receipts that do not arrive over HTTP (SMPP's `deliver_sm`)
    /// are handed: the service's shared receipt handling.
    pub receipts: std::sync::Arc<dyn receipts::ReceiptSink>,
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The name stored with each message (`simulated`, `http`, ...).
    fn name(&self) -> &'static str;

    /// The channel whose addresses it carries ([`Recipient::channel`]):
    /// delivery hands it only messages to those (`sms` unless the adapter
    /// is a channel of its own, `registry::Channel`).
    fn channel(&self) -> &'static str {
        "sms"
    }

    /// Whether the provider de-duplicates on the idempotency key we pass it,
    /// so that resending after an ambiguous outcome cannot send twice. Only
    /// where its documentation says so (docs/providers.md cites it).
    fn dedupes_by_key(&self) -> bool;

    /// Whether a refusal of a resend under our key also says that no
    /// earlier attempt under that key sent the message, so that the message
    /// may end `failed` after an ambiguous attempt. True for a key that
    /// replays its first answer (the `http` bridge); false where the
    /// refusal is about the repeat alone (Infobip's idempotency refuses a
    /// repeat whatever became of the first). Defaults to
    /// [`Provider::dedupes_by_key`].
    fn rejection_covers_earlier_attempts(&self) -> bool {
        self.dedupes_by_key()
    }

    /// Whether a finished attempt to `to` means the recipient opted out of
    /// everything this installation sends them (a Telegram chat that
    /// blocked the bot): the finishing write records the opt-out with the
    /// message, so that nothing more is sent there. Defaults to never.
    fn opts_out(
        &self,
        _to: &Recipient,
        _outcome: crate::domain::AttemptOutcome,
        _provider_code: Option<&str>,
    ) -> bool {
        false
    }

    /// Makes one attempt. Never panics; every failure is classified.
    async fn send(&self, sms: &OutgoingSms) -> SendOutcome;

    /// Who a message with this `from` (the request's, if any) is sent as,
    /// in this provider's own words, when its configuration decides more
    /// than the request does (a default sender, a messaging service). It is
    /// recorded with each attempt, so that whoever reconciles the attempt
    /// later, under another configuration, matches what was really sent.
    fn sender(&self, _from: Option<&str>) -> Option<String> {
        None
    }

    /// Starts what the provider keeps running beside its calls (SMPP's
    /// sessions), when the service starts; it must end once `runtime.stop`
    /// is cancelled, which the service does after its sends have drained.
    /// Most providers keep nothing running: `None`.
    fn start(&self, _runtime: ProviderRuntime) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    /// Whether the provider has a first call ([`Provider::prepare`]):
    /// delivery asks only those, so that every other send costs nothing
    /// more.
    fn prepares(&self) -> bool {
        false
    }

    /// The first of two calls, for a provider whose send must carry what
    /// an earlier call handed out (the Telegram Gateway's
    /// `checkSendAbility` and its `request_id`). `None`: no such call (the
    /// default). `Some(Ok(token))`: delivery writes the token with the
    /// message, fenced on its lease, and only then calls [`Provider::send`]
    /// with it in [`OutgoingSms::prepared`]; every later attempt reuses it
    /// without preparing again. `Some(Err(outcome))`: how the attempt ends
    /// (nothing was sent).
    async fn prepare(&self, _sms: &OutgoingSms) -> Option<Result<String, SendOutcome>> {
        None
    }

    /// Withdraws a message sent under `prepared` (a token of
    /// [`Provider::prepare`]) that was not delivered yet, best effort:
    /// whether the provider said it did. Providers that cannot: false.
    async fn revoke(&self, _prepared: &str) -> bool {
        false
    }

    /// Asks the provider what became of a message it took under
    /// `provider_message_id`, by a lookup it documents: the answer as one
    /// of its receipts would carry it, and what that means for the message
    /// (as its receipt route reads the word). `None`: it cannot be asked,
    /// or gave no answer. The verification fallback asks before it moves a
    /// code on from silence: a report that was lost, refused or never
    /// asked for must not put the code on a second channel.
    async fn delivery_status(
        &self,
        _provider_message_id: &str,
    ) -> Option<(receipts::Receipt, Option<crate::domain::Status>)> {
        None
    }

    /// Asks the provider whether `sms` was sent by `attempt`. Providers
    /// that cannot be asked say `Unknown`.
    async fn reconcile(&self, _sms: &OutgoingSms, _attempt: &AttemptRef) -> Reconciled {
        Reconciled::Unknown(format!(
            "the {} provider cannot be asked whether it sent the message",
            self.name()
        ))
    }
}

/// `url` as the base of an adapter's endpoints: an http or https URL that
/// can take a path (`what` names it in the error).
pub(crate) fn base_url(what: &'static str, url: &str) -> Result<reqwest::Url, ProviderError> {
    let base = reqwest::Url::parse(url).map_err(|e| ProviderError::Url {
        what,
        source: e.into(),
    })?;
    if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
        return Err(ProviderError::NotHttp { what });
    }
    Ok(base)
}

/// `base` with `segments` after its path (each one escaped as a path
/// segment; a trailing `/` of the base is dropped first).
pub(crate) fn endpoint(
    what: &'static str,
    base: &reqwest::Url,
    segments: &[&str],
) -> Result<reqwest::Url, ProviderError> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| ProviderError::NotHttp { what })?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// The HTTP client of an adapter: `timeout` bounds a whole call,
/// `connect_timeout` the connect (until then nothing was sent), and it
/// never follows a redirect (a POST must not silently turn into a GET
/// elsewhere, nor a credential follow it).
pub(crate) fn http_client(
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<reqwest::Client, ProviderError> {
    crate::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(ProviderError::Client)
}

/// `text` without `body` and without any run of four or more digits that
/// `body` contains.
pub fn scrub(text: &str, body: &str) -> String {
    let mut out = if body.is_empty() {
        text.to_string()
    } else {
        text.replace(body, "[message text]")
    };
    let mut runs: Vec<&str> = body
        .split(|c: char| !c.is_ascii_digit())
        .filter(|run| run.len() >= 4)
        .collect();
    // Longest first, so that a run inside a longer one goes with it.
    runs.sort_by_key(|run| std::cmp::Reverse(run.len()));
    for run in runs {
        out = out.replace(run, "[digits]");
    }
    out
}

/// The installation's configured secrets (every adapter variable marked
/// secret: API keys, tokens, receipt secrets), taken out of any provider
/// text before it is stored, shown or logged. Its `Debug` shows a count only.
#[derive(Clone, Default)]
pub struct Secrets(std::sync::Arc<[String]>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// The shortest value taken out: a shorter one (a PIN-like test value)
    /// would blank out common words and numbers; every configured secret
    /// the service accepts is longer.
    pub const MIN_LEN: usize = 6;

    /// `values`, blanks and those under [`Secrets::MIN_LEN`] characters
    /// left out, longest first (so one inside another goes with it).
    pub fn new(values: impl IntoIterator<Item = String>) -> Secrets {
        let mut v: Vec<String> = values
            .into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| s.chars().count() >= Self::MIN_LEN)
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        v.dedup();
        Secrets(v.into())
    }

    /// The values of every adapter variable marked secret in `vars`.
    pub fn from_vars(vars: &registry::Vars) -> Secrets {
        Secrets::new(
            registry::Vars::known()
                .filter(|v| v.secret)
                .filter_map(|v| vars.get(v.env))
                .map(str::to_string),
        )
    }

    /// `text` with every secret replaced by `[secret]` and the query of
    /// every `http(s)://` URL by `[query]`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in self.0.iter() {
            out = out.replace(secret.as_str(), "[secret]");
        }
        without_url_queries(&out)
    }
}

/// `text` with the query (and fragment) of every `http://` or `https://`
/// URL in it replaced by `[query]`: a URL's query is where a secret rides
/// (a receipt secret, a token), and nothing a tenant needs is in it.
fn without_url_queries(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| lower[at..].find(scheme).map(|i| at + i))
        .min()
    {
        let end = text[found..]
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '<' | '>' | '`'))
            .map_or(text.len(), |i| found + i);
        let url = &text[found..end];
        out.push_str(&text[at..found]);
        match url.find(['?', '#']) {
            Some(q) => {
                out.push_str(&url[..q]);
                out.push_str("?[query]");
            }
            None => out.push_str(url),
        }
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The largest provider answer to a send that is read (bytes); a longer one
/// is not read on (see [`read_body`]).
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The longest provider error text kept (characters): a provider's error
/// message is stored with the attempt and shown to the client, so a longer
/// one is cut there and ends in `…`.
pub const MAX_ERROR_TEXT: usize = 500;

/// `text`, cut to [`MAX_ERROR_TEXT`] characters.
pub fn cut_error_text(text: &str) -> String {
    match text.char_indices().nth(MAX_ERROR_TEXT) {
        None => text.to_string(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

/// Why a provider's answer could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// It was longer than the limit: not read on.
    TooLarge {
        limit: usize,
    },
    Transport(reqwest::Error),
}

impl BodyError {
    /// A short description, without anything the provider sent.
    pub fn describe(&self) -> String {
        match self {
            BodyError::TooLarge { limit } => format!("the answer was larger than {limit} bytes"),
            BodyError::Transport(e) if e.is_timeout() => "timeout".into(),
            BodyError::Transport(_) => "connection error".into(),
        }
    }
}

/// Reads `resp`'s body, refusing one longer than `limit` bytes (by its
/// `Content-Length`, or as soon as more arrived) instead of holding whatever
/// a provider, or whoever answers in its place, sends.
pub async fn read_body(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let too_large = BodyError::TooLarge { limit };
    if resp
        .content_length()
        .is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX))
    {
        return Err(too_large);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Parses `Retry-After`: delta-seconds or an HTTP-date (RFC 9110 10.2.3).
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn construction_errors_keep_their_cause() {
        let t = Duration::from_secs(1);
        let e = HttpProvider::new("not a url", None, t, t).unwrap_err();
        assert_eq!(e.to_string(), "invalid provider URL");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        let e = HttpProvider::new("ftp://x", None, t, t).unwrap_err();
        assert!(matches!(e, ProviderError::NotHttp { .. }), "{e:?}");
        let twilio = |base_url: &str| TwilioSettings {
            base_url: base_url.into(),
            account_sid: "AC0123456789abcdef0123456789abcdef".into(),
            auth_token: "t".into(),
            from: None,
            messaging_service_sid: None,
            status_callback: None,
            timeout: t,
            connect_timeout: t,
        };
        let e = TwilioProvider::new(twilio("::")).unwrap_err();
        assert_eq!(e.to_string(), "invalid Twilio base URL");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        let e = TwilioProvider::new(twilio("mailto:x@example.com")).unwrap_err();
        assert!(matches!(e, ProviderError::NotHttp { .. }), "{e:?}");
    }

    #[test]
    fn retry_after_forms() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn error_texts_lose_the_body_and_its_codes() {
        let body = "Your verification code is 482913";
        assert_eq!(
            scrub("Invalid message 'Your verification code is 482913'", body),
            "Invalid message '[message text]'"
        );
        assert_eq!(
            scrub("blocked: content 482913 looks like spam", body),
            "blocked: content [digits] looks like spam"
        );
        // Short digit runs (a status, a count) stay.
        assert_eq!(
            scrub("error 21211 at 12:00", "code 12"),
            "error 21211 at 12:00"
        );
        let scrubbed = SendOutcome::Rejected {
            http_status: Some(400),
            provider_code: Some("21617".into()),
            message: "the body 'Your verification code is 482913' is too long".into(),
        }
        .scrubbed(body, &Secrets::default());
        assert!(
            matches!(&scrubbed, SendOutcome::Rejected { message, .. }
            if !message.contains("482913")),
            "{scrubbed:?}"
        );
    }

    #[test]
    fn error_texts_lose_configured_secrets_and_url_queries() {
        let secrets = Secrets::from_vars(&registry::Vars::from_pairs([
            ("INFOBIP_RECEIPT_SECRET", "receipt-secret-0123456789"),
            ("INFOBIP_API_KEY", "app-key-abcdef"),
            ("INFOBIP_FROM", "ACME-SENDER"),
        ]));
        let outcome = SendOutcome::Rejected {
            http_status: Some(400),
            provider_code: Some("BAD receipt-secret-0123456789".into()),
            message: "bad key app-key-abcdef; report URL \
                      'https://sms.example/providers/infobip/status?secret=abc&x=1' \
                      from ACME-SENDER"
                .into(),
        }
        .scrubbed("hello", &secrets);
        let SendOutcome::Rejected {
            provider_code,
            message,
            ..
        } = outcome
        else {
            panic!("{outcome:?}");
        };
        assert_eq!(provider_code.as_deref(), Some("BAD [secret]"));
        assert_eq!(
            message,
            "bad key [secret]; report URL \
             'https://sms.example/providers/infobip/status?[query]' from ACME-SENDER"
        );
        // A URL without a query, at the end, stays whole.
        assert_eq!(
            Secrets::default().scrub("see HTTPS://x.example/a"),
            "see HTTPS://x.example/a"
        );
        assert_eq!(
            format!("{secrets:?}"),
            "Secrets(2 values)",
            "no value in Debug"
        );
    }

    #[test]
    fn error_texts_are_cut_on_a_character_boundary() {
        assert_eq!(cut_error_text("short"), "short");
        let exact = "é".repeat(MAX_ERROR_TEXT);
        assert_eq!(cut_error_text(&exact), exact);
        let long = "é".repeat(MAX_ERROR_TEXT + 1);
        let cut = cut_error_text(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_TEXT + 1);
        assert!(cut.ends_with("é…"));
    }
}
