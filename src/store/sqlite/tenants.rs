//! Tenants on SQLite: what is its own (the statements are in
//! `store/shared/tenants.rs`).

use super::SqliteStore;
use crate::notify::Acks;

impl SqliteStore {
    /// No other instance caches what this one changes: nothing to wait for.
    pub(crate) async fn start_acks(&self) -> Option<Acks> {
        None
    }
}
