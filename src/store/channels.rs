//! Inbound updates of channels of their own (a Telegram bot's), each taken
//! once: the unique (channel, source, event id) of its row decides, in the
//! same transaction as the event and the opt-out it makes
//! (`shared/channels.rs`). The same for every channel (issue 40).

use async_trait::async_trait;
use time::OffsetDateTime;

use super::StoreError;
use crate::domain::inbound::Effect;

/// One update to take.
#[derive(Clone, Debug)]
pub struct TakeUpdate {
    /// The channel it came in on (its adapter's name).
    pub channel: &'static str,
    /// Its source there (a bot's id).
    pub source: i64,
    pub event_id: i64,
    /// The tenant (by name) that owns it.
    pub tenant: String,
    pub effect: Effect,
    pub received_at: OffsetDateTime,
    /// A row for the same id stored before this is a restarted id: the
    /// update is new (never a high-water mark).
    pub restarted_before: OffsetDateTime,
}

/// What taking an update did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// New: stored, with its event and opt-out.
    New,
    /// Taken before: nothing changed.
    Repeat,
    /// The owning tenant does not exist: nothing stored.
    NoTenant,
}

#[async_trait]
pub trait ChannelStore: Send + Sync {
    /// Takes `u` once.
    async fn take_update(&self, u: &TakeUpdate) -> Result<Taken, StoreError>;
    /// Deletes up to `batch` updates of `channel` taken before `cutoff`.
    async fn purge_updates(
        &self,
        channel: &str,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError>;
}
