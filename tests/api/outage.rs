//! Postgres outages: requests fail fast with 503, nothing acknowledged is
//! lost, and the service recovers without a restart. The outage is real: the
//! instance reaches Postgres through a TCP proxy that the test cuts, which
//! breaks every open connection and refuses new ones.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use testkit::mock_provider::Behaviour;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::helpers::*;

pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    down: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<JoinSet<()>>>,
}

impl Proxy {
    pub(crate) async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let (d, c) = (down.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                c.lock().unwrap().spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Proxy { addr, down, conns }
    }

    /// Breaks every connection and refuses new ones.
    pub(crate) fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.conns.lock().unwrap().abort_all();
    }

    fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

pub(crate) fn upstream() -> SocketAddr {
    let url = reqwest::Url::parse(&admin_url()).unwrap();
    let host = url.host_str().unwrap_or("127.0.0.1");
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{}", url.port().unwrap_or(5432))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn requests_fail_fast_while_the_database_is_down_and_recover_after() {
    let database = fresh_database().await;
    let proxy = Proxy::start(upstream()).await;
    let mut via_proxy = reqwest::Url::parse(&database).unwrap();
    via_proxy.set_ip_host(proxy.addr.ip()).unwrap();
    via_proxy.set_port(Some(proxy.addr.port())).unwrap();
    let direct = store_for(&database);
    let mut settings = test_settings();
    settings.delivery.lease = Duration::from_secs(30);
    let app = spawn_with(TestOptions {
        database: Some(via_proxy.to_string()),
        settings,
        db_acquire_timeout: Some(Duration::from_millis(300)),
        ..TestOptions::default()
    })
    .await;

    assert_eq!(
        app.post("BEFORE", &sms("+14155550100", "hi")).await.status,
        201
    );
    // One send is in flight when the database goes away.
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let inflight = app
        .post_with(
            Some("DURING"),
            &sms("+14155550100", "hi"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(inflight.status, 202, "acknowledged: it must not be lost");
    eventually("the provider call", || async {
        (app.mock.call_count() == 2).then_some(())
    })
    .await;

    proxy.cut();
    let started = std::time::Instant::now();
    let refused = app.post("OUTAGE", &sms("+14155550100", "hi")).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.slug(), "unavailable");
    assert_eq!(refused.header("retry-after"), Some("1"));
    let ready = answer(
        app.request(reqwest::Method::GET, "/readyz")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(ready.status, 503);
    assert_eq!(app.get("/messages/BEFORE").await.status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answers came back while the database was still down"
    );
    // The provider accepts the in-flight send while the database is down:
    // the delivery task keeps the answer and retries the write.
    gate.notify_one();
    eventually("the provider to accept", || async {
        (app.mock.stats().deliveries == 2).then_some(())
    })
    .await;

    proxy.restore();
    let during = app.wait_for_status("DURING", "sent").await;
    assert_eq!(
        during["attempts"], 1,
        "the stored answer is the provider's first one"
    );
    assert_eq!(app.get("/messages/BEFORE").await.json()["status"], "sent");
    let after = eventually("a new send to succeed", || async {
        let a = app.post("AFTER", &sms("+14155550100", "hi")).await;
        (a.status == 201).then_some(a)
    })
    .await;
    assert_eq!(after.json()["status"], "sent");
    // Nothing was stored for the refused request.
    let refused_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE idempotency_key = 'OUTAGE'")
            .fetch_one(direct.pool())
            .await
            .unwrap();
    assert_eq!(refused_rows, 0);
    assert_eq!(app.mock.stats().max_deliveries_per_key, 1);
}
