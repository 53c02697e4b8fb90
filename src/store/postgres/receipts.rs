//! Delivery receipts on Postgres.

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
use crate::domain::{MessageId, Status};
use crate::store::row::{FirstFinalReceipt, ReceiptDbRow, receipt_columns};
use crate::store::time::db;
use crate::store::{
    NewReceipt, ReceiptOutcome, ReceiptRow, ReceiptStore, SqlxResultExt, StoreError, delivery_error,
};

type Tx<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

#[async_trait]
impl ReceiptStore for PgStore {
    async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        lock_receipts(&mut tx, &r.provider, &r.provider_message_id).await?;
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO receipts (provider, event_id, provider_message_id, provider_status, \
                status, error_code, received_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (provider, event_id) DO NOTHING RETURNING seq",
        )
        .bind(&r.provider)
        .bind(&r.event_id)
        .bind(&r.provider_message_id)
        .bind(&r.provider_status)
        .bind(r.status)
        .bind(&r.error_code)
        .bind(db(r.received_at))
        .fetch_optional(&mut *tx)
        .await?;
        if inserted.is_none() {
            let earlier: Option<Option<Uuid>> = sqlx::query_scalar(
                "SELECT message_id FROM receipts WHERE provider = $1 AND event_id = $2",
            )
            .bind(&r.provider)
            .bind(&r.event_id)
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(ReceiptOutcome {
                duplicate: true,
                message_id: earlier.flatten().map(MessageId),
                applied: false,
            });
        }
        let (message_id, applied) =
            link_and_apply_receipts(&mut tx, &r.provider, &r.provider_message_id, r.received_at)
                .await?;
        tx.commit().await?;
        Ok(ReceiptOutcome {
            duplicate: false,
            message_id,
            applied,
        })
    }

    async fn has_unmatched_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        self.lanes()
            .look
            .call((provider.to_string(), provider_message_id.to_string()))
            .await
    }

    async fn attach_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        lock_receipts(&mut tx, provider, provider_message_id).await?;
        let (_, applied) =
            link_and_apply_receipts(&mut tx, provider, provider_message_id, now).await?;
        tx.commit().await?;
        Ok(applied)
    }

    async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows: Vec<ReceiptDbRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE message_id = $1 ORDER BY seq"
        ))
        .bind(id.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ReceiptRow::from).collect())
    }

    async fn receipts_after(
        &self,
        id: MessageId,
        after: Option<(OffsetDateTime, i64)>,
        limit: u32,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows: Vec<ReceiptDbRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE message_id = $1 \
             AND ($2::timestamptz IS NULL OR received_at > $2 OR (received_at = $2 AND seq > $3)) \
             ORDER BY received_at, seq LIMIT $4"
        ))
        .bind(id.0)
        .bind(after.map(|(t, _)| db(t)))
        .bind(after.map_or(0, |(_, seq)| seq))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ReceiptRow::from).collect())
    }

    async fn unmatched_receipts(&self, limit: u32) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows: Vec<ReceiptDbRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE message_id IS NULL ORDER BY seq DESC LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ReceiptRow::from).collect())
    }
}

/// Serialises everything that links or applies receipts of one provider
/// message id, until the transaction ends: a receipt and the delivery task's
/// write of that id can then never miss each other.
async fn lock_receipts(
    tx: &mut Tx<'_>,
    provider: &str,
    provider_message_id: &str,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!(
            "sendonce.receipts:{provider}:{provider_message_id}"
        ))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Links the unlinked receipts of a provider message id to its message and
/// moves a `sent` message to the first final delivery status reported.
/// Returns the message (if any) and whether its status moved.
async fn link_and_apply_receipts(
    tx: &mut Tx<'_>,
    provider: &str,
    provider_message_id: &str,
    now: OffsetDateTime,
) -> Result<(Option<MessageId>, bool), StoreError> {
    let message: Option<(Uuid, Status)> = sqlx::query_as(
        "SELECT id, status FROM messages WHERE provider = $1 AND provider_message_id = $2 \
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(provider)
    .bind(provider_message_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((id, status)) = message else {
        return Ok((None, false));
    };
    sqlx::query(
        "UPDATE receipts SET message_id = $3 \
         WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL",
    )
    .bind(provider)
    .bind(provider_message_id)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    if status != Status::Sent {
        return Ok((Some(MessageId(id)), false));
    }
    let first: Option<FirstFinalReceipt> = sqlx::query_as(
        "SELECT seq, status, provider_status, error_code, received_at FROM receipts \
         WHERE message_id = $1 AND status IN ($2, $3) \
         ORDER BY seq LIMIT 1",
    )
    .bind(id)
    .bind(Status::Delivered)
    .bind(Status::Undelivered)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(first) = first else {
        return Ok((Some(MessageId(id)), false));
    };
    let error = (first.status == Status::Undelivered)
        .then(|| delivery_error(&first.provider_status, first.error_code.as_deref()));
    let done = sqlx::query(
        "UPDATE messages SET status = $2, delivery_status_at = $3, \
            updated_at = GREATEST(updated_at, $4), error = COALESCE($5, error) \
         WHERE id = $1 AND status = $6",
    )
    .bind(id)
    .bind(first.status)
    .bind(first.received_at)
    .bind(db(now))
    .bind(error.map(Json))
    .bind(Status::Sent)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() == 1 {
        sqlx::query("UPDATE receipts SET applied = true WHERE seq = $1")
            .bind(first.seq)
            .execute(&mut **tx)
            .await?;
        // The outbox row, in the transaction of the status change.
        let event_type = format!("message.{}", first.status.as_str());
        super::webhooks::enqueue_message_event(tx, id, &event_type, now).await?;
    }
    Ok((Some(MessageId(id)), done.rows_affected() == 1))
}

impl PgStore {
    /// [`ReceiptStore::has_unmatched_receipts`] for one id, as one read.
    pub(super) async fn has_unmatched_one(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM receipts \
             WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL)",
        )
        .bind(provider)
        .bind(provider_message_id)
        .fetch_one(&self.pool)
        .await
        .store_err()
    }
}
