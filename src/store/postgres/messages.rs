//! Messages, attempts and leases on Postgres.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::webhooks::EVENT_FROM_M;
use super::{PgStore, to_i32};
use crate::domain::{MessageId, Status};
use crate::store::row::{MessageRow, message_columns, stored_response};
use crate::store::time::{DbTime, db, micros};
use crate::store::{
    Claim, Finish, KeyState, Lease, MessageReadStore, MessageRecord, MessageStore, NewMessage,
    Queued, Reschedule, StoreError, StoredResponse,
};

/// What the insert statement returns: the new message, or the key's holder.
#[derive(sqlx::FromRow)]
struct InsertRow {
    created: bool,
    id: Uuid,
    fingerprint: Option<Vec<u8>>,
    status: Option<Status>,
    response_code: Option<i16>,
    response_body: Option<Vec<u8>>,
    opted_out: bool,
    lease_expires_at: Option<DbTime>,
}

impl PgStore {
    /// The claiming insert of one message (a batch of one, and a batch
    /// row that must go alone).
    #[tracing::instrument(name = "store.insert_message", level = "debug", skip_all, fields(message_id = %m.id))]
    pub(super) async fn insert_one(
        &self,
        m: &NewMessage,
        lease: &Lease,
    ) -> Result<Claim, StoreError> {
        // A key can be purged between our insert's conflict and our read;
        // then the insert is simply tried again.
        for _ in 0..3 {
            // A new key: the inserted id and whether the recipient opted
            // out. A taken key: that message's state, from the same
            // statement, unless it was committed after this statement's
            // snapshot (then the follow-up read below sees it).
            let row: Option<InsertRow> = sqlx::query_as(
                "WITH ins AS ( \
                    INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                        to_number, from_sender, body, segments, encoding, metadata, \
                        validity_seconds, provider, attempts, lease_token, lease_owner, \
                        lease_expires_at, created_at, updated_at, expires_at, deadline_at, route, \
                        cost_micros, cost_currency, route_order) \
                    VALUES ($1, $2, $3, $4, 'processing', $5, $6, $7, $8, $9, $10, $11, $12, 1, \
                        $13, $14, now() + $15 * interval '1 microsecond', $16, $16, $17, $18, $20, \
                        $21, $22, $23) \
                    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
                    RETURNING id, lease_expires_at), \
                 att AS ( \
                    INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
                    SELECT id, 1, $14, $16, $19 FROM ins) \
                 SELECT true AS created, ins.id, NULL::bytea AS fingerprint, \
                    NULL::text AS status, NULL::smallint AS response_code, \
                    NULL::bytea AS response_body, \
                    EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = $2 AND o.number = $5) \
                        AS opted_out, ins.lease_expires_at \
                 FROM ins \
                 UNION ALL \
                 SELECT false, m.id, m.fingerprint, m.status, m.response_code, m.response_body, \
                    false, NULL::timestamptz \
                 FROM messages m \
                 WHERE m.tenant_id = $2 AND m.idempotency_key = $3 \
                    AND NOT EXISTS (SELECT 1 FROM ins)",
            )
            .bind(m.id.0)
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .bind(&m.fingerprint)
            .bind(&m.to)
            .bind(&m.from)
            .bind(&m.body)
            .bind(to_i32(m.segments))
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
            .bind(&m.sender)
            .bind(&m.route)
            .bind(m.cost_columns().0)
            .bind(m.cost_columns().1)
            .bind(&m.route_order)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(row) = row {
                if row.created {
                    let expires_at = row
                        .lease_expires_at
                        .ok_or(StoreError::Invariant("a new message without its lease"))?;
                    return Ok(Claim::Created(Box::new(MessageRecord::claimed(
                        m,
                        lease,
                        expires_at.0,
                        row.opted_out,
                    ))));
                }
                let (Some(fingerprint), Some(status)) = (row.fingerprint, row.status) else {
                    return Err(StoreError::Invariant("a taken key's row without its state"));
                };
                return Ok(Claim::Existing(KeyState {
                    id: MessageId(row.id),
                    fingerprint,
                    status,
                    response: stored_response(row.response_code, row.response_body),
                }));
            }
            if let Some(state) = self
                .key_state(m.tenant_id, m.idempotency_key.as_str())
                .await?
            {
                return Ok(Claim::Existing(state));
            }
        }
        Err(StoreError::Invariant(
            "the key was taken and released three times in a row",
        ))
    }

    /// The insert of a `scheduled` message (not coalesced: off the hot
    /// path, and it takes no lease).
    #[tracing::instrument(name = "store.schedule_message", level = "debug", skip_all, fields(message_id = %m.id))]
    async fn schedule_one(
        &self,
        m: &NewMessage,
        due: OffsetDateTime,
        send_at: Option<OffsetDateTime>,
    ) -> Result<Claim, StoreError> {
        for _ in 0..3 {
            let row: Option<InsertRow> = sqlx::query_as(
                "WITH ins AS ( \
                    INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                        to_number, from_sender, body, segments, encoding, metadata, \
                        validity_seconds, provider, attempts, next_attempt_at, send_at, \
                        created_at, updated_at, expires_at, deadline_at, route, cost_micros, \
                        cost_currency, route_order) \
                    VALUES ($1, $2, $3, $4, 'scheduled', $5, $6, $7, $8, $9, $10, $11, $12, 0, \
                        $13, $14, $15, $15, $16, $17, $18, $19, $20, $21) \
                    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
                    RETURNING id) \
                 SELECT true AS created, ins.id, NULL::bytea AS fingerprint, \
                    NULL::text AS status, NULL::smallint AS response_code, \
                    NULL::bytea AS response_body, false AS opted_out, \
                    NULL::timestamptz AS lease_expires_at \
                 FROM ins \
                 UNION ALL \
                 SELECT false, m.id, m.fingerprint, m.status, m.response_code, m.response_body, \
                    false, NULL::timestamptz \
                 FROM messages m \
                 WHERE m.tenant_id = $2 AND m.idempotency_key = $3 \
                    AND NOT EXISTS (SELECT 1 FROM ins)",
            )
            .bind(m.id.0)
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .bind(&m.fingerprint)
            .bind(&m.to)
            .bind(&m.from)
            .bind(&m.body)
            .bind(to_i32(m.segments))
            .bind(m.encoding)
            .bind(Json(&m.metadata))
            .bind(m.validity_seconds)
            .bind(&m.provider)
            .bind(db(due))
            .bind(send_at.map(db))
            .bind(db(m.created_at))
            .bind(m.expires_at.map(db))
            .bind(db(m.deadline_at))
            .bind(&m.route)
            .bind(m.cost_columns().0)
            .bind(m.cost_columns().1)
            .bind(&m.route_order)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(row) = row {
                if row.created {
                    return Ok(Claim::Created(Box::new(MessageRecord::scheduled(
                        m, due, send_at,
                    ))));
                }
                let (Some(fingerprint), Some(status)) = (row.fingerprint, row.status) else {
                    return Err(StoreError::Invariant("a taken key's row without its state"));
                };
                return Ok(Claim::Existing(KeyState {
                    id: MessageId(row.id),
                    fingerprint,
                    status,
                    response: stored_response(row.response_code, row.response_body),
                }));
            }
            if let Some(state) = self
                .key_state(m.tenant_id, m.idempotency_key.as_str())
                .await?
            {
                return Ok(Claim::Existing(state));
            }
        }
        Err(StoreError::Invariant(
            "the key was taken and released three times in a row",
        ))
    }

    /// The fenced final write of one message. Every fenced write tests the
    /// status as `status || ''`, an expression no partial index matches: see
    /// `batch.rs`, `finish_statement`.
    #[tracing::instrument(name = "store.finish", level = "debug", skip_all, fields(message_id = %f.id, status = f.status.as_str()))]
    pub(super) async fn finish_one(&self, f: &Finish) -> Result<bool, StoreError> {
        let a = f.attempt.as_ref();
        // The outbox row is written by this same statement (`EVENT_FROM_M`).
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH m AS ( \
                UPDATE messages SET status = $3, provider_message_id = $4, error = $5, \
                    sent_at = $6, updated_at = $7, finalized_at = $7, response_code = $8, \
                    response_body = $9, lease_token = NULL, lease_owner = NULL, \
                    lease_expires_at = NULL, next_attempt_at = NULL \
                WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing' \
                RETURNING id, tenant_id, status, response_body, updated_at), \
             a AS ( \
                UPDATE attempts SET finished_at = $11, outcome = $12, http_status = $13, \
                    provider_code = $14, error = $15, provider_message_id = $16 \
                WHERE message_id = (SELECT id FROM m) AND number = $10 AND finished_at IS NULL), \
             o AS ( \
                INSERT INTO opt_outs (tenant_id, number, source, created_at) \
                SELECT t.id, $17::text, 'provider', $7 FROM m JOIN tenants t \
                    ON t.id = m.tenant_id OR $17::text NOT LIKE '+%' \
                WHERE $17::text IS NOT NULL \
                ON CONFLICT (tenant_id, number) DO NOTHING), \
             {EVENT_FROM_M} \
             SELECT count(*) FROM m",
        )))
        .bind(f.id.0)
        .bind(f.lease_token)
        .bind(f.status)
        .bind(&f.provider_message_id)
        .bind(f.error.as_ref().map(Json))
        .bind(f.sent_at.map(db))
        .bind(db(f.updated_at))
        .bind(i16::try_from(f.response.status_code).unwrap_or(500))
        .bind(&f.response.body)
        .bind(a.map(|a| to_i32(a.number)).unwrap_or(-1))
        .bind(a.map(|a| db(a.finished_at)))
        .bind(a.map(|a| a.outcome))
        .bind(a.and_then(|a| a.http_status.map(i32::from)))
        .bind(a.and_then(|a| a.provider_code.clone()))
        .bind(a.and_then(|a| a.error.clone()))
        .bind(a.and_then(|a| a.provider_message_id.clone()))
        .bind(&f.opt_out)
        .fetch_one(&self.pool)
        .await?;
        Ok(n == 1)
    }
}

#[async_trait]
impl MessageStore for PgStore {
    /// Coalesced with concurrent claims (`batch.rs`).
    async fn insert_message(&self, m: &NewMessage, lease: &Lease) -> Result<Claim, StoreError> {
        self.lanes().claim.call((m.clone(), lease.clone())).await
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
        let number: Option<i32> = sqlx::query_scalar(
            "WITH m AS ( \
                UPDATE messages SET attempts = attempts + 1, \
                    lease_expires_at = now() + $3 * interval '1 microsecond', \
                    next_attempt_at = NULL, updated_at = $4, \
                    maybe_sent = maybe_sent OR EXISTS (SELECT 1 FROM attempts o \
                        WHERE o.message_id = $1 AND o.finished_at IS NULL) \
                WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing' \
                RETURNING id, attempts), \
             closed AS ( \
                UPDATE attempts SET finished_at = $4, outcome = $6, \
                    error = 'the instance making this attempt stopped before recording an answer' \
                WHERE message_id = (SELECT id FROM m) AND finished_at IS NULL), \
             a AS ( \
                INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
                SELECT id, attempts, $5, $4, $7 FROM m) \
             SELECT attempts FROM m",
        )
        .bind(id.0)
        .bind(lease.token)
        .bind(micros(lease.ttl))
        .bind(db(now))
        .bind(&lease.owner)
        .bind(crate::domain::AttemptOutcome::Lost)
        .bind(sender)
        .fetch_optional(&self.pool)
        .await?;
        Ok(number.map(|n| u32::try_from(n).unwrap_or(0)))
    }

    #[tracing::instrument(name = "store.renew_lease", level = "debug", skip_all, fields(message_id = %id))]
    async fn renew_lease(&self, id: MessageId, lease: &Lease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET lease_expires_at = now() + $3 * interval '1 microsecond' \
             WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing'",
        )
        .bind(id.0)
        .bind(lease.token)
        .bind(micros(lease.ttl))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Coalesced with concurrent final writes (`batch.rs`).
    async fn finish(&self, f: &Finish) -> Result<bool, StoreError> {
        self.lanes().finish.call(f.clone()).await
    }

    #[tracing::instrument(name = "store.reschedule", level = "debug", skip_all, fields(message_id = %r.id))]
    async fn reschedule(&self, r: &Reschedule) -> Result<bool, StoreError> {
        // No attempt to close: it stays open (asked about again later), and
        // the message may have been sent.
        let a = r.attempt.as_ref();
        let n: i64 = sqlx::query_scalar(
            "WITH m AS ( \
                UPDATE messages SET next_attempt_at = $3, updated_at = $4, error = $5, \
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                    maybe_sent = maybe_sent OR $13 \
                WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing' \
                RETURNING id), \
             a AS ( \
                UPDATE attempts SET finished_at = $7, outcome = $8, http_status = $9, \
                    provider_code = $10, error = $11, provider_message_id = $12 \
                WHERE message_id = (SELECT id FROM m) AND number = $6 AND finished_at IS NULL) \
             SELECT count(*) FROM m",
        )
        .bind(r.id.0)
        .bind(r.lease_token)
        .bind(db(r.next_attempt_at))
        .bind(db(r.updated_at))
        .bind(r.error.as_ref().map(Json))
        .bind(a.map_or(-1, |a| to_i32(a.number)))
        .bind(a.map(|a| db(a.finished_at)))
        .bind(a.map(|a| a.outcome))
        .bind(a.and_then(|a| a.http_status.map(i32::from)))
        .bind(a.and_then(|a| a.provider_code.clone()))
        .bind(a.and_then(|a| a.error.clone()))
        .bind(a.and_then(|a| a.provider_message_id.clone()))
        .bind(a.is_none_or(|a| a.outcome.maybe_sent()))
        .fetch_one(&self.pool)
        .await?;
        Ok(n == 1)
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
        // Due times are the callers' clock (`now`); lease expiry is the
        // database's (`now()`) only.
        // SKIP LOCKED: two claimers scanning at once never wait for, nor get,
        // the same row; the lock is held only for this statement.
        let rows: Vec<MessageRow> = sqlx::query_as(concat!(
            "UPDATE messages m SET status = 'processing', lease_token = gen_random_uuid(), \
                lease_owner = $1, lease_expires_at = now() + $3 * interval '1 microsecond' \
             WHERE m.id IN ( \
                SELECT id FROM messages \
                WHERE (status = 'processing' \
                       AND ((lease_token IS NULL AND next_attempt_at <= $2) \
                            OR lease_expires_at <= now())) \
                   OR (status = 'scheduled' AND next_attempt_at <= $2) \
                ORDER BY COALESCE(next_attempt_at, lease_expires_at) \
                LIMIT $4 FOR UPDATE SKIP LOCKED) \
             RETURNING ",
            message_columns!()
        ))
        .bind(owner)
        .bind(db(now))
        .bind(micros(ttl))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|row| {
                let record = MessageRecord::from(row);
                let held = record
                    .lease
                    .as_ref()
                    .ok_or(StoreError::Invariant("claimed row without a lease"))?;
                let lease = Lease {
                    token: held.token,
                    owner: held.owner.clone(),
                    ttl,
                    written,
                };
                Ok((record, lease))
            })
            .collect()
    }
}
