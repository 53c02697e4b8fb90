use std::time::Duration;

use time::macros::datetime;

use super::*;

const NOW: OffsetDateTime = datetime!(2026-12-07 12:00 UTC);

fn t() -> Thresholds {
    Thresholds {
        min_samples: 50,
        ..Thresholds::default()
    }
}

/// `judged` messages of which `slow` were slow, `delivered` of
/// `delivered + undelivered` reported.
fn m(provider: &str, judged: u32, slow: u32, delivered: u32, undelivered: u32) -> Measured {
    let mut within = [0; BUCKETS.len()];
    // Every delivery within 5 s.
    for (i, edge) in BUCKETS.iter().enumerate() {
        if *edge >= 5 {
            within[i] = delivered;
        }
    }
    Measured {
        route: "+966".into(),
        provider: provider.into(),
        messages: judged,
        sent: judged,
        delivered,
        undelivered,
        judged,
        slow,
        within,
        ..Measured::default()
    }
}

fn codes(mut x: Measured, codes: u32, approved: u32) -> Measured {
    x.codes = codes;
    x.approved = approved;
    x
}

fn priced(mut x: Measured, cost_micros: i64) -> Measured {
    x.cost_micros = cost_micros;
    x.currency = Some("USD".into());
    x
}

fn cur(order: &[&str], pinned: bool, changed: Option<OffsetDateTime>) -> Current {
    Current {
        providers: order.iter().map(|s| s.to_string()).collect(),
        pinned,
        changed_at: changed,
    }
}

fn names(c: &Option<Change>) -> Option<Vec<&str>> {
    c.as_ref()
        .map(|c| c.providers.iter().map(String::as_str).collect())
}

/// The decision table: (case, configured, current order, pinned, last
/// change, measurements, expected new order or None).
#[test]
fn the_order_follows_the_table() {
    let ab = ["a", "b"];
    let abc = ["a", "b", "c"];
    let long_ago = Some(NOW - Duration::from_secs(3600));
    let recent = Some(NOW - Duration::from_secs(60));
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        &[&str],
        &[&str],
        bool,
        Option<OffsetDateTime>,
        Vec<Measured>,
        Option<Vec<&str>>,
    )> = vec![
        (
            "all good: no change",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 2, 95, 5), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "a slow (20% >= 15%): a moves down",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 20, 95, 5), m("b", 100, 1, 96, 4)],
            Some(vec!["b", "a"]),
        ),
        (
            "a slow, b never measured: a moves down all the same",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 30, 70, 0)],
            Some(vec!["b", "a"]),
        ),
        (
            "a slow at 14%: stays",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 14, 95, 5), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "a slow but too few samples (49): unmeasured, stays",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 49, 40, 9, 0), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "a delivers 50%, b 95%: a moves down",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 0, 50, 50), m("b", 100, 0, 95, 5)],
            Some(vec!["b", "a"]),
        ),
        (
            "a delivers 88%, b 95%: within the gap, stays",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 0, 88, 12), m("b", 100, 0, 95, 5)],
            None,
        ),
        (
            "a delivers 50% with no other measured: not 'below the others'",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 0, 50, 50)],
            None,
        ),
        (
            "a's codes entered 40%, b's 80%: a moves down",
            &ab,
            &ab,
            false,
            None,
            vec![
                codes(m("a", 100, 0, 95, 5), 100, 40),
                codes(m("b", 100, 0, 95, 5), 100, 80),
            ],
            Some(vec!["b", "a"]),
        ),
        (
            "within the cooldown: no change",
            &ab,
            &ab,
            false,
            recent,
            vec![m("a", 100, 20, 95, 5), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "after the cooldown: the change",
            &ab,
            &ab,
            false,
            long_ago,
            vec![m("a", 100, 20, 95, 5), m("b", 100, 1, 96, 4)],
            Some(vec!["b", "a"]),
        ),
        (
            "pinned: no change whatever the quality",
            &ab,
            &ab,
            true,
            None,
            vec![m("a", 100, 90, 10, 90), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "one provider: nothing to shift",
            &["a"],
            &["a"],
            false,
            None,
            vec![m("a", 100, 90, 10, 90)],
            None,
        ),
        (
            "a recovered (5% slow < 10%): back in its place",
            &ab,
            &["b", "a"],
            false,
            long_ago,
            vec![m("a", 100, 5, 95, 5), m("b", 100, 1, 96, 4)],
            Some(vec!["a", "b"]),
        ),
        (
            "a demoted at 12% slow: the stricter bar keeps it down",
            &ab,
            &["b", "a"],
            false,
            long_ago,
            vec![m("a", 100, 12, 95, 5), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "a demoted, too few samples to say: stays down",
            &ab,
            &["b", "a"],
            false,
            long_ago,
            vec![m("a", 10, 0, 10, 0), m("b", 100, 1, 96, 4)],
            None,
        ),
        (
            "both slow: the configured order",
            &ab,
            &["b", "a"],
            false,
            long_ago,
            vec![m("a", 100, 50, 50, 0), m("b", 100, 60, 40, 0)],
            Some(vec!["a", "b"]),
        ),
        (
            "both slow, already configured: no change",
            &ab,
            &ab,
            false,
            None,
            vec![m("a", 100, 50, 50, 0), m("b", 100, 60, 40, 0)],
            None,
        ),
        (
            "three: b slow goes last, a and c keep their order",
            &abc,
            &abc,
            false,
            None,
            vec![
                m("a", 100, 0, 95, 5),
                m("b", 100, 40, 60, 0),
                m("c", 100, 0, 95, 5),
            ],
            Some(vec!["a", "c", "b"]),
        ),
        (
            "three: a and b bad, c first",
            &abc,
            &abc,
            false,
            None,
            vec![
                m("a", 100, 30, 70, 0),
                m("b", 100, 40, 60, 0),
                m("c", 100, 0, 95, 5),
            ],
            Some(vec!["c", "a", "b"]),
        ),
        (
            "a stored order naming a provider the route dropped: ignored",
            &ab,
            &["x", "b", "a"],
            false,
            long_ago,
            vec![m("a", 100, 5, 95, 5), m("b", 100, 1, 96, 4)],
            Some(vec!["a", "b"]),
        ),
    ];
    for (case, configured, current, pinned, changed, measured, want) in cases {
        let c = decide(
            configured,
            &cur(current, pinned, changed),
            &measured,
            &t(),
            NOW,
        );
        assert_eq!(names(&c), want, "{case}: {c:?}");
    }
}

#[test]
fn every_change_says_why() {
    let c = decide(
        &["a", "b"],
        &cur(&["a", "b"], false, None),
        &[m("a", 100, 20, 80, 0), m("b", 100, 0, 95, 5)],
        &t(),
        NOW,
    )
    .expect("a change");
    assert_eq!(
        c.reason,
        "a moved down: 20% of its 100 messages had no delivery report 5m after they were sent (at most 15% allowed)"
    );
    let c = decide(
        &["a", "b"],
        &cur(&["a", "b"], false, None),
        &[m("a", 100, 0, 50, 50), m("b", 100, 0, 95, 5)],
        &t(),
        NOW,
    )
    .expect("a change");
    assert_eq!(
        c.reason,
        "a moved down: it delivered 50% of 100 reported messages, b 95%"
    );
    let c = decide(
        &["a", "b"],
        &cur(&["b", "a"], false, None),
        &[m("a", 100, 0, 95, 5), m("b", 100, 0, 95, 5)],
        &t(),
        NOW,
    )
    .expect("a change");
    assert_eq!(c.reason, "a measures well again: back in its place");
}

#[test]
fn prefer_cheaper_puts_the_cheaper_of_two_equals_first() {
    let tc = Thresholds {
        prefer_cheaper: Some(0.02),
        ..t()
    };
    // b delivers 95% at 0.02 per delivered message, a 96% at 0.05.
    let a = priced(m("a", 100, 0, 96, 4), 96 * 50_000);
    let b = priced(m("b", 100, 0, 95, 5), 95 * 20_000);
    let c = decide(
        &["a", "b"],
        &cur(&["a", "b"], false, None),
        &[a.clone(), b.clone()],
        &tc,
        NOW,
    );
    assert_eq!(names(&c), Some(vec!["b", "a"]), "{c:?}");
    assert_eq!(
        c.expect("change").reason,
        "cheaper at the same quality first"
    );
    // Off by default: quality alone orders.
    assert_eq!(
        decide(
            &["a", "b"],
            &cur(&["a", "b"], false, None),
            &[a.clone(), b.clone()],
            &t(),
            NOW
        ),
        None
    );
    // Outside the margin (b 90%): quality first.
    let b90 = priced(m("b", 100, 0, 90, 10), 90 * 20_000);
    assert_eq!(
        decide(
            &["a", "b"],
            &cur(&["a", "b"], false, None),
            &[a, b90],
            &tc,
            NOW
        ),
        None
    );
    // Unpriced: nothing to compare.
    let c = decide(
        &["a", "b"],
        &cur(&["a", "b"], false, None),
        &[m("a", 100, 0, 96, 4), m("b", 100, 0, 95, 5)],
        &tc,
        NOW,
    );
    assert_eq!(c, None);
}

#[test]
fn percentiles_are_read_from_the_buckets() {
    let mut x = m("a", 10, 0, 10, 0);
    // 5 within 1 s, 4 more within 10 s, 1 more within 300 s.
    x.within = [5, 5, 5, 9, 9, 9, 9, 9, 10, 10, 10];
    assert_eq!(x.delivery_seconds(0.5), Some(1));
    assert_eq!(x.delivery_seconds(0.9), Some(10));
    assert_eq!(x.delivery_seconds(0.95), Some(300));
    // One delivered after the last bucket: past it.
    x.within = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    assert_eq!(x.delivery_seconds(0.99), None);
    assert_eq!(Measured::default().delivery_seconds(0.5), None);
    assert_eq!(Measured::default().delivery_rate(), None);
}

#[test]
fn effective_orders_only_the_configured_providers() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(effective(&["a", "b"], None), s(&["a", "b"]));
    assert_eq!(
        effective(&["a", "b"], Some(&s(&["b", "a"]))),
        s(&["b", "a"])
    );
    // A provider added to the route since: after the stored ones.
    assert_eq!(
        effective(&["a", "b", "c"], Some(&s(&["b", "a"]))),
        s(&["b", "a", "c"])
    );
    // One removed: gone.
    assert_eq!(effective(&["a"], Some(&s(&["b", "a"]))), s(&["a"]));
}

#[test]
fn the_floor_keeps_every_other_provider_measured() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let order = s(&["b", "a"]);
    let mut firsts = std::collections::HashMap::new();
    for n in 0..2000 {
        let o = first_for(&order, n, 0.05);
        assert_eq!(o.len(), 2);
        *firsts.entry(o[0].clone()).or_insert(0) += 1;
    }
    // One in 20 starts on a, the rest on b.
    assert_eq!(firsts["a"], 100);
    assert_eq!(firsts["b"], 1900);
    // The first 19 messages all take the order as it is.
    for n in 0..19 {
        assert_eq!(first_for(&order, n, 0.05), order);
    }
    assert_eq!(first_for(&order, 19, 0.05), s(&["a", "b"]));
    // Three providers: b and c each one in 20, failing over in order.
    let order = s(&["a", "b", "c"]);
    assert_eq!(first_for(&order, 19, 0.05), s(&["b", "a", "c"]));
    assert_eq!(first_for(&order, 18, 0.05), s(&["c", "a", "b"]));
    assert_eq!(first_for(&order, 17, 0.05), order);
    // No floor, or one provider: the order as it is.
    assert_eq!(first_for(&order, 19, 0.0), order);
    assert_eq!(first_for(&s(&["a"]), 19, 0.05), s(&["a"]));
}
