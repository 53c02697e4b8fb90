//! The two in-process caches of the fast path (issue 11): API keys, so a
//! request authenticates without the database, and final responses, so a
//! replay touches no database. Both are bounded and both are kept true by
//! the instance's [`Notifier`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use crate::notify::{Event, Notifier};
use crate::store::{StoredResponse, TenantAuth};

/// Cache sizes and bounds.
#[derive(Clone, Debug)]
pub struct CacheSettings {
    /// How long a cached API key is trusted while no notification connection
    /// is up (always on SQLite, where the CLI is another process): the bound
    /// on how late a revocation takes effect then. Zero: keys are not cached
    /// without a live notification connection.
    pub key_ttl: Duration,
    /// How long a cached API key is trusted even with a live connection.
    pub key_max_age: Duration,
    /// Most API keys cached.
    pub key_entries: usize,
    /// Most final responses cached for replays (0: none).
    pub replay_entries: usize,
    /// Requests for a message another request is sending that may wait for
    /// it at once, per tenant; beyond this a duplicate is answered 409 at
    /// once.
    pub max_waiters_per_tenant: usize,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            key_ttl: Duration::from_secs(2),
            key_max_age: Duration::from_secs(300),
            key_entries: 10_000,
            replay_entries: 4096,
            max_waiters_per_tenant: 100,
        }
    }
}

/// Largest response body the replay cache keeps (a larger one is replayed
/// from the database): with [`CacheSettings::replay_entries`] this bounds its
/// memory at about `entries × (REPLAY_MAX_BODY + 400 bytes)`, 18 MiB with the
/// defaults (typical bodies are about 600 bytes: 4 MiB).
pub const REPLAY_MAX_BODY: usize = 4096;

/// Cached responses expire this long before their message may be purged,
/// so that clocks a little apart never replay a purged key.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(60);

struct KeyEntry {
    auth: TenantAuth,
    at: Instant,
}

/// A key's last use is written at most this often (per instance).
pub const TOUCH_EVERY: time::Duration = time::Duration::MINUTE;

/// Whether a key last written as used at `written` (by this instance) is
/// written again at `now`.
pub fn touch_due(written: Option<OffsetDateTime>, now: OffsetDateTime) -> bool {
    written.is_none_or(|w| now - w >= TOUCH_EVERY || now < w)
}

/// API keys by hash.
pub struct KeyCache {
    entries: Mutex<HashMap<Vec<u8>, KeyEntry>>,
    /// When this instance last wrote each key's last use (service clock).
    touched: Mutex<HashMap<Uuid, OffsetDateTime>>,
    notifier: Notifier,
    settings: CacheSettings,
}

impl KeyCache {
    pub fn new(notifier: Notifier, settings: CacheSettings) -> Arc<Self> {
        let cache = Arc::new(Self {
            entries: Mutex::new(HashMap::new()),
            touched: Mutex::new(HashMap::new()),
            notifier: notifier.clone(),
            settings,
        });
        let weak = Arc::downgrade(&cache);
        notifier.subscribe(move |event| {
            if let Some(cache) = weak.upgrade() {
                cache.apply(event);
            }
        });
        cache
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, KeyEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long an entry is trusted now.
    fn trusted_for(&self) -> Duration {
        if self.notifier.is_connected() {
            self.settings.key_max_age
        } else {
            self.settings.key_ttl
        }
    }

    /// The cached tenant of a key hash, if trusted now.
    pub fn get(&self, hash: &[u8]) -> Option<TenantAuth> {
        let bound = self.trusted_for();
        let entries = self.lock();
        let e = entries.get(hash)?;
        (e.at.elapsed() < bound).then(|| e.auth.clone())
    }

    /// A token to hand to [`KeyCache::put`]: taken before the database read.
    pub fn ticket(&self) -> u64 {
        self.notifier.generation()
    }

    /// Caches what the database said, unless something changed since
    /// `ticket` was taken (the read may predate a revocation). Negative
    /// answers are never cached: a new key works at once.
    pub fn put(&self, hash: &[u8], auth: &TenantAuth, ticket: u64) {
        if self.trusted_for().is_zero() {
            return;
        }
        let mut entries = self.lock();
        if self.notifier.generation() != ticket {
            return;
        }
        if entries.len() >= self.settings.key_entries {
            entries.clear();
        }
        entries.insert(
            hash.to_vec(),
            KeyEntry {
                auth: auth.clone(),
                at: Instant::now(),
            },
        );
    }

    /// Whether the request using key `id` at `now` writes the key's last
    /// use: once a minute per key on this instance, whatever the traffic.
    /// Decided here, so the write happens once and not per request.
    pub fn touch_due(&self, id: Uuid, now: OffsetDateTime) -> bool {
        let mut touched = self.touched.lock().unwrap_or_else(PoisonError::into_inner);
        if !touch_due(touched.get(&id).copied(), now) {
            return false;
        }
        if touched.len() >= self.settings.key_entries {
            touched.clear();
        }
        touched.insert(id, now);
        true
    }

    fn apply(&self, event: &Event) {
        match event {
            // A live tenant's change (disabled, a setting) holds for the
            // keys of its test namespace too: they read its row.
            Event::TenantChanged(id) => self
                .lock()
                .retain(|_, e| e.auth.id != *id && e.auth.live_id != Some(*id)),
            Event::Flush => self.lock().clear(),
            Event::Purged(_) => {}
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many of each tenant's requests wait for a message another request
/// is sending.
#[derive(Default)]
pub struct Waiters {
    counts: Mutex<HashMap<Uuid, usize>>,
    max: usize,
}

/// One waiting request, counted until dropped.
pub struct Waiting {
    waiters: Arc<Waiters>,
    tenant: Uuid,
}

impl Waiters {
    pub fn new(max_per_tenant: usize) -> Arc<Self> {
        Arc::new(Self {
            counts: Mutex::default(),
            max: max_per_tenant,
        })
    }

    /// Counts one more waiter of `tenant`, unless it already has the most
    /// allowed.
    pub fn enter(self: &Arc<Self>, tenant: Uuid) -> Option<Waiting> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let n = counts.entry(tenant).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Waiting {
            waiters: Arc::clone(self),
            tenant,
        })
    }

    /// The tenant's waiters now.
    pub fn count(&self, tenant: Uuid) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&tenant)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut counts = self
            .waiters
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

/// A frozen final response.
#[derive(Clone, Debug)]
pub struct Replay {
    pub fingerprint: [u8; 32],
    pub status_code: u16,
    pub body: Bytes,
}

struct ReplayEntry {
    replay: Replay,
    created_at: OffsetDateTime,
    /// Never served at or after this (retention, less a margin).
    until: OffsetDateTime,
}

type ReplayKey = (Uuid, String);

#[derive(Default)]
struct ReplayMap {
    map: HashMap<ReplayKey, ReplayEntry>,
    /// Insertion order, for evicting the oldest.
    order: VecDeque<ReplayKey>,
}

/// Final responses by (tenant, key).
pub struct ReplayCache {
    inner: Mutex<ReplayMap>,
    notifier: Notifier,
    capacity: usize,
    retention: Duration,
}

impl ReplayCache {
    pub fn new(notifier: Notifier, capacity: usize, retention: Duration) -> Arc<Self> {
        let cache = Arc::new(Self {
            inner: Mutex::new(ReplayMap::default()),
            notifier: notifier.clone(),
            capacity,
            retention,
        });
        let weak = Arc::downgrade(&cache);
        notifier.subscribe(move |event| {
            if let Some(cache) = weak.upgrade() {
                cache.apply(event);
            }
        });
        cache
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplayMap> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached final response for a key, if any and still within
    /// retention at `now`.
    pub fn get(&self, tenant: Uuid, key: &str, now: OffsetDateTime) -> Option<Replay> {
        if self.capacity == 0 {
            return None;
        }
        let inner = self.lock();
        let e = inner.map.get(&(tenant, key.to_string()))?;
        (now < e.until).then(|| e.replay.clone())
    }

    /// A token to hand to [`ReplayCache::put`]: taken before the database read.
    pub fn ticket(&self) -> u64 {
        self.notifier.generation()
    }

    /// Caches a final response read from (or just written to) the database.
    /// Skipped when a purge may have happened since `ticket`, when the body
    /// is large, or when its message is too close to the end of retention.
    pub fn put(
        &self,
        tenant: Uuid,
        key: &str,
        fingerprint: &[u8],
        response: &StoredResponse,
        ticket: u64,
        now: OffsetDateTime,
    ) {
        let (status_code, body) = (response.status_code, &response.body);
        if self.capacity == 0 || body.len() > REPLAY_MAX_BODY {
            return;
        }
        let Ok(fingerprint) = <[u8; 32]>::try_from(fingerprint) else {
            return;
        };
        let Some(created_at) = created_at_of(body) else {
            return;
        };
        let keep = self.retention.saturating_sub(RETENTION_MARGIN);
        let Ok(keep) = time::Duration::try_from(keep) else {
            return;
        };
        let until = created_at + keep;
        if now >= until {
            return;
        }
        let mut inner = self.lock();
        if self.notifier.generation() != ticket {
            return;
        }
        let k = (tenant, key.to_string());
        if inner.map.contains_key(&k) {
            return;
        }
        while inner.map.len() >= self.capacity {
            match inner.order.pop_front() {
                Some(old) => {
                    inner.map.remove(&old);
                }
                None => break,
            }
        }
        inner.order.push_back(k.clone());
        inner.map.insert(
            k,
            ReplayEntry {
                replay: Replay {
                    fingerprint,
                    status_code,
                    body: Bytes::copy_from_slice(body),
                },
                created_at,
                until,
            },
        );
    }

    fn apply(&self, event: &Event) {
        let mut inner = self.lock();
        match event {
            Event::Purged(upto) => inner.map.retain(|_, e| e.created_at > *upto),
            // A purge elsewhere may have gone unheard.
            Event::Flush => inner.map.clear(),
            Event::TenantChanged(_) => return,
        }
        let ReplayMap { map, order } = &mut *inner;
        order.retain(|k| map.contains_key(k));
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The message's `created_at` in a frozen response body.
fn created_at_of(body: &[u8]) -> Option<OffsetDateTime> {
    #[derive(serde::Deserialize)]
    struct Created {
        #[serde(with = "time::serde::rfc3339")]
        created_at: OffsetDateTime,
    }
    serde_json::from_slice::<Created>(body)
        .ok()
        .map(|c| c.created_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(id: Uuid) -> TenantAuth {
        TenantAuth {
            id,
            key_id: id,
            key_label: None,
            scopes: crate::scopes::Scopes::DEFAULT,
            disabled: false,
            allowed_countries: None,
            allowed_senders: None,
            bootstrap_tenant: false,
            quiet_hours: None,
            home_country: None,
            verify_channels: None,
            spend_caps: Default::default(),
            live_id: None,
        }
    }

    #[test]
    fn last_use_is_written_once_a_minute() {
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        let s = time::Duration::seconds;
        // (last written, now, write)
        for (written, now, want) in [
            (None, t0, true),
            (Some(t0), t0, false),
            (Some(t0), t0 + s(59), false),
            (Some(t0), t0 + s(60), true),
            (Some(t0), t0 - s(1), true),
        ] {
            assert_eq!(touch_due(written, now), want, "{written:?} {now}");
        }
        let c = KeyCache::new(Notifier::local(), CacheSettings::default());
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let writes = (0..100)
            .filter(|i| c.touch_due(a, t0 + time::Duration::milliseconds(500 * i)))
            .count();
        assert_eq!(writes, 1, "100 requests within a minute write once");
        assert!(c.touch_due(b, t0), "per key");
        assert!(c.touch_due(a, t0 + s(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_without_a_connection_last_the_short_bound() {
        let n = Notifier::local();
        let c = KeyCache::new(n.clone(), CacheSettings::default());
        let t = Uuid::now_v7();
        let ticket = c.ticket();
        c.put(b"h", &auth(t), ticket);
        assert_eq!(c.get(b"h"), Some(auth(t)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.get(b"h"), None);
    }

    #[test]
    fn a_live_tenant_change_drops_its_test_keys_too() {
        let n = Notifier::local();
        let c = KeyCache::new(n.clone(), CacheSettings::default());
        let (live, shadow, other) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let test_key = TenantAuth {
            live_id: Some(live),
            ..auth(shadow)
        };
        let ticket = c.ticket();
        c.put(b"test", &test_key, ticket);
        c.put(b"other", &auth(other), ticket);
        assert_eq!(c.get(b"test"), Some(test_key));
        n.publish(Event::TenantChanged(live));
        assert_eq!(c.get(b"test"), None);
        assert_eq!(c.get(b"other"), Some(auth(other)));
    }

    #[test]
    fn a_tenant_change_drops_its_keys_and_spoils_older_reads() {
        let n = Notifier::local();
        let c = KeyCache::new(n.clone(), CacheSettings::default());
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ticket = c.ticket();
        c.put(b"a", &auth(a), ticket);
        c.put(b"b", &auth(b), ticket);
        let before = c.ticket();
        n.publish(Event::TenantChanged(a));
        assert_eq!(c.get(b"a"), None);
        assert_eq!(c.get(b"b"), Some(auth(b)));
        // A read that started before the change is not stored.
        c.put(b"a", &auth(a), before);
        assert_eq!(c.get(b"a"), None);
    }

    fn body(created: &str) -> StoredResponse {
        StoredResponse {
            status_code: 201,
            body: format!(r#"{{"id":"x","created_at":"{created}"}}"#).into_bytes(),
        }
    }

    #[test]
    fn replays_are_bounded_and_end_before_retention() {
        let n = Notifier::local();
        let c = ReplayCache::new(n.clone(), 2, Duration::from_secs(3600));
        let t = Uuid::now_v7();
        let created = time::macros::datetime!(2026-01-01 00:00 UTC);
        let now = created + time::Duration::minutes(1);
        let b = body("2026-01-01T00:00:00Z");
        for k in ["a", "b", "c"] {
            c.put(t, k, &[7; 32], &b, c.ticket(), now);
        }
        assert_eq!(c.len(), 2);
        assert!(c.get(t, "a", now).is_none(), "the oldest went first");
        assert!(c.get(t, "c", now).is_some());
        // 3600 s retention less the 60 s margin.
        assert!(
            c.get(t, "c", created + time::Duration::seconds(3539))
                .is_some()
        );
        assert!(
            c.get(t, "c", created + time::Duration::seconds(3540))
                .is_none()
        );
        // Purged up to its creation: gone.
        n.publish(Event::Purged(created));
        assert!(c.get(t, "c", now).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn replays_not_stored_past_a_purge_or_retention() {
        let n = Notifier::local();
        let c = ReplayCache::new(n.clone(), 10, Duration::from_secs(30));
        let t = Uuid::now_v7();
        let created = time::macros::datetime!(2026-01-01 00:00 UTC);
        let b = body("2026-01-01T00:00:00Z");
        // Retention shorter than the margin: never cached.
        c.put(t, "a", &[7; 32], &b, c.ticket(), created);
        assert!(c.is_empty());
        let c = ReplayCache::new(n.clone(), 10, Duration::from_secs(3600));
        let ticket = c.ticket();
        n.publish(Event::Purged(created));
        c.put(t, "a", &[7; 32], &b, ticket, created);
        assert!(c.is_empty());
    }
}
