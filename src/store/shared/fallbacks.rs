//! A verification's next channel and a provider's prepared token: once for
//! both backends (see `store/fallbacks.rs`), and the stopping of a
//! verification's messages that have not gone out (`domain::stop`), read
//! fresh and written in the transaction of the move or the end.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::messages::cancel_sql;
use super::{per_backend, to_i32};
use crate::domain::schedule::cancelable_sql;
use crate::domain::stop::{self, Fresh, Stop};
use crate::domain::verification::VerificationStatus;
use crate::domain::{MessageId, Status};
use crate::store::row::{MessageRow, message_columns};
use crate::store::time::{DbTime, db, micros};
use crate::store::{
    FallbackDue, FallbackState, FallbackStore, FellBack, Lease, MessageRecord, NewMessage, Steps,
    StoreError, step_row,
};

/// Whether any step's message of a verification's send was reported
/// delivered: by its status, or by a receipt (matched by the provider's id
/// or by ours that the provider echoed: a message whose send ended
/// `unknown` keeps its status, but not its report). The one rule that
/// stops the steps after it, wherever it is asked.
macro_rules! any_step_delivered {
    ($verification:literal, $send:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM verification_fallbacks s \
                JOIN messages sm ON sm.id = s.message_id \
                WHERE s.verification_id = ",
            $verification,
            " AND s.send_number = ",
            $send,
            " AND (sm.status = 'delivered' OR EXISTS (SELECT 1 FROM receipts r \
                    WHERE (r.message_id = sm.id OR r.our_message_id = sm.id) \
                    AND r.status = 'delivered')))"
        )
    };
}

/// Open rows with something to do at `$1`, oldest due first.
const DUE: &str = concat!(
    "SELECT f.verification_id, f.send_number, f.step, f.tenant_id, \
        f.message_id, f.due_at, f.state, m.status AS message_status, \
        m.attempts AS message_attempts, m.lease_token IS NOT NULL AS message_leased, \
        m.provider, m.prepared_token, v.status AS verification_status, v.expires_at, \
        v.channels, v.fallback_after_seconds, v.fallback_after_list, ",
    any_step_delivered!("f.verification_id", "f.send_number"),
    " AS reported_delivered \
     FROM verification_fallbacks f \
     JOIN messages m ON m.id = f.message_id \
     JOIN verifications v ON v.id = f.verification_id \
     WHERE f.state IN ('waiting', 'delivered') AND ( \
        v.status <> 'pending' OR v.expires_at <= $1 \
        OR (f.state = 'waiting' AND (f.due_at <= $1 \
            OR m.status IN ('failed', 'canceled', 'undelivered', 'delivered') \
            OR ",
    any_step_delivered!("f.verification_id", "f.send_number"),
    "))) ORDER BY f.due_at LIMIT $2"
);

const SETTLE: &str = "UPDATE verification_fallbacks SET state = $3, updated_at = $5 \
     WHERE verification_id = $1 AND send_number = $2 AND step = $6 AND state = $4";

/// Waiting to fell_back (the verification was locked pending first).
const FALL_BACK: &str = "UPDATE verification_fallbacks SET state = 'fell_back', \
        updated_at = $3 \
     WHERE verification_id = $1 AND send_number = $2 AND step = $4 AND state = 'waiting'";

/// A message stopped unsent: canceled (as a caller's cancel in
/// `shared/messages.rs`), no attempt since it was read (`$2`), no lease, no
/// open attempt.
const CANCEL_UNSENT: &str = concat!(cancel_sql!(), cancelable_sql!());

/// A message's validity ended at `$2`: no provider call starts after it.
const EXPIRE: &str = "UPDATE messages SET expires_at = $2, updated_at = $2 \
     WHERE id = $1 AND status = 'processing' AND (expires_at IS NULL OR expires_at > $2)";

#[derive(sqlx::FromRow)]
struct DueRow {
    verification_id: Uuid,
    send_number: i32,
    step: i32,
    tenant_id: Uuid,
    message_id: Uuid,
    due_at: DbTime,
    state: String,
    message_status: Status,
    message_attempts: i32,
    message_leased: bool,
    provider: String,
    prepared_token: Option<String>,
    verification_status: String,
    expires_at: DbTime,
    channels: String,
    fallback_after_seconds: i32,
    fallback_after_list: Option<String>,
    reported_delivered: bool,
}

impl TryFrom<DueRow> for FallbackDue {
    type Error = StoreError;

    fn try_from(r: DueRow) -> Result<Self, StoreError> {
        Ok(FallbackDue {
            verification_id: r.verification_id,
            send_number: u32::try_from(r.send_number)
                .map_err(|_| StoreError::Invariant("a negative send number"))?,
            step: u32::try_from(r.step).map_err(|_| StoreError::Invariant("a negative step"))?,
            tenant_id: r.tenant_id,
            message_id: MessageId(r.message_id),
            due_at: r.due_at.0,
            state: FallbackState::parse(&r.state)
                .ok_or(StoreError::Invariant("an unknown fallback state"))?,
            message_status: r.message_status,
            message_attempts: u32::try_from(r.message_attempts)
                .map_err(|_| StoreError::Invariant("a negative attempt count"))?,
            message_leased: r.message_leased,
            provider: r.provider,
            prepared_token: r.prepared_token,
            verification_status: VerificationStatus::parse(&r.verification_status)
                .ok_or(StoreError::Invariant("an unknown verification status"))?,
            expires_at: r.expires_at.0,
            channels: crate::domain::Channels::parse_stored(
                &r.channels,
                &crate::provider::registry::verify_channels(),
            )
            .ok_or(StoreError::Invariant("an unknown verification channel"))?,
            fallback_after: crate::domain::FallbackAfter::from_stored(
                u32::try_from(r.fallback_after_seconds)
                    .map_err(|_| StoreError::Invariant("a negative fallback_after_seconds"))?,
                r.fallback_after_list.as_deref(),
            )
            .ok_or(StoreError::Invariant("a broken fallback_after_list"))?,
            reported_delivered: r.reported_delivered,
        })
    }
}

/// Whether any step's message of send `$2` of verification `$1` was
/// reported delivered (its status, or a receipt's, when its status cannot
/// show it): then no later step goes.
const REPORTED_DELIVERED: &str = concat!("SELECT ", any_step_delivered!("$1", "$2"));

/// The message as a stop reads it (`reported_delivered`: whether a receipt
/// said it was delivered, read in the same transaction where it matters).
fn fresh(m: &MessageRecord, reported_delivered: bool) -> Fresh {
    Fresh {
        status: m.status,
        reported_delivered,
        leased: m.lease.is_some(),
        attempt_open: m.last_attempt_open,
        maybe_sent: m.maybe_sent,
        expires_at: m.expires_at,
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

    /// One message, locked (on Postgres) for a stop.
    const LOCK_MESSAGE: &str = concat!(
        "SELECT ",
        message_columns!(),
        " FROM messages m WHERE m.id = $1",
        for_update!()
    );

    /// A verification's messages still processing, locked for its end.
    const LOCK_UNSENT: &str = concat!(
        "SELECT ",
        message_columns!(),
        " FROM messages m WHERE m.verification_id = $1 AND m.status = 'processing'",
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

    /// The lease renewed, fenced, and whether the message may still be
    /// sent at `$4` (its validity not ended: not stopped).
    const GUARD: &str = concat!(
        "UPDATE messages SET lease_expires_at = ",
        db_now!(),
        " + $3",
        us!(),
        " WHERE id = $1 AND lease_token = $2 AND status = 'processing' \
         RETURNING (expires_at IS NULL OR expires_at > $4)"
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

        async fn guard_send(
            &self,
            id: MessageId,
            lease: &Lease,
            now: OffsetDateTime,
        ) -> Result<Option<bool>, StoreError> {
            let lease = lease.clone();
            self.write(move |c| {
                Box::pin(async move {
                    let go: Option<bool> = sqlx::query_scalar(GUARD)
                        .bind(id.0)
                        .bind(lease.token)
                        .bind(micros(lease.ttl))
                        .bind(db(now))
                        .fetch_optional(&mut *c)
                        .await?;
                    Ok(go)
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
        ) -> Result<bool, StoreError> {
            let f = f.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    // Reported delivered on some step: the row's own message,
                    // if it has not gone out (a retry waiting, a call about
                    // to start), never goes (issue 40).
                    if to == FallbackState::Delivered
                        && let Some(m) = Driver::locked_message(c, f.message_id).await?
                    {
                        Driver::stop_message(c, &m, stop::for_end(&fresh(&m, false), now), now)
                            .await?;
                    }
                    Driver::settle(c, &f, to, now).await
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
        ) -> Result<FellBack, StoreError> {
            let (f, m, lease) = (f.clone(), m.clone(), lease.clone());
            self.write_tx(move |c| {
                Box::pin(async move {
                    let pending: Option<Uuid> = sqlx::query_scalar(LOCK_PENDING)
                        .bind(f.verification_id)
                        .bind(db(now))
                        .fetch_optional(&mut *c)
                        .await?;
                    if pending.is_none() {
                        return Ok(FellBack::NotNow);
                    }
                    // The message moved on from, as it is now: a report
                    // that came during the revoke is seen here.
                    let Some(first) = Driver::locked_message(c, f.message_id).await? else {
                        return Ok(FellBack::NotNow);
                    };
                    let reported: bool = sqlx::query_scalar(REPORTED_DELIVERED)
                        .bind(f.verification_id)
                        .bind(to_i32(f.send_number))
                        .fetch_one(&mut *c)
                        .await?;
                    let stop = stop::for_next_channel(&fresh(&first, reported), now);
                    // Moved on since the pass read it (an attempt made, a
                    // report): the pass's revoke and question were about
                    // an older message. Decided again on the next pass.
                    let as_read = first.status == f.message_status
                        && first.attempts == f.message_attempts;
                    match stop {
                        Stop::Busy => return Ok(FellBack::NotNow),
                        Stop::Nothing | Stop::Cancel | Stop::Expire if !as_read => {
                            return Ok(FellBack::NotNow);
                        }
                        Stop::Delivered => {
                            // Another step's report: this one's message, if
                            // it has not gone out, never goes.
                            Driver::stop_message(
                                c,
                                &first,
                                stop::for_end(&fresh(&first, false), now),
                                now,
                            )
                            .await?;
                            return Ok(
                                if Driver::settle(c, &f, FallbackState::Delivered, now).await? {
                                    FellBack::Delivered
                                } else {
                                    FellBack::NotNow
                                },
                            );
                        }
                        Stop::Nothing | Stop::Cancel | Stop::Expire => {}
                    }
                    let done = sqlx::query(FALL_BACK)
                        .bind(f.verification_id)
                        .bind(to_i32(f.send_number))
                        .bind(db(now))
                        .bind(to_i32(f.step))
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() != 1 {
                        return Ok(FellBack::NotNow);
                    }
                    Driver::stop_message(c, &first, stop, now).await?;
                    let steps = Steps {
                        verification_id: f.verification_id,
                        tenant_id: f.tenant_id,
                        channels: &f.channels,
                        after: &f.fallback_after,
                        expires_at: f.expires_at,
                    };
                    let row = step_row(&steps, f.send_number, f.step + 1, &m);
                    let message =
                        Driver::insert_verification_send(c, f.verification_id, &m, &lease, row)
                            .await?;
                    Ok(FellBack::Moved(Box::new(message), stop))
                })
            })
            .await
        }
    }

    impl Driver {
        /// Moves `f` to `to` if it is still as read.
        async fn settle(
            c: &mut Conn,
            f: &FallbackDue,
            to: FallbackState,
            now: OffsetDateTime,
        ) -> Result<bool, StoreError> {
            let done = sqlx::query(SETTLE)
                .bind(f.verification_id)
                .bind(to_i32(f.send_number))
                .bind(to.as_str())
                .bind(f.state.as_str())
                .bind(db(now))
                .bind(to_i32(f.step))
                .execute(&mut *c)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        /// Message `id` as it is now, locked for the transaction.
        async fn locked_message(
            c: &mut Conn,
            id: MessageId,
        ) -> Result<Option<MessageRecord>, StoreError> {
            let row: Option<MessageRow> = sqlx::query_as(LOCK_MESSAGE)
                .bind(id.0)
                .fetch_optional(&mut *c)
                .await?;
            Ok(row.map(MessageRecord::from))
        }

        /// Does `stop` to `m` (read locked in this transaction).
        async fn stop_message(
            c: &mut Conn,
            m: &MessageRecord,
            stop: Stop,
            now: OffsetDateTime,
        ) -> Result<(), StoreError> {
            match stop {
                Stop::Cancel => {
                    let response = m.canceled_response(now);
                    let done = sqlx::query(CANCEL_UNSENT)
                        .bind(m.id.0)
                        .bind(to_i32(m.attempts))
                        .bind(i16::try_from(response.status_code).unwrap_or(200))
                        .bind(&response.body)
                        .bind(db(now))
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() == 1 {
                        Driver::enqueue_event(
                            c,
                            m.tenant_id,
                            "message.canceled",
                            Some(m.id.0),
                            &response.body,
                            now,
                        )
                        .await?;
                    }
                }
                Stop::Expire => {
                    sqlx::query(EXPIRE)
                        .bind(m.id.0)
                        .bind(db(now))
                        .execute(&mut *c)
                        .await?;
                }
                Stop::Nothing | Stop::Delivered | Stop::Busy => {}
            }
            Ok(())
        }

        /// Stops every message of verification `id` that has not gone out,
        /// in the transaction that ends it (`domain::stop::for_end`): what
        /// was stopped, and how.
        pub(crate) async fn stop_unsent(
            c: &mut Conn,
            id: Uuid,
            now: OffsetDateTime,
        ) -> Result<Vec<(MessageId, Stop)>, StoreError> {
            let rows: Vec<MessageRow> = sqlx::query_as(LOCK_UNSENT)
                .bind(id)
                .fetch_all(&mut *c)
                .await?;
            let mut stopped = Vec::new();
            for row in rows {
                let m = MessageRecord::from(row);
                // A delivered report changes nothing at the end.
                let stop = stop::for_end(&fresh(&m, false), now);
                Driver::stop_message(c, &m, stop, now).await?;
                if matches!(stop, Stop::Cancel | Stop::Expire) {
                    stopped.push((m.id, stop));
                }
            }
            Ok(stopped)
        }
    }
}
