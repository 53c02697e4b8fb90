//! Delivery receipts: once for both backends. What serialises the
//! receipts of one provider message id is each backend's own
//! (`Driver::lock_receipts`: an advisory lock on Postgres, the single
//! writer on SQLite), as is the cheap unmatched-receipts read
//! (`Driver::lookup_unmatched`: coalesced on Postgres).

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::domain::{MessageId, Status};
use crate::store::row::{FirstFinalReceipt, ReceiptDbRow, receipt_columns};
use crate::store::time::db;
use crate::store::{
    NewReceipt, ReceiptOutcome, ReceiptRow, ReceiptStore, SqlxResultExt, StoreError, delivery_error,
};

const INSERT: &str = "INSERT INTO receipts (provider, event_id, provider_message_id, \
        provider_status, status, error_code, received_at, our_message_id) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (provider, event_id) DO NOTHING RETURNING seq";

const EARLIER: &str = "SELECT message_id FROM receipts WHERE provider = $1 AND event_id = $2";

// A message's receipts: those linked to it, and those that name it by our
// id under their authentication but could not be linked (a status that
// came while its send waited for an answer that was then lost: the message
// never got the provider's id, issue 40); shown, never applied.
const OF_MESSAGE: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE (message_id = $1 OR (message_id IS NULL AND our_message_id = $1)) \
     ORDER BY seq"
);

const OF_MESSAGE_AFTER: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE (message_id = $1 OR (message_id IS NULL AND our_message_id = $1)) \
     AND ($2 IS NULL OR received_at > $2 OR (received_at = $2 AND seq > $3)) \
     ORDER BY received_at, seq LIMIT $4"
);

const UNMATCHED: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE message_id IS NULL ORDER BY seq DESC LIMIT $1"
);

/// Unlinked receipts since `$1` whose provider id a message holds now (the
/// partial index on the unlinked receipts' `received_at`, then the
/// messages' unique (provider, provider id) index).
const ORPHANED: &str = "SELECT DISTINCT r.provider, r.provider_message_id FROM receipts r \
     WHERE r.message_id IS NULL AND r.received_at >= $1 AND EXISTS (SELECT 1 FROM messages m \
        WHERE m.provider = r.provider AND m.provider_message_id = r.provider_message_id) \
     LIMIT $2";

const HAS_UNMATCHED: &str = "SELECT EXISTS (SELECT 1 FROM receipts \
     WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL)";

/// The newest message that holds the provider message id.
const OWNER: &str = "SELECT id, status FROM messages \
     WHERE provider = $1 AND provider_message_id = $2 ORDER BY created_at DESC LIMIT 1";

const LINK: &str = "UPDATE receipts SET message_id = $3 \
     WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL";

/// The message with our id, when it is on this provider.
const BY_OUR_ID: &str = "SELECT id, status FROM messages WHERE id = $1 AND provider = $2";

const LINK_ONE: &str = "UPDATE receipts SET message_id = $2 WHERE seq = $1";

/// The unlinked receipts on provider `$2` that name message `$1` by our id.
const LINK_NAMING: &str = "UPDATE receipts SET message_id = $1 \
     WHERE message_id IS NULL AND provider = $2 AND our_message_id = $1";

const STATUS_OF: &str = "SELECT status FROM messages WHERE id = $1";

const FIRST_FINAL: &str = "SELECT seq, status, provider_status, error_code, received_at \
     FROM receipts WHERE message_id = $1 AND status IN ($2, $3) ORDER BY seq LIMIT 1";

const MARK_APPLIED: &str = "UPDATE receipts SET applied = true WHERE seq = $1";

per_backend! {
    /// Moves a `sent` message to the receipt's final status (never back:
    /// fenced on `sent`).
    const APPLY: &str = concat!(
        "UPDATE messages SET status = $2, delivery_status_at = $3, updated_at = ",
        greatest!(),
        "(updated_at, $4), error = COALESCE($5, error) WHERE id = $1 AND status = $6"
    );

    #[async_trait]
    impl ReceiptStore for Driver {
        async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
            let r = r.clone();
            self.write_tx(move |c| Box::pin(async move { record_receipt(c, &r).await }))
                .await
        }

        async fn has_unmatched_receipts(
            &self,
            provider: &str,
            provider_message_id: &str,
        ) -> Result<bool, StoreError> {
            self.lookup_unmatched(provider, provider_message_id).await
        }

        async fn attach_receipts(
            &self,
            provider: &str,
            provider_message_id: &str,
            now: OffsetDateTime,
        ) -> Result<bool, StoreError> {
            let (provider, pmid) = (provider.to_string(), provider_message_id.to_string());
            self.write_tx(move |c| {
                Box::pin(async move {
                    Driver::lock_receipts(c, &provider, &pmid).await?;
                    let (_, applied) = link_and_apply_receipts(c, &provider, &pmid, now).await?;
                    Ok(applied)
                })
            })
            .await
        }

        async fn attach_receipts_naming(
            &self,
            id: MessageId,
            provider: &str,
            now: OffsetDateTime,
        ) -> Result<bool, StoreError> {
            let provider = provider.to_string();
            self.write_tx(move |c| {
                Box::pin(async move {
                    let linked = sqlx::query(LINK_NAMING)
                        .bind(id.0)
                        .bind(&provider)
                        .execute(&mut *c)
                        .await?;
                    if linked.rows_affected() == 0 {
                        return Ok(false);
                    }
                    let status: Option<Status> = sqlx::query_scalar(STATUS_OF)
                        .bind(id.0)
                        .fetch_optional(&mut *c)
                        .await?;
                    match status {
                        Some(status) => apply_first_final(c, id.0, status, now).await,
                        None => Ok(false),
                    }
                })
            })
            .await
        }

        async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError> {
            let rows: Vec<ReceiptDbRow> = sqlx::query_as(OF_MESSAGE)
                .bind(id.0)
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(ReceiptRow::from).collect())
        }

        async fn receipts_after(
            &self,
            id: MessageId,
            after: Option<(OffsetDateTime, i64)>,
            limit: u32,
        ) -> Result<Vec<ReceiptRow>, StoreError> {
            let rows: Vec<ReceiptDbRow> = sqlx::query_as(OF_MESSAGE_AFTER)
                .bind(id.0)
                .bind(after.map(|(t, _)| db(t)))
                .bind(after.map_or(0, |(_, seq)| seq))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(ReceiptRow::from).collect())
        }

        async fn unmatched_receipts(&self, limit: u32) -> Result<Vec<ReceiptRow>, StoreError> {
            let rows: Vec<ReceiptDbRow> = sqlx::query_as(UNMATCHED)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(ReceiptRow::from).collect())
        }

        async fn orphaned_receipts(
            &self,
            since: OffsetDateTime,
            limit: u32,
        ) -> Result<Vec<(String, String)>, StoreError> {
            let rows: Vec<(String, String)> = sqlx::query_as(ORPHANED)
                .bind(db(since))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows)
        }
    }

    impl Driver {
        /// [`ReceiptStore::has_unmatched_receipts`] for one id, as one read.
        pub(crate) async fn has_unmatched_one(
            &self,
            provider: &str,
            provider_message_id: &str,
        ) -> Result<bool, StoreError> {
            sqlx::query_scalar(HAS_UNMATCHED)
                .bind(provider)
                .bind(provider_message_id)
                .fetch_one(self.pool())
                .await
                .store_err()
        }
    }

    /// [`ReceiptStore::record_receipt`] in the caller's transaction.
    async fn record_receipt(c: &mut Conn, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
        Driver::lock_receipts(c, &r.provider, &r.provider_message_id).await?;
        let inserted: Option<i64> = sqlx::query_scalar(INSERT)
            .bind(&r.provider)
            .bind(&r.event_id)
            .bind(&r.provider_message_id)
            .bind(&r.provider_status)
            .bind(r.status)
            .bind(&r.error_code)
            .bind(db(r.received_at))
            .bind(r.message_id.map(|m| m.0))
            .fetch_optional(&mut *c)
            .await?;
        if inserted.is_none() {
            let earlier: Option<Option<Uuid>> = sqlx::query_scalar(EARLIER)
                .bind(&r.provider)
                .bind(&r.event_id)
                .fetch_optional(&mut *c)
                .await?;
            return Ok(ReceiptOutcome {
                duplicate: true,
                message_id: earlier.flatten().map(MessageId),
                applied: false,
            });
        }
        let (mut message_id, mut applied) =
            link_and_apply_receipts(c, &r.provider, &r.provider_message_id, r.received_at).await?;
        if let (None, Some(ours), Some(seq)) = (message_id, r.message_id, inserted) {
            // No message holds the provider id: matched by our own id, when
            // the message is on this provider and past its send (one still
            // being sent gets its receipts by provider id once it records
            // the id, which a receipt linked here would escape).
            let owner: Option<(Uuid, Status)> = sqlx::query_as(BY_OUR_ID)
                .bind(ours.0)
                .bind(&r.provider)
                .fetch_optional(&mut *c)
                .await?;
            if let Some((id, status)) = owner
                && !matches!(status, Status::Scheduled | Status::Processing)
            {
                sqlx::query(LINK_ONE)
                    .bind(seq)
                    .bind(id)
                    .execute(&mut *c)
                    .await?;
                message_id = Some(MessageId(id));
                applied = apply_first_final(c, id, status, r.received_at).await?;
            }
        }
        Ok(ReceiptOutcome {
            duplicate: false,
            message_id,
            applied,
        })
    }

    /// Links the unlinked receipts of a provider message id to its message
    /// and moves a `sent` message to the first final delivery status
    /// reported, with its webhook event. Returns the message (if any) and
    /// whether its status moved.
    async fn link_and_apply_receipts(
        c: &mut Conn,
        provider: &str,
        provider_message_id: &str,
        now: OffsetDateTime,
    ) -> Result<(Option<MessageId>, bool), StoreError> {
        let message: Option<(Uuid, Status)> = sqlx::query_as(OWNER)
            .bind(provider)
            .bind(provider_message_id)
            .fetch_optional(&mut *c)
            .await?;
        let Some((id, status)) = message else {
            return Ok((None, false));
        };
        sqlx::query(LINK)
            .bind(provider)
            .bind(provider_message_id)
            .bind(id)
            .execute(&mut *c)
            .await?;
        let applied = apply_first_final(c, id, status, now).await?;
        Ok((Some(MessageId(id)), applied))
    }

    /// Moves message `id` (now `status`) to the first final delivery status
    /// its receipts reported, with its webhook event, if it is `sent`.
    async fn apply_first_final(
        c: &mut Conn,
        id: Uuid,
        status: Status,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        if status != Status::Sent {
            return Ok(false);
        }
        let first: Option<FirstFinalReceipt> = sqlx::query_as(FIRST_FINAL)
            .bind(id)
            .bind(Status::Delivered)
            .bind(Status::Undelivered)
            .fetch_optional(&mut *c)
            .await?;
        let Some(first) = first else {
            return Ok(false);
        };
        let error = (first.status == Status::Undelivered)
            .then(|| delivery_error(&first.provider_status, first.error_code.as_deref()));
        let done = sqlx::query(APPLY)
            .bind(id)
            .bind(first.status)
            .bind(first.received_at)
            .bind(db(now))
            .bind(error.map(Json))
            .bind(Status::Sent)
            .execute(&mut *c)
            .await?;
        let applied = done.rows_affected() == 1;
        if applied {
            sqlx::query(MARK_APPLIED)
                .bind(first.seq)
                .execute(&mut *c)
                .await?;
            // The outbox row, in the transaction of the status change.
            let event_type = format!("message.{}", first.status.as_str());
            Driver::enqueue_message_event(c, id, &event_type, now).await?;
        }
        Ok(applied)
    }
}
