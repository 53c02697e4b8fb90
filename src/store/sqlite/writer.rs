//! The single SQLite writer: one task owns the write connection and commits
//! whatever writes are waiting as one transaction (group commit).
//!
//! SQLite admits one writer at a time and pays one `fsync` per commit
//! (`synchronous=FULL`). Letting every caller take the write lock in turn made
//! each send queue for the lock, several commits per send, and the tail was
//! lock waits. Here a caller hands its write to the writer as a job and waits;
//! the writer takes every job that is waiting (up to [`MAX_GROUP`]), runs
//! each in a savepoint of its own inside one `BEGIN IMMEDIATE` transaction,
//! commits once, and only then answers every caller. A job that fails is
//! rolled back to its savepoint alone and gets its error; the others commit.
//! If the commit itself fails, every caller of the group gets an error, and
//! nothing of the group is acknowledged.
//!
//! WAL checkpoints run here too, on the writer's schedule, between groups
//! (automatic checkpoints are off on this connection, so no commit of a
//! request pays for one).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;

/// The most jobs one group commit takes.
pub(super) const MAX_GROUP: usize = 256;
/// Jobs that may wait for the writer before callers wait to hand theirs in.
pub(super) const QUEUE: usize = 4096;
/// A passive WAL checkpoint runs when the writer is idle after this many
/// commits, and after four times as many even when it is not.
pub(super) const CHECKPOINT_EVERY: u32 = 64;

pub(super) type BoxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// What a job's caller is told once the group's commit is known.
type Reply = Box<dyn FnOnce(Result<(), &StoreError>) + Send>;

/// One caller's write: runs on the writer's connection inside the group's
/// transaction and says whether it succeeded (its savepoint is kept) and how
/// to answer its caller after the commit.
pub(super) type Job =
    Box<dyn for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, (bool, Reply)> + Send>;

/// A job's answer, typed by its caller ([`super::SqliteStore::write`]).
pub(super) type Answer = oneshot::Receiver<Result<Box<dyn Any + Send>, StoreError>>;

/// Wraps a caller's write as a [`Job`] and the receiver of its answer.
pub(super) fn job<T, F>(f: F) -> (Job, Answer)
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
        + Send
        + 'static,
{
    let (tx, rx) = oneshot::channel();
    // The job runs on the writer's task but belongs to its caller's span, so
    // its statements are logged where the caller's work is.
    let span = tracing::Span::current();
    let job: Job = Box::new(move |conn| {
        Box::pin(async move {
            let result = tracing::Instrument::instrument(f(conn), span).await;
            let ok = result.is_ok();
            let reply: Reply = Box::new(move |commit| {
                let answer = match commit {
                    Ok(()) => result.map(|v| Box::new(v) as Box<dyn Any + Send>),
                    Err(e) => Err(group_failed(e)),
                };
                // The caller may have gone (its request was cancelled): the
                // write stands all the same.
                let _ = tx.send(answer);
            });
            (ok, reply)
        })
    });
    (job, rx)
}

/// The error each caller of a failed group commit gets (the cause is logged
/// once by the writer).
fn group_failed(e: &StoreError) -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::other(format!(
        "the group commit failed: {e}"
    ))))
}

/// Starts the writer on a thread of its own, with a single-threaded runtime:
/// a group is a run of round trips to SQLite's worker thread, and each time
/// the writer is woken it must not wait in the request runtime's queue
/// behind the requests' tasks. It ends when every sender is gone.
pub(super) fn start(conn: SqliteConnection, jobs: mpsc::Receiver<Job>) -> Result<(), StoreError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || runtime.block_on(run(conn, jobs)))
        .map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
    Ok(())
}

/// The writer's loop: runs until every sender is gone.
pub(super) async fn run(mut conn: SqliteConnection, mut jobs: mpsc::Receiver<Job>) {
    let mut group: Vec<Job> = Vec::with_capacity(MAX_GROUP);
    let mut since_checkpoint = 0u32;
    loop {
        let first = match jobs.try_recv() {
            Ok(job) => job,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Idle: the moment to checkpoint, off every request's path.
                if since_checkpoint >= CHECKPOINT_EVERY {
                    checkpoint(&mut conn).await;
                    since_checkpoint = 0;
                }
                match jobs.recv().await {
                    Some(job) => job,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        group.push(first);
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut group).await;
        since_checkpoint += 1;
        if since_checkpoint >= 4 * CHECKPOINT_EVERY {
            checkpoint(&mut conn).await;
            since_checkpoint = 0;
        }
    }
    let _ = conn.close().await;
}

/// Copies what the WAL holds into the database file without waiting for
/// readers (PASSIVE), so the WAL stays short.
async fn checkpoint(conn: &mut SqliteConnection) {
    if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
        .execute(&mut *conn)
        .await
    {
        tracing::warn!(error = %e, "WAL checkpoint failed");
    }
}

async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), StoreError> {
    sqlx::query(sql).execute(&mut *conn).await?;
    Ok(())
}

/// Runs several statements (no parameters) in one round trip; stops at the
/// first that fails.
async fn exec_many(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), StoreError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Runs `group` as one transaction and answers its callers after the commit.
/// Jobs not answered (the transaction could not start, or a savepoint
/// failed) are dropped, which their callers see as the writer failing.
///
/// Every statement is a round trip to SQLite's worker thread (two thread
/// wake-ups), so the end of one job's savepoint and the start of the next
/// one's go as one batch of statements, and so do the last job's end and
/// the commit.
async fn commit_group(conn: &mut SqliteConnection, group: &mut Vec<Job>) {
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE").await {
        tracing::warn!(error = %e, jobs = group.len(), "could not start a group commit");
        group.clear();
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(group.len());
    let mut broken: Option<StoreError> = None;
    // How the previous job's savepoint ends: `None` before the first job.
    let mut previous: Option<bool> = None;
    for job in group.drain(..) {
        if broken.is_some() {
            continue;
        }
        let start = match previous {
            None => "SAVEPOINT job",
            Some(true) => "RELEASE job; SAVEPOINT job",
            Some(false) => "ROLLBACK TO job; RELEASE job; SAVEPOINT job",
        };
        if let Err(e) = exec_many(conn, start).await {
            broken = Some(e);
            continue;
        }
        let (ok, reply) = job(conn).await;
        replies.push(reply);
        previous = Some(ok);
    }
    let outcome = match broken {
        Some(e) => {
            let _ = exec(conn, "ROLLBACK").await;
            Err(e)
        }
        None => {
            let end = match previous {
                None => "COMMIT",
                Some(true) => "RELEASE job; COMMIT",
                Some(false) => "ROLLBACK TO job; RELEASE job; COMMIT",
            };
            match exec_many(conn, end).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    // A failed release or commit: nothing of the group is kept.
                    let _ = exec(conn, "ROLLBACK").await;
                    Err(e)
                }
            }
        }
    };
    if let Err(e) = &outcome {
        tracing::error!(error = %e, jobs = replies.len(), "a group commit failed");
    }
    for reply in replies {
        reply(outcome.as_ref().map(|_| ()));
    }
}
