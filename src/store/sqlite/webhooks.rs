//! Webhooks on SQLite: the events feed, claiming and finishing deliveries,
//! and writing events (endpoints and the rest are in
//! `store/shared/webhooks.rs`). Writes go
//! through the single writer; the outbox rows are written by the status
//! changes themselves ([`enqueue_event`], called by `messages.rs` and
//! `receipts.rs` inside their job).

use std::time::Duration;

use sqlx::SqliteConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::time::{db, micros};
use crate::store::webhooks::{
    ClaimedDelivery, ClaimedRow, DeliveryAttempt, DeliveryNext, EventCursor, EventRow,
    InFlightCaps, WebhookEvent, claimed_columns, event_columns,
};
use crate::store::{SqlxResultExt, StoreError};

/// Writes an event and one delivery per endpoint of its tenant subscribed
/// now, inside the caller's (the writer's) transaction.
pub(super) async fn enqueue_event(
    c: &mut SqliteConnection,
    tenant_id: Uuid,
    event_type: &str,
    message_id: Option<Uuid>,
    data: &[u8],
    at: OffsetDateTime,
) -> Result<(), StoreError> {
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO webhook_events (id, tenant_id, type, message_id, data, created_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(event_type)
    .bind(message_id)
    .bind(data)
    .bind(db(at))
    .execute(&mut *c)
    .await?;
    // Its deliveries: the trigger `webhook_events_fan_out` (migration 0015).
    Ok(())
}

async fn claim(
    c: &mut SqliteConnection,
    owner: &str,
    now: OffsetDateTime,
    ttl: Duration,
    limit: u32,
    caps: InFlightCaps,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    // The writer's transaction makes this claim exclusive. In flight: a
    // live lease; the due rows are ranked per endpoint, then (those within
    // the endpoint's cap) per tenant, after what each has in flight.
    let ids: Vec<i64> = sqlx::query_scalar(concat!(
        "WITH live AS ( \
            SELECT d.endpoint_id, x.tenant_id, count(*) AS n \
            FROM webhook_deliveries d JOIN webhook_endpoints x ON x.id = d.endpoint_id \
            WHERE d.status = 'pending' AND d.lease_token IS NOT NULL \
              AND d.lease_expires_at > ",
        db_now!(),
        " GROUP BY d.endpoint_id, x.tenant_id), \
         by_endpoint AS ( \
            SELECT d.id, d.next_attempt_at, x.tenant_id, \
                row_number() OVER (PARTITION BY d.endpoint_id \
                    ORDER BY d.next_attempt_at, d.id) \
                + COALESCE((SELECT l.n FROM live l WHERE l.endpoint_id = d.endpoint_id), 0) \
                    AS on_endpoint \
            FROM webhook_deliveries d JOIN webhook_endpoints x \
                ON x.id = d.endpoint_id AND x.enabled \
            WHERE d.status = 'pending' AND d.next_attempt_at <= $1 \
              AND (d.lease_token IS NULL OR d.lease_expires_at <= ",
        db_now!(),
        ")), \
         by_tenant AS ( \
            SELECT e.id, e.next_attempt_at, \
                row_number() OVER (PARTITION BY e.tenant_id \
                    ORDER BY e.next_attempt_at, e.id) \
                + COALESCE((SELECT sum(l.n) FROM live l WHERE l.tenant_id = e.tenant_id), 0) \
                    AS on_tenant \
            FROM by_endpoint e WHERE e.on_endpoint <= $3) \
         SELECT t.id FROM by_tenant t WHERE t.on_tenant <= $4 \
         ORDER BY t.next_attempt_at, t.id LIMIT $2"
    ))
    .bind(db(now))
    .bind(i64::from(limit))
    .bind(i64::from(caps.per_endpoint))
    .bind(i64::from(caps.per_tenant))
    .fetch_all(&mut *c)
    .await?;
    let mut claimed = Vec::with_capacity(ids.len());
    for id in ids {
        sqlx::query(concat!(
            "UPDATE webhook_deliveries SET lease_token = ?, lease_owner = ?, lease_expires_at = ",
            db_now!(),
            " + ? WHERE id = ?"
        ))
        .bind(Uuid::new_v4())
        .bind(owner)
        .bind(micros(ttl))
        .bind(id)
        .execute(&mut *c)
        .await?;
        let row: ClaimedRow = sqlx::query_as(concat!(
            "SELECT ",
            claimed_columns!(),
            " FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id \
               JOIN webhook_endpoints w ON w.id = d.endpoint_id WHERE d.id = ?"
        ))
        .bind(id)
        .fetch_one(&mut *c)
        .await?;
        claimed.push(ClaimedDelivery::from(row));
    }
    Ok(claimed)
}

async fn finish_attempt(c: &mut SqliteConnection, a: &DeliveryAttempt) -> Result<bool, StoreError> {
    let next_at = match &a.next {
        DeliveryNext::RetryAt(at) => Some(db(*at)),
        _ => None,
    };
    let done: Option<(Uuid, i64)> = sqlx::query_as(
        "UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, \
            next_attempt_at = ?, lease_token = NULL, lease_owner = NULL, \
            lease_expires_at = NULL, updated_at = ? \
         WHERE id = ? AND lease_token = ? AND status = 'pending' \
         RETURNING endpoint_id, attempts",
    )
    .bind(a.delivery_status())
    .bind(next_at)
    .bind(db(a.finished_at))
    .bind(a.delivery_id)
    .bind(a.lease_token)
    .fetch_optional(&mut *c)
    .await?;
    let Some((endpoint_id, number)) = done else {
        return Ok(false);
    };
    sqlx::query(
        "INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, event_type, number, \
            outcome, http_status, error, response_excerpt, started_at, finished_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(a.delivery_id)
    .bind(endpoint_id)
    .bind(a.event_id)
    .bind(&a.event_type)
    .bind(number)
    .bind(a.outcome())
    .bind(a.http_status.map(i64::from))
    .bind(&a.error)
    .bind(&a.response_excerpt)
    .bind(db(a.started_at))
    .bind(db(a.finished_at))
    .execute(&mut *c)
    .await?;
    if let DeliveryNext::Disable(reason) = &a.next {
        sqlx::query(
            "UPDATE webhook_endpoints SET enabled = 0, disabled_reason = ?, updated_at = ? \
             WHERE id = ?",
        )
        .bind(reason)
        .bind(db(a.finished_at))
        .bind(endpoint_id)
        .execute(&mut *c)
        .await?;
        sqlx::query(
            "UPDATE webhook_deliveries SET status = 'canceled', next_attempt_at = NULL, \
                lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = ? \
             WHERE endpoint_id = ? AND status = 'pending' AND id <> ?",
        )
        .bind(db(a.finished_at))
        .bind(endpoint_id)
        .bind(a.delivery_id)
        .execute(&mut *c)
        .await?;
    }
    Ok(true)
}

/// What the shared `WebhookStore` (`store/shared/webhooks.rs`) calls: what
/// this backend does its own way.
impl SqliteStore {
    pub(crate) async fn events_after(
        &self,
        tenant_id: Uuid,
        after: Option<EventCursor>,
        limit: u32,
    ) -> Result<Vec<WebhookEvent>, StoreError> {
        // One writer: `seq` order is commit order.
        let after = after.unwrap_or(EventCursor { txid: -1, seq: -1 });
        let rows: Vec<EventRow> = sqlx::query_as(concat!(
            "SELECT ",
            event_columns!(),
            " FROM webhook_events e WHERE e.tenant_id = ? \
               AND (e.txid > ? OR (e.txid = ? AND e.seq > ?)) \
             ORDER BY e.txid, e.seq LIMIT ?"
        ))
        .bind(tenant_id)
        .bind(after.txid)
        .bind(after.txid)
        .bind(after.seq)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .store_err()?;
        Ok(rows.into_iter().map(WebhookEvent::from).collect())
    }

    pub(crate) async fn claim_deliveries(
        &self,
        owner: &str,
        now: OffsetDateTime,
        ttl: Duration,
        limit: u32,
        caps: InFlightCaps,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let owner = owner.to_string();
        self.write(move |c| Box::pin(async move { claim(c, &owner, now, ttl, limit, caps).await }))
            .await
    }

    pub(crate) async fn finish_attempt(&self, a: &DeliveryAttempt) -> Result<bool, StoreError> {
        let a = a.clone();
        self.write(move |c| Box::pin(async move { finish_attempt(c, &a).await }))
            .await
    }

    /// [`enqueue_event`] as the shared code calls it.
    pub(crate) async fn enqueue_event(
        c: &mut SqliteConnection,
        tenant_id: Uuid,
        event_type: &str,
        message_id: Option<Uuid>,
        data: &[u8],
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        enqueue_event(c, tenant_id, event_type, message_id, data, at).await
    }
}
