//! In-process rendezvous between a delivery and the requests waiting for its
//! result (issue 18, finding 5).
//!
//! Every message someone waits for, or that is being delivered here, has one
//! slot. A delivery running on this instance publishes its final response in
//! the slot the moment it is stored, so a waiter here learns it without
//! reading the database. While no delivery of the message runs here (it waits
//! in backoff, or another instance holds it) one poller per message, not one
//! per waiter, reads its row with a backoff capped at [`POLL_CAP`], and stops
//! as soon as a delivery registers here again, the answer is known, or the
//! last waiter is gone. However many requests wait for one message, this
//! instance reads its row at most once per [`POLL_CAP`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::MessageId;
use crate::store::{Store, StoredResponse};

/// Longest pause between two reads of a waited-for message's row.
pub const POLL_CAP: Duration = Duration::from_millis(250);

/// First pause of a poller.
const POLL_FIRST: Duration = Duration::from_millis(10);

struct Slot {
    tx: watch::Sender<Option<StoredResponse>>,
    /// Deliveries of this message running here.
    local: usize,
    /// A poller task runs for this message.
    poller: bool,
}

impl Slot {
    fn done(&self) -> bool {
        self.tx.borrow().is_some()
    }
}

#[derive(Default)]
struct Inner {
    slots: Mutex<HashMap<MessageId, Slot>>,
    /// Reads rows for pollers; unset in unit tests of the hub alone.
    store: Option<Arc<dyn Store>>,
}

#[derive(Clone, Default)]
pub struct Hub {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("slots", &self.slots()).finish()
    }
}

/// Held by a running delivery task; dropping it without a final answer
/// hands any waiters over to a poller.
pub struct Registration {
    hub: Hub,
    id: MessageId,
}

impl Hub {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                slots: Mutex::default(),
                store: Some(store),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MessageId, Slot>> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a running delivery of `id`.
    pub fn register(&self, id: MessageId) -> Registration {
        let mut slots = self.lock();
        let slot = slots.entry(id).or_insert_with(|| Slot {
            tx: watch::channel(None).0,
            local: 0,
            poller: false,
        });
        slot.local += 1;
        Registration {
            hub: self.clone(),
            id,
        }
    }

    /// A receiver for the final response of `id`, fed by the delivery here
    /// or by the message's one poller (started if needed).
    pub fn wait(&self, id: MessageId) -> watch::Receiver<Option<StoredResponse>> {
        let mut slots = self.lock();
        let slot = slots.entry(id).or_insert_with(|| Slot {
            tx: watch::channel(None).0,
            local: 0,
            poller: false,
        });
        let rx = slot.tx.subscribe();
        self.ensure_poller(id, slot);
        rx
    }

    /// Starts the poller of a slot that needs one: someone waits, no answer
    /// yet, no delivery here and no poller already.
    fn ensure_poller(&self, id: MessageId, slot: &mut Slot) {
        if slot.poller || slot.local > 0 || slot.done() || slot.tx.receiver_count() == 0 {
            return;
        }
        let Some(store) = self.inner.store.clone() else {
            return;
        };
        slot.poller = true;
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(poll(weak, store, id));
    }

    /// How many deliveries run here now.
    pub fn len(&self) -> usize {
        self.lock().values().filter(|s| s.local > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots (messages delivered here or waited for) held now.
    pub fn slots(&self) -> usize {
        self.lock().len()
    }

    /// Pollers running now.
    pub fn pollers(&self) -> usize {
        self.lock().values().filter(|s| s.poller).count()
    }
}

/// The one poller of a message: reads its row until it is final, a delivery
/// of it registers here, or nobody waits any more.
async fn poll(hub: Weak<Inner>, store: Arc<dyn Store>, id: MessageId) {
    let mut pause = POLL_FIRST;
    loop {
        {
            let Some(inner) = hub.upgrade() else { return };
            let mut slots = inner.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            let waiters = slot.tx.receiver_count();
            if slot.done() || slot.local > 0 || waiters == 0 {
                slot.poller = false;
                if slot.local == 0 {
                    slots.remove(&id);
                }
                return;
            }
        }
        match store.state_by_id(id).await {
            Ok(Some(state)) if state.status.is_final() && state.response.is_some() => {
                if let Some(inner) = hub.upgrade()
                    && let Some(slot) = inner
                        .slots
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(&id)
                {
                    slot.tx.send_replace(state.response);
                }
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, message_id = %id, "could not read a waited-for message")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL_CAP);
    }
}

impl Registration {
    /// Publishes the final response to every waiter.
    pub fn complete(&self, response: StoredResponse) {
        if let Some(slot) = self.hub.lock().get(&self.id) {
            slot.tx.send_replace(Some(response));
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let hub = self.hub.clone();
        let mut slots = hub.lock();
        let Some(slot) = slots.get_mut(&self.id) else {
            return;
        };
        slot.local = slot.local.saturating_sub(1);
        if slot.local > 0 {
            return;
        }
        if slot.done() || (slot.tx.receiver_count() == 0 && !slot.poller) {
            // Waiters already subscribed keep the value they were sent.
            slots.remove(&self.id);
            return;
        }
        // Ended without a final answer (a retry is scheduled, or the lease
        // was lost): the waiters' poller takes over.
        hub.ensure_poller(self.id, slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_delivery_answers_its_waiters_and_leaves_nothing() {
        let hub = Hub::default();
        let id = MessageId::new();
        let reg = hub.register(id);
        let mut rx = hub.wait(id);
        let response = StoredResponse {
            status_code: 201,
            body: b"{}".to_vec(),
        };
        reg.complete(response.clone());
        drop(reg);
        assert_eq!(hub.slots(), 0);
        let got = rx.wait_for(Option::is_some).await.expect("value kept");
        assert_eq!(got.as_ref(), Some(&response));
    }

    #[tokio::test]
    async fn a_registration_without_waiters_leaves_no_slot() {
        let hub = Hub::default();
        let id = MessageId::new();
        let reg = hub.register(id);
        assert_eq!(hub.len(), 1);
        drop(reg);
        assert_eq!(hub.slots(), 0);
        assert!(hub.is_empty());
    }
}
