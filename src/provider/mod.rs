//! SMS providers behind one trait, and how their answers are classified.
//!
//! Every outcome of a provider call falls in exactly one class, and the class
//! alone decides what delivery does next:
//!
//! | class       | meaning                                   | next step                         |
//! |-------------|-------------------------------------------|-----------------------------------|
//! | `Accepted`  | the provider took the message             | `sent`                            |
//! | `Rejected`  | a permanent refusal (4xx but 408/425/429) | `failed`, no retry                |
//! | `Retryable` | the provider certainly did not act        | retry with backoff / Retry-After  |
//! | `Ambiguous` | it may have acted (timeout after sending, | retry only through a provider     |
//! |             | 5xx, connection reset mid-response)       | that de-duplicates on our key;    |
//! |             |                                           | otherwise reconcile or `unknown`  |

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::domain::MessageId;

pub mod http;
pub mod simulated;
pub mod twilio;

pub use http::HttpProvider;
pub use simulated::SimulatedProvider;
pub use twilio::{TwilioProvider, TwilioSettings};

/// One SMS as handed to a provider.
#[derive(Clone, Debug)]
pub struct OutgoingSms {
    /// Our message id: passed as the provider-side idempotency key, the same
    /// on every attempt of one message.
    pub message_id: MessageId,
    pub to: String,
    pub from: Option<String>,
    pub body: String,
    /// What is left of the message's validity period, if it has one.
    pub validity: Option<Duration>,
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
    /// `retryable` or `ambiguous`.
    pub fn class(&self) -> &'static str {
        match self {
            SendOutcome::Accepted { .. } => "ok",
            SendOutcome::Rejected { .. } => "permanent",
            SendOutcome::Retryable { .. } => "retryable",
            SendOutcome::Ambiguous { .. } => "ambiguous",
        }
    }
}

/// What a provider says about a send whose outcome we did not see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconciled {
    /// It has the message: it was sent once, under this id.
    Sent { provider_message_id: String },
    /// It certainly has no such message: sending again is safe.
    NotSent,
    /// Nobody can tell.
    Unknown(String),
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The name stored with each message (`simulated`, `http`, ...).
    fn name(&self) -> &'static str;

    /// Whether the provider de-duplicates on the idempotency key we pass it,
    /// so that resending after an ambiguous outcome cannot send twice.
    fn dedupes_by_key(&self) -> bool;

    /// Makes one attempt. Never panics; every failure is classified.
    async fn send(&self, sms: &OutgoingSms) -> SendOutcome;

    /// Asks the provider whether `sms` was sent since `since`. Providers that
    /// cannot be asked say `Unknown`.
    async fn reconcile(&self, _sms: &OutgoingSms, _since: OffsetDateTime) -> Reconciled {
        Reconciled::Unknown(format!(
            "the {} provider cannot be asked whether it sent the message",
            self.name()
        ))
    }
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
}
