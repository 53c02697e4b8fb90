//! Fair shares of this instance's send slots and of the queue of new
//! sends waiting for one (issue 41, finding 4): one tenant whose route is
//! slow must not take every slot or fill the whole queue, so that another
//! tenant's sends to a fast route are refused or wait behind it.
//!
//! The decisions are two pure functions ([`may_take_slot`],
//! [`may_queue`]), tested as tables; [`Fair`] counts what each tenant
//! holds and waits for. A tenant is *active* while it has a send queued,
//! waiting for a slot or holding one on this instance.
//!
//! - **Slots** (`SENDONCE_MAX_CONCURRENT_SENDS`, S): a delivery takes its
//!   tenant's first slot whenever one is free. Any further slot only while
//!   more than `SENDONCE_SPARE_SEND_SLOTS` (R; default S / 16) stay free,
//!   and only within its fair share `max(1, S / active tenants)` unless no
//!   other tenant's delivery waits for a slot. So a tenant alone uses
//!   S − R slots (all of them below 16 slots), the R left give another
//!   tenant's next sends a slot at once, and a tenant above its share gives
//!   slots back as its calls end, to tenants that wait.
//! - **Queue** (`SENDONCE_MAX_QUEUED_SENDS`, Q): a new send gets a place
//!   while the queue is not full and its tenant holds no place yet, or
//!   fewer than `max(1, Q / (active tenants + 1))` (a share for every
//!   active tenant and one for the next to arrive), or the queue is less
//!   than half full. A tenant alone queues at most half the queue.
//!
//! The scheduler (batch items, retries, scheduled sends) claims only for
//! the free slots beyond R ([`super::Deliverer::claimable_permits`]); what
//! it starts counts against its tenant's slots while it runs.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a delivery asking for a send slot sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAsk {
    /// Slots its tenant holds now.
    pub mine: usize,
    /// The instance's slots (S).
    pub slots: usize,
    /// Slots a tenant's further slots leave free (R).
    pub spare: usize,
    /// Slots free now.
    pub free: usize,
    /// Active tenants, its own included.
    pub tenants: usize,
    /// Whether another tenant's delivery waits for a slot.
    pub others_waiting: bool,
}

/// Whether the delivery may take a free slot now (the module's doc).
pub fn may_take_slot(a: &SlotAsk) -> bool {
    if a.free == 0 {
        return false;
    }
    let share = (a.slots / a.tenants.max(1)).max(1);
    a.mine == 0 || (a.free > a.spare && (a.mine < share || !a.others_waiting))
}

/// What a new send asking for a place in the queue sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAsk {
    /// Places its tenant holds now.
    pub mine: usize,
    /// Places taken now, by every tenant.
    pub queued: usize,
    /// The queue's bound (Q).
    pub bound: usize,
    /// Active tenants, its own included.
    pub tenants: usize,
}

/// Whether the send gets a place in the queue (the module's doc).
pub fn may_queue(a: &QueueAsk) -> bool {
    if a.queued >= a.bound {
        return false;
    }
    let share = (a.bound / (a.tenants.max(1) + 1)).max(1);
    a.mine == 0 || a.mine < share || a.queued < a.bound / 2
}

/// What one tenant holds and waits for on this instance.
#[derive(Default, Debug)]
struct Use {
    /// Places in the queue.
    queued: usize,
    /// Deliveries waiting for a slot.
    waiting: usize,
    /// Slots held.
    holding: usize,
}

impl Use {
    fn idle(&self) -> bool {
        self.queued == 0 && self.waiting == 0 && self.holding == 0
    }
}

#[derive(Default)]
struct State {
    tenants: HashMap<Uuid, Use>,
    /// Places taken in the queue, by every tenant.
    queued: usize,
}

impl State {
    /// Active tenants, counting `tenant` whether or not it is yet.
    fn active_with(&self, tenant: Uuid) -> usize {
        self.tenants.len() + usize::from(!self.tenants.contains_key(&tenant))
    }

    fn get(&self, tenant: Uuid) -> Option<&Use> {
        self.tenants.get(&tenant)
    }

    fn change(&mut self, tenant: Uuid, f: impl FnOnce(&mut Use)) {
        let u = self.tenants.entry(tenant).or_default();
        f(u);
        if u.idle() {
            self.tenants.remove(&tenant);
        }
    }
}

/// How long a waiting delivery goes at most before it looks again: every
/// change it waits for is signalled, this only bounds a change that was not
/// (a slot the scheduler took and gave back).
const RECHECK: Duration = Duration::from_millis(250);

/// The counts behind the fair shares, shared by the send path (queue
/// places) and the delivery tasks (slots).
#[derive(Default)]
pub(super) struct Fair {
    state: Mutex<State>,
    /// Signalled whenever a slot, a place or a wait is given up.
    changed: Notify,
}

impl Fair {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The counts stay consistent even if a holder panicked: every
        // change is one assignment.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Places taken in the queue now.
    pub(super) fn queued(&self) -> usize {
        self.lock().queued
    }

    /// Something was given up: waiting deliveries look again.
    pub(super) fn changed(&self) {
        self.changed.notify_waiters();
    }

    /// A place in the queue for `tenant`'s new send, if [`may_queue`].
    pub(super) fn reserve(self: &Arc<Self>, tenant: Uuid, bound: usize) -> Option<QueuePlace> {
        let mut st = self.lock();
        let ask = QueueAsk {
            mine: st.get(tenant).map_or(0, |u| u.queued),
            queued: st.queued,
            bound,
            tenants: st.active_with(tenant),
        };
        if !may_queue(&ask) {
            return None;
        }
        st.queued += 1;
        st.change(tenant, |u| u.queued += 1);
        Some(QueuePlace {
            fair: Arc::clone(self),
            tenant,
        })
    }

    /// Counts a slot taken for `tenant` elsewhere (the scheduler's).
    pub(super) fn hold(self: &Arc<Self>, tenant: Uuid) -> Holding {
        self.lock().change(tenant, |u| u.holding += 1);
        Holding {
            fair: Arc::clone(self),
            tenant,
        }
    }

    /// Waits until `tenant` [`may_take_slot`] of `permits` (`slots` of
    /// them, `spare` kept) and takes it; `None` once `stop` is cancelled.
    pub(super) async fn take_slot(
        self: &Arc<Self>,
        tenant: Uuid,
        permits: &Arc<Semaphore>,
        (slots, spare): (usize, usize),
        stop: &CancellationToken,
    ) -> Option<(OwnedSemaphorePermit, Holding)> {
        let _waiting = Waiting::enter(self, tenant);
        loop {
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            {
                let mut st = self.lock();
                let ask = SlotAsk {
                    mine: st.get(tenant).map_or(0, |u| u.holding),
                    slots,
                    spare,
                    free: permits.available_permits(),
                    tenants: st.active_with(tenant),
                    others_waiting: st
                        .tenants
                        .iter()
                        .any(|(t, u)| *t != tenant && u.waiting > 0),
                };
                if may_take_slot(&ask)
                    && let Ok(permit) = Arc::clone(permits).try_acquire_owned()
                {
                    st.change(tenant, |u| u.holding += 1);
                    let holding = Holding {
                        fair: Arc::clone(self),
                        tenant,
                    };
                    return Some((permit, holding));
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return None,
                () = changed => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

impl Fair {
    /// Waits until more than `spare` of `permits` are free; false once
    /// `stop` is cancelled.
    pub(super) async fn wait_free(
        &self,
        permits: &Semaphore,
        spare: usize,
        stop: &CancellationToken,
    ) -> bool {
        loop {
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            if permits.available_permits() > spare {
                return true;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return false,
                () = changed => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

/// A tenant's place in the queue; given up when dropped.
pub(super) struct QueuePlace {
    fair: Arc<Fair>,
    tenant: Uuid,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        {
            let mut st = self.fair.lock();
            st.queued = st.queued.saturating_sub(1);
            st.change(self.tenant, |u| u.queued = u.queued.saturating_sub(1));
        }
        self.fair.changed();
    }
}

/// A slot counted against a tenant; given up when dropped (after the slot's
/// permit, which the delivery drops first).
pub(super) struct Holding {
    fair: Arc<Fair>,
    tenant: Uuid,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.fair
            .lock()
            .change(self.tenant, |u| u.holding = u.holding.saturating_sub(1));
        self.fair.changed();
    }
}

/// A delivery of a tenant waiting for a slot, while it waits.
struct Waiting<'a> {
    fair: &'a Fair,
    tenant: Uuid,
}

impl<'a> Waiting<'a> {
    fn enter(fair: &'a Fair, tenant: Uuid) -> Self {
        fair.lock().change(tenant, |u| u.waiting += 1);
        Self { fair, tenant }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.fair
            .lock()
            .change(self.tenant, |u| u.waiting = u.waiting.saturating_sub(1));
        self.fair.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(
        mine: usize,
        (slots, spare): (usize, usize),
        free: usize,
        n: usize,
        others: bool,
    ) -> bool {
        may_take_slot(&SlotAsk {
            mine,
            slots,
            spare,
            free,
            tenants: n,
            others_waiting: others,
        })
    }

    #[test]
    fn slots_table() {
        // (mine, (S, R), free, active tenants, another waits) → may take
        let rows = [
            // No slot free: nobody.
            ((0, (4, 1), 0, 1, false), false),
            ((0, (4, 0), 0, 2, true), false),
            // A tenant's first slot, whenever one is free, spare or not.
            ((0, (4, 1), 1, 1, false), true),
            ((0, (4, 1), 1, 3, true), true),
            ((0, (1, 0), 1, 1, false), true),
            // Alone: every slot but the spare ones.
            ((1, (4, 1), 3, 1, false), true),
            ((2, (4, 1), 2, 1, false), true),
            ((3, (4, 1), 1, 1, false), false),
            ((59, (64, 4), 5, 1, false), true),
            ((60, (64, 4), 4, 1, false), false),
            // No spare slots (fewer than 16 by default): every slot.
            ((1, (2, 0), 1, 1, false), true),
            ((2, (3, 0), 1, 1, false), true),
            // Two active, both waiting: up to S / 2 each.
            ((1, (4, 0), 1, 2, true), true),
            ((2, (4, 0), 2, 2, true), false),
            ((31, (64, 4), 10, 2, true), true),
            ((32, (64, 4), 10, 2, true), false),
            // Above its share while nobody else waits: spare capacity.
            ((2, (4, 0), 2, 2, false), true),
            ((40, (64, 4), 10, 2, false), true),
            ((40, (64, 4), 4, 2, false), false),
            // Within its share, still never the spare slots.
            ((1, (64, 4), 4, 2, true), false),
            // More tenants than slots: a share is still one slot.
            ((0, (2, 0), 1, 5, true), true),
            ((1, (2, 0), 1, 5, true), false),
        ];
        for ((mine, s, free, n, others), want) in rows {
            assert_eq!(
                slot(mine, s, free, n, others),
                want,
                "mine={mine} (S, R)={s:?} free={free} tenants={n} others_waiting={others}"
            );
        }
    }

    fn queue(mine: usize, queued: usize, bound: usize, tenants: usize) -> bool {
        may_queue(&QueueAsk {
            mine,
            queued,
            bound,
            tenants,
        })
    }

    #[test]
    fn queue_table() {
        // (mine, queued, Q, active tenants) → gets a place
        let rows = [
            // Full: nobody.
            ((0, 8, 8, 2), false),
            ((0, 1, 1, 1), false),
            // A tenant's first place, while there is room.
            ((0, 7, 8, 3), true),
            ((0, 0, 1, 1), true),
            // Alone: half the queue.
            ((3, 3, 8, 1), true),
            ((4, 4, 8, 1), false),
            ((512, 512, 1024, 1), false),
            // Two active: a third each (a share kept for the next).
            ((2, 6, 8, 2), false),
            ((1, 5, 8, 2), true),
            ((341, 700, 1024, 2), false),
            ((340, 700, 1024, 2), true),
            // Less than half full: anyone.
            ((3, 3, 8, 2), true),
            // A bound of one or two still takes a first send.
            ((0, 1, 2, 2), true),
            ((1, 1, 2, 1), false),
        ];
        for ((mine, queued, bound, n), want) in rows {
            assert_eq!(
                queue(mine, queued, bound, n),
                want,
                "mine={mine} queued={queued} Q={bound} tenants={n}"
            );
        }
    }
}
