//! One delivery run: resuming a claimed message, then at most one provider
//! call per pass (a message that moves on to the next provider goes round
//! again), every call started under a lease that outlives it, checked after
//! the last wait.

use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::OwnedSemaphorePermit;

use super::decide::{self, Event, KeyRule, Snapshot, Step, Transition, Write, too_late};
use super::{Deliverer, LEASE_FRESHNESS, Report, Route, hub, needs_renewal};
use crate::clock::Stamp;
use crate::domain::{AttemptOutcome, MessageId, Status};
use crate::provider::{AttemptRef, OutgoingSms, Reconciled};
use crate::store::{Lease, MessageRecord};

/// How a delivery run begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A message just inserted with its first attempt started under our lease.
    Fresh,
    /// A claimed message that was due: a retry, a scheduled send, a recheck,
    /// or one an instance released on shutdown before calling the provider.
    Due,
    /// A claimed message whose previous owner's lease ran out: it crashed,
    /// paused, or the database's clock stepped; its call may still be in
    /// flight.
    Takeover,
}

/// Why the body cannot be handed to the provider now.
pub(super) enum BodyError {
    /// The verify secret cannot be read now (the database is away): later.
    Unavailable,
    /// It never will be (a sealed body whose secret is gone): why.
    Unreadable(String),
}

impl Deliverer {
    pub(super) async fn run(
        &self,
        mut msg: MessageRecord,
        mut lease: Lease,
        start: Start,
        permit: Option<OwnedSemaphorePermit>,
        registration: &hub::Registration,
    ) -> Report {
        let mut permit = match permit {
            Some(p) => Some(p),
            None => match self.acquire().await {
                Some(p) => Some(p),
                None => return Report::Stopped,
            },
        };
        let (mut attempt, mut started_at) = if start == Start::Fresh {
            let started = msg.last_attempt_started_at.unwrap_or(msg.created_at);
            (msg.attempts, started)
        } else {
            match self.resume(&mut msg, &mut lease, start, registration).await {
                Ok(at) => at,
                Err(report) => return report,
            }
        };

        // One provider call per pass; a message that moves on to the next
        // provider goes round again at once.
        loop {
            // A send slot first: in a provider brownout the wait for one can
            // be long, and every check below must come after it.
            let slot = match permit.take() {
                Some(p) => p,
                None => match self.acquire().await {
                    Some(p) => p,
                    None => return Report::Stopped,
                },
            };
            // Stopped meanwhile: this pass has called nothing yet, so the
            // message may be released for another instance at once.
            if self.stop.is_cancelled() {
                return Report::Stopped;
            }
            let snap = Snapshot::of(&msg, attempt, started_at);
            let routing = self.route_state(&msg).await;
            let current = msg.provider.clone();
            let r = Route {
                current: &current,
                current_open: routing.current_open,
                next: routing.next,
            };
            let keys = KeyRule::of(routing.provider.as_deref());

            // Past its validity, or to a number that opted out (read with
            // the row, the insert or the claim): no provider is called. A
            // circuit that is open sends the message on to the next provider.
            let t = self.decide(
                &snap,
                &Event::Starting {
                    opted_out: msg.recipient_opted_out,
                    closing: Some((attempt, AttemptOutcome::Expired)),
                },
                keys,
                &r,
            );
            match t {
                Transition::Step(Step::Proceed) => {}
                Transition::Step(Step::MoveOn {
                    to,
                    reason,
                    attempt: closing,
                }) => {
                    let moved_attempt = closing.is_some();
                    match self
                        .move_on(&mut msg, &mut lease, to, reason, closing)
                        .await
                    {
                        Ok(n) => {
                            attempt = n;
                            if moved_attempt {
                                started_at = self.clock.now();
                            }
                            permit = Some(slot);
                            continue;
                        }
                        Err(report) => return report,
                    }
                }
                Transition::Write(w) => return self.apply(&mut msg, &lease, registration, w).await,
                Transition::Step(step) => return unexpected(&step),
            }
            let Some(provider) = routing.provider else {
                // Its provider is no longer configured and something may
                // have been sent through it: nobody can tell.
                let w = Write::Final {
                    status: Status::Unknown,
                    provider_message_id: None,
                    error: Some(decide::error(
                        "outcome_unknown",
                        &format!(
                            "the {} provider is no longer configured and may have sent it",
                            msg.provider
                        ),
                        None,
                    )),
                    attempt: None,
                };
                return self.apply(&mut msg, &lease, registration, w).await;
            };

            let now = self.clock.now();
            let mut sms = match self.outgoing(&msg, now).await {
                Ok(sms) => sms,
                Err(BodyError::Unreadable(why)) => {
                    return match self.decide(&snap, &Event::Unsendable(&why), keys, &r) {
                        Transition::Write(w) => self.apply(&mut msg, &lease, registration, w).await,
                        Transition::Step(step) => unexpected(&step),
                    };
                }
                Err(BodyError::Unavailable) => return Report::StoreDown,
            };

            let outcome = match self
                .call(&mut msg, &mut lease, provider.as_ref(), &mut sms)
                .await
            {
                Ok(super::calls::Called::Answered(outcome)) => outcome,
                Ok(super::calls::Called::Stopped) => {
                    return match self.decide(&snap, &Event::Stopped, keys, &r) {
                        Transition::Write(w) => self.apply(&mut msg, &lease, registration, w).await,
                        Transition::Step(step) => unexpected(&step),
                    };
                }
                Err(report) => return report,
            };
            // The request was written before the call returned: an age
            // measured from here is a lower bound of the time since.
            let returned = Stamp::now();
            drop(slot);
            self.record_circuit(provider.name(), outcome.provider_works(), &msg)
                .await;

            let mut t = self.decide(&snap, &Event::Answered(&outcome), keys, &r);
            if let Transition::Step(Step::Reconcile { since }) = t {
                if let Err(report) = self.wait_out_own_call(msg.id, &mut lease).await {
                    return report;
                }
                let asked = self.attempt_ref(&msg, since, returned.elapsed());
                let Some(answer) = self
                    .reconcile(Some(provider.as_ref()), provider.name(), &sms, &asked)
                    .await
                else {
                    return Report::Stopped;
                };
                let reconciled = |answer| {
                    self.decide(
                        &snap,
                        &Event::Reconciled {
                            after: &outcome,
                            answer,
                        },
                        keys,
                        &r,
                    )
                };
                t = reconciled(&answer);
                if let Transition::Write(w @ Write::Final { .. }) = &t {
                    match self
                        .apply_once(&mut msg, &lease, registration, w.clone())
                        .await
                    {
                        // The one candidate became another message's first:
                        // it was not ours, and ours was not listed yet (a
                        // list may lag): asked again, never resent.
                        Report::IdTaken => t = reconciled(&candidate_taken()),
                        report => return report,
                    }
                }
            }
            match t {
                Transition::Step(Step::MoveOn {
                    to,
                    reason,
                    attempt: closing,
                }) => match self
                    .move_on(&mut msg, &mut lease, to, reason, closing)
                    .await
                {
                    Ok(n) => {
                        attempt = n;
                        started_at = self.clock.now();
                    }
                    Err(report) => return report,
                },
                Transition::Write(w) => return self.apply(&mut msg, &lease, registration, w).await,
                Transition::Step(step) => return unexpected(&step),
            }
        }
    }

    /// Before a claimed message's next attempt: wait out a previous owner's
    /// call, ask the provider about an attempt left open, check the
    /// deadline, then start the attempt. The attempt number and start, or
    /// how the run ends.
    async fn resume(
        &self,
        msg: &mut MessageRecord,
        lease: &mut Lease,
        start: Start,
        registration: &hub::Registration,
    ) -> Result<(u32, OffsetDateTime), Report> {
        // Our claim is over: whatever request a previous owner wrote, it
        // wrote it at the latest a call's time after this (see
        // `inherited_age`).
        let claimed = Stamp::now();
        let open = msg.last_attempt_open;
        let previous_start = msg.last_attempt_started_at.unwrap_or(msg.created_at);
        let provider = self.provider_named(&msg.provider);
        let keys = KeyRule::of(provider.as_deref());
        // Past the retry deadline no attempt may start, so nothing the
        // previous owner may still have in flight can be sent twice: the
        // message is ended at once (a wait there would only let the lookup
        // see more, and an instance hit again and again during waits would
        // hold the message long past its deadline).
        let past_deadline = self.clock.now() >= msg.deadline_at;
        if open && start == Start::Takeover && !past_deadline {
            self.wait_out_previous_owner(msg.id, lease).await?;
        }
        // An attempt without an answer may have reached the provider.
        msg.maybe_sent |= open;
        let stay = Route {
            current: "",
            current_open: false,
            next: None,
        };
        let snap = Snapshot::of(msg, msg.attempts, previous_start);
        let now = self.clock.now();
        if open && !keys.dedupes {
            // The previous owner may have sent it and cannot tell us: ask
            // the provider it was sending with before sending anything again.
            let t = match self.outgoing(msg, now).await {
                Ok(sms) => {
                    let asked = self.attempt_ref(msg, previous_start, self.inherited_age(claimed));
                    let Some(answer) = self
                        .reconcile(provider.as_deref(), &msg.provider, &sms, &asked)
                        .await
                    else {
                        return Err(Report::Stopped);
                    };
                    self.decide(&snap, &Event::Resumed(&answer), keys, &stay)
                }
                Err(BodyError::Unreadable(why)) => {
                    self.decide(&snap, &Event::Unsendable(&why), keys, &stay)
                }
                // The body cannot be read now: past the deadline that is an
                // answer already (below); before it, the next owner asks.
                Err(BodyError::Unavailable) if too_late(&snap, now).is_none() => {
                    return Err(Report::StoreDown);
                }
                Err(BodyError::Unavailable) => Transition::Step(Step::Proceed),
            };
            match t {
                Transition::Step(Step::Proceed) => {}
                Transition::Write(w @ Write::Final { .. }) => {
                    match self.apply_once(msg, lease, registration, w).await {
                        // The one candidate is another message's (it wrote
                        // the id first): ours was not listed yet (a list
                        // may lag), so it is asked again, never resent.
                        Report::IdTaken => {
                            let pending = candidate_taken();
                            return Err(
                                match self.decide(&snap, &Event::Resumed(&pending), keys, &stay) {
                                    Transition::Write(w) => {
                                        self.apply(msg, lease, registration, w).await
                                    }
                                    Transition::Step(step) => unexpected(&step),
                                },
                            );
                        }
                        report => return Err(report),
                    }
                }
                Transition::Write(w) => return Err(self.apply(msg, lease, registration, w).await),
                Transition::Step(step) => return Err(unexpected(&step)),
            }
        }
        let closing = open.then_some((msg.attempts, AttemptOutcome::Lost));
        let t = self.decide(
            &snap,
            &Event::Starting {
                opted_out: false,
                closing,
            },
            keys,
            &stay,
        );
        match t {
            Transition::Step(Step::Proceed) => {}
            Transition::Write(w) => return Err(self.apply(msg, lease, registration, w).await),
            Transition::Step(step) => return Err(unexpected(&step)),
        }
        let sender = provider
            .as_ref()
            .and_then(|p| p.sender(msg.from.as_deref()));
        let written = crate::clock::Stamp::now();
        match self
            .store
            .start_attempt(msg.id, lease, now, sender.as_deref())
            .await
        {
            Ok(Some(n)) => {
                lease.written = written;
                msg.attempts = n;
                msg.last_attempt_sender = sender;
                Ok((n, now))
            }
            Ok(None) => Err(Report::LeaseLost),
            Err(e) => {
                tracing::warn!(error = %e, "could not start an attempt");
                Err(Report::StoreDown)
            }
        }
    }

    /// A claimer that took over an expired lease with an attempt open does
    /// nothing for [`Deliverer::takeover_wait`], on its own clock: the
    /// previous owner's lease ran out on the database's clock, which may
    /// have stepped, or the owner may be paused mid-call, and its request
    /// may still be in flight. Asking the provider, or resending, before
    /// that request can no longer be acting would send twice (issue 24,
    /// findings 1, 5 and 6). Then the lease is renewed, fenced.
    async fn wait_out_previous_owner(
        &self,
        id: MessageId,
        lease: &mut Lease,
    ) -> Result<(), Report> {
        let wait = self.takeover_wait();
        tracing::info!(
            wait_ms = wait.as_millis() as u64,
            "took over an attempt left open: waiting out its provider call"
        );
        self.hold_for(id, wait).await?;
        self.renew(id, lease).await
    }

    /// How long a previous owner may still be acting on the provider: it may
    /// have passed its last lease check up to [`LEASE_FRESHNESS`] before our
    /// claim (a stepped database clock), spent up to the provider timeout
    /// connecting before its request was written (the call's one time
    /// limit covers the connection too), and the provider acts on a request
    /// within the provider timeout of receiving it. The configuration keeps
    /// the lease (at least twice the timeout plus 2 s) longer, so rescuers
    /// do not take a message from each other while they wait.
    fn takeover_wait(&self) -> Duration {
        self.settings.provider_timeout * 2 + LEASE_FRESHNESS
    }

    /// Waits `wait` holding the message like a call in flight (a shutdown
    /// meanwhile holds its lease rather than releasing it).
    async fn hold_for(&self, id: MessageId, wait: Duration) -> Result<(), Report> {
        let Some(_held) = self.begin_call(id) else {
            return Err(Report::Stopped);
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => Ok(()),
            () = self.stop.cancelled() => Err(Report::Stopped),
        }
    }

    /// After an ambiguous answer (a 5xx, a reset, our own timeout) the
    /// provider may still be acting on the request for the provider timeout
    /// after it: the lease is renewed, and the provider asked only then, so
    /// that "not found" means it never will be.
    async fn wait_out_own_call(&self, id: MessageId, lease: &mut Lease) -> Result<(), Report> {
        self.renew(id, lease).await?;
        self.hold_for(id, self.settings.provider_timeout).await
    }

    /// How much lease a provider call needs left when it starts: the whole
    /// call, plus a second.
    fn call_needs(&self) -> Duration {
        self.settings.provider_timeout + LEASE_FRESHNESS
    }

    /// Makes sure the lease covers a call starting now: renewed (fenced)
    /// unless written within [`LEASE_FRESHNESS`] with enough left.
    pub(super) async fn lease_for_call(
        &self,
        id: MessageId,
        lease: &mut Lease,
    ) -> Result<(), Report> {
        if needs_renewal(lease.age()) || lease.left() < self.call_needs() {
            self.renew(id, lease).await?;
        }
        Ok(())
    }

    pub(super) async fn renew(&self, id: MessageId, lease: &mut Lease) -> Result<(), Report> {
        let written = crate::clock::Stamp::now();
        match self.store.renew_lease(id, lease).await {
            Ok(true) => {
                lease.written = written;
                Ok(())
            }
            Ok(false) => Err(Report::LeaseLost),
            Err(e) => {
                tracing::warn!(error = %e, "could not renew the lease");
                Err(Report::StoreDown)
            }
        }
    }

    /// What a reconciliation asks about: the current attempt of `msg`,
    /// started at `since` (on the wall clock of whoever started it: only
    /// for a window on the provider's own clock, Twilio's list), its
    /// request written at least `age` ago, sent as it recorded.
    fn attempt_ref(&self, msg: &MessageRecord, since: OffsetDateTime, age: Duration) -> AttemptRef {
        AttemptRef {
            started_at: since,
            age,
            sender: msg.last_attempt_sender.clone(),
        }
    }

    /// How long ago, at least, the request of an attempt this instance
    /// inherited (a takeover, a recheck) was written, judged on this
    /// host's clock that cannot step: this instance cannot know when, only
    /// that its previous owner's last lease write came before our claim,
    /// its last lease check at most [`LEASE_FRESHNESS`] after that write,
    /// and its request at most the provider timeout after the check (the
    /// call's one limit covers the connection too). So from our claim,
    /// less the provider timeout and the freshness, and never below zero.
    fn inherited_age(&self, claimed: Stamp) -> Duration {
        claimed
            .elapsed()
            .saturating_sub(self.settings.provider_timeout + LEASE_FRESHNESS)
    }

    /// The SMS to hand the provider, its body opened if it was sealed (a
    /// verification's code).
    pub(super) async fn outgoing(
        &self,
        msg: &MessageRecord,
        now: OffsetDateTime,
    ) -> Result<OutgoingSms, BodyError> {
        let mut sms = OutgoingSms {
            message_id: msg.id,
            to: msg.to.clone(),
            from: msg.from.clone(),
            body: msg.body.clone(),
            validity: msg
                .expires_at
                .map(|e| Duration::try_from(e - now).unwrap_or(Duration::ZERO)),
            attempt: msg.attempts,
            prepared: msg.prepared_token.clone(),
        };
        if !crate::verify::crypto::is_sealed(&sms.body) {
            return Ok(sms);
        }
        let Some(secret) = self.calls.sealed.get() else {
            tracing::error!(message_id = %sms.message_id, "a sealed body, and no verify secret to open it");
            return Err(BodyError::Unreadable(
                "the message's sealed body cannot be opened: no verify secret is configured".into(),
            ));
        };
        let keys = match secret.keys().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(message_id = %sms.message_id, error = %e, "verify secret unavailable");
                return Err(BodyError::Unavailable);
            }
        };
        match keys.open_body(sms.message_id.0, &sms.body) {
            Ok(body) => {
                sms.body = body;
                Ok(sms)
            }
            Err(e) => {
                tracing::error!(message_id = %sms.message_id, error = %e, "sealed body does not open");
                Err(BodyError::Unreadable(
                    "the message's sealed body does not open with the verify secret \
                     (SENDONCE_VERIFY_SECRET changed since it was sealed)"
                        .into(),
                ))
            }
        }
    }

    /// A provider-call slot; `None` when shutdown stopped the wait.
    pub(super) async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        tokio::select! {
            // Shutdown first: a slot freed by a call it just cut off must
            // not start another.
            biased;
            () = self.stop.cancelled() => None,
            p = std::sync::Arc::clone(&self.slots.permits).acquire_owned() => p.ok(),
        }
    }

    pub(super) fn decide(
        &self,
        snap: &Snapshot,
        event: &Event<'_>,
        keys: KeyRule,
        r: &Route<'_>,
    ) -> Transition {
        super::route::route(snap, event, self.clock.now(), &self.settings.retry, keys, r)
    }
}

/// What a reconciliation learns when its one candidate turns out to be
/// another message's (that message wrote the provider's id first): ours
/// was not listed, which on a list that may lag is no answer yet.
fn candidate_taken() -> Reconciled {
    Reconciled::Pending(
        "the provider's only candidate belongs to another message; ours is not listed yet".into(),
    )
}

/// A step `decide` does not lead to from where the run asked (an event
/// that cannot need it): nothing is written, and whoever claims the
/// message next decides again.
fn unexpected(step: &Step) -> Report {
    tracing::error!(
        ?step,
        "a step this part of the run cannot take: nothing written"
    );
    Report::StoreDown
}
