//! The I/O side of routing: which providers are configured, this instance's
//! copy of the shared circuits, recording answers in them, and moving a
//! message on. The decisions themselves are [`route`](super::route) and
//! [`circuit`](super::circuit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::circuit::{self, Gate};
use super::{Deliverer, Report};
use crate::provider::Provider;
use crate::store::{
    AttemptResult, Circuit, CircuitState, Lease, MessageEvent, MessageRecord, MoveOn,
};

/// This instance's copy of the circuits, read again from the store once
/// older than the policy's `refresh`.
#[derive(Default)]
pub(super) struct CircuitCache {
    by_provider: HashMap<String, Circuit>,
    read_at: Option<Instant>,
}

/// Where a message stands for routing, as [`route`](super::route::route)
/// needs it.
pub(super) struct RouteState {
    pub provider: Option<Arc<dyn Provider>>,
    pub current_open: bool,
    pub next: Option<&'static str>,
}

impl Deliverer {
    /// The configured provider called `name`, or test mode's.
    pub(super) fn provider_named(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.provider_named_ref(name).cloned()
    }

    /// Every configured provider's circuit, as this instance last read it
    /// (reading again when the copy is older than the refresh interval).
    pub async fn circuits(&self) -> Vec<Circuit> {
        self.refresh_circuits().await;
        let now = self.clock.now();
        let cache = self.circuit_cache();
        self.calls
            .providers
            .iter()
            .map(|p| {
                cache
                    .by_provider
                    .get(p.name())
                    .cloned()
                    .unwrap_or_else(|| Circuit::closed(p.name(), now))
            })
            .collect()
    }

    fn circuit_cache(&self) -> std::sync::MutexGuard<'_, CircuitCache> {
        self.calls
            .circuits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn cached_circuit(&self, name: &str) -> Circuit {
        self.circuit_cache()
            .by_provider
            .get(name)
            .cloned()
            .unwrap_or_else(|| Circuit::closed(name, self.clock.now()))
    }

    async fn refresh_circuits(&self) {
        let due = self
            .circuit_cache()
            .read_at
            .is_none_or(|at| at.elapsed() >= self.calls.circuit_policy.refresh);
        if due {
            self.read_circuits().await;
        }
    }

    async fn read_circuits(&self) {
        match self.store.circuits().await {
            Ok(list) => {
                let mut cache = self.circuit_cache();
                cache.by_provider = list.into_iter().map(|c| (c.provider.clone(), c)).collect();
                cache.read_at = Some(Instant::now());
            }
            Err(e) => tracing::warn!(error = %e, "could not read the provider circuits"),
        }
    }

    fn remember(&self, c: Circuit) {
        self.circuit_cache()
            .by_provider
            .insert(c.provider.clone(), c);
    }

    /// Whether the provider called `name` is open to a send now, taking its
    /// probe when it is due for one.
    async fn open_now(&self, name: &str) -> bool {
        let policy = &self.calls.circuit_policy;
        for _ in 0..3 {
            let c = self.cached_circuit(name);
            let now = self.clock.now();
            match circuit::gate(&c, now, policy) {
                Gate::Pass => return false,
                Gate::Blocked => return true,
                Gate::Probe => {
                    let probing = circuit::take_probe(&c, now);
                    match self.store.put_circuit(&probing).await {
                        Ok(true) => {
                            tracing::info!(provider = name, "circuit half-open: this send probes");
                            self.remember(probing);
                            return false;
                        }
                        Ok(false) => self.read_circuits().await,
                        Err(e) => {
                            tracing::warn!(error = %e, "could not take the circuit probe");
                            return true;
                        }
                    }
                }
            }
        }
        true
    }

    /// The providers `msg` may use now.
    pub(super) async fn route_state(&self, msg: &MessageRecord) -> RouteState {
        self.refresh_circuits().await;
        let provider = self.provider_named(&msg.provider);
        let now = self.clock.now();
        let providers = self.providers_of(msg);
        let position = providers.iter().position(|p| p.name() == msg.provider);
        // A provider no longer on the message's route: the message may start
        // over on the route (unless something may have been sent already).
        let after = position.map_or(0, |i| i + 1);
        let next = providers[after.min(providers.len())..]
            .iter()
            .find(|p| {
                circuit::gate(
                    &self.cached_circuit(p.name()),
                    now,
                    &self.calls.circuit_policy,
                ) != Gate::Blocked
            })
            .map(|p| p.name())
            .or_else(|| {
                position
                    .is_none()
                    .then(|| providers.first().map(|p| p.name()))
                    .flatten()
            });
        let current_open = match &provider {
            Some(p) => self.open_now(p.name()).await,
            None => true,
        };
        RouteState {
            provider,
            current_open,
            next,
        }
    }

    /// Records in `name`'s circuit whether it works, and in the message's
    /// events any change that makes.
    pub(super) async fn record_circuit(
        &self,
        name: &'static str,
        works: bool,
        msg: &MessageRecord,
    ) {
        // Test mode's simulated answers say nothing about any provider.
        if name == crate::provider::testmode::NAME {
            return;
        }
        let policy = &self.calls.circuit_policy;
        for _ in 0..3 {
            let c = self.cached_circuit(name);
            let now = self.clock.now();
            let next = circuit::after(&c, works, now, policy);
            if next == c {
                return;
            }
            match self.store.put_circuit(&next).await {
                Ok(true) => {
                    self.remember(next.clone());
                    if next.state != c.state {
                        self.circuit_changed(name, &c, &next, msg).await;
                    }
                    return;
                }
                Ok(false) => self.read_circuits().await,
                Err(e) => {
                    tracing::warn!(error = %e, "could not record in the provider circuit");
                    return;
                }
            }
        }
    }

    async fn circuit_changed(&self, name: &str, from: &Circuit, to: &Circuit, msg: &MessageRecord) {
        let (kind, detail) = match to.state {
            CircuitState::Open if from.state == CircuitState::HalfOpen => (
                "circuit_opened",
                format!("the probe of {name} failed: its circuit is open again"),
            ),
            CircuitState::Open => (
                "circuit_opened",
                format!(
                    "{} failures in a row: the {name} circuit is open",
                    to.failures
                ),
            ),
            _ => (
                "circuit_closed",
                format!("{name} works again: its circuit is closed"),
            ),
        };
        tracing::warn!(provider = name, state = to.state.as_str(), "{detail}");
        self.metrics.circuit_change(name, to.state.as_str());
        let event = MessageEvent {
            at: to.updated_at,
            kind: kind.into(),
            provider: name.into(),
            to_provider: None,
            detail,
        };
        if let Err(e) = self.store.add_message_event(msg.id, &event).await {
            tracing::warn!(error = %e, "could not record the circuit change with the message");
        }
    }

    /// Moves `msg` on to provider `to` under `lease` (extended). The new
    /// open attempt's number, or how the run ends.
    pub(super) async fn move_on(
        &self,
        msg: &mut MessageRecord,
        lease: &mut Lease,
        to: String,
        reason: String,
        closing: Option<AttemptResult>,
    ) -> Result<u32, Report> {
        let now = self.clock.now();
        // The move extends the lease (the database's now plus its length).
        let written_at = crate::clock::Stamp::now();
        let sender = self
            .provider_named(&to)
            .and_then(|p| p.sender(msg.from.as_deref()));
        // Along a route, the event says which one (the next provider is the
        // route's, not the configured list's).
        let reason = match &msg.route {
            Some(route) => format!("{reason} (route {route})"),
            None => reason,
        };
        let cost_micros = self.cost_at(msg, &to);
        let m = MoveOn {
            cost_micros,
            id: msg.id,
            lease: lease.clone(),
            from: msg.provider.clone(),
            sender: sender.clone(),
            to,
            closing,
            reason,
            now,
        };
        let number = std::sync::Mutex::new(None);
        let written = self
            .write(lease, || async {
                let n = self.store.move_on(&m).await?;
                *number.lock().unwrap_or_else(|e| e.into_inner()) = n;
                Ok(n.is_some())
            })
            .await?;
        let n = number.into_inner().unwrap_or_else(|e| e.into_inner());
        let (true, Some(n)) = (written, n) else {
            return Err(Report::LeaseLost);
        };
        lease.written = written_at;
        tracing::warn!(from = %m.from, to = %m.to, reason = %m.reason, "moved on to the next provider");
        self.metrics.failover(&m.from, &m.to);
        if let (Some(micros), Some(cost)) = (m.cost_micros, &mut msg.cost) {
            *cost = crate::spend::Cost::new(micros, &cost.currency);
        }
        msg.provider = m.to;
        msg.attempts = n;
        msg.last_attempt_started_at = Some(now);
        msg.last_attempt_sender = sender;
        Ok(n)
    }
}

/// A new, empty copy of the circuits.
pub(super) fn cache() -> Mutex<CircuitCache> {
    Mutex::new(CircuitCache::default())
}
