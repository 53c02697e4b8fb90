//! The support console (issue 16): sign-in and its cookie, CSRF, tenant
//! isolation by URL, the search kinds, the timeline of a retried then
//! delivered message, opt-outs, revoked keys and idle sessions, and the
//! sign-in rate limit, and webhook deliveries on the timeline. Every test
//! runs on both backends.

use std::time::Duration;

use reqwest::redirect::Policy;
use sendonce::clock::Clock;
use sendonce::console::{CSP, IDLE_TIMEOUT, SESSION_COOKIE};
use serde_json::json;
use testkit::mock_provider::Behaviour;

use crate::helpers::*;

const SECRET: &str = "receipt-secret-0123456789";

/// A browser without a browser: keeps the console's cookies, never follows
/// redirects.
pub(crate) struct Browser {
    base: String,
    client: reqwest::Client,
    cookies: Vec<(String, String)>,
}

impl Browser {
    pub(crate) fn new(app: &TestApp) -> Self {
        Browser {
            base: app.base.clone(),
            client: reqwest::Client::builder()
                .redirect(Policy::none())
                .build()
                .expect("client"),
            cookies: Vec::new(),
        }
    }

    fn keep(&mut self, a: &Answer) {
        for v in a.headers.get_all("set-cookie") {
            let v = v.to_str().expect("cookie");
            let pair = v.split(';').next().unwrap_or("");
            let (name, value) = pair.split_once('=').expect("name=value");
            self.cookies.retain(|(n, _)| n != name);
            if !value.is_empty() && !v.contains("Max-Age=0") {
                self.cookies.push((name.to_string(), value.to_string()));
            }
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) async fn get(&mut self, path: &str) -> Answer {
        let a = answer(
            self.client
                .get(format!("{}{path}", self.base))
                .header("cookie", self.cookie_header())
                .send()
                .await
                .expect("GET"),
        )
        .await;
        self.keep(&a);
        a
    }

    pub(crate) async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Answer {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let a = answer(
            self.client
                .post(format!("{}{path}", self.base))
                .header("cookie", self.cookie_header())
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .expect("POST"),
        )
        .await;
        self.keep(&a);
        a
    }

    /// Signs in with `key`: the sign-in answer.
    pub(crate) async fn sign_in(&mut self, key: &str) -> Answer {
        let page = self.get("/console/login").await;
        assert_eq!(page.status, 200);
        let token = csrf(&page);
        self.post("/console/login", &[("csrf", &token), ("api_key", key)])
            .await
    }

    /// The CSRF token of a signed-in page.
    async fn csrf(&mut self) -> String {
        let page = self.get("/console/overview").await;
        assert_eq!(page.status, 200, "signed in");
        csrf(&page)
    }
}

fn text(a: &Answer) -> String {
    String::from_utf8(a.bytes.clone()).expect("UTF-8 page")
}

/// The value of the first hidden `csrf` field of a page.
fn csrf(a: &Answer) -> String {
    let page = text(a);
    let at = page.find(r#"name="csrf" value=""#).expect("a CSRF field") + 19;
    page[at..].split('"').next().expect("value").to_string()
}

fn location(a: &Answer) -> &str {
    a.header("location").expect("a Location")
}

async fn signs_in_with_a_safe_cookie_and_signs_out(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut b = Browser::new(&app);

    let home = b.get("/console").await;
    assert_eq!((home.status, location(&home)), (303, "/console/login"));
    let page = b.get("/console/login").await;
    assert_eq!(page.header("content-security-policy"), Some(CSP));
    assert!(
        page.header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    assert!(!text(&page).contains("<script"), "no script at all");
    let css = b.get("/console/console.css").await;
    assert_eq!(css.status, 200);
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));

    // A sign-in without the form's token is refused before the key is read.
    let a = b
        .post(
            "/console/login",
            &[("csrf", "forged"), ("api_key", &app.api_key)],
        )
        .await;
    assert_eq!(a.status, 403);
    assert!(a.header("set-cookie").is_none(), "no session");

    let wrong = b.sign_in("so_not-a-key-of-anyone-000000000").await;
    assert_eq!(wrong.status, 401);
    assert!(text(&wrong).contains("not accepted"));
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0
    );

    let ok = b.sign_in(&app.api_key).await;
    assert_eq!((ok.status, location(&ok)), (303, "/console/overview"));
    let cookie = ok
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with(&format!("{SESSION_COOKIE}=")))
        .expect("session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/;", "Secure"] {
        assert!(cookie.contains(flag), "{cookie} has {flag}");
    }
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        1
    );
    // Only the hash of the cookie's id is stored.
    let id = cookie.split(';').next().unwrap().split_once('=').unwrap().1;
    let stored = app
        .db
        .count("SELECT count(*) FROM console_sessions WHERE key_prefix LIKE 'so_%'")
        .await;
    assert_eq!(stored, 1);
    assert!(id.len() >= 43, "256 random bits");

    let overview = b.get("/console/overview").await;
    assert_eq!(overview.status, 200);
    assert!(text(&overview).contains("Overview"));

    // Sign out needs the token too.
    let a = b.post("/console/logout", &[]).await;
    assert_eq!(a.status, 403);
    assert_eq!(
        b.get("/console/overview").await.status,
        200,
        "still signed in"
    );
    let token = b.csrf().await;
    let out = b.post("/console/logout", &[("csrf", &token)]).await;
    assert_eq!((out.status, location(&out)), (303, "/console/login"));
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0
    );
    let after = b.get("/console/overview").await;
    assert_eq!((after.status, location(&after)), (303, "/console/login"));
}

async fn the_cookie_is_secure_behind_https(backend: Backend) {
    let mut settings = test_settings();
    settings.server.public_url = Some("https://sms.example.com".into());
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let mut b = Browser::new(&app);
    let ok = b.sign_in(&app.api_key).await;
    assert_eq!(ok.status, 303);
    let cookie = ok.header("set-cookie").expect("cookie");
    assert!(cookie.contains("; Secure"), "{cookie}");
}

async fn posts_without_the_csrf_token_are_refused_and_change_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let token = b.csrf().await;
    let count = || app.db.count("SELECT count(*) FROM opt_outs");

    for form in [
        vec![("number", "+14155550123")],
        vec![("number", "+14155550123"), ("csrf", "forged")],
        vec![("number", "+14155550123"), ("csrf", "")],
    ] {
        let a = b.post("/console/opt-outs", &form).await;
        assert_eq!(a.status, 403, "{form:?}");
        assert!(text(&a).contains("CSRF"));
    }
    assert_eq!(count().await, 0);

    // A form as JSON is no form.
    let a = answer(
        b.client
            .post(format!("{}/console/opt-outs", b.base))
            .header("cookie", b.cookie_header())
            .json(&json!({"csrf": token, "number": "+14155550123"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 415);
    // Bad input: a 400 page, nothing stored.
    let a = b
        .post(
            "/console/opt-outs",
            &[("csrf", &token), ("number", "not a number")],
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(a.header("content-type").unwrap().starts_with("text/html"));
    assert_eq!(count().await, 0);

    // With the token: added, and shown with who added it.
    let a = b
        .post(
            "/console/opt-outs",
            &[("csrf", &token), ("number", "+1 415 555 0123")],
        )
        .await;
    assert_eq!(a.status, 303);
    assert_eq!(count().await, 1);
    let page = b.get(location(&a).to_string().as_str()).await;
    let html = text(&page);
    assert!(html.contains("+14155550123") && html.contains("was added"));
    let prefix: String = app.api_key.chars().take(9).collect();
    assert!(
        html.contains(&format!("console, key {prefix}")),
        "who: {html}"
    );
    // The API sees it too (source `console`).
    let api = app.get("/opt-outs").await.json();
    assert_eq!(api["data"][0]["source"], "console");
    // And a send to it never reaches the provider.
    let sent = app
        .post("CONSOLE-OPTED-OUT", &sms("+14155550123", "hi"))
        .await;
    assert_eq!(sent.json()["status"], "failed");
    assert_eq!(app.mock.call_count(), 0);

    // Search by the beginning of the number.
    let found = b.get("/console/opt-outs?q=%2B1415").await;
    assert!(text(&found).contains("+14155550123"));
    let none = b.get("/console/opt-outs?q=%2B44").await;
    assert!(!text(&none).contains("+14155550123"));
    assert_eq!(b.get("/console/opt-outs?q=abc").await.status, 400);

    // Removal needs the token as well.
    let a = b
        .post("/console/opt-outs/remove", &[("number", "+14155550123")])
        .await;
    assert_eq!(a.status, 403);
    assert_eq!(count().await, 1);
    let a = b
        .post(
            "/console/opt-outs/remove",
            &[("csrf", &token), ("number", "+14155550123")],
        )
        .await;
    assert_eq!(
        (a.status, location(&a)),
        (303, "/console/opt-outs?done=removed")
    );
    assert_eq!(count().await, 0);

    // Without a session a POST is refused the same way.
    let mut stranger = Browser::new(&app);
    let a = stranger
        .post(
            "/console/opt-outs",
            &[("csrf", &token), ("number", "+14155550123")],
        )
        .await;
    assert_eq!(a.status, 403);
    assert_eq!(count().await, 0);
}

/// Sends `key` through one 503 and a retry, then reports it delivered.
async fn retried_then_delivered(app: &TestApp, key: &str, to: &str, body: &str) -> String {
    app.mock.push([
        Behaviour::Fail {
            status: 503,
            body: json!({"message": "busy", "code": "E503"}),
            retry_after: None,
        },
        Behaviour::Accept,
    ]);
    let first = app.post(key, &sms(to, body)).await;
    assert!(matches!(first.status, 201 | 202), "{}", first.status);
    let sent = app.wait_for_status(key, "sent").await;
    let pmid = sent["provider_message_id"]
        .as_str()
        .expect("provider id")
        .to_string();
    let receipt = json!({"id": pmid, "status": "delivered", "event_id": format!("ev-{key}")});
    let a = answer(
        app.client
            .post(format!("{}/providers/http/status", app.base))
            .header("X-Receipt-Secret", SECRET)
            .header("content-type", "application/json")
            .body(receipt.to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(a.status < 300, "receipt: {}", a.status);
    app.wait_for_status(key, "delivered").await;
    sent["id"].as_str().unwrap().to_string()
}

fn receipts_settings() -> sendonce::config::Settings {
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        SECRET,
    )])
    .unwrap();
    settings
}

async fn search_finds_every_kind_and_the_timeline_tells_the_story(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        settings: receipts_settings(),
        ..TestOptions::default()
    })
    .await;
    let id = retried_then_delivered(
        &app,
        "ORDER-92831-SMS",
        "+14155550100",
        "Your code is 481516",
    )
    .await;
    let pmid = app.get("/messages/ORDER-92831-SMS").await.json()["provider_message_id"]
        .as_str()
        .unwrap()
        .to_string();
    app.post(
        "ORDER-92832-SMS",
        &sms("+14155550100", "Order 92832 shipped"),
    )
    .await;
    app.wait_for_status("ORDER-92832-SMS", "sent").await;

    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let timeline = format!("/console/messages/{id}");
    // A key, a message id and a provider message id each lead to the timeline.
    for q in ["ORDER-92831-SMS", id.as_str(), pmid.as_str()] {
        let a = b.get(&format!("/console/search?q={}", enc(q))).await;
        assert_eq!((a.status, location(&a)), (303, timeline.as_str()), "{q}");
    }
    // A phone number lists its messages, newest first.
    let a = b.get("/console/search?q=%2B1%20415%20555%200100").await;
    assert_eq!(a.status, 200);
    let html = text(&a);
    let (newer, older) = (
        html.find("ORDER-92832-SMS").expect("newer"),
        html.find("ORDER-92831-SMS").expect("older"),
    );
    assert!(newer < older, "newest first");
    let nothing = b.get("/console/search?q=NO-SUCH-KEY").await;
    assert!(text(&nothing).contains("Nothing matched"));
    // Bad input is a 4xx page.
    let long = "K".repeat(300);
    assert_eq!(
        b.get(&format!("/console/search?q={long}")).await.status,
        400
    );
    assert_eq!(
        b.get("/console/search?q=%2B14155550100&before=garbage")
            .await
            .status,
        400
    );
    assert_eq!(b.get("/console/messages/msg_nothex").await.status, 404);

    let page = b.get(&timeline).await;
    assert_eq!(page.status, 200);
    let html = text(&page);
    for needle in [
        "Accepted",
        "Attempt 1 to http",
        "Attempt 2 to http",
        "503",
        "Retried: attempt 2 started at",
        "Receipt from http: delivered",
        "yes: it set the message",
        "Final status: sent",
        "the carrier reported it delivered at",
    ] {
        assert!(html.contains(needle), "timeline shows {needle:?}");
    }
    assert!(!html.contains("481516"), "the code is masked");
    assert!(html.contains("••••••"));
}

/// A second tenant on the same database gets 404s for the first's pages.
async fn one_tenant_never_sees_anothers_data(backend: Backend) {
    let a = spawn_with(TestOptions {
        backend,
        settings: receipts_settings(),
        ..TestOptions::default()
    })
    .await;
    let b_app = spawn_with(TestOptions {
        backend,
        database: Some(a.database.clone()),
        ..TestOptions::default()
    })
    .await;
    let id = retried_then_delivered(&a, "TENANT-A-1", "+14155550100", "hello").await;
    a.handle
        .store
        .add_opt_out(
            a.handle
                .store
                .tenant_for_key(&sendonce::apikey::hash(&a.api_key))
                .await
                .unwrap()
                .unwrap()
                .id,
            "+14155550177",
            "api",
            a.clock.now(),
        )
        .await
        .unwrap();

    let mut other = Browser::new(&b_app);
    assert_eq!(other.sign_in(&b_app.api_key).await.status, 303);
    let page = other.get(&format!("/console/messages/{id}")).await;
    assert_eq!(page.status, 404);
    assert!(!text(&page).contains("TENANT-A-1"));
    for q in ["TENANT-A-1", id.as_str(), "%2B14155550100"] {
        let s = other.get(&format!("/console/search?q={q}")).await;
        assert_eq!(s.status, 200, "{q}");
        let html = text(&s);
        assert!(
            html.contains("Nothing matched") || html.contains("No messages to this number"),
            "{q}"
        );
        assert!(!html.contains(&format!("/console/messages/{id}")), "{q}");
    }
    let list = other.get("/console/opt-outs").await;
    assert!(!text(&list).contains("+14155550177"));
    // Removing A's opt-out from B's session removes nothing.
    let token = other.csrf().await;
    let r = other
        .post(
            "/console/opt-outs/remove",
            &[("csrf", &token), ("number", "+14155550177")],
        )
        .await;
    assert_eq!(location(&r), "/console/opt-outs?done=absent");
    assert_eq!(a.db.count("SELECT count(*) FROM opt_outs").await, 1);
    // A's own session sees its message.
    let mut mine = Browser::new(&a);
    assert_eq!(mine.sign_in(&a.api_key).await.status, 303);
    assert_eq!(
        mine.get(&format!("/console/messages/{id}")).await.status,
        200
    );
}

async fn a_revoked_key_or_an_idle_session_ends_it(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    // Used within the idle timeout, the session lives on.
    clock.advance(IDLE_TIMEOUT - Duration::from_secs(60));
    assert_eq!(b.get("/console/overview").await.status, 200);
    clock.advance(IDLE_TIMEOUT - Duration::from_secs(60));
    assert_eq!(b.get("/console/overview").await.status, 200);
    // Unused for longer, it ends.
    clock.advance(IDLE_TIMEOUT + Duration::from_secs(1));
    let a = b.get("/console/overview").await;
    assert_eq!((a.status, location(&a)), (303, "/console/login"));
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0
    );

    // Revoking the key ends the session at once.
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    assert_eq!(b.get("/console/overview").await.status, 200);
    let keys = app.handle.store.list_keys().await.unwrap();
    let key = keys.iter().find(|k| k.tenant_name == app.tenant).unwrap();
    assert!(
        app.handle
            .store
            .revoke_key(key.id, clock.now())
            .await
            .unwrap()
    );
    let a = b.get("/console/overview").await;
    assert_eq!((a.status, location(&a)), (303, "/console/login"));
    let again = b.sign_in(&app.api_key).await;
    assert_eq!(again.status, 401, "a revoked key signs in no more");
}

async fn failed_sign_ins_are_rate_limited(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    let mut b = Browser::new(&app);
    for _ in 0..sendonce::console::decide::SIGNIN_FAILURES {
        assert_eq!(
            b.sign_in("so_wrong-key-000000000000000000").await.status,
            401
        );
    }
    // Now even the right key waits.
    let a = b.sign_in(&app.api_key).await;
    assert_eq!(a.status, 429);
    let wait: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0
    );
    clock.advance(Duration::from_secs(61));
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
}

async fn a_verification_and_its_sealed_message_show_no_code(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let started = answer(
        app.request(reqwest::Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "LOGIN-7731")
            .json(&json!({"to": "+14155550100", "code_length": 6}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(started.status, 201);
    let ver = started.json()["id"].as_str().unwrap().to_string();
    let body = eventually("the code's SMS", || async {
        app.mock
            .calls()
            .into_iter()
            .find_map(|c| c.body["body"].as_str().map(str::to_string))
    })
    .await;
    let code: String = body.chars().filter(char::is_ascii_digit).collect();
    assert_eq!(code.len(), 6);

    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let found = b.get(&format!("/console/search?q={ver}")).await;
    let page_url = format!("/console/verifications/{ver}");
    assert_eq!((found.status, location(&found)), (303, page_url.as_str()));
    let page = b.get(&page_url).await;
    assert_eq!(page.status, 200);
    let html = text(&page);
    assert!(html.contains("pending") && html.contains("+14155550100"));
    assert!(!html.contains(&code), "no code on the verification page");
    let link = html
        .split("href=\"/console/messages/")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a link to its message");
    let timeline = b.get(&format!("/console/messages/{link}")).await;
    assert_eq!(timeline.status, 200);
    let html = text(&timeline);
    assert!(!html.contains(&code), "no code on the timeline");
    assert!(html.contains("******"), "the text, its code masked");
    assert!(html.contains(&ver));
    // Another tenant's session finds nothing of it.
    let other = spawn_with(TestOptions {
        backend,
        database: Some(app.database.clone()),
        ..TestOptions::default()
    })
    .await;
    let mut b2 = Browser::new(&other);
    assert_eq!(b2.sign_in(&other.api_key).await.status, 303);
    assert_eq!(b2.get(&page_url).await.status, 404);
    assert_eq!(
        b2.get(&format!("/console/search?q={ver}")).await.status,
        200
    );
}

/// A local webhook receiver answering every delivery with `status`.
async fn hook_receiver(status: u16) -> String {
    let code = axum::http::StatusCode::from_u16(status).expect("a status");
    let app = axum::Router::new().route("/hook", axum::routing::post(move || async move { code }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

/// Three endpoints (one answers 200, one 500, one 410 Gone) and a message
/// sent then delivered: its timeline shows each delivery attempt and where
/// each delivery stands; another tenant's store query sees none of them.
async fn the_timeline_shows_webhook_deliveries(backend: Backend) {
    let mut settings = receipts_settings();
    settings.webhooks.allow_private = true;
    settings.webhooks.poll_interval = Duration::from_millis(50);
    settings.webhooks.timeout = Duration::from_millis(700);
    settings.webhooks.connect_timeout = Duration::from_millis(500);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let (ok, busy, gone) = (
        hook_receiver(200).await,
        hook_receiver(500).await,
        hook_receiver(410).await,
    );
    for url in [&ok, &busy, &gone] {
        let a = answer(
            app.client
                .post(format!("{}/webhook-endpoints", app.base))
                .bearer_auth(&app.api_key)
                .json(&json!({ "url": url }))
                .send()
                .await
                .expect("POST"),
        )
        .await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    }
    let id = retried_then_delivered(&app, "ORDER-HOOKS-1", "+14155550100", "Order shipped").await;

    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let timeline = format!("/console/messages/{id}");
    let needles = [
        "Webhook deliveries".to_string(),
        ok.clone(),
        busy.clone(),
        gone.clone(),
        format!("Webhook delivered to {ok}"),
        "<dd>message.delivered</dd>".into(),
        "Webhook failed: HTTP 500".into(),
        "Webhook failed: HTTP 410".into(),
        "<dt>then</dt><dd>endpoint disabled</dd>".into(),
        "<dt>duration</dt>".into(),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let html = loop {
        let page = b.get(&timeline).await;
        assert_eq!(page.status, 200);
        let html = text(&page);
        let due = html.contains("<dt>then</dt><dd>attempt ") && html.contains(" due at ");
        if due && needles.iter().all(|n| html.contains(n.as_str())) {
            break html;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timeline never showed every delivery: missing {:?} (retry due shown: {due})",
            needles
                .iter()
                .filter(|n| !html.contains(n.as_str()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Delivery entries come after the final status they report.
    let fin = html.find("Final status: sent").expect("final status");
    let first = html.find("Webhook delivered to").expect("an attempt");
    assert!(fin < first, "the axis puts the status before its webhook");
    // Each attempt once, worded as a webhook: no separate result entry.
    assert!(!html.contains("Webhook message.sent"), "{html}");
    // The 500 endpoint's delivery waits for a retry: the overview counts it.
    let overview = text(&b.get("/console/overview").await);
    let label = "<dt>Webhook deliveries waiting for a retry</dt><dd>";
    let at = overview.find(label).expect("the waiting line") + label.len();
    let waiting: i64 = overview[at..]
        .split('<')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(waiting >= 1, "waiting webhooks: {waiting}");

    // The store query is tenant-scoped: another tenant on the same database
    // gets nothing for this message, its own tenant gets every delivery.
    let other = spawn_with(TestOptions {
        backend,
        database: Some(app.database.clone()),
        ..TestOptions::default()
    })
    .await;
    let tenant = |a: &TestApp| {
        let store = a.handle.store.clone();
        let key = sendonce::apikey::hash(&a.api_key);
        async move { store.tenant_for_key(&key).await.unwrap().unwrap().id }
    };
    let message = sendonce::console::decide::parse_message_id(&id).expect("a message id");
    let mine = app
        .handle
        .store
        .message_webhook_deliveries(tenant(&app).await, message)
        .await
        .unwrap();
    assert!(mine.len() >= 4, "{} deliveries", mine.len());
    let theirs = app
        .handle
        .store
        .message_webhook_deliveries(tenant(&other).await, message)
        .await
        .unwrap();
    assert!(theirs.is_empty(), "another tenant sees {theirs:?}");
    let mut o = Browser::new(&other);
    assert_eq!(o.sign_in(&other.api_key).await.status, 303);
    assert_eq!(o.get(&timeline).await.status, 404);
}

/// Agents know order numbers, not keys: part of a key, any case, a
/// metadata value and a national-format number (in the home country only)
/// find a message; nothing found says what can be searched.
async fn search_finds_part_of_a_key_a_metadata_value_and_a_national_number(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut with_meta = sms("+14155550100", "Order 92840 confirmed");
    with_meta["metadata"] = serde_json::json!({ "crm_ticket": "TCK-7731", "shop": "north" });
    assert_eq!(
        app.post("ORDER-92840-CONFIRMATION-SMS", &with_meta)
            .await
            .status,
        201
    );
    app.wait_for_status("ORDER-92840-CONFIRMATION-SMS", "sent")
        .await;
    // A key with LIKE's wildcards in it: they are taken literally.
    assert_eq!(
        app.post("ORDER-5_0%-SMS", &sms("+14155550101", "Order 50 confirmed"))
            .await
            .status,
        201
    );
    let timeline = format!(
        "/console/messages/{}",
        app.get("/messages/ORDER-92840-CONFIRMATION-SMS")
            .await
            .json()["id"]
            .as_str()
            .unwrap()
    );
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let page = text(&b.get(&timeline).await);
    assert!(
        page.contains("crm_ticket") && page.contains("TCK-7731"),
        "metadata shown: {page}"
    );
    let label = text(&b.get("/console/search").await);
    assert!(label.contains("verification id"), "{label}");
    for q in [
        "ORDER-92840",
        "order-92840-confirmation-sms",
        "92840-conf",
        "tck-7731",
    ] {
        let a = b.get(&format!("/console/search?q={}", enc(q))).await;
        assert_eq!((a.status, location(&a)), (303, timeline.as_str()), "{q}");
    }
    // Both messages' keys start with ORDER-: a list, not a redirect.
    let both = b.get("/console/search?q=order-").await;
    assert_eq!(both.status, 200);
    let html = text(&both);
    assert!(
        html.contains("ORDER-92840-CONFIRMATION-SMS") && html.contains("ORDER-5_0%-SMS"),
        "{html}"
    );
    // `%` and `_` match themselves only.
    let a = b.get(&format!("/console/search?q={}", enc("5_0%"))).await;
    assert_eq!(a.status, 303, "{}", text(&a));
    let none = text(&b.get("/console/search?q=ORDER-9_840").await);
    assert!(none.contains("Nothing matched"), "{none}");
    // A national number without a home country: nothing, and how to set one.
    let nothing = text(&b.get("/console/search?q=4155550100").await);
    assert!(nothing.contains("Nothing matched"), "{nothing}");
    assert!(nothing.contains("verification id (ver_"), "{nothing}");
    assert!(
        nothing.contains("sendonce tenant home-country"),
        "{nothing}"
    );
    // With one, it is read there.
    assert_eq!(
        app.db
            .count("UPDATE tenants SET home_country = 'US' RETURNING CAST(1 AS BIGINT)")
            .await,
        1
    );
    let found = b.get("/console/search?q=%28415%29%20555-0100").await;
    assert_eq!(found.status, 200);
    let html = text(&found);
    assert!(html.contains("Recent messages to +14155550100"), "{html}");
    assert!(html.contains("ORDER-92840-CONFIRMATION-SMS"), "{html}");
    // Another tenant's search finds none of it.
    let other = spawn_with(TestOptions {
        backend,
        database: Some(app.database.clone()),
        ..TestOptions::default()
    })
    .await;
    let mut o = Browser::new(&other);
    assert_eq!(o.sign_in(&other.api_key).await.status, 303);
    assert!(text(&o.get("/console/search?q=order-92840").await).contains("Nothing matched"));
}

/// Waiting and withdrawn messages are not drawn red like failed ones, and
/// the status summary has a total.
async fn the_overview_colours_by_outcome_and_shows_a_total(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let later = app.clock.now() + time::Duration::hours(2);
    let at = later
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    for key in ["LATER-1", "LATER-2"] {
        let body = serde_json::json!({ "to": "+14155550100", "body": "Later", "send_at": at });
        assert_eq!(app.post(key, &body).await.status, 202, "{key}");
    }
    let cancel = app
        .request(reqwest::Method::POST, "/messages/LATER-2/cancel")
        .bearer_auth(&app.api_key);
    assert_eq!(cancel.send().await.unwrap().status(), 200);
    app.mock.push([testkit::mock_provider::Behaviour::Fail {
        status: 400,
        body: serde_json::json!({ "error": "invalid number" }),
        retry_after: None,
    }]);
    app.post("NOW-FAILS", &sms("+14155550100", "Now")).await;
    app.wait_for_status("NOW-FAILS", "failed").await;

    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let html = text(&b.get("/console/overview").await);
    let bar = |status: &str| {
        let at = html
            .find(&format!(">{status}</text>"))
            .unwrap_or_else(|| panic!("{status} bar: {html}"));
        let rect = &html[at..];
        let rect = &rect[rect.find("<rect").unwrap()..];
        rect[..rect.find('>').unwrap()].to_string()
    };
    for s in ["scheduled", "canceled"] {
        let r = bar(s);
        assert!(
            r.contains("bar-neutral") && !r.contains("#a40e26"),
            "{s}: {r}"
        );
    }
    assert!(bar("failed").contains("bar-bad"), "{}", bar("failed"));
    assert!(html.contains("Total: <strong>3</strong>"), "{html}");
}

/// An error page keeps the signed-in navigation (and signed out, none).
async fn error_pages_keep_the_signed_in_navigation(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut b = Browser::new(&app);
    assert_eq!(b.get("/console/no-such-page").await.status, 404);
    let signed_out = text(&b.get("/console/no-such-page").await);
    assert!(!signed_out.contains("Sign out"), "{signed_out}");
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let long = "K".repeat(300);
    for (path, status) in [
        ("/console/messages/msg_nothex".to_string(), 404),
        ("/console/no-such-page".to_string(), 404),
        (format!("/console/search?q={long}"), 400),
    ] {
        let a = b.get(&path).await;
        assert_eq!(a.status, status, "{path}");
        let html = text(&a);
        for needle in [
            "Sign out",
            "href=\"/console/overview\"",
            "href=\"/console/search\"",
        ] {
            assert!(html.contains(needle), "{path}: {needle}: {html}");
        }
    }
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Issue 42, item 5: an Arabic body and user text read in their own
/// direction (`dir="auto"`), and every table of the overview and the search
/// stacks on a phone (`table.stack`, each cell under its column's name) as
/// the webhook table does, so nothing is cut at 390 px.
async fn user_text_has_its_direction_and_tables_stack(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let body = "تم تأكيد طلبك رقم ١٢٣.";
    let a = app
        .post(
            "ORDER-AR-123",
            &json!({"to": "+14155550100", "body": body, "metadata": {"order": "طلب ١٢٣"}}),
        )
        .await;
    assert_eq!(a.status / 100, 2, "{}", text(&a));
    app.wait_for_status("ORDER-AR-123", "sent").await;
    let second = app.post("ORDER-AR-124", &sms("+14155550100", body)).await;
    assert_eq!(second.status / 100, 2, "{}", text(&second));
    let id = app.get("/messages/ORDER-AR-123").await.json()["id"]
        .as_str()
        .expect("id")
        .to_string();
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let page = text(&b.get(&format!("/console/messages/{id}")).await);
    assert!(
        page.contains(&format!(r#"<pre class="body" dir="auto">{body}</pre>"#)),
        "{page}"
    );
    assert!(page.contains(r#"<dd dir="auto">طلب ١٢٣</dd>"#), "{page}");
    for path in [
        "/console/overview".to_string(),
        format!("/console/search?q={}", enc("+14155550100")),
        "/console/search?q=ORDER-AR".to_string(),
        "/console/opt-outs".to_string(),
    ] {
        let page = text(&b.get(&path).await);
        let tables = page.matches("<table").count();
        assert!(tables > 0 || path.contains("opt-outs"), "{path}: {page}");
        assert_eq!(
            page.matches(r#"<table class="stack""#).count(),
            tables,
            "{path}: {page}"
        );
        // Every cell has its column's name (a cell may have a class too).
        let unlabelled = page
            .split("<td")
            .skip(1)
            .filter(|cell| {
                !cell
                    .split('>')
                    .next()
                    .unwrap_or("")
                    .contains(" data-label=")
            })
            .count();
        assert_eq!(unlabelled, 0, "{path}: {page}");
    }
    let search = text(&b.get("/console/search?q=ORDER-AR").await);
    assert!(
        search.contains(r#"name="q" value="ORDER-AR" dir="auto""#),
        "{search}"
    );
}

/// Issue 42, item 5: a key without `read` is told so (the API names the
/// scope too), and a sign-in is a use of its key.
async fn a_sign_in_names_the_missing_scope_and_counts_as_use(backend: Backend) {
    use sendonce::scopes::{Scope, Scopes};
    let app = spawn_app_on(backend).await;
    let send_only = crate::access::key_with(&app, Scopes::of(&[Scope::Send]), None).await;
    let mut b = Browser::new(&app);
    let refused = b.sign_in(&send_only).await;
    assert_eq!(refused.status, 401);
    let page = text(&refused);
    assert!(page.contains("<code>read</code>"), "{page}");
    assert!(!page.contains("not accepted"), "{page}");
    assert_eq!(
        app.db.count("SELECT count(*) FROM console_sessions").await,
        0
    );
    let last_used = || async {
        app.handle
            .store
            .list_keys()
            .await
            .expect("keys")
            .into_iter()
            .find(|k| k.tenant_name == app.tenant && k.scopes.contains(Scope::Read))
            .and_then(|k| k.last_used_at)
    };
    assert_eq!(last_used().await, None);
    let ok = b.sign_in(&app.api_key).await;
    assert_eq!(ok.status, 303);
    assert!(last_used().await.is_some(), "the sign-in used the key");
    // A key no one holds is still only "not accepted".
    let mut c = Browser::new(&app);
    let wrong = c.sign_in("so_not-a-key-of-anyone-000000000").await;
    assert!(text(&wrong).contains("not accepted"));
    assert!(!text(&wrong).contains("<code>read</code>"));
}

/// Every `<time>` of a page: (datetime, title, text).
fn times(html: &str) -> Vec<(String, Option<String>, String)> {
    html.split("<time ")
        .skip(1)
        .map(|rest| {
            let attr = |name: &str| {
                rest.split('>')
                    .next()
                    .and_then(|tag| tag.split(&format!("{name}=\"")).nth(1))
                    .and_then(|v| v.split('"').next())
                    .map(str::to_string)
            };
            let text = rest
                .split_once('>')
                .and_then(|(_, t)| t.split("</time>").next())
                .unwrap_or_default()
                .to_string();
            (attr("datetime").unwrap_or_default(), attr("title"), text)
        })
        .collect()
}

fn formatted(t: time::OffsetDateTime, zone: &str) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    format!("{} {zone}", t.format(f).expect("format"))
}

/// Issue 42, item 5: times read in the tenant's zone (its home country's;
/// Saudi Arabia: UTC+3 all year, `+03`), the UTC time on hover; in UTC
/// alone without a home country.
async fn times_are_in_the_tenants_zone_with_utc_on_hover(backend: Backend) {
    let app = spawn_app_on(backend).await;
    assert_eq!(
        app.post("ORDER-TZ-1", &sms("+14155550100", "Order TZ confirmed"))
            .await
            .status,
        201
    );
    app.wait_for_status("ORDER-TZ-1", "sent").await;
    // A second to the number, so that a search by it lists both.
    assert_eq!(
        app.post("ORDER-TZ-2", &sms("+14155550100", "Order TZ2 confirmed"))
            .await
            .status,
        201
    );
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&app.api_key).await.status, 303);
    let found = b.get("/console/search?q=ORDER-TZ-1").await;
    let page = location(&found).to_string();
    assert!(page.starts_with("/console/messages/"), "{page}");

    // No home country: UTC, no title.
    let html = text(&b.get(&page).await);
    let utc_times = times(&html);
    assert!(utc_times.len() >= 3, "{html}");
    for (datetime, title, shown) in &utc_times {
        let t =
            time::OffsetDateTime::parse(datetime, &time::format_description::well_known::Rfc3339)
                .expect("an RFC 3339 datetime");
        assert_eq!(shown, &formatted(t, "UTC"));
        assert_eq!(title, &None);
    }

    assert_eq!(
        app.db
            .count("UPDATE tenants SET home_country = 'SA' RETURNING CAST(1 AS BIGINT)")
            .await,
        1
    );
    for path in [page.as_str(), "/console/search?q=%2B14155550100"] {
        let html = text(&b.get(path).await);
        let local = times(&html);
        assert!(!local.is_empty(), "{path}: {html}");
        for (datetime, title, shown) in &local {
            let t = time::OffsetDateTime::parse(
                datetime,
                &time::format_description::well_known::Rfc3339,
            )
            .expect("an RFC 3339 datetime");
            assert_eq!(
                shown,
                &formatted(t + time::Duration::hours(3), "+03"),
                "{path}"
            );
            assert_eq!(
                title.as_deref(),
                Some(formatted(t, "UTC").as_str()),
                "{path}"
            );
        }
    }
    // The sentence for the customer says the local time too.
    let html = text(&b.get(&page).await);
    let say = html
        .split("Tell the customer")
        .nth(1)
        .and_then(|r| r.split("</p>").next())
        .unwrap_or_default();
    assert!(say.contains(" +03") && !say.contains(" UTC"), "{say}");
}

on_both_backends!(
    times_are_in_the_tenants_zone_with_utc_on_hover,
    signs_in_with_a_safe_cookie_and_signs_out,
    a_sign_in_names_the_missing_scope_and_counts_as_use,
    user_text_has_its_direction_and_tables_stack,
    the_cookie_is_secure_behind_https,
    posts_without_the_csrf_token_are_refused_and_change_nothing,
    search_finds_every_kind_and_the_timeline_tells_the_story,
    one_tenant_never_sees_anothers_data,
    a_revoked_key_or_an_idle_session_ends_it,
    failed_sign_ins_are_rate_limited,
    a_verification_and_its_sealed_message_show_no_code,
    the_timeline_shows_webhook_deliveries,
    search_finds_part_of_a_key_a_metadata_value_and_a_national_number,
    the_overview_colours_by_outcome_and_shows_a_total,
    error_pages_keep_the_signed_in_navigation,
);
