//! Scheduled messages and a batch's rows on SQLite (issue 15): each a job
//! for the one writer, so a batch is one transaction (the cancel is in
//! `store/shared/messages.rs`).

use sqlx::SqliteConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::row::{KeyStateRow, key_state_columns};
use crate::store::time::db;
use crate::store::{Claim, MessageReadStore, MessageRecord, NewMessage, Queued, StoreError};

async fn schedule(
    c: &mut SqliteConnection,
    m: &NewMessage,
    due: OffsetDateTime,
    send_at: Option<OffsetDateTime>,
) -> Result<Claim, StoreError> {
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
                provider, attempts, next_attempt_at, send_at, created_at, updated_at, \
                expires_at, deadline_at, route, cost_micros, cost_currency, route_order) \
             VALUES (?, ?, ?, ?, 'scheduled', ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id",
    )
    .bind(m.id.0)
    .bind(m.tenant_id)
    .bind(&m.idempotency_key)
    .bind(&m.fingerprint)
    .bind(&m.to)
    .bind(&m.from)
    .bind(&m.body)
    .bind(i64::from(m.segments))
    .bind(m.encoding)
    .bind(Json(&m.metadata))
    .bind(m.validity_seconds)
    .bind(&m.provider)
    .bind(db(due))
    .bind(send_at.map(db))
    .bind(db(m.created_at))
    .bind(db(m.created_at))
    .bind(m.expires_at.map(db))
    .bind(db(m.deadline_at))
    .bind(&m.route)
    .bind(m.cost_columns().0)
    .bind(m.cost_columns().1)
    .bind(&m.route_order)
    .fetch_optional(&mut *c)
    .await?;
    if inserted.is_some() {
        return Ok(Claim::Created(Box::new(MessageRecord::scheduled(
            m, due, send_at,
        ))));
    }
    let row: Option<KeyStateRow> = sqlx::query_as(concat!(
        "SELECT ",
        key_state_columns!(),
        " FROM messages WHERE tenant_id = ? AND idempotency_key = ?"
    ))
    .bind(m.tenant_id)
    .bind(&m.idempotency_key)
    .fetch_optional(&mut *c)
    .await?;
    row.map(|row| Claim::Existing(row.into()))
        .ok_or(StoreError::Invariant("a taken key without its row"))
}

/// A batch's rows in the writer's one transaction: each inserted without a
/// lease, or the state of the message holding its key.
async fn insert_rows(c: &mut SqliteConnection, items: &[Queued]) -> Result<Vec<Claim>, StoreError> {
    let mut answers = Vec::with_capacity(items.len());
    for q in items {
        let m = &q.message;
        let inserted: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                    to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
                    provider, attempts, next_attempt_at, send_at, created_at, updated_at, \
                    expires_at, deadline_at, route, cost_micros, cost_currency, route_order) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id",
        )
        .bind(m.id.0)
        .bind(m.tenant_id)
        .bind(&m.idempotency_key)
        .bind(&m.fingerprint)
        .bind(q.status())
        .bind(&m.to)
        .bind(&m.from)
        .bind(&m.body)
        .bind(i64::from(m.segments))
        .bind(m.encoding)
        .bind(Json(&m.metadata))
        .bind(m.validity_seconds)
        .bind(&m.provider)
        .bind(db(q.due))
        .bind(q.send_at.map(db))
        .bind(db(m.created_at))
        .bind(db(m.created_at))
        .bind(m.expires_at.map(db))
        .bind(db(m.deadline_at))
        .bind(&m.route)
        .bind(m.cost_columns().0)
        .bind(m.cost_columns().1)
        .bind(&m.route_order)
        .fetch_optional(&mut *c)
        .await?;
        if inserted.is_some() {
            answers.push(Claim::Created(Box::new(q.record())));
            continue;
        }
        let row: Option<KeyStateRow> = sqlx::query_as(concat!(
            "SELECT ",
            key_state_columns!(),
            " FROM messages WHERE tenant_id = ? AND idempotency_key = ?"
        ))
        .bind(m.tenant_id)
        .bind(&m.idempotency_key)
        .fetch_optional(&mut *c)
        .await?;
        let state = row.ok_or(StoreError::Invariant("a taken key without its row"))?;
        answers.push(Claim::Existing(state.into()));
    }
    Ok(answers)
}

impl SqliteStore {
    #[tracing::instrument(name = "store.schedule_message", level = "debug", skip_all, fields(message_id = %m.id))]
    pub(super) async fn schedule_one(
        &self,
        m: &NewMessage,
        due: OffsetDateTime,
        send_at: Option<OffsetDateTime>,
    ) -> Result<Claim, StoreError> {
        if let Some(state) = self
            .key_state(m.tenant_id, m.idempotency_key.as_str())
            .await?
        {
            return Ok(Claim::Existing(state));
        }
        let m = m.clone();
        self.write(move |c| Box::pin(async move { schedule(c, &m, due, send_at).await }))
            .await
    }

    #[tracing::instrument(name = "store.insert_batch", level = "debug", skip_all, fields(rows = items.len()))]
    pub(super) async fn insert_queued(&self, items: &[Queued]) -> Result<Vec<Claim>, StoreError> {
        let items = items.to_vec();
        self.write(move |c| Box::pin(async move { insert_rows(c, &items).await }))
            .await
    }
}
