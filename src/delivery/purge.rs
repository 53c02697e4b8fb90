//! Retention: deletes final messages older than the retention window, in
//! small batches so the purge never holds many locks or bloats one
//! transaction. Once a message is purged its key may be used again.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, to_time};
use crate::store::{Store, StoreError};

pub struct Purger {
    store: Arc<dyn Store>,
    clock: Clock,
    retention: Duration,
    interval: Duration,
    batch: u32,
}

impl Purger {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Clock,
        retention: Duration,
        interval: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            retention,
            interval,
            batch: 500,
        }
    }

    /// Deletes everything past retention now. Returns how many messages.
    pub async fn purge_now(&self) -> Result<u64, StoreError> {
        let cutoff = self.clock.now() - to_time(self.retention);
        let mut total = 0;
        loop {
            let n = self.store.purge(cutoff, self.batch).await?;
            total += n;
            if n < u64::from(self.batch) {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.purge_now().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "purged messages past retention"),
                Err(e) => tracing::warn!(error = %e, "purge failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}
