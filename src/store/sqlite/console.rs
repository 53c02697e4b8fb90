//! The console's sessions, searches and counts on SQLite (writes through
//! the single writer).

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::domain::MessageId;
use crate::store::console::{
    ERROR_OUTCOMES, MessageWebhookRow, SUMMARY_COLUMNS, SummaryRow, group_webhook_rows,
    message_webhooks_sql,
};
use crate::store::row::{MessageRow, message_columns};
use crate::store::time::{DbTime, db};
use crate::store::{
    ConsoleStore, MessageRecord, MessageSummary, MessageWebhookDelivery, NewSession, OptOut,
    OverviewCounts, SessionRecord, StoreError,
};

#[async_trait]
impl ConsoleStore for SqliteStore {
    async fn create_session(
        &self,
        s: &NewSession,
        idle_cutoff: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let s = s.clone();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM console_sessions WHERE last_seen_at < ?")
                    .bind(db(idle_cutoff))
                    .execute(&mut *c)
                    .await?;
                sqlx::query(
                    "INSERT INTO console_sessions \
                     (id_hash, tenant_id, key_hash, key_prefix, csrf_token, created_at, last_seen_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(&s.id_hash)
                .bind(s.tenant_id)
                .bind(&s.key_hash)
                .bind(&s.key_prefix)
                .bind(&s.csrf_token)
                .bind(db(s.at))
                .bind(db(s.at))
                .execute(&mut *c)
                .await?;
                Ok(())
            })
        })
        .await
    }

    async fn session(&self, id_hash: &[u8]) -> Result<Option<SessionRecord>, StoreError> {
        let row: Option<(Uuid, String, String, DbTime)> = sqlx::query_as(
            "SELECT s.tenant_id, s.key_prefix, s.csrf_token, s.last_seen_at \
             FROM console_sessions s \
             JOIN api_keys k ON k.key_hash = s.key_hash AND k.revoked_at IS NULL \
             WHERE s.id_hash = ?",
        )
        .bind(id_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(tenant_id, key_prefix, csrf_token, last_seen_at)| SessionRecord {
                tenant_id,
                key_prefix,
                csrf_token,
                last_seen_at: last_seen_at.0,
            },
        ))
    }

    async fn touch_session(&self, id_hash: &[u8], at: OffsetDateTime) -> Result<(), StoreError> {
        let id_hash = id_hash.to_vec();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("UPDATE console_sessions SET last_seen_at = ? WHERE id_hash = ?")
                    .bind(db(at))
                    .bind(&id_hash)
                    .execute(&mut *c)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError> {
        let id_hash = id_hash.to_vec();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM console_sessions WHERE id_hash = ?")
                    .bind(&id_hash)
                    .execute(&mut *c)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn messages_by_provider_id(
        &self,
        tenant_id: Uuid,
        provider_message_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM messages \
             WHERE tenant_id = ? AND provider_message_id = ? \
             ORDER BY created_at DESC, id DESC LIMIT ?"
        );
        let rows: Vec<SummaryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(provider_message_id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(MessageSummary::from).collect())
    }

    async fn messages_to(
        &self,
        tenant_id: Uuid,
        number: &str,
        before: Option<(OffsetDateTime, MessageId)>,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM messages \
             WHERE tenant_id = ? AND to_number = ? \
             AND (? IS NULL OR created_at < ? OR (created_at = ? AND id < ?)) \
             ORDER BY created_at DESC, id DESC LIMIT ?"
        );
        let at = before.map(|(t, _)| db(t));
        let rows: Vec<SummaryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(number)
            .bind(at)
            .bind(at)
            .bind(at)
            .bind(before.map(|(_, id)| id.0))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(MessageSummary::from).collect())
    }

    async fn tenant_message(
        &self,
        tenant_id: Uuid,
        id: MessageId,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let row: Option<MessageRow> = sqlx::query_as(concat!(
            "SELECT ",
            message_columns!(),
            " FROM messages m WHERE m.id = ? AND m.tenant_id = ?"
        ))
        .bind(id.0)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(MessageRecord::from))
    }

    async fn message_webhook_deliveries(
        &self,
        tenant_id: Uuid,
        id: MessageId,
    ) -> Result<Vec<MessageWebhookDelivery>, StoreError> {
        let rows: Vec<MessageWebhookRow> =
            sqlx::query_as(AssertSqlSafe(message_webhooks_sql("?", "?")))
                .bind(tenant_id)
                .bind(id.0)
                .fetch_all(&self.pool)
                .await?;
        Ok(group_webhook_rows(rows))
    }

    async fn overview(
        &self,
        tenant_id: Uuid,
        since: OffsetDateTime,
    ) -> Result<OverviewCounts, StoreError> {
        let by_status_provider: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT status, provider, count(*) FROM messages \
             WHERE tenant_id = ? AND created_at >= ? \
             GROUP BY status, provider ORDER BY provider, status",
        )
        .bind(tenant_id)
        .bind(db(since))
        .fetch_all(&self.pool)
        .await?;
        let sql = format!(
            "SELECT COALESCE(a.provider, m.provider) AS p, count(*), \
             CAST(COALESCE(SUM(CASE WHEN a.outcome IN {ERROR_OUTCOMES} THEN 1 ELSE 0 END), 0) AS BIGINT) \
             FROM attempts a JOIN messages m ON m.id = a.message_id \
             WHERE m.tenant_id = ? AND a.started_at >= ? GROUP BY p ORDER BY p"
        );
        let attempts_by_provider: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(db(since))
            .fetch_all(&self.pool)
            .await?;
        let (processing, waiting_retries, oldest_processing): (i64, i64, Option<DbTime>) =
            sqlx::query_as(
                "SELECT count(*), \
                 CAST(COALESCE(SUM(CASE WHEN next_attempt_at IS NOT NULL THEN 1 ELSE 0 END), 0) AS BIGINT), \
                 MIN(created_at) FROM messages WHERE tenant_id = ? AND status = 'processing'",
            )
            .bind(tenant_id)
            .fetch_one(&self.pool)
            .await?;
        let waiting_webhooks: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries d \
             JOIN webhook_endpoints w ON w.id = d.endpoint_id \
             WHERE w.tenant_id = ? AND d.status = 'pending' AND d.attempts > 0",
        )
        .bind(tenant_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(OverviewCounts {
            by_status_provider,
            attempts_by_provider,
            waiting_retries,
            processing,
            oldest_processing: oldest_processing.map(|t| t.0),
            waiting_webhooks,
        })
    }

    async fn add_opt_out_by(
        &self,
        tenant_id: Uuid,
        number: &str,
        who: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let (number, who) = (number.to_string(), who.to_string());
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "INSERT INTO opt_outs (tenant_id, number, source, created_at, added_by) \
                     VALUES (?, ?, 'console', ?, ?) ON CONFLICT (tenant_id, number) DO NOTHING",
                )
                .bind(tenant_id)
                .bind(&number)
                .bind(db(at))
                .bind(&who)
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected() == 1)
            })
        })
        .await
    }

    async fn search_opt_outs(
        &self,
        tenant_id: Uuid,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OptOut>, StoreError> {
        let rows: Vec<(String, String, DbTime, Option<String>)> = sqlx::query_as(
            "SELECT number, source, created_at, added_by FROM opt_outs \
             WHERE tenant_id = ? AND substr(number, 1, length(?)) = ? \
             AND (? IS NULL OR number > ?) ORDER BY number LIMIT ?",
        )
        .bind(tenant_id)
        .bind(prefix)
        .bind(prefix)
        .bind(after)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(number, source, created_at, added_by)| OptOut {
                number,
                source,
                created_at: created_at.0,
                added_by,
            })
            .collect())
    }
}
