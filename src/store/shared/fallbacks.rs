//! A verification's next channel and a provider's prepared token: once for
//! both backends (see `store/fallbacks.rs`).

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::messages::cancel_sql;
use super::{per_backend, to_i32};
use crate::domain::schedule::cancelable_sql;
use crate::domain::{MessageId, Status};
use crate::store::time::{DbTime, db, micros};
use crate::store::{
    FallbackDue, FallbackState, FallbackStore, Lease, MessageRecord, NewMessage, StoreError, Unsent,
};
use crate::verify::decide::VerificationStatus;

/// Open rows with something to do at `$1`, oldest due first.
const DUE: &str = "SELECT f.verification_id, f.send_number, f.tenant_id, f.message_id, \
        f.due_at, f.state, m.status AS message_status, m.prepared_token, \
        v.status AS verification_status, v.expires_at, v.channels \
     FROM verification_fallbacks f \
     JOIN messages m ON m.id = f.message_id \
     JOIN verifications v ON v.id = f.verification_id \
     WHERE f.state IN ('waiting', 'delivered') AND ( \
        v.status <> 'pending' OR v.expires_at <= $1 \
        OR (f.state = 'waiting' AND (f.due_at <= $1 \
            OR m.status IN ('failed', 'canceled', 'undelivered', 'delivered')))) \
     ORDER BY f.due_at LIMIT $2";

const SETTLE: &str = "UPDATE verification_fallbacks SET state = $3, updated_at = $5 \
     WHERE verification_id = $1 AND send_number = $2 AND state = $4";

/// Waiting to fell_back, while the verification is still pending.
const FALL_BACK: &str = "UPDATE verification_fallbacks SET state = 'fell_back', \
        updated_at = $3 \
     WHERE verification_id = $1 AND send_number = $2 AND state = 'waiting' \
        AND EXISTS (SELECT 1 FROM verifications v WHERE v.id = $1 \
            AND v.status = 'pending' AND v.expires_at > $3)";

/// A Telegram message with no request id canceled (as a caller's cancel
/// in `shared/messages.rs`, and only while it has no request id): no
/// attempt since it was read (`$2`), no lease, no open attempt.
const CANCEL_UNSENT: &str = concat!(
    cancel_sql!(),
    "m.prepared_token IS NULL AND ",
    cancelable_sql!()
);

#[derive(sqlx::FromRow)]
struct DueRow {
    verification_id: Uuid,
    send_number: i32,
    tenant_id: Uuid,
    message_id: Uuid,
    due_at: DbTime,
    state: String,
    message_status: Status,
    prepared_token: Option<String>,
    verification_status: String,
    expires_at: DbTime,
    channels: String,
}

impl TryFrom<DueRow> for FallbackDue {
    type Error = StoreError;

    fn try_from(r: DueRow) -> Result<Self, StoreError> {
        Ok(FallbackDue {
            verification_id: r.verification_id,
            send_number: u32::try_from(r.send_number)
                .map_err(|_| StoreError::Invariant("a negative send number"))?,
            tenant_id: r.tenant_id,
            message_id: MessageId(r.message_id),
            due_at: r.due_at.0,
            state: FallbackState::parse(&r.state)
                .ok_or(StoreError::Invariant("an unknown fallback state"))?,
            message_status: r.message_status,
            prepared_token: r.prepared_token,
            verification_status: VerificationStatus::parse(&r.verification_status)
                .ok_or(StoreError::Invariant("an unknown verification status"))?,
            expires_at: r.expires_at.0,
            channels: crate::verify::Channels::parse_stored(&r.channels)
                .ok_or(StoreError::Invariant("an unknown verification channel"))?,
        })
    }
}

per_backend! {
    /// The verification, still pending at `$2`, locked (on Postgres) for
    /// the fallback's transaction: a check approving it meanwhile waits,
    /// or has committed first and the row is not found.
    const LOCK_PENDING: &str = concat!(
        "SELECT id FROM verifications WHERE id = $1 AND status = 'pending' AND expires_at > $2",
        for_update!()
    );

    /// The token unless the message has one, fenced on the lease, which
    /// it renews for its ttl on the database's clock.
    const PREPARE: &str = concat!(
        "UPDATE messages SET prepared_token = COALESCE(prepared_token, $3), \
            lease_expires_at = ",
        db_now!(),
        " + $4",
        us!(),
        " WHERE id = $1 AND lease_token = $2 AND status = 'processing' \
         RETURNING prepared_token"
    );

    #[async_trait]
    impl FallbackStore for Driver {
        async fn prepare_send(
            &self,
            id: MessageId,
            lease: &Lease,
            token: &str,
        ) -> Result<Option<String>, StoreError> {
            let (lease, token) = (lease.clone(), token.to_string());
            self.write(move |c| {
                Box::pin(async move {
                    let stored: Option<Option<String>> = sqlx::query_scalar(PREPARE)
                        .bind(id.0)
                        .bind(lease.token)
                        .bind(&token)
                        .bind(micros(lease.ttl))
                        .fetch_optional(&mut *c)
                        .await?;
                    Ok(stored.flatten())
                })
            })
            .await
        }

        async fn due_fallbacks(
            &self,
            now: OffsetDateTime,
            batch: u32,
        ) -> Result<Vec<FallbackDue>, StoreError> {
            let rows: Vec<DueRow> = sqlx::query_as(DUE)
                .bind(db(now))
                .bind(i64::from(batch))
                .fetch_all(self.pool())
                .await?;
            rows.into_iter().map(FallbackDue::try_from).collect()
        }

        async fn settle_fallback(
            &self,
            f: &FallbackDue,
            to: FallbackState,
            now: OffsetDateTime,
            unsent: Option<&Unsent>,
        ) -> Result<bool, StoreError> {
            let (f, unsent) = (f.clone(), unsent.cloned());
            self.write_tx(move |c| {
                Box::pin(async move {
                    if !Driver::cancel_unsent(c, &f, unsent.as_ref(), now).await? {
                        return Ok(false);
                    }
                    let done = sqlx::query(SETTLE)
                        .bind(f.verification_id)
                        .bind(to_i32(f.send_number))
                        .bind(to.as_str())
                        .bind(f.state.as_str())
                        .bind(db(now))
                        .execute(&mut *c)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
        }

        async fn fall_back(
            &self,
            f: &FallbackDue,
            m: &NewMessage,
            lease: &Lease,
            now: OffsetDateTime,
            unsent: Option<&Unsent>,
        ) -> Result<Option<MessageRecord>, StoreError> {
            let (f, m, lease, unsent) = (f.clone(), m.clone(), lease.clone(), unsent.cloned());
            self.write_tx(move |c| {
                Box::pin(async move {
                    let pending: Option<Uuid> = sqlx::query_scalar(LOCK_PENDING)
                        .bind(f.verification_id)
                        .bind(db(now))
                        .fetch_optional(&mut *c)
                        .await?;
                    if pending.is_none() {
                        return Ok(None);
                    }
                    // Before anything is written: a message that could not
                    // be canceled leaves the transaction empty.
                    if !Driver::cancel_unsent(c, &f, unsent.as_ref(), now).await? {
                        return Ok(None);
                    }
                    let done = sqlx::query(FALL_BACK)
                        .bind(f.verification_id)
                        .bind(to_i32(f.send_number))
                        .bind(db(now))
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() != 1 {
                        return Ok(None);
                    }
                    Driver::insert_verification_send(c, &m, &lease).await.map(Some)
                })
            })
            .await
        }
    }

    impl Driver {
        /// Cancels `f`'s unsent Telegram message when `unsent` asks to;
        /// false when it could not be (it moved on since it was read).
        async fn cancel_unsent(
            c: &mut Conn,
            f: &FallbackDue,
            unsent: Option<&Unsent>,
            now: OffsetDateTime,
        ) -> Result<bool, StoreError> {
            let Some(u) = unsent else {
                return Ok(true);
            };
            let done = sqlx::query(CANCEL_UNSENT)
                .bind(f.message_id.0)
                .bind(to_i32(u.attempts))
                .bind(i16::try_from(u.response.status_code).unwrap_or(500))
                .bind(&u.response.body)
                .bind(db(now))
                .execute(&mut *c)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    }
}
