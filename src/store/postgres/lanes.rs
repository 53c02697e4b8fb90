//! A lane: a queue of writes of one kind and a small task that sends what
//! is waiting to the database together (see `batch.rs` for the statements
//! and why).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::metrics::{BatchKind, BatchSizes};
use crate::store::StoreError;

/// Statements of one kind running at once. Two: a batch forms from what
/// arrives while the other is at the database, and a lone request never
/// waits behind a small running batch under light load (see [`waits`]).
const IN_FLIGHT: usize = 2;
/// A second statement never starts beside a running one of this many rows
/// or more: it would only split what, waiting, becomes one bigger batch, and
/// every statement costs Postgres a commit.
const SHARE_BELOW: usize = 4;
/// Nor beside any running statement while this many requests or more are
/// expected to arrive during one statement: then waiting for the running
/// one fills the next batch (issue 44: at c=32, 7.1 rows per claim instead
/// of 5.0, 0.50 transactions per send instead of 0.75, 7-12% more sends);
/// below it a lone request would wait for almost nothing to join it (a
/// single slot always cost c=4 20-30%: BENCHMARKS.md, "Lanes sized to the
/// load").
const JOIN_AT: f64 = 2.0;
/// Rows per statement at most; the rest waits for the next slot.
const MAX_ROWS: usize = 128;

/// Whether a new statement waits for the running one (gathering what
/// arrives meanwhile) instead of starting beside it: `running` rows are at
/// the database, and `expected` requests will arrive during one statement.
fn waits(running: usize, expected: f64) -> bool {
    running >= SHARE_BELOW || (running > 0 && expected >= JOIN_AT)
}

/// The lane's load: how many requests arrive during one statement, from
/// averages over the last few batches (each weighing 1/8 less than the
/// next) of rows per batch, time between batches, and statement time.
#[derive(Debug)]
struct Load {
    rows: f64,
    gap_us: f64,
    last: Instant,
}

impl Load {
    fn new(now: Instant) -> Self {
        Self {
            rows: 0.0,
            gap_us: 1.0,
            last: now,
        }
    }

    /// A batch of `rows` starts at `now`.
    fn batch(&mut self, rows: usize, now: Instant) {
        self.rows = self.rows * 0.875 + rows as f64;
        self.gap_us = self.gap_us * 0.875 + now.duration_since(self.last).as_micros() as f64;
        self.last = now;
    }

    /// Requests expected during a statement of `statement_us`.
    fn expected(&self, statement_us: u64) -> f64 {
        self.rows / self.gap_us.max(1.0) * statement_us as f64
    }
}

/// The average of a kind's statement times in microseconds (each weighing
/// 1/8 less than the next), kept by the statements' tasks.
#[derive(Debug)]
struct StatementTime(AtomicU64);

impl StatementTime {
    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let old = self.0.load(Ordering::Relaxed);
        self.0.store(old - old / 8 + took / 8, Ordering::Relaxed);
    }
}

type Reply<O> = oneshot::Sender<Result<O, StoreError>>;

/// One kind of coalesced write: a queue drained by a task.
pub(super) struct Lane<I, O> {
    tx: mpsc::UnboundedSender<(I, Reply<O>)>,
}

impl<I: Send + 'static, O: Send + 'static> Lane<I, O> {
    /// Starts the lane's task (on the current Tokio runtime). It ends when
    /// the lane is dropped and the queue is empty.
    pub(super) fn start<F, Fut>(kind: BatchKind, sizes: Arc<BatchSizes>, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<O, StoreError>>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        // Rows of the statements running now.
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let statement = Arc::new(StatementTime(AtomicU64::new(1_000)));
        let run = Arc::new(run);
        tokio::spawn(async move {
            let mut load = Load::new(Instant::now());
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else {
                    return;
                };
                let expected = load.expected(statement.0.load(Ordering::Relaxed));
                if waits(running.load(Ordering::Acquire), expected) {
                    // Wait for the running statement's slot, gathering what
                    // arrives meanwhile into this batch.
                    match slots.acquire().await {
                        Ok(other) => drop(other),
                        Err(_) => return,
                    }
                }
                let mut batch = vec![first];
                while batch.len() < MAX_ROWS {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                sizes.record(kind, batch.len());
                let rows = batch.len();
                let started = Instant::now();
                load.batch(rows, started);
                let statement = Arc::clone(&statement);
                running.fetch_add(rows, Ordering::AcqRel);
                let running = Arc::clone(&running);
                let run = Arc::clone(&run);
                tokio::spawn(async move {
                    let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                    let n = replies.len();
                    let mut results = run(items).await.into_iter();
                    for reply in replies {
                        let result = results.next().unwrap_or(Err(StoreError::Invariant(
                            "a batch answered fewer rows than it was given",
                        )));
                        // The caller may have gone away: its row's fate is
                        // in the database either way.
                        let _ = reply.send(result);
                    }
                    debug_assert!(results.next().is_none(), "batch of {n} answered more");
                    statement.record(started.elapsed());
                    running.fetch_sub(rows, Ordering::AcqRel);
                    drop(slot);
                });
            }
        });
        Self { tx }
    }

    /// Queues `item` and waits for its own result.
    pub(super) async fn call(&self, item: I) -> Result<O, StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send((item, reply)).is_err() {
            return Err(StoreError::Invariant("the store's write queue is closed"));
        }
        answer.await.unwrap_or(Err(StoreError::Invariant(
            "the store's write task ended without an answer",
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_waits_for_the_running_one_only_under_load() {
        // (rows running, requests expected during a statement, waits)
        let table = [
            (0, 0.0, false),
            (0, 50.0, false),
            (1, 0.5, false),
            (3, 1.9, false),
            (1, 2.0, true),
            (3, 7.0, true),
            (4, 0.0, true),
            (100, 0.0, true),
        ];
        for (running, expected, wait) in table {
            assert_eq!(waits(running, expected), wait, "{running} rows, {expected}");
        }
    }

    #[test]
    fn the_load_is_arrivals_per_statement() {
        let t0 = Instant::now();
        let mut load = Load::new(t0);
        // Batches of 4 rows every millisecond: 4 arrivals per millisecond.
        for i in 1..=200u64 {
            load.batch(4, t0 + Duration::from_millis(i));
        }
        let expected = load.expected(1_000);
        assert!((expected - 4.0).abs() < 0.01, "{expected}");
        assert!((load.expected(250) - 1.0).abs() < 0.01);
        // One row every 5 ms: a lone request expects almost no company.
        for i in 1..=200u64 {
            load.batch(1, t0 + Duration::from_millis(200 + 5 * i));
        }
        assert!(load.expected(1_000) < 0.25, "{}", load.expected(1_000));
    }

    #[test]
    fn statement_time_follows_the_recent_statements() {
        let time = StatementTime(AtomicU64::new(1_000));
        for _ in 0..100 {
            time.record(Duration::from_micros(3_000));
        }
        let now = time.0.load(Ordering::Relaxed);
        assert!((2_900..=3_010).contains(&now), "{now}");
    }
}
