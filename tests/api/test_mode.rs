//! Test mode (issue 27): a key made with `"test": true` starts `so_test_`,
//! its messages go to test mode's simulated provider whatever is configured
//! (counted at the mock provider, which must see none of them), each magic
//! number ends as docs/api.md's table says (receipts and webhook events
//! included), test and live data never see each other (messages, keys,
//! webhooks, opt-outs, verifications, the console), `000000` approves a
//! test verification, and a live key's magic number is an ordinary number.

use std::time::Duration;

use reqwest::Method;
use sendonce::provider::testmode::{MAGIC_NUMBERS, Outcome};
use sendonce::scopes::Scopes;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::webhooks::{Receiver, webhook_settings};

/// The default sync wait of these tests: a slow number takes it plus a
/// second.
const WAIT: Duration = Duration::from_millis(500);

fn settings() -> sendonce::config::Settings {
    let mut s = webhook_settings();
    s.server.wait.default = WAIT;
    s.verify.secret = Some(sendonce::verify::settings::VerifySecret(
        b"test-mode verify secret".to_vec(),
    ));
    s
}

async fn spawn(backend: Backend) -> TestApp {
    spawn_with(TestOptions {
        backend,
        settings: settings(),
        ..TestOptions::default()
    })
    .await
}

async fn call(
    app: &TestApp,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
    idem: Option<&str>,
) -> Answer {
    let mut req = app.request(method, path).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(k) = idem {
        req = req.header("idempotency-key", k);
    }
    answer(req.send().await.expect("request")).await
}

async fn send(app: &TestApp, key: &str, idem: &str, to: &str) -> Answer {
    call(
        app,
        key,
        Method::POST,
        "/messages",
        Some(sms(to, &format!("Order {idem}"))),
        Some(idem),
    )
    .await
}

async fn get(app: &TestApp, key: &str, path: &str) -> Answer {
    call(app, key, Method::GET, path, None, None).await
}

/// A key of tenant `tenant` made over the admin API by `admin`, in test
/// mode when `test`.
async fn key_of(app: &TestApp, admin: &str, tenant: &str, test: bool) -> String {
    let a = call(
        app,
        admin,
        Method::POST,
        &format!("/admin/tenants/{tenant}/keys"),
        Some(json!({ "test": test, "label": if test { "ci" } else { "prod" } })),
        None,
    )
    .await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    let k = a.json();
    assert_eq!(k["test"], test);
    let secret = k["key"].as_str().expect("the key").to_string();
    assert_eq!(secret.starts_with("so_test_"), test, "{secret}");
    assert!(
        k["prefix"]
            .as_str()
            .is_some_and(|p| p.starts_with("so_test_") == test),
        "{k}"
    );
    secret
}

async fn admin_key(app: &TestApp) -> String {
    crate::access::key_with(app, Scopes::ALL, Some("ops")).await
}

/// Waits until `key`'s message `idem` is `status`.
async fn final_status(app: &TestApp, key: &str, idem: &str, status: &str) -> Value {
    within(
        Duration::from_secs(20),
        &format!("{idem} to be {status}"),
        || async {
            let a = get(app, key, &format!("/messages/{idem}")).await;
            (a.status == 200 && a.json()["status"] == status).then(|| a.json())
        },
    )
    .await
}

/// The events of a message's history of type `kind`.
async fn history(app: &TestApp, key: &str, idem: &str, kind: &str) -> Vec<Value> {
    let a = get(app, key, &format!("/messages/{idem}/events?limit=100")).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|e| e["type"] == kind)
        .cloned()
        .collect()
}

/// Registers a webhook endpoint at `url` with `key`; checks its mode.
async fn endpoint(app: &TestApp, key: &str, url: &str, mode: &str) {
    let a = call(
        app,
        key,
        Method::POST,
        "/webhook-endpoints",
        Some(json!({ "url": url })),
        None,
    )
    .await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.json()["mode"], mode);
}

/// Per outcome: the first answer's status, the final status, the receipt's
/// word, the webhook events, the attempts.
fn expected(
    o: Outcome,
) -> (
    u16,
    &'static str,
    Option<&'static str>,
    &'static [&'static str],
    usize,
) {
    const SENT_DELIVERED: &[&str] = &["message.sent", "message.delivered"];
    match o {
        Outcome::Delivered => (201, "delivered", Some("delivered"), SENT_DELIVERED, 1),
        Outcome::Failed => (201, "failed", None, &["message.failed"], 1),
        Outcome::Undelivered => (
            201,
            "undelivered",
            Some("undelivered"),
            &["message.sent", "message.undelivered"],
            1,
        ),
        // The provider timeout (2 s) waits out the unclear answer: past the wait.
        Outcome::Unknown => (202, "unknown", None, &["message.unknown"], 1),
        Outcome::Slow => (202, "delivered", Some("delivered"), SENT_DELIVERED, 2),
        // Its Retry-After (1 s) is past this wait (0.5 s): 202 here.
        Outcome::RateLimited => (202, "delivered", Some("delivered"), SENT_DELIVERED, 2),
    }
}

async fn every_magic_number_ends_as_the_table_says(backend: Backend) {
    let app = spawn(backend).await;
    let admin = admin_key(&app).await;
    let test = key_of(&app, &admin, &app.tenant, true).await;
    let (hooks, url) = Receiver::start().await;
    endpoint(&app, &test, &url, "test").await;

    let mut firsts = Vec::new();
    for (number, outcome) in MAGIC_NUMBERS {
        let idem = format!("TM-{}", outcome.as_str());
        let a = send(&app, &test, &idem, number).await;
        assert_eq!(a.json()["provider"], "test", "{}", a.json());
        firsts.push((idem, outcome, a.status));
    }
    let mut events = 0;
    for (idem, outcome, first) in &firsts {
        let (answer, status, receipt, hooks_of, attempts) = expected(*outcome);
        assert_eq!(*first, answer, "{idem}: the first answer");
        let m = final_status(&app, &test, idem, status).await;
        assert_eq!(m["provider"], "test");
        let receipts = history(&app, &test, idem, "receipt").await;
        match receipt {
            Some(word) => {
                assert_eq!(receipts.len(), 1, "{idem}: {receipts:?}");
                assert_eq!(receipts[0]["provider"], "test");
                assert_eq!(receipts[0]["provider_status"], word);
                assert_eq!(receipts[0]["applied"], true);
            }
            None => assert!(receipts.is_empty(), "{idem}: {receipts:?}"),
        }
        let tried = history(&app, &test, idem, "attempt").await;
        assert_eq!(tried.len(), attempts, "{idem}: {tried:?}");
        if *outcome == Outcome::RateLimited {
            assert_eq!(tried[0]["http_status"], 429, "{tried:?}");
            assert_eq!(tried[0]["outcome"], "retryable");
        }
        events += hooks_of.len();
    }
    // Each message's webhook events at the test endpoint and in the events
    // feed, compared as sets: deliveries of one message may overtake each
    // other, and a receipt that overtakes the write of the provider's id
    // can be ordered before `message.sent` in the feed (its transaction's
    // id is older).
    let hits = hooks.wait_for(events).await;
    // (On Postgres an event shows in the feed once older transactions end.)
    let feed = eventually("every event in the feed", || async {
        let feed = get(&app, &test, "/events?limit=100").await.json();
        let n = feed["data"].as_array().map_or(0, Vec::len);
        (n >= events).then_some(feed)
    })
    .await;
    for (idem, outcome, _) in &firsts {
        let (_, _, _, hooks_of, _) = expected(*outcome);
        let mut got: Vec<String> = hits
            .iter()
            .map(|h| h.json())
            .filter(|b| b["data"]["idempotency_key"] == idem.as_str())
            .map(|b| b["type"].as_str().expect("type").to_string())
            .collect();
        got.sort();
        let mut want = hooks_of.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{idem}");
        let mut written: Vec<&str> = feed["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter(|e| e["data"]["idempotency_key"] == idem.as_str())
            .filter_map(|e| e["type"].as_str())
            .collect();
        written.sort_unstable();
        assert_eq!(written, want, "{idem}: the feed");
    }
    // Nothing reached the configured provider.
    assert_eq!(app.mock.call_count(), 0);
    let metrics = app.handle.deliverer.metrics().render(0, None);
    assert!(
        metrics.contains(r#"sendonce_messages_final_total{status="failed",mode="test"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains(r#"mode="live""#), "{metrics}");
}

/// A new tenant `name` made over the admin API.
async fn tenant(app: &TestApp, admin: &str, name: &str) {
    let a = call(
        app,
        admin,
        Method::POST,
        "/admin/tenants",
        Some(json!({ "name": name })),
        None,
    )
    .await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
}

async fn test_and_live_data_never_meet(backend: Backend) {
    let app = spawn(backend).await;
    let admin = admin_key(&app).await;
    tenant(&app, &admin, "acme").await;
    let live = key_of(&app, &admin, "acme", false).await;
    let test = key_of(&app, &admin, "acme", true).await;
    let (live_hooks, live_url) = Receiver::start().await;
    let (test_hooks, test_url) = Receiver::start().await;
    endpoint(&app, &live, &live_url, "live").await;
    endpoint(&app, &test, &test_url, "test").await;

    // One idempotency key in each mode: two messages, one at the provider.
    let l = send(&app, &live, "ORDER-1", "+14155550100").await;
    let t = send(&app, &test, "ORDER-1", "+14155550100").await;
    assert_eq!((l.status, t.status), (201, 201));
    let (l, t) = (l.json(), t.json());
    assert_ne!(l["id"], t["id"]);
    assert_eq!(
        (l["provider"].as_str(), t["provider"].as_str()),
        (Some("http"), Some("test"))
    );
    // Each mode's key finds its own, and a replay stays in its mode.
    assert_eq!(
        get(&app, &live, "/messages/ORDER-1").await.json()["id"],
        l["id"]
    );
    assert_eq!(
        get(&app, &test, "/messages/ORDER-1").await.json()["id"],
        t["id"]
    );
    let again = send(&app, &test, "ORDER-1", "+14155550100").await;
    assert_eq!(again.json()["id"], t["id"]);
    // Only in one mode: the other never finds it.
    assert_eq!(
        send(&app, &test, "ORDER-T", "+14155550100").await.status,
        201
    );
    assert_eq!(
        send(&app, &live, "ORDER-L", "+14155550100").await.status,
        201
    );
    assert_eq!(get(&app, &live, "/messages/ORDER-T").await.status, 404);
    assert_eq!(get(&app, &test, "/messages/ORDER-L").await.status, 404);
    assert_eq!(app.mock.created_to("+14155550100"), 2, "the live ones only");

    // Webhooks by mode: the live endpoint gets live events only, the test
    // one test events only (sent + delivered each).
    let live_ids = [
        l["id"].clone(),
        get(&app, &live, "/messages/ORDER-L").await.json()["id"].clone(),
    ];
    let test_ids = [
        t["id"].clone(),
        final_status(&app, &test, "ORDER-T", "delivered").await["id"].clone(),
    ];
    final_status(&app, &test, "ORDER-1", "delivered").await;
    let live_got = live_hooks.wait_for(2).await;
    let test_got = test_hooks.wait_for(4).await;
    for h in &live_got {
        assert!(live_ids.contains(&h.json()["data"]["id"]), "{}", h.json());
    }
    for h in &test_got {
        assert!(test_ids.contains(&h.json()["data"]["id"]), "{}", h.json());
    }
    // The events feed too.
    for (key, ids) in [(&live, &live_ids), (&test, &test_ids)] {
        let feed = within(Duration::from_secs(10), "the feed", || async {
            let a = get(&app, key, "/events?limit=100").await;
            let data = a.json()["data"].as_array().cloned().unwrap_or_default();
            (!data.is_empty()).then_some(data)
        })
        .await;
        for e in feed {
            assert!(ids.contains(&e["data"]["id"]), "{e}");
        }
    }
    let crossed = app
        .db
        .count(
            "SELECT count(*) FROM webhook_deliveries d \
             JOIN webhook_events e ON e.id = d.event_id \
             JOIN webhook_endpoints w ON w.id = d.endpoint_id \
             WHERE e.tenant_id <> w.tenant_id",
        )
        .await;
    assert_eq!(crossed, 0);
    // Endpoints are listed in their own mode.
    for (key, mode) in [(&live, "live"), (&test, "test")] {
        let list = get(&app, key, "/webhook-endpoints").await.json();
        let data = list["data"].as_array().expect("data");
        assert_eq!(data.len(), 1, "{list}");
        assert_eq!(data[0]["mode"], mode);
    }

    // Opt-outs: a test opt-out stops nothing live.
    let opted = call(
        &app,
        &test,
        Method::POST,
        "/opt-outs",
        Some(json!({ "number": "+14155550111" })),
        None,
    )
    .await;
    assert!(
        opted.status == 201 || opted.status == 200,
        "{}",
        opted.status
    );
    let live_list = get(&app, &live, "/opt-outs").await.json();
    assert_eq!(live_list["data"], json!([]), "{live_list}");
    assert_eq!(
        send(&app, &live, "ORDER-OPT", "+14155550111").await.json()["status"],
        "sent"
    );
    assert_eq!(
        send(&app, &test, "ORDER-OPT", "+14155550111").await.json()["status"],
        "failed"
    );

    // Verifications.
    let v = call(
        &app,
        &test,
        Method::POST,
        "/verifications",
        Some(json!({ "to": "+14155550122" })),
        Some("V-1"),
    )
    .await;
    assert_eq!(v.status, 201, "{}", String::from_utf8_lossy(&v.bytes));
    let vid = v.json()["id"].as_str().expect("id").to_string();
    assert_eq!(
        get(&app, &live, &format!("/verifications/{vid}"))
            .await
            .status,
        404
    );
    assert_eq!(
        get(&app, &test, &format!("/verifications/{vid}"))
            .await
            .status,
        200
    );

    // The console: a live key's finds no test message, a test key's does.
    let find = |key: String, q: String| {
        let app = &app;
        async move {
            let mut b = crate::console::Browser::new(app);
            assert_eq!(b.sign_in(&key).await.status, 303);
            // The test console says it is one.
            let overview = b.get("/console/overview").await;
            let banner = String::from_utf8_lossy(&overview.bytes).contains("Test mode");
            assert_eq!(banner, key.starts_with("so_test_"));
            let a = b.get(&format!("/console/search?q={q}")).await;
            (a.status, String::from_utf8_lossy(&a.bytes).to_string())
        }
    };
    let (status, page) = find(live.clone(), "ORDER-T".into()).await;
    assert!(
        status == 200 && page.contains("Nothing matched"),
        "{status} {page}"
    );
    let test_id = t["id"].as_str().expect("id").to_string();
    let (status, page) = find(live.clone(), test_id.clone()).await;
    assert!(
        status == 200 && page.contains("Nothing matched"),
        "{status} {page}"
    );
    let (status, _) = find(test.clone(), "ORDER-T".into()).await;
    assert_eq!(status, 303, "the test console finds it");

    // The admin API shows one tenant, with both keys, the test one flagged.
    let tenants = get(&app, &admin, "/admin/tenants").await.json();
    let names: Vec<&str> = tenants["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"acme") && names.iter().all(|n| !n.contains('~')),
        "{names:?}"
    );
    let keys = get(&app, &admin, "/admin/tenants/acme/keys").await.json();
    let flags: Vec<bool> = keys["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|k| k["test"].as_bool())
        .collect();
    assert_eq!(flags, vec![false, true], "{keys}");

    // A batch item of a test key goes to test mode too.
    let batch = call(
        &app,
        &test,
        Method::POST,
        "/messages/batch",
        Some(json!({ "messages": [
            { "idempotency_key": "B-1", "to": "+12025550101", "body": "batched" },
        ]})),
        None,
    )
    .await;
    assert_eq!(
        batch.status,
        200,
        "{}",
        String::from_utf8_lossy(&batch.bytes)
    );
    assert_eq!(batch.json()["results"][0]["message"]["provider"], "test");
    final_status(&app, &test, "B-1", "failed").await;
    assert_eq!(get(&app, &live, "/messages/B-1").await.status, 404);

    // Spend caps hold live only: a cap below one message's cost refuses a
    // live send and none of test mode's.
    let capped = call(
        &app,
        &admin,
        Method::PATCH,
        "/admin/tenants/acme",
        Some(json!({ "spend_caps": { "daily": "0.01" } })),
        None,
    )
    .await;
    assert_eq!(
        capped.status,
        200,
        "{}",
        String::from_utf8_lossy(&capped.bytes)
    );
    let refused = send(&app, &live, "ORDER-CAP", "+14155550100").await;
    assert_eq!(
        (refused.status, refused.slug()),
        (429, "spend-cap-reached".into())
    );
    let sent = send(&app, &test, "ORDER-CAP", "+14155550100").await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.bytes));
    assert_eq!(
        sent.json()["cost"]["amount"],
        "0.10",
        "the cost it would have live"
    );

    // Disabling the tenant stops its test key too; enabling it, both again.
    for (disabled, status) in [(true, 401), (false, 200)] {
        let a = call(
            &app,
            &admin,
            Method::PATCH,
            "/admin/tenants/acme",
            Some(json!({ "disabled": disabled })),
            None,
        )
        .await;
        assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
        for key in [&live, &test] {
            assert_eq!(get(&app, key, "/messages/ORDER-1").await.status, status);
        }
    }
}

async fn a_live_keys_magic_number_is_an_ordinary_number(backend: Backend) {
    let app = spawn(backend).await;
    for (number, outcome) in MAGIC_NUMBERS {
        let idem = format!("LIVE-{}", outcome.as_str());
        let a = send(&app, &app.api_key, &idem, number).await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
        assert_eq!(a.json()["status"], "sent", "{idem}");
        assert_eq!(a.json()["provider"], "http");
        assert_eq!(app.mock.created_to(number), 1, "{number}");
    }
}

/// The code of a test-mode verification's first message, read as test
/// mode's provider was handed it (its stored body opened with the verify
/// secret).
async fn code_of(app: &TestApp, v: &Value) -> String {
    let id = v["messages"][0]["id"].as_str().expect("message id");
    let uuid = uuid::Uuid::try_parse(id.trim_start_matches("msg_")).expect("uuid");
    let m = app
        .handle
        .store
        .message_by_id(sendonce::domain::MessageId(uuid))
        .await
        .expect("read")
        .expect("the message");
    let keys = sendonce::verify::crypto::Keys::derive(b"test-mode verify secret");
    let body = keys.open_body(uuid, &m.body).expect("opens");
    body.chars().filter(char::is_ascii_digit).collect()
}

async fn check(app: &TestApp, key: &str, id: &str, code: &str) -> Value {
    let a = call(
        app,
        key,
        Method::POST,
        &format!("/verifications/{id}/check"),
        Some(json!({ "code": code })),
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()
}

async fn start(app: &TestApp, key: &str, idem: &str, to: &str) -> Value {
    let a = call(
        app,
        key,
        Method::POST,
        "/verifications",
        Some(json!({ "to": to })),
        Some(idem),
    )
    .await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()
}

async fn zeros_approve_a_test_verification_and_the_real_code_too(backend: Backend) {
    let app = spawn(backend).await;
    let admin = admin_key(&app).await;
    let test = key_of(&app, &admin, &app.tenant, true).await;
    // Any number: 000000 approves.
    let v = start(&app, &test, "V-ZEROS", "+14155550140").await;
    let id = v["id"].as_str().expect("id");
    let real = code_of(&app, &v).await;
    assert_eq!(real.len(), 6);
    if real != "000000" {
        let wrong = check(&app, &test, id, "000001").await;
        assert_eq!(wrong["valid"], false);
    }
    let ok = check(&app, &test, id, "000000").await;
    assert_eq!(
        (ok["valid"].as_bool(), ok["status"].as_str()),
        (Some(true), Some("approved"))
    );
    // The real code still works.
    let v = start(&app, &test, "V-REAL", "+12025550100").await;
    let id = v["id"].as_str().expect("id");
    let ok = check(&app, &test, id, &code_of(&app, &v).await).await;
    assert_eq!(ok["valid"], true);
    // Its message went to test mode's provider, not the configured one.
    final_status(
        &app,
        &test,
        v["messages"][0]["idempotency_key"].as_str().expect("key"),
        "delivered",
    )
    .await;
    assert_eq!(app.mock.call_count(), 0);

    // A live verification: 000000 is a wrong code (unless it is the code).
    let v = start(&app, &app.api_key, "V-LIVE", "+14155550141").await;
    let id = v["id"].as_str().expect("id");
    let sent = eventually("the live code at the provider", || async {
        app.mock
            .calls()
            .into_iter()
            .find(|c| c.body["to"] == "+14155550141")
            .and_then(|c| c.body["body"].as_str().map(str::to_string))
    })
    .await;
    let live_code: String = sent.chars().filter(char::is_ascii_digit).collect();
    let zeros = check(&app, &app.api_key, id, "000000").await;
    assert_eq!(zeros["valid"], live_code == "000000");
}

on_both_backends!(
    every_magic_number_ends_as_the_table_says,
    test_and_live_data_never_meet,
    a_live_keys_magic_number_is_an_ordinary_number,
    zeros_approve_a_test_verification_and_the_real_code_too,
);
