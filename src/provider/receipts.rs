//! What an adapter's receipt endpoint does: authenticate a request and read
//! the receipt out of it. Storing it, de-duplicating it and moving the
//! message on are the service's (`src/http/receipts.rs`), the same for
//! every adapter.

use axum::http::{HeaderMap, Method};

use crate::domain::{FieldError, Status};

/// A receipt request as it arrived.
pub struct ReceiptRequest<'a> {
    /// `POST`, or `GET` on a route that takes it (`Receipts::get`): then
    /// the receipt is the query string and the body is empty.
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The path and query the provider called (what a signature covers).
    pub path_and_query: &'a str,
    /// `SENDONCE_PUBLIC_URL`, without a trailing slash: the address the
    /// provider was given, and signs.
    pub public_url: Option<&'a str>,
    /// When it arrived, by the service's clock (what a signed timestamp is
    /// judged against).
    pub now: time::OffsetDateTime,
}

/// A receipt, authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The provider's id of the message it is about.
    pub provider_message_id: String,
    /// The provider's word for the status.
    pub status: String,
    pub error_code: Option<String>,
    /// Our id of the message, when the provider echoes it in the receipt
    /// and the receipt's authentication covers it (Vonage's `client-ref`).
    pub message_id: Option<crate::domain::MessageId>,
}

impl Receipt {
    /// This receipt as it is stored and shown (issue 41): its error code
    /// and status word without any configured secret, URL query or run of
    /// four or more digits, and without `body` (the message's text, when
    /// it is known) ([`scrub_receipt_text`]). Its ids stay as they are: they
    /// are what it is matched by. What its status means is read from the
    /// status word before.
    pub fn scrubbed(self, body: Option<&str>, secrets: &super::Secrets) -> Receipt {
        Receipt {
            status: scrub_receipt_text(&self.status, body, secrets),
            error_code: self
                .error_code
                .map(|c| scrub_receipt_text(&c, body, secrets)),
            ..self
        }
    }
}

/// A provider's text from a receipt (its error code, its status word) as
/// it may be stored and shown: without the message's text `body` when it
/// is known and the runs of four or more digits in it (as a send's answer,
/// [`super::scrub`]), without any configured secret and with every URL's
/// query as `[query]` ([`super::Secrets::scrub`]), and then without any run
/// of four or more digits at all, the message's text being unknown to a
/// receipt that came before its send was recorded: a provider quoting the
/// SMS must not leak a code. A bare number of at most five digits is a
/// provider's error code (Twilio's `30003`) and is kept whole.
pub fn scrub_receipt_text(text: &str, body: Option<&str>, secrets: &super::Secrets) -> String {
    if is_bare_code(text) {
        return text.to_string();
    }
    let text = match body {
        Some(body) => super::scrub(text, body),
        None => text.to_string(),
    };
    without_digit_runs(&secrets.scrub(&text))
}

/// Whether `text` is a provider's numeric error code: a bare number of at
/// most five digits (nothing to scrub in it).
pub fn is_bare_code(text: &str) -> bool {
    (1..=5).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// `text` with every run of four or more ASCII digits as `[digits]`.
fn without_digit_runs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 4 {
            out.push_str("[digits]");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Why a receipt request was refused; nothing was recorded.
#[derive(Debug, PartialEq, Eq)]
pub enum ReceiptError {
    /// Not authenticated (403).
    Forbidden,
    /// The body is not of the type the endpoint reads (415).
    UnsupportedMediaType,
    /// The body is not JSON (400).
    MalformedJson,
    /// Fields missing or wrong (422).
    Invalid(Vec<FieldError>),
}

impl ReceiptError {
    /// One wrong field.
    pub fn field(field: &str, message: &str) -> Self {
        ReceiptError::Invalid(vec![FieldError {
            field: field.to_string(),
            message: message.to_string(),
        }])
    }
}

/// One adapter's receipt endpoint, with its secrets.
pub trait ReceiptRoute: std::fmt::Debug + Send + Sync + 'static {
    /// What can be checked before the body is read (a shared secret in a
    /// header): a forged request is then refused without reading it.
    fn admit(&self, _req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        Ok(())
    }

    /// A subscription handshake the provider makes with `GET` on the
    /// receipt path (Meta's `hub.challenge`), on a route that takes `GET`
    /// (`Receipts::get`): `Some(Ok(text))` is answered 200 with `text` as a
    /// `text/plain` body, `Some(Err(_))` is refused, and nothing is
    /// recorded either way. `None` (the default): not a handshake; the
    /// `GET` carries a receipt in its query string ([`ReceiptRoute::read`]).
    fn handshake(&self, _req: &ReceiptRequest<'_>) -> Option<Result<String, ReceiptError>> {
        None
    }

    /// Authenticates the request with its body and reads the receipt.
    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError>;

    /// Authenticates the request with its body and reads every receipt in
    /// it, in order: a provider that batches reports (Infobip's `results[]`)
    /// says so here; the others carry one ([`ReceiptRoute::read`]). All are
    /// read before any is recorded, so a request is taken or refused whole.
    fn read_all(
        &self,
        req: &ReceiptRequest<'_>,
        body: &[u8],
    ) -> Result<Vec<Receipt>, ReceiptError> {
        self.read(req, body).map(|r| vec![r])
    }

    /// What an operator should hear at start about this endpoint's
    /// settings, though they are allowed (a published demo secret).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// What the provider's status word means for the message ([`delivery_status`]
    /// unless the provider has words of its own).
    fn delivery_status(&self, status: &str) -> Option<Status> {
        delivery_status(status)
    }
}

/// Longest provider id, event id or status accepted in a receipt.
pub const MAX_ID_LEN: usize = 255;
pub const MAX_STATUS_LEN: usize = 64;

/// What a provider's status word means for us (the words of Twilio and of
/// the `http` protocol). `None`: not a status we track
/// (recorded in the history, changes nothing).
pub fn delivery_status(provider_status: &str) -> Option<Status> {
    match provider_status.to_ascii_lowercase().as_str() {
        "accepted" | "scheduled" | "queued" | "sending" | "sent" => Some(Status::Sent),
        "delivered" | "read" => Some(Status::Delivered),
        // Twilio's `failed` after it accepted a message means it could not
        // be sent on: for us that is a message not delivered.
        "undelivered" | "failed" | "canceled" => Some(Status::Undelivered),
        _ => None,
    }
}

/// Where an adapter whose receipts do not come over HTTP hands them: the
/// service stores, de-duplicates and matches them as it does the HTTP
/// ones (`src/http/receipts.rs`), and a receipt for no known message is
/// kept as unmatched.
#[async_trait::async_trait]
pub trait ReceiptSink: Send + Sync + 'static {
    /// Records `receipt` of `provider`, whose status word means `status`.
    /// `Err`: it could not be stored (the caller may have it sent again).
    async fn take(
        &self,
        provider: &'static str,
        receipt: Receipt,
        status: Option<Status>,
    ) -> Result<(), String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Secrets;

    /// A receipt's texts as they are stored: (text, the message's body if
    /// known) → what is kept.
    #[test]
    fn receipt_texts_lose_secrets_codes_and_the_message() {
        let secrets = Secrets::new([
            "receipt-secret-0123456789".to_string(),
            "provider-token".to_string(),
        ]);
        let rows: [(&str, Option<&str>, &str); 12] = [
            // Providers' own codes and words stay.
            ("30003", None, "30003"),
            ("6", None, "6"),
            ("000", None, "000"),
            ("EC_ABSENT_SUBSCRIBER", None, "EC_ABSENT_SUBSCRIBER"),
            ("DELIVERED", Some("Code 482913"), "DELIVERED"),
            ("err 123", None, "err 123"),
            // A longer number, or digits in a text: a code may be quoted.
            ("482913", None, "[digits]"),
            ("bad: 482913", None, "bad: [digits]"),
            ("EC_1234", None, "EC_[digits]"),
            // The message's text, when known, goes whole.
            (
                "refused: Code 482913, tap",
                Some("Code 482913, tap"),
                "refused: [message text]",
            ),
            // Configured secrets and URL queries.
            (
                "receipt-secret-0123456789/provider-token",
                None,
                "[secret]/[secret]",
            ),
            (
                "see https://x.example/cb?s=abc&t=1 now",
                None,
                "see https://x.example/cb?[query] now",
            ),
        ];
        for (text, body, want) in rows {
            assert_eq!(scrub_receipt_text(text, body, &secrets), want, "{text}");
        }
    }

    #[test]
    fn a_receipt_keeps_its_ids() {
        let r = Receipt {
            provider_message_id: "id-123456".into(),
            status: "undelivered".into(),
            error_code: Some("code 123456".into()),
            message_id: None,
        };
        let s = r.clone().scrubbed(None, &Secrets::default());
        assert_eq!(s.provider_message_id, r.provider_message_id);
        assert_eq!(s.status, "undelivered");
        assert_eq!(s.error_code.as_deref(), Some("code [digits]"));
    }
}
