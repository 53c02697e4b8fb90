//! Receipts left behind by a stopped instance.
//!
//! A receipt can overtake our write of its message's provider id (a fast
//! provider's callback, or a send whose answer was lost and found again by
//! a retry or a reconciliation). It is kept unlinked, and whoever writes the
//! id looks for it right after that commit (`apply::attach_early_receipts`)
//! while the receipt path looks again after its own: one of the two sees the
//! other. An instance that stops (a crash, a kill) between its commit and
//! its look leaves the receipt unlinked for good, and its message `sent`
//! although the provider said `delivered`; for a verification's Telegram
//! message that also means a fallback SMS it did not need.
//!
//! Both rows are in the database, so every instance, on the scheduler's
//! beat, links the unlinked receipts of the last [`Orphans::window`] whose
//! id a message holds now (one indexed read; nothing when there are none),
//! through the same attach as the look.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, to_time};
use crate::store::{Store, StoreError};

/// How many ids one pass links at most.
const BATCH: u32 = 100;

pub struct Orphans {
    pub store: Arc<dyn Store>,
    pub clock: Clock,
    pub interval: Duration,
    /// How far back receipts are looked at: a message gets its provider id
    /// within its retry deadline, so older unlinked receipts are another
    /// system's (kept for `sendonce receipts unmatched`, never linked here).
    pub window: Duration,
}

impl Orphans {
    /// The window for a retry deadline: the deadline and a quarter of an
    /// hour for rescues and reconciliations that finish after it.
    pub fn window_for(deadline: Duration) -> Duration {
        deadline.saturating_add(Duration::from_secs(15 * 60))
    }

    /// One pass: links what it finds; how many ids moved their message.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let since = now
            .checked_sub(to_time(self.window))
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let found = self.store.orphaned_receipts(since, BATCH).await?;
        let mut moved = 0;
        for (provider, id) in &found {
            if self.store.attach_receipts(provider, id, now).await? {
                moved += 1;
            }
        }
        if !found.is_empty() {
            tracing::info!(
                ids = found.len(),
                moved,
                "linked receipts left unlinked by an instance that stopped before it looked"
            );
        }
        Ok(moved)
    }

    pub async fn run(self, stop: CancellationToken) {
        crate::shutdown::every(
            self.interval,
            stop,
            "the pass over unlinked receipts",
            || self.run_once(),
        )
        .await;
    }
}
