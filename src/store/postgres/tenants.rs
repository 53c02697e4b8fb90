//! Tenants on Postgres: what is its own (the statements are in
//! `store/shared/tenants.rs`).

use super::PgStore;
use crate::notify::Acks;

impl PgStore {
    /// Starts counting the instances that must acknowledge a change to
    /// what they cache, before the change commits (see [`Acks`]).
    pub(crate) async fn start_acks(&self) -> Option<Acks> {
        Acks::start(self.session_pool()).await
    }
}
