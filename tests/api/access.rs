//! Scoped API keys (issue 27): every authenticated route × every scope is
//! allowed or 403 `insufficient-scope` naming the scope it needs, and a
//! refused request changes nothing; the table is the router's own
//! (`sendonce::scopes::ROUTES`, checked against openapi.yaml by a unit
//! test, and a route missing there is refused to every key). A `read` key
//! signs in to the console and sees no opt-out form; a key's last use is
//! written once a minute, on the service's clock.

use reqwest::Method;
use sendonce::clock::Clock;
use sendonce::scopes::{ROUTES, Scope, Scopes};
use sendonce::store::NewApiKey;

use crate::console::Browser;
use crate::helpers::*;

/// A new key of `app`'s tenant holding `scopes`.
pub(crate) async fn key_with(app: &TestApp, scopes: Scopes, label: Option<&str>) -> String {
    let mut key = sendonce::apikey::generate();
    key.stored = NewApiKey {
        scopes,
        label: label.map(str::to_string),
        ..key.stored
    };
    let added = app.handle.store.add_key(&app.tenant, &key.stored).await;
    assert!(added.expect("add key").is_some());
    key.secret
}

/// `route` (a template) with its parameters filled in.
fn concrete(route: &str, tenant: &str) -> String {
    route
        .replace("{key}", "no-such-key")
        .replace("{id}", "0190c0de-0000-7000-8000-000000000000")
        .replace("{number}", "%2B14155550100")
        .replace("{name}", tenant)
}

async fn call(app: &TestApp, key: &str, method: &str, path: &str) -> Answer {
    let method = Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = app.request(method.clone(), path).bearer_auth(key);
    if method != Method::GET && method != Method::DELETE {
        req = req
            .header("content-type", "application/json")
            .header("idempotency-key", "scope-probe")
            .body("{}");
    }
    answer(req.send().await.expect("request")).await
}

/// Rows a refused request must not have changed.
async fn footprint(app: &TestApp) -> Vec<i64> {
    let mut counts = Vec::new();
    for sql in [
        "SELECT count(*) FROM messages",
        "SELECT count(*) FROM opt_outs",
        "SELECT count(*) FROM webhook_endpoints",
        "SELECT count(*) FROM verifications",
        "SELECT count(*) FROM tenants",
        "SELECT count(*) FROM api_keys WHERE revoked_at IS NULL",
        "SELECT count(*) FROM audit_log",
    ] {
        counts.push(app.db.count(sql).await);
    }
    counts
}

async fn every_route_takes_exactly_its_scope(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let mut keys = Vec::new();
    for scope in Scope::ALL {
        keys.push((scope, key_with(&app, Scopes::of(&[scope]), None).await));
    }
    let before = footprint(&app).await;
    // Refused first: nothing may change.
    for (method, route, needs) in ROUTES {
        let path = concrete(route, &app.tenant);
        for (scope, key) in &keys {
            if scope == needs {
                continue;
            }
            let a = call(&app, key, method, &path).await;
            assert_eq!(a.status, 403, "{method} {route} with {scope}");
            assert_eq!(a.slug(), "insufficient-scope", "{method} {route}");
            assert_eq!(
                a.json()["required_scope"],
                needs.as_str(),
                "{method} {route}"
            );
            assert!(
                a.json()["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains(needs.as_str()),
                "the detail names the scope"
            );
        }
    }
    assert_eq!(
        footprint(&app).await,
        before,
        "refused requests changed nothing"
    );
    // Allowed: whatever the route answers to an empty request, it is not a
    // scope refusal.
    for (method, route, needs) in ROUTES {
        let path = concrete(route, &app.tenant);
        let (_, key) = keys.iter().find(|(s, _)| s == needs).expect("key");
        let a = call(&app, key, method, &path).await;
        assert!(
            a.status != 403 && a.status != 401 && a.status < 500,
            "{method} {route} with {needs}: {} {}",
            a.status,
            String::from_utf8_lossy(&a.bytes)
        );
    }
    // A key issued before scopes existed (the default) holds all but admin.
    let a = app.get("/admin/tenants").await;
    assert_eq!((a.status, a.slug()), (403, "insufficient-scope".into()));
    assert_eq!(app.get("/messages/none").await.status, 404);
}

async fn a_read_key_uses_the_console_without_opt_out_forms(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let tenant_id = app
        .handle
        .store
        .tenant_settings()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == app.tenant)
        .expect("tenant")
        .id;
    let added = app
        .handle
        .store
        .add_opt_out(tenant_id, "+14155550100", "api", app.clock.now())
        .await;
    assert!(added.expect("opt-out"));
    let read = key_with(&app, Scopes::of(&[Scope::Read]), Some("support")).await;
    let send_only = key_with(&app, Scopes::of(&[Scope::Send]), None).await;
    let mut b = Browser::new(&app);
    assert_eq!(
        b.sign_in(&send_only).await.status,
        401,
        "the console needs read"
    );
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&read).await.status, 303);
    let page = b.get("/console/opt-outs").await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8_lossy(&page.bytes).into_owned();
    assert!(html.contains("+14155550100"), "the list is shown");
    assert!(
        !html.contains(r#"method="post" action="/console/opt-outs""#),
        "no add form"
    );
    assert!(!html.contains("/console/opt-outs/remove"), "no remove form");
    assert!(
        html.contains("has no <code>opt-outs</code> scope"),
        "says why"
    );
    // A timeline is readable.
    let sent = app.post("c-1", &sms("+14155550199", "hello")).await;
    assert_eq!(sent.status, 201);
    let id = sent.json()["id"].as_str().unwrap().to_string();
    assert_eq!(b.get(&format!("/console/messages/{id}")).await.status, 200);
    // A forged form is refused and changes nothing.
    let csrf = {
        let p = b.get("/console/overview").await;
        let t = String::from_utf8_lossy(&p.bytes).into_owned();
        let at = t.find(r#"name="csrf" value=""#).expect("csrf") + 19;
        t[at..].split('"').next().unwrap().to_string()
    };
    let before = app.db.count("SELECT count(*) FROM opt_outs").await;
    let a = b
        .post(
            "/console/opt-outs",
            &[("csrf", &csrf), ("number", "+14155550111")],
        )
        .await;
    assert_eq!(a.status, 403);
    let a = b
        .post(
            "/console/opt-outs/remove",
            &[("csrf", &csrf), ("number", "+14155550100")],
        )
        .await;
    assert_eq!(a.status, 403);
    assert_eq!(app.db.count("SELECT count(*) FROM opt_outs").await, before);
}

/// 100 requests within a minute of the service's clock write the key's
/// last use once; a minute later it is written again.
async fn last_use_is_written_once_a_minute(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-03-01 12:00 UTC));
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        ..TestOptions::default()
    })
    .await;
    let last_used = || async {
        let keys = app.handle.store.list_keys().await.unwrap();
        keys.into_iter()
            .find(|k| k.tenant_name == app.tenant)
            .and_then(|k| k.last_used_at)
    };
    assert_eq!(last_used().await, None);
    let start = clock.now();
    for _ in 0..100 {
        assert_eq!(app.get("/messages/none").await.status, 404);
        clock.advance(std::time::Duration::from_millis(500));
    }
    assert_eq!(last_used().await, Some(start), "written once, by the first");
    clock.advance(std::time::Duration::from_secs(10));
    let later = clock.now();
    assert_eq!(app.get("/messages/none").await.status, 404);
    assert_eq!(last_used().await, Some(later), "a minute on: written again");
}

/// The bootstrap key holds every scope, `admin` included; keys made
/// otherwise hold every scope but `admin`.
async fn the_bootstrap_key_administers(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let key = sendonce::apikey::generate();
    let store = &app.handle.store;
    store
        .ensure_bootstrap_key("default", &key.stored, app.clock.now())
        .await
        .expect("bootstrap");
    let keys = store.list_keys().await.unwrap();
    let boot = keys
        .iter()
        .find(|k| k.id == key.stored.id)
        .expect("bootstrap key");
    assert_eq!(boot.scopes, Scopes::ALL);
    let mine = keys
        .iter()
        .find(|k| k.tenant_name == app.tenant)
        .expect("key");
    assert_eq!(mine.scopes, Scopes::DEFAULT);
    let a = app
        .request(Method::GET, "/admin/tenants")
        .bearer_auth(&key.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
}

on_both_backends!(
    the_bootstrap_key_administers,
    every_route_takes_exactly_its_scope,
    a_read_key_uses_the_console_without_opt_out_forms,
    last_use_is_written_once_a_minute,
);
