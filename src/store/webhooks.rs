//! Webhook endpoints, the events outbox/feed and deliveries: the records and
//! the store interface. The outbox rows themselves are written by the
//! statements that change a message's status (`finish`, receipts), in their
//! transaction; see docs/architecture.md, "Webhooks and the events feed".

use ::time::OffsetDateTime;
use async_trait::async_trait;
use uuid::Uuid;

use super::StoreError;
use super::time::DbTime;

/// A webhook endpoint as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub url: String,
    /// Subscribed event types; `None`: all.
    pub events: Option<Vec<String>>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub secret: String,
    /// The secret before the last rotation, still signing until
    /// `previous_secret_expires_at`.
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

impl WebhookEndpoint {
    /// The secrets that sign a delivery made at `now`: the current one and,
    /// for 24 h after a rotation, the previous one.
    pub fn signing_secrets(&self, now: OffsetDateTime) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let (Some(old), Some(until)) = (&self.previous_secret, self.previous_secret_expires_at)
            && until > now
        {
            secrets.push(old.as_str());
        }
        secrets
    }
}

/// A new endpoint.
#[derive(Clone, Debug)]
pub struct NewWebhookEndpoint {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub url: String,
    pub events: Option<Vec<String>>,
    pub secret: String,
    pub created_at: OffsetDateTime,
}

/// A position in a tenant's feed: (transaction id, sequence number). On
/// SQLite the transaction id is always 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventCursor {
    pub txid: i64,
    pub seq: i64,
}

impl EventCursor {
    /// The position as bytes (sealed into the API's opaque cursor).
    pub fn to_bytes(self) -> Vec<u8> {
        [self.txid.to_be_bytes(), self.seq.to_be_bytes()].concat()
    }

    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let (txid, seq) = (b.get(..8)?, b.get(8..)?);
        Some(Self {
            txid: i64::from_be_bytes(txid.try_into().ok()?),
            seq: i64::from_be_bytes(seq.try_into().ok()?),
        })
    }

    /// The text form (`txid-seq`; kept in tests and tools, never answered).
    pub fn encode(&self) -> String {
        format!("{}-{}", self.txid, self.seq)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let (txid, seq) = s.split_once('-')?;
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 19 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(txid) || !digits(seq) {
            return None;
        }
        Some(Self {
            txid: txid.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

/// One event of the outbox/feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookEvent {
    pub id: Uuid,
    pub cursor: EventCursor,
    pub tenant_id: Uuid,
    pub event_type: String,
    /// The resource as it was when the event happened (JSON bytes).
    pub data: Vec<u8>,
    pub created_at: OffsetDateTime,
}

impl WebhookEvent {
    /// `evt_` + the id: the `webhook-id` of every delivery of this event.
    pub fn public_id(&self) -> String {
        format!("evt_{}", self.id.simple())
    }

    /// The delivered body: `{"type", "timestamp", "data"}`.
    pub fn body(&self) -> Vec<u8> {
        let data: serde_json::Value =
            serde_json::from_slice(&self.data).unwrap_or(serde_json::Value::Null);
        let body = serde_json::json!({
            "type": self.event_type,
            "timestamp": crate::store::webhooks::rfc3339(self.created_at),
            "data": data,
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The event as the feed shows it: the body plus its id and `cursor`
    /// (the opaque text the API makes of [`WebhookEvent::cursor`]).
    pub fn to_feed_json(&self, cursor: &str) -> serde_json::Value {
        let data: serde_json::Value =
            serde_json::from_slice(&self.data).unwrap_or(serde_json::Value::Null);
        serde_json::json!({
            "id": self.public_id(),
            "type": self.event_type,
            "timestamp": rfc3339(self.created_at),
            "cursor": cursor,
            "data": data,
        })
    }
}

/// The event a verification's move out of `pending` makes: its type
/// (`verification.<status>`) and data (the verification's state, as the
/// resource shows it, without its messages).
pub fn verification_event(rec: &super::VerificationRecord) -> (String, Vec<u8>) {
    let data = serde_json::json!({
        "id": format!("ver_{}", rec.id.simple()),
        "status": rec.status.as_str(),
        "to": rec.to,
        "created_at": rfc3339(rec.created_at),
        "expires_at": rfc3339(rec.expires_at),
        "approved_at": rec.approved_at.map(rfc3339),
        "sends": rec.sends,
        "checks_remaining": rec.checks_remaining,
    });
    (
        format!("verification.{}", rec.status.as_str()),
        serde_json::to_vec(&data).unwrap_or_default(),
    )
}

/// RFC 3339 text of a time (UTC).
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&::time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A delivery claimed under a lease.
#[derive(Clone, Debug)]
pub struct ClaimedDelivery {
    pub id: i64,
    pub lease_token: Uuid,
    /// Attempts made before this one.
    pub attempts: u32,
    pub event: WebhookEvent,
    pub endpoint: WebhookEndpoint,
}

/// How a delivery continues after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryNext {
    Succeeded,
    RetryAt(OffsetDateTime),
    /// The schedule is over: `failed`.
    GaveUp,
    /// `410 Gone`: `failed`, and the endpoint is disabled with this reason
    /// (its other pending deliveries are canceled).
    Disable(String),
}

/// One finished attempt, written fenced on the lease.
#[derive(Clone, Debug)]
pub struct DeliveryAttempt {
    pub delivery_id: i64,
    pub lease_token: Uuid,
    pub endpoint_id: Uuid,
    pub event_id: Uuid,
    pub event_type: String,
    pub started_at: OffsetDateTime,
    pub finished_at: OffsetDateTime,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub next: DeliveryNext,
}

impl DeliveryAttempt {
    /// `succeeded`, `failed` (a retry follows or the schedule is over) or
    /// `gone` (410).
    pub fn outcome(&self) -> &'static str {
        match self.next {
            DeliveryNext::Succeeded => "succeeded",
            DeliveryNext::Disable(_) => "gone",
            DeliveryNext::RetryAt(_) | DeliveryNext::GaveUp => "failed",
        }
    }

    /// The delivery's status after this attempt.
    pub fn delivery_status(&self) -> &'static str {
        match self.next {
            DeliveryNext::Succeeded => "succeeded",
            DeliveryNext::RetryAt(_) => "pending",
            DeliveryNext::GaveUp | DeliveryNext::Disable(_) => "failed",
        }
    }
}

/// A recorded attempt, as `GET /webhook-endpoints/{id}/attempts` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WebhookAttemptRow {
    #[serde(skip)]
    pub id: i64,
    #[serde(rename = "event_id")]
    pub event_public_id: String,
    pub event_type: String,
    /// The attempt's number within its delivery (1-based).
    pub number: u32,
    /// `succeeded`, `failed` or `gone`.
    pub outcome: String,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    #[serde(with = "::time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "::time::serde::rfc3339")]
    pub finished_at: OffsetDateTime,
}

/// Most webhook deliveries in flight at once (leased, the lease live),
/// counted in the database over every instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightCaps {
    pub per_endpoint: u32,
    pub per_tenant: u32,
}

/// Webhook endpoints, the events feed and deliveries.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Creates the endpoint unless its tenant has `most` already (`None`):
    /// the count and the insert are one transaction holding the tenant's
    /// row, so concurrent creates never pass the cap.
    async fn create_webhook_endpoint(
        &self,
        e: &NewWebhookEndpoint,
        most: u32,
    ) -> Result<Option<WebhookEndpoint>, StoreError>;
    /// A tenant's endpoints, oldest first.
    async fn webhook_endpoints(&self, tenant_id: Uuid) -> Result<Vec<WebhookEndpoint>, StoreError>;
    async fn webhook_endpoint(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<WebhookEndpoint>, StoreError>;
    /// Deletes an endpoint with its deliveries and attempts; false if the
    /// tenant has no such endpoint.
    async fn delete_webhook_endpoint(&self, tenant_id: Uuid, id: Uuid) -> Result<bool, StoreError>;
    /// Makes `secret` the endpoint's secret; the current one keeps signing
    /// until `old_until`. `None` if the tenant has no such endpoint.
    async fn rotate_webhook_secret(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        secret: &str,
        old_until: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Result<Option<WebhookEndpoint>, StoreError>;
    /// Whether any enabled endpoint exists (an idle instance's dispatcher
    /// asks this now and then instead of claiming every second).
    async fn any_webhook_endpoints(&self) -> Result<bool, StoreError>;
    /// Up to `limit` of a tenant's events after `after`, in feed order.
    async fn webhook_events_after(
        &self,
        tenant_id: Uuid,
        after: Option<EventCursor>,
        limit: u32,
    ) -> Result<Vec<WebhookEvent>, StoreError>;
    /// Claims up to `limit` pending deliveries that are due (`now`, the
    /// caller's clock) and not leased, or whose lease expired (the
    /// database's clock), leasing each for `ttl` in the database's clock;
    /// oldest due first, but never past `caps`: deliveries in flight (a
    /// live lease, on any instance) count against their endpoint's and
    /// tenant's caps, so a slow endpoint holds only its own slots.
    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: OffsetDateTime,
        ttl: std::time::Duration,
        limit: u32,
        caps: InFlightCaps,
    ) -> Result<Vec<ClaimedDelivery>, StoreError>;
    /// Records an attempt and moves its delivery on (fenced on the lease);
    /// false when the lease was no longer ours (nothing is written).
    async fn finish_webhook_attempt(&self, a: &DeliveryAttempt) -> Result<bool, StoreError>;
    /// Up to `limit` attempts of a tenant's endpoint older than the attempt
    /// `before` (its id; `None`: from the newest), newest first.
    async fn webhook_attempts(
        &self,
        tenant_id: Uuid,
        endpoint_id: Uuid,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<WebhookAttemptRow>, StoreError>;
    /// Deletes up to `batch` events created before `cutoff` (retention),
    /// with their deliveries and attempts.
    async fn purge_webhook_events(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError>;
}

// ------------------------------------------------------------------ rows

/// The columns of an endpoint row, prefixed `w.`.
macro_rules! endpoint_columns {
    () => {
        "w.id AS w_id, w.tenant_id AS w_tenant_id, w.url AS w_url, w.events AS w_events, \
         w.enabled AS w_enabled, w.disabled_reason AS w_disabled_reason, w.secret AS w_secret, \
         w.previous_secret AS w_previous_secret, \
         w.previous_secret_expires_at AS w_previous_secret_expires_at, \
         w.created_at AS w_created_at, w.updated_at AS w_updated_at"
    };
}
pub(crate) use endpoint_columns;

/// The columns of an event row, prefixed `e.`.
macro_rules! event_columns {
    () => {
        "e.id AS e_id, e.txid AS e_txid, e.seq AS e_seq, e.tenant_id AS e_tenant_id, \
         e.type AS e_type, e.data AS e_data, e.created_at AS e_created_at"
    };
}
pub(crate) use event_columns;

#[derive(sqlx::FromRow)]
pub(crate) struct EndpointRow {
    w_id: Uuid,
    w_tenant_id: Uuid,
    w_url: String,
    w_events: Option<String>,
    w_enabled: bool,
    w_disabled_reason: Option<String>,
    w_secret: String,
    w_previous_secret: Option<String>,
    w_previous_secret_expires_at: Option<DbTime>,
    w_created_at: DbTime,
    w_updated_at: DbTime,
}

impl From<EndpointRow> for WebhookEndpoint {
    fn from(r: EndpointRow) -> Self {
        Self {
            id: r.w_id,
            tenant_id: r.w_tenant_id,
            url: r.w_url,
            events: r
                .w_events
                .and_then(|e| serde_json::from_str::<Vec<String>>(&e).ok()),
            enabled: r.w_enabled,
            disabled_reason: r.w_disabled_reason,
            secret: r.w_secret,
            previous_secret: r.w_previous_secret,
            previous_secret_expires_at: r.w_previous_secret_expires_at.map(|t| t.0),
            created_at: r.w_created_at.0,
            updated_at: r.w_updated_at.0,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct EventRow {
    e_id: Uuid,
    e_txid: i64,
    e_seq: i64,
    e_tenant_id: Uuid,
    e_type: String,
    e_data: Vec<u8>,
    e_created_at: DbTime,
}

impl From<EventRow> for WebhookEvent {
    fn from(r: EventRow) -> Self {
        Self {
            id: r.e_id,
            cursor: EventCursor {
                txid: r.e_txid,
                seq: r.e_seq,
            },
            tenant_id: r.e_tenant_id,
            event_type: r.e_type,
            data: r.e_data,
            created_at: r.e_created_at.0,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    d_id: i64,
    d_lease_token: Uuid,
    d_attempts: i32,
    #[sqlx(flatten)]
    event: EventRow,
    #[sqlx(flatten)]
    endpoint: EndpointRow,
}

impl From<ClaimedRow> for ClaimedDelivery {
    fn from(r: ClaimedRow) -> Self {
        Self {
            id: r.d_id,
            lease_token: r.d_lease_token,
            attempts: u32::try_from(r.d_attempts).unwrap_or(0),
            event: r.event.into(),
            endpoint: r.endpoint.into(),
        }
    }
}

/// The claimed-delivery columns (`d`, `e`, `w`).
macro_rules! claimed_columns {
    () => {
        concat!(
            "d.id AS d_id, d.lease_token AS d_lease_token, d.attempts AS d_attempts, ",
            crate::store::webhooks::event_columns!(),
            ", ",
            crate::store::webhooks::endpoint_columns!()
        )
    };
}
pub(crate) use claimed_columns;

#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRowDb {
    id: i64,
    event_id: Uuid,
    event_type: String,
    number: i32,
    outcome: String,
    http_status: Option<i32>,
    error: Option<String>,
    response_excerpt: Option<String>,
    started_at: DbTime,
    finished_at: DbTime,
}

impl From<AttemptRowDb> for WebhookAttemptRow {
    fn from(r: AttemptRowDb) -> Self {
        Self {
            id: r.id,
            event_public_id: format!("evt_{}", r.event_id.simple()),
            event_type: r.event_type,
            number: u32::try_from(r.number).unwrap_or(0),
            outcome: r.outcome,
            http_status: r.http_status.and_then(|s| u16::try_from(s).ok()),
            error: r.error,
            response_excerpt: r.response_excerpt,
            started_at: r.started_at.0,
            finished_at: r.finished_at.0,
        }
    }
}

/// The `events` column of an endpoint.
pub(crate) fn events_column(events: &Option<Vec<String>>) -> Option<String> {
    events.as_ref().and_then(|e| serde_json::to_string(e).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_junk() {
        let c = EventCursor { txid: 741, seq: 9 };
        assert_eq!(EventCursor::decode(&c.encode()), Some(c));
        assert_eq!(EventCursor::from_bytes(&c.to_bytes()), Some(c));
        assert_eq!(EventCursor::from_bytes(&[1, 2, 3]), None);
        for junk in [
            "",
            "1",
            "-1",
            "1-",
            "a-1",
            "1-b",
            "1--2",
            "+1-2",
            "99999999999999999999-1",
        ] {
            assert_eq!(EventCursor::decode(junk), None, "{junk}");
        }
    }
}
