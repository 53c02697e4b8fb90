//! Issue 29, the rest of the review's findings: sign-in failures counted per
//! client address (6), the console session's absolute lifetime and its
//! `__Host-` cookie (11), the endpoint cap under concurrent creates (8), the SSRF filter's
//! translated ranges, ports and refusal texts (9), webhook fairness between
//! tenants (5), what the API's listener tells strangers (14). Every test runs on both backends.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::redirect::Policy;
use sendonce::clock::Clock;
use sendonce::console::{IDLE_TIMEOUT, SESSION_COOKIE, decide};

use crate::helpers::*;

/// A console client connecting from `from` (any 127/8 address reaches the
/// test server), keeping its cookies.
struct Client {
    base: String,
    http: reqwest::Client,
    cookies: Vec<(String, String)>,
}

impl Client {
    fn from(app: &TestApp, from: &str) -> Self {
        let ip: IpAddr = from.parse().expect("an address");
        Client {
            base: app.base.clone(),
            http: reqwest::Client::builder()
                .redirect(Policy::none())
                .local_address(ip)
                .build()
                .expect("client"),
            cookies: Vec::new(),
        }
    }

    fn keep(&mut self, a: &Answer) {
        for v in a.headers.get_all("set-cookie") {
            let v = v.to_str().expect("cookie");
            let (name, value) = v.split(';').next().unwrap_or("").split_once('=').unwrap();
            self.cookies.retain(|(n, _)| n != name);
            if !value.is_empty() && !v.contains("Max-Age=0") {
                self.cookies.push((name.to_string(), value.to_string()));
            }
        }
    }

    fn cookie(&self) -> String {
        let pairs: Vec<_> = self
            .cookies
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        pairs.join("; ")
    }

    async fn get(&mut self, path: &str) -> Answer {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", self.cookie())
            .send()
            .await
            .expect("GET");
        let a = answer(resp).await;
        self.keep(&a);
        a
    }

    async fn sign_in(&mut self, key: &str) -> Answer {
        let page = self.get("/console/login").await;
        assert_eq!(page.status, 200);
        let text = String::from_utf8(page.bytes.clone()).unwrap();
        let at = text.find(r#"name="csrf" value=""#).expect("a CSRF field") + 19;
        let token = text[at..].split('"').next().unwrap().to_string();
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs([("csrf", token.as_str()), ("api_key", key)])
            .finish();
        let resp = self
            .http
            .post(format!("{}/console/login", self.base))
            .header("cookie", self.cookie())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .expect("POST");
        let a = answer(resp).await;
        self.keep(&a);
        a
    }
}

const WRONG: &str = "so_wrong-key-000000000000000000";

/// Finding 6: one instance-wide counter let ten wrong sign-ins from anyone
/// lock every tenant out. Failures now count per client address: the
/// attacker waits, everyone else signs in, with a right key or a wrong one.
async fn one_clients_failed_sign_ins_lock_out_no_one_else(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    let mut attacker = Client::from(&app, "127.0.0.1");
    for _ in 0..decide::SIGNIN_FAILURES {
        assert_eq!(attacker.sign_in(WRONG).await.status, 401);
    }
    assert_eq!(attacker.sign_in(WRONG).await.status, 429);

    let mut user = Client::from(&app, "127.0.0.2");
    let ok = user.sign_in(&app.api_key).await;
    assert_eq!(ok.status, 303, "another address signs in at once");
    assert_eq!(user.get("/console/overview").await.status, 200);
    let mut typo = Client::from(&app, "127.0.0.3");
    assert_eq!(typo.sign_in(WRONG).await.status, 401, "not 429");

    // The attacker's own address still waits, even with the right key.
    assert_eq!(attacker.sign_in(&app.api_key).await.status, 429);
    clock.advance(decide::SIGNIN_WINDOW + Duration::from_secs(1));
    assert_eq!(attacker.sign_in(&app.api_key).await.status, 303);
}

/// Finding 8: the 20-endpoint cap was a count, then an insert: concurrent
/// creates reached 27 on Postgres and 23 on SQLite. Now the count and the
/// insert are one transaction under the tenant's row lock.
async fn concurrent_creates_never_pass_the_endpoint_cap(backend: Backend) {
    let mut settings = test_settings();
    settings.webhooks.allow_private = true;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let cap = sendonce::http::webhooks::MAX_ENDPOINTS as usize;
    let tries = 3 * cap;
    let answers = crate::delivery::futures_join_all((0..tries).map(|i| {
        let req = app
            .request(reqwest::Method::POST, "/webhook-endpoints")
            .bearer_auth(&app.api_key)
            .json(&serde_json::json!({ "url": format!("http://127.0.0.1:9/hook/{i}") }));
        async move { answer(req.send().await.expect("POST")).await }
    }))
    .await;
    let created = answers.iter().filter(|a| a.status == 201).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.status == 400).collect();
    assert_eq!(
        created,
        cap,
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), tries - cap);
    let why = String::from_utf8_lossy(&refused[0].bytes).to_string();
    assert!(why.contains("the most allowed"), "{why}");
    assert_eq!(
        app.db.count("SELECT count(*) FROM webhook_endpoints").await,
        cap as i64
    );
}

/// Finding 9: NAT64 and IPv4-translated addresses, any port, and a refusal
/// that named the inside address a name resolved to. Every refusal is a
/// 400 on `url` and creates nothing.
async fn webhook_urls_inside_translated_or_on_internal_ports_are_refused(backend: Backend) {
    let app = spawn_app_on(backend).await;
    for (url, says) in [
        ("https://[64:ff9b:1::a9fe:a9fe]/hook", "metadata address"),
        ("https://[64:ff9b::808:808]/hook", "metadata address"),
        ("https://[::ffff:0:a9fe:a9fe]/hook", "metadata address"),
        ("https://localhost/hook", "must not resolve to"),
        ("https://example.com:22/hook", "port 443"),
        ("https://example.com:6379/hook", "port 443"),
    ] {
        let req = app
            .request(reqwest::Method::POST, "/webhook-endpoints")
            .bearer_auth(&app.api_key)
            .json(&serde_json::json!({ "url": url }));
        let a = answer(req.send().await.expect("POST")).await;
        assert_eq!(a.status, 400, "{url}");
        let text = String::from_utf8_lossy(&a.bytes).to_string();
        assert!(text.contains(says), "{url}: {text}");
        if url.contains("localhost") {
            assert!(
                !text.contains("127.0.0.1") && !text.contains("::1"),
                "{text}"
            );
        }
    }
    assert_eq!(
        app.db.count("SELECT count(*) FROM webhook_endpoints").await,
        0
    );
}

/// Accepts connections and never answers: a webhook receiver that hangs.
struct Hang {
    url: String,
    accepted: Arc<AtomicUsize>,
}

impl Hang {
    async fn start() -> Hang {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Hang { url, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A receiver that answers 200 at once; counts what it got.
async fn quick_receiver() -> (Arc<AtomicUsize>, String) {
    let hits = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let count = Arc::clone(&count);
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (hits, url)
}

async fn create_endpoint(app: &TestApp, key: &str, url: &str) {
    let req = app
        .request(reqwest::Method::POST, "/webhook-endpoints")
        .bearer_auth(key)
        .json(&serde_json::json!({ "url": url }));
    let a = answer(req.send().await.expect("POST")).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
}

/// Finding 5: the dispatcher waited for all 32 claimed deliveries before
/// claiming more, so 20 endpoints of one tenant that never answer took
/// another tenant's webhook from 0.3 s to 100 s. Now the hung tenant holds
/// at most its in-flight cap and the other tenant's webhook goes out at the
/// next poll.
async fn a_tenants_hung_endpoints_never_delay_another_tenants_webhook(backend: Backend) {
    let mut settings = test_settings();
    settings.webhooks.allow_private = true;
    settings.webhooks.poll_interval = Duration::from_millis(50);
    settings.webhooks.connect_timeout = Duration::from_secs(1);
    // Hung attempts outlast the whole test.
    settings.webhooks.timeout = Duration::from_secs(30);
    let per_tenant = settings.webhooks.per_tenant as usize;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let hang = Hang::start().await;
    for i in 0..20 {
        create_endpoint(&app, &app.api_key, &format!("{}/hook/{i}", hang.url)).await;
    }
    for i in 0..3 {
        let a = app
            .post(&format!("A-{i}"), &sms("+14155550100", "hello"))
            .await;
        assert_eq!(a.status, 201);
    }
    // 60 deliveries due; the first are hanging.
    eventually("the hung tenant's deliveries in flight", || async {
        (hang.accepted() >= per_tenant).then_some(())
    })
    .await;

    let key = sendonce::apikey::generate();
    app.handle
        .store
        .create_tenant("patient", &key.stored)
        .await
        .expect("tenant");
    let (hits, url) = quick_receiver().await;
    create_endpoint(&app, &key.secret, &url).await;
    let sent = app
        .request(reqwest::Method::POST, "/messages")
        .bearer_auth(&key.secret)
        .header("Idempotency-Key", "B-1")
        .json(&sms("+14155550101", "hello"));
    let sent = answer(sent.send().await.expect("POST")).await;
    assert_eq!(sent.status, 201);
    within(
        Duration::from_secs(3),
        "the other tenant's webhook",
        || async { (hits.load(Ordering::SeqCst) >= 1).then_some(()) },
    )
    .await;
    // The hung tenant holds its own slots, no more.
    assert!(
        hang.accepted() <= per_tenant,
        "{} deliveries of one tenant in flight",
        hang.accepted()
    );
}

/// Finding 14: with a metrics listener of its own, the API's `/readyz`
/// says only ok (the database's host and role, and the providers, are on
/// the metrics listener), and the service names the demo's public key and
/// secret at start.
async fn the_api_listener_tells_strangers_only_ok(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        separate_metrics: true,
        ..TestOptions::default()
    })
    .await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json(), serde_json::json!({"status": "ok"}));
    let addr = app.handle.metrics_addr.expect("metrics listener");
    let inside = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .expect("GET");
    assert_eq!(inside.status(), 200);
    let inside: serde_json::Value = inside.json().await.expect("JSON");
    assert!(inside["database"].is_object(), "{inside}");
    assert!(inside["providers"].is_array(), "{inside}");

    let mut demo = test_settings();
    demo.server.bootstrap_api_key = Some(sendonce::config::DEMO_BOOTSTRAP_KEY.into());
    demo.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        sendonce::config::DEMO_RECEIPT_SECRET,
    )])
    .expect("the demo secret is a valid secret");
    let said = demo.warnings().join("\n");
    for named in [
        "SENDONCE_BOOTSTRAP_API_KEY",
        "SENDONCE_RECEIPT_SECRET",
        "SENDONCE_METRICS_LISTEN",
    ] {
        assert!(said.contains(named), "{said}");
    }
}

/// The console's documented absolute lifetime.
const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// Finding 11: a session used every few minutes lived for ever, and its
/// cookie was `Secure` only behind an https public URL, with no `__Host-`
/// prefix (a sibling subdomain could plant one). Now a session ends
/// 12 hours after sign-in (docs/console.md) however busy, and the cookie is always
/// `__Host-`, `Secure`, `Path=/`.
async fn a_session_ends_at_its_lifetime_and_its_cookie_is_host_only(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    assert!(SESSION_COOKIE.starts_with("__Host-"), "{SESSION_COOKIE}");
    let mut c = Client::from(&app, "127.0.0.1");
    let login = c.get("/console/login").await;
    let ok = c.sign_in(&app.api_key).await;
    assert_eq!(ok.status, 303);
    for a in [&login, &ok] {
        for cookie in a.headers.get_all("set-cookie") {
            let cookie = cookie.to_str().unwrap();
            assert!(cookie.starts_with("__Host-"), "{cookie}");
            for flag in ["; Secure", "; Path=/;", "; HttpOnly", "; SameSite=Strict"] {
                assert!(cookie.contains(flag), "{cookie} has {flag}");
            }
            assert!(!cookie.contains("Domain"), "{cookie}");
        }
    }
    // Used well within the idle timeout, all day long.
    let step = IDLE_TIMEOUT - Duration::from_secs(60);
    let mut lived = Duration::ZERO;
    while lived + step < LIFETIME {
        clock.advance(step);
        lived += step;
        assert_eq!(c.get("/console/overview").await.status, 200, "at {lived:?}");
    }
    clock.advance(LIFETIME - lived);
    let a = c.get("/console/overview").await;
    assert_eq!(a.status, 303, "{lived:?} after sign-in the session is over");
    assert_eq!(a.header("location"), Some("/console/login"));
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0,
        "and deleted"
    );
}

on_both_backends!(
    one_clients_failed_sign_ins_lock_out_no_one_else,
    a_session_ends_at_its_lifetime_and_its_cookie_is_host_only,
    concurrent_creates_never_pass_the_endpoint_cap,
    webhook_urls_inside_translated_or_on_internal_ports_are_refused,
    a_tenants_hung_endpoints_never_delay_another_tenants_webhook,
    the_api_listener_tells_strangers_only_ok,
);
