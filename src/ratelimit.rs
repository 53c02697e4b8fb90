//! Abuse limits: token buckets per tenant (requests), per destination number
//! and per destination prefix (new sends), checked before anything is
//! stored.
//!
//! Limits are kept in this instance's memory: with N instances behind a
//! balancer a client can get up to N times a limit. That is the documented
//! trade-off (an exact shared limit would cost a database write per request);
//! the per-number limit is small enough by default that N times it still
//! stops OTP pumping. Buckets read the service's [`Clock`], so tests move time
//! by hand. Memory is bounded by use, without scans: a bucket is forgotten
//! within two periods of its last use (it is full again by then), a whole
//! generation at a time.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::clock::Clock;
use crate::domain::Recipient;

/// A rate: `capacity` tokens, refilled evenly over `per`. Zero capacity
/// means no limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub capacity: u32,
    pub per: Duration,
}

impl Rate {
    pub const UNLIMITED: Rate = Rate {
        capacity: 0,
        per: Duration::from_secs(1),
    };

    /// The steady rate, per second: a whole burst (`capacity`) refills
    /// over `per` (0: no limit).
    pub fn per_second(&self) -> f64 {
        let secs = self.per.as_secs_f64();
        if self.is_unlimited() || secs == 0.0 {
            0.0
        } else {
            f64::from(self.capacity) / secs
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.capacity == 0
    }

    /// The number this rate allows per hour (0: no limit).
    pub fn per_hour(&self) -> u32 {
        if self.is_unlimited() {
            return 0;
        }
        let n = f64::from(self.capacity) * 3600.0 / self.per.as_secs_f64().max(1e-9);
        if n >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            n.round() as u32
        }
    }

    fn refill_per_sec(&self) -> f64 {
        f64::from(self.capacity) / self.per.as_secs_f64().max(1e-9)
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: OffsetDateTime,
}

/// Token buckets by key, in shards (one lock each) so requests for
/// different keys rarely wait on each other.
struct Buckets<K> {
    rate: Rate,
    hasher: RandomState,
    shards: Box<[Mutex<Shard<K>>]>,
}

/// Shards per limit.
const SHARDS: usize = 16;

/// One shard's buckets, in two generations. A bucket untouched for a whole
/// period (`rate.per`) has refilled to full, which is what a forgotten
/// bucket would be; so once `current` is a period old, `previous` (touched
/// before `current` began) can be forgotten as a whole and `current`
/// becomes `previous`. That is a swap under the lock, and the old
/// generation is freed after the lock is released: no call scans the map.
/// A bucket lives at most two periods past its last use.
struct Shard<K> {
    current: HashMap<K, Bucket>,
    previous: HashMap<K, Bucket>,
    /// When `current` began (`None`: never used).
    since: Option<OffsetDateTime>,
}

impl<K: Hash + Eq> Shard<K> {
    /// Starts a new generation if `current` is a period old, and hands back
    /// the generation to forget (for the caller to drop after unlocking).
    fn rotate(&mut self, now: OffsetDateTime, per: Duration) -> Option<HashMap<K, Bucket>> {
        let since = *self.since.get_or_insert(now);
        let age = Duration::try_from(now - since).unwrap_or(Duration::ZERO);
        if age < per {
            return None;
        }
        self.since = Some(now);
        let current = std::mem::take(&mut self.current);
        Some(std::mem::replace(&mut self.previous, current))
    }
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    fn new(rate: Rate) -> Self {
        Self::with_shards(rate, SHARDS)
    }

    fn with_shards(rate: Rate, shards: usize) -> Self {
        Self {
            rate,
            hasher: RandomState::new(),
            shards: (0..shards.max(1))
                .map(|_| {
                    Mutex::new(Shard {
                        current: HashMap::new(),
                        previous: HashMap::new(),
                        since: None,
                    })
                })
                .collect(),
        }
    }

    fn shard(&self, key: &K) -> MutexGuard<'_, Shard<K>> {
        let i = (self.hasher.hash_one(key) % self.shards.len() as u64) as usize;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn refilled(&self, b: Bucket, now: OffsetDateTime) -> Bucket {
        let elapsed = (now - b.at).as_seconds_f64().max(0.0);
        Bucket {
            tokens: (b.tokens + elapsed * self.rate.refill_per_sec())
                .min(f64::from(self.rate.capacity)),
            at: now,
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&self, key: &K, now: OffsetDateTime) -> Result<(), Duration> {
        if self.rate.is_unlimited() {
            return Ok(());
        }
        let mut shard = self.shard(key);
        let forgotten = shard.rotate(now, self.rate.per);
        let known = match shard.current.get(key) {
            Some(b) => Some(*b),
            None => shard.previous.remove(key),
        };
        let full = Bucket {
            tokens: f64::from(self.rate.capacity),
            at: now,
        };
        let b = self.refilled(known.unwrap_or(full), now);
        let result = if b.tokens >= 1.0 {
            shard.current.insert(
                key.clone(),
                Bucket {
                    tokens: b.tokens - 1.0,
                    ..b
                },
            );
            Ok(())
        } else {
            shard.current.insert(key.clone(), b);
            let secs = (1.0 - b.tokens) / self.rate.refill_per_sec();
            Err(Duration::from_secs_f64(secs.max(0.0)))
        };
        drop(shard);
        drop(forgotten);
        result
    }

    /// Gives back a token taken for something that did not happen.
    fn give_back(&self, key: &K) {
        if self.rate.is_unlimited() {
            return;
        }
        let mut shard = self.shard(key);
        let shard = &mut *shard;
        if let Some(b) = shard
            .current
            .get_mut(key)
            .or_else(|| shard.previous.get_mut(key))
        {
            b.tokens = (b.tokens + 1.0).min(f64::from(self.rate.capacity));
        }
    }

    /// Buckets held, all shards.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap();
                s.current.len() + s.previous.len()
            })
            .sum()
    }
}

/// The configured limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests per tenant (all `POST /messages`, replays included).
    pub tenant: Rate,
    /// New sends per destination number, per tenant.
    pub number: Rate,
    /// New sends per destination prefix (the number without its last four
    /// digits), per tenant.
    pub prefix: Rate,
}

impl Limits {
    pub const NONE: Limits = Limits {
        tenant: Rate::UNLIMITED,
        number: Rate::UNLIMITED,
        prefix: Rate::UNLIMITED,
    };
}

/// Which limit refused a request, and when to come back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refused {
    pub limit: &'static str,
    pub retry_after: Duration,
}

pub struct RateLimiter {
    clock: Clock,
    tenant: Buckets<Uuid>,
    number: Buckets<(Uuid, String)>,
    prefix: Buckets<(Uuid, String)>,
}

/// Tokens taken for a new send; give them back if the send turns out not to
/// be new (a replay) so a replay is never charged as a send.
pub struct SendPermit {
    tenant: Uuid,
    to: String,
    /// The number range, for an SMS recipient.
    prefix: Option<String>,
}

impl RateLimiter {
    pub fn new(limits: Limits, clock: Clock) -> Self {
        Self {
            clock,
            tenant: Buckets::new(limits.tenant),
            number: Buckets::new(limits.number),
            prefix: Buckets::new(limits.prefix),
        }
    }

    /// The limits this limiter applies (the same to every tenant).
    pub fn limits(&self) -> Limits {
        Limits {
            tenant: self.tenant.rate,
            number: self.number.rate,
            prefix: self.prefix.rate,
        }
    }

    /// One request by `tenant`.
    pub fn request(&self, tenant: Uuid) -> Result<(), Refused> {
        self.tenant
            .take(&tenant, self.clock.now())
            .map_err(|retry_after| Refused {
                limit: "requests per tenant",
                retry_after,
            })
    }

    /// One new send to `to`: a token of its address's bucket and, for an
    /// SMS recipient, of its number range's.
    pub fn send(&self, tenant: Uuid, to: &Recipient) -> Result<SendPermit, Refused> {
        let now = self.clock.now();
        let number = (tenant, to.as_str().to_string());
        self.number
            .take(&number, now)
            .map_err(|retry_after| Refused {
                limit: "messages per destination number",
                retry_after,
            })?;
        let prefix = to.prefix();
        if let Some(p) = &prefix
            && let Err(retry_after) = self.prefix.take(&(tenant, p.clone()), now)
        {
            self.number.give_back(&number);
            return Err(Refused {
                limit: "messages per destination prefix",
                retry_after,
            });
        }
        Ok(SendPermit {
            tenant,
            to: number.1,
            prefix,
        })
    }

    /// Returns a send's tokens.
    pub fn refund(&self, permit: SendPermit) {
        self.number.give_back(&(permit.tenant, permit.to));
        if let Some(p) = permit.prefix {
            self.prefix.give_back(&(permit.tenant, p));
        }
    }
}

pub use crate::domain::phone::prefix_of;

#[cfg(test)]
mod tests {
    use super::*;

    fn sms(n: &str) -> Recipient {
        Recipient::from_stored(n, &[]).unwrap()
    }

    fn limiter(limits: Limits) -> (RateLimiter, Clock) {
        let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
        (RateLimiter::new(limits, clock.clone()), clock)
    }

    #[test]
    fn tenant_burst_then_steady_rate() {
        let (l, clock) = limiter(Limits {
            tenant: Rate {
                capacity: 3,
                per: Duration::from_secs(1),
            },
            ..Limits::NONE
        });
        let t = Uuid::new_v4();
        for _ in 0..3 {
            assert!(l.request(t).is_ok());
        }
        let refused = l.request(t).unwrap_err();
        assert_eq!(refused.limit, "requests per tenant");
        assert!(refused.retry_after <= Duration::from_millis(334));
        assert!(l.request(Uuid::new_v4()).is_ok(), "tenants are separate");
        clock.advance(Duration::from_millis(334));
        assert!(l.request(t).is_ok());
        assert!(l.request(t).is_err());
    }

    #[test]
    fn per_number_and_prefix_limits_with_refunds() {
        let (l, clock) = limiter(Limits {
            number: Rate {
                capacity: 2,
                per: Duration::from_secs(3600),
            },
            prefix: Rate {
                capacity: 3,
                per: Duration::from_secs(3600),
            },
            ..Limits::NONE
        });
        let t = Uuid::new_v4();
        let a = l.send(t, &sms("+14155552671")).unwrap();
        l.send(t, &sms("+14155552671")).unwrap();
        let refused = l.send(t, &sms("+14155552671")).err().unwrap();
        assert_eq!(refused.limit, "messages per destination number");
        assert!(refused.retry_after > Duration::from_secs(1700));
        // A refund (the send was a replay) gives the token back.
        l.refund(a);
        l.send(t, &sms("+14155552671")).unwrap();
        // The range +1415555____ allows 3: two are used (the refunded one
        // does not count), so one more number in it goes through...
        l.send(t, &sms("+14155559999")).unwrap();
        // ...and the next is refused by the prefix, not by its own number,
        // whose token is given back.
        for _ in 0..3 {
            let refused = l.send(t, &sms("+14155558888")).err().unwrap();
            assert_eq!(refused.limit, "messages per destination prefix");
        }
        clock.advance(Duration::from_secs(1200));
        l.send(t, &sms("+14155558888")).unwrap();
        assert!(
            l.send(Uuid::new_v4(), &sms("+14155552671")).is_ok(),
            "per tenant"
        );
    }

    #[test]
    fn prefix_drops_the_last_four_digits() {
        assert_eq!(prefix_of("+14155552671"), "+1415555");
        assert_eq!(prefix_of("+123"), "");
    }

    fn minute(capacity: u32) -> Rate {
        Rate {
            capacity,
            per: Duration::from_secs(60),
        }
    }

    #[test]
    fn buckets_untouched_for_two_periods_are_forgotten() {
        let t0 = time::macros::datetime!(2026-11-29 12:00:00 UTC);
        let later = |secs: i64| t0 + time::Duration::seconds(secs);
        let b: Buckets<u32> = Buckets::new(minute(2));
        for k in 0..5_000 {
            b.take(&k, t0).unwrap();
        }
        assert_eq!(b.len(), 5_000);
        // A period later every one of them is full again; new keys touch
        // every shard, which starts a new generation there.
        for k in 10_000..11_000 {
            b.take(&k, later(61)).unwrap();
        }
        // Another period on, the first 5,000 are gone without anyone
        // having scanned the map: what is left is what was touched since.
        for k in 20_000..21_000 {
            b.take(&k, later(122)).unwrap();
        }
        assert_eq!(b.len(), 2_000);
    }

    #[test]
    fn an_empty_bucket_is_not_forgotten_with_its_generation() {
        let t0 = time::macros::datetime!(2026-11-29 12:00:00 UTC);
        let later = |secs: i64| t0 + time::Duration::seconds(secs);
        let b: Buckets<&str> = Buckets::with_shards(minute(2), 1);
        b.take(&"a", t0).unwrap();
        b.take(&"b", later(59)).unwrap();
        b.take(&"b", later(59)).unwrap();
        assert!(b.take(&"b", later(59)).is_err());
        // A new generation starts; "b" is still remembered as empty.
        b.take(&"a", later(61)).unwrap();
        let wait = b.take(&"b", later(62)).unwrap_err();
        assert!(wait > Duration::from_secs(25), "{wait:?}");
        // Given back and taken again across generations.
        b.give_back(&"b");
        b.take(&"b", later(62)).unwrap();
        assert!(b.take(&"b", later(62)).is_err());
    }
}
