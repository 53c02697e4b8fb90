//! The admin API (issue 27) over HTTP with an `admin` key: create a tenant
//! and a key, send with it, change settings, disable the tenant (its keys
//! refused on every instance once the PATCH returns), revoke a key; the
//! audit log lists each change, newest first; bad input is a 4xx problem
//! and changes nothing.

use std::time::Duration;

use reqwest::Method;
use sendonce::scopes::Scopes;
use serde_json::{Value, json};

use crate::helpers::*;

/// An `admin` key (the bootstrap key's scopes) of `app`'s tenant.
async fn admin_key(app: &TestApp) -> String {
    crate::access::key_with(app, Scopes::ALL, Some("ops")).await
}

async fn send(app: &TestApp, key: &str, method: Method, path: &str, body: Option<Value>) -> Answer {
    let mut req = app.request(method, path).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    answer(req.send().await.expect("request")).await
}

async fn send_sms(app: &TestApp, key: &str, idem: &str) -> Answer {
    let req = app
        .request(Method::POST, "/messages")
        .bearer_auth(key)
        .header("idempotency-key", idem)
        .json(&sms("+14155550123", &format!("Order {idem}")));
    answer(req.send().await.expect("send")).await
}

async fn a_tenant_and_key_made_over_http_send_and_every_change_is_audited(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let admin = admin_key(&app).await;
    let created = send(
        &app,
        &admin,
        Method::POST,
        "/admin/tenants",
        Some(json!({"name": "acme-eu"})),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.bytes)
    );
    assert_eq!(created.json()["name"], "acme-eu");
    assert_eq!(created.json()["disabled"], false);
    let again = send(
        &app,
        &admin,
        Method::POST,
        "/admin/tenants",
        Some(json!({"name": "acme-eu"})),
    )
    .await;
    assert_eq!((again.status, again.slug()), (409, "conflict".into()));

    let key = send(
        &app,
        &admin,
        Method::POST,
        "/admin/tenants/acme-eu/keys",
        Some(json!({"scopes": ["send", "read"], "label": "checkout"})),
    )
    .await;
    assert_eq!(key.status, 201, "{}", String::from_utf8_lossy(&key.bytes));
    let k = key.json();
    let secret = k["key"].as_str().expect("the key, once").to_string();
    assert!(secret.starts_with("so_"));
    assert_eq!(k["scopes"], json!(["send", "read"]));
    let sent = send_sms(&app, &secret, "acme-1").await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.bytes));
    assert_eq!(app.mock.created_to("+14155550123"), 1);
    // Its own scopes only.
    let hooks = send(&app, &secret, Method::GET, "/webhook-endpoints", None).await;
    assert_eq!(
        (hooks.status, hooks.slug()),
        (403, "insufficient-scope".into())
    );

    let listed = send(
        &app,
        &admin,
        Method::GET,
        "/admin/tenants/acme-eu/keys",
        None,
    )
    .await;
    assert_eq!(listed.status, 200);
    let list = listed.json()["data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["label"], "checkout");
    assert!(
        list[0]["last_used_at"].is_string(),
        "used once: {}",
        list[0]
    );
    assert!(
        list[0].get("key").is_none()
            && !listed
                .bytes
                .windows(secret.len())
                .any(|w| w == secret.as_bytes())
    );

    let patched = send(
        &app,
        &admin,
        Method::PATCH,
        "/admin/tenants/acme-eu",
        Some(json!({"allowed_countries": ["us"], "quiet_hours": "21:00-08:00", "home_country": "US"})),
    )
    .await;
    assert_eq!(
        patched.status,
        200,
        "{}",
        String::from_utf8_lossy(&patched.bytes)
    );
    let shown = send(&app, &admin, Method::GET, "/admin/tenants/acme-eu", None)
        .await
        .json();
    assert_eq!(shown["allowed_countries"], json!(["US"]));
    assert_eq!(shown["quiet_hours"], "21:00-08:00");
    assert_eq!(shown["home_country"], "US");
    let limits = &shown["limits"];
    assert_eq!(
        limits["new_sends_per_number_per_hour"].as_u64(),
        Some(u64::from(test_settings().limits.rates.number.per_hour())),
        "{limits}"
    );
    let gb = app
        .request(Method::POST, "/messages")
        .bearer_auth(&secret)
        .header("idempotency-key", "acme-gb")
        .json(&sms("+442079460958", "hi"));
    assert_eq!(
        answer(gb.send().await.unwrap()).await.status,
        400,
        "GB now refused"
    );

    let id = k["id"].as_str().unwrap().to_string();
    let revoked = send(
        &app,
        &admin,
        Method::DELETE,
        &format!("/admin/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(revoked.status, 204);
    assert_eq!(send_sms(&app, &secret, "acme-2").await.status, 401);
    assert_eq!(
        send(
            &app,
            &admin,
            Method::DELETE,
            "/admin/keys/0190c0de-0000-7000-8000-000000000000",
            None
        )
        .await
        .status,
        404
    );

    // Newest first, with who did it.
    let audit = send(&app, &admin, Method::GET, "/admin/audit?limit=2", None).await;
    assert_eq!(audit.status, 200);
    let page = audit.json();
    let actions: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["key.revoke", "tenant.update"]);
    assert_eq!(page["data"][0]["key_label"], "ops");
    assert_eq!(page["data"][0]["target"], id);
    assert_eq!(
        page["data"][1]["detail"]["allowed_countries"],
        json!(["US"])
    );
    let cursor = page["next_cursor"].as_str().expect("more").to_string();
    let rest = send(
        &app,
        &admin,
        Method::GET,
        &format!("/admin/audit?cursor={cursor}"),
        None,
    )
    .await
    .json();
    let actions: Vec<&str> = rest["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["key.create", "tenant.create"],
        "the refused 409 wrote nothing"
    );
    assert!(rest["next_cursor"].is_null());
}

async fn bad_input_is_a_problem_and_changes_nothing(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let admin = admin_key(&app).await;
    let plain = crate::access::key_with(&app, Scopes::DEFAULT, None).await;
    let audit = || app.db.count("SELECT count(*) FROM audit_log");
    let tenants = || app.db.count("SELECT count(*) FROM tenants");
    let (a0, t0) = (audit().await, tenants().await);
    let tenant = app.tenant.clone();
    for (method, path, body, status, slug) in [
        (
            Method::POST,
            "/admin/tenants".to_string(),
            json!({"name": "-bad"}),
            400,
            "validation",
        ),
        (
            Method::POST,
            "/admin/tenants".into(),
            json!({"name": "a b"}),
            400,
            "validation",
        ),
        (
            Method::POST,
            "/admin/tenants".into(),
            json!({"name": "x".repeat(65)}),
            400,
            "validation",
        ),
        (
            Method::POST,
            "/admin/tenants".into(),
            json!({"nom": "x"}),
            400,
            "validation",
        ),
        (
            Method::PATCH,
            format!("/admin/tenants/{tenant}"),
            json!({}),
            400,
            "validation",
        ),
        (
            Method::PATCH,
            format!("/admin/tenants/{tenant}"),
            json!({"home_country": "USA"}),
            400,
            "validation",
        ),
        (
            Method::PATCH,
            format!("/admin/tenants/{tenant}"),
            json!({"spend": 3}),
            400,
            "validation",
        ),
        (
            Method::PATCH,
            format!("/admin/tenants/{tenant}"),
            json!({"disabled": true}),
            409,
            "conflict",
        ),
        (
            Method::PATCH,
            "/admin/tenants/nobody".into(),
            json!({"disabled": true}),
            404,
            "not-found",
        ),
        (
            Method::POST,
            format!("/admin/tenants/{tenant}/keys"),
            json!({"scopes": ["root"]}),
            400,
            "validation",
        ),
        (
            Method::POST,
            format!("/admin/tenants/{tenant}/keys"),
            json!({"scopes": []}),
            400,
            "validation",
        ),
        (
            Method::POST,
            format!("/admin/tenants/{tenant}/keys"),
            json!({"label": "\u{7}"}),
            400,
            "validation",
        ),
        (
            Method::POST,
            "/admin/tenants/nobody/keys".into(),
            json!({}),
            404,
            "not-found",
        ),
    ] {
        let a = send(&app, &admin, method.clone(), &path, Some(body.clone())).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (status, slug),
            "{method} {path} {body}"
        );
    }
    let a = send(
        &app,
        &plain,
        Method::POST,
        "/admin/tenants",
        Some(json!({"name": "ok"})),
    )
    .await;
    assert_eq!((a.status, a.slug()), (403, "insufficient-scope".into()));
    assert_eq!(
        (audit().await, tenants().await),
        (a0, t0),
        "nothing changed"
    );
    let keys = app.db.count("SELECT count(*) FROM api_keys").await;
    assert_eq!(keys, 3, "no key was made");
}

/// Disabling a tenant (and revoking a key) over HTTP on one instance is
/// refused on the other as soon as the PATCH returns, though both had the
/// keys cached for ten minutes.
#[tokio::test]
async fn a_disabled_tenant_is_refused_on_every_instance_at_once() {
    let mut settings = test_settings();
    settings.caches.key_ttl = Duration::from_secs(600);
    settings.caches.key_max_age = Duration::from_secs(600);
    let a = spawn_with(TestOptions {
        settings: settings.clone(),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        settings,
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        ..TestOptions::default()
    })
    .await;
    for app in [&a, &b] {
        eventually("the notification connection", || async {
            app.handle.notifier.is_connected().then_some(())
        })
        .await;
    }
    // `b`'s tenant is administered from `a`.
    let admin = admin_key(&a).await;
    // Both caches hold b's key. A fill is not stored when a notification
    // is applied while it reads (the admin key's own `tenant:` notification
    // may reach `b` just then on a loaded machine): asked again until
    // stored.
    eventually("b's key cached on both instances", || async {
        assert_eq!(b.get("/messages/none").await.status, 404);
        let via_a = a
            .request(Method::GET, "/messages/none")
            .bearer_auth(&b.api_key)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(via_a, 404);
        (!b.handle.keys.is_empty()).then_some(())
    })
    .await;
    let r = send(
        &a,
        &admin,
        Method::PATCH,
        &format!("/admin/tenants/{}", b.tenant),
        Some(json!({"disabled": true})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    for app in [&a, &b] {
        let got = send(app, &b.api_key, Method::GET, "/messages/none", None).await;
        assert_eq!((got.status, got.slug()), (401, "tenant-disabled".into()));
    }
    let r = send(
        &a,
        &admin,
        Method::PATCH,
        &format!("/admin/tenants/{}", b.tenant),
        Some(json!({"disabled": false})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(b.get("/messages/none").await.status, 404, "enabled again");
    // A key revoked over HTTP on `a` stops on `b` at once.
    let keys = send(
        &a,
        &admin,
        Method::GET,
        &format!("/admin/tenants/{}/keys", b.tenant),
        None,
    )
    .await
    .json();
    let id = keys["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        send(
            &a,
            &admin,
            Method::DELETE,
            &format!("/admin/keys/{id}"),
            None
        )
        .await
        .status,
        204
    );
    assert_eq!(b.get("/messages/none").await.status, 401);
}

on_both_backends!(
    a_tenant_and_key_made_over_http_send_and_every_change_is_audited,
    bad_input_is_a_problem_and_changes_nothing,
);
