//! Messages, attempts and leases on SQLite.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqliteConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::domain::{AttemptOutcome, MessageId};
use crate::store::row::{KeyStateRow, MessageRow, key_state_columns, message_columns};
use crate::store::time::{DbTime, db, micros};
use crate::store::{
    AttemptResult, Claim, Finish, Lease, MessageReadStore, MessageRecord, MessageStore, NewMessage,
    Queued, Reschedule, StoreError, StoredResponse,
};

/// Closes an open attempt with its result (inside the caller's transaction).
async fn close_attempt(
    tx: &mut SqliteConnection,
    id: MessageId,
    a: &AttemptResult,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE attempts SET finished_at = ?, outcome = ?, http_status = ?, provider_code = ?, \
         error = ?, provider_message_id = ? \
         WHERE message_id = ? AND number = ? AND finished_at IS NULL",
    )
    .bind(db(a.finished_at))
    .bind(a.outcome)
    .bind(a.http_status.map(i64::from))
    .bind(&a.provider_code)
    .bind(&a.error)
    .bind(&a.provider_message_id)
    .bind(id.0)
    .bind(i64::from(a.number))
    .execute(tx)
    .await?;
    Ok(())
}

async fn insert(
    c: &mut SqliteConnection,
    m: &NewMessage,
    lease: &Lease,
) -> Result<Claim, StoreError> {
    // The opt-out check comes back with the insert (one round trip to
    // SQLite's worker thread fewer).
    let inserted: Option<(DbTime, bool)> = sqlx::query_as(concat!(
        "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
                provider, attempts, lease_token, lease_owner, lease_expires_at, created_at, \
                updated_at, expires_at, deadline_at, route, cost_micros, cost_currency, \
                route_order) \
             VALUES (?, ?, ?, ?, 'processing', ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ",
        db_now!(),
        " + ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
             RETURNING lease_expires_at, \
                EXISTS (SELECT 1 FROM opt_outs o \
                        WHERE o.tenant_id = messages.tenant_id AND o.number = messages.to_number)",
    ))
    .bind(m.id.0)
    .bind(m.tenant_id)
    .bind(&m.idempotency_key)
    .bind(&m.fingerprint)
    .bind(&m.to)
    .bind(&m.from)
    .bind(&m.body)
    .bind(i64::from(m.segments))
    .bind(m.encoding)
    .bind(Json(&m.metadata))
    .bind(m.validity_seconds)
    .bind(&m.provider)
    .bind(lease.token)
    .bind(&lease.owner)
    .bind(micros(lease.ttl))
    .bind(db(m.created_at))
    .bind(db(m.created_at))
    .bind(m.expires_at.map(db))
    .bind(db(m.deadline_at))
    .bind(&m.route)
    .bind(m.cost_columns().0)
    .bind(m.cost_columns().1)
    .bind(&m.route_order)
    .fetch_optional(&mut *c)
    .await?;
    if let Some((lease_expires_at, opted_out)) = inserted {
        sqlx::query(
            "INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
                 VALUES (?, 1, ?, ?, ?)",
        )
        .bind(m.id.0)
        .bind(&lease.owner)
        .bind(db(m.created_at))
        .bind(&m.sender)
        .execute(&mut *c)
        .await?;
        return Ok(Claim::Created(Box::new(MessageRecord::claimed(
            m,
            lease,
            lease_expires_at.0,
            opted_out,
        ))));
    }
    // In the writer's transaction the taken key's row is there to read.
    let row: Option<KeyStateRow> = sqlx::query_as(concat!(
        "SELECT ",
        key_state_columns!(),
        " FROM messages WHERE tenant_id = ? AND idempotency_key = ?"
    ))
    .bind(m.tenant_id)
    .bind(&m.idempotency_key)
    .fetch_optional(&mut *c)
    .await?;
    row.map(|row| Claim::Existing(row.into()))
        .ok_or(StoreError::Invariant("a taken key without its row"))
}

async fn start_attempt(
    c: &mut SqliteConnection,
    id: MessageId,
    lease: &Lease,
    now: OffsetDateTime,
    sender: Option<&str>,
) -> Result<Option<u32>, StoreError> {
    let number: Option<i64> = sqlx::query_scalar(concat!(
        "UPDATE messages SET attempts = attempts + 1, lease_expires_at = ",
        db_now!(),
        " + ?, \
            next_attempt_at = NULL, updated_at = ?, \
            maybe_sent = maybe_sent OR EXISTS (SELECT 1 FROM attempts o \
                WHERE o.message_id = messages.id AND o.finished_at IS NULL) \
         WHERE id = ? AND lease_token = ? AND status = 'processing' RETURNING attempts",
    ))
    .bind(micros(lease.ttl))
    .bind(db(now))
    .bind(id.0)
    .bind(lease.token)
    .fetch_optional(&mut *c)
    .await?;
    let Some(number) = number else {
        return Ok(None);
    };
    sqlx::query(
        "UPDATE attempts SET finished_at = ?, outcome = ?, \
            error = 'the instance making this attempt stopped before recording an answer' \
         WHERE message_id = ? AND finished_at IS NULL",
    )
    .bind(db(now))
    .bind(AttemptOutcome::Lost)
    .bind(id.0)
    .execute(&mut *c)
    .await?;
    sqlx::query(
        "INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(id.0)
    .bind(number)
    .bind(&lease.owner)
    .bind(db(now))
    .bind(sender)
    .execute(&mut *c)
    .await?;
    Ok(Some(u32::try_from(number).unwrap_or(0)))
}

async fn renew_lease(
    c: &mut SqliteConnection,
    id: MessageId,
    lease: &Lease,
) -> Result<bool, StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE messages SET lease_expires_at = ",
        db_now!(),
        " + ? WHERE id = ? AND lease_token = ? AND status = 'processing'",
    ))
    .bind(micros(lease.ttl))
    .bind(id.0)
    .bind(lease.token)
    .execute(&mut *c)
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn finish(c: &mut SqliteConnection, f: &Finish) -> Result<bool, StoreError> {
    // Every statement is a round trip to SQLite's worker thread: the tenant
    // the event needs comes back with the write.
    let tenant_id: Option<Uuid> = sqlx::query_scalar(
        "UPDATE messages SET status = ?, provider_message_id = ?, error = ?, sent_at = ?, \
            updated_at = ?, finalized_at = ?, response_code = ?, response_body = ?, \
            lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
            next_attempt_at = NULL \
         WHERE id = ? AND lease_token = ? AND status = 'processing' \
         RETURNING tenant_id",
    )
    .bind(f.status)
    .bind(&f.provider_message_id)
    .bind(f.error.as_ref().map(Json))
    .bind(f.sent_at.map(db))
    .bind(db(f.updated_at))
    .bind(db(f.updated_at))
    .bind(i64::from(f.response.status_code))
    .bind(&f.response.body)
    .bind(f.id.0)
    .bind(f.lease_token)
    .fetch_optional(&mut *c)
    .await?;
    let Some(tenant_id) = tenant_id else {
        return Ok(false);
    };
    if let Some(a) = &f.attempt {
        close_attempt(c, f.id, a).await?;
    }
    if let Some(address) = &f.opt_out {
        sqlx::query(
            "INSERT INTO opt_outs (tenant_id, number, source, created_at) \
             SELECT id, ?1, 'provider', ?2 FROM tenants WHERE id = ?3 OR ?1 NOT LIKE '+%' \
             ON CONFLICT (tenant_id, number) DO NOTHING",
        )
        .bind(address)
        .bind(db(f.updated_at))
        .bind(tenant_id)
        .execute(&mut *c)
        .await?;
    }
    // The outbox row, in the same transaction as the final write.
    super::webhooks::enqueue_event(
        c,
        tenant_id,
        &format!("message.{}", f.status.as_str()),
        Some(f.id.0),
        &f.response.body,
        f.updated_at,
    )
    .await?;
    Ok(true)
}

async fn reschedule(c: &mut SqliteConnection, r: &Reschedule) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE messages SET next_attempt_at = ?, updated_at = ?, error = ?, \
            lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
            maybe_sent = maybe_sent OR ? \
         WHERE id = ? AND lease_token = ? AND status = 'processing'",
    )
    .bind(db(r.next_attempt_at))
    .bind(db(r.updated_at))
    .bind(r.error.as_ref().map(Json))
    // No attempt to close: it stays open, and the message may have been sent.
    .bind(r.attempt.as_ref().is_none_or(|a| a.outcome.maybe_sent()))
    .bind(r.id.0)
    .bind(r.lease_token)
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    if let Some(a) = &r.attempt {
        close_attempt(c, r.id, a).await?;
    }
    Ok(true)
}

async fn claim_due(
    c: &mut SqliteConnection,
    owner: &str,
    now: OffsetDateTime,
    ttl: Duration,
    limit: u32,
    written: crate::clock::Stamp,
) -> Result<Vec<(MessageRecord, Lease)>, StoreError> {
    // The writer's transaction (BEGIN IMMEDIATE, the file's write lock) makes this
    // claim exclusive, against another process on the file too.
    // Due times are the caller's clock (`now`); lease expiry is the
    // database's only.
    let ids: Vec<Uuid> = sqlx::query_scalar(concat!(
        "SELECT id FROM messages \
         WHERE (status = 'processing' \
                AND ((lease_token IS NULL AND next_attempt_at <= ?) OR lease_expires_at <= ",
        db_now!(),
        ")) OR (status = 'scheduled' AND next_attempt_at <= ?) \
         ORDER BY COALESCE(next_attempt_at, lease_expires_at) LIMIT ?",
    ))
    .bind(db(now))
    .bind(db(now))
    .bind(i64::from(limit))
    .fetch_all(&mut *c)
    .await?;
    let mut claimed = Vec::with_capacity(ids.len());
    for id in ids {
        let lease = Lease {
            token: Uuid::new_v4(),
            owner: owner.to_string(),
            ttl,
            written,
        };
        sqlx::query(concat!(
            "UPDATE messages SET status = 'processing', lease_token = ?, lease_owner = ?, \
             lease_expires_at = ",
            db_now!(),
            " + ? WHERE id = ?",
        ))
        .bind(lease.token)
        .bind(&lease.owner)
        .bind(micros(lease.ttl))
        .bind(id)
        .execute(&mut *c)
        .await?;
        let row: MessageRow = sqlx::query_as(concat!(
            "SELECT ",
            message_columns!(),
            " FROM messages m WHERE m.id = ?"
        ))
        .bind(id)
        .fetch_one(&mut *c)
        .await?;
        claimed.push((MessageRecord::from(row), lease));
    }
    Ok(claimed)
}

#[async_trait]
impl MessageStore for SqliteStore {
    #[tracing::instrument(name = "store.insert_message", level = "debug", skip_all, fields(message_id = %m.id))]
    async fn insert_message(&self, m: &NewMessage, lease: &Lease) -> Result<Claim, StoreError> {
        // A replay is answered by a reader, without queueing for the writer.
        if let Some(state) = self
            .key_state(m.tenant_id, m.idempotency_key.as_str())
            .await?
        {
            return Ok(Claim::Existing(state));
        }
        let (m, lease) = (m.clone(), lease.clone());
        self.write(move |c| Box::pin(async move { insert(c, &m, &lease).await }))
            .await
    }

    async fn schedule_message(
        &self,
        m: &NewMessage,
        due: OffsetDateTime,
        send_at: Option<OffsetDateTime>,
    ) -> Result<Claim, StoreError> {
        self.schedule_one(m, due, send_at).await
    }

    async fn insert_batch(&self, items: &[Queued]) -> Result<Vec<Claim>, StoreError> {
        self.insert_queued(items).await
    }

    async fn cancel_message(
        &self,
        id: MessageId,
        attempts: u32,
        now: OffsetDateTime,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.cancel_one(id, attempts, now, response).await
    }

    #[tracing::instrument(name = "store.start_attempt", level = "debug", skip_all, fields(message_id = %id))]
    async fn start_attempt(
        &self,
        id: MessageId,
        lease: &Lease,
        now: OffsetDateTime,
        sender: Option<&str>,
    ) -> Result<Option<u32>, StoreError> {
        let lease = lease.clone();
        let sender = sender.map(str::to_string);
        self.write(move |c| {
            Box::pin(async move { start_attempt(c, id, &lease, now, sender.as_deref()).await })
        })
        .await
    }

    #[tracing::instrument(name = "store.renew_lease", level = "debug", skip_all, fields(message_id = %id))]
    async fn renew_lease(&self, id: MessageId, lease: &Lease) -> Result<bool, StoreError> {
        let lease = lease.clone();
        self.write(move |c| Box::pin(async move { renew_lease(c, id, &lease).await }))
            .await
    }

    #[tracing::instrument(name = "store.finish", level = "debug", skip_all, fields(message_id = %f.id, status = f.status.as_str()))]
    async fn finish(&self, f: &Finish) -> Result<bool, StoreError> {
        let f = f.clone();
        self.write(move |c| Box::pin(async move { finish(c, &f).await }))
            .await
    }

    #[tracing::instrument(name = "store.reschedule", level = "debug", skip_all, fields(message_id = %r.id))]
    async fn reschedule(&self, r: &Reschedule) -> Result<bool, StoreError> {
        let r = r.clone();
        self.write(move |c| Box::pin(async move { reschedule(c, &r).await }))
            .await
    }

    #[tracing::instrument(name = "store.claim_due", level = "debug", skip_all, fields(limit = limit))]
    async fn claim_due(
        &self,
        owner: &str,
        now: OffsetDateTime,
        ttl: Duration,
        limit: u32,
    ) -> Result<Vec<(MessageRecord, Lease)>, StoreError> {
        let written = crate::clock::Stamp::now();
        let owner = owner.to_string();
        self.write(move |c| {
            Box::pin(async move { claim_due(c, &owner, now, ttl, limit, written).await })
        })
        .await
    }
}
