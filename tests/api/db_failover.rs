//! A multi-host `DATABASE_URL`: the pool keeps only connections to a
//! writable server, and follows when the one it uses goes away. The "first
//! host" is a TCP proxy in front of the test Postgres that the test cuts (a
//! primary that is gone), or a connection made read-only (a standby).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sendonce::store::postgres::PoolSettings;
use sendonce::store::postgres::connect::Targets;
use sendonce::store::{MaintenanceStore, PgStore, StoreError};
use sqlx::postgres::PgConnectOptions;
use testkit::mock_provider::Behaviour;
use tokio::sync::Notify;

use crate::helpers::*;
use crate::outage::{Proxy, upstream};

/// `database` with its host replaced by the list `hosts` and
/// `target_session_attrs=read-write`.
fn multi_host(database: &str, hosts: &[String]) -> String {
    let url = reqwest::Url::parse(database).unwrap();
    format!(
        "postgres://{}@{}{}?target_session_attrs=read-write",
        url.username(),
        hosts.join(","),
        url.path()
    )
}

async fn ready_host(app: &TestApp) -> Option<String> {
    let a = answer(
        app.request(reqwest::Method::GET, "/readyz")
            .send()
            .await
            .unwrap(),
    )
    .await;
    (a.status == 200).then(|| {
        let j = a.json();
        assert_eq!(j["database"]["role"], "primary", "{j}");
        j["database"]["host"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    })
}

async fn metric(app: &TestApp, name: &str) -> f64 {
    let a = answer(
        app.request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let text = String::from_utf8(a.bytes).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[tokio::test]
async fn the_pool_follows_when_the_primary_goes_away() {
    let database = fresh_database().await;
    let first = Proxy::start(upstream()).await;
    let second = upstream();
    let url = multi_host(&database, &[first.addr.to_string(), second.to_string()]);
    let mut settings = test_settings();
    settings.delivery.lease = Duration::from_secs(30);
    let app = spawn_with(TestOptions {
        database: Some(url),
        settings,
        db_acquire_timeout: Some(Duration::from_millis(300)),
        ..TestOptions::default()
    })
    .await;

    assert_eq!(
        app.post("BEFORE", &sms("+14155550100", "hi")).await.status,
        201
    );
    assert_eq!(ready_host(&app).await, Some(first.addr.to_string()));
    assert_eq!(metric(&app, "sendonce_db_host_switches_total").await, 0.0);
    // One send is in flight when the primary goes away.
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let inflight = app
        .post_with(
            Some("DURING"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(inflight.status, 202);
    eventually("the provider call", || async {
        (app.mock.call_count() == 2).then_some(())
    })
    .await;

    first.cut();
    let switched = Instant::now();
    gate.notify_one();
    eventually("a new send to succeed on the other host", || async {
        let a = app.post("AFTER", &sms("+14155550100", "hi")).await;
        (a.status == 201).then_some(())
    })
    .await;
    let took = switched.elapsed();
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(ready_host(&app).await, Some(second.to_string()));
    assert_eq!(metric(&app, "sendonce_db_host_switches_total").await, 1.0);
    assert!(metric(&app, "sendonce_db_connections_opened_total").await >= 2.0);
    let during = app.wait_for_status("DURING", "sent").await;
    assert_eq!(during["attempts"], 1);
    assert_eq!(app.mock.stats().max_deliveries_per_key, 1);
}

fn settings() -> PoolSettings {
    PoolSettings {
        max_connections: 4,
        acquire_timeout: Duration::from_millis(500),
    }
}

fn read_only(o: PgConnectOptions) -> PgConnectOptions {
    o.options([("default_transaction_read_only", "on")])
}

#[tokio::test]
async fn a_read_only_server_is_skipped_and_never_written_to() {
    let database = fresh_database().await;
    let proxy = Proxy::start(upstream()).await;
    let direct: PgConnectOptions = database.parse().unwrap();
    let standby = read_only(direct.clone().host("127.0.0.1").port(proxy.addr.port()));
    let store = PgStore::connect_lazy_to(
        Targets {
            hosts: vec![standby, direct.clone()],
            writable_only: true,
        },
        &settings(),
    );
    let status = eventually("the writable host to be chosen", || async {
        store.status().await.ok()
    })
    .await;
    assert_eq!(
        status.host.as_deref(),
        Some(format!("{}:{}", direct.get_host(), direct.get_port()).as_str())
    );
    assert_eq!(store.connection_stats().host_switches, 1);
    // Every connection the pool hands out accepts writes.
    for _ in 0..4 {
        let ro: String = sqlx::query_scalar("SHOW transaction_read_only")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(ro, "off");
    }
}

#[tokio::test]
async fn a_single_read_only_server_is_unavailable_not_written_to() {
    let database = fresh_database().await;
    let direct: PgConnectOptions = database.parse().unwrap();
    // With target_session_attrs the pool refuses the connection.
    let strict = PgStore::connect_lazy_to(
        Targets {
            hosts: vec![read_only(direct.clone())],
            writable_only: true,
        },
        &settings(),
    );
    assert!(matches!(
        strict.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    // Without it the server refuses the write, which the service treats as
    // an outage (retry while the lease lasts), not as a bug.
    let lax = PgStore::connect_lazy_to(
        Targets {
            hosts: vec![read_only(direct)],
            writable_only: false,
        },
        &settings(),
    );
    let write = sqlx::query("CREATE TABLE never (x int)")
        .execute(lax.pool())
        .await
        .map_err(StoreError::from_sqlx);
    assert!(
        matches!(write, Err(StoreError::Unavailable(_))),
        "{write:?}"
    );
}

#[tokio::test]
async fn without_target_session_attrs_a_host_that_answers_will_do() {
    let database = fresh_database().await;
    let gone = Proxy::start(upstream()).await;
    gone.cut();
    let direct: PgConnectOptions = database.parse().unwrap();
    let first = direct.clone().host("127.0.0.1").port(gone.addr.port());
    let store = PgStore::connect_lazy_to(
        Targets {
            hosts: vec![first, direct.clone()],
            writable_only: false,
        },
        &settings(),
    );
    let status = eventually("a host that answers", || async {
        store.status().await.ok()
    })
    .await;
    assert_eq!(
        status.host.as_deref(),
        Some(format!("{}:{}", direct.get_host(), direct.get_port()).as_str())
    );
    assert_eq!(store.connection_stats().host_switches, 1);
}
