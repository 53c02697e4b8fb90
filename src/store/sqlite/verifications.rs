//! Verifications on SQLite. Each change is one job of the single writer
//! (`writer.rs`): it runs inside the writer's transaction, which holds the
//! file's write lock, so the per-hour counts, the pause decision and a
//! check's read-decide-write are exact across instances, and no verification
//! ever waits on the busy timeout. The caller's decisions (the code's HMAC,
//! the answer's JSON) come in as shared `'static` closures and run inside
//! the job.

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::time::{DbTime, db};
use crate::store::verification::{
    VerificationRow, apply_check, pause_window_start, start_limit, verification_columns,
};
use crate::store::{
    CheckOutcome, CheckRenderer, CodeMatcher, Lease, MessageRecord, NewMessage, NewVerification,
    OpKey, ResendOutcome, ResendRenderer, SendBuilder, StartOutcome, StartPolicy, StoreError,
    StoredOp, StoredResponse, VerificationRecord, VerificationStore,
};
use crate::verify::decide::{self, VerificationStatus};

use sqlx::SqliteConnection;

/// A count as an `INTEGER` column.
fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Inserts a verification's message, its first attempt started and leased,
/// in the caller's transaction; returns the claimed record.
async fn insert_message(
    c: &mut SqliteConnection,
    m: &NewMessage,
    lease: &Lease,
) -> Result<MessageRecord, StoreError> {
    // The lease runs on the database's clock, as in messages.rs.
    let lease_expires_at: DbTime = sqlx::query_scalar(
        "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
            to_number, from_sender, body, segments, encoding, metadata, \
            validity_seconds, provider, attempts, lease_token, lease_owner, \
            lease_expires_at, created_at, updated_at, expires_at, deadline_at) \
         VALUES (?1, ?2, ?3, ?4, 'processing', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 1, \
            ?13, ?14, CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?15, ?16, ?16, ?17, ?18) \
         RETURNING lease_expires_at",
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
    .bind(crate::store::time::micros(lease.ttl))
    .bind(db(m.created_at))
    .bind(m.expires_at.map(db))
    .bind(db(m.deadline_at))
    .fetch_one(&mut *c)
    .await?;
    sqlx::query(
        "INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
         VALUES (?1, 1, ?2, ?3, ?4)",
    )
    .bind(m.id.0)
    .bind(&lease.owner)
    .bind(db(m.created_at))
    .bind(&m.sender)
    .execute(&mut *c)
    .await?;
    let opted_out: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM opt_outs WHERE tenant_id = ?1 AND number = ?2)",
    )
    .bind(m.tenant_id)
    .bind(&m.to)
    .fetch_one(&mut *c)
    .await?;
    Ok(MessageRecord::claimed(
        m,
        lease,
        lease_expires_at.0,
        opted_out,
    ))
}

async fn locked(
    c: &mut SqliteConnection,
    tenant_id: Uuid,
    id: Uuid,
) -> Result<Option<VerificationRecord>, StoreError> {
    let row: Option<VerificationRow> = sqlx::query_as(concat!(
        "SELECT ",
        verification_columns!(),
        " FROM verifications WHERE id = ?1 AND tenant_id = ?2"
    ))
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(&mut *c)
    .await?;
    row.map(VerificationRecord::try_from).transpose()
}

async fn stored_op(
    c: &mut SqliteConnection,
    id: Uuid,
    kind: &str,
    key: &str,
) -> Result<Option<StoredOp>, StoreError> {
    let row: Option<(Vec<u8>, i16, Vec<u8>)> = sqlx::query_as(
        "SELECT fingerprint, response_code, response_body FROM verification_ops \
         WHERE verification_id = ?1 AND kind = ?2 AND idempotency_key = ?3",
    )
    .bind(id)
    .bind(kind)
    .bind(key)
    .fetch_optional(&mut *c)
    .await?;
    Ok(row.map(|(fingerprint, code, body)| StoredOp {
        fingerprint,
        response: StoredResponse {
            status_code: u16::try_from(code).unwrap_or(200),
            body,
        },
    }))
}

async fn store_op(
    c: &mut SqliteConnection,
    id: Uuid,
    kind: &str,
    op: OpKey<'_>,
    response: &StoredResponse,
    now: OffsetDateTime,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO verification_ops (verification_id, kind, idempotency_key, fingerprint, \
            response_code, response_body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .bind(id)
    .bind(kind)
    .bind(op.key)
    .bind(op.fingerprint)
    .bind(i16::try_from(response.status_code).unwrap_or(200))
    .bind(&response.body)
    .bind(db(now))
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Writes a locked verification's state; a move out of `pending` writes its
/// webhook event in the same transaction.
async fn write_state(c: &mut SqliteConnection, rec: &VerificationRecord) -> Result<(), StoreError> {
    let before: Option<String> =
        sqlx::query_scalar("SELECT status FROM verifications WHERE id = ?")
            .bind(rec.id)
            .fetch_optional(&mut *c)
            .await?;
    sqlx::query(
        "UPDATE verifications SET status = ?2, checks_remaining = ?3, approved_at = ?4, \
            sends = ?5, last_sent_at = ?6, updated_at = ?7 WHERE id = ?1",
    )
    .bind(rec.id)
    .bind(rec.status.as_str())
    .bind(to_i32(rec.checks_remaining))
    .bind(rec.approved_at.map(db))
    .bind(to_i32(rec.sends))
    .bind(db(rec.last_sent_at))
    .bind(db(rec.updated_at))
    .execute(&mut *c)
    .await?;
    if before.as_deref() == Some("pending") && rec.status != VerificationStatus::Pending {
        let (event_type, data) = crate::store::webhooks::verification_event(rec);
        super::webhooks::enqueue_event(c, rec.tenant_id, &event_type, None, &data, rec.updated_at)
            .await?;
    }
    Ok(())
}

/// A start, inside the writer's transaction.
async fn start(
    c: &mut SqliteConnection,
    v: &NewVerification,
    message: &NewMessage,
    lease: &Lease,
    policy: &StartPolicy,
) -> Result<StartOutcome, StoreError> {
    let now = v.created_at;
    let existing: Option<VerificationRow> = sqlx::query_as(concat!(
        "SELECT ",
        verification_columns!(),
        " FROM verifications WHERE tenant_id = ?1 AND idempotency_key = ?2"
    ))
    .bind(v.tenant_id)
    .bind(&v.idempotency_key)
    .fetch_optional(&mut *c)
    .await?;
    if let Some(row) = existing {
        return Ok(StartOutcome::Existing(Box::new(row.try_into()?)));
    }
    let pause: Option<DbTime> = sqlx::query_scalar(
        "SELECT paused_until FROM verify_pauses WHERE tenant_id = ?1 AND prefix = ?2",
    )
    .bind(v.tenant_id)
    .bind(&v.prefix)
    .fetch_optional(&mut *c)
    .await?;
    let pause = pause.map(|t| t.0);
    if let Some(until) = pause.filter(|t| *t > now) {
        return Ok(StartOutcome::Paused {
            until,
            newly: false,
        });
    }
    let (approved, concluded): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(CASE WHEN status = 'approved' THEN 1 ELSE 0 END), 0), \
            COALESCE(SUM(CASE WHEN status IN ('approved', 'max_attempts_reached', 'expired') \
                OR (status = 'pending' AND expires_at <= ?4) THEN 1 ELSE 0 END), 0) \
         FROM verifications WHERE tenant_id = ?1 AND prefix = ?2 AND created_at > ?3",
    )
    .bind(v.tenant_id)
    .bind(&v.prefix)
    .bind(db(pause_window_start(policy, pause, now)))
    .bind(db(now))
    .fetch_one(&mut *c)
    .await?;
    if decide::should_pause(
        policy.pause,
        u64::try_from(approved).unwrap_or(0),
        u64::try_from(concluded).unwrap_or(0),
    ) {
        let until = now + policy.pause_for;
        sqlx::query(
            "INSERT INTO verify_pauses (tenant_id, prefix, paused_until) VALUES (?1, ?2, ?3) \
             ON CONFLICT (tenant_id, prefix) DO UPDATE SET paused_until = excluded.paused_until",
        )
        .bind(v.tenant_id)
        .bind(&v.prefix)
        .bind(db(until))
        .execute(&mut *c)
        .await?;
        return Ok(StartOutcome::Paused { until, newly: true });
    }
    let hour_ago = db(now - time::Duration::HOUR);
    let number: (i64, Option<DbTime>) = sqlx::query_as(
        "SELECT count(*), min(created_at) FROM verifications \
         WHERE tenant_id = ?1 AND to_number = ?2 AND created_at > ?3",
    )
    .bind(v.tenant_id)
    .bind(&v.to)
    .bind(hour_ago)
    .fetch_one(&mut *c)
    .await?;
    let prefix: (i64, Option<DbTime>) = sqlx::query_as(
        "SELECT count(*), min(created_at) FROM verifications \
         WHERE tenant_id = ?1 AND prefix = ?2 AND created_at > ?3",
    )
    .bind(v.tenant_id)
    .bind(&v.prefix)
    .bind(hour_ago)
    .fetch_one(&mut *c)
    .await?;
    if let Some(limited) = start_limit(
        policy,
        (number.0, number.1.map(|t| t.0)),
        (prefix.0, prefix.1.map(|t| t.0)),
        now,
    ) {
        return Ok(limited);
    }
    sqlx::query(
        "INSERT INTO verifications (id, tenant_id, idempotency_key, fingerprint, status, \
            to_number, country, prefix, code_length, code_mac, code_sealed, template, sends, \
            checks_remaining, created_at, expires_at, last_sent_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6, ?7, ?8, ?9, ?10, ?11, 1, ?12, ?13, ?14, \
            ?13, ?13)",
    )
    .bind(v.id)
    .bind(v.tenant_id)
    .bind(&v.idempotency_key)
    .bind(&v.fingerprint)
    .bind(&v.to)
    .bind(&v.country)
    .bind(&v.prefix)
    .bind(to_i32(v.code_length))
    .bind(&v.code_mac)
    .bind(&v.code_sealed)
    .bind(&v.template)
    .bind(to_i32(v.checks_remaining))
    .bind(db(v.created_at))
    .bind(db(v.expires_at))
    .execute(&mut *c)
    .await?;
    let message = insert_message(c, message, lease).await?;
    Ok(StartOutcome::Created {
        verification: Box::new(VerificationRecord::started(v)),
        message: Box::new(message),
    })
}

#[async_trait]
impl VerificationStore for SqliteStore {
    async fn verify_secret(&self, candidate: &[u8]) -> Result<Vec<u8>, StoreError> {
        let candidate = candidate.to_vec();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO verify_secrets (name, secret, created_at) \
                     VALUES ('verify', ?1, ?2) ON CONFLICT (name) DO NOTHING",
                )
                .bind(&candidate)
                .bind(db(OffsetDateTime::now_utc()))
                .execute(&mut *c)
                .await?;
                let secret: Vec<u8> =
                    sqlx::query_scalar("SELECT secret FROM verify_secrets WHERE name = 'verify'")
                        .fetch_one(&mut *c)
                        .await?;
                Ok(secret)
            })
        })
        .await
    }

    #[tracing::instrument(name = "store.start_verification", level = "debug", skip_all)]
    async fn start_verification(
        &self,
        v: &NewVerification,
        message: &NewMessage,
        lease: &Lease,
        policy: &StartPolicy,
    ) -> Result<StartOutcome, StoreError> {
        let (v, message, lease, policy) = (v.clone(), message.clone(), lease.clone(), *policy);
        self.write(move |c| Box::pin(async move { start(c, &v, &message, &lease, &policy).await }))
            .await
    }

    async fn verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<VerificationRecord>, StoreError> {
        let row: Option<VerificationRow> = sqlx::query_as(concat!(
            "SELECT ",
            verification_columns!(),
            " FROM verifications WHERE id = ?1 AND tenant_id = ?2"
        ))
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(VerificationRecord::try_from).transpose()
    }

    async fn resend_answered(&self, id: Uuid, key: &str) -> Result<bool, StoreError> {
        let mut c = self.pool.acquire().await?;
        Ok(stored_op(&mut c, id, "resend", key).await?.is_some())
    }

    #[tracing::instrument(name = "store.check_verification", level = "debug", skip_all)]
    async fn check_verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        op: Option<OpKey<'_>>,
        now: OffsetDateTime,
        matches: CodeMatcher,
        render: CheckRenderer,
    ) -> Result<CheckOutcome, StoreError> {
        let op = op.map(|o| (o.key.to_owned(), o.fingerprint.to_vec()));
        self.write(move |c| {
            Box::pin(async move {
                let Some(mut rec) = locked(c, tenant_id, id).await? else {
                    return Ok(CheckOutcome::NotFound);
                };
                if let Some((key, _)) = &op
                    && let Some(stored) = stored_op(c, id, "check", key).await?
                {
                    return Ok(CheckOutcome::Replay(stored));
                }
                let decision = decide::check(&rec.state(), now, matches(&rec));
                apply_check(&mut rec, decision, now);
                let response = match decision {
                    decide::Check::Approve
                    | decide::Check::Wrong { .. }
                    | decide::Check::LastWrong => Some(StoredResponse {
                        status_code: 200,
                        body: render(&rec, decision == decide::Check::Approve),
                    }),
                    decide::Check::Expire | decide::Check::NotPending(_) => None,
                };
                if !matches!(decision, decide::Check::NotPending(_)) {
                    write_state(c, &rec).await?;
                }
                if let (Some((key, fingerprint)), Some(response)) = (&op, &response) {
                    let op = OpKey { key, fingerprint };
                    store_op(c, id, "check", op, response, now).await?;
                }
                Ok(CheckOutcome::Done {
                    verification: Box::new(rec),
                    decision,
                    response,
                })
            })
        })
        .await
    }

    #[tracing::instrument(name = "store.resend_verification", level = "debug", skip_all)]
    async fn resend_verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        op: OpKey<'_>,
        now: OffsetDateTime,
        rules: (std::time::Duration, u32),
        build: SendBuilder,
        lease: &Lease,
        render: ResendRenderer,
    ) -> Result<ResendOutcome, StoreError> {
        let (key, fingerprint) = (op.key.to_owned(), op.fingerprint.to_vec());
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                let Some(mut rec) = locked(c, tenant_id, id).await? else {
                    return Ok(ResendOutcome::NotFound);
                };
                if let Some(stored) = stored_op(c, id, "resend", &key).await? {
                    return Ok(ResendOutcome::Replay(stored));
                }
                let decision = decide::resend(&rec.state(), now, rules.0, rules.1);
                match decision {
                    decide::Resend::Send => {}
                    decide::Resend::Expire => {
                        rec.status = VerificationStatus::Expired;
                        rec.updated_at = now;
                        write_state(c, &rec).await?;
                        return Ok(ResendOutcome::Refused {
                            verification: Box::new(rec),
                            decision,
                        });
                    }
                    _ => {
                        return Ok(ResendOutcome::Refused {
                            verification: Box::new(rec),
                            decision,
                        });
                    }
                }
                let m = build(&rec).ok_or(StoreError::Invariant(
                    "a verification's code does not open with the verify secret",
                ))?;
                rec.sends += 1;
                rec.last_sent_at = now;
                rec.updated_at = now;
                write_state(c, &rec).await?;
                let message = insert_message(c, &m, &lease).await?;
                let response = StoredResponse {
                    status_code: 201,
                    body: render(&rec, &message),
                };
                let op = OpKey {
                    key: &key,
                    fingerprint: &fingerprint,
                };
                store_op(c, id, "resend", op, &response, now).await?;
                Ok(ResendOutcome::Sent {
                    verification: Box::new(rec),
                    message: Box::new(message),
                    response,
                })
            })
        })
        .await
    }

    async fn expire_verifications(
        &self,
        now: OffsetDateTime,
        batch: u32,
    ) -> Result<Vec<VerificationRecord>, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let rows: Vec<VerificationRow> = sqlx::query_as(concat!(
                    "UPDATE verifications SET status = 'expired', updated_at = ?1 WHERE id IN ( \
                        SELECT id FROM verifications WHERE status = 'pending' \
                        AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2) RETURNING ",
                    verification_columns!()
                ))
                .bind(db(now))
                .bind(i64::from(batch))
                .fetch_all(&mut *c)
                .await?;
                let expired = rows
                    .into_iter()
                    .map(VerificationRecord::try_from)
                    .collect::<Result<Vec<_>, _>>()?;
                for rec in &expired {
                    let (event_type, data) = crate::store::webhooks::verification_event(rec);
                    super::webhooks::enqueue_event(c, rec.tenant_id, &event_type, None, &data, now)
                        .await?;
                }
                Ok(expired)
            })
        })
        .await
    }

    async fn purge_verifications(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "DELETE FROM verifications WHERE id IN ( \
                        SELECT id FROM verifications WHERE expires_at < ?1 \
                        ORDER BY expires_at LIMIT ?2)",
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

    async fn cancel_verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Option<VerificationRecord>, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE verifications SET status = 'canceled', updated_at = ?3 \
                     WHERE id = ?1 AND tenant_id = ?2 AND status = 'pending' AND expires_at > ?3",
                )
                .bind(id)
                .bind(tenant_id)
                .bind(db(now))
                .execute(&mut *c)
                .await?;
                // The webhook event, in the transaction of the change.
                if done.rows_affected() == 1
                    && let Some(rec) = locked(c, tenant_id, id).await?
                {
                    let (event_type, data) = crate::store::webhooks::verification_event(&rec);
                    super::webhooks::enqueue_event(c, tenant_id, &event_type, None, &data, now)
                        .await?;
                }
                Ok(())
            })
        })
        .await?;
        self.verification(tenant_id, id).await
    }
}
