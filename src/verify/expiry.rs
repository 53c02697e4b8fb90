//! The expiry sweep: a pending verification whose time ran out becomes
//! `expired` within one interval, with its `verification.expired` webhook
//! event written in the same transaction, whether or not anyone checks or
//! resends it again. A check or a resend that comes first expires it
//! itself (`decide::check`/`decide::resend`), so the two never disagree:
//! both move it out of `pending` once, under the row's lock.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// How many verifications one transaction expires.
const BATCH: u32 = 200;

pub struct Expirer {
    store: Arc<dyn Store>,
    clock: Clock,
    metrics: Arc<Metrics>,
    interval: Duration,
}

impl Expirer {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Clock,
        metrics: Arc<Metrics>,
        interval: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            metrics,
            interval,
        }
    }

    /// Expires every pending verification whose time ran out by the clock's
    /// now, batch by batch; returns how many.
    pub async fn expire_now(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        loop {
            let expired = self
                .store
                .expire_verifications(self.clock.now(), BATCH)
                .await?;
            for v in &expired {
                self.metrics.verify_event("expiry", v.country.as_deref());
            }
            total += expired.len();
            if expired.len() < BATCH as usize {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    pub async fn run(self, stop: CancellationToken) {
        crate::shutdown::every(self.interval, stop, "verification expiry sweep", || {
            self.expire_now()
        })
        .await;
    }
}
