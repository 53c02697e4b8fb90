//! A lane: a queue of writes of one kind and a small task that sends what
//! is waiting to the database together (see `batch.rs` for the statements
//! and why).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::metrics::{BatchKind, BatchSizes};
use crate::store::StoreError;

/// Statements of one kind running at once. Two: a batch forms from what
/// arrives while the other is at the database, and a lone request never
/// waits behind a small running batch (see [`SHARE_BELOW`]).
const IN_FLIGHT: usize = 2;
/// A second statement starts beside a running one only while that one
/// carries fewer rows than this. Under light load batches are small and the
/// second slot keeps a lone request from waiting; under heavy load a second
/// statement would only split what becomes one bigger batch if it waits for
/// the running one, and every statement costs Postgres a commit (measured:
/// BENCHMARKS.md, "Lanes", and `docs/architecture.md`).
const SHARE_BELOW: usize = 4;
/// Rows per statement at most; the rest waits for the next slot.
const MAX_ROWS: usize = 128;

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
        let run = Arc::new(run);
        tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else {
                    return;
                };
                if running.load(Ordering::Acquire) >= SHARE_BELOW {
                    // A large batch is at the database: wait for its slot,
                    // gathering what arrives meanwhile into this batch.
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
