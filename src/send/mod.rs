//! The send protocol, without HTTP: one function takes a tenant, a key and a
//! parsed request and returns what became of it. `POST /messages` is this
//! plus the translation to HTTP; batch items share its checks
//! ([`Sends::prepare`]) and its answer for a key already taken
//! ([`Sends::answer_existing`]).
//!
//! The protocol, in order:
//! 1. the request is checked against the tenant's policy and scheduled
//!    (a future `send_at`, quiet hours); nothing is stored when it is not
//!    allowed;
//! 2. a final response this instance has seen for the key is replayed from
//!    memory (the cache never outlives retention or a purge);
//! 3. the destination limits and the bound on queued sends count new sends
//!    only: a refused request whose key exists goes on as a replay;
//! 4. the message is inserted under the unique (tenant, key) constraint,
//!    its first attempt started and the lease held: the insert alone
//!    decides which of several racing requests owns the send;
//! 5. the owner hands the message to delivery (never running the provider
//!    call in its own future) and waits for its outcome; any other request
//!    with the same key compares fingerprints, replays a final response
//!    byte for byte, or waits for it.

use std::sync::Arc;
use std::time::Duration;

mod verifications;

pub use verifications::{Checked, Resent};

use axum::body::Bytes;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::cache::{ReplayCache, Waiters};
use crate::clock::{Clock, to_time};
use crate::delivery::Deliverer;
use crate::domain::schedule;
use crate::domain::{FieldError, IdempotencyKey, MessageId, Recipient, SendRequest, Status};
use crate::error::ApiError;
use crate::ratelimit::RateLimiter;
use crate::spend::{Charge, Prices};
use crate::store::{
    Charged, Claim, KeyState, MessageRecord, NewMessage, Queued, SpendItem, Store, StoredResponse,
    TenantAuth,
};

/// What became of a send.
#[derive(Debug)]
pub enum Sent {
    /// A new message, scheduled for later: as it stands.
    Scheduled(Box<MessageRecord>),
    /// A new message, final within the wait: its response.
    Final(StoredResponse),
    /// A new message still on its way when the wait ran out: as it stands.
    Pending(Box<MessageRecord>),
    /// The key was taken by this same request, final: its response.
    Replayed(StoredResponse),
    /// The same, from this instance's memory (no database read, no copy).
    Remembered { status_code: u16, body: Bytes },
    /// The key was taken by this same request, scheduled: as it stands.
    ReplayedScheduled(Box<MessageRecord>),
}

/// A request that passed the tenant's policy, with when it starts.
pub struct Prepared {
    key: IdempotencyKey,
    request: SendRequest,
    fingerprint: [u8; 32],
    /// The provider (and route) it starts on.
    via: crate::domain::Via,
    /// When it starts, if not at once (a future `send_at`, quiet hours).
    due: Option<OffsetDateTime>,
    now: OffsetDateTime,
    /// Its estimated cost.
    charge: Charge,
}

impl Prepared {
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub fn to(&self) -> &Recipient {
        &self.request.to
    }

    pub fn fingerprint(&self) -> &[u8; 32] {
        &self.fingerprint
    }
}

/// The send layer of one instance.
pub struct Sends {
    store: Arc<dyn Store>,
    deliverer: Arc<Deliverer>,
    limiter: Arc<RateLimiter>,
    replays: Arc<ReplayCache>,
    waiters: Arc<Waiters>,
    clock: Clock,
    /// Most SMS segments one message may take.
    max_segments: u32,
    /// The price table costs are estimated with.
    prices: Arc<Prices>,
}

impl Sends {
    /// `max_segments`: most SMS segments one message may take; `prices`:
    /// the table costs are estimated with.
    pub fn new(
        store: Arc<dyn Store>,
        deliverer: Arc<Deliverer>,
        limiter: Arc<RateLimiter>,
        replays: Arc<ReplayCache>,
        waiters: Arc<Waiters>,
        clock: Clock,
        (max_segments, prices): (u32, Arc<Prices>),
    ) -> Self {
        Self {
            store,
            deliverer,
            limiter,
            replays,
            waiters,
            clock,
            max_segments,
            prices,
        }
    }

    /// The currency of the price table (every cost and cap is in it).
    pub fn currency(&self) -> &str {
        self.prices.currency()
    }

    /// What a message to `request`'s number through `provider` is
    /// estimated to cost this tenant.
    /// A Telegram chat's message costs nothing (bot messages are free) and
    /// is not international (the cap guards against SMS pumping; a chat has
    /// no country): it counts toward no cap.
    fn charge(&self, tenant: &TenantAuth, request: &SendRequest, provider: &str) -> Charge {
        if request.to.phone().is_none() {
            return Charge {
                micros: 0,
                currency: self.prices.currency().to_string(),
                international: false,
            };
        }
        let country = request.to_country.as_deref();
        Charge {
            micros: self
                .prices
                .cost(country, provider, request.segments.segments),
            currency: self.prices.currency().to_string(),
            international: crate::spend::is_international(tenant.home_country.as_deref(), country),
        }
    }

    /// The charged insert of a capped tenant's send (see `store::spend`):
    /// its claim, or the 429 of the cap it would pass. Warnings crossed are
    /// counted in the metrics (their events are rows already).
    pub async fn insert_capped(
        &self,
        tenant: &TenantAuth,
        item: SpendItem,
    ) -> Result<Claim, ApiError> {
        let now = self.clock.now();
        match self
            .store
            .insert_charged(&item, tenant.spend_caps, now)
            .await?
        {
            Charged::Created { claim, warned } => {
                for cap in warned {
                    self.deliverer
                        .metrics()
                        .spend_event("warning", cap.as_str());
                }
                Ok(claim)
            }
            Charged::Existing(state) => Ok(Claim::Existing(state)),
            Charged::Refused(cap) => {
                self.deliverer
                    .metrics()
                    .spend_event("refused", cap.as_str());
                Err(ApiError::SpendCapReached {
                    cap: cap.as_str(),
                    retry_after: crate::spend::retry_after(cap, now),
                })
            }
        }
    }

    /// Checks `request` against the tenant's policy and works out when it
    /// starts. A refused request has changed nothing.
    pub fn prepare(
        &self,
        tenant: &TenantAuth,
        key: IdempotencyKey,
        request: SendRequest,
        now: OffsetDateTime,
    ) -> Result<Prepared, ApiError> {
        let via = self
            .deliverer
            .first_route(request.to.as_str(), request.from.as_deref());
        check_policy(&request, tenant, self.max_segments, via.is_some())?;
        let via = via.ok_or_else(|| ApiError::invalid("to", unreachable(&request.to)))?;
        let due =
            schedule::start_at(request.send_at, now).map_err(|e| ApiError::Validation(vec![e]))?;
        let due = start_with_quiet_hours(&request, tenant, due, now);
        let fingerprint = request.fingerprint();
        // What it would cost live; a test key's message goes to test
        // mode's provider only (and is never counted against a cap).
        let charge = self.charge(tenant, &request, &via.provider);
        let via = if tenant.is_test() {
            Deliverer::test_route()
        } else {
            via
        };
        Ok(Prepared {
            key,
            request,
            fingerprint,
            via,
            due,
            now,
            charge,
        })
    }

    /// Sends one message (the protocol in the module's doc), waiting up to
    /// `wait` for a final answer.
    pub async fn send(
        &self,
        tenant: &TenantAuth,
        key: IdempotencyKey,
        request: SendRequest,
        wait: Duration,
    ) -> Result<Sent, ApiError> {
        let tenant_id = tenant.id;
        let now = self.clock.now();
        let prepared = self.prepare(tenant, key, request, now)?;
        let fingerprint = prepared.fingerprint;
        if let Some(hit) = self.replays.get(tenant_id, prepared.key.as_str(), now) {
            if hit.fingerprint != fingerprint {
                return Err(ApiError::KeyReused);
            }
            return Ok(Sent::Remembered {
                status_code: hit.status_code,
                body: hit.body,
            });
        }
        let replay_ticket = self.replays.ticket();
        let key = prepared.key.clone();
        let due = prepared.due;
        let queued = self.queued(tenant_id, prepared);
        let new = queued.message;
        let lease = self.deliverer.new_lease();

        // Destination limits and the bound on queued sends count new sends
        // only: a request refused by either whose key already exists is a
        // replay (or a 422) and goes on. A scheduled message waits in the
        // database, not in this instance's send queue.
        let permit = self.limiter.send(tenant_id, &new.to);
        let queue_ticket = if due.is_some() {
            None
        } else {
            self.deliverer.reserve(tenant_id)
        };
        let queue_full = due.is_none() && queue_ticket.is_none();
        let permit = if permit.is_err() || queue_full {
            let exists = self
                .store
                .key_state(tenant_id, key.as_str())
                .await?
                .is_some();
            match permit {
                Err(refused) if !exists => {
                    return Err(ApiError::RateLimited {
                        limit: refused.limit,
                        retry_after: refused.retry_after,
                    });
                }
                Err(_) => None,
                Ok(permit) if !exists => {
                    self.limiter.refund(permit);
                    return Err(ApiError::Overloaded);
                }
                Ok(permit) => Some(permit),
            }
        } else {
            permit.ok()
        };
        crate::failpoint::hit("claim.before");
        let claim = if tenant.spend_caps.any() {
            // Counted against the caps in the insert's transaction.
            let item = SpendItem {
                message: new.clone(),
                lease: due.is_none().then(|| lease.clone()),
                due: due.unwrap_or(queued.due),
                send_at: queued.send_at,
            };
            self.insert_capped(tenant, item).await
        } else {
            match due {
                Some(due) => self.store.schedule_message(&new, due, queued.send_at).await,
                None => self.store.insert_message(&new, &lease).await,
            }
            .map_err(ApiError::from)
        };
        crate::failpoint::hit("claim.after");
        if !matches!(claim, Ok(Claim::Created(_)))
            && let Some(permit) = permit
        {
            self.limiter.refund(permit);
        }
        let remember = |response: &StoredResponse| {
            self.replays.put(
                tenant_id,
                key.as_str(),
                &fingerprint,
                response,
                replay_ticket,
                self.clock.now(),
            );
        };
        match claim? {
            Claim::Created(record) if record.status == Status::Scheduled => {
                // Any instance's scheduler starts it when due.
                drop(queue_ticket);
                if let Some(at) = record.next_attempt_at {
                    self.deliverer.nudge_at(at);
                }
                Ok(Sent::Scheduled(record))
            }
            Claim::Created(record) => {
                let id = record.id;
                self.deliverer.spawn_queued(*record, lease, queue_ticket);
                let sent = self.when_final(id, wait).await?;
                if let Sent::Final(response) = &sent {
                    remember(response);
                }
                Ok(sent)
            }
            Claim::Existing(existing) => {
                drop(queue_ticket);
                let sent = self
                    .answer_existing(tenant_id, &fingerprint, &existing, wait)
                    .await?;
                if let Sent::Replayed(response) = &sent {
                    remember(response);
                }
                Ok(sent)
            }
        }
    }

    /// The row a prepared request makes, for a batch's one insert (and for
    /// [`Sends::send`]): its validity and retry deadline run from when it
    /// starts.
    pub fn queued(&self, tenant_id: Uuid, p: Prepared) -> Queued {
        let starts = p.due.unwrap_or(p.now);
        let send_at = p.request.send_at.filter(|t| *t > p.now);
        let request = p.request;
        let message = NewMessage {
            id: MessageId::new(),
            tenant_id,
            idempotency_key: p.key,
            fingerprint: p.fingerprint.to_vec(),
            to: request.to,
            from: request.from,
            body: request.body,
            segments: request.segments.segments,
            encoding: request.segments.encoding,
            metadata: request.metadata,
            validity_seconds: request.validity_seconds,
            provider: p.via.provider,
            route: p.via.route,
            route_order: p.via.order,
            sender: p.via.sender,
            created_at: p.now,
            expires_at: request
                .validity_seconds
                .map(|s| starts + time::Duration::seconds(i64::from(s))),
            deadline_at: starts + to_time(self.deliverer.settings().retry.deadline),
            cost: Some(p.charge),
        };
        Queued {
            message,
            due: starts,
            send_at,
        }
    }

    /// What a request whose key is taken gets: 422 for another request, the
    /// final response, the scheduled message as it stands, or (waiting up
    /// to `wait` for the owner) the final response or 409.
    pub async fn answer_existing(
        &self,
        tenant_id: Uuid,
        fingerprint: &[u8],
        existing: &KeyState,
        wait: Duration,
    ) -> Result<Sent, ApiError> {
        if existing.fingerprint != fingerprint {
            return Err(ApiError::KeyReused);
        }
        if let Some(response) = &existing.response {
            return Ok(Sent::Replayed(response.clone()));
        }
        if existing.status == Status::Scheduled {
            // Waiting for a send weeks away makes no sense: the message as
            // it stands, as the first answer gave it.
            if let Some(record) = self.store.message_by_id(existing.id).await?
                && record.status == Status::Scheduled
            {
                return Ok(Sent::ReplayedScheduled(Box::new(record)));
            }
        }
        if wait.is_zero() {
            return Err(ApiError::KeyInUse);
        }
        // Waiting holds a place among the tenant's waiters, not a database
        // connection: one poller per message reads its row.
        let Some(_waiting) = self.waiters.enter(tenant_id) else {
            return Err(ApiError::TooManyWaiters);
        };
        match self.deliverer.await_final(existing.id, wait).await? {
            Some(response) => Ok(Sent::Replayed(response)),
            None => Err(ApiError::KeyInUse),
        }
    }

    /// The owner's answer: the final response, or the message as it stands
    /// when the wait runs out.
    async fn when_final(&self, id: MessageId, wait: Duration) -> Result<Sent, ApiError> {
        if let Some(response) = self.deliverer.await_final(id, wait).await? {
            return Ok(Sent::Final(response));
        }
        let record = self.store.message_by_id(id).await?.ok_or_else(|| {
            ApiError::Internal("a message vanished right after its insert".into())
        })?;
        if let Some(response) = record.response.clone() {
            return Ok(Sent::Final(response));
        }
        Ok(Sent::Pending(Box::new(record)))
    }
}

/// When a request starts, given its checked `send_at` (`due`): later still
/// if that falls in the tenant's quiet hours in the recipient's zones
/// (unless the request says `"quiet_hours": false`). `None`: at once.
fn start_with_quiet_hours(
    request: &SendRequest,
    tenant: &TenantAuth,
    due: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let Some(quiet) = tenant.quiet_hours.as_ref() else {
        return due;
    };
    // Local time is the number's (its country, its area code): SMS only.
    let zones = match request.to.phone() {
        Some(phone) => crate::domain::quiet::zones_for(phone, request.to_country.as_deref()),
        None => Vec::new(),
    };
    schedule::starts_at(
        due,
        now,
        Some(quiet),
        request.quiet_hours != Some(false),
        &zones,
    )
}

/// Why a number no route of `SENDONCE_ROUTES` covers is refused.
pub const NO_ROUTE: &str =
    "no route covers this number: this service sends only to the prefixes its operator routes";

/// Why the service has no way to `to`: no route covers the number, or a
/// chat channel's adapter is not configured (its variable named).
pub fn unreachable(to: &Recipient) -> String {
    match to {
        Recipient::Sms(_) => NO_ROUTE.to_string(),
        Recipient::Chat(c) => {
            let channel = c.channel();
            let var = crate::provider::registry::ADAPTERS
                .iter()
                .find_map(|a| match a.channel {
                    crate::provider::registry::Channel::Own {
                        name, enabled_by, ..
                    } if name == channel.as_str() => Some(enabled_by),
                    _ => None,
                })
                .unwrap_or("its adapter's variable");
            format!(
                "this service has no {channel} channel ({var} is not set): {channel}: addresses are refused"
            )
        }
    }
}

/// The 400 for a number no route covers.
pub fn no_route() -> ApiError {
    ApiError::invalid("to", NO_ROUTE)
}

/// The field error for a destination country outside the tenant's
/// allow-list (messages and verifications alike), if it is.
pub fn country_refused(tenant: &TenantAuth, country: Option<&str>) -> Option<FieldError> {
    let allowed = tenant.allowed_countries.as_ref()?;
    let ok = country.is_some_and(|c| allowed.iter().any(|a| a.eq_ignore_ascii_case(c)));
    (!ok).then(|| FieldError {
        field: "to".into(),
        message: format!(
            "the destination country is not allowed for this account (allowed: {})",
            allowed.join(", ")
        ),
    })
}

/// What the tenant and the service allow beyond a well-formed request.
fn check_policy(
    request: &SendRequest,
    tenant: &TenantAuth,
    max_segments: u32,
    routed: bool,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if !routed {
        errors.push(FieldError::new("to", unreachable(&request.to)));
    }
    if request.segments.segments > max_segments {
        errors.push(FieldError {
            field: "body".into(),
            message: format!(
                "takes {} SMS segments; at most {max_segments} are allowed",
                request.segments.segments
            ),
        });
    }
    // Country allow-lists and senders are about numbers: a Telegram chat
    // has no country, and goes as the bot.
    let sms = request.to.phone().is_some();
    if sms {
        errors.extend(country_refused(tenant, request.to_country.as_deref()));
    } else if request.from.is_some() {
        errors.push(FieldError::new(
            "from",
            "a Telegram message is sent as the bot: leave `from` out",
        ));
    }
    if sms && !tenant.may_send_as(request.from.as_deref()) {
        errors.push(FieldError {
            field: "from".into(),
            message: if tenant.allowed_senders.is_some() {
                "this sender is not on this account's list of allowed senders".into()
            } else {
                "this account has no allowed senders: leave `from` out to use the default sender"
                    .into()
            },
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Validation(errors))
    }
}
