//! Webhook endpoints, their attempts and the event retention: once for
//! both backends. What each backend does its own way stays with it, as
//! primitives this calls on `Driver`: reading the events feed
//! (`events_after`: Postgres' snapshot horizon, SQLite's commit order),
//! claiming deliveries (`claim_deliveries`: SKIP LOCKED, or the single
//! writer), recording an attempt (`finish_attempt`: one statement of CTEs,
//! or a writer job) and writing an event (`enqueue_event`: a fan-out CTE,
//! or a trigger).

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::store::row::{MessageRow, message_columns};
use crate::store::time::db;
use crate::store::webhooks::{
    AttemptRowDb, ClaimedDelivery, DeliveryAttempt, EndpointRow, EventCursor, InFlightCaps,
    NewWebhookEndpoint, WebhookAttemptRow, WebhookEndpoint, WebhookEvent, WebhookStore,
    endpoint_columns, events_column,
};
use crate::store::{MessageRecord, StoreError};

/// Takes the tenant's row lock, so one endpoint insert of the tenant at a
/// time counts its endpoints (SQLite's single writer does this anyway).
/// The write changes nothing.
const LOCK_TENANT: &str = "UPDATE tenants SET name = name WHERE id = $1";

/// Inserts only while the tenant has fewer than `$7` endpoints; under the
/// lock above the count sees every committed insert (on Postgres each
/// statement of a read-committed transaction takes a fresh snapshot).
const INSERT_ENDPOINT: &str = "INSERT INTO webhook_endpoints (id, tenant_id, url, events, \
        enabled, secret, created_at, updated_at) \
     SELECT $1, $2, $3, $4, true, $5, $6, $6 \
     WHERE (SELECT count(*) FROM webhook_endpoints WHERE tenant_id = $2) < $7";

const ENDPOINTS: &str = concat!(
    "SELECT ",
    endpoint_columns!(),
    " FROM webhook_endpoints w WHERE w.tenant_id = $1 ORDER BY w.created_at, w.id"
);

const ENDPOINT: &str = concat!(
    "SELECT ",
    endpoint_columns!(),
    " FROM webhook_endpoints w WHERE w.tenant_id = $1 AND w.id = $2"
);

/// Its deliveries and their attempts go with it (ON DELETE CASCADE).
const DELETE_ENDPOINT: &str = "DELETE FROM webhook_endpoints WHERE tenant_id = $1 AND id = $2";

const ROTATE_SECRET: &str = "UPDATE webhook_endpoints SET previous_secret = secret, \
        previous_secret_expires_at = $4, secret = $3, updated_at = $5 \
     WHERE tenant_id = $1 AND id = $2";

const ANY_ENDPOINT: &str = "SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled)";

/// An endpoint's attempts ([`AttemptRowDb`]) older than id `$4`, newest
/// first, if it is the tenant's.
const ATTEMPTS: &str = "SELECT id, event_id, event_type, number, outcome, http_status, \
        error, response_excerpt, started_at, finished_at FROM webhook_attempts \
     WHERE endpoint_id = $2 AND EXISTS (SELECT 1 FROM webhook_endpoints w \
        WHERE w.id = $2 AND w.tenant_id = $1) AND id < $4 \
     ORDER BY id DESC LIMIT $3";

const PURGE_EVENTS: &str = "DELETE FROM webhook_events WHERE seq IN (SELECT seq \
        FROM webhook_events WHERE created_at < $1 ORDER BY created_at LIMIT $2)";

const MESSAGE: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1"
);

per_backend! {
    #[async_trait]
    impl WebhookStore for Driver {
        async fn create_webhook_endpoint(
            &self,
            e: &NewWebhookEndpoint,
            most: u32,
        ) -> Result<Option<WebhookEndpoint>, StoreError> {
            let new = e.clone();
            let inserted = self
                .write_tx(move |c| {
                    Box::pin(async move {
                        sqlx::query(LOCK_TENANT)
                            .bind(new.tenant_id)
                            .execute(&mut *c)
                            .await?;
                        let done = sqlx::query(INSERT_ENDPOINT)
                            .bind(new.id)
                            .bind(new.tenant_id)
                            .bind(&new.url)
                            .bind(events_column(&new.events))
                            .bind(&new.secret)
                            .bind(db(new.created_at))
                            .bind(i64::from(most))
                            .execute(&mut *c)
                            .await?;
                        Ok(done.rows_affected() == 1)
                    })
                })
                .await?;
            if !inserted {
                return Ok(None);
            }
            self.webhook_endpoint(e.tenant_id, e.id)
                .await?
                .map(Some)
                .ok_or(StoreError::Invariant(
                    "an endpoint vanished right after its insert",
                ))
        }

        async fn webhook_endpoints(
            &self,
            tenant_id: Uuid,
        ) -> Result<Vec<WebhookEndpoint>, StoreError> {
            let rows: Vec<EndpointRow> = sqlx::query_as(ENDPOINTS)
                .bind(tenant_id)
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(WebhookEndpoint::from).collect())
        }

        async fn webhook_endpoint(
            &self,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<Option<WebhookEndpoint>, StoreError> {
            let row: Option<EndpointRow> = sqlx::query_as(ENDPOINT)
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(WebhookEndpoint::from))
        }

        async fn delete_webhook_endpoint(
            &self,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<bool, StoreError> {
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(DELETE_ENDPOINT)
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
                        let done = sqlx::query(ROTATE_SECRET)
                            .bind(tenant_id)
                            .bind(id)
                            .bind(&secret)
                            .bind(db(old_until))
                            .bind(db(now))
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
            let any: bool = sqlx::query_scalar(ANY_ENDPOINT)
                .fetch_one(self.pool())
                .await?;
            Ok(any)
        }

        async fn webhook_events_after(
            &self,
            tenant_id: Uuid,
            after: Option<EventCursor>,
            limit: u32,
        ) -> Result<Vec<WebhookEvent>, StoreError> {
            self.events_after(tenant_id, after, limit).await
        }

        async fn claim_webhook_deliveries(
            &self,
            owner: &str,
            now: OffsetDateTime,
            ttl: Duration,
            limit: u32,
            caps: InFlightCaps,
        ) -> Result<Vec<ClaimedDelivery>, StoreError> {
            self.claim_deliveries(owner, now, ttl, limit, caps).await
        }

        async fn finish_webhook_attempt(&self, a: &DeliveryAttempt) -> Result<bool, StoreError> {
            self.finish_attempt(a).await
        }

        async fn webhook_attempts(
            &self,
            tenant_id: Uuid,
            endpoint_id: Uuid,
            before: Option<i64>,
            limit: u32,
        ) -> Result<Vec<WebhookAttemptRow>, StoreError> {
            let rows: Vec<AttemptRowDb> = sqlx::query_as(ATTEMPTS)
                .bind(tenant_id)
                .bind(endpoint_id)
                .bind(i64::from(limit))
                .bind(before.unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(WebhookAttemptRow::from).collect())
        }

        async fn purge_webhook_events(
            &self,
            cutoff: OffsetDateTime,
            batch: u32,
        ) -> Result<u64, StoreError> {
            self.purge_rows(PURGE_EVENTS, cutoff, batch).await
        }
    }

    impl Driver {
        /// Writes the event of a message's status change (and its
        /// deliveries) inside the caller's transaction: `data` is the
        /// message as it is now.
        pub(crate) async fn enqueue_message_event(
            c: &mut Conn,
            message_id: Uuid,
            event_type: &str,
            at: OffsetDateTime,
        ) -> Result<(), StoreError> {
            let row: Option<MessageRow> = sqlx::query_as(MESSAGE)
                .bind(message_id)
                .fetch_optional(&mut *c)
                .await?;
            let Some(row) = row else {
                return Ok(());
            };
            let record = MessageRecord::from(row);
            let data = record.to_out().to_json();
            Driver::enqueue_event(c, record.tenant_id, event_type, Some(message_id), &data, at).await
        }
    }
}
