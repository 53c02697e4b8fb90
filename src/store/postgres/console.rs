//! The console's sessions, searches and counts on Postgres.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
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
impl ConsoleStore for PgStore {
    async fn create_session(
        &self,
        s: &NewSession,
        idle_cutoff: OffsetDateTime,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sessions WHERE last_seen_at < $1")
            .bind(db(idle_cutoff))
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions \
             (id_hash, tenant_id, key_hash, key_prefix, csrf_token, created_at, last_seen_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6)",
        )
        .bind(&s.id_hash)
        .bind(s.tenant_id)
        .bind(&s.key_hash)
        .bind(&s.key_prefix)
        .bind(&s.csrf_token)
        .bind(db(s.at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn session(&self, id_hash: &[u8]) -> Result<Option<SessionRecord>, StoreError> {
        let row: Option<(Uuid, String, String, DbTime)> = sqlx::query_as(
            "SELECT s.tenant_id, s.key_prefix, s.csrf_token, s.last_seen_at \
             FROM console_sessions s \
             JOIN api_keys k ON k.key_hash = s.key_hash AND k.revoked_at IS NULL \
             WHERE s.id_hash = $1",
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
        sqlx::query("UPDATE console_sessions SET last_seen_at = $2 WHERE id_hash = $1")
            .bind(id_hash)
            .bind(db(at))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn messages_by_provider_id(
        &self,
        tenant_id: Uuid,
        provider_message_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM messages \
             WHERE tenant_id = $1 AND provider_message_id = $2 \
             ORDER BY created_at DESC, id DESC LIMIT $3"
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
             WHERE tenant_id = $1 AND to_number = $2 \
             AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4)) \
             ORDER BY created_at DESC, id DESC LIMIT $5"
        );
        let rows: Vec<SummaryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(number)
            .bind(before.map(|(t, _)| db(t)))
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
            " FROM messages m WHERE m.id = $1 AND m.tenant_id = $2"
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
            sqlx::query_as(AssertSqlSafe(message_webhooks_sql("$1", "$2")))
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
             WHERE tenant_id = $1 AND created_at >= $2 \
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
             WHERE m.tenant_id = $1 AND a.started_at >= $2 GROUP BY p ORDER BY p"
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
                 MIN(created_at) FROM messages WHERE tenant_id = $1 AND status = 'processing'",
            )
            .bind(tenant_id)
            .fetch_one(&self.pool)
            .await?;
        let waiting_webhooks: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries d \
             JOIN webhook_endpoints w ON w.id = d.endpoint_id \
             WHERE w.tenant_id = $1 AND d.status = 'pending' AND d.attempts > 0",
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
        let done = sqlx::query(
            "INSERT INTO opt_outs (tenant_id, number, source, created_at, added_by) \
             VALUES ($1, $2, 'console', $3, $4) ON CONFLICT (tenant_id, number) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(number)
        .bind(db(at))
        .bind(who)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
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
             WHERE tenant_id = $1 AND starts_with(number, $2) \
             AND ($3::text IS NULL OR number > $3) ORDER BY number LIMIT $4",
        )
        .bind(tenant_id)
        .bind(prefix)
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
