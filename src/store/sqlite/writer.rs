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
//! Every statement is a round trip to SQLite's worker thread (two thread
//! wake-ups), so the statements that end one job's savepoint and open the
//! next one's are not a round trip of their own: they are the [`Savepoint`]
//! a job is handed, and the job runs them at the head of its first query
//! (the hot writes, a claim and a final write, are then one round trip each)
//! or alone before it ([`Savepoint::open`], every other write). The names
//! alternate (`a`, `b`), so a failed job's `ROLLBACK TO` names the savepoint
//! its own head opened and no other: if the head did not run to its end,
//! that rollback fails and the whole group is rolled back, never a job
//! whose caller will be told it committed.
//!
//! WAL checkpoints run here too, on the writer's schedule, between groups
//! (automatic checkpoints are off on this connection, so no commit of a
//! request pays for one).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;

use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::{BatchKind, BatchSizes};
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
/// transaction, starting with its [`Savepoint`]'s statements, and says
/// whether it succeeded (its savepoint is kept) and how to answer its caller
/// after the commit.
pub(super) type Job = Box<
    dyn for<'c> FnOnce(&'c mut SqliteConnection, Savepoint) -> BoxFuture<'c, (bool, Reply)> + Send,
>;

/// A job's answer, typed by its caller ([`super::SqliteStore::write`]).
pub(super) type Answer = oneshot::Receiver<Result<Box<dyn Any + Send>, StoreError>>;

/// The savepoint names, alternating from one job to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    A,
    B,
}

impl Name {
    fn other(self) -> Name {
        match self {
            Name::A => Name::B,
            Name::B => Name::A,
        }
    }
}

/// The statements a job runs before its own: they end the previous job's
/// savepoint, if one is open, and open this job's. A job must run them
/// first, whatever it does next: alone ([`open`](Self::open)) or at the
/// head of its first query ([`head`](Self::head)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Savepoint {
    /// The previous job succeeded and its savepoint, the other name, is
    /// still open.
    release: bool,
    /// This job's.
    open: Name,
}

impl Savepoint {
    /// Which of the four forms of a query ([`headed!`]) is this one's.
    fn index(self) -> usize {
        match (self.release, self.open) {
            (false, Name::A) => 0,
            (false, Name::B) => 1,
            (true, Name::B) => 2,
            (true, Name::A) => 3,
        }
    }

    /// The statements alone.
    fn sql(self) -> &'static str {
        [
            "SAVEPOINT a",
            "SAVEPOINT b",
            "RELEASE a; SAVEPOINT b",
            "RELEASE b; SAVEPOINT a",
        ][self.index()]
    }

    /// Runs the statements alone: one round trip.
    pub(crate) async fn open(self, conn: &mut SqliteConnection) -> Result<(), StoreError> {
        exec_many(conn, self.sql()).await
    }

    /// The form of `query` that starts with these statements.
    pub(crate) fn head(self, query: &Headed) -> &'static str {
        query.0[self.index()]
    }
}

/// A query in four forms, one per [`Savepoint`]: see [`headed!`].
pub(crate) struct Headed(pub(crate) [&'static str; 4]);

/// The four forms of a query (a string literal or a macro that expands to
/// one) a job runs first, each headed by one [`Savepoint`]'s statements in
/// [`Savepoint::index`]'s order.
macro_rules! headed {
    ($($sql:tt)+) => {
        $crate::store::sqlite::writer::Headed([
            concat!("SAVEPOINT a; ", $($sql)+),
            concat!("SAVEPOINT b; ", $($sql)+),
            concat!("RELEASE a; SAVEPOINT b; ", $($sql)+),
            concat!("RELEASE b; SAVEPOINT a; ", $($sql)+),
        ])
    };
}
pub(super) use headed;

/// Wraps a caller's write as a [`Job`] and the receiver of its answer. `f`
/// runs the savepoint's statements itself, first ([`Savepoint`]).
pub(super) fn job<T, F>(f: F) -> (Job, Answer)
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut SqliteConnection, Savepoint) -> BoxFuture<'c, Result<T, StoreError>>
        + Send
        + 'static,
{
    let (tx, rx) = oneshot::channel();
    // The job runs on the writer's task but belongs to its caller's span, so
    // its statements are logged where the caller's work is.
    let span = tracing::Span::current();
    let job: Job = Box::new(move |conn, savepoint| {
        Box::pin(async move {
            let result = tracing::Instrument::instrument(f(conn, savepoint), span).await;
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
pub(super) fn start(
    conn: SqliteConnection,
    jobs: mpsc::Receiver<Job>,
    sizes: Arc<BatchSizes>,
) -> Result<(), StoreError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || runtime.block_on(run(conn, jobs, &sizes)))
        .map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
    Ok(())
}

/// The writer's loop: runs until every sender is gone.
pub(super) async fn run(
    mut conn: SqliteConnection,
    mut jobs: mpsc::Receiver<Job>,
    sizes: &BatchSizes,
) {
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
        sizes.record(BatchKind::Group, group.len());
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
/// first that fails. A prepared query, not `raw_sql`: the worker keeps it
/// parsed, where `raw_sql` parsed the savepoint statements again for every
/// job (4% of a send's instructions on SQLite, BENCHMARKS.md).
async fn exec_many(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), StoreError> {
    sqlx::query(sql).execute(&mut *conn).await?;
    Ok(())
}

/// Runs `group` as one transaction and answers its callers after the commit.
/// Jobs not answered (the transaction could not start, or a savepoint
/// failed) are dropped, which their callers see as the writer failing.
///
/// Each job opens its savepoint at the head of its own statements (and ends
/// the previous job's there too); a job that fails is rolled back to its
/// savepoint at once, and the last job's savepoint ends with the commit.
async fn commit_group(conn: &mut SqliteConnection, group: &mut Vec<Job>) {
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE").await {
        tracing::warn!(error = %e, jobs = group.len(), "could not start a group commit");
        group.clear();
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(group.len());
    let mut broken: Option<StoreError> = None;
    // The previous job succeeded: its savepoint, `next.other()`, is open.
    let mut kept = false;
    let mut next = Name::A;
    for job in group.drain(..) {
        if broken.is_some() {
            continue;
        }
        let savepoint = Savepoint {
            release: kept,
            open: next,
        };
        let (ok, reply) = job(conn, savepoint).await;
        replies.push(reply);
        next = next.other();
        kept = ok;
        if ok {
            continue;
        }
        // Undo the job's writes, and only its: its head opened this name
        // and no savepoint of that name is open otherwise, so if the head
        // did not run, this fails and the group is rolled back.
        let undo = match savepoint.open {
            Name::A => "ROLLBACK TO a; RELEASE a",
            Name::B => "ROLLBACK TO b; RELEASE b",
        };
        if let Err(e) = exec_many(conn, undo).await {
            broken = Some(e);
        }
    }
    let outcome = match broken {
        Some(e) => {
            let _ = exec(conn, "ROLLBACK").await;
            Err(e)
        }
        None => {
            // The last job's name is `next.other()`.
            let end = match (kept, next) {
                (false, _) => "COMMIT",
                (true, Name::B) => "RELEASE a; COMMIT",
                (true, Name::A) => "RELEASE b; COMMIT",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every savepoint's statements, and the form of a headed query it
    /// picks, name the same savepoints.
    #[test]
    fn a_headed_query_starts_with_its_savepoints_statements() {
        let query = headed!("SELECT 1");
        for release in [false, true] {
            for open in [Name::A, Name::B] {
                let savepoint = Savepoint { release, open };
                assert_eq!(
                    savepoint.head(&query),
                    format!("{}; SELECT 1", savepoint.sql()),
                    "{savepoint:?}"
                );
                let opened = match open {
                    Name::A => "SAVEPOINT a",
                    Name::B => "SAVEPOINT b",
                };
                assert!(savepoint.sql().ends_with(opened), "{savepoint:?}");
                if release {
                    let released = match open.other() {
                        Name::A => "RELEASE a;",
                        Name::B => "RELEASE b;",
                    };
                    assert!(savepoint.sql().starts_with(released), "{savepoint:?}");
                }
            }
        }
    }
}
