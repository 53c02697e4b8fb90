//! Hardening V (issue 41): what a security review of the new surfaces
//! found. Each test reproduces one finding against today's code.

use reqwest::Method;
use sendonce::scopes::Scopes;
use serde_json::json;

use crate::helpers::*;

/// Audit rows of `action`.
async fn audited(db: &Db, action: &'static str) -> i64 {
    let sql: &'static str = match action {
        "key.revoke" => "SELECT count(*) FROM audit_log WHERE action = 'key.revoke'",
        "tenant.senders" => "SELECT count(*) FROM audit_log WHERE action LIKE 'tenant.senders.%'",
        _ => unreachable!("no such action in these tests"),
    };
    db.count(sql).await
}

/// Finding 7: the bootstrap key's rotation revoking the old key is
/// audited; a restart with the same value writes nothing.
async fn a_bootstrap_key_rotation_is_audited(backend: Backend) {
    let database = fresh_database_on(backend).await;
    let (store, db) = open_store(&database, std::time::Duration::from_secs(2));
    let mut settings = test_settings();
    settings.server.bootstrap_api_key = Some(sendonce::apikey::generate().secret);
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("first start");
    assert_eq!(audited(&db, "key.revoke").await, 0);
    settings.server.bootstrap_api_key = Some(sendonce::apikey::generate().secret);
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("rotated");
    assert_eq!(audited(&db, "key.revoke").await, 1, "the rotation's revoke");
    let log = store.audit_log(None, 10).await.expect("audit log");
    let old: Vec<_> = store
        .list_keys()
        .await
        .expect("keys")
        .into_iter()
        .filter(|k| k.revoked_at.is_some())
        .collect();
    assert_eq!(old.len(), 1);
    assert_eq!(log[0].action, "key.revoke");
    assert_eq!(log[0].target, old[0].id.to_string());
    assert_eq!(log[0].via, "cli");
    sendonce::commands::bootstrap(&settings, store.as_ref())
        .await
        .expect("same value again");
    assert_eq!(audited(&db, "key.revoke").await, 1, "nothing new revoked");
}

/// Finding 7: `sendonce tenant senders NAME add/remove` is audited when it
/// changes the list, and only then.
async fn sender_list_edits_are_audited(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let store = &app.handle.store;
    assert_eq!(audited(&app.db, "tenant.senders").await, 0);
    assert_eq!(
        store.edit_senders(&app.tenant, "ACME", true).await.unwrap(),
        Some(true)
    );
    assert_eq!(audited(&app.db, "tenant.senders").await, 1);
    let log = store.audit_log(None, 1).await.expect("audit log");
    assert_eq!(log[0].action, "tenant.senders.add");
    assert_eq!(log[0].target, app.tenant);
    assert_eq!(log[0].detail, json!({"sender": "ACME"}));
    // Unchanged: no row.
    assert_eq!(
        store.edit_senders(&app.tenant, "ACME", true).await.unwrap(),
        Some(false)
    );
    assert_eq!(audited(&app.db, "tenant.senders").await, 1);
    assert_eq!(
        store
            .edit_senders(&app.tenant, "ACME", false)
            .await
            .unwrap(),
        Some(true)
    );
    assert_eq!(audited(&app.db, "tenant.senders").await, 2);
    let log = store.audit_log(None, 1).await.expect("audit log");
    assert_eq!(log[0].action, "tenant.senders.remove");
}

/// Finding 7: revoking a revoked key again is harmless (204) and writes
/// no second row.
async fn revoking_a_revoked_key_writes_no_second_row(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let admin = crate::access::key_with(&app, Scopes::ALL, Some("ops")).await;
    let victim = crate::access::key_with(&app, Scopes::ALL, Some("victim")).await;
    let id = app
        .handle
        .store
        .list_keys()
        .await
        .expect("keys")
        .into_iter()
        .find(|k| k.label.as_deref() == Some("victim"))
        .expect("the key")
        .id;
    drop(victim);
    for _ in 0..3 {
        let a = answer(
            app.request(Method::DELETE, &format!("/admin/keys/{id}"))
                .bearer_auth(&admin)
                .send()
                .await
                .expect("DELETE"),
        )
        .await;
        assert_eq!(a.status, 204, "{}", String::from_utf8_lossy(&a.bytes));
    }
    assert_eq!(audited(&app.db, "key.revoke").await, 1);
}

/// Finding 10: the console tells test mode from the key's record, not its
/// text: a live key whose text starts `so_test_` (one stored by a start
/// before such a bootstrap key was refused) is shown as live.
async fn the_console_tells_test_mode_by_the_keys_record(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let secret = format!(
        "{}{}",
        sendonce::apikey::TEST_PREFIX,
        &sendonce::apikey::generate().secret[sendonce::apikey::PREFIX.len()..]
    );
    let mut stored = sendonce::apikey::stored_form(&secret);
    stored.scopes = Scopes::ALL;
    assert!(!stored.test, "a live key");
    app.handle
        .store
        .add_key(&app.tenant, &stored)
        .await
        .expect("add key")
        .expect("the tenant");
    let mut browser = crate::console::Browser::new(&app);
    let signed = browser.sign_in(&secret).await;
    assert_eq!(
        signed.status,
        303,
        "{}",
        String::from_utf8_lossy(&signed.bytes)
    );
    let page = browser.get("/console/overview").await;
    assert_eq!(page.status, 200);
    let text = String::from_utf8_lossy(&page.bytes);
    assert!(
        !text.contains("Test mode"),
        "a live key is shown as test mode: {text}"
    );
    // A real test key is still shown as test mode.
    let admin = crate::access::key_with(&app, Scopes::ALL, Some("ops")).await;
    let made = answer(
        app.request(Method::POST, &format!("/admin/tenants/{}/keys", app.tenant))
            .bearer_auth(&admin)
            .json(&json!({"scopes": ["read"], "test": true}))
            .send()
            .await
            .expect("POST key"),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));
    let test_secret = made.json()["key"].as_str().expect("key").to_string();
    let mut browser = crate::console::Browser::new(&app);
    browser.sign_in(&test_secret).await;
    let page = browser.get("/console/overview").await;
    assert!(String::from_utf8_lossy(&page.bytes).contains("Test mode"));
}

on_both_backends!(
    the_console_tells_test_mode_by_the_keys_record,
    a_bootstrap_key_rotation_is_audited,
    sender_list_edits_are_audited,
    revoking_a_revoked_key_writes_no_second_row,
);
