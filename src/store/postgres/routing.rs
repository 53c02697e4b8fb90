//! Circuits, moving a message on, and message events on Postgres.

use async_trait::async_trait;
use uuid::Uuid;

use super::{PgStore, to_i32};
use crate::domain::MessageId;
use crate::store::StoreError;
use crate::store::routing::{Circuit, CircuitState, MessageEvent, MoveOn, RoutingStore};
use crate::store::time::{DbTime, db};

#[derive(sqlx::FromRow)]
struct CircuitRow {
    provider: String,
    state: String,
    failures: i32,
    window_started_at: Option<DbTime>,
    opened_at: Option<DbTime>,
    probe_started_at: Option<DbTime>,
    version: i64,
    updated_at: DbTime,
}

impl TryFrom<CircuitRow> for Circuit {
    type Error = StoreError;
    fn try_from(r: CircuitRow) -> Result<Self, StoreError> {
        Ok(Circuit {
            provider: r.provider,
            state: CircuitState::parse(&r.state)
                .ok_or(StoreError::Invariant("an unknown circuit state"))?,
            failures: u32::try_from(r.failures).unwrap_or(0),
            window_started_at: r.window_started_at.map(|t| t.0),
            opened_at: r.opened_at.map(|t| t.0),
            probe_started_at: r.probe_started_at.map(|t| t.0),
            version: r.version,
            updated_at: r.updated_at.0,
        })
    }
}

#[derive(sqlx::FromRow)]
struct EventRow {
    at: DbTime,
    kind: String,
    provider: String,
    to_provider: Option<String>,
    detail: String,
}

#[async_trait]
impl RoutingStore for PgStore {
    async fn circuits(&self) -> Result<Vec<Circuit>, StoreError> {
        let rows: Vec<CircuitRow> = sqlx::query_as(
            "SELECT provider, state, failures, window_started_at, opened_at, probe_started_at, \
                version, updated_at FROM provider_circuits ORDER BY provider",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(Circuit::try_from).collect()
    }

    async fn put_circuit(&self, c: &Circuit) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO provider_circuits (provider, state, failures, window_started_at, \
                opened_at, probe_started_at, version, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (provider) DO UPDATE SET state = EXCLUDED.state, \
                failures = EXCLUDED.failures, window_started_at = EXCLUDED.window_started_at, \
                opened_at = EXCLUDED.opened_at, probe_started_at = EXCLUDED.probe_started_at, \
                version = EXCLUDED.version, updated_at = EXCLUDED.updated_at \
             WHERE provider_circuits.version = EXCLUDED.version - 1",
        )
        .bind(&c.provider)
        .bind(c.state.as_str())
        .bind(to_i32(c.failures))
        .bind(c.window_started_at.map(db))
        .bind(c.opened_at.map(db))
        .bind(c.probe_started_at.map(db))
        .bind(c.version)
        .bind(db(c.updated_at))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn move_on(&self, m: &MoveOn) -> Result<Option<u32>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let attempts: Option<i32> = sqlx::query_scalar(
            "UPDATE messages SET provider = $4, \
                lease_expires_at = now() + $5 * interval '1 microsecond', updated_at = $6, \
                attempts = attempts + $7 \
             WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing' AND provider = $3 \
             RETURNING attempts",
        )
        .bind(m.id.0)
        .bind(m.lease.token)
        .bind(&m.from)
        .bind(&m.to)
        .bind(crate::store::time::micros(m.lease.ttl))
        .bind(db(m.now))
        .bind(i32::from(m.closing.is_some()))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(number) = attempts else {
            tx.rollback().await?;
            return Ok(None);
        };
        // Every attempt so far that names no provider was made with `from`.
        sqlx::query(
            "UPDATE attempts SET provider = $2 \
             WHERE message_id = $1 AND provider IS NULL AND finished_at IS NOT NULL",
        )
        .bind(m.id.0)
        .bind(&m.from)
        .execute(&mut *tx)
        .await?;
        if let Some(a) = &m.closing {
            sqlx::query(
                "UPDATE attempts SET finished_at = $3, outcome = $4, http_status = $5, \
                    provider_code = $6, error = $7, provider_message_id = $8, provider = $9 \
                 WHERE message_id = $1 AND number = $2 AND finished_at IS NULL",
            )
            .bind(m.id.0)
            .bind(to_i32(a.number))
            .bind(db(a.finished_at))
            .bind(a.outcome)
            .bind(a.http_status.map(i32::from))
            .bind(&a.provider_code)
            .bind(&a.error)
            .bind(&a.provider_message_id)
            .bind(&m.from)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO attempts (message_id, number, lease_owner, started_at, provider, \
                    sender) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(m.id.0)
            .bind(number)
            .bind(&m.lease.owner)
            .bind(db(m.now))
            .bind(&m.to)
            .bind(&m.sender)
            .execute(&mut *tx)
            .await?;
        } else {
            sqlx::query(
                "UPDATE attempts SET provider = $3, sender = $4 \
                 WHERE message_id = $1 AND number = $2",
            )
            .bind(m.id.0)
            .bind(number)
            .bind(&m.to)
            .bind(&m.sender)
            .execute(&mut *tx)
            .await?;
        }
        insert_event(
            &mut tx,
            m.id,
            &MessageEvent {
                at: m.now,
                kind: "failover".into(),
                provider: m.from.clone(),
                to_provider: Some(m.to.clone()),
                detail: m.reason.clone(),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some(u32::try_from(number).unwrap_or(0)))
    }

    async fn add_message_event(&self, id: MessageId, e: &MessageEvent) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        insert_event(&mut conn, id, e).await
    }

    async fn message_events(&self, id: MessageId) -> Result<Vec<MessageEvent>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT at, kind, provider, to_provider, detail FROM message_events \
             WHERE message_id = $1 ORDER BY at, kind",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| MessageEvent {
                at: r.at.0,
                kind: r.kind,
                provider: r.provider,
                to_provider: r.to_provider,
                detail: r.detail,
            })
            .collect())
    }
}

async fn insert_event(
    conn: &mut sqlx::PgConnection,
    id: MessageId,
    e: &MessageEvent,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO message_events (id, message_id, at, kind, provider, to_provider, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(Uuid::new_v4())
    .bind(id.0)
    .bind(db(e.at))
    .bind(&e.kind)
    .bind(&e.provider)
    .bind(&e.to_provider)
    .bind(&e.detail)
    .execute(conn)
    .await?;
    Ok(())
}
