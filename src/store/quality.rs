//! Route quality (issue 43): each route's providers measured from the
//! messages over a window, and the order quality or an operator's pin
//! gave a route.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::StoreError;
use crate::admin::AuditEntry;
use crate::domain::quality::Measured;

/// A route's stored order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteOrder {
    /// The route's prefix (`*` the default).
    pub prefix: String,
    pub providers: Vec<String>,
    /// Set by an operator: quality leaves it alone.
    pub pinned: bool,
    /// Why it is this order.
    pub reason: String,
    pub changed_at: OffsetDateTime,
    /// Bumped by every change; writes are compare-and-set on it. 0: no row.
    pub version: i64,
}

/// What is measured, and over which time.
#[derive(Clone, Copy, Debug)]
pub struct QualityWindow {
    /// Messages created from then on.
    pub since: OffsetDateTime,
    /// Messages sent up to then are old enough to say whether slow.
    pub judged_before: OffsetDateTime,
    /// A message without a final receipt this long after it was sent is slow.
    pub slow_after_micros: i64,
}

#[async_trait]
pub trait QualityStore {
    /// Every route and provider (and every channel's adapter, route `""`,
    /// for its codes) with messages created in the window.
    async fn route_quality(&self, w: QualityWindow) -> Result<Vec<Measured>, StoreError>;

    /// Every stored route order.
    async fn route_orders(&self) -> Result<Vec<RouteOrder>, StoreError>;

    /// Writes `order` (its `version` the new one: 1 for a route without a
    /// row) if the stored version is the one before, with `audit` in the
    /// same transaction. `false`: another write came first, nothing written.
    async fn put_route_order(
        &self,
        order: &RouteOrder,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError>;

    /// Removes route `prefix`'s pinned order if its version is `version`,
    /// with `audit` in the same transaction. `false`: nothing removed.
    async fn delete_route_order(
        &self,
        prefix: &str,
        version: i64,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError>;
}
