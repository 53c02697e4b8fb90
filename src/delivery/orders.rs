//! This instance's copy of the route orders (issue 43): what quality or an
//! operator's pin made of each route, read from the store on the quality
//! beat (so every instance takes the same order within one beat), and the
//! count of new messages per route that spreads the measuring floor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::destinations::{Route, Routes};
use super::quality::{effective, first_for};
use crate::store::RouteOrder;

/// The stored orders and the per-route counters.
pub struct RouteOrders {
    /// Quality on: the floor spreads new messages (a pin still holds when
    /// off).
    on: bool,
    floor: f64,
    stored: RwLock<Arc<HashMap<String, RouteOrder>>>,
    /// New messages per route prefix on this instance (routes of two or
    /// more providers only).
    counters: HashMap<String, AtomicU64>,
}

impl RouteOrders {
    pub fn new(routes: Option<&Routes>, on: bool, floor: f64) -> Self {
        let counters = routes
            .map(|r| {
                r.entries()
                    .iter()
                    .filter(|e| e.providers.len() >= 2)
                    .map(|e| (e.prefix.clone(), AtomicU64::new(0)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            on,
            floor,
            stored: RwLock::new(Arc::new(HashMap::new())),
            counters,
        }
    }

    pub fn quality_on(&self) -> bool {
        self.on
    }

    /// Replaces the copy with what the store holds.
    pub fn replace(&self, orders: Vec<RouteOrder>) {
        let map = orders.into_iter().map(|o| (o.prefix.clone(), o)).collect();
        *self.stored.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(map);
    }

    /// Puts one route's order in the copy (a write this instance made).
    pub fn remember(&self, order: RouteOrder) {
        let mut guard = self.stored.write().unwrap_or_else(|e| e.into_inner());
        let mut map = (**guard).clone();
        map.insert(order.prefix.clone(), order);
        *guard = Arc::new(map);
    }

    /// Forgets one route's order (an unpin this instance made).
    pub fn forget(&self, prefix: &str) {
        let mut guard = self.stored.write().unwrap_or_else(|e| e.into_inner());
        let mut map = (**guard).clone();
        map.remove(prefix);
        *guard = Arc::new(map);
    }

    /// Every stored order, as this instance last read it.
    pub fn stored(&self) -> Arc<HashMap<String, RouteOrder>> {
        Arc::clone(&self.stored.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The route's current order: its configured one unless stored (a
    /// quality shift only while quality is on; a pin always).
    pub fn current(&self, route: &Route) -> Vec<String> {
        let stored = self.stored();
        let order = stored
            .get(&route.prefix)
            .filter(|o| o.pinned || self.on)
            .map(|o| o.providers.as_slice());
        effective(&route.providers, order)
    }

    /// The order a new message on `route` takes, and whether that is not
    /// the route's configured order (then it is stored with the message).
    pub fn for_new(&self, route: &Route) -> Vec<String> {
        let Some(counter) = self.counters.get(&route.prefix) else {
            return route.providers.iter().map(|s| s.to_string()).collect();
        };
        let stored = self.stored();
        let order = stored.get(&route.prefix);
        let current = effective(&route.providers, order.map(|o| o.providers.as_slice()));
        let pinned = order.is_some_and(|o| o.pinned);
        if pinned {
            return current;
        }
        if !self.on {
            return route.providers.iter().map(|s| s.to_string()).collect();
        }
        let n = counter.fetch_add(1, Ordering::Relaxed);
        first_for(&current, n, self.floor)
    }
}

/// `order` joined for the message's row when it is not `route`'s
/// configured order.
pub fn stored_form(route: &Route, order: &[String]) -> Option<String> {
    let same = order.len() == route.providers.len()
        && order.iter().zip(&route.providers).all(|(a, b)| a == b);
    (!same).then(|| order.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        Routes::parse("+966=a,b; *=a", |n| {
            ["a", "b"].into_iter().find(|k| *k == n)
        })
        .expect("routes")
    }

    fn stored(providers: &[&str], pinned: bool) -> RouteOrder {
        RouteOrder {
            prefix: "+966".into(),
            providers: providers.iter().map(|s| s.to_string()).collect(),
            pinned,
            reason: String::new(),
            changed_at: time::OffsetDateTime::UNIX_EPOCH,
            version: 1,
        }
    }

    /// Where 20 new messages on `+966` start: (on a, on b).
    fn firsts(o: &RouteOrders, r: &Route) -> (usize, usize) {
        let v: Vec<String> = (0..20).map(|_| o.for_new(r)[0].clone()).collect();
        (
            v.iter().filter(|p| *p == "a").count(),
            v.iter().filter(|p| *p == "b").count(),
        )
    }

    /// (quality on, stored order, where 20 new messages start, the
    /// current order shown).
    #[test]
    fn new_messages_follow_the_table() {
        let routes = routes();
        let r = routes.get("+966").expect("route").clone();
        type Case = (bool, Option<RouteOrder>, (usize, usize), Vec<&'static str>);
        let cases: Vec<Case> = vec![
            // On, never shifted: the configured order, b its floor (1 in 20).
            (true, None, (19, 1), vec!["a", "b"]),
            // On, shifted: b first, a its floor.
            (
                true,
                Some(stored(&["b", "a"], false)),
                (1, 19),
                vec!["b", "a"],
            ),
            // On, pinned: exactly the pin, no floor.
            (
                true,
                Some(stored(&["b", "a"], true)),
                (0, 20),
                vec!["b", "a"],
            ),
            // Off: the configured order, no floor, a shift ignored...
            (false, None, (20, 0), vec!["a", "b"]),
            (
                false,
                Some(stored(&["b", "a"], false)),
                (20, 0),
                vec!["a", "b"],
            ),
            // ...but a pin still holds.
            (
                false,
                Some(stored(&["b", "a"], true)),
                (0, 20),
                vec!["b", "a"],
            ),
        ];
        for (on, order, want, current) in cases {
            let o = RouteOrders::new(Some(&routes), on, 0.05);
            o.replace(order.clone().into_iter().collect());
            assert_eq!(firsts(&o, &r), want, "on {on}, {order:?}");
            assert_eq!(o.current(&r), current, "on {on}, {order:?}");
        }
        // A route of one provider takes no turn and is never reordered.
        let o = RouteOrders::new(Some(&routes), true, 0.05);
        let one = routes.get("*").expect("default").clone();
        assert!((0..40).all(|_| o.for_new(&one) == ["a"]));
    }

    #[test]
    fn only_a_changed_order_is_stored_with_the_message() {
        let routes = routes();
        let r = routes.get("+966").expect("route");
        assert_eq!(stored_form(r, &["a".into(), "b".into()]), None);
        assert_eq!(
            stored_form(r, &["b".into(), "a".into()]),
            Some("b,a".into())
        );
    }
}
