//! The provider calls of this instance that may be in flight, so that a
//! shutdown knows which leases it must hold rather than release (issue 24,
//! finding 1): a call registers before its last lease check and stays
//! registered until it returns; once shutdown has cut calls off, none may
//! start, and a task that reaches one is held too.

use super::Deliverer;
use crate::domain::MessageId;

/// A provider call that may be in flight: registered until dropped, so a
/// shutdown knows which leases it must hold rather than release.
pub(super) struct Call<'a> {
    deliverer: &'a Deliverer,
    id: MessageId,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.deliverer.calls().in_flight.remove(&self.id);
    }
}

impl Deliverer {
    /// Registers a provider call about to start (or a takeover waiting out
    /// someone else's); `None` once shutdown has cut calls off, and then the
    /// message is held rather than released, since its task was that close
    /// to a call (holding what could have been released costs only time).
    pub(super) fn begin_call(&self, id: MessageId) -> Option<Call<'_>> {
        let mut calls = self.calls();
        if calls.stopping {
            calls.held.insert(id);
            return None;
        }
        calls.in_flight.insert(id);
        Some(Call {
            deliverer: self,
            id,
        })
    }

    /// No call may start any more; every call in flight now is held.
    pub(super) fn cut_off_calls(&self) {
        let mut calls = self.calls();
        calls.stopping = true;
        let in_flight: Vec<MessageId> = calls.in_flight.iter().copied().collect();
        calls.held.extend(in_flight);
    }

    /// The messages a shutdown holds rather than releases: those whose call
    /// was in flight when calls were cut off, and those whose task reached a
    /// call afterwards.
    pub(super) fn held_calls(&self) -> Vec<MessageId> {
        self.calls().held.iter().copied().collect()
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, super::Calls> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}
