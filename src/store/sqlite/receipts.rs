//! Delivery receipts on SQLite.

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use sqlx::SqliteConnection;

use super::SqliteStore;
use crate::domain::{MessageId, Status};
use crate::store::row::{FirstFinalReceipt, ReceiptDbRow, receipt_columns};
use crate::store::time::db;
use crate::store::{
    NewReceipt, ReceiptOutcome, ReceiptRow, ReceiptStore, SqlxResultExt, StoreError, delivery_error,
};

#[async_trait]
impl ReceiptStore for SqliteStore {
    async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
        // The single writer serialises this with every other receipt and
        // with the delivery task's attach_receipts.
        let r = r.clone();
        self.write(move |c| Box::pin(async move { record_receipt(c, &r).await }))
            .await
    }

    async fn has_unmatched_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM receipts \
             WHERE provider = ? AND provider_message_id = ? AND message_id IS NULL)",
        )
        .bind(provider)
        .bind(provider_message_id)
        .fetch_one(&self.pool)
        .await
        .store_err()
    }

    async fn attach_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let (provider, pmid) = (provider.to_string(), provider_message_id.to_string());
        self.write(move |c| {
            Box::pin(async move {
                let (_, applied) = link_and_apply_receipts(c, &provider, &pmid, now).await?;
                Ok(applied)
            })
        })
        .await
    }

    async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows: Vec<ReceiptDbRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE message_id = ? ORDER BY seq"
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
            " FROM receipts WHERE message_id = ?1 \
             AND (?2 IS NULL OR received_at > ?2 OR (received_at = ?2 AND seq > ?3)) \
             ORDER BY received_at, seq LIMIT ?4"
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
            " FROM receipts WHERE message_id IS NULL ORDER BY seq DESC LIMIT ?"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ReceiptRow::from).collect())
    }
}

async fn record_receipt(
    c: &mut SqliteConnection,
    r: &NewReceipt,
) -> Result<ReceiptOutcome, StoreError> {
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO receipts (provider, event_id, provider_message_id, provider_status, \
            status, error_code, received_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (provider, event_id) DO NOTHING RETURNING seq",
    )
    .bind(&r.provider)
    .bind(&r.event_id)
    .bind(&r.provider_message_id)
    .bind(&r.provider_status)
    .bind(r.status)
    .bind(&r.error_code)
    .bind(db(r.received_at))
    .fetch_optional(&mut *c)
    .await?;
    if inserted.is_none() {
        let earlier: Option<Option<Uuid>> = sqlx::query_scalar(
            "SELECT message_id FROM receipts WHERE provider = ? AND event_id = ?",
        )
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
    let (message_id, applied) =
        link_and_apply_receipts(c, &r.provider, &r.provider_message_id, r.received_at).await?;
    Ok(ReceiptOutcome {
        duplicate: false,
        message_id,
        applied,
    })
}

/// Links the unlinked receipts of a provider message id to its message and
/// moves a `sent` message to the first final delivery status reported.
/// Returns the message (if any) and whether its status moved.
async fn link_and_apply_receipts(
    tx: &mut SqliteConnection,
    provider: &str,
    provider_message_id: &str,
    now: OffsetDateTime,
) -> Result<(Option<MessageId>, bool), StoreError> {
    let message: Option<(Uuid, Status)> = sqlx::query_as(
        "SELECT id, status FROM messages WHERE provider = ? AND provider_message_id = ? \
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(provider)
    .bind(provider_message_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((id, status)) = message else {
        return Ok((None, false));
    };
    sqlx::query(
        "UPDATE receipts SET message_id = ? \
         WHERE provider = ? AND provider_message_id = ? AND message_id IS NULL",
    )
    .bind(id)
    .bind(provider)
    .bind(provider_message_id)
    .execute(&mut *tx)
    .await?;
    if status != Status::Sent {
        return Ok((Some(MessageId(id)), false));
    }
    let first: Option<FirstFinalReceipt> = sqlx::query_as(
        "SELECT seq, status, provider_status, error_code, received_at FROM receipts \
         WHERE message_id = ? AND status IN (?, ?) \
         ORDER BY seq LIMIT 1",
    )
    .bind(id)
    .bind(Status::Delivered)
    .bind(Status::Undelivered)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(first) = first else {
        return Ok((Some(MessageId(id)), false));
    };
    let error = (first.status == Status::Undelivered)
        .then(|| delivery_error(&first.provider_status, first.error_code.as_deref()));
    let done = sqlx::query(
        "UPDATE messages SET status = ?, delivery_status_at = ?, \
            updated_at = max(updated_at, ?), error = COALESCE(?, error) \
         WHERE id = ? AND status = ?",
    )
    .bind(first.status)
    .bind(first.received_at)
    .bind(db(now))
    .bind(error.map(Json))
    .bind(id)
    .bind(Status::Sent)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 1 {
        sqlx::query("UPDATE receipts SET applied = 1 WHERE seq = ?")
            .bind(first.seq)
            .execute(&mut *tx)
            .await?;
        // The outbox row, in the transaction of the status change.
        let event_type = format!("message.{}", first.status.as_str());
        super::webhooks::enqueue_message_event(tx, id, &event_type, now).await?;
    }
    Ok((Some(MessageId(id)), done.rows_affected() == 1))
}
