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
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Told what was purged, so no cache replays a purged key.
    notifier: Option<crate::notify::Notifier>,
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
            metrics: None,
            notifier: None,
        }
    }

    /// Counts what is purged in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Deletes up to `batch` messages per transaction (tests use small ones).
    /// Publishes each purge to this instance's caches (on Postgres every
    /// instance also hears it from the database).
    pub fn with_notifier(mut self, notifier: crate::notify::Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    pub fn with_batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Deletes everything past retention now. Returns how many messages.
    pub async fn purge_now(&self) -> Result<u64, StoreError> {
        self.purge_until(&CancellationToken::new()).await
    }

    /// Deletes what is past retention, batch by batch, until done or `stop`
    /// is cancelled (checked between batches). Returns how many messages.
    pub async fn purge_until(&self, stop: &CancellationToken) -> Result<u64, StoreError> {
        let cutoff = self.clock.now() - to_time(self.retention);
        let mut total = 0;
        loop {
            let n = self.store.purge(cutoff, self.batch).await?;
            total += n;
            if n > 0
                && let Some(notifier) = &self.notifier
            {
                notifier.publish(crate::notify::Event::Purged(cutoff));
            }
            if let Some(m) = &self.metrics {
                m.purged(n);
            }
            if n < u64::from(self.batch) {
                // Receipts that never found their message (the others go
                // with it) are kept for the same window.
                while !stop.is_cancelled()
                    && self
                        .store
                        .purge_unmatched_receipts(cutoff, self.batch)
                        .await?
                        == u64::from(self.batch)
                {
                    tokio::task::yield_now().await;
                }
                // Verifications expired before the window (their messages
                // went above, by their own age).
                while !stop.is_cancelled()
                    && self.store.purge_verifications(cutoff, self.batch).await?
                        == u64::from(self.batch)
                {
                    tokio::task::yield_now().await;
                }
                // A channel's inbound updates are kept as long as its
                // route says, whatever the retention: an id seen within
                // that is a repeat, an older one a restarted id.
                for adapter in crate::provider::registry::ADAPTERS {
                    let Some(inbound) = &adapter.inbound else {
                        continue;
                    };
                    let updates_cutoff = self.clock.now() - to_time(inbound.keep);
                    while !stop.is_cancelled()
                        && self
                            .store
                            .purge_updates(adapter.name, updates_cutoff, self.batch)
                            .await?
                            == u64::from(self.batch)
                    {
                        tokio::task::yield_now().await;
                    }
                }
                // Webhook events (the feed) are kept as long as messages.
                while !stop.is_cancelled()
                    && self.store.purge_webhook_events(cutoff, self.batch).await?
                        == u64::from(self.batch)
                {
                    tokio::task::yield_now().await;
                }
                return Ok(total);
            }
            if stop.is_cancelled() {
                tracing::info!(purged = total, "purge stopped by shutdown");
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.purge_until(&shutdown).await {
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
