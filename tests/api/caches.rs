//! The API-key and replay caches (issue 11): revocation and tenant changes
//! reach every instance at once, a new key works at once, replays come from
//! memory, and a purged key is new again everywhere.

use std::time::Duration;

use sendonce::delivery::Purger;

use crate::helpers::*;

/// Settings under which only a notification can end a cached key early.
fn long_lived_keys() -> sendonce::config::Settings {
    let mut s = test_settings();
    s.caches.key_ttl = Duration::from_secs(600);
    s.caches.key_max_age = Duration::from_secs(600);
    s
}

/// A second instance on `a`'s database, acting as the same tenant.
async fn second(a: &TestApp, settings: sendonce::config::Settings) -> TestApp {
    spawn_with(TestOptions {
        backend: Backend::of(&a.database).unwrap_or(Backend::Postgres),
        settings,
        database: Some(a.database.clone()),
        api_key: Some(a.api_key.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        ..TestOptions::default()
    })
    .await
}

async fn connected(app: &TestApp) {
    eventually("the notification connection", || async {
        app.handle.notifier.is_connected().then_some(())
    })
    .await;
}

/// `path` answers `status` on `app` now: a change's writer returns only
/// once every instance has applied it.
async fn answers(app: &TestApp, path: &str, status: u16) {
    assert_eq!(app.get(path).await.status, status, "{path}");
}

async fn key_id(app: &TestApp) -> uuid::Uuid {
    let keys = app.handle.store.list_keys().await.unwrap();
    keys.iter()
        .find(|k| k.tenant_name == app.tenant && k.revoked_at.is_none())
        .unwrap()
        .id
}

/// Revoking a key (what `sendonce key revoke` does, from a store of its own)
/// takes effect at once on both instances, though both had it cached for
/// ten minutes.
#[tokio::test]
async fn a_revoked_key_is_refused_by_every_instance_at_once() {
    let a = spawn_with(TestOptions {
        settings: long_lived_keys(),
        ..TestOptions::default()
    })
    .await;
    let b = second(&a, long_lived_keys()).await;
    connected(&a).await;
    connected(&b).await;
    assert_eq!(a.get("/messages/NONE").await.status, 404);
    assert_eq!(b.get("/messages/NONE").await.status, 404);
    assert_eq!(a.handle.keys.len(), 1, "a cached the key");
    assert_eq!(b.handle.keys.len(), 1, "b cached the key");

    let cli = store_for(&a.database);
    use sendonce::store::TenantStore;
    assert!(
        cli.revoke_key(key_id(&a).await, a.clock.now())
            .await
            .unwrap()
    );
    answers(&a, "/messages/NONE", 401).await;
    answers(&b, "/messages/NONE", 401).await;
    assert!(a.handle.keys.is_empty() && b.handle.keys.is_empty());
}

/// A tenant setting changed elsewhere (here the destination allow-list)
/// applies at once on every instance: the tenant's cached keys go.
#[tokio::test]
async fn a_tenant_change_reaches_every_instance_at_once() {
    let a = spawn_with(TestOptions {
        settings: long_lived_keys(),
        ..TestOptions::default()
    })
    .await;
    let b = second(&a, long_lived_keys()).await;
    connected(&a).await;
    connected(&b).await;
    let gb = sms("+442079460958", "hi");
    assert_eq!(a.post("GB-A1", &gb).await.status, 201);
    assert_eq!(b.post("GB-B1", &gb).await.status, 201);

    let cli = store_for(&a.database);
    use sendonce::store::TenantStore;
    assert!(
        cli.set_allowed_countries(&a.tenant, Some(&["US".to_string()]))
            .await
            .unwrap()
    );
    for (app, key) in [(&a, "GB-A2"), (&b, "GB-B2")] {
        let r = app.post(key, &gb).await;
        assert_eq!(r.status, 400, "GB refused at once");
        assert_eq!(r.slug(), "validation");
    }
}

/// The listener reconnects on its own, and what was cached before the loss
/// is dropped; revocation works again after it.
#[tokio::test]
async fn the_notification_connection_comes_back_and_flushes() {
    let a = spawn_with(TestOptions {
        settings: long_lived_keys(),
        ..TestOptions::default()
    })
    .await;
    connected(&a).await;
    assert_eq!(a.get("/messages/NONE").await.status, 404);
    assert_eq!(a.handle.keys.len(), 1);
    let before = a.handle.notifier.generation();

    let Db::Pg(pool) = &a.db else { unreachable!() };
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "one listening connection per instance");
    eventually("the listener to notice and reconnect", || async {
        (a.handle.notifier.generation() != before && a.handle.notifier.is_connected()).then_some(())
    })
    .await;
    assert!(a.handle.keys.is_empty(), "flushed on reconnect");

    assert_eq!(a.get("/messages/NONE").await.status, 404);
    let cli = store_for(&a.database);
    use sendonce::store::TenantStore;
    assert!(
        cli.revoke_key(key_id(&a).await, a.clock.now())
            .await
            .unwrap()
    );
    answers(&a, "/messages/NONE", 401).await;
}

/// Negative answers are not cached: a key created after a refusal works at
/// once.
async fn a_new_key_works_at_once(backend: Backend) {
    let a = spawn_app_on(backend).await;
    let key = sendonce::apikey::generate();
    let as_new = |k: &str| {
        a.request(reqwest::Method::GET, "/messages/NONE")
            .bearer_auth(k.to_string())
            .send()
    };
    assert_eq!(as_new(&key.secret).await.unwrap().status(), 401);
    assert!(
        a.handle
            .store
            .add_key(&a.tenant, &key.stored)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(as_new(&key.secret).await.unwrap().status(), 404);
}

/// A replay is answered from memory: the row's stored response changed
/// behind the service's back is not what comes back, the frozen one is.
async fn a_replay_comes_from_memory(backend: Backend) {
    let a = spawn_app_on(backend).await;
    if backend == Backend::Postgres {
        // Connecting flushes the caches: let that happen first.
        connected(&a).await;
    }
    let body = sms("+14155550100", "code 1234");
    let first = a.post("R1", &body).await;
    assert_eq!(first.status, 201);
    assert_eq!(a.handle.replays.len(), 1);
    let sql = "UPDATE messages SET response_body = response_body || response_body";
    match &a.db {
        Db::Pg(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        Db::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
    }
    .unwrap();
    let again = a.post("R1", &body).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.bytes, first.bytes, "the frozen response, from memory");
    // Another body under the same key is still a 422 from the cache.
    let other = a.post("R1", &sms("+14155550100", "code 9999")).await;
    assert_eq!(other.status, 422);
    assert_eq!(a.mock.call_count(), 1);
}

/// After a purge the key is new again, on the instance that cached its
/// response and (Postgres) on another one that did too.
async fn a_purged_key_is_new_again_everywhere(backend: Backend) {
    let a = spawn_app_on(backend).await;
    let b = if backend == Backend::Postgres {
        let b = second(&a, test_settings()).await;
        connected(&a).await;
        connected(&b).await;
        Some(b)
    } else {
        None
    };
    let body = sms("+14155550100", "code 1234");
    let first = a.post("P1", &body).await;
    assert_eq!(first.status, 201);
    for app in std::iter::once(&a).chain(b.iter()) {
        let replay = app.post("P1", &body).await;
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(app.handle.replays.len(), 1, "cached");
    }

    // A purge with a retention short enough to take P1 (the instances keep
    // their 30 days: only the purge's notification can drop the entries).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = Purger::new(
        a.handle.store.clone(),
        a.clock.clone(),
        Duration::from_millis(1),
        Duration::from_secs(3600),
    )
    .with_notifier(a.handle.notifier.clone())
    .purge_now()
    .await
    .unwrap();
    assert_eq!(purged, 1);
    assert!(a.handle.replays.is_empty());
    if let Some(b) = &b {
        eventually("b to hear of the purge", || async {
            b.handle.replays.is_empty().then_some(())
        })
        .await;
    }
    let new = a.post("P1", &body).await;
    assert_eq!(new.status, 201);
    assert_eq!(new.header("idempotent-replayed"), None, "new again on a");
    if let Some(b) = &b {
        // Purge again (a's new P1 too), then b sends it anew as well.
        let purged = Purger::new(
            b.handle.store.clone(),
            b.clock.clone(),
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )
        .purge_now()
        .await
        .unwrap();
        assert_eq!(purged, 1);
        eventually("a to hear of b's purge", || async {
            a.handle.replays.is_empty().then_some(())
        })
        .await;
        let new = b.post("P1", &body).await;
        assert_eq!(new.status, 201);
        assert_eq!(new.header("idempotent-replayed"), None, "new again on b");
    }
    let sends = if b.is_some() { 3 } else { 2 };
    assert_eq!(a.mock.call_count(), sends);
}

on_both_backends!(
    a_new_key_works_at_once,
    a_replay_comes_from_memory,
    a_purged_key_is_new_again_everywhere,
);
