//! Routing records: the circuit breaker shared by every instance, a message
//! moving on to the next provider, and the routing events of a message.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{AttemptResult, Lease, StoreError};
use crate::domain::MessageId;

/// The state of one provider's circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CircuitState {
    /// Sends go to the provider.
    Closed,
    /// New sends go to the next provider.
    Open,
    /// One probe send is on its way to the provider.
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "closed" => Self::Closed,
            "open" => Self::Open,
            "half_open" => Self::HalfOpen,
            _ => return None,
        })
    }

    /// The value of the `sendonce_provider_circuit_state` gauge.
    pub fn gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::HalfOpen => 1.0,
            Self::Open => 2.0,
        }
    }
}

/// One provider's circuit breaker, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circuit {
    pub provider: String,
    pub state: CircuitState,
    /// Failures in a row, counted since `window_started_at`.
    pub failures: u32,
    pub window_started_at: Option<OffsetDateTime>,
    pub opened_at: Option<OffsetDateTime>,
    pub probe_started_at: Option<OffsetDateTime>,
    /// Bumped by every change; writes are compare-and-set on it. 0: no row yet.
    pub version: i64,
    pub updated_at: OffsetDateTime,
}

impl Circuit {
    /// A provider nobody has recorded anything about.
    pub fn closed(provider: &str, now: OffsetDateTime) -> Self {
        Self {
            provider: provider.to_string(),
            state: CircuitState::Closed,
            failures: 0,
            window_started_at: None,
            opened_at: None,
            probe_started_at: None,
            version: 0,
            updated_at: now,
        }
    }
}

/// A fenced write that moves a message to another provider.
#[derive(Clone, Debug)]
pub struct MoveOn {
    pub id: MessageId,
    /// The lease held; it is extended to its `expires_at`.
    pub lease: Lease,
    pub from: String,
    pub to: String,
    /// The attempt this closes (the provider answered it); the next attempt
    /// starts on `to`. `None`: the open attempt was not sent and simply
    /// moves to `to`.
    pub closing: Option<AttemptResult>,
    /// Why, as shown in the message's events.
    pub reason: String,
    pub now: OffsetDateTime,
    /// Who the attempt on `to` sends as ([`crate::provider::Provider::sender`]).
    pub sender: Option<String>,
    /// The message's cost at `to`'s price, when it has a cost: it replaces
    /// the stored one, and the tenant's spend counters take the difference
    /// (a failover is charged at the price of the provider that sends;
    /// issue 41, finding 9).
    pub cost_micros: Option<i64>,
}

/// A routing event of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageEvent {
    pub at: OffsetDateTime,
    /// `failover`, `circuit_opened` or `circuit_closed`.
    pub kind: String,
    pub provider: String,
    pub to_provider: Option<String>,
    pub detail: String,
}

#[async_trait]
pub trait RoutingStore: Send + Sync {
    /// Every stored circuit.
    async fn circuits(&self) -> Result<Vec<Circuit>, StoreError>;
    /// Writes `c` if the stored version is still `c.version - 1` (no row for
    /// version 1). False when another instance changed it first.
    async fn put_circuit(&self, c: &Circuit) -> Result<bool, StoreError>;
    /// Moves a message to `m.to` (fenced on the lease, recording a
    /// `failover` event in the same transaction). Returns the number of the
    /// attempt now open, or `None` when the lease is no longer ours.
    async fn move_on(&self, m: &MoveOn) -> Result<Option<u32>, StoreError>;
    /// Records an event of a message (not fenced: it only informs).
    async fn add_message_event(&self, id: MessageId, e: &MessageEvent) -> Result<(), StoreError>;
    /// A message's routing events, oldest first.
    async fn message_events(&self, id: MessageId) -> Result<Vec<MessageEvent>, StoreError>;
}
