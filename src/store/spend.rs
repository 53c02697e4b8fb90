//! The spend interface: a capped tenant's sends are inserted with their
//! charge against the period counters in one transaction, whose cap
//! condition is in the counters' `UPDATE` (the database decides races:
//! concurrent sends never together pass a cap). Uncapped tenants' sends take
//! the ordinary (coalesced) inserts and only store their cost.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Claim, KeyState, Lease, NewMessage, StoreError};
use crate::spend::{Cap, Micros, SpendCaps};

/// One capped send to insert: with a lease (started now, attempt 1), or
/// waiting without one until `due` (scheduled, or a batch item).
#[derive(Clone, Debug)]
pub struct SpendItem {
    pub message: NewMessage,
    pub lease: Option<Lease>,
    pub due: OffsetDateTime,
    pub send_at: Option<OffsetDateTime>,
}

/// What a capped insert did.
#[derive(Debug)]
pub enum Charged {
    /// Inserted and charged; the caps whose 80 % this send crossed (their
    /// `tenant.spend_warning` events were written in the same transaction).
    Created { claim: Claim, warned: Vec<Cap> },
    /// The key is taken: that message's state (not charged again).
    Existing(KeyState),
    /// Over `cap`: nothing was stored.
    Refused(Cap),
}

/// What a tenant spent today and this month (UTC), from its messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpendSummary {
    pub today_micros: Micros,
    pub month_micros: Micros,
    pub international_today: i64,
    /// The currency of the costs summed (the prices file's).
    pub currency: Option<String>,
    /// The tenant's caps now.
    pub caps: SpendCaps,
}

#[async_trait]
pub trait SpendStore: Send + Sync {
    /// A tenant's caps; `None`: no such tenant.
    async fn spend_caps(&self, tenant_name: &str) -> Result<Option<SpendCaps>, StoreError>;
    /// Inserts a capped tenant's send and charges it (see the module's docs).
    async fn insert_charged(
        &self,
        item: &SpendItem,
        caps: SpendCaps,
        now: OffsetDateTime,
    ) -> Result<Charged, StoreError>;
    /// What a tenant spent in the day and month of `now`.
    async fn spend_summary(
        &self,
        tenant_id: Uuid,
        now: OffsetDateTime,
    ) -> Result<SpendSummary, StoreError>;
}
