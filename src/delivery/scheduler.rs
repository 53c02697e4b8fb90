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
use crate::store::{Store, StoreError};

pub struct Scheduler {
    store: Arc<dyn Store>,
    deliverer: Arc<Deliverer>,
    interval: Duration,
    batch: u32,
    /// Scans the background loop finished (claimed or not, failed or not).
    scans: std::sync::atomic::AtomicU64,
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, deliverer: Arc<Deliverer>, interval: Duration) -> Self {
        Self {
            store,
            deliverer,
            interval,
            batch: 100,
            scans: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many scans the background loop ([`Scheduler::run`]) finished: a
    /// test that runs [`Scheduler::tick`] itself waits for the loop's first
    /// (at start), which holds the free send slots while it runs.
    pub fn scans(&self) -> u64 {
        self.scans.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Claims what is due now and starts delivering it. Returns how many
    /// messages were claimed.
    pub async fn tick(&self) -> Result<usize, StoreError> {
        self.scan().await.map(|(n, _)| n)
    }

    /// [`Scheduler::tick`], also returning how many slots it had.
    async fn scan(&self) -> Result<(usize, usize), StoreError> {
        // Take the send slots first and hand one to each claimed message: a
        // claimed message never waits, leased, for a slot. The spare slots
        // stay for tenants' next new sends (`fair`).
        let mut permits = Vec::new();
        let want = (self.batch as usize).min(self.deliverer.claimable_permits());
        while permits.len() < want {
            match self.deliverer.try_permit() {
                Some(p) => permits.push(p),
                None => break,
            }
        }
        if permits.is_empty() {
            return Ok((0, 0));
        }
        let slots = permits.len();
        let limit = u32::try_from(permits.len()).unwrap_or(u32::MAX);
        let now = self.deliverer.clock().now();
        let claimed = self
            .store
            .claim_due(
                self.deliverer.owner(),
                now,
                self.deliverer.settings().lease,
                limit,
            )
            .await?;
        let n = claimed.len();
        // Slots left over (fewer messages were due) go back when dropped.
        for ((msg, lease), permit) in claimed.into_iter().zip(permits) {
            // A leased row has no due time: one claimed without being due
            // was taken from an owner whose lease ran out.
            let start = if msg.next_attempt_at.is_none_or(|due| due > now) {
                tracing::info!(message_id = %msg.id, attempts = msg.attempts, "rescuing a message whose lease expired");
                self.deliverer.metrics().takeover();
                super::Start::Takeover
            } else {
                super::Start::Due
            };
            self.deliverer.spawn_with_permit(msg, lease, start, permit);
        }
        // Left-over slots were given back: deliveries waiting look again.
        self.deliverer.slots_returned();
        Ok((n, slots))
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let nudge = Arc::clone(&self.deliverer.nudge);
        // The last scan filled every slot it had, so more may be due (a
        // batch, schedules falling due in bulk): scan again as soon as a
        // slot frees rather than after the interval.
        let mut more = false;
        loop {
            let scanned = self.scan().await;
            self.scans.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            match scanned {
                // A full batch, or every slot filled: there may be more.
                Ok((n, slots)) if n as u32 == self.batch || (n > 0 && n == slots) => {
                    more = true;
                    continue;
                }
                Ok((0, 0)) if more => {
                    tokio::select! {
                        freed = self.deliverer.slot_freed() => {
                            if freed {
                                continue;
                            }
                        }
                        () = shutdown.cancelled() => return,
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "scheduler scan failed"),
            }
            more = false;
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = nudge.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}
