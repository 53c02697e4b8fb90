//! Console rows: a message summary, a session and a message's webhook
//! deliveries.

use uuid::Uuid;

use crate::domain::{MessageId, Status};
use crate::store::console::{
    MessageSummary, MessageWebhookAttempt, MessageWebhookDelivery, SessionRecord,
};
use crate::store::time::DbTime;

/// A live session as read.
#[derive(sqlx::FromRow)]
pub(crate) struct SessionRow {
    tenant_id: Uuid,
    key_prefix: String,
    csrf_token: String,
    created_at: DbTime,
    last_seen_at: DbTime,
    scopes: String,
    /// The key is a test-mode key (of a test namespace).
    test: bool,
}

impl From<SessionRow> for SessionRecord {
    fn from(r: SessionRow) -> Self {
        SessionRecord {
            tenant_id: r.tenant_id,
            key_prefix: r.key_prefix,
            csrf_token: r.csrf_token,
            created_at: r.created_at.0,
            last_seen_at: r.last_seen_at.0,
            scopes: crate::scopes::Scopes::from_stored(&r.scopes),
            test: r.test,
        }
    }
}

/// A [`MessageSummary`] as both databases return it.
#[derive(sqlx::FromRow)]
pub(crate) struct SummaryRow {
    pub id: Uuid,
    pub idempotency_key: String,
    pub status: Status,
    pub to_number: String,
    pub provider: String,
    pub attempts: i64,
    pub created_at: DbTime,
}

impl From<SummaryRow> for MessageSummary {
    fn from(r: SummaryRow) -> Self {
        MessageSummary {
            id: MessageId(r.id),
            idempotency_key: r.idempotency_key,
            status: r.status,
            to: r.to_number,
            provider: r.provider,
            attempts: u32::try_from(r.attempts).unwrap_or(0),
            created_at: r.created_at.0,
        }
    }
}

/// A row of a message's webhook deliveries, one per attempt (see
/// `store/shared/console.rs`).
#[derive(sqlx::FromRow)]
pub(crate) struct MessageWebhookRow {
    d_id: i64,
    event_type: String,
    event_at: DbTime,
    url: String,
    status: String,
    next_attempt_at: Option<DbTime>,
    updated_at: DbTime,
    enabled: bool,
    disabled_reason: Option<String>,
    a_number: Option<i32>,
    a_outcome: Option<String>,
    a_http_status: Option<i32>,
    a_error: Option<String>,
    a_started_at: Option<DbTime>,
    a_finished_at: Option<DbTime>,
}

/// Groups the rows (ordered by delivery) into deliveries.
pub(crate) fn group_webhook_rows(rows: Vec<MessageWebhookRow>) -> Vec<MessageWebhookDelivery> {
    let mut out: Vec<(i64, MessageWebhookDelivery)> = Vec::new();
    for r in rows {
        let attempt = match (r.a_number, r.a_outcome, r.a_started_at, r.a_finished_at) {
            (Some(n), Some(outcome), Some(started), Some(finished)) => {
                Some(MessageWebhookAttempt {
                    number: u32::try_from(n).unwrap_or(0),
                    outcome,
                    http_status: r.a_http_status.and_then(|s| u16::try_from(s).ok()),
                    error: r.a_error,
                    started_at: started.0,
                    finished_at: finished.0,
                })
            }
            _ => None,
        };
        if out.last().is_none_or(|(id, _)| *id != r.d_id) {
            out.push((
                r.d_id,
                MessageWebhookDelivery {
                    event_type: r.event_type,
                    event_at: r.event_at.0,
                    url: r.url,
                    status: r.status,
                    next_attempt_at: r.next_attempt_at.map(|t| t.0),
                    updated_at: r.updated_at.0,
                    endpoint_enabled: r.enabled,
                    endpoint_disabled_reason: r.disabled_reason,
                    attempts: Vec::new(),
                },
            ));
        }
        if let (Some(a), Some((_, d))) = (attempt, out.last_mut()) {
            d.attempts.push(a);
        }
    }
    out.into_iter().map(|(_, d)| d).collect()
}
