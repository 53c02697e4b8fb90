//! The console's sessions, searches and counts: once for both backends.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::domain::MessageId;
use crate::store::console::{OutboxCursor, OutboxEntry};
use crate::store::row::console::{MessageWebhookRow, SessionRow, SummaryRow, group_webhook_rows};
use crate::store::row::{MessageRow, OptOutRow, message_columns};
use crate::store::time::{DbTime, db};
use crate::store::{
    ConsoleStore, MessageRecord, MessageSummary, MessageWebhookDelivery, NewSession, OptOut,
    OverviewCounts, SessionRecord, StoreError,
};

/// The columns of a [`SummaryRow`].
macro_rules! summary_columns {
    () => {
        "id, idempotency_key, status, to_number, provider, \
         CAST(attempts AS BIGINT) AS attempts, created_at"
    };
}

/// Attempt outcomes that count as a provider error on the overview.
macro_rules! error_outcomes {
    () => {
        "('rejected', 'retryable', 'ambiguous', 'lost')"
    };
}

/// The outbox's columns and joins: attempts the provider `$1` answered
/// `sent` (an attempt's own provider, else its message's for attempts
/// written before attempts named theirs), of tenant `$2` or of all.
macro_rules! outbox_from {
    () => {
        "SELECT a.message_id, CAST(a.number AS BIGINT) AS attempt, t.name AS tenant, \
            m.idempotency_key, m.to_number, m.body, a.provider_message_id, \
            a.finished_at AS sent_at \
         FROM attempts a JOIN messages m ON m.id = a.message_id \
         JOIN tenants t ON t.id = m.tenant_id \
         WHERE a.outcome = 'sent' AND a.finished_at IS NOT NULL \
         AND COALESCE(a.provider, m.provider) = $1 AND ($2 IS NULL OR m.tenant_id = $2)"
    };
}

const OUTBOX_NEWEST: &str = concat!(
    outbox_from!(),
    " ORDER BY a.finished_at DESC, a.message_id DESC, a.number DESC LIMIT $3"
);

const OUTBOX_AFTER: &str = concat!(
    outbox_from!(),
    " AND (a.finished_at, a.message_id, a.number) > ($3, $4, $5) \
     ORDER BY a.finished_at, a.message_id, a.number LIMIT $6"
);

/// One [`OutboxEntry`] as both databases return it.
#[derive(sqlx::FromRow)]
struct OutboxRow {
    message_id: Uuid,
    attempt: i64,
    tenant: String,
    idempotency_key: String,
    to_number: String,
    body: String,
    provider_message_id: Option<String>,
    sent_at: DbTime,
}

impl From<OutboxRow> for OutboxEntry {
    fn from(r: OutboxRow) -> Self {
        OutboxEntry {
            message_id: MessageId(r.message_id),
            attempt: u32::try_from(r.attempt).unwrap_or(0),
            tenant: r.tenant,
            idempotency_key: r.idempotency_key,
            to: r.to_number,
            body: r.body,
            provider_message_id: r.provider_message_id,
            sent_at: r.sent_at.0,
        }
    }
}

const DELETE_IDLE_SESSIONS: &str = "DELETE FROM console_sessions WHERE last_seen_at < $1";

const INSERT_SESSION: &str = "INSERT INTO console_sessions \
     (id_hash, tenant_id, key_hash, key_prefix, csrf_token, created_at, last_seen_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $6)";

/// A session whose key is not revoked, with the `read` scope, of a tenant
/// not disabled (a test key's: its shadow nor its live tenant).
const SESSION: &str = "SELECT s.tenant_id, s.key_prefix, s.csrf_token, s.created_at, \
        s.last_seen_at, k.scopes, t.live_tenant_id IS NOT NULL AS test \
     FROM console_sessions s \
     JOIN api_keys k ON k.key_hash = s.key_hash AND k.revoked_at IS NULL \
     JOIN tenants t ON t.id = k.tenant_id AND NOT t.disabled \
     JOIN tenants l ON l.id = COALESCE(t.live_tenant_id, t.id) AND NOT l.disabled \
     WHERE s.id_hash = $1";

const TOUCH_SESSION: &str = "UPDATE console_sessions SET last_seen_at = $2 WHERE id_hash = $1";

const DELETE_SESSION: &str = "DELETE FROM console_sessions WHERE id_hash = $1";

const BY_PROVIDER_ID: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM messages WHERE tenant_id = $1 AND provider_message_id = $2 \
     ORDER BY created_at DESC, id DESC LIMIT $3"
);

const TO_NUMBER: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM messages WHERE tenant_id = $1 AND to_number = $2 \
     AND ($3 IS NULL OR (created_at, id) < ($3, $4)) \
     ORDER BY created_at DESC, id DESC LIMIT $5"
);

const TENANT_MESSAGE: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1 AND m.tenant_id = $2"
);

/// A message's webhook deliveries, one row per attempt (a delivery without
/// attempts yet: one row, attempt columns NULL), at most 500. The attempts
/// join on the endpoint too, so the planner may use the attempts' endpoint
/// index.
const MESSAGE_WEBHOOKS: &str = "SELECT d.id AS d_id, e.type AS event_type, \
        e.created_at AS event_at, w.url AS url, d.status AS status, \
        d.next_attempt_at AS next_attempt_at, d.updated_at AS updated_at, \
        w.enabled AS enabled, w.disabled_reason AS disabled_reason, \
        a.number AS a_number, a.outcome AS a_outcome, a.http_status AS a_http_status, \
        a.error AS a_error, a.started_at AS a_started_at, a.finished_at AS a_finished_at \
     FROM webhook_events e \
     JOIN webhook_deliveries d ON d.event_id = e.id \
     JOIN webhook_endpoints w ON w.id = d.endpoint_id AND w.tenant_id = e.tenant_id \
     LEFT JOIN webhook_attempts a ON a.delivery_id = d.id AND a.endpoint_id = d.endpoint_id \
     WHERE e.tenant_id = $1 AND e.message_id = $2 \
     ORDER BY e.created_at, e.seq, d.id, a.number \
     LIMIT 500";

const BY_STATUS_PROVIDER: &str = "SELECT status, provider, count(*) FROM messages \
     WHERE tenant_id = $1 AND created_at >= $2 \
     GROUP BY status, provider ORDER BY provider, status";

const ATTEMPTS_BY_PROVIDER: &str = concat!(
    "SELECT COALESCE(a.provider, m.provider) AS p, count(*), \
     CAST(COALESCE(SUM(CASE WHEN a.outcome IN ",
    error_outcomes!(),
    " THEN 1 ELSE 0 END), 0) AS BIGINT) \
     FROM attempts a JOIN messages m ON m.id = a.message_id \
     WHERE m.tenant_id = $1 AND a.started_at >= $2 GROUP BY p ORDER BY p"
);

const PROCESSING: &str = "SELECT count(*), \
     CAST(COALESCE(SUM(CASE WHEN next_attempt_at IS NOT NULL THEN 1 ELSE 0 END), 0) AS BIGINT), \
     MIN(created_at) FROM messages WHERE tenant_id = $1 AND status = 'processing'";

const WAITING_WEBHOOKS: &str = "SELECT count(*) FROM webhook_deliveries d \
     JOIN webhook_endpoints w ON w.id = d.endpoint_id \
     WHERE w.tenant_id = $1 AND d.status = 'pending' AND d.attempts > 0";

const ADD_OPT_OUT_BY: &str = "INSERT INTO opt_outs (tenant_id, number, source, created_at, \
        added_by) VALUES ($1, $2, 'console', $3, $4) ON CONFLICT (tenant_id, number) DO NOTHING";

/// A prefix match both dialects read alike (Postgres' `starts_with` is not
/// SQLite's).
const SEARCH_OPT_OUTS: &str = "SELECT number, source, created_at, added_by FROM opt_outs \
     WHERE tenant_id = $1 AND substr(number, 1, length($2)) = $2 \
     AND ($3 IS NULL OR number > $3) ORDER BY number LIMIT $4";

/// `needle` as a LIKE pattern matching it anywhere, lower case, with `\\`,
/// `%` and `_` taken literally.
fn contains_pattern(needle: &str) -> String {
    let mut p = String::with_capacity(needle.len() + 2);
    p.push('%');
    for c in needle.to_lowercase().chars() {
        if matches!(c, '\\' | '%' | '_') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// A tenant's home country (a test namespace's is its live tenant's).
const HOME_COUNTRY: &str = "SELECT l.home_country FROM tenants t \
     JOIN tenants l ON l.id = COALESCE(t.live_tenant_id, t.id) WHERE t.id = $1";

per_backend! {
    /// Part of a key or of a metadata value, any case, in the tenant's
    /// recent messages (see [`ConsoleStore::search_messages`]).
    const SEARCH_MESSAGES: &str = concat!(
        "SELECT ",
        summary_columns!(),
        " FROM messages WHERE tenant_id = $1 AND created_at >= $3 \
         AND (lower(idempotency_key) LIKE $2 ESCAPE '\\' \
         OR EXISTS (SELECT 1 FROM ",
        json_values!(),
        " j WHERE lower(CAST(j.value AS TEXT)) LIKE $2 ESCAPE '\\')) \
         ORDER BY created_at DESC, id DESC LIMIT $4"
    );

    #[async_trait]
    impl ConsoleStore for Driver {
        async fn create_session(
            &self,
            s: &NewSession,
            idle_cutoff: OffsetDateTime,
        ) -> Result<(), StoreError> {
            let s = s.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    sqlx::query(DELETE_IDLE_SESSIONS)
                        .bind(db(idle_cutoff))
                        .execute(&mut *c)
                        .await?;
                    sqlx::query(INSERT_SESSION)
                        .bind(&s.id_hash)
                        .bind(s.tenant_id)
                        .bind(&s.key_hash)
                        .bind(&s.key_prefix)
                        .bind(&s.csrf_token)
                        .bind(db(s.at))
                        .execute(&mut *c)
                        .await?;
                    Ok(())
                })
            })
            .await
        }

        async fn session(&self, id_hash: &[u8]) -> Result<Option<SessionRecord>, StoreError> {
            let row: Option<SessionRow> = sqlx::query_as(SESSION)
                .bind(id_hash)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(SessionRecord::from))
        }

        async fn touch_session(&self, id_hash: &[u8], at: OffsetDateTime) -> Result<(), StoreError> {
            let id_hash = id_hash.to_vec();
            self.write(move |c| {
                Box::pin(async move {
                    sqlx::query(TOUCH_SESSION)
                        .bind(&id_hash)
                        .bind(db(at))
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
                    sqlx::query(DELETE_SESSION)
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
            let rows: Vec<SummaryRow> = sqlx::query_as(BY_PROVIDER_ID)
                .bind(tenant_id)
                .bind(provider_message_id)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
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
            let rows: Vec<SummaryRow> = sqlx::query_as(TO_NUMBER)
                .bind(tenant_id)
                .bind(number)
                .bind(before.map(|(t, _)| db(t)))
                .bind(before.map(|(_, id)| id.0))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(MessageSummary::from).collect())
        }

        async fn tenant_message(
            &self,
            tenant_id: Uuid,
            id: MessageId,
        ) -> Result<Option<MessageRecord>, StoreError> {
            let row: Option<MessageRow> = sqlx::query_as(TENANT_MESSAGE)
                .bind(id.0)
                .bind(tenant_id)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(MessageRecord::from))
        }

        async fn message_webhook_deliveries(
            &self,
            tenant_id: Uuid,
            id: MessageId,
        ) -> Result<Vec<MessageWebhookDelivery>, StoreError> {
            let rows: Vec<MessageWebhookRow> = sqlx::query_as(MESSAGE_WEBHOOKS)
                .bind(tenant_id)
                .bind(id.0)
                .fetch_all(self.pool())
                .await?;
            Ok(group_webhook_rows(rows))
        }

        async fn overview(
            &self,
            tenant_id: Uuid,
            since: OffsetDateTime,
        ) -> Result<OverviewCounts, StoreError> {
            let by_status_provider: Vec<(String, String, i64)> = sqlx::query_as(BY_STATUS_PROVIDER)
                .bind(tenant_id)
                .bind(db(since))
                .fetch_all(self.pool())
                .await?;
            let attempts_by_provider: Vec<(String, i64, i64)> =
                sqlx::query_as(ATTEMPTS_BY_PROVIDER)
                    .bind(tenant_id)
                    .bind(db(since))
                    .fetch_all(self.pool())
                    .await?;
            let (processing, waiting_retries, oldest_processing): (i64, i64, Option<DbTime>) =
                sqlx::query_as(PROCESSING)
                    .bind(tenant_id)
                    .fetch_one(self.pool())
                    .await?;
            let waiting_webhooks: i64 = sqlx::query_scalar(WAITING_WEBHOOKS)
                .bind(tenant_id)
                .fetch_one(self.pool())
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
                    let done = sqlx::query(ADD_OPT_OUT_BY)
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
            let rows: Vec<OptOutRow> = sqlx::query_as(SEARCH_OPT_OUTS)
                .bind(tenant_id)
                .bind(prefix)
                .bind(after)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(OptOut::from).collect())
        }

        async fn search_messages(
            &self,
            tenant_id: Uuid,
            needle: &str,
            since: OffsetDateTime,
            limit: u32,
        ) -> Result<Vec<MessageSummary>, StoreError> {
            let rows: Vec<SummaryRow> = sqlx::query_as(SEARCH_MESSAGES)
                .bind(tenant_id)
                .bind(contains_pattern(needle))
                .bind(db(since))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(MessageSummary::from).collect())
        }

        async fn home_country(&self, tenant_id: Uuid) -> Result<Option<String>, StoreError> {
            let c: Option<Option<String>> = sqlx::query_scalar(HOME_COUNTRY)
                .bind(tenant_id)
                .fetch_optional(self.pool())
                .await?;
            Ok(c.flatten())
        }

        async fn outbox(
            &self,
            provider: &str,
            tenant_id: Option<Uuid>,
            after: Option<OutboxCursor>,
            limit: u32,
        ) -> Result<Vec<OutboxEntry>, StoreError> {
            let rows: Vec<OutboxRow> = match after {
                None => {
                    let mut rows: Vec<OutboxRow> = sqlx::query_as(OUTBOX_NEWEST)
                        .bind(provider)
                        .bind(tenant_id)
                        .bind(i64::from(limit))
                        .fetch_all(self.pool())
                        .await?;
                    rows.reverse();
                    rows
                }
                Some((at, id, number)) => {
                    sqlx::query_as(OUTBOX_AFTER)
                        .bind(provider)
                        .bind(tenant_id)
                        .bind(db(at))
                        .bind(id.0)
                        .bind(i64::from(number))
                        .bind(i64::from(limit))
                        .fetch_all(self.pool())
                        .await?
                }
            };
            Ok(rows.into_iter().map(OutboxEntry::from).collect())
        }
    }
}
