//! The scheduler (and rescuer): claims messages whose retry is due, and
//! messages whose owner's lease expired (the owner crashed, hung or lost the
//! database), and resumes them. Every instance runs one; `FOR UPDATE SKIP
//! LOCKED` in the claim makes sure no row is handed to two of them.
//!
//! It wakes on a fixed interval, when a local retry falls due (a nudge), and
//! stops when told to.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Deliverer;
use crate::clock::to_time;
use crate::store::{Store, StoreError};

pub struct Scheduler {
    store: Arc<dyn Store>,
    deliverer: Arc<Deliverer>,
    interval: Duration,
    batch: u32,
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, deliverer: Arc<Deliverer>, interval: Duration) -> Self {
        Self {
            store,
            deliverer,
            interval,
            batch: 100,
        }
    }

    /// Claims what is due now and starts delivering it. Returns how many
    /// messages were claimed.
    pub async fn tick(&self) -> Result<usize, StoreError> {
        let free = self.deliverer.free_permits();
        if free == 0 {
            return Ok(0);
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX).min(self.batch);
        let now = self.deliverer.clock().now();
        let lease_until = now + to_time(self.deliverer.settings().lease);
        let claimed = self
            .store
            .claim_due(self.deliverer.owner(), now, lease_until, limit)
            .await?;
        let n = claimed.len();
        for (msg, lease) in claimed {
            if msg.next_attempt_at.is_none_or(|due| due > now) {
                tracing::info!(message_id = %msg.id, attempts = msg.attempts, "rescuing a message whose lease expired");
                self.deliverer.metrics().takeover();
            }
            self.deliverer.spawn(msg, lease, false);
        }
        Ok(n)
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let nudge = Arc::clone(&self.deliverer.nudge);
        loop {
            match self.tick().await {
                // A full batch: there may be more waiting.
                Ok(n) if n as u32 == self.batch => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "scheduler scan failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = nudge.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}
