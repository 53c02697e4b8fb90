//! Storage: one interface, split by what it stores, and two drivers
//! (`postgres/`, `sqlite/`). What both run alike is written once in
//! `shared/` and expanded per backend; each driver keeps what is its own
//! (locks, the single SQLite writer, Postgres' coalesced lanes, the tuned
//! message paths).
//!
//! Every method is a single short statement or transaction; none holds a
//! transaction open across a provider call. Writes that finish or reschedule a
//! message are fenced on the lease token: they change nothing, and say so,
//! when the caller no longer owns the message.
//!
//! Shared by both backends: the records ([`types`]), the rows and their
//! column lists ([`row`]), the time column ([`time::DbTime`]) and the mapping
//! of driver errors ([`error`]).

use ::time::OffsetDateTime;
use async_trait::async_trait;
use uuid::Uuid;

use crate::domain::{MessageError, MessageId};

pub mod admin;
pub mod channels;
pub mod console;
pub mod error;
pub mod fallbacks;
pub mod postgres;
pub mod quality;
pub mod routing;
pub(crate) mod row;
pub(crate) mod shared;
pub mod spend;
pub mod sqlite;
pub mod time;
pub mod types;
pub mod verification;
pub mod webhooks;

pub use admin::AdminStore;
pub use channels::{ChannelStore, TakeUpdate, Taken};
pub use console::{
    ConsoleStore, MessageSummary, MessageWebhookAttempt, MessageWebhookDelivery, NewSession,
    OutboxCursor, OutboxEntry, OverviewCounts, SessionRecord,
};
pub use error::{SqlxResultExt, StoreError};
pub use fallbacks::{
    FallbackDue, FallbackState, FallbackStore, FellBack, NewFallback, Steps, fallback_of, step_row,
};
pub use postgres::PgStore;
pub use quality::{QualityStore, QualityWindow, RouteOrder};
pub use routing::{Circuit, CircuitState, MessageEvent, MoveOn, RoutingStore};
pub use spend::{Charged, SpendItem, SpendStore, SpendSummary};
pub use sqlite::SqliteStore;
pub use types::*;

/// A tenant and its settings, as `sendonce tenant list` and `show` print
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSettings {
    pub id: Uuid,
    pub name: String,
    pub created_at: OffsetDateTime,
    pub allowed_countries: Option<Vec<String>>,
    pub allowed_senders: Option<Vec<String>>,
    pub quiet_hours: Option<crate::domain::quiet::QuietHours>,
    pub home_country: Option<String>,
    /// Its keys are refused (the admin API's `disabled`).
    pub disabled: bool,
    pub spend_caps: crate::spend::SpendCaps,
    /// The channels of a verification that names none (`None`: `sms`).
    pub verify_channels: Option<crate::domain::Channels>,
}

pub use verification::*;
pub use webhooks::{
    ClaimedDelivery, DeliveryAttempt, DeliveryNext, EventCursor, InFlightCaps, NewWebhookEndpoint,
    WebhookAttemptRow, WebhookEndpoint, WebhookEvent, WebhookStore,
};

/// What a receipt with a final delivery status makes of a `sent` message.
pub fn delivery_error(provider_status: &str, error_code: Option<&str>) -> MessageError {
    MessageError {
        code: "delivery_failed".into(),
        message: format!("the provider reported the message as not delivered ({provider_status})"),
        provider_code: error_code.map(str::to_string),
    }
}

/// Everything the service runs on: callers hold an `Arc<dyn Store>`.
pub trait Store:
    TenantStore
    + AdminStore
    + MessageStore
    + MessageReadStore
    + ReceiptStore
    + OptOutStore
    + MaintenanceStore
    + RoutingStore
    + VerificationStore
    + ConsoleStore
    + WebhookStore
    + SpendStore
    + ChannelStore
    + FallbackStore
    + QualityStore
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: TenantStore
        + AdminStore
        + MessageStore
        + MessageReadStore
        + ReceiptStore
        + OptOutStore
        + MaintenanceStore
        + RoutingStore
        + VerificationStore
        + ConsoleStore
        + WebhookStore
        + SpendStore
        + ChannelStore
        + FallbackStore
        + QualityStore
        + Send
        + Sync
        + 'static
{
}

/// Tenants, their API keys and settings.
#[async_trait]
pub trait TenantStore: Send + Sync {
    async fn tenant_count(&self) -> Result<i64, StoreError>;
    /// Creates a tenant with one key. `Conflict` if the name is taken.
    async fn create_tenant(&self, name: &str, key: &NewApiKey) -> Result<Uuid, StoreError>;
    /// Makes sure tenant `name` exists and accepts `key` as its bootstrap
    /// key (idempotent), and revokes any other active bootstrap key, all in
    /// one transaction. Keys added with [`TenantStore::add_key`] are never
    /// bootstrap keys. A configured key that was revoked stays revoked and
    /// then nothing else is revoked (an instance started with an old value
    /// must not lock out the new one). Each key it revokes is audited
    /// (`key.revoke`, as the CLI's).
    async fn ensure_bootstrap_key(
        &self,
        name: &str,
        key: &NewApiKey,
        at: OffsetDateTime,
    ) -> Result<BootstrapOutcome, StoreError>;
    /// The tenant a key hash belongs to, if the key exists and is not revoked.
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError>;
    async fn list_tenants(&self) -> Result<Vec<(Uuid, String, OffsetDateTime)>, StoreError>;
    /// Every tenant with its settings, by name (what the CLI shows).
    async fn tenant_settings(&self) -> Result<Vec<TenantSettings>, StoreError>;
    /// Sets (or with `None` clears) a tenant's home country; false if there
    /// is no such tenant.
    async fn set_home_country(
        &self,
        tenant_name: &str,
        country: Option<String>,
    ) -> Result<bool, StoreError>;
    /// Adds a key to a tenant by name; `None` if there is no such tenant.
    async fn add_key(&self, tenant_name: &str, key: &NewApiKey)
    -> Result<Option<Uuid>, StoreError>;
    /// Revokes a key by id; false if there is no such key.
    async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError>;
    async fn list_keys(&self) -> Result<Vec<ApiKeyInfo>, StoreError>;
    /// Sets (or with `None` clears) a tenant's destination allow-list;
    /// false if there is no such tenant.
    async fn set_allowed_countries(
        &self,
        tenant_name: &str,
        countries: Option<&[String]>,
    ) -> Result<bool, StoreError>;
    /// Sets (or with `None` clears) a tenant's quiet hours; false if there
    /// is no such tenant.
    async fn set_quiet_hours(
        &self,
        tenant_name: &str,
        window: Option<crate::domain::quiet::QuietHours>,
    ) -> Result<bool, StoreError>;
    /// A tenant's allowed senders: `None` if there is no such tenant,
    /// `Some(None)` if it has no list.
    async fn allowed_senders(
        &self,
        tenant_name: &str,
    ) -> Result<Option<Option<Vec<String>>>, StoreError>;
    /// Adds (`add`) or removes a sender on a tenant's list, creating the
    /// list if there is none (removing the last sender leaves an empty list:
    /// the provider's default sender only). `None` if there is no such
    /// tenant, else whether the list changed. A change is audited as the
    /// CLI's (`tenant.senders.add` / `.remove`), in its transaction.
    async fn edit_senders(
        &self,
        tenant_name: &str,
        sender: &str,
        add: bool,
    ) -> Result<Option<bool>, StoreError>;
}

/// Messages, their attempts and leases.
#[async_trait]
pub trait MessageStore: Send + Sync {
    /// Inserts a message as `processing` with its first attempt started and
    /// the lease held, or reports the message that already holds the key.
    /// One round trip in the common cases: a replay learns the stored
    /// response from the same statement that found the key taken, and a new
    /// message learns whether its recipient opted out.
    async fn insert_message(&self, m: &NewMessage, lease: &Lease) -> Result<Claim, StoreError>;
    /// Inserts a message as `scheduled` for `due` (no lease, no attempt:
    /// any instance's [`MessageStore::claim_due`] starts it when due), or
    /// reports the message that already holds the key. `send_at` is what
    /// the request asked for (shown on the resource).
    async fn schedule_message(
        &self,
        m: &NewMessage,
        due: OffsetDateTime,
        send_at: Option<OffsetDateTime>,
    ) -> Result<Claim, StoreError>;
    /// Inserts a batch's messages (distinct keys) without leases, each
    /// `scheduled` or `processing` due now (see [`Queued`]), in one
    /// statement on Postgres and one writer transaction on SQLite; answers
    /// per item, in input order: created, or the state of the message that
    /// already holds the key.
    async fn insert_batch(&self, items: &[Queued]) -> Result<Vec<Claim>, StoreError>;
    /// Makes a message `canceled` with its frozen `response`, in one
    /// conditional write fenced on [`crate::domain::schedule::cancelable`]
    /// (as SQL) and on `attempts` (the response was rendered from a row with
    /// that many). False when the row no longer qualifies: a scheduler's
    /// claim, an attempt or another cancel got there first.
    async fn cancel_message(
        &self,
        id: MessageId,
        attempts: u32,
        now: OffsetDateTime,
        response: &StoredResponse,
    ) -> Result<bool, StoreError>;
    /// Starts attempt `attempts + 1` under the lease (fenced), renewing it
    /// for its `ttl` from the database's clock; an attempt still open is closed as `lost` (its
    /// owner died before recording an answer). Returns the attempt number, or
    /// `None` when the lease is no longer ours.
    async fn start_attempt(
        &self,
        id: MessageId,
        lease: &Lease,
        now: OffsetDateTime,
        sender: Option<&str>,
    ) -> Result<Option<u32>, StoreError>;
    /// Renews the lease for its `ttl` from the database's clock (fenced).
    /// False when it is no longer ours.
    async fn renew_lease(&self, id: MessageId, lease: &Lease) -> Result<bool, StoreError>;
    /// Makes the message final (fenced). False when the lease is no longer ours.
    async fn finish(&self, f: &Finish) -> Result<bool, StoreError>;
    /// Records the attempt and a due time, releasing the lease (fenced).
    async fn reschedule(&self, r: &Reschedule) -> Result<bool, StoreError>;
    /// Claims up to `limit` messages that are due (`next_attempt_at <= now`,
    /// the caller's clock: a retry, or a `scheduled` message, which becomes
    /// `processing`) or whose lease expired (in the database's clock),
    /// leasing each for `ttl` from the database's clock, never handing one
    /// row to two claimers.
    async fn claim_due(
        &self,
        owner: &str,
        now: OffsetDateTime,
        ttl: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<(MessageRecord, Lease)>, StoreError>;
}

/// Reads of messages and their attempts: the same on both backends
/// (`store/shared/messages.rs`).
#[async_trait]
pub trait MessageReadStore: Send + Sync {
    /// The state of a key, for replays and waiting duplicates.
    async fn key_state(&self, tenant_id: Uuid, key: &str) -> Result<Option<KeyState>, StoreError>;
    /// The state of a message by id.
    async fn state_by_id(&self, id: MessageId) -> Result<Option<KeyState>, StoreError>;
    /// The message that already holds this provider message id, if any
    /// (reconciliation must never attribute one message's SMS to another).
    async fn provider_message_owner(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<Option<MessageId>, StoreError>;
    /// Another message on `provider` to the same number with the same body
    /// that could own a provider message without having written its id:
    /// one `processing`, with no provider message id, whose latest attempt
    /// is open or which may have been sent; or one that ended `unknown`
    /// since `since` (its message may exist under an id nobody learned). A
    /// candidate such a message could own is never taken by reconciliation
    /// (issue 24, finding 3).
    async fn in_flight_sibling(
        &self,
        id: MessageId,
        provider: &str,
        since: OffsetDateTime,
    ) -> Result<Option<MessageId>, StoreError>;
    async fn message(
        &self,
        tenant_id: Uuid,
        key: &str,
    ) -> Result<Option<MessageRecord>, StoreError>;
    async fn message_by_id(&self, id: MessageId) -> Result<Option<MessageRecord>, StoreError>;
    async fn attempts(&self, id: MessageId) -> Result<Vec<AttemptRow>, StoreError>;
}

/// Delivery receipts.
#[async_trait]
pub trait ReceiptStore: Send + Sync {
    /// Records a receipt once under (provider, event id) and applies it: the
    /// message whose provider id it names moves from `sent` to the first
    /// final delivery status any of its receipts reported, and never back.
    /// A receipt for no known message is kept, unlinked, for inspection.
    async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError>;
    /// Links the receipts that name message `id` on `provider` by our id
    /// (under their authentication) but arrived before its send was saved:
    /// a later part of a long message, with a provider id of its own. Then
    /// applies them as [`ReceiptStore::attach_receipts`] does. Returns
    /// whether the status moved.
    async fn attach_receipts_naming(
        &self,
        id: MessageId,
        provider: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Links receipts that arrived before the message's provider id was
    /// written (a fast provider overtaking our own write) and applies them.
    /// Returns whether the status moved.
    async fn attach_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Whether receipts for this provider message id wait, unlinked, for
    /// their message (a cheap read before [`ReceiptStore::attach_receipts`]).
    async fn has_unmatched_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError>;
    /// A message's receipts in arrival order.
    async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError>;
    /// At most `limit` of a message's receipts in (received_at, seq) order,
    /// after the position `after` (received at, seq) when given: one page of
    /// its history.
    async fn receipts_after(
        &self,
        id: MessageId,
        after: Option<(OffsetDateTime, i64)>,
        limit: u32,
    ) -> Result<Vec<ReceiptRow>, StoreError>;
    /// Receipts that matched no message, newest first.
    async fn unmatched_receipts(&self, limit: u32) -> Result<Vec<ReceiptRow>, StoreError>;
    /// Up to `limit` (provider, provider message id) pairs of unlinked
    /// receipts received since `since` whose id a message holds now: left
    /// behind when the instance that wrote the id stopped before it looked
    /// for them (see `delivery::orphans`).
    async fn orphaned_receipts(
        &self,
        since: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<(String, String)>, StoreError>;
}

/// Per-tenant opt-out lists.
#[async_trait]
pub trait OptOutStore: Send + Sync {
    /// Adds an opt-out; false if the number was already opted out.
    async fn add_opt_out(
        &self,
        tenant_id: Uuid,
        number: &str,
        source: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Removes an opt-out; false if there was none.
    async fn remove_opt_out(&self, tenant_id: Uuid, number: &str) -> Result<bool, StoreError>;
    /// Opt-outs in number order, after `after`, at most `limit`.
    async fn list_opt_outs(
        &self,
        tenant_id: Uuid,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OptOut>, StoreError>;
}

/// Verifications (one-time codes). A start is one transaction that
/// serialises the starts to one destination prefix (Postgres: an advisory
/// lock; SQLite: the single writer) and decides its limits and pause with
/// the pure functions of `domain::verification`. A check or a resend is decided
/// by its caller, with the same functions, from the row as read; the store
/// writes the change only if the row is still as read (fenced on its
/// status, checks left and sends, as a circuit on its version), with the
/// message it sends and the answer a retry replays, in one transaction.
#[async_trait]
pub trait VerificationStore: Send + Sync {
    /// The verify secret kept in the database, created from `candidate` by
    /// the first caller (every later caller reads that one).
    async fn verify_secret(&self, candidate: &[u8]) -> Result<Vec<u8>, StoreError>;
    /// Starts a verification under its (tenant, key) with its first message
    /// (`message`, leased by `lease`), unless the key is taken, a per-hour
    /// limit is reached or the destination prefix is paused.
    async fn start_verification(
        &self,
        v: &NewVerification,
        message: &NewMessage,
        lease: &Lease,
        policy: &StartPolicy,
    ) -> Result<StartOutcome, StoreError>;
    /// A tenant's verification by id.
    async fn verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<VerificationRecord>, StoreError>;
    /// The answer stored for a check or resend of verification `id` under
    /// `key`, if there is one (a retry of it is a replay).
    async fn verification_op(
        &self,
        id: Uuid,
        kind: OpKind,
        key: &str,
    ) -> Result<Option<StoredOp>, StoreError>;
    /// Writes `after`, a change that sends nothing (a check, or an expiry a
    /// resend found), if the verification is still as `read`; with `op`,
    /// stores its answer as the check's under that key. A move out of
    /// `pending` writes its webhook event in the same transaction.
    async fn check_verification(
        &self,
        read: &VerificationRecord,
        after: &VerificationRecord,
        op: Option<(OpKey<'_>, &StoredResponse)>,
    ) -> Result<Changed, StoreError>;
    /// Writes `after` (one send more) if the verification is still as
    /// `read`, with its message (`message`, its first attempt started and
    /// leased by `lease`) and its answer, stored as the resend's under
    /// `op`'s key.
    async fn resend_verification(
        &self,
        read: &VerificationRecord,
        after: &VerificationRecord,
        op: (OpKey<'_>, &StoredResponse),
        message: &NewMessage,
        lease: &Lease,
    ) -> Result<Changed, StoreError>;
    /// Marks up to `batch` pending verifications whose time ran out by
    /// `now` as `expired`, each with its `verification.expired` webhook
    /// event in the same transaction; returns them (after the change).
    async fn expire_verifications(
        &self,
        now: OffsetDateTime,
        batch: u32,
    ) -> Result<Vec<VerificationRecord>, StoreError>;
    /// Deletes up to `batch` verifications (with their stored answers) that
    /// expired before `cutoff` (retention); their keys are free again.
    async fn purge_verifications(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError>;
    /// Cancels a pending verification; returns it as it is after.
    async fn cancel_verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Option<VerificationRecord>, StoreError>;
}

/// What `/readyz` reports about the database it reached.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DbStatus {
    /// `primary` (a Postgres server that accepts writes) or `file` (SQLite).
    pub role: &'static str,
    /// `host:port` of the Postgres server in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Counts of what the Postgres connector did, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Connections the pool opened (every reconnect included).
    pub connections_opened: u64,
    /// Times the pool was pointed at another host (a failover followed).
    pub host_switches: u64,
}

/// A store's listener for the changes other instances announce: runs until
/// its stop token is cancelled.
pub type ChangeFeed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Schema, health, shutdown and retention.
#[async_trait]
pub trait MaintenanceStore: Send + Sync {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Whether the database answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// The database's role as seen from here; `Unavailable` when it does
    /// not answer or cannot take writes.
    async fn status(&self) -> Result<DbStatus, StoreError> {
        self.ping().await?;
        Ok(DbStatus {
            role: "file",
            host: None,
        })
    }
    /// What the connector did so far.
    fn connection_stats(&self) -> ConnectionStats {
        ConnectionStats::default()
    }
    /// Releases every lease `owner` holds so another instance resumes those
    /// messages at once (graceful shutdown), except those in `hold`: their
    /// provider call was cut off and the provider may still be acting on
    /// it, so their lease is only shortened to `hold_for` from the
    /// database's now (never lengthened), and nobody takes them before.
    /// Returns how many were released.
    async fn release_leases(
        &self,
        owner: &str,
        now: OffsetDateTime,
        hold: &[MessageId],
        hold_for: std::time::Duration,
    ) -> Result<u64, StoreError>;
    /// Deletes up to `batch` final messages created before `cutoff`.
    async fn purge(&self, cutoff: OffsetDateTime, batch: u32) -> Result<u64, StoreError>;
    /// Deletes up to `batch` unmatched receipts received before `cutoff`.
    async fn purge_unmatched_receipts(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError>;
    /// The creation time of the oldest message still `processing`.
    async fn oldest_processing(&self) -> Result<Option<OffsetDateTime>, StoreError>;
    /// Rows per coalesced write, for a store that coalesces (Postgres).
    fn batch_sizes(&self) -> Option<std::sync::Arc<crate::metrics::BatchSizes>> {
        None
    }
    /// Whether other processes announce their changes through this store
    /// (so what this instance caches hears of them at once).
    fn announces_changes(&self) -> bool {
        false
    }
    /// Listens for the changes other instances announce (revoked keys,
    /// purges) and publishes them to `notifier` until `stop`; `None` for a
    /// store no other process announces changes through (SQLite).
    fn change_feed(
        &self,
        _notifier: crate::notify::Notifier,
        _stop: tokio_util::sync::CancellationToken,
    ) -> Option<crate::store::ChangeFeed> {
        None
    }
}
