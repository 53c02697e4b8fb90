//! The message resource and its states.
//!
//! ```text
//!              insert (unique (tenant, key))
//!                         |
//!                         v
//!   +------------------ processing ------------------+
//!   | provider accepted   |  rejected / expired /    | ambiguous and nobody
//!   v                     |  retries exhausted       | can tell (reconcile failed)
//!  sent ---receipt--->    v                          v
//!   |   delivered       failed                    unknown
//!   +--receipt--> undelivered
//! ```
//! A request with a future `send_at` is inserted `scheduled` instead (no
//! lease, no attempt); any instance's scheduler claims it when due, making it
//! `processing`. `POST /messages/{key}/cancel` makes a `scheduled` message,
//! or one waiting for a retry with no attempt in flight, `canceled` (final).
//!
//! `sent`, `failed`, `unknown` and `canceled` are final for idempotency: the response
//! stored with them is what every replay gets. Receipts may later move `sent`
//! forward to `delivered` or `undelivered` (visible in GET, never in a replay).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use super::segments::Encoding;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for its `send_at` (or the end of a quiet window): no lease,
    /// no attempt yet; cancelable.
    Scheduled,
    Processing,
    Sent,
    Failed,
    Unknown,
    Delivered,
    Undelivered,
    /// Canceled before any attempt could reach the provider: final.
    Canceled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Scheduled => "scheduled",
            Status::Processing => "processing",
            Status::Sent => "sent",
            Status::Failed => "failed",
            Status::Unknown => "unknown",
            Status::Delivered => "delivered",
            Status::Undelivered => "undelivered",
            Status::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "scheduled" => Status::Scheduled,
            "processing" => Status::Processing,
            "sent" => Status::Sent,
            "failed" => Status::Failed,
            "unknown" => Status::Unknown,
            "delivered" => Status::Delivered,
            "undelivered" => Status::Undelivered,
            "canceled" => Status::Canceled,
            _ => return None,
        })
    }

    /// Final for idempotency: the stored response will never change.
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Processing | Status::Scheduled)
    }
}

/// A message id: a UUIDv7 (time-ordered, so the primary key index stays
/// append-mostly), shown as `msg_<uuid>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageId(pub Uuid);

impl MessageId {
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "msg_{}", self.0.as_simple())
    }
}

/// Why a message failed or ended unknown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageError {
    /// Our code: `provider_rejected`, `retries_exhausted`, `validity_expired`,
    /// `outcome_unknown`; `delivery_failed` when a receipt says `undelivered`.
    pub code: String,
    pub message: String,
    /// The provider's own error code, when it gave one.
    pub provider_code: Option<String>,
}

/// The message resource as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessageOut {
    pub id: String,
    pub idempotency_key: String,
    pub status: Status,
    pub to: String,
    pub from: Option<String>,
    pub body: String,
    pub segments: u32,
    pub encoding: Encoding,
    pub metadata: BTreeMap<String, String>,
    pub provider: String,
    /// The `SENDONCE_ROUTES` prefix its number took; absent when the
    /// service does not route by destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    pub provider_message_id: Option<String>,
    pub attempts: u32,
    pub error: Option<MessageError>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub sent_at: Option<OffsetDateTime>,
    /// When a delivery receipt moved the status to `delivered`/`undelivered`.
    #[serde(with = "time::serde::rfc3339::option")]
    pub delivery_status_at: Option<OffsetDateTime>,
    /// When the next attempt is due, while a retry waits; when a
    /// `scheduled` message starts.
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// The time the request asked to send at (`send_at`), if it asked.
    #[serde(with = "time::serde::rfc3339::option")]
    pub send_at: Option<OffsetDateTime>,
    /// Why a `scheduled` message waits (`null` otherwise).
    pub waiting_for: Option<WaitingFor>,
    /// Its estimated cost (segments × the price of `SENDONCE_PRICES`);
    /// absent for messages stored before costs were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::spend::Cost>,
}

/// Why a `scheduled` message waits until `next_attempt_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    /// The request's `send_at`.
    SendAt,
    /// The tenant's quiet hours in the recipient's local time.
    QuietHours,
}

impl MessageOut {
    /// The JSON bytes of this resource.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain strings, numbers and maps cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}
