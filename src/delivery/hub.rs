//! In-process rendezvous between a delivery task and the requests waiting for
//! its result, so a waiter on the same instance learns the outcome the moment
//! it is stored, without reading the database. Waiters on other instances (or
//! after the task handed the message to the scheduler) poll the row instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::domain::MessageId;
use crate::store::StoredResponse;

type Slot = watch::Sender<Option<StoredResponse>>;

#[derive(Clone, Debug, Default)]
pub struct Hub {
    slots: Arc<Mutex<HashMap<MessageId, Slot>>>,
}

/// Held by a running delivery task; dropping it removes the slot, which tells
/// waiters to fall back to the database.
pub struct Registration {
    hub: Hub,
    id: MessageId,
    tx: Slot,
}

impl Hub {
    /// Registers a running delivery of `id`.
    pub fn register(&self, id: MessageId) -> Registration {
        let (tx, _) = watch::channel(None);
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx.clone());
        Registration {
            hub: self.clone(),
            id,
            tx,
        }
    }

    /// A receiver for the outcome of `id`, if a delivery of it runs here.
    pub fn subscribe(&self, id: MessageId) -> Option<watch::Receiver<Option<StoredResponse>>> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .map(|tx| tx.subscribe())
    }

    /// How many deliveries run here now.
    pub fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Registration {
    /// Publishes the final response to every waiter.
    pub fn complete(&self, response: StoredResponse) {
        self.tx.send_replace(Some(response));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut slots = self
            .hub
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Only remove our own slot: a newer delivery of the same message may
        // have registered since.
        if slots
            .get(&self.id)
            .is_some_and(|tx| tx.same_channel(&self.tx))
        {
            slots.remove(&self.id);
        }
    }
}
