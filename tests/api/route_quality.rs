//! Routes that heal themselves (issue 43), end to end on both backends,
//! on a hand-moved clock: a route's first provider that stops reporting
//! deliveries moves down once it is measured slow, the other provider takes
//! new messages (the demoted one keeps its floor), it comes back once it
//! measures well again, a pin holds whatever quality says, two instances
//! agree on the order, and every message is created once, counted at two
//! mocks that do not de-duplicate.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use sendonce::clock::Clock;
use sendonce::delivery::destinations::Routes;
use sendonce::provider::twilio::TwilioProvider;
use sendonce::scopes::Scopes;
use serde_json::{Value, json};
use testkit::mock_provider::{MockProvider, ReceiptConfig, ReceiptOrder};

use crate::helpers::*;

const SECRET: &str = "receipt-secret-0123456789";

fn routes(table: &str) -> Routes {
    Routes::parse(table, |name| {
        ["twilio", "http"].into_iter().find(|known| *known == name)
    })
    .expect("routes")
}

struct Pair {
    /// Twilio's mock is `app.mock`.
    app: TestApp,
    /// The `http` provider's mock.
    http: MockProvider,
    admin: String,
}

fn reported(app: &TestApp) -> ReceiptConfig {
    ReceiptConfig {
        order: ReceiptOrder::InOrder,
        http_url: Some(format!("{}/providers/http/status", app.base)),
        http_secret: Some(SECRET.into()),
        ..ReceiptConfig::default()
    }
}

/// An instance routing `+966` to `http` (at a mock of its own), then
/// Twilio (at `app.mock`, reporting every delivery at once), measured
/// with 10 samples and a floor of one message in four.
async fn spawn_pair(
    backend: Backend,
    clock: Clock,
    database: Option<String>,
    api_key: Option<String>,
    shared_admin: Option<String>,
) -> Pair {
    let (http, http_provider) = crate::failover::secondary().await;
    let mut settings = test_settings();
    settings.provider.routes = Some(routes("+966=http,twilio"));
    let q = &mut settings.provider.quality;
    q.thresholds.min_samples = 10;
    q.thresholds.floor = 0.25;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        clock,
        database,
        api_key,
        provider: Some(Box::new(move |mock, app, s| {
            s.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([
                ("TWILIO_AUTH_TOKEN", crate::twilio::AUTH_TOKEN),
                ("SENDONCE_RECEIPT_SECRET", SECRET),
            ])
            .expect("receipt routes");
            s.server.public_url = Some(app.to_string());
            Arc::new(
                TwilioProvider::new(crate::twilio::settings(
                    mock,
                    Some(format!("{app}/providers/twilio/status")),
                ))
                .expect("twilio provider"),
            )
        })),
        fallbacks: vec![http_provider],
        ..TestOptions::default()
    })
    .await;
    app.mock.set_receipts(ReceiptConfig {
        order: ReceiptOrder::InOrder,
        ..ReceiptConfig::default()
    });
    // A second instance shares the first one's tenant and keys.
    let admin = match &shared_admin {
        Some(a) => a.clone(),
        None => crate::access::key_with(&app, Scopes::ALL, Some("ops")).await,
    };
    Pair { app, http, admin }
}

const TO: &str = "+96650123";

fn number(i: usize) -> String {
    format!("{TO}{i:04}")
}

async fn send_many(app: &TestApp, from: usize, to: usize) {
    for i in from..to {
        let a = app
            .post(
                &format!("q-{i}"),
                &sms(&number(i), &format!("Order {i} confirmed")),
            )
            .await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
    }
}

/// Every message was created once, at one mock or the other.
fn each_once(p: &Pair, from: usize, to: usize) {
    for i in from..to {
        let (n, body) = (number(i), format!("Order {i} confirmed"));
        let made = p.app.mock.deliveries_to(&n, &body) + p.http.deliveries_to(&n, &body);
        assert_eq!(made, 1, "message {i} created {made} times");
    }
}

async fn route_view(app: &TestApp, admin: &str) -> Value {
    let a = answer(
        app.request(Method::GET, "/routes")
            .bearer_auth(admin)
            .send()
            .await
            .expect("GET /routes"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    a.json()["data"][0].clone()
}

fn order(route: &Value) -> Vec<String> {
    route["providers"]
        .as_array()
        .expect("providers")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn delivered_count(app: &TestApp, want: i64) {
    eventually(&format!("{want} messages delivered"), || async {
        (app.db
            .count("SELECT count(*) FROM messages WHERE status = 'delivered'")
            .await
            >= want)
            .then_some(())
    })
    .await;
}

async fn a_provider_that_stops_reporting_moves_down_and_comes_back(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let p = spawn_pair(backend, clock.clone(), None, None, None).await;
    // http accepts every message and reports none.
    let before = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&before), ["http", "twilio"], "{before}");

    send_many(&p.app, 0, 40).await;
    // One in four starts on Twilio (the floor), the rest on http.
    assert_eq!(p.http.created(), 30);
    assert_eq!(p.app.mock.created(), 10);
    delivered_count(&p.app, 10).await;
    // Within SLOW_AFTER nothing is judged yet.
    p.app.handle.quality.evaluate().await.expect("evaluate");
    assert_eq!(
        order(&route_view(&p.app, &p.admin).await),
        ["http", "twilio"]
    );

    // Six minutes on: http's 30 are all slow.
    clock.advance(Duration::from_secs(6 * 60));
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let shifted = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&shifted), ["twilio", "http"], "{shifted}");
    let http = &shifted["providers"][1]["quality"];
    assert_eq!(http["verdict"], "bad", "{shifted}");
    assert_eq!(http["slow"], 30, "{shifted}");
    assert_eq!(
        shifted["providers"][0]["quality"]["delivery_rate"], 1.0,
        "{shifted}"
    );
    let reason = shifted["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("http moved down: 100% of its 30 messages had no delivery report 5m"),
        "{reason}"
    );
    // The shift is in the audit log, with its reason.
    let audit = answer(
        p.app
            .request(Method::GET, "/admin/audit")
            .bearer_auth(&p.admin)
            .send()
            .await
            .expect("audit"),
    )
    .await
    .json();
    let shift = audit["data"]
        .as_array()
        .expect("audit rows")
        .iter()
        .find(|r| r["action"] == "route.shift")
        .unwrap_or_else(|| panic!("no route.shift in {audit}"))
        .clone();
    assert_eq!(shift["via"], "quality");
    assert_eq!(shift["target"], "route +966");
    assert_eq!(shift["detail"]["to"], json!(["twilio", "http"]));

    // The console's routes page says the same, for an admin key only.
    let mut browser = crate::console::Browser::new(&p.app);
    browser.sign_in(&p.admin).await;
    let page = browser.get("/console/routes").await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8_lossy(&page.bytes).to_string();
    assert!(html.contains("Route +966"), "{html}");
    assert!(html.contains("twilio → http"), "{html}");
    assert!(
        html.contains("shifted by quality; configured: http → twilio"),
        "{html}"
    );
    assert!(
        html.contains("had no delivery report 5m after they were sent"),
        "{html}"
    );
    assert!(html.contains("<svg"), "{html}");
    let mut reader = crate::console::Browser::new(&p.app);
    reader.sign_in(&p.app.api_key).await;
    assert_eq!(reader.get("/console/routes").await.status, 403);

    // Within the cooldown nothing changes, whatever is measured.
    p.http.set_receipts(reported(&p.app));
    send_many(&p.app, 40, 80).await;
    // Now Twilio takes three in four; http keeps its floor (and delivers).
    assert_eq!(p.app.mock.created(), 40);
    assert_eq!(p.http.created(), 40);
    delivered_count(&p.app, 50).await;
    clock.advance(Duration::from_secs(60));
    p.app.handle.quality.evaluate().await.expect("evaluate");
    assert_eq!(
        order(&route_view(&p.app, &p.admin).await),
        ["twilio", "http"]
    );

    // Past the cooldown, with the slow messages out of the window: http
    // measures well (10 of 10 delivered at once) and is back in its place.
    clock.advance(Duration::from_secs(10 * 60));
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let back = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&back), ["http", "twilio"], "{back}");
    assert_eq!(
        back["reason"], "http measures well again: back in its place",
        "{back}"
    );

    // Nothing was ever sent twice, nor moved because of quality.
    each_once(&p, 0, 80);
    let moved = p
        .app
        .db
        .count("SELECT count(*) FROM message_events WHERE kind = 'failover'")
        .await;
    assert_eq!(moved, 0);
}

async fn a_pin_holds_and_two_instances_agree(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let p = spawn_pair(backend, clock.clone(), None, None, None).await;
    let pin = |providers: Value| {
        p.app
            .request(Method::PUT, "/routes/%2B966/pin")
            .bearer_auth(&p.admin)
            .json(&json!({ "providers": providers }))
            .send()
    };
    // Bad input: a 4xx that says what to do, nothing changed.
    let a = answer(pin(json!(["twilio"])).await.expect("pin")).await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.bytes));
    assert!(
        a.json()["errors"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("each of the route's providers once"),
        "{}",
        a.json()
    );
    let a = answer(
        p.app
            .request(Method::PUT, "/routes/%2B1/pin")
            .bearer_auth(&p.admin)
            .json(&json!({ "providers": ["http"] }))
            .send()
            .await
            .expect("pin"),
    )
    .await;
    assert_eq!(a.status, 404);
    // A key without the admin scope may not look or pin.
    let a = p.app.get("/routes").await;
    assert_eq!(a.status, 403, "{}", String::from_utf8_lossy(&a.bytes));

    let a = answer(pin(json!(["http", "twilio"])).await.expect("pin")).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.bytes));
    assert_eq!(a.json()["pinned"], true);

    // http slow, but pinned: no shift, and no floor either.
    send_many(&p.app, 0, 20).await;
    assert_eq!(p.http.created(), 20);
    assert_eq!(p.app.mock.created(), 0);
    clock.advance(Duration::from_secs(6 * 60));
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let r = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&r), ["http", "twilio"], "{r}");
    assert_eq!(r["pinned"], true);
    assert_eq!(r["providers"][0]["quality"]["verdict"], "bad", "{r}");

    // Unpinned: quality decides on its next beat.
    let a = answer(
        p.app
            .request(Method::DELETE, "/routes/%2B966/pin")
            .bearer_auth(&p.admin)
            .send()
            .await
            .expect("unpin"),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["pinned"], false);
    p.app.handle.quality.evaluate().await.expect("evaluate");
    assert_eq!(
        order(&route_view(&p.app, &p.admin).await),
        ["twilio", "http"]
    );

    // A second instance on the same database takes the same order on its
    // beat, and its new messages start on Twilio.
    let second = spawn_pair(
        backend,
        clock.clone(),
        Some(p.app.database.clone()),
        Some(p.app.api_key.clone()),
        Some(p.admin.clone()),
    )
    .await;
    second
        .app
        .handle
        .quality
        .evaluate()
        .await
        .expect("evaluate");
    assert_eq!(
        order(&route_view(&second.app, &p.admin).await),
        ["twilio", "http"]
    );
    let a = second
        .app
        .post("q-second", &sms(&number(99), "Order 99 confirmed"))
        .await;
    assert_eq!(a.status, 201);
    assert_eq!(a.json()["provider"], "twilio", "{}", a.json());
    assert_eq!(
        second
            .app
            .mock
            .deliveries_to(&number(99), "Order 99 confirmed"),
        1
    );
    assert_eq!(second.http.created() + p.http.created(), 20);
    each_once(&p, 0, 20);

    let audit = answer(
        p.app
            .request(Method::GET, "/admin/audit")
            .bearer_auth(&p.admin)
            .send()
            .await
            .expect("audit"),
    )
    .await
    .json();
    let actions: Vec<&str> = audit["data"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["action"].as_str())
        .filter(|a| a.starts_with("route."))
        .collect();
    // Newest first: the shift after the unpin, the unpin, the pin.
    assert_eq!(
        actions,
        ["route.shift", "route.unpin", "route.pin"],
        "{audit}"
    );
}

async fn a_provider_delivering_half_moves_down(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let p = spawn_pair(backend, clock.clone(), None, None, None).await;
    // http reports its first half delivered, its second half undelivered.
    p.http.set_receipts(reported(&p.app));
    send_many(&p.app, 0, 20).await;
    p.http.set_receipts(ReceiptConfig {
        final_status: Some("undelivered".into()),
        ..reported(&p.app)
    });
    send_many(&p.app, 20, 40).await;
    assert_eq!(p.http.created(), 30);
    assert_eq!(p.app.mock.created(), 10);
    eventually("every receipt in", || async {
        (p.app
            .db
            .count("SELECT count(*) FROM messages WHERE status IN ('delivered', 'undelivered')")
            .await
            == 40)
            .then_some(())
    })
    .await;
    // Nothing judged slow (every report came at once): the delivery rate
    // alone moves it, with no clock moved.
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let r = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&r), ["twilio", "http"], "{r}");
    assert_eq!(
        r["reason"], "http moved down: it delivered 50% of 30 reported messages, twilio 100%",
        "{r}"
    );
    assert_eq!(r["providers"][1]["quality"]["undelivered"], 15, "{r}");
    each_once(&p, 0, 40);
}

async fn a_provider_delivering_after_six_minutes_moves_down(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let p = spawn_pair(backend, clock.clone(), None, None, None).await;
    // http reports nothing at once...
    send_many(&p.app, 0, 40).await;
    assert_eq!(p.http.created(), 30);
    // ...and every delivery six minutes later, as its reports arrive.
    clock.advance(Duration::from_secs(6 * 60));
    for i in 0..30 {
        let a = answer(
            p.app
                .request(Method::POST, "/providers/http/status")
                .header("X-Receipt-Secret", SECRET)
                .json(&json!({
                    "id": format!("prov_{}", i + 1),
                    "status": "delivered",
                    "event_id": format!("late-{i}"),
                }))
                .send()
                .await
                .expect("receipt"),
        )
        .await;
        assert!(a.status < 300, "{}", String::from_utf8_lossy(&a.bytes));
    }
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let r = route_view(&p.app, &p.admin).await;
    let http = &r["providers"][1]["quality"];
    // Every one delivered, every one late: slow, and p50 past 5 minutes.
    assert_eq!(http["delivered"], 30, "{r}");
    assert_eq!(http["delivery_rate"], 1.0, "{r}");
    assert_eq!(http["slow"], 30, "{r}");
    assert_eq!(http["delivery_seconds"]["p50"], 600, "{r}");
    assert_eq!(order(&r), ["twilio", "http"], "{r}");
    each_once(&p, 0, 40);
}

/// The code sent to `to` at either mock, once it is there, and where.
async fn code_to(p: &Pair, to: &str) -> (String, &'static str) {
    eventually(&format!("a code to {to}"), || async {
        for (name, mock) in [("twilio", &p.app.mock), ("http", &p.http)] {
            let found = mock.calls().into_iter().find_map(|c| {
                let b = &c.body;
                let dest = b["to"].as_str().or(b["To"].as_str())?;
                let text = b["body"].as_str().or(b["Body"].as_str())?;
                (dest == to).then(|| {
                    text.chars()
                        .filter(char::is_ascii_digit)
                        .collect::<String>()
                })
            });
            if let Some(code) = found {
                return Some((code, name));
            }
        }
        None
    })
    .await
}

async fn codes_entered_less_move_a_provider_down(backend: Backend) {
    let clock = Clock::manual(time::OffsetDateTime::now_utc());
    let p = spawn_pair(backend, clock.clone(), None, None, None).await;
    p.http.set_receipts(reported(&p.app));
    let mut entered = std::collections::HashMap::<&str, (u32, u32)>::new();
    for i in 0..60 {
        let to = number(i);
        let a = answer(
            p.app
                .request(Method::POST, "/verifications")
                .bearer_auth(&p.app.api_key)
                .header("Idempotency-Key", format!("v-{i}"))
                .json(&json!({ "to": to }))
                .send()
                .await
                .expect("start"),
        )
        .await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
        let id = a.json()["id"].as_str().expect("id").to_string();
        let (code, via) = code_to(&p, &to).await;
        let e = entered.entry(via).or_default();
        e.0 += 1;
        // Every code sent through Twilio is entered; one in three of
        // http's.
        if via == "twilio" || e.0.is_multiple_of(3) {
            e.1 += 1;
            let c = answer(
                p.app
                    .request(Method::POST, &format!("/verifications/{id}/check"))
                    .bearer_auth(&p.app.api_key)
                    .json(&json!({ "code": code }))
                    .send()
                    .await
                    .expect("check"),
            )
            .await;
            assert_eq!(c.json()["status"], "approved", "{}", c.json());
        }
    }
    // One in four started on Twilio (the floor).
    assert_eq!(entered["twilio"].0, 15, "{entered:?}");
    assert_eq!(entered["http"].0, 45, "{entered:?}");
    p.app.handle.quality.evaluate().await.expect("evaluate");
    let r = route_view(&p.app, &p.admin).await;
    assert_eq!(order(&r), ["twilio", "http"], "{r}");
    let http = &r["providers"][1]["quality"];
    assert_eq!(http["codes"], 45, "{r}");
    assert_eq!(http["approved"], 15, "{r}");
    assert_eq!(r["providers"][0]["quality"]["conversion"], 1.0, "{r}");
    let reason = r["reason"].as_str().unwrap_or_default();
    assert_eq!(
        reason, "http moved down: 33% of its 45 codes were entered, twilio's 100%",
        "{r}"
    );
    // One code per verification, each created once.
    for i in 0..60 {
        let to = number(i);
        let made = p.app.mock.created_to(&to) + p.http.created_to(&to);
        assert_eq!(made, 1, "{to}");
    }
}

on_both_backends!(
    a_provider_that_stops_reporting_moves_down_and_comes_back,
    a_pin_holds_and_two_instances_agree,
    codes_entered_less_move_a_provider_down,
    a_provider_delivering_half_moves_down,
    a_provider_delivering_after_six_minutes_moves_down,
);
