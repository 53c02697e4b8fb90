//! Messages, attempts and leases on SQLite.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqliteConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use super::writer::{Headed, Savepoint, headed};
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

/// A claim in one round trip to SQLite's worker thread: the job's savepoint
/// ([`headed!`]), the message's insert (the opt-out check comes back with
/// it) and its first attempt's open go as one query. The attempt is written
/// only where the message is there under its new id, that is, where this
/// insert took the key; the two share the job's savepoint, so neither stands
/// without the other. Parameters are numbered: sqlx binds `?N` by its number
/// in every statement of the query.
const CLAIM: Headed = headed!(concat!(
    "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
            to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
            provider, attempts, lease_token, lease_owner, lease_expires_at, created_at, \
            updated_at, expires_at, deadline_at, route, cost_micros, cost_currency, \
            route_order) \
         VALUES (?1, ?2, ?3, ?4, 'processing', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 1, ?13, \
            ?14, ",
    db_now!(),
    " + ?15, ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22) \
         ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
         RETURNING lease_expires_at, \
            EXISTS (SELECT 1 FROM opt_outs o \
                    WHERE o.tenant_id = messages.tenant_id AND o.number = messages.to_number); \
     INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
         SELECT ?1, 1, ?14, ?16, ?23 WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?1)",
));

async fn insert(
    c: &mut SqliteConnection,
    savepoint: Savepoint,
    m: &NewMessage,
    lease: &Lease,
) -> Result<Claim, StoreError> {
    let inserted: Vec<(DbTime, bool)> = sqlx::query_as(savepoint.head(&CLAIM))
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
        .bind(m.expires_at.map(db))
        .bind(db(m.deadline_at))
        .bind(&m.route)
        .bind(m.cost_columns().0)
        .bind(m.cost_columns().1)
        .bind(&m.route_order)
        .bind(&m.sender)
        .fetch_all(&mut *c)
        .await?;
    if let Some((lease_expires_at, opted_out)) = inserted.into_iter().next() {
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

/// A final write in one round trip to SQLite's worker thread: the job's
/// savepoint ([`headed!`]), the attempt's close, the outbox row and the
/// final write go as one query, each statement fenced on the lease. The
/// message's row is the fence and only the last statement changes it, so
/// the three see the same answer: all three write, or none does (and the
/// job's savepoint undoes the first two if the last fails). The attempt's
/// number is NULL when there is no attempt to close, and `number = NULL`
/// matches no row.
const FINISH: Headed = headed!(
    "UPDATE attempts SET finished_at = ?1, outcome = ?2, http_status = ?3, \
        provider_code = ?4, error = ?5, provider_message_id = ?6 \
     WHERE message_id = ?7 AND number = ?8 AND finished_at IS NULL \
        AND EXISTS (SELECT 1 FROM messages \
                    WHERE id = ?7 AND lease_token = ?9 AND status = 'processing'); \
     INSERT INTO webhook_events (id, tenant_id, type, message_id, data, created_at) \
        SELECT ?10, tenant_id, ?11, id, ?12, ?13 FROM messages \
        WHERE id = ?7 AND lease_token = ?9 AND status = 'processing'; \
     UPDATE messages SET status = ?14, provider_message_id = ?15, error = ?16, \
        sent_at = ?17, updated_at = ?13, finalized_at = ?13, response_code = ?18, \
        response_body = ?12, lease_token = NULL, lease_owner = NULL, \
        lease_expires_at = NULL, next_attempt_at = NULL \
     WHERE id = ?7 AND lease_token = ?9 AND status = 'processing' \
     RETURNING tenant_id"
);

async fn finish(
    c: &mut SqliteConnection,
    savepoint: Savepoint,
    f: &Finish,
) -> Result<bool, StoreError> {
    let (number, a) = match &f.attempt {
        Some(a) => (Some(i64::from(a.number)), Some(a)),
        None => (None, None),
    };
    let tenant_id: Vec<Uuid> = sqlx::query_scalar(savepoint.head(&FINISH))
        .bind(a.map(|a| db(a.finished_at)))
        .bind(a.map(|a| a.outcome))
        .bind(a.and_then(|a| a.http_status).map(i64::from))
        .bind(a.and_then(|a| a.provider_code.as_deref()))
        .bind(a.and_then(|a| a.error.as_deref()))
        .bind(a.and_then(|a| a.provider_message_id.as_deref()))
        .bind(f.id.0)
        .bind(number)
        .bind(f.lease_token)
        // The outbox row (its deliveries: the trigger `webhook_events_fan_out`).
        .bind(Uuid::now_v7())
        .bind(format!("message.{}", f.status.as_str()))
        .bind(&f.response.body)
        .bind(db(f.updated_at))
        .bind(f.status)
        .bind(&f.provider_message_id)
        .bind(f.error.as_ref().map(Json))
        .bind(f.sent_at.map(db))
        .bind(i64::from(f.response.status_code))
        .fetch_all(&mut *c)
        .await?;
    let Some(tenant_id) = tenant_id.into_iter().next() else {
        return Ok(false);
    };
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
        self.write_headed(move |c, sp| Box::pin(async move { insert(c, sp, &m, &lease).await }))
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
        self.write_headed(move |c, sp| Box::pin(async move { finish(c, sp, &f).await }))
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
