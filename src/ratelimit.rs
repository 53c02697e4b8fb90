//! Abuse limits: token buckets per tenant (requests), per destination number
//! and per destination prefix (new sends), checked before anything is
//! stored.
//!
//! Limits are kept in this instance's memory: with N instances behind a
//! balancer a client can get up to N times a limit. That is the documented
//! trade-off (an exact shared limit would cost a database write per request);
//! the per-number limit is small enough by default that N times it still
//! stops OTP pumping. Buckets read the service's [`Clock`], so tests move time
//! by hand.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::clock::Clock;

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

    pub fn is_unlimited(&self) -> bool {
        self.capacity == 0
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

/// Token buckets by key.
struct Buckets<K> {
    rate: Rate,
    map: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            map: Mutex::new(HashMap::new()),
        }
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
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() > 100_000 {
            // Forget full buckets: they are what a new bucket would be.
            let cap = f64::from(self.rate.capacity);
            map.retain(|_, b| self.refilled(*b, now).tokens < cap);
        }
        let full = Bucket {
            tokens: f64::from(self.rate.capacity),
            at: now,
        };
        let b = self.refilled(*map.get(key).unwrap_or(&full), now);
        if b.tokens >= 1.0 {
            map.insert(
                key.clone(),
                Bucket {
                    tokens: b.tokens - 1.0,
                    ..b
                },
            );
            Ok(())
        } else {
            map.insert(key.clone(), b);
            let secs = (1.0 - b.tokens) / self.rate.refill_per_sec();
            Err(Duration::from_secs_f64(secs.max(0.0)))
        }
    }

    /// Gives back a token taken for something that did not happen.
    fn give_back(&self, key: &K) {
        if self.rate.is_unlimited() {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = map.get_mut(key) {
            b.tokens = (b.tokens + 1.0).min(f64::from(self.rate.capacity));
        }
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
#[derive(Clone, Debug, PartialEq)]
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

    /// One request by `tenant`.
    pub fn request(&self, tenant: Uuid) -> Result<(), Refused> {
        self.tenant
            .take(&tenant, self.clock.now())
            .map_err(|retry_after| Refused {
                limit: "requests per tenant",
                retry_after,
            })
    }

    /// One new send to `to` (E.164).
    pub fn send(&self, tenant: Uuid, to: &str) -> Result<SendPermit, Refused> {
        let now = self.clock.now();
        let number = (tenant, to.to_string());
        self.number
            .take(&number, now)
            .map_err(|retry_after| Refused {
                limit: "messages per destination number",
                retry_after,
            })?;
        let prefix = (tenant, prefix_of(to));
        if let Err(retry_after) = self.prefix.take(&prefix, now) {
            self.number.give_back(&number);
            return Err(Refused {
                limit: "messages per destination prefix",
                retry_after,
            });
        }
        Ok(SendPermit {
            tenant,
            to: to.to_string(),
        })
    }

    /// Returns a send's tokens.
    pub fn refund(&self, permit: SendPermit) {
        self.number.give_back(&(permit.tenant, permit.to.clone()));
        self.prefix
            .give_back(&(permit.tenant, prefix_of(&permit.to)));
    }
}

/// The number without its last four digits: numbers sharing it are usually
/// one range, the unit SMS-pumping fraud works in.
pub fn prefix_of(e164: &str) -> String {
    let keep = e164.len().saturating_sub(4);
    e164[..keep].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a = l.send(t, "+14155552671").unwrap();
        l.send(t, "+14155552671").unwrap();
        let refused = l.send(t, "+14155552671").err().unwrap();
        assert_eq!(refused.limit, "messages per destination number");
        assert!(refused.retry_after > Duration::from_secs(1700));
        // A refund (the send was a replay) gives the token back.
        l.refund(a);
        l.send(t, "+14155552671").unwrap();
        // The range +1415555____ allows 3: two are used (the refunded one
        // does not count), so one more number in it goes through...
        l.send(t, "+14155559999").unwrap();
        // ...and the next is refused by the prefix, not by its own number,
        // whose token is given back.
        for _ in 0..3 {
            let refused = l.send(t, "+14155558888").err().unwrap();
            assert_eq!(refused.limit, "messages per destination prefix");
        }
        clock.advance(Duration::from_secs(1200));
        l.send(t, "+14155558888").unwrap();
        assert!(l.send(Uuid::new_v4(), "+14155552671").is_ok(), "per tenant");
    }

    #[test]
    fn prefix_drops_the_last_four_digits() {
        assert_eq!(prefix_of("+14155552671"), "+1415555");
        assert_eq!(prefix_of("+123"), "");
    }
}
