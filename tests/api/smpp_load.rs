//! Two service instances, each with `SMPP_BINDS=2`, sharing one database,
//! under load against the npm `smpp` SMSC (`npm_smsc.rs`): every message
//! exactly once at the SMSC (which does not de-duplicate), four binds,
//! `SMPP_WINDOW` and `SMPP_RATE` held, both measured at the SMSC.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;
use crate::npm_smsc::{NpmSmsc, Start, available};
use crate::smpp_npm::smpp_at;

/// `n` messages posted at once, alternately to two instances of
/// `binds=2`, `window`, `rate`; the SMSC answers each after `delay_ms`.
/// Returns the SMSC once every message is `sent`.
async fn load(backend: Backend, n: usize, window: usize, rate: u32, delay_ms: u64) -> NpmSmsc {
    let mut smsc = NpmSmsc::start(Start::default()).await;
    smsc.config(json!({"delay_ms": delay_ms})).await;
    let port = smsc.port;
    let adjust = move |s: &mut sendonce::provider::smpp::SmppSettings| {
        s.binds = 2;
        s.window = window;
        s.rate = rate;
    };
    let mut settings = test_settings();
    settings.delivery.retry.max_attempts = 50;
    let a = spawn_with(TestOptions {
        backend,
        settings: settings.clone(),
        provider: Some(smpp_at(port, adjust)),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        backend,
        settings,
        database: Some(a.database.clone()),
        api_key: Some(a.api_key.clone()),
        provider: Some(smpp_at(port, adjust)),
        ..TestOptions::default()
    })
    .await;
    smsc.wait(Duration::from_secs(10), "4 binds", |ev| {
        (ev.iter()
            .filter(|e| e["event"] == "bind" && e["ok"] == true)
            .count()
            == 4)
            .then_some(())
    })
    .await;
    let apps = [Arc::new(a), Arc::new(b)];
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..n {
        let app = Arc::clone(&apps[i % 2]);
        posts.spawn(async move {
            let key = format!("LOAD-{i}");
            let a = app
                .post(&key, &sms("+14155550110", &format!("load {i}")))
                .await;
            assert!(a.status == 201 || a.status == 202, "{key}: {}", a.status);
        });
    }
    while let Some(r) = posts.join_next().await {
        r.expect("a post");
    }
    within(Duration::from_secs(120), "every message sent", || {
        let app = Arc::clone(&apps[0]);
        async move {
            let n_sent = app
                .db
                .count("SELECT count(*) FROM messages WHERE status = 'sent'")
                .await;
            (n_sent as usize == n).then_some(())
        }
    })
    .await;
    for i in 0..n {
        assert_eq!(
            smsc.created("+14155550110", &format!("load {i}")),
            1,
            "load {i} at the SMSC"
        );
    }
    assert_eq!(smsc.submits().len(), n, "no submit twice, none refused");
    let binds = smsc.binds();
    assert_eq!(binds.len(), 4, "2 instances x SMPP_BINDS=2: {binds:?}");
    smsc
}

/// Per session, the most submits the SMSC held unanswered.
fn max_outstanding(submits: &[Value]) -> Vec<u64> {
    let mut by_session = std::collections::BTreeMap::<u64, u64>::new();
    for s in submits {
        let e = by_session
            .entry(s["session"].as_u64().unwrap_or(0))
            .or_default();
        *e = (*e).max(s["outstanding"].as_u64().unwrap_or(0));
    }
    by_session.into_values().collect()
}

/// The SMSC answers slowly (150 ms) and the rate is no limit: each session
/// fills its window of 3 and never goes past it.
async fn two_instances_hold_the_window(backend: Backend) {
    if !available("the smpp load tests") {
        return;
    }
    let smsc = load(backend, 120, 3, 1000, 150).await;
    let max = max_outstanding(&smsc.submits());
    eprintln!("smpp window: most outstanding per session {max:?}");
    assert_eq!(max.len(), 4, "4 sessions submitted: {max:?}");
    assert!(
        max.iter().all(|m| *m <= 3),
        "SMPP_WINDOW=3 exceeded: {max:?}"
    );
    assert!(max.contains(&3), "the window was never filled: {max:?}");
}

/// SMPP_RATE=20 per instance, two instances: at most 40 submits in any
/// second at the SMSC (wall clock there, a measurement only), with a
/// tolerance of 10% + 2 for scheduling and the two instances' paces
/// starting apart; and the whole run not faster than the rate allows.
async fn two_instances_hold_the_rate(backend: Backend) {
    if !available("the smpp load tests") {
        return;
    }
    let n = 200;
    let smsc = load(backend, n, 10, 20, 0).await;
    let mut at: Vec<i64> = smsc
        .submits()
        .iter()
        .map(|s| s["at_ms"].as_i64().unwrap_or(0))
        .collect();
    at.sort_unstable();
    let most_in_a_second = (0..at.len())
        .map(|i| at[i..].iter().take_while(|t| **t < at[i] + 1000).count())
        .max()
        .unwrap_or(0);
    assert!(
        most_in_a_second <= 46,
        "{most_in_a_second} submits in one second (limit 40 + 10% + 2)"
    );
    let span_ms = at[at.len() - 1] - at[0];
    eprintln!("smpp rate: {n} submits in {span_ms} ms, at most {most_in_a_second} in one second");
    // 200 at 40/s: 199 steps of 25 ms at best.
    assert!(
        span_ms >= 199 * 25 * 9 / 10,
        "200 submits in {span_ms} ms: faster than 40/s"
    );
}

on_both_backends!(two_instances_hold_the_window, two_instances_hold_the_rate);
