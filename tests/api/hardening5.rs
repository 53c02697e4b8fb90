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

/// Finding 5: a test key never holds `admin` (refused when it is made)
/// and, one stored before that was refused, never uses it: it cannot list
/// live tenants, mint a live key, or disable its own live tenant.
async fn a_test_key_has_no_admin_powers(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let admin = crate::access::key_with(&app, Scopes::ALL, Some("ops")).await;
    let keys = format!("/admin/tenants/{}/keys", app.tenant);
    let minted = answer(
        app.request(Method::POST, &keys)
            .bearer_auth(&admin)
            .json(&json!({"scopes": ["send", "read", "admin"], "test": true}))
            .send()
            .await
            .expect("POST key"),
    )
    .await;
    assert_eq!(
        (minted.status, minted.slug()),
        (400, "validation".into()),
        "{}",
        String::from_utf8_lossy(&minted.bytes)
    );
    assert_eq!(minted.json()["errors"][0]["field"], "scopes");
    assert!(
        minted.json()["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("test")),
        "{}",
        minted.json()
    );

    // One stored with `admin` anyway (before the refusal): a test key made
    // with the default scopes, then given every scope in the database.
    let made = answer(
        app.request(Method::POST, &keys)
            .bearer_auth(&admin)
            .json(&json!({"test": true}))
            .send()
            .await
            .expect("POST key"),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));
    let test_key = made.json()["key"].as_str().expect("key").to_string();
    let hash = sendonce::apikey::hash(&test_key);
    let all = Scopes::ALL.to_stored();
    match &app.db {
        Db::Pg(p) => sqlx::query("UPDATE api_keys SET scopes = $1 WHERE key_hash = $2")
            .bind(&all)
            .bind(&hash)
            .execute(p)
            .await
            .map(|_| ()),
        Db::Sqlite(p) => sqlx::query("UPDATE api_keys SET scopes = $1 WHERE key_hash = $2")
            .bind(&all)
            .bind(&hash)
            .execute(p)
            .await
            .map(|_| ()),
    }
    .expect("scopes set");
    let with_test_key = |method: Method, path: String, body: Option<serde_json::Value>| {
        let mut r = app.request(method, &path).bearer_auth(&test_key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move { answer(r.send().await.expect("request")).await }
    };
    let listed = with_test_key(Method::GET, "/admin/tenants".into(), None).await;
    let minted = with_test_key(
        Method::POST,
        keys.clone(),
        Some(json!({"scopes": ["send", "admin"]})),
    )
    .await;
    let disabled = with_test_key(
        Method::PATCH,
        format!("/admin/tenants/{}", app.tenant),
        Some(json!({"disabled": true})),
    )
    .await;
    for (what, a) in [("list", &listed), ("mint", &minted), ("disable", &disabled)] {
        assert_eq!(
            (a.status, a.slug()),
            (403, "insufficient-scope".into()),
            "{what}: {}",
            String::from_utf8_lossy(&a.bytes)
        );
        assert!(
            a.json()["detail"]
                .as_str()
                .is_some_and(|d| d.contains("test-mode")),
            "{what} says why: {}",
            a.json()
        );
    }
    // The live tenant still works.
    assert_eq!(app.get("/messages/none").await.status, 404);
}

/// Finding 9: a message that fails over is charged at the price of the
/// provider that sends it, in its cost and in the tenant's spend counters:
/// `http` (0.01) refuses everything, `simulated` (1.00) sends.
async fn a_failover_is_charged_at_the_senders_price(backend: Backend) {
    let mut settings = test_settings();
    settings.prices = std::sync::Arc::new(
        sendonce::spend::Prices::parse(
            "country,provider,price_per_segment,currency\n\
             *,http,0.01,USD\n\
             *,simulated,1.00,USD\n",
        )
        .expect("prices"),
    );
    let app = spawn_with(TestOptions {
        backend,
        settings,
        fallbacks: vec![std::sync::Arc::new(
            sendonce::provider::SimulatedProvider::default(),
        )],
        ..TestOptions::default()
    })
    .await;
    let admin = crate::access::key_with(&app, Scopes::ALL, Some("ops")).await;
    let capped = answer(
        app.request(Method::PATCH, &format!("/admin/tenants/{}", app.tenant))
            .bearer_auth(&admin)
            .json(&json!({"spend_caps": {"daily": "100.00"}}))
            .send()
            .await
            .expect("PATCH"),
    )
    .await;
    assert_eq!(
        capped.status,
        200,
        "{}",
        String::from_utf8_lossy(&capped.bytes)
    );
    for _ in 0..5 {
        app.mock.push([testkit::mock_provider::Behaviour::Fail {
            status: 401,
            body: json!({"message": "bad credentials"}),
            retry_after: None,
        }]);
    }
    for i in 0..5 {
        let key = format!("failover-{i}");
        let a = app.post(&key, &sms("+14155550100", "hello")).await;
        assert!(
            matches!(a.status, 201 | 202),
            "{}",
            String::from_utf8_lossy(&a.bytes)
        );
        let m = eventually("the message to be sent", || async {
            let m = app.get(&format!("/messages/{key}")).await.json();
            (m["status"] == "sent" || m["status"] == "delivered").then_some(m)
        })
        .await;
        assert_eq!(m["provider"], "simulated", "{m}");
        assert_eq!(m["cost"]["amount"], "1.00", "{m}");
    }
    let spent = app
        .db
        .count("SELECT CAST(COALESCE(MAX(spent_micros), 0) AS BIGINT) FROM tenant_spend")
        .await;
    assert_eq!(spent, 5_000_000, "the daily counter holds what was sent");
    let costs = app
        .db
        .count("SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM messages")
        .await;
    assert_eq!(costs, 5_000_000);
}

on_both_backends!(
    a_failover_is_charged_at_the_senders_price,
    a_test_key_has_no_admin_powers,
    the_console_tells_test_mode_by_the_keys_record,
    a_bootstrap_key_rotation_is_audited,
    sender_list_edits_are_audited,
    revoking_a_revoked_key_writes_no_second_row,
);

/// A receipt sink that holds every receipt until the test lets it go,
/// counting how many it holds at once.
struct HeldReceipts {
    gate: tokio::sync::Semaphore,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    taken: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl sendonce::provider::receipts::ReceiptSink for HeldReceipts {
    async fn take(
        &self,
        _provider: &'static str,
        _receipt: sendonce::provider::receipts::Receipt,
        _status: Option<sendonce::domain::Status>,
    ) -> Result<(), String> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        let permit = self.gate.acquire().await.map_err(|e| e.to_string())?;
        permit.forget();
        self.now.fetch_sub(1, SeqCst);
        self.taken.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// Finding 3: a hostile SMSC flooding `deliver_sm` gets at most the
/// session's window of them handled at once: the rest wait in the socket
/// (back-pressure), not as tasks holding their bodies. Every one is still
/// taken once the sink moves.
#[tokio::test]
async fn a_deliver_sm_flood_is_held_to_the_window() {
    use sendonce::provider::Provider;
    use sendonce::provider::smpp::pdu::{self, id};
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const FLOOD: usize = 2_000;
    const WINDOW: usize = 8;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("addr");
    let smsc = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.expect("accept");
        let (mut read, mut write) = sock.into_split();
        let mut head = [0u8; 16];
        read.read_exact(&mut head).await.expect("bind");
        let h = pdu::header(&head).expect("header");
        let mut body = vec![0u8; h.command_length as usize - 16];
        read.read_exact(&mut body).await.expect("bind body");
        assert_eq!(h.command_id, id::BIND_TRANSCEIVER);
        write
            .write_all(&pdu::encode(
                id::BIND_TRANSCEIVER_RESP,
                0,
                h.sequence,
                &pdu::id_body("smsc"),
            ))
            .await
            .expect("bind_resp");
        // Whatever the ESME answers is read and dropped.
        tokio::spawn(async move {
            let mut sink = vec![0u8; 64 * 1024];
            while read.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        for n in 0..FLOOD {
            let text = format!(
                "id:flood-{n} sub:001 dlvrd:001 submit date:2601011200 done date:2601011201 stat:DELIVRD err:000 text:"
            );
            let body = pdu::Submit {
                source_addr: "+14155550100".into(),
                destination_addr: "sendonce".into(),
                esm_class: pdu::ESM_RECEIPT,
                registered_delivery: 0,
                data_coding: 0,
                short_message: text.into_bytes(),
            }
            .body();
            let seq = u32::try_from(n).expect("small") + 1;
            if write
                .write_all(&pdu::encode(id::DELIVER_SM, 0, seq, &body))
                .await
                .is_err()
            {
                return;
            }
        }
        // Held open until the test ends.
        std::future::pending::<()>().await;
    });
    let mut s = sendonce::provider::smpp::SmppSettings::new(
        &addr.ip().to_string(),
        addr.port(),
        "sendonce",
        "secret",
    );
    s.window = WINDOW;
    let provider = sendonce::provider::smpp::SmppProvider::new(s);
    let sink = std::sync::Arc::new(HeldReceipts {
        gate: tokio::sync::Semaphore::new(0),
        now: Default::default(),
        most: Default::default(),
        taken: Default::default(),
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let running = provider
        .start(sendonce::provider::ProviderRuntime {
            stop: stop.clone(),
            receipts: sink.clone(),
        })
        .expect("an SMPP provider runs a session");
    // The sink holds every receipt: the session fills its window.
    within(
        std::time::Duration::from_secs(10),
        "the window to fill",
        || async { (sink.now.load(SeqCst) >= WINDOW).then_some(()) },
    )
    .await;
    // Then let them through a few at a time: each release makes room for
    // one more, never more than the window at once.
    while sink.taken.load(SeqCst) < FLOOD {
        sink.gate.add_permits(WINDOW);
        let before = sink.taken.load(SeqCst);
        within(
            std::time::Duration::from_secs(10),
            "receipts to be taken",
            || async { (sink.taken.load(SeqCst) >= (before + WINDOW).min(FLOOD)).then_some(()) },
        )
        .await;
        assert!(
            sink.most.load(SeqCst) <= WINDOW,
            "{} deliver_sm handled at once (window {WINDOW})",
            sink.most.load(SeqCst)
        );
    }
    assert_eq!(sink.taken.load(SeqCst), FLOOD, "every receipt taken");
    stop.cancel();
    smsc.abort();
    running.abort();
}
