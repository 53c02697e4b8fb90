//! Webhook endpoints, the events feed and deliveries on SQLite. Writes go
//! through the single writer; the outbox rows are written by the status
//! changes themselves ([`enqueue_event`], called by `messages.rs` and
//! `receipts.rs` inside their job).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqliteConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::time::{db, micros};
use crate::store::webhooks::{
    ATTEMPT_COLUMNS, AttemptRowDb, ClaimedDelivery, ClaimedRow, DeliveryAttempt, DeliveryNext,
    EndpointRow, EventCursor, EventRow, NewWebhookEndpoint, WebhookAttemptRow, WebhookEndpoint,
    WebhookEvent, WebhookStore, claimed_columns, endpoint_columns, event_columns, events_column,
};
use crate::store::{MessageRecord, SqlxResultExt, StoreError};

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

/// The event of a message's status change, its data the message as it is
/// now (receipts), inside the caller's transaction.
pub(super) async fn enqueue_message_event(
    c: &mut SqliteConnection,
    message_id: Uuid,
    event_type: &str,
    at: OffsetDateTime,
) -> Result<(), StoreError> {
    let row: Option<crate::store::row::MessageRow> = sqlx::query_as(concat!(
        "SELECT ",
        crate::store::row::message_columns!(),
        " FROM messages m WHERE m.id = ?"
    ))
    .bind(message_id)
    .fetch_optional(&mut *c)
    .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let record = MessageRecord::from(row);
    let data = record.to_out().to_json();
    enqueue_event(c, record.tenant_id, event_type, Some(message_id), &data, at).await
}

async fn claim(
    c: &mut SqliteConnection,
    owner: &str,
    now: OffsetDateTime,
    ttl: Duration,
    limit: u32,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    // The writer's transaction makes this claim exclusive.
    let ids: Vec<i64> = sqlx::query_scalar(concat!(
        "SELECT d.id FROM webhook_deliveries d \
         JOIN webhook_endpoints x ON x.id = d.endpoint_id AND x.enabled \
         WHERE d.status = 'pending' AND d.next_attempt_at <= ? \
           AND (d.lease_token IS NULL OR d.lease_expires_at <= ",
        db_now!(),
        ") ORDER BY d.next_attempt_at LIMIT ?"
    ))
    .bind(db(now))
    .bind(i64::from(limit))
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

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn create_webhook_endpoint(
        &self,
        e: &NewWebhookEndpoint,
    ) -> Result<WebhookEndpoint, StoreError> {
        let e2 = e.clone();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO webhook_endpoints (id, tenant_id, url, events, enabled, secret, \
                        created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                )
                .bind(e2.id)
                .bind(e2.tenant_id)
                .bind(&e2.url)
                .bind(events_column(&e2.events))
                .bind(&e2.secret)
                .bind(db(e2.created_at))
                .bind(db(e2.created_at))
                .execute(&mut *c)
                .await?;
                Ok(())
            })
        })
        .await?;
        self.webhook_endpoint(e.tenant_id, e.id)
            .await?
            .ok_or(StoreError::Invariant(
                "an endpoint vanished right after its insert",
            ))
    }

    async fn webhook_endpoints(&self, tenant_id: Uuid) -> Result<Vec<WebhookEndpoint>, StoreError> {
        let rows: Vec<EndpointRow> = sqlx::query_as(concat!(
            "SELECT ",
            endpoint_columns!(),
            " FROM webhook_endpoints w WHERE w.tenant_id = ? ORDER BY w.created_at, w.id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .store_err()?;
        Ok(rows.into_iter().map(WebhookEndpoint::from).collect())
    }

    async fn webhook_endpoint(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<WebhookEndpoint>, StoreError> {
        let row: Option<EndpointRow> = sqlx::query_as(concat!(
            "SELECT ",
            endpoint_columns!(),
            " FROM webhook_endpoints w WHERE w.tenant_id = ? AND w.id = ?"
        ))
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .store_err()?;
        Ok(row.map(WebhookEndpoint::from))
    }

    async fn delete_webhook_endpoint(&self, tenant_id: Uuid, id: Uuid) -> Result<bool, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                // Its deliveries and their attempts go with it (ON DELETE CASCADE).
                let done =
                    sqlx::query("DELETE FROM webhook_endpoints WHERE tenant_id = ? AND id = ?")
                        .bind(tenant_id)
                        .bind(id)
                        .execute(&mut *c)
                        .await?;
                Ok(done.rows_affected() == 1)
            })
        })
        .await
    }

    async fn rotate_webhook_secret(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        secret: &str,
        old_until: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Result<Option<WebhookEndpoint>, StoreError> {
        let secret = secret.to_string();
        let changed = self
            .write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(
                        "UPDATE webhook_endpoints SET previous_secret = secret, \
                            previous_secret_expires_at = ?, secret = ?, updated_at = ? \
                         WHERE tenant_id = ? AND id = ?",
                    )
                    .bind(db(old_until))
                    .bind(&secret)
                    .bind(db(now))
                    .bind(tenant_id)
                    .bind(id)
                    .execute(&mut *c)
                    .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await?;
        if !changed {
            return Ok(None);
        }
        self.webhook_endpoint(tenant_id, id).await
    }

    async fn any_webhook_endpoints(&self) -> Result<bool, StoreError> {
        let any: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled)")
                .fetch_one(&self.pool)
                .await
                .store_err()?;
        Ok(any)
    }

    async fn webhook_events_after(
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

    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: OffsetDateTime,
        ttl: Duration,
        limit: u32,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let owner = owner.to_string();
        self.write(move |c| Box::pin(async move { claim(c, &owner, now, ttl, limit).await }))
            .await
    }

    async fn finish_webhook_attempt(&self, a: &DeliveryAttempt) -> Result<bool, StoreError> {
        let a = a.clone();
        self.write(move |c| Box::pin(async move { finish_attempt(c, &a).await }))
            .await
    }

    async fn webhook_attempts(
        &self,
        tenant_id: Uuid,
        endpoint_id: Uuid,
        limit: u32,
    ) -> Result<Vec<WebhookAttemptRow>, StoreError> {
        let rows: Vec<AttemptRowDb> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts \
             WHERE endpoint_id = ? AND EXISTS (SELECT 1 FROM webhook_endpoints w \
                WHERE w.id = ? AND w.tenant_id = ?) \
             ORDER BY id DESC LIMIT ?"
        )))
        .bind(endpoint_id)
        .bind(endpoint_id)
        .bind(tenant_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .store_err()?;
        Ok(rows.into_iter().map(WebhookAttemptRow::from).collect())
    }

    async fn purge_webhook_events(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "DELETE FROM webhook_events WHERE seq IN (SELECT seq FROM webhook_events \
                        WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                )
                .bind(db(cutoff))
                .bind(i64::from(batch))
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }
}
