//! Change notifications for this instance's caches.
//!
//! On Postgres one dedicated connection per instance `LISTEN`s on the
//! [`CHANNEL`] channel; triggers (migration 0008) `NOTIFY` in the same
//! transaction as the change: a tenant row or one of its API keys changed
//! (`tenant:<uuid>`), or messages were deleted (`purged:<µs>`, the newest
//! `created_at` among them). The listener fans these out to in-process
//! subscribers, reconnects on its own and keeps a "connected" flag: while it
//! is down nothing can be learnt from other instances, so the caches fall
//! back to a short time bound, and they are flushed whenever the connection
//! is (re)established, since notifications sent meanwhile are lost.
//!
//! On SQLite (one process) there is no listener: events are in-process only
//! and [`Notifier::is_connected`] is always false, so cached keys are
//! re-checked within the short bound (the CLI is another process).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The Postgres channel the triggers notify on.
pub const CHANNEL: &str = "sendonce";

/// Where each instance acknowledges a tenant change once its caches dropped
/// what the change spoils (see [`Acks`]).
pub const ACK_CHANNEL: &str = "sendonce_ack";

/// The `application_name` of the listening connections, so a writer can
/// count the instances that must acknowledge its change.
pub const LISTENER_NAME: &str = "sendonce-listener";

/// How long a writer waits for every instance to acknowledge a tenant
/// change: longer than a cached key's life without a notification
/// connection (2 s by default), so an instance that does not answer in time
/// has lost its connection and trusts nothing older than this. Healthy
/// instances answer in milliseconds; 2 s was too short for a connected
/// instance on a machine starved of CPU (a revoked key still accepted
/// after the revocation returned), so the bound is generous: only an
/// instance that is gone makes a writer wait it out.
pub const ACK_WAIT: Duration = Duration::from_secs(10);

/// Something other instances (or this one) changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A tenant's settings or one of its API keys changed.
    TenantChanged(Uuid),
    /// Messages created at or before this time may have been deleted.
    Purged(OffsetDateTime),
    /// The notification connection was (re)established or lost: anything
    /// learnt before may be stale.
    Flush,
}

impl Event {
    /// Reads a notification payload.
    pub fn parse(payload: &str) -> Option<Event> {
        if let Some(id) = payload.strip_prefix("tenant:") {
            return Uuid::parse_str(id).ok().map(Event::TenantChanged);
        }
        if let Some(us) = payload.strip_prefix("purged:") {
            let us: i128 = us.parse().ok()?;
            return OffsetDateTime::from_unix_timestamp_nanos(us.checked_mul(1000)?)
                .ok()
                .map(Event::Purged);
        }
        None
    }
}

type Subscriber = Box<dyn Fn(&Event) + Send + Sync>;

struct Inner {
    /// Called in order, synchronously, for every event.
    subscribers: Mutex<Vec<Subscriber>>,
    connected: AtomicBool,
    /// Bumped on every event, so a cache fill that read the database before
    /// an invalidation can tell and not store what it read.
    generation: AtomicU64,
}

/// One per instance; cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Self::local()
    }
}

impl Notifier {
    /// In-process only (SQLite, tests).
    pub fn local() -> Self {
        Self {
            inner: Arc::new(Inner {
                subscribers: Mutex::new(Vec::new()),
                connected: AtomicBool::new(false),
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// Whether notifications from other instances arrive now.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
    }

    /// Changes whenever an event is published (see [`Inner::generation`]).
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Calls `f` for every event from now on (it must be quick: it runs on
    /// the listener's task).
    pub fn subscribe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.inner
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(f));
    }

    /// Publishes an event to this instance's subscribers.
    pub fn publish(&self, event: Event) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        let subscribers = self
            .inner
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for f in subscribers.iter() {
            f(&event);
        }
        // Bumped again after applying, so a fill that started while the
        // event was being applied cannot store what it read either.
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn set_connected(&self, connected: bool) {
        let was = self.inner.connected.swap(connected, Ordering::AcqRel);
        if was != connected {
            self.publish(Event::Flush);
        }
    }

    /// Listens on Postgres until `stop`: one connection of its own (outside
    /// the request pool), reconnecting with a capped backoff.
    pub async fn listen(self, pool: PgPool, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            // A pool of one, only so that the listener has a connection of
            // its own and does not hold one of the request pool's. Rebuilt on
            // every reconnect from the request pool's current options, so
            // that after a database failover it listens on the new primary.
            let options = (*pool.connect_options())
                .clone()
                .application_name(LISTENER_NAME);
            let own = PgPoolOptions::new()
                .max_connections(1)
                .min_connections(0)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy_with(options);
            let outcome = self.listen_once(&own, &stop).await;
            own.close().await;
            match outcome {
                Ok(()) => return,
                Err(e) => {
                    self.set_connected(false);
                    tracing::warn!(error = %e, "notification connection lost; caches fall back to their time bound");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn listen_once(
        &self,
        pool: &PgPool,
        stop: &CancellationToken,
    ) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.eager_reconnect(false);
        listener.listen(CHANNEL).await?;
        // Only now is nothing missed: flush what was learnt before.
        self.set_connected(true);
        loop {
            let next = tokio::select! {
                n = listener.try_recv() => n?,
                () = stop.cancelled() => {
                    self.set_connected(false);
                    return Ok(());
                }
            };
            match next {
                Some(n) => match Event::parse(n.payload()) {
                    Some(event) => {
                        let ack = matches!(event, Event::TenantChanged(_));
                        self.publish(event);
                        if ack {
                            sqlx::query("SELECT pg_notify($1, $2)")
                                .bind(ACK_CHANNEL)
                                .bind(n.payload())
                                .execute(&mut listener)
                                .await?;
                        }
                    }
                    None => tracing::debug!(payload = n.payload(), "unknown notification"),
                },
                None => return Err(sqlx::Error::PoolClosed),
            }
        }
    }
}

/// Lets a writer of a tenant change (a key revoked, a setting changed) return
/// only once every instance has applied it: started before the change is
/// committed, it counts the listening instances, then waits (at most
/// [`ACK_WAIT`]) for an acknowledgement from each.
pub struct Acks {
    listener: PgListener,
    expected: i64,
}

impl Acks {
    /// `None` if it cannot listen: the change goes ahead regardless, and
    /// instances learn it from their own notification.
    pub async fn start(pool: &PgPool) -> Option<Acks> {
        let start = async {
            let mut listener = PgListener::connect_with(pool).await?;
            listener.listen(ACK_CHANNEL).await?;
            let expected: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = $1",
            )
            .bind(LISTENER_NAME)
            .fetch_one(&mut listener)
            .await?;
            Ok::<_, sqlx::Error>(Acks { listener, expected })
        };
        match start.await {
            Ok(acks) => Some(acks),
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait for instances to acknowledge a change");
                None
            }
        }
    }

    /// Waits for each instance counted at the start to acknowledge.
    pub async fn wait(mut self) {
        let mut seen = std::collections::HashSet::new();
        let deadline = tokio::time::Instant::now() + ACK_WAIT;
        while (seen.len() as i64) < self.expected {
            match tokio::time::timeout_at(deadline, self.listener.try_recv()).await {
                Ok(Ok(Some(n))) => {
                    seen.insert(n.process_id());
                }
                Ok(Ok(None) | Err(_)) | Err(_) => {
                    tracing::warn!(
                        expected = self.expected,
                        acknowledged = seen.len(),
                        "not every instance acknowledged the change in time"
                    );
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        let id = Uuid::now_v7();
        assert_eq!(
            Event::parse(&format!("tenant:{id}")),
            Some(Event::TenantChanged(id))
        );
        assert_eq!(
            Event::parse("purged:1700000000123456"),
            Some(Event::Purged(
                OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_000).unwrap()
            ))
        );
        assert_eq!(Event::parse("tenant:nope"), None);
        assert_eq!(Event::parse("purged:x"), None);
        assert_eq!(Event::parse("other"), None);
    }

    #[test]
    fn generation_moves_on_every_event() {
        let n = Notifier::local();
        let g = n.generation();
        n.publish(Event::Flush);
        assert_ne!(n.generation(), g);
        assert!(!n.is_connected());
    }
}
