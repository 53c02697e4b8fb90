//! Routing rows: a circuit and a message event.

use crate::store::StoreError;
use crate::store::routing::{Circuit, CircuitState, MessageEvent};
use crate::store::time::DbTime;

/// A `provider_circuits` row (`failures` is `integer` on Postgres: `i32`
/// decodes on both).
#[derive(sqlx::FromRow)]
pub(crate) struct CircuitRow {
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

/// A `message_events` row.
#[derive(sqlx::FromRow)]
pub(crate) struct EventRow {
    at: DbTime,
    kind: String,
    provider: String,
    to_provider: Option<String>,
    detail: String,
}

impl From<EventRow> for MessageEvent {
    fn from(r: EventRow) -> Self {
        MessageEvent {
            at: r.at.0,
            kind: r.kind,
            provider: r.provider,
            to_provider: r.to_provider,
            detail: r.detail,
        }
    }
}
