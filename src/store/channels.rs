//! Inbound updates of channels of their own (a Telegram bot's), each taken
//! once: the unique (bot, `update_id`) of its row decides, in the same
//! transaction as the event and the opt-out it makes (`shared/channels.rs`).

use async_trait::async_trait;
use time::OffsetDateTime;

use super::StoreError;
use crate::provider::telegram::updates::Effect;

/// One update to take.
#[derive(Clone, Debug)]
pub struct TakeUpdate {
    pub bot_id: i64,
    pub update_id: i64,
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
    async fn take_telegram_update(&self, u: &TakeUpdate) -> Result<Taken, StoreError>;
    /// Deletes up to `batch` updates taken before `cutoff`.
    async fn purge_telegram_updates(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError>;
}
