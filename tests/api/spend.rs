//! Spend (issue 27): each message's estimated cost stored and shown, and a
//! tenant's caps decided by the database in the insert's transaction: many
//! concurrent sends against a cap that allows exactly N put N messages on
//! the (non-deduplicating) mock, not more; a replay is neither charged nor
//! refused; a batch is refused per item from the cap on.

use std::sync::Arc;
use std::time::Duration;

use sendonce::scopes::Scopes;
use sendonce::spend::SpendCaps;
use serde_json::{Value, json};

use crate::helpers::*;

/// The default price table charges USD 0.10 a segment.
pub(crate) const PRICE: i64 = 100_000;

/// Sets the caps as an operator does: `PATCH /admin/tenants/{name}` with an
/// admin key; the tenant as shown then carries them.
pub(crate) async fn set_caps(app: &TestApp, caps: SpendCaps) {
    let admin = crate::access::key_with(app, Scopes::ALL, Some("ops")).await;
    let amount = |m: Option<i64>| m.map(sendonce::spend::format_amount);
    let body = json!({"spend_caps": {
        "daily": amount(caps.daily),
        "monthly": amount(caps.monthly),
        "international_daily_messages": caps.international_daily_messages,
    }});
    let path = format!("/admin/tenants/{}", app.tenant);
    let patched = app
        .request(reqwest::Method::PATCH, &path)
        .bearer_auth(&admin)
        .json(&body)
        .send()
        .await
        .expect("PATCH");
    assert_eq!(patched.status(), 200);
    let shown: Value = app
        .request(reqwest::Method::GET, &path)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON");
    let mut want = body["spend_caps"].clone();
    want["currency"] = json!("USD");
    assert_eq!(shown["spend_caps"], want);
    let (store, _) = open_store(&app.database, Duration::from_secs(5));
    assert_eq!(
        store.spend_caps(&app.tenant).await.expect("read"),
        Some(caps)
    );
}

pub(crate) fn daily(n: i64) -> SpendCaps {
    SpendCaps {
        daily: Some(n * PRICE),
        ..SpendCaps::default()
    }
}

/// Seconds from now to the next UTC midnight.
fn to_midnight() -> i64 {
    let now = time::OffsetDateTime::now_utc();
    let next = now
        .date()
        .next_day()
        .expect("a next day")
        .midnight()
        .assume_utc();
    (next - now).whole_seconds()
}

fn assert_refused(a: &Answer, cap: &str) {
    assert_eq!(a.status, 429, "{:?}", a.json());
    assert_eq!(a.slug(), "spend-cap-reached", "{:?}", a.json());
    assert!(
        a.json()["detail"].as_str().unwrap_or("").contains(cap),
        "{:?}",
        a.json()
    );
    let secs: i64 = a
        .header("retry-after")
        .and_then(|s| s.parse().ok())
        .expect("Retry-After");
    assert!(
        (secs - to_midnight()).abs() <= 5,
        "{secs} vs {}",
        to_midnight()
    );
}

async fn concurrent_sends_never_pass_the_cap(backend: Backend) {
    let app = Arc::new(spawn_app_on(backend).await);
    const ALLOWED: i64 = 5;
    set_caps(&app, daily(ALLOWED)).await;
    let sends = (0..24).map(|i| {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            app.post(
                &format!("race-{i}"),
                &sms("+14155550100", &format!("Code {i}")),
            )
            .await
        })
    });
    let mut accepted = 0;
    for s in sends {
        let a = s.await.expect("task");
        match a.status {
            201 | 202 => accepted += 1,
            _ => assert_refused(&a, "daily"),
        }
    }
    assert_eq!(accepted, ALLOWED);
    // Nothing stored for a refusal; exactly N at the provider.
    assert_eq!(app.message_count().await, ALLOWED);
    within(
        Duration::from_secs(10),
        "the accepted sends reach the mock",
        || async { (i64::from(app.mock.created()) == ALLOWED).then_some(()) },
    )
    .await;
    assert_eq!(i64::from(app.mock.stats().created), ALLOWED);
}

async fn a_replay_is_not_charged_nor_refused(backend: Backend) {
    let app = spawn_app_on(backend).await;
    set_caps(&app, daily(1)).await;
    let first = app.post("only", &sms("+14155550101", "Hello")).await;
    assert_eq!(first.status, 201, "{:?}", first.json());
    assert_eq!(
        first.json()["cost"],
        json!({"amount": "0.10", "currency": "USD"})
    );
    // The cap is full: a new send is refused, the replay is answered.
    assert_refused(
        &app.post("second", &sms("+14155550101", "Again")).await,
        "daily",
    );
    let replay = app.post("only", &sms("+14155550101", "Hello")).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.bytes, first.bytes);
    assert_eq!(app.message_count().await, 1);
    assert_eq!(app.mock.created(), 1);
    // The message resource shows its cost.
    let got = app.get("/messages/only").await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.json()["cost"],
        json!({"amount": "0.10", "currency": "USD"})
    );
}

async fn a_batch_is_refused_per_item_from_the_cap_on(backend: Backend) {
    let app = spawn_app_on(backend).await;
    set_caps(&app, daily(3)).await;
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"idempotency_key": format!("b-{i}"), "to": "+14155550102", "body": format!("Batch {i}")}))
        .collect();
    let a = answer(
        app.request(reqwest::Method::POST, "/messages/batch")
            .bearer_auth(&app.api_key)
            .json(&json!({ "messages": items }))
            .send()
            .await
            .expect("batch"),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.json());
    let results = a.json()["results"].as_array().expect("results").clone();
    let statuses: Vec<i64> = results
        .iter()
        .map(|r| r["status"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [202, 202, 202, 429, 429], "{results:?}");
    assert!(a.header("retry-after").is_some());
    within(Duration::from_secs(10), "three sent", || async {
        (app.mock.created() == 3).then_some(())
    })
    .await;
    assert_eq!(app.message_count().await, 3);
    assert_eq!(app.mock.created(), 3);
}

async fn crossing_eighty_percent_writes_one_warning(backend: Backend) {
    let app = spawn_app_on(backend).await;
    set_caps(&app, daily(5)).await;
    for i in 0..5 {
        let a = app
            .post(&format!("w-{i}"), &sms("+14155550103", &format!("W {i}")))
            .await;
        assert_eq!(a.status, 201);
    }
    // Postgres's feed shows a transaction once every older one in the
    // cluster has ended (other tests' included): wait until all five sends
    // show, so every charge's transaction is in the page, then count.
    let feed = eventually("the five sends in the feed", || async {
        let feed = app.get("/events?limit=100").await.json();
        let sent = feed["data"].as_array().map_or(0, |d| {
            d.iter().filter(|e| e["type"] == "message.sent").count()
        });
        (sent == 5).then_some(feed)
    })
    .await;
    let warnings: Vec<Value> = feed["data"]
        .as_array()
        .expect("feed")
        .iter()
        .filter(|e| e["type"] == "tenant.spend_warning")
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{feed:?}");
    let text = warnings[0].to_string();
    assert!(
        text.contains("\"cap\":\"daily\"") && text.contains("\"spent\":\"0.40\""),
        "{text}"
    );
    let metrics = app.get("/metrics").await;
    let body = String::from_utf8_lossy(&metrics.bytes).to_string();
    assert!(
        body.contains("sendonce_spend_cap_events_total{event=\"warning\",cap=\"daily\"} 1"),
        "{body}"
    );
}

async fn international_messages_count_away_from_home(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let (store, _) = open_store(&app.database, Duration::from_secs(5));
    assert!(
        store
            .set_home_country(&app.tenant, Some("GB".into()))
            .await
            .expect("home")
    );
    set_caps(
        &app,
        SpendCaps {
            international_daily_messages: Some(1),
            ..SpendCaps::default()
        },
    )
    .await;
    assert_eq!(
        app.post("us-1", &sms("+14155550104", "One")).await.status,
        201
    );
    assert_refused(
        &app.post("us-2", &sms("+14155550104", "Two")).await,
        "international",
    );
    let home = app.post("gb-1", &sms("+442079460958", "Home")).await;
    assert_eq!(home.status, 201, "{:?}", home.json());
    assert_eq!(app.message_count().await, 2);
}

async fn the_console_shows_spend_against_the_caps(backend: Backend) {
    let app = spawn_app_on(backend).await;
    set_caps(
        &app,
        SpendCaps {
            daily: Some(2 * PRICE),
            monthly: Some(100 * PRICE),
            international_daily_messages: None,
        },
    )
    .await;
    assert_eq!(
        app.post("c-1", &sms("+14155550106", "Console"))
            .await
            .status,
        201
    );
    let mut b = crate::console::Browser::new(&app);
    b.sign_in(&app.api_key).await;
    let page = b.get("/console/overview").await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8(page.bytes.clone()).expect("UTF-8");
    assert!(html.contains("Spend"), "{html}");
    assert!(html.contains("0.10 USD"), "{html}");
    assert!(html.contains("0.20 (50 % used)"), "{html}");
    assert!(html.contains("10.00 (1 % used)"), "{html}");
    assert!(html.contains("no cap"), "{html}");
}

async fn a_cap_set_mid_day_counts_what_was_sent_before(backend: Backend) {
    let app = spawn_app_on(backend).await;
    for i in 0..2 {
        let a = app
            .post(
                &format!("pre-{i}"),
                &sms("+14155550107", &format!("Pre {i}")),
            )
            .await;
        assert_eq!(a.status, 201);
        assert_eq!(a.json()["cost"]["amount"], "0.10");
    }
    set_caps(&app, daily(3)).await;
    assert_eq!(
        app.post("post-0", &sms("+14155550107", "Post 0"))
            .await
            .status,
        201
    );
    assert_refused(
        &app.post("post-1", &sms("+14155550107", "Post 1")).await,
        "daily",
    );
    assert_eq!(app.message_count().await, 3);
}

/// Verification SMS are charged (issue 41, finding 2): a start and each
/// resend get the SMS price and count against the caps in their insert's
/// transaction; past the cap a start or a resend is refused as a message
/// is, and stores nothing.
async fn verification_sms_count_against_the_caps(backend: Backend) {
    let mut settings = test_settings();
    settings.verify.resend_cooldown = Duration::ZERO;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    set_caps(&app, daily(2)).await;
    let post = |path: String, key: &'static str, body: Option<Value>| {
        let mut req = app
            .request(reqwest::Method::POST, &path)
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move { answer(req.send().await.expect("POST")).await }
    };
    let to = json!({"to": "+14155550123"});
    let v = post("/verifications".into(), "ver-a", Some(to.clone())).await;
    assert_eq!(v.status, 201, "{:?}", v.json());
    let id = v.json()["id"].as_str().expect("id").to_string();
    let spent = || async {
        app.db
            .count("SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM messages")
            .await
    };
    assert_eq!(spent().await, PRICE, "the first SMS is charged");
    let r = post(format!("/verifications/{id}/resend"), "res-1", None).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(spent().await, 2 * PRICE, "a resend is charged");
    // The cap (2 SMS) is reached: a resend and a new start are refused.
    let r = post(format!("/verifications/{id}/resend"), "res-2", None).await;
    assert_refused(&r, "daily");
    let v = post("/verifications".into(), "ver-b", Some(to)).await;
    assert_refused(&v, "daily");
    assert_eq!(app.message_count().await, 2, "nothing stored when refused");
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 1);
    let sends = app
        .db
        .count("SELECT CAST(sends AS BIGINT) FROM verifications")
        .await;
    assert_eq!(sends, 2, "a refused resend changed nothing");
    within(Duration::from_secs(10), "two SMS sent", || async {
        (app.mock.created() == 2).then_some(())
    })
    .await;
}

/// A verification's SMS away from the tenant's home country counts against
/// the international cap (issue 41, finding 2); one at home does not.
async fn verification_sms_count_against_the_international_cap(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let (store, _) = open_store(&app.database, Duration::from_secs(5));
    assert!(
        store
            .set_home_country(&app.tenant, Some("GB".into()))
            .await
            .expect("home")
    );
    set_caps(
        &app,
        SpendCaps {
            international_daily_messages: Some(1),
            ..SpendCaps::default()
        },
    )
    .await;
    let start = |key: &'static str, to: &'static str| {
        let req = app
            .request(reqwest::Method::POST, "/verifications")
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&json!({ "to": to }));
        async move { answer(req.send().await.expect("POST")).await }
    };
    let first = start("ver-us-1", "+14155550106").await;
    assert_eq!(first.status, 201, "{:?}", first.json());
    assert_refused(&start("ver-us-2", "+14155550107").await, "international");
    let home = start("ver-gb-1", "+442079460958").await;
    assert_eq!(home.status, 201, "{:?}", home.json());
    assert_eq!(app.db.count("SELECT count(*) FROM verifications").await, 2);
}

on_both_backends!(
    verification_sms_count_against_the_international_cap,
    verification_sms_count_against_the_caps,
    a_cap_set_mid_day_counts_what_was_sent_before,
    the_console_shows_spend_against_the_caps,
    concurrent_sends_never_pass_the_cap,
    a_replay_is_not_charged_nor_refused,
    a_batch_is_refused_per_item_from_the_cap_on,
    crossing_eighty_percent_writes_one_warning,
    international_messages_count_away_from_home,
);

/// Two instances on one Postgres database racing for one cap: together
/// they never pass it.
#[tokio::test]
async fn two_instances_racing_never_pass_the_cap() {
    let a = Arc::new(spawn_app().await);
    let b = Arc::new(
        spawn_with(TestOptions {
            database: Some(a.database.clone()),
            mock: Some((a.mock.clone(), a.mock_url.clone())),
            api_key: Some(a.api_key.clone()),
            ..TestOptions::default()
        })
        .await,
    );
    set_caps(&a, daily(4)).await;
    let sends = (0..20).map(|i| {
        let app = Arc::clone(if i % 2 == 0 { &a } else { &b });
        tokio::spawn(async move {
            app.post(
                &format!("two-{i}"),
                &sms("+14155550105", &format!("Two {i}")),
            )
            .await
            .status
        })
    });
    let mut accepted = 0;
    for s in sends {
        if matches!(s.await.expect("task"), 201 | 202) {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 4);
    within(Duration::from_secs(10), "four sent", || async {
        (a.mock.created() == 4).then_some(())
    })
    .await;
    assert_eq!(a.message_count().await, 4);
}
