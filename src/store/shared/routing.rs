//! Circuits, moving a message on, and message events: once for both
//! backends.

use async_trait::async_trait;
use uuid::Uuid;

use super::{per_backend, to_i32};
use crate::domain::MessageId;
use crate::store::StoreError;
use crate::store::routing::{Circuit, MessageEvent, MoveOn, RoutingStore};
use crate::store::row::routing::{CircuitRow, EventRow};
use crate::store::time::{DbTime, db};

/// A message's stored cost, tenant and creation (the periods it was
/// charged in).
const MESSAGE_COST: &str = "SELECT cost_micros, tenant_id, created_at FROM messages WHERE id = $1";

const SET_MESSAGE_COST: &str = "UPDATE messages SET cost_micros = $2 WHERE id = $1";

/// A tenant's day (`$2`) and month (`$3`) spend counters moved by `$4`.
const MOVE_SPEND: &str = "UPDATE tenant_spend SET spent_micros = spent_micros + $4 \
     WHERE tenant_id = $1 AND period IN ($2, $3)";

const CIRCUITS: &str = "SELECT provider, state, failures, window_started_at, opened_at, \
        probe_started_at, version, updated_at FROM provider_circuits ORDER BY provider";

/// A compare-and-set on the version: no row is version 0.
const PUT_CIRCUIT: &str = "INSERT INTO provider_circuits (provider, state, failures, \
        window_started_at, opened_at, probe_started_at, version, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (provider) DO UPDATE SET state = EXCLUDED.state, \
        failures = EXCLUDED.failures, window_started_at = EXCLUDED.window_started_at, \
        opened_at = EXCLUDED.opened_at, probe_started_at = EXCLUDED.probe_started_at, \
        version = EXCLUDED.version, updated_at = EXCLUDED.updated_at \
     WHERE provider_circuits.version = EXCLUDED.version - 1";

/// Every attempt so far that names no provider was made with `from`.
const NAME_PAST_ATTEMPTS: &str = "UPDATE attempts SET provider = $2 \
     WHERE message_id = $1 AND provider IS NULL AND finished_at IS NOT NULL";

const CLOSE_ATTEMPT: &str = "UPDATE attempts SET finished_at = $3, outcome = $4, \
        http_status = $5, provider_code = $6, error = $7, provider_message_id = $8, \
        provider = $9 \
     WHERE message_id = $1 AND number = $2 AND finished_at IS NULL";

const OPEN_ATTEMPT: &str = "INSERT INTO attempts (message_id, number, lease_owner, started_at, \
        provider, sender) VALUES ($1, $2, $3, $4, $5, $6)";

const MOVE_OPEN_ATTEMPT: &str = "UPDATE attempts SET provider = $3, sender = $4 \
     WHERE message_id = $1 AND number = $2";

const INSERT_EVENT: &str = "INSERT INTO message_events (id, message_id, at, kind, provider, \
        to_provider, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)";

const MESSAGE_EVENTS: &str = "SELECT at, kind, provider, to_provider, detail \
     FROM message_events WHERE message_id = $1 ORDER BY at, kind";

per_backend! {
    /// Moves the message to `m.to` if the lease is still ours, extending it
    /// for its ttl on the database's clock; the attempt number now open.
    const MOVE_MESSAGE: &str = concat!(
        "UPDATE messages SET provider = $4, lease_expires_at = ",
        db_now!(),
        " + $5",
        us!(),
        ", updated_at = $6, attempts = attempts + $7 \
         WHERE id = $1 AND lease_token = $2 AND status || '' = 'processing' AND provider = $3 \
         RETURNING attempts"
    );

    #[async_trait]
    impl RoutingStore for Driver {
        async fn circuits(&self) -> Result<Vec<Circuit>, StoreError> {
            let rows: Vec<CircuitRow> = sqlx::query_as(CIRCUITS).fetch_all(self.pool()).await?;
            rows.into_iter().map(Circuit::try_from).collect()
        }

        async fn put_circuit(&self, c: &Circuit) -> Result<bool, StoreError> {
            let c = c.clone();
            self.write(move |conn| {
                Box::pin(async move {
                    let done = sqlx::query(PUT_CIRCUIT)
                        .bind(&c.provider)
                        .bind(c.state.as_str())
                        .bind(to_i32(c.failures))
                        .bind(c.window_started_at.map(db))
                        .bind(c.opened_at.map(db))
                        .bind(c.probe_started_at.map(db))
                        .bind(c.version)
                        .bind(db(c.updated_at))
                        .execute(&mut *conn)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
        }

        async fn move_on(&self, m: &MoveOn) -> Result<Option<u32>, StoreError> {
            let m = m.clone();
            self.write_tx(move |tx| Box::pin(async move { move_on(tx, &m).await }))
                .await
        }

        async fn add_message_event(
            &self,
            id: MessageId,
            e: &MessageEvent,
        ) -> Result<(), StoreError> {
            let e = e.clone();
            self.write(move |conn| Box::pin(async move { insert_event(conn, id, &e).await }))
                .await
        }

        async fn message_events(&self, id: MessageId) -> Result<Vec<MessageEvent>, StoreError> {
            let rows: Vec<EventRow> = sqlx::query_as(MESSAGE_EVENTS)
                .bind(id.0)
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(MessageEvent::from).collect())
        }
    }

    /// The message's stored cost set to `new` (when it has one), and the
    /// tenant's spend counters of the day and month it was charged in moved
    /// by the difference (only counters that exist: one seeded later sums
    /// the messages' costs, this one included).
    async fn reprice(tx: &mut Conn, id: MessageId, new: i64) -> Result<(), StoreError> {
        let row: Option<(Option<i64>, Uuid, DbTime)> = sqlx::query_as(MESSAGE_COST)
            .bind(id.0)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((Some(old), tenant_id, created_at)) = row else {
            return Ok(());
        };
        let delta = new.saturating_sub(old);
        if delta == 0 {
            return Ok(());
        }
        sqlx::query(SET_MESSAGE_COST)
            .bind(id.0)
            .bind(new)
            .execute(&mut *tx)
            .await?;
        let period = crate::spend::Period::at(created_at.0);
        sqlx::query(MOVE_SPEND)
            .bind(tenant_id)
            .bind(&period.day)
            .bind(&period.month)
            .bind(delta)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    /// [`RoutingStore::move_on`] inside a transaction: nothing is written
    /// when the lease is no longer ours.
    async fn move_on(tx: &mut Conn, m: &MoveOn) -> Result<Option<u32>, StoreError> {
        let attempts: Option<i32> = sqlx::query_scalar(MOVE_MESSAGE)
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
            return Ok(None);
        };
        sqlx::query(NAME_PAST_ATTEMPTS)
            .bind(m.id.0)
            .bind(&m.from)
            .execute(&mut *tx)
            .await?;
        if let Some(cost) = m.cost_micros {
            reprice(tx, m.id, cost).await?;
        }
        if let Some(a) = &m.closing {
            sqlx::query(CLOSE_ATTEMPT)
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
            sqlx::query(OPEN_ATTEMPT)
                .bind(m.id.0)
                .bind(number)
                .bind(&m.lease.owner)
                .bind(db(m.now))
                .bind(&m.to)
                .bind(&m.sender)
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query(MOVE_OPEN_ATTEMPT)
                .bind(m.id.0)
                .bind(number)
                .bind(&m.to)
                .bind(&m.sender)
                .execute(&mut *tx)
                .await?;
        }
        let event = MessageEvent {
            at: m.now,
            kind: "failover".into(),
            provider: m.from.clone(),
            to_provider: Some(m.to.clone()),
            detail: m.reason.clone(),
        };
        insert_event(tx, m.id, &event).await?;
        Ok(Some(u32::try_from(number).unwrap_or(0)))
    }

    async fn insert_event(c: &mut Conn, id: MessageId, e: &MessageEvent) -> Result<(), StoreError> {
        sqlx::query(INSERT_EVENT)
            .bind(Uuid::new_v4())
            .bind(id.0)
            .bind(db(e.at))
            .bind(&e.kind)
            .bind(&e.provider)
            .bind(&e.to_provider)
            .bind(&e.detail)
            .execute(c)
            .await?;
        Ok(())
    }
}
