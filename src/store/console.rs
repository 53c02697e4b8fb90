//! What the support console reads and writes. It is a reader of the store,
//! except for its own sessions and the opt-outs a support person adds or
//! removes.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{MessageRecord, OptOut, StoreError};
use crate::domain::{MessageId, Status};

/// A console session to store (only the hash of the cookie's id).
#[derive(Clone, Debug)]
pub struct NewSession {
    pub id_hash: Vec<u8>,
    pub tenant_id: Uuid,
    /// The hash of the API key signed in with: revoking it ends the session.
    pub key_hash: Vec<u8>,
    pub key_prefix: String,
    pub csrf_token: String,
    pub at: OffsetDateTime,
}

/// A live console session (its key not revoked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    pub tenant_id: Uuid,
    pub key_prefix: String,
    pub csrf_token: String,
    /// When it was signed in: it ends a fixed time later, however busy.
    pub created_at: OffsetDateTime,
    pub last_seen_at: OffsetDateTime,
    /// The signing-in key's scopes (read now: a change holds at once).
    pub scopes: crate::scopes::Scopes,
    /// Signed in with a test-mode key, as its record says (never read
    /// from the key's text).
    pub test: bool,
}

/// One line of a message list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageSummary {
    pub id: MessageId,
    pub idempotency_key: String,
    pub status: Status,
    pub to: String,
    pub provider: String,
    pub attempts: u32,
    pub created_at: OffsetDateTime,
}

/// A tenant's last hours, for the overview page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverviewCounts {
    /// Messages created since the cutoff: (status, provider, count).
    pub by_status_provider: Vec<(String, String, i64)>,
    /// Attempts started since the cutoff per provider: (provider, attempts,
    /// attempts that ended in an error: rejected, retryable, ambiguous, lost).
    pub attempts_by_provider: Vec<(String, i64, i64)>,
    /// Messages `processing` waiting for a retry's due time. (Scheduled
    /// messages, when they land, are counted beside this as
    /// `waiting_scheduled` and shown on the same "Waiting" list.)
    pub waiting_retries: i64,
    /// Messages `processing` now.
    pub processing: i64,
    /// When the oldest message still `processing` was created.
    pub oldest_processing: Option<OffsetDateTime>,
    /// Webhook deliveries `pending` after at least one failed attempt
    /// (waiting for a retry's due time).
    pub waiting_webhooks: i64,
}

/// One webhook delivery of one of a message's events (one endpoint), with
/// its attempts oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageWebhookDelivery {
    pub event_type: String,
    pub event_at: OffsetDateTime,
    pub url: String,
    /// `pending`, `succeeded`, `failed` or `canceled`.
    pub status: String,
    /// When a `pending` delivery's next attempt is due.
    pub next_attempt_at: Option<OffsetDateTime>,
    /// When the delivery last changed (its last attempt, or its cancel).
    pub updated_at: OffsetDateTime,
    pub endpoint_enabled: bool,
    pub endpoint_disabled_reason: Option<String>,
    pub attempts: Vec<MessageWebhookAttempt>,
}

/// One attempt of a [`MessageWebhookDelivery`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageWebhookAttempt {
    pub number: u32,
    /// `succeeded`, `failed` or `gone`.
    pub outcome: String,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub started_at: OffsetDateTime,
    pub finished_at: OffsetDateTime,
}

/// What the simulated provider was handed: one attempt it answered `sent`
/// (the local outbox, `sendonce outbox` and `/console/outbox`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    pub message_id: MessageId,
    /// The attempt's number: with `sent_at` and the message, its place.
    pub attempt: u32,
    pub tenant: String,
    pub idempotency_key: String,
    pub to: String,
    /// The body as stored: a verification's sealed (open it with the
    /// verify secret, as delivery does).
    pub body: String,
    pub provider_message_id: Option<String>,
    /// When the provider answered.
    pub sent_at: OffsetDateTime,
}

impl OutboxEntry {
    /// Where this entry is in the outbox (for reading on after it).
    pub fn cursor(&self) -> OutboxCursor {
        (self.sent_at, self.message_id, self.attempt)
    }
}

/// A place in the outbox: (sent at, message, attempt number).
pub type OutboxCursor = (OffsetDateTime, MessageId, u32);

#[async_trait]
pub trait ConsoleStore: Send + Sync {
    /// Stores a new session and deletes every session last used before
    /// `idle_cutoff`.
    async fn create_session(
        &self,
        s: &NewSession,
        idle_cutoff: OffsetDateTime,
    ) -> Result<(), StoreError>;
    /// The session with this id hash, if its API key is not revoked.
    async fn session(&self, id_hash: &[u8]) -> Result<Option<SessionRecord>, StoreError>;
    /// Records that the session was used at `at`.
    async fn touch_session(&self, id_hash: &[u8], at: OffsetDateTime) -> Result<(), StoreError>;
    /// Ends a session (sign out, or found idle).
    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError>;
    /// A tenant's messages whose provider message id is `provider_message_id`.
    async fn messages_by_provider_id(
        &self,
        tenant_id: Uuid,
        provider_message_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError>;
    /// A tenant's messages to `number`, newest first, created before
    /// `before` (created at, id) when given.
    async fn messages_to(
        &self,
        tenant_id: Uuid,
        number: &str,
        before: Option<(OffsetDateTime, MessageId)>,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError>;
    /// A tenant's message by id (`None` for another tenant's).
    async fn tenant_message(
        &self,
        tenant_id: Uuid,
        id: MessageId,
    ) -> Result<Option<MessageRecord>, StoreError>;
    /// The webhook deliveries of a tenant's message's events (none for
    /// another tenant's message), in event order, then endpoint.
    async fn message_webhook_deliveries(
        &self,
        tenant_id: Uuid,
        id: MessageId,
    ) -> Result<Vec<MessageWebhookDelivery>, StoreError>;
    /// Counts for the overview since `since`.
    async fn overview(
        &self,
        tenant_id: Uuid,
        since: OffsetDateTime,
    ) -> Result<OverviewCounts, StoreError>;
    /// Adds an opt-out from the console, naming who added it; false if the
    /// number was already opted out.
    async fn add_opt_out_by(
        &self,
        tenant_id: Uuid,
        number: &str,
        who: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Opt-outs whose number starts with `prefix`, in number order after
    /// `after`, at most `limit`.
    async fn search_opt_outs(
        &self,
        tenant_id: Uuid,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OptOut>, StoreError>;
    /// A tenant's messages created since `since` whose idempotency key or
    /// one of whose metadata values contains `needle`, any case, newest
    /// first, at most `limit`. A substring scan: bounded by the tenant, the
    /// window and the limit.
    async fn search_messages(
        &self,
        tenant_id: Uuid,
        needle: &str,
        since: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError>;
    /// The tenant's home country (ISO 3166 alpha-2), if set.
    async fn home_country(&self, tenant_id: Uuid) -> Result<Option<String>, StoreError>;
    /// The attempts the `simulated` provider answered `sent` (never another
    /// provider's), of one tenant or of all, oldest first: the `limit`
    /// newest, or with `after` the first `limit` after it.
    async fn outbox(
        &self,
        provider: &str,
        tenant_id: Option<Uuid>,
        after: Option<OutboxCursor>,
        limit: u32,
    ) -> Result<Vec<OutboxEntry>, StoreError>;
}
