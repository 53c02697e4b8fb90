//! Hardening II (issue 18): bootstrap key rotation, per-tenant senders,
//! receipt replays and small leaks.

use serde_json::json;

use crate::helpers::*;

/// Status of an authenticated read with `key` (404: the key works, 401: refused).
async fn status_with_key(app: &TestApp, key: &str) -> u16 {
    app.client
        .get(format!("{}/messages/no-such-key", app.base))
        .bearer_auth(key)
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

async fn a_changed_bootstrap_key_revokes_only_the_previous_one(backend: Backend) {
    let database = fresh_database_on(backend).await;
    let (store, db) = open_store(&database, std::time::Duration::from_secs(2));
    let first = sendonce::apikey::generate().secret;
    let second = sendonce::apikey::generate().secret;
    let mut settings = test_settings();
    settings.server.bootstrap_api_key = Some(first.clone());
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("first start");
    let cli = sendonce::apikey::generate();
    store
        .add_key("default", &cli.stored)
        .await
        .expect("key create")
        .expect("tenant default");
    let app = spawn_with(TestOptions {
        backend,
        database: Some(database.clone()),
        api_key: Some(first.clone()),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(status_with_key(&app, &first).await, 404);
    assert_eq!(status_with_key(&app, &cli.secret).await, 404);

    // A restart with the same value revokes nothing.
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("same value again");
    assert_eq!(status_with_key(&app, &first).await, 404);
    let revoked = "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL";
    assert_eq!(db.count(revoked).await, 0);

    // A restart with a new value: the old bootstrap key is refused at once,
    // the key made with `key create` still works.
    settings.server.bootstrap_api_key = Some(second.clone());
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("rotated");
    assert_eq!(status_with_key(&app, &first).await, 401);
    assert_eq!(status_with_key(&app, &second).await, 404);
    assert_eq!(status_with_key(&app, &cli.secret).await, 404);
    assert_eq!(db.count(revoked).await, 1);

    // Again with the new value: nothing more is revoked.
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("same new value");
    assert_eq!(db.count(revoked).await, 1);
    assert_eq!(status_with_key(&app, &second).await, 404);

    // An instance started with the old (revoked) value locks nobody out.
    settings.server.bootstrap_api_key = Some(first.clone());
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("old value");
    assert_eq!(status_with_key(&app, &first).await, 401);
    assert_eq!(status_with_key(&app, &second).await, 404);
    assert_eq!(db.count(revoked).await, 1);
}

/// The problem's `errors` fields of a 400.
fn error_fields(a: &Answer) -> Vec<String> {
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.slug(), "validation");
    a.json()["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().expect("field").to_string())
        .collect()
}

async fn senders_are_limited_to_the_tenants_list(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let with_from = |from: &str| json!({"to": "+14155550100", "body": "hi", "from": from});

    // No list: the provider's default sender only.
    let a = app.post("no-list-acme", &with_from("ACME")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
    let a = app.post("no-list-number", &with_from("+14155550199")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
    assert_eq!(app.message_count().await, 0);
    assert_eq!(
        app.post("no-list-default", &sms("+14155550100", "hi"))
            .await
            .status,
        201
    );

    // With a list: exactly its senders (numbers compared in E.164).
    app.allow_sender("ACME").await;
    app.allow_sender("+14155550199").await;
    assert_eq!(
        app.post("listed-acme", &with_from("ACME")).await.status,
        201
    );
    assert_eq!(
        app.post("listed-number", &with_from("+1 (415) 555-0199"))
            .await
            .status,
        201
    );
    assert_eq!(
        app.post("listed-default", &sms("+14155550100", "hi"))
            .await
            .status,
        201
    );
    let a = app.post("unlisted", &with_from("EVIL")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
    let a = app.post("other-case", &with_from("acme")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
    assert_eq!(app.message_count().await, 4);

    // Removing a sender takes effect on the next request.
    let store = &app.handle.store;
    assert_eq!(
        store
            .edit_senders(&app.tenant, "ACME", false)
            .await
            .unwrap(),
        Some(true)
    );
    assert_eq!(
        store
            .edit_senders(&app.tenant, "ACME", false)
            .await
            .unwrap(),
        Some(false)
    );
    let a = app.post("removed", &with_from("ACME")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
    assert_eq!(
        store.allowed_senders(&app.tenant).await.unwrap(),
        Some(Some(vec!["+14155550199".to_string()]))
    );
    assert_eq!(store.allowed_senders("no-such-tenant").await.unwrap(), None);
    assert_eq!(
        store
            .edit_senders("no-such-tenant", "ACME", true)
            .await
            .unwrap(),
        None
    );
}

async fn the_default_tenant_accepts_any_sender_until_it_has_a_list(backend: Backend) {
    let database = fresh_database_on(backend).await;
    let (store, _) = open_store(&database, std::time::Duration::from_secs(2));
    let key = sendonce::apikey::generate();
    store
        .ensure_bootstrap_key("default", &key.stored, time::OffsetDateTime::now_utc())
        .await
        .expect("bootstrap");
    let app = spawn_with(TestOptions {
        backend,
        database: Some(database),
        api_key: Some(key.secret),
        ..TestOptions::default()
    })
    .await;
    let with_from = |from: &str| json!({"to": "+14155550100", "body": "hi", "from": from});
    assert_eq!(app.post("any-1", &with_from("ACME")).await.status, 201);
    assert_eq!(app.post("any-2", &with_from("OTHER")).await.status, 201);
    store.edit_senders("default", "ACME", true).await.unwrap();
    assert_eq!(app.post("listed", &with_from("ACME")).await.status, 201);
    let a = app.post("unlisted", &with_from("OTHER")).await;
    assert_eq!(error_fields(&a), vec!["from"]);
}

on_both_backends!(
    a_changed_bootstrap_key_revokes_only_the_previous_one,
    senders_are_limited_to_the_tenants_list,
    the_default_tenant_accepts_any_sender_until_it_has_a_list,
);
