//! The provider call itself ([`Deliverer::call`]), and the calls of this
//! instance that may be in flight, so that a shutdown knows which leases it
//! must hold rather than release (issue 24, finding 1): a call registers
//! before its last lease check and stays registered until it returns; once
//! shutdown has cut calls off, none may start, and a task that reaches one
//! is held too.

use tokio::time::Instant;

use super::{Deliverer, Report, needs_renewal};
use crate::domain::MessageId;
use crate::provider::{OutgoingSms, Provider, SendOutcome};
use crate::store::{Lease, MessageRecord};

/// How a call went, when the run goes on after it.
pub(super) enum Called {
    /// The provider answered (or the call timed out: ambiguous).
    Answered(SendOutcome),
    /// No call was made: the message was stopped since it was read.
    Stopped,
}

/// A provider call that may be in flight: registered until dropped, so a
/// shutdown knows which leases it must hold rather than release.
pub(super) struct Call<'a> {
    deliverer: &'a Deliverer,
    id: MessageId,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.deliverer.calls_in_flight().in_flight.remove(&self.id);
    }
}

impl Deliverer {
    /// Registers a provider call about to start (or a takeover waiting out
    /// someone else's); `None` once shutdown has cut calls off, and then the
    /// message is held rather than released, since its task was that close
    /// to a call (holding what could have been released costs only time).
    pub(super) fn begin_call(&self, id: MessageId) -> Option<Call<'_>> {
        let mut calls = self.calls_in_flight();
        if calls.stopping {
            calls.held.insert(id);
            return None;
        }
        calls.in_flight.insert(id);
        Some(Call {
            deliverer: self,
            id,
        })
    }

    /// No call may start any more; every call in flight now is held.
    pub(super) fn cut_off_calls(&self) {
        let mut calls = self.calls_in_flight();
        calls.stopping = true;
        let in_flight: Vec<MessageId> = calls.in_flight.iter().copied().collect();
        calls.held.extend(in_flight);
    }

    /// The messages a shutdown holds rather than releases: those whose call
    /// was in flight when calls were cut off, and those whose task reached a
    /// call afterwards.
    pub(super) fn held_calls(&self) -> Vec<MessageId> {
        self.calls_in_flight().held.iter().copied().collect()
    }

    fn calls_in_flight(&self) -> std::sync::MutexGuard<'_, super::Calls> {
        self.calls
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Deliverer {
    /// One provider call: registered (so a shutdown holds its lease), under
    /// a lease renewed after the last wait and checked once more on this
    /// instance's clock, cut off at the provider timeout or when the
    /// shutdown grace ends; the answer scrubbed of the message's text.
    ///
    /// A provider whose send carries a token of a first call
    /// ([`Provider::prepare`]) gets it first, when the message has none
    /// yet: the token is written with the message, fenced on the lease,
    /// before the send that carries it starts (and the lease checked again
    /// after that wait), so that every later attempt, on any instance,
    /// sends with the same one.
    pub(super) async fn call(
        &self,
        msg: &mut MessageRecord,
        lease: &mut Lease,
        provider: &dyn Provider,
        sms: &mut OutgoingSms,
    ) -> Result<Called, Report> {
        // The lease, after the last wait (the slot, the secret): renewed
        // unless it was written within the last second, and with enough
        // left for the whole call.
        let Some(call) = self.begin_call(msg.id) else {
            return Err(Report::Stopped);
        };
        self.lease_for_call(msg.id, lease).await?;
        if sms.prepared.is_none()
            && provider.prepares()
            && let Some(prepared) = self.prepare(msg, lease, provider, sms).await?
        {
            drop(call);
            return Ok(Called::Answered(
                prepared.scrubbed(&sms.body, self.secrets()),
            ));
        }
        // A message that carries a verification's code is checked, in a
        // write right before its call, for a stop since it was read: the
        // verification moved on to its next channel, or ended (issue 39).
        // The write renews the lease as well.
        if msg.verification_id.is_some() {
            let written = crate::clock::Stamp::now();
            match self.store.guard_send(msg.id, lease, self.clock.now()).await {
                Ok(Some(true)) => lease.written = written,
                Ok(Some(false)) => return Ok(Called::Stopped),
                Ok(None) => return Err(Report::LeaseLost),
                Err(e) => {
                    tracing::warn!(error = %e, "could not check the message before its call");
                    return Err(Report::StoreDown);
                }
            }
        }
        crate::failpoint::hit("call.before_request");
        // Checked once more on this instance's own clock right before the
        // request is built: a pause (GC, SIGSTOP, a VM freeze) since the
        // renewal that ate into the lease means someone else may own the
        // message now. A renewal that still succeeds says nobody does
        // (the lease is still ours in the database), and then the check
        // is made again; one that fails ends the run. From the last
        // check to the request's bytes on the wire is the window
        // docs/architecture.md states.
        // The test is the lease's freshness, not what is left of it: a
        // stepped database clock may have ended it whatever this clock
        // says, and only a write less than a second old is known to be
        // covered by a claimer's takeover wait.
        if needs_renewal(lease.age()) {
            tracing::warn!(
                age_ms = lease.age().as_millis() as u64,
                "paused before the provider call: renewing the lease before calling"
            );
            self.renew(msg.id, lease).await?;
            if needs_renewal(lease.age()) {
                return Err(Report::LeaseLost);
            }
        }
        let called = Instant::now();
        let outcome = tokio::select! {
            o = tokio::time::timeout(self.settings.provider_timeout, provider.send(sms)) => {
                o.unwrap_or_else(|_| SendOutcome::Ambiguous {
                    http_status: None,
                    retry_after: None,
                    message: "the provider did not answer in time".into(),
                })
            }
            // Shutdown grace is over: the call is cut off, its lease
            // held (see `Deliverer::shutdown`), and whoever resumes the
            // message treats the attempt as ambiguous.
            () = self.stop.cancelled() => return Err(Report::Stopped),
        };
        drop(call);
        // Before it is logged, stored or decided on: a provider's error
        // text may quote the message, a one-time code included.
        let outcome = outcome.scrubbed(&sms.body, self.secrets());
        crate::failpoint::hit("call.after_answer");
        let class = outcome.class();
        self.metrics
            .provider_attempt(provider.name(), class, called.elapsed());
        tracing::debug!(
            provider = provider.name(),
            elapsed_ms = called.elapsed().as_millis() as u64,
            ?outcome,
            "provider answered"
        );
        Ok(Called::Answered(outcome))
    }

    /// The first call of a provider that has one, and its token written
    /// (see [`Deliverer::call`]); `Some(outcome)`: the attempt ends so,
    /// nothing sent.
    async fn prepare(
        &self,
        msg: &mut MessageRecord,
        lease: &mut Lease,
        provider: &dyn Provider,
        sms: &mut OutgoingSms,
    ) -> Result<Option<SendOutcome>, Report> {
        let first = tokio::select! {
            o = tokio::time::timeout(self.settings.provider_timeout, provider.prepare(sms)) => o,
            () = self.stop.cancelled() => return Err(Report::Stopped),
        };
        let token = match first {
            Ok(None) => return Ok(None),
            Ok(Some(Ok(token))) => token,
            Ok(Some(Err(outcome))) => return Ok(Some(outcome)),
            // The first call sends nothing: no answer is no harm.
            Err(_) => {
                return Ok(Some(SendOutcome::Retryable {
                    http_status: None,
                    provider_code: None,
                    retry_after: None,
                    message: "the provider did not answer its first call in time".into(),
                }));
            }
        };
        let written = crate::clock::Stamp::now();
        match self.store.prepare_send(msg.id, lease, &token).await {
            // The token the message holds: ours, or one an earlier owner
            // wrote first (then ours is never used).
            Ok(Some(stored)) => {
                lease.written = written;
                msg.prepared_token = Some(stored.clone());
                sms.prepared = Some(stored);
            }
            Ok(None) => return Err(Report::LeaseLost),
            Err(e) => {
                tracing::warn!(error = %e, "could not store the provider's token");
                return Err(Report::StoreDown);
            }
        }
        // The write was a wait: the lease must still cover the send.
        self.lease_for_call(msg.id, lease).await?;
        Ok(None)
    }
}
