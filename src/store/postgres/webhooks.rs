//! Webhooks on Postgres: the events feed, claiming and finishing
//! deliveries, and writing events (endpoints and the rest are in
//! `store/shared/webhooks.rs`). The outbox rows are written by the status changes themselves (see
//! [`EVENT_FROM_M`], used by `messages.rs`, `batch.rs` and `receipts.rs`).

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
use crate::store::StoreError;
use crate::store::time::{db, micros};
use crate::store::webhooks::{
    ClaimedDelivery, ClaimedRow, DeliveryAttempt, DeliveryNext, EventCursor, EventRow,
    InFlightCaps, WebhookEvent, claimed_columns, event_columns,
};

/// Two CTEs to append (after a comma) to a statement whose CTE `m` returns
/// the messages it made final (`id`, `tenant_id`, `status`,
/// `response_body`, `updated_at`): one event per message, with the frozen
/// response as its data, and one delivery per endpoint subscribed now.
pub(super) const EVENT_FROM_M: &str = "\
    ev AS ( \
        INSERT INTO webhook_events (id, tenant_id, type, message_id, data, created_at) \
        SELECT gen_random_uuid(), m.tenant_id, 'message.' || m.status, m.id, m.response_body, \
            m.updated_at FROM m \
        RETURNING id, tenant_id, type, created_at), \
    wd AS ( \
        INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts, \
            next_attempt_at, created_at, updated_at) \
        SELECT ev.id, w.id, 'pending', 0, ev.created_at, ev.created_at, ev.created_at \
        FROM ev JOIN webhook_endpoints w ON w.tenant_id = ev.tenant_id AND w.enabled \
            AND (w.events IS NULL OR jsonb_exists(w.events::jsonb, ev.type)))";

/// Writes an event and one delivery per endpoint of its tenant enabled and
/// subscribed to its type now, inside the caller's transaction.
pub(super) async fn enqueue_event(
    tx: &mut sqlx::PgConnection,
    tenant_id: Uuid,
    event_type: &str,
    message_id: Option<Uuid>,
    data: &[u8],
    at: OffsetDateTime,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH ev AS ( \
            INSERT INTO webhook_events (id, tenant_id, type, message_id, data, created_at) \
            VALUES ($1, $2, $3, $4, $5, $6) \
            RETURNING id, tenant_id, type, created_at) \
         INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts, \
            next_attempt_at, created_at, updated_at) \
         SELECT ev.id, w.id, 'pending', 0, ev.created_at, ev.created_at, ev.created_at \
         FROM ev JOIN webhook_endpoints w ON w.tenant_id = ev.tenant_id AND w.enabled \
            AND (w.events IS NULL OR jsonb_exists(w.events::jsonb, ev.type))",
    )
    .bind(Uuid::now_v7())
    .bind(tenant_id)
    .bind(event_type)
    .bind(message_id)
    .bind(data)
    .bind(db(at))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// What the shared `WebhookStore` (`store/shared/webhooks.rs`) calls: what
/// this backend does its own way.
impl PgStore {
    pub(crate) async fn events_after(
        &self,
        tenant_id: Uuid,
        after: Option<EventCursor>,
        limit: u32,
    ) -> Result<Vec<WebhookEvent>, StoreError> {
        let after = after.unwrap_or(EventCursor { txid: -1, seq: -1 });
        // Only rows of transactions older than every one still running: a
        // transaction that began earlier but commits later can then never
        // add a row behind a cursor a reader already holds.
        let rows: Vec<EventRow> = sqlx::query_as(concat!(
            "SELECT ",
            event_columns!(),
            " FROM webhook_events e WHERE e.tenant_id = $1 AND (e.txid, e.seq) > ($2, $3) \
               AND e.txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint \
             ORDER BY e.txid, e.seq LIMIT $4"
        ))
        .bind(tenant_id)
        .bind(after.txid)
        .bind(after.seq)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
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
        // In flight: a live lease, whoever holds it. The due rows are
        // ranked per endpoint, then (those within the endpoint's cap) per
        // tenant, after what each already has in flight; two instances
        // claiming at the same instant may each fill a cap (SKIP LOCKED
        // keeps their rows apart, not their counts).
        let rows: Vec<ClaimedRow> = sqlx::query_as(concat!(
            "WITH live AS ( \
                SELECT d.endpoint_id, x.tenant_id, count(*) AS n \
                FROM webhook_deliveries d JOIN webhook_endpoints x ON x.id = d.endpoint_id \
                WHERE d.status = 'pending' AND d.lease_token IS NOT NULL \
                  AND d.lease_expires_at > now() \
                GROUP BY d.endpoint_id, x.tenant_id), \
             by_endpoint AS ( \
                SELECT d.id, d.next_attempt_at, x.tenant_id, \
                    row_number() OVER (PARTITION BY d.endpoint_id \
                        ORDER BY d.next_attempt_at, d.id) \
                    + COALESCE((SELECT l.n FROM live l WHERE l.endpoint_id = d.endpoint_id), 0) \
                        AS on_endpoint \
                FROM webhook_deliveries d JOIN webhook_endpoints x \
                    ON x.id = d.endpoint_id AND x.enabled \
                WHERE d.status = 'pending' AND d.next_attempt_at <= $1 \
                  AND (d.lease_token IS NULL OR d.lease_expires_at <= now())), \
             by_tenant AS ( \
                SELECT e.id, e.next_attempt_at, \
                    row_number() OVER (PARTITION BY e.tenant_id \
                        ORDER BY e.next_attempt_at, e.id) \
                    + COALESCE((SELECT sum(l.n) FROM live l WHERE l.tenant_id = e.tenant_id), 0) \
                        AS on_tenant \
                FROM by_endpoint e WHERE e.on_endpoint <= $5), \
             due AS ( \
                SELECT id FROM webhook_deliveries WHERE id IN ( \
                    SELECT t.id FROM by_tenant t WHERE t.on_tenant <= $6 \
                    ORDER BY t.next_attempt_at, t.id LIMIT $2) \
                FOR UPDATE SKIP LOCKED), \
             c AS ( \
                UPDATE webhook_deliveries d SET lease_token = gen_random_uuid(), \
                    lease_owner = $3, lease_expires_at = now() + $4 * interval '1 microsecond' \
                FROM due WHERE d.id = due.id \
                RETURNING d.id, d.lease_token, d.attempts, d.event_id, d.endpoint_id) \
             SELECT ",
            claimed_columns!(),
            " FROM c d JOIN webhook_events e ON e.id = d.event_id \
               JOIN webhook_endpoints w ON w.id = d.endpoint_id"
        ))
        .bind(db(now))
        .bind(i64::from(limit))
        .bind(owner)
        .bind(micros(ttl))
        .bind(i64::from(caps.per_endpoint))
        .bind(i64::from(caps.per_tenant))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ClaimedDelivery::from).collect())
    }

    pub(crate) async fn finish_attempt(&self, a: &DeliveryAttempt) -> Result<bool, StoreError> {
        let next_at = match &a.next {
            DeliveryNext::RetryAt(at) => Some(db(*at)),
            _ => None,
        };
        let disable = match &a.next {
            DeliveryNext::Disable(reason) => Some(reason.as_str()),
            _ => None,
        };
        let n: i64 = sqlx::query_scalar(
            "WITH d AS ( \
                UPDATE webhook_deliveries SET status = $3, attempts = attempts + 1, \
                    next_attempt_at = $4, lease_token = NULL, lease_owner = NULL, \
                    lease_expires_at = NULL, updated_at = $5 \
                WHERE id = $1 AND lease_token = $2 AND status = 'pending' \
                RETURNING id, endpoint_id, event_id, attempts), \
             a AS ( \
                INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, event_type, \
                    number, outcome, http_status, error, response_excerpt, started_at, \
                    finished_at) \
                SELECT d.id, d.endpoint_id, d.event_id, $6, d.attempts, $7, $8, $9, $10, $11, $5 \
                FROM d), \
             w AS ( \
                UPDATE webhook_endpoints SET enabled = false, disabled_reason = $12, \
                    updated_at = $5 \
                WHERE $12::text IS NOT NULL AND id = (SELECT endpoint_id FROM d)), \
             c AS ( \
                UPDATE webhook_deliveries SET status = 'canceled', next_attempt_at = NULL, \
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                    updated_at = $5 \
                WHERE $12::text IS NOT NULL AND endpoint_id = (SELECT endpoint_id FROM d) \
                    AND status = 'pending' AND id <> $1) \
             SELECT count(*) FROM d",
        )
        .bind(a.delivery_id)
        .bind(a.lease_token)
        .bind(a.delivery_status())
        .bind(next_at)
        .bind(db(a.finished_at))
        .bind(&a.event_type)
        .bind(a.outcome())
        .bind(a.http_status.map(i32::from))
        .bind(&a.error)
        .bind(&a.response_excerpt)
        .bind(db(a.started_at))
        .bind(disable)
        .fetch_one(&self.pool)
        .await?;
        Ok(n == 1)
    }

    /// [`enqueue_event`] as the shared code calls it.
    pub(crate) async fn enqueue_event(
        c: &mut sqlx::PgConnection,
        tenant_id: Uuid,
        event_type: &str,
        message_id: Option<Uuid>,
        data: &[u8],
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        enqueue_event(c, tenant_id, event_type, message_id, data, at).await
    }
}
