//! The records the store reads and writes, shared by both backends.

use std::collections::BTreeMap;
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

mod tenants;

pub use tenants::*;

use crate::domain::message::WaitingFor;
use crate::domain::{
    AttemptOutcome, Encoding, IdempotencyKey, MessageError, MessageId, MessageOut, Recipient,
    Status,
};

/// A message to insert as `processing`, its first attempt started.
#[derive(Clone, Debug)]
pub struct NewMessage {
    pub id: MessageId,
    pub tenant_id: Uuid,
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: Vec<u8>,
    pub to: Recipient,
    pub from: Option<String>,
    pub body: String,
    pub segments: u32,
    pub encoding: Encoding,
    pub metadata: BTreeMap<String, String>,
    pub validity_seconds: Option<i32>,
    pub provider: String,
    /// The route its number took (`SENDONCE_ROUTES`' prefix), if routed.
    pub route: Option<String>,
    /// The providers it takes, in order, when not its route's configured
    /// order (joined by `,`; issue 43): where it started, then its failover.
    pub route_order: Option<String>,
    /// Who its first attempt sends as ([`crate::provider::Provider::sender`]),
    /// recorded with that attempt when the insert starts it.
    pub sender: Option<String>,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub deadline_at: OffsetDateTime,
    /// Its estimated cost, stored with it (`None`: a verification's code).
    pub cost: Option<crate::spend::Charge>,
}

impl NewMessage {
    /// Its cost as the resource shows it.
    pub fn cost_out(&self) -> Option<crate::spend::Cost> {
        self.cost
            .as_ref()
            .map(|c| crate::spend::Cost::new(c.micros, &c.currency))
    }

    /// Its cost's amount and currency as the columns hold them.
    pub fn cost_columns(&self) -> (Option<i64>, Option<&str>) {
        match &self.cost {
            Some(c) => (Some(c.micros), Some(c.currency.as_str())),
            None => (None, None),
        }
    }
}

/// A batch item to insert without a lease: `scheduled` when `due` is later
/// than its creation (a `send_at`, or the end of quiet hours), else
/// `processing` due now with no attempt yet; either way any instance's
/// scheduler starts it when due. `send_at`: what the request asked for.
#[derive(Clone, Debug)]
pub struct Queued {
    pub message: NewMessage,
    pub due: OffsetDateTime,
    pub send_at: Option<OffsetDateTime>,
}

impl Queued {
    pub fn status(&self) -> Status {
        if self.due > self.message.created_at {
            Status::Scheduled
        } else {
            Status::Processing
        }
    }

    /// The row as inserted.
    pub fn record(&self) -> MessageRecord {
        MessageRecord::waiting(&self.message, self.status(), self.due, self.send_at)
    }
}

/// The right to act on a message, held by this instance.
///
/// Its expiry lives only in the row, in the database's clock: every write of
/// the lease (insert, claim, start of an attempt, renewal) sets it to the
/// database's `now()` plus `ttl`, and claims compare it with the database's
/// `now()`. No instance's wall clock takes part, so a skewed instance can
/// neither shorten nor steal another's lease. The holder knows how much is
/// left from its monotonic clock alone ([`Lease::left`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// New for every claim; every finishing write is fenced on it.
    pub token: Uuid,
    /// The instance holding it (for operators and for releasing on shutdown).
    pub owner: String,
    /// How long each write of the lease makes it last, from the database's
    /// `now()` at that write.
    pub ttl: Duration,
    /// A monotonic instant taken before the lease's latest write (so never
    /// later than the database's `now()` of that write).
    pub written: crate::clock::Stamp,
}

impl Lease {
    /// A new lease for `owner`, about to be written.
    pub fn new(owner: &str, ttl: Duration) -> Self {
        Self {
            token: Uuid::new_v4(),
            owner: owner.to_string(),
            ttl,
            written: crate::clock::Stamp::now(),
        }
    }

    /// How long ago the latest write of the lease started.
    pub fn age(&self) -> Duration {
        self.written.elapsed()
    }

    /// A lower bound of how long the lease still holds.
    pub fn left(&self) -> Duration {
        self.ttl.saturating_sub(self.age())
    }
}

/// A lease as the row records it (for reading; expiry in the database's
/// clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    pub token: Uuid,
    pub owner: String,
    pub expires_at: OffsetDateTime,
}

/// A message row.
#[derive(Clone, Debug)]
pub struct MessageRecord {
    pub id: MessageId,
    pub tenant_id: Uuid,
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: Vec<u8>,
    pub status: Status,
    pub to: Recipient,
    pub from: Option<String>,
    pub body: String,
    pub segments: u32,
    pub encoding: Encoding,
    pub metadata: BTreeMap<String, String>,
    pub validity_seconds: Option<i32>,
    pub provider: String,
    /// The route its number took (`SENDONCE_ROUTES`' prefix), if routed.
    pub route: Option<String>,
    /// The providers it takes, in order, when not its route's configured
    /// order (joined by `,`; issue 43): where it started, then its failover.
    pub route_order: Option<String>,
    pub provider_message_id: Option<String>,
    pub attempts: u32,
    /// Some attempt ended without a clear answer: the provider may have sent.
    pub maybe_sent: bool,
    pub error: Option<MessageError>,
    pub response: Option<StoredResponse>,
    pub lease: Option<LeaseState>,
    pub next_attempt_at: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub sent_at: Option<OffsetDateTime>,
    /// When a delivery receipt moved the status to `delivered`/`undelivered`.
    pub delivery_status_at: Option<OffsetDateTime>,
    pub expires_at: Option<OffsetDateTime>,
    pub deadline_at: OffsetDateTime,
    /// The latest attempt started and has no recorded answer: the provider
    /// may or may not have acted on it.
    pub last_attempt_open: bool,
    /// When the latest attempt started.
    pub last_attempt_started_at: Option<OffsetDateTime>,
    /// Who the latest attempt sent as, when that was recorded.
    pub last_attempt_sender: Option<String>,
    /// The recipient is on the tenant's opt-out list (as of reading the row:
    /// the insert for a new message, the claim for a resumed one).
    pub recipient_opted_out: bool,
    /// The time the request asked to send at, if it asked.
    pub send_at: Option<OffsetDateTime>,
    /// Its estimated cost, if it was stored with one.
    pub cost: Option<crate::spend::Cost>,
    /// What its provider's first call handed out for its send (the
    /// Telegram Gateway's `request_id`), reused by every retry
    /// ([`crate::provider::Provider::prepare`]).
    pub prepared_token: Option<String>,
    /// The verification whose code it carries, if any: such a message is
    /// stopped (its `expires_at` moved to now) when the verification moves
    /// on to its next channel or ends, and checked for that in a write
    /// right before each provider call.
    pub verification_id: Option<Uuid>,
}

impl MessageRecord {
    /// The row `insert_message` just created: `processing`, attempt 1
    /// started, the lease held until `lease_expires_at` (the database's clock).
    pub fn claimed(
        m: &NewMessage,
        lease: &Lease,
        lease_expires_at: OffsetDateTime,
        recipient_opted_out: bool,
    ) -> Self {
        MessageRecord {
            id: m.id,
            tenant_id: m.tenant_id,
            idempotency_key: m.idempotency_key.clone(),
            fingerprint: m.fingerprint.clone(),
            status: Status::Processing,
            to: m.to.clone(),
            from: m.from.clone(),
            body: m.body.clone(),
            segments: m.segments,
            encoding: m.encoding,
            metadata: m.metadata.clone(),
            validity_seconds: m.validity_seconds,
            provider: m.provider.clone(),
            route: m.route.clone(),
            route_order: m.route_order.clone(),
            provider_message_id: None,
            attempts: 1,
            maybe_sent: false,
            error: None,
            response: None,
            lease: Some(LeaseState {
                token: lease.token,
                owner: lease.owner.clone(),
                expires_at: lease_expires_at,
            }),
            next_attempt_at: None,
            created_at: m.created_at,
            updated_at: m.created_at,
            sent_at: None,
            delivery_status_at: None,
            expires_at: m.expires_at,
            deadline_at: m.deadline_at,
            last_attempt_open: true,
            last_attempt_started_at: Some(m.created_at),
            last_attempt_sender: m.sender.clone(),
            recipient_opted_out,
            send_at: None,
            cost: m.cost_out(),
            prepared_token: None,
            verification_id: None,
        }
    }

    /// The row `schedule_message` just created: `scheduled` for `due`, no
    /// lease, no attempt.
    pub fn scheduled(m: &NewMessage, due: OffsetDateTime, send_at: Option<OffsetDateTime>) -> Self {
        Self::waiting(m, Status::Scheduled, due, send_at)
    }

    /// A row inserted without a lease or an attempt, due at `due`.
    pub fn waiting(
        m: &NewMessage,
        status: Status,
        due: OffsetDateTime,
        send_at: Option<OffsetDateTime>,
    ) -> Self {
        MessageRecord {
            id: m.id,
            tenant_id: m.tenant_id,
            idempotency_key: m.idempotency_key.clone(),
            fingerprint: m.fingerprint.clone(),
            status,
            to: m.to.clone(),
            from: m.from.clone(),
            body: m.body.clone(),
            segments: m.segments,
            encoding: m.encoding,
            metadata: m.metadata.clone(),
            validity_seconds: m.validity_seconds,
            provider: m.provider.clone(),
            route: m.route.clone(),
            route_order: m.route_order.clone(),
            provider_message_id: None,
            attempts: 0,
            maybe_sent: false,
            error: None,
            response: None,
            lease: None,
            next_attempt_at: Some(due),
            created_at: m.created_at,
            updated_at: m.created_at,
            sent_at: None,
            delivery_status_at: None,
            expires_at: m.expires_at,
            deadline_at: m.deadline_at,
            last_attempt_open: false,
            last_attempt_started_at: None,
            last_attempt_sender: None,
            recipient_opted_out: false,
            send_at,
            cost: m.cost_out(),
            prepared_token: None,
            verification_id: None,
        }
    }

    /// Why a `scheduled` message waits: its `send_at`, or the tenant's
    /// quiet hours in the recipient's time (due later than asked).
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        if self.status != Status::Scheduled {
            return None;
        }
        Some(match (self.send_at, self.next_attempt_at) {
            (Some(asked), Some(due)) if due <= asked => WaitingFor::SendAt,
            _ => WaitingFor::QuietHours,
        })
    }

    /// The 201 frozen with a message a delivery made final: every replay's.
    pub fn final_response(&self) -> StoredResponse {
        let body = self.to_out().to_json();
        StoredResponse {
            status_code: 201,
            body,
        }
    }

    /// The 200 frozen with a message canceled at `now` (by its caller, or
    /// by a verification that no longer needs it): every replay's.
    pub fn canceled_response(&self, now: OffsetDateTime) -> StoredResponse {
        let mut out = self.to_out();
        out.status = Status::Canceled;
        out.updated_at = now;
        out.next_attempt_at = None;
        StoredResponse {
            status_code: 200,
            body: out.to_json(),
        }
    }

    /// The resource as the API shows it now.
    pub fn to_out(&self) -> MessageOut {
        MessageOut {
            id: self.id.to_string(),
            idempotency_key: self.idempotency_key.to_string(),
            status: self.status,
            to: self.to.to_string(),
            from: self.from.clone(),
            // A verification's SMS is stored sealed: its masked text.
            body: crate::domain::sealed::shown_body(&self.body).into_owned(),
            segments: self.segments,
            encoding: self.encoding,
            metadata: self.metadata.clone(),
            provider: self.provider.clone(),
            route: self.route.clone(),
            provider_message_id: self.provider_message_id.clone(),
            attempts: self.attempts,
            error: self.error.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            sent_at: self.sent_at,
            delivery_status_at: self.delivery_status_at,
            next_attempt_at: self.next_attempt_at,
            send_at: self.send_at,
            waiting_for: self.waiting_for(),
            cost: self.cost.clone(),
        }
    }
}

/// A frozen final response: replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub status_code: u16,
    pub body: Vec<u8>,
}

/// What a replay or a waiting duplicate needs: one narrow indexed read.
#[derive(Clone, Debug)]
pub struct KeyState {
    pub id: MessageId,
    pub fingerprint: Vec<u8>,
    pub status: Status,
    pub response: Option<StoredResponse>,
}

/// The result of inserting a message under its key.
#[derive(Debug)]
pub enum Claim {
    /// The key was free: this request owns the message (lease included).
    Created(Box<MessageRecord>),
    /// The key is taken: the existing message's state.
    Existing(KeyState),
}

/// How an attempt ended, as recorded in its row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptResult {
    pub number: u32,
    pub outcome: AttemptOutcome,
    pub http_status: Option<u16>,
    pub provider_code: Option<String>,
    pub error: Option<String>,
    pub provider_message_id: Option<String>,
    pub finished_at: OffsetDateTime,
}

/// A fenced write that makes a message final.
#[derive(Clone, Debug)]
pub struct Finish {
    pub id: MessageId,
    pub lease_token: Uuid,
    pub status: Status,
    pub provider_message_id: Option<String>,
    pub error: Option<MessageError>,
    pub sent_at: Option<OffsetDateTime>,
    pub updated_at: OffsetDateTime,
    pub response: StoredResponse,
    /// The attempt this closes, if one is open.
    pub attempt: Option<AttemptResult>,
    /// An address to add to the tenant's opt-outs with this write (source
    /// `provider`): a Telegram chat whose user blocked the bot, recorded in
    /// the same transaction as the refusal that says so.
    pub opt_out: Option<String>,
}

/// A fenced write that records an attempt and waits for the next one without
/// holding a lease.
#[derive(Clone, Debug)]
pub struct Reschedule {
    pub id: MessageId,
    pub lease_token: Uuid,
    pub next_attempt_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub error: Option<MessageError>,
    /// The attempt this closes; `None` leaves it open (its outcome is not
    /// known yet: the next owner asks the provider again before anything
    /// else) and marks the message as maybe sent.
    pub attempt: Option<AttemptResult>,
}

/// One row of a message's attempt history.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttemptRow {
    pub number: u32,
    /// The instance (host, pid) that made the attempt: for operators and
    /// logs, never shown to tenants.
    #[serde(skip_serializing)]
    pub lease_owner: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    pub outcome: Option<String>,
    pub http_status: Option<u16>,
    pub provider_code: Option<String>,
    pub error: Option<String>,
    pub provider_message_id: Option<String>,
    /// The provider the attempt was made with.
    pub provider: String,
}

/// A delivery receipt as received, to record under its event identity.
#[derive(Clone, Debug)]
pub struct NewReceipt {
    /// The endpoint that received it: `twilio` or `http` (the provider name
    /// stored on messages, which is how a receipt finds its message).
    pub provider: String,
    /// The identity of this event: a second receipt with the same one is a
    /// duplicate and changes nothing. Built from what the provider
    /// authenticated (see `http::receipts::receipt_identity`).
    pub event_id: String,
    pub provider_message_id: String,
    /// Our id of the message, when the provider echoes it and it was
    /// authenticated with the receipt (Vonage's `client-ref`): the receipt is
    /// matched by it when its provider message id matches no message (a
    /// later part of a concatenated message, each part with its own id).
    pub message_id: Option<MessageId>,
    /// The status as the provider spelled it.
    pub provider_status: String,
    /// What it means for us: `Sent`, `Delivered`, `Undelivered`, or `None`.
    pub status: Option<Status>,
    pub error_code: Option<String>,
    pub received_at: OffsetDateTime,
}

/// What recording a receipt did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptOutcome {
    /// Already recorded under the same event identity: nothing changed.
    pub duplicate: bool,
    /// The message it belongs to, if one is known.
    pub message_id: Option<MessageId>,
    /// The message's status moved forward because of it.
    pub applied: bool,
}

/// A recorded receipt.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReceiptRow {
    /// Arrival order.
    #[serde(skip)]
    pub seq: i64,
    pub provider: String,
    pub event_id: String,
    pub provider_message_id: String,
    pub message_id: Option<String>,
    pub provider_status: String,
    pub status: Option<Status>,
    pub error_code: Option<String>,
    pub applied: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
}
