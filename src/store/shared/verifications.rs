//! Verifications: every transaction once for both backends, over a few
//! row primitives (the functions below, one SQL text each). What is each
//! backend's own stays with it: how starts to one destination prefix are
//! serialised (`Driver::lock_verify_prefix`: an advisory lock on Postgres,
//! nothing beyond the single writer on SQLite), the database's clock for a
//! lease (`db_now!()`) and the row lock of the expiry sweep
//! (`skip_locked!()`).
//!
//! A start decides its per-hour limits and pause inside its transaction
//! (they are counts only the transaction can read exactly). A check or a
//! resend is decided by its caller from the row as it read it, and written
//! here only if the row is still so ([`fenced_write`]): no caller's code
//! runs inside a transaction.

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{per_backend, to_i32};
use crate::domain::verification::{self as decide, VerificationStatus};
use crate::store::row::verifications::{OpRow, VerificationRow, verification_columns};
use crate::store::time::{DbTime, db, micros};
use crate::store::verification::{pause_window_start, start_limit};
use crate::store::{
    Changed, Lease, MessageRecord, NewFallback, NewMessage, NewVerification, OpKey, OpKind,
    StartOutcome, StartPolicy, StoreError, StoredOp, StoredResponse, VerificationRecord,
    VerificationStore, fallback_of,
};

const ENSURE_SECRET: &str = "INSERT INTO verify_secrets (name, secret, created_at) \
     VALUES ('verify', $1, $2) ON CONFLICT (name) DO NOTHING";

const SECRET: &str = "SELECT secret FROM verify_secrets WHERE name = 'verify'";

const BY_ID: &str = concat!(
    "SELECT ",
    verification_columns!(),
    " FROM verifications WHERE id = $1 AND tenant_id = $2"
);

const BY_KEY: &str = concat!(
    "SELECT ",
    verification_columns!(),
    " FROM verifications WHERE tenant_id = $1 AND idempotency_key = $2"
);

const PAUSE: &str = "SELECT paused_until FROM verify_pauses WHERE tenant_id = $1 AND prefix = $2";

/// Recent starts of one scope (`$2` in `column`): how many were approved,
/// and how many concluded (approved, failed, or expired whether written or
/// not).
macro_rules! approvals_by {
    ($column:literal) => {
        concat!(
            "SELECT \
                CAST(COALESCE(SUM(CASE WHEN status = 'approved' THEN 1 ELSE 0 END), 0) AS BIGINT), \
                CAST(COALESCE(SUM(CASE WHEN status IN ('approved', 'max_attempts_reached', 'expired') \
                    OR (status = 'pending' AND expires_at <= $4) THEN 1 ELSE 0 END), 0) AS BIGINT) \
             FROM verifications WHERE tenant_id = $1 AND ",
            $column,
            " = $2 AND created_at > $3"
        )
    };
}

/// A prefix's recent starts.
const APPROVALS: &str = approvals_by!("prefix");

/// A country's recent starts, all its prefixes together.
const COUNTRY_APPROVALS: &str = approvals_by!("country");

/// A country's pause is kept beside the prefixes' under this key and its
/// ISO code (`country:US`); a prefix always starts with `+`.
const COUNTRY_PAUSE: &str = "country:";

/// Where a start looks for a pause: the key of its `verify_pauses` row,
/// the statement counting its recent approvals with the value it binds,
/// and the rule that judges them.
struct PauseScope<'a> {
    tenant: Uuid,
    key: &'a str,
    approvals: &'static str,
    value: &'a str,
    rule: decide::PausePolicy,
}

const SET_PAUSE: &str = "INSERT INTO verify_pauses (tenant_id, prefix, paused_until) \
     VALUES ($1, $2, $3) \
     ON CONFLICT (tenant_id, prefix) DO UPDATE SET paused_until = excluded.paused_until";

const NUMBER_STARTS: &str = "SELECT count(*), min(created_at) FROM verifications \
     WHERE tenant_id = $1 AND to_number = $2 AND created_at > $3";

const PREFIX_STARTS: &str = "SELECT count(*), min(created_at) FROM verifications \
     WHERE tenant_id = $1 AND prefix = $2 AND created_at > $3";

const INSERT: &str = "INSERT INTO verifications (id, tenant_id, idempotency_key, fingerprint, \
        status, to_number, country, prefix, code_length, code_mac, code_sealed, template, \
        sends, checks_remaining, created_at, expires_at, last_sent_at, updated_at, channels, \
        fallback_after_seconds, fallback_after_list) \
     VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $9, $10, $11, 1, $12, $13, $14, \
        $13, $13, $15, $16, $17)";

const INSERT_ATTEMPT: &str = "INSERT INTO attempts (message_id, number, lease_owner, \
        started_at, sender) VALUES ($1, 1, $2, $3, $4)";

const INSERT_FALLBACK: &str = "INSERT INTO verification_fallbacks (verification_id, \
        send_number, tenant_id, message_id, due_at, state, updated_at, step) \
     VALUES ($1, $2, $3, $4, $5, 'waiting', $6, $7)";

/// A tenant's caps and home country, for a verification send's charge.
const TENANT_SPEND: &str = "SELECT spend_cap_daily_micros, spend_cap_monthly_micros, \
        spend_cap_international_daily, home_country FROM tenants WHERE id = $1";

type TenantSpend = (Option<i64>, Option<i64>, Option<i64>, Option<String>);

/// Whether the step's number is opted out: of every channel (the bare
/// number: an SMS STOP, the tenant's own list), or of this adapter's alone
/// (`<adapter>:<number>`, what a channel's own inbound route stores: a
/// WhatsApp STOP).
const OPTED_OUT: &str = "SELECT EXISTS (SELECT 1 FROM opt_outs WHERE tenant_id = $1 \
     AND number IN ($2, $3 || ':' || $2))";

const OP: &str = "SELECT fingerprint, response_code, response_body FROM verification_ops \
     WHERE verification_id = $1 AND kind = $2 AND idempotency_key = $3";

const INSERT_OP: &str = "INSERT INTO verification_ops (verification_id, kind, idempotency_key, \
        fingerprint, response_code, response_body, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// The change of a pending verification, fenced on what its decision read:
/// every change moves the status, the checks left or the sends.
const FENCED_WRITE: &str = "UPDATE verifications SET status = $5, checks_remaining = $6, \
        approved_at = $7, sends = $8, last_sent_at = $9, updated_at = $10 \
     WHERE id = $1 AND tenant_id = $2 AND status = 'pending' AND checks_remaining = $3 \
        AND sends = $4";

const CANCEL: &str = concat!(
    "UPDATE verifications SET status = 'canceled', updated_at = $3 \
     WHERE id = $1 AND tenant_id = $2 AND status = 'pending' AND expires_at > $3 RETURNING ",
    verification_columns!()
);

const PURGE: &str = "DELETE FROM verifications WHERE id IN ( \
        SELECT id FROM verifications WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)";

/// A check's or resend's answer to store with its change.
type OpAnswer = (OpKind, String, Vec<u8>, StoredResponse);

fn op_answer(kind: OpKind, (op, response): (OpKey<'_>, &StoredResponse)) -> OpAnswer {
    (
        kind,
        op.key.to_owned(),
        op.fingerprint.to_vec(),
        response.clone(),
    )
}

per_backend! {
    /// A verification's message, its first attempt started and leased
    /// (the lease on the database's clock, as in `messages.rs`).
    const INSERT_MESSAGE: &str = concat!(
        "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
            to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
            provider, attempts, lease_token, lease_owner, lease_expires_at, created_at, \
            updated_at, expires_at, deadline_at, route, verification_id, cost_micros, \
            cost_currency, route_order) \
         VALUES ($1, $2, $3, $4, 'processing', $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, \
            $14, ",
        db_now!(),
        " + $15",
        us!(),
        ", $16, $16, $17, $18, $19, $20, $21, $22, $23) RETURNING lease_expires_at"
    );

    /// Up to `$2` pending verifications past their expiry at `$1`, marked
    /// expired (Postgres passes over the rows a check holds).
    const EXPIRE: &str = concat!(
        "UPDATE verifications SET status = 'expired', updated_at = $1 WHERE id IN ( \
            SELECT id FROM verifications WHERE status = 'pending' AND expires_at <= $1 \
            ORDER BY expires_at LIMIT $2",
        skip_locked!(),
        ") RETURNING ",
        verification_columns!()
    );

    /// Inserts verification `verification_id`'s message and its first
    /// attempt, leased, with the fallback row of a Telegram send, and
    /// charges its cost to the tenant's spend counters (issue 41, finding
    /// 2): over a cap it is `Err(SpendCap)` when `enforce` (a start or a
    /// resend: nothing stored), else counted past it (a fallback's SMS,
    /// the code already promised).
    async fn insert_send(
        c: &mut Conn,
        verification_id: Uuid,
        m: &NewMessage,
        lease: &Lease,
        fallback: Option<NewFallback>,
        enforce: bool,
    ) -> Result<MessageRecord, StoreError> {
        let (cost, currency) = m.cost_columns();
        let lease_expires_at: DbTime = sqlx::query_scalar(INSERT_MESSAGE)
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
            .bind(&m.route)
            .bind(verification_id)
            .bind(cost)
            .bind(currency)
            .bind(&m.route_order)
            .fetch_one(&mut *c)
            .await?;
        if let Some(charge) = &m.cost {
            let tenant: Option<TenantSpend> = sqlx::query_as(TENANT_SPEND)
                .bind(m.tenant_id)
                .fetch_optional(&mut *c)
                .await?;
            let (daily, monthly, intl, home) = tenant.unwrap_or_default();
            let caps = crate::spend::SpendCaps {
                daily,
                monthly,
                international_daily_messages: intl,
            };
            if caps != crate::spend::SpendCaps::default() {
                let country = m
                    .to
                    .phone()
                    .and_then(|p| crate::domain::phone::parse(p.as_str()))
                    .and_then(|p| p.into_parts().1);
                let charge = crate::spend::Charge {
                    international: crate::spend::is_international(
                        home.as_deref(),
                        country.as_deref(),
                    ),
                    ..charge.clone()
                };
                Driver::charge_spend(c, m.tenant_id, m.id.0, &charge, caps, enforce, m.created_at)
                    .await?;
            }
        }
        sqlx::query(INSERT_ATTEMPT)
            .bind(m.id.0)
            .bind(&lease.owner)
            .bind(db(m.created_at))
            .bind(&m.sender)
            .execute(&mut *c)
            .await?;
        if let Some(f) = fallback {
            sqlx::query(INSERT_FALLBACK)
                .bind(f.verification_id)
                .bind(to_i32(f.send_number))
                .bind(f.tenant_id)
                .bind(f.message_id.0)
                .bind(db(f.due_at))
                .bind(db(m.created_at))
                .bind(to_i32(f.step))
                .execute(&mut *c)
                .await?;
        }
        let opted_out: bool = sqlx::query_scalar(OPTED_OUT)
            .bind(m.tenant_id)
            .bind(&m.to)
            .bind(&m.provider)
            .fetch_one(&mut *c)
            .await?;
        let mut claimed = MessageRecord::claimed(m, lease, lease_expires_at.0, opted_out);
        claimed.verification_id = Some(verification_id);
        Ok(claimed)
    }

    async fn stored_op(
        c: &mut Conn,
        id: Uuid,
        kind: OpKind,
        key: &str,
    ) -> Result<Option<StoredOp>, StoreError> {
        let row: Option<OpRow> = sqlx::query_as(OP)
            .bind(id)
            .bind(kind.as_str())
            .bind(key)
            .fetch_optional(&mut *c)
            .await?;
        Ok(row.map(StoredOp::from))
    }

    async fn store_op(
        c: &mut Conn,
        id: Uuid,
        (kind, key, fingerprint, response): &OpAnswer,
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        sqlx::query(INSERT_OP)
            .bind(id)
            .bind(kind.as_str())
            .bind(key)
            .bind(fingerprint)
            .bind(i16::try_from(response.status_code).unwrap_or(200))
            .bind(&response.body)
            .bind(db(at))
            .execute(&mut *c)
            .await?;
        Ok(())
    }

    /// The verification's webhook event, in the transaction of the change.
    async fn event(
        c: &mut Conn,
        rec: &VerificationRecord,
        at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let (event_type, data) = crate::store::webhooks::verification_event(rec);
        Driver::enqueue_event(c, rec.tenant_id, &event_type, None, &data, at).await
    }

    /// Writes `after` if the verification is still as `read` (pending,
    /// with as many checks left and sends); a move out of `pending` writes
    /// its webhook event too. False: it changed in between.
    async fn fenced_write(
        c: &mut Conn,
        read: &VerificationRecord,
        after: &VerificationRecord,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(FENCED_WRITE)
            .bind(read.id)
            .bind(read.tenant_id)
            .bind(to_i32(read.checks_remaining))
            .bind(to_i32(read.sends))
            .bind(after.status.as_str())
            .bind(to_i32(after.checks_remaining))
            .bind(after.approved_at.map(db))
            .bind(to_i32(after.sends))
            .bind(db(after.last_sent_at))
            .bind(db(after.updated_at))
            .execute(&mut *c)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        if after.status != VerificationStatus::Pending {
            Driver::stop_unsent(c, read.id, after.updated_at).await?;
            event(c, after, after.updated_at).await?;
        }
        Ok(true)
    }

    /// A check's or a resend's transaction: a stored answer under its key
    /// is replayed; otherwise the change is written if the row is still as
    /// read, with the message it sends and the answer to replay.
    async fn change(
        c: &mut Conn,
        read: &VerificationRecord,
        after: &VerificationRecord,
        op: Option<OpAnswer>,
        send: Option<(NewMessage, Lease)>,
    ) -> Result<Changed, StoreError> {
        if let Some((kind, key, _, _)) = &op
            && let Some(stored) = stored_op(c, read.id, *kind, key).await?
        {
            return Ok(Changed::Replay(stored));
        }
        if !fenced_write(c, read, after).await? {
            return Ok(Changed::Stale);
        }
        let message = match send {
            Some((m, lease)) => {
                let fallback = fallback_of(after, after.sends, 0, &m);
                Some(Box::new(insert_send(c, after.id, &m, &lease, fallback, true).await?))
            }
            None => None,
        };
        if let Some(op) = &op {
            store_op(c, read.id, op, after.updated_at).await?;
        }
        Ok(Changed::Written(message))
    }

    /// One scope's pause (a prefix's, or a country's): refused while its
    /// pause lasts, and paused now if its recent approval rate is too low.
    async fn pause_for(
        c: &mut Conn,
        scope: &PauseScope<'_>,
        policy: &StartPolicy,
        now: OffsetDateTime,
    ) -> Result<Option<StartOutcome>, StoreError> {
        let pause: Option<DbTime> = sqlx::query_scalar(PAUSE)
            .bind(scope.tenant)
            .bind(scope.key)
            .fetch_optional(&mut *c)
            .await?;
        let pause = pause.map(|t| t.0);
        if let Some(until) = pause.filter(|t| *t > now) {
            return Ok(Some(StartOutcome::Paused {
                until,
                newly: false,
            }));
        }
        let (approved, concluded): (i64, i64) = sqlx::query_as(scope.approvals)
            .bind(scope.tenant)
            .bind(scope.value)
            .bind(db(pause_window_start(policy, pause, now)))
            .bind(db(now))
            .fetch_one(&mut *c)
            .await?;
        if !decide::should_pause(
            scope.rule,
            u64::try_from(approved).unwrap_or(0),
            u64::try_from(concluded).unwrap_or(0),
        ) {
            return Ok(None);
        }
        let until = now + policy.pause_for;
        sqlx::query(SET_PAUSE)
            .bind(scope.tenant)
            .bind(scope.key)
            .bind(db(until))
            .execute(&mut *c)
            .await?;
        Ok(Some(StartOutcome::Paused { until, newly: true }))
    }

    /// A start, in its transaction: the key, the pause, the approval rate,
    /// the per-hour limits, then the verification and its first message.
    async fn start(
        c: &mut Conn,
        v: &NewVerification,
        message: &NewMessage,
        lease: &Lease,
        policy: &StartPolicy,
    ) -> Result<StartOutcome, StoreError> {
        let now = v.created_at;
        Driver::lock_verify_prefix(c, v.tenant_id, &v.prefix).await?;
        let existing: Option<VerificationRow> = sqlx::query_as(BY_KEY)
            .bind(v.tenant_id)
            .bind(&v.idempotency_key)
            .fetch_optional(&mut *c)
            .await?;
        if let Some(row) = existing {
            return Ok(StartOutcome::Existing(Box::new(row.try_into()?)));
        }
        let scopes = [
            Some((APPROVALS, v.prefix.clone(), v.prefix.as_str(), policy.pause)),
            v.country
                .as_deref()
                .filter(|_| policy.country_pause.min_starts > 0)
                .map(|cc| {
                    let key = format!("{COUNTRY_PAUSE}{cc}");
                    (COUNTRY_APPROVALS, key, cc, policy.country_pause)
                }),
        ];
        for (approvals, key, value, rule) in scopes.iter().flatten() {
            let scope = PauseScope {
                tenant: v.tenant_id,
                key,
                approvals,
                value,
                rule: *rule,
            };
            if let Some(paused) = pause_for(c, &scope, policy, now).await? {
                return Ok(paused);
            }
        }
        let hour_ago = db(now - time::Duration::HOUR);
        let number: (i64, Option<DbTime>) = sqlx::query_as(NUMBER_STARTS)
            .bind(v.tenant_id)
            .bind(&v.to)
            .bind(hour_ago)
            .fetch_one(&mut *c)
            .await?;
        let prefix: (i64, Option<DbTime>) = sqlx::query_as(PREFIX_STARTS)
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
        sqlx::query(INSERT)
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
            .bind(v.channels.stored())
            .bind(to_i32(v.fallback_after.first()))
            .bind(v.fallback_after.stored_list())
            .execute(&mut *c)
            .await?;
        let started = VerificationRecord::started(v);
        let message =
            insert_send(c, v.id, message, lease, fallback_of(&started, 1, 0, message), true).await?;
        Ok(StartOutcome::Created {
            verification: Box::new(started),
            message: Box::new(message),
        })
    }

    impl Driver {
        /// [`insert_send`], for the fallback's transaction
        /// (`shared/fallbacks.rs`).
        pub(crate) async fn insert_verification_send(
            c: &mut Conn,
            verification_id: Uuid,
            m: &NewMessage,
            lease: &Lease,
            row: Option<NewFallback>,
        ) -> Result<MessageRecord, StoreError> {
            insert_send(c, verification_id, m, lease, row, false).await
        }
    }

    #[async_trait]
    impl VerificationStore for Driver {
        async fn verify_secret(&self, candidate: &[u8]) -> Result<Vec<u8>, StoreError> {
            let candidate = candidate.to_vec();
            self.write(move |c| {
                Box::pin(async move {
                    sqlx::query(ENSURE_SECRET)
                        .bind(&candidate)
                        .bind(db(OffsetDateTime::now_utc()))
                        .execute(&mut *c)
                        .await?;
                    let secret: Vec<u8> = sqlx::query_scalar(SECRET).fetch_one(&mut *c).await?;
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
            self.write_tx(move |c| {
                Box::pin(async move { start(c, &v, &message, &lease, &policy).await })
            })
            .await
        }

        async fn verification(
            &self,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<Option<VerificationRecord>, StoreError> {
            let row: Option<VerificationRow> = sqlx::query_as(BY_ID)
                .bind(id)
                .bind(tenant_id)
                .fetch_optional(self.pool())
                .await?;
            row.map(VerificationRecord::try_from).transpose()
        }

        async fn verification_op(
            &self,
            id: Uuid,
            kind: OpKind,
            key: &str,
        ) -> Result<Option<StoredOp>, StoreError> {
            let mut c = self.pool().acquire().await?;
            stored_op(&mut c, id, kind, key).await
        }

        #[tracing::instrument(name = "store.check_verification", level = "debug", skip_all)]
        async fn check_verification(
            &self,
            read: &VerificationRecord,
            after: &VerificationRecord,
            op: Option<(OpKey<'_>, &StoredResponse)>,
        ) -> Result<Changed, StoreError> {
            let (read, after) = (read.clone(), after.clone());
            let op = op.map(|op| op_answer(OpKind::Check, op));
            self.write_tx(move |c| {
                Box::pin(async move { change(c, &read, &after, op, None).await })
            })
            .await
        }

        #[tracing::instrument(name = "store.resend_verification", level = "debug", skip_all)]
        async fn resend_verification(
            &self,
            read: &VerificationRecord,
            after: &VerificationRecord,
            op: (OpKey<'_>, &StoredResponse),
            message: &NewMessage,
            lease: &Lease,
        ) -> Result<Changed, StoreError> {
            let (read, after) = (read.clone(), after.clone());
            let op = Some(op_answer(OpKind::Resend, op));
            let send = Some((message.clone(), lease.clone()));
            self.write_tx(move |c| {
                Box::pin(async move { change(c, &read, &after, op, send).await })
            })
            .await
        }

        async fn expire_verifications(
            &self,
            now: OffsetDateTime,
            batch: u32,
        ) -> Result<Vec<VerificationRecord>, StoreError> {
            self.write_tx(move |c| {
                Box::pin(async move {
                    let rows: Vec<VerificationRow> = sqlx::query_as(EXPIRE)
                        .bind(db(now))
                        .bind(i64::from(batch))
                        .fetch_all(&mut *c)
                        .await?;
                    let expired = rows
                        .into_iter()
                        .map(VerificationRecord::try_from)
                        .collect::<Result<Vec<_>, _>>()?;
                    for rec in &expired {
                        event(c, rec, now).await?;
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
            self.purge_rows(PURGE, cutoff, batch).await
        }

        async fn cancel_verification(
            &self,
            tenant_id: Uuid,
            id: Uuid,
            now: OffsetDateTime,
        ) -> Result<Option<VerificationRecord>, StoreError> {
            self.write_tx(move |c| {
                Box::pin(async move {
                    let canceled: Option<VerificationRow> = sqlx::query_as(CANCEL)
                        .bind(id)
                        .bind(tenant_id)
                        .bind(db(now))
                        .fetch_optional(&mut *c)
                        .await?;
                    if let Some(row) = canceled {
                        let rec = VerificationRecord::try_from(row)?;
                        // Nothing of it goes out after the cancel.
                        Driver::stop_unsent(c, rec.id, now).await?;
                        event(c, &rec, now).await?;
                        return Ok(Some(rec));
                    }
                    let row: Option<VerificationRow> = sqlx::query_as(BY_ID)
                        .bind(id)
                        .bind(tenant_id)
                        .fetch_optional(&mut *c)
                        .await?;
                    row.map(VerificationRecord::try_from).transpose()
                })
            })
            .await
        }
    }
}
