//! Issue 42, item 1: numbers written the way a Gulf shop writes them.
//! With the tenant's `home_country` set, a national number (`0501234567`),
//! the `00` international prefix (`00966501234567`) and a country code
//! without `+` (`966501234567`) are read as libphonenumber reads them for
//! that country, on every way in, and stored and answered in E.164; with no
//! home country the refusal says what to add. A verification check takes
//! Arabic-Indic and Eastern Arabic-Indic digits and spaces around the code,
//! and is counted once.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::*;

const E164: &str = "+966501234567";
const WRITTEN: [&str; 4] = [
    "0501234567",
    "966501234567",
    "00966501234567",
    "050 123 4567",
];

async fn home(app: &TestApp, country: Option<&str>) {
    let (store, _) = open_store(&app.database, std::time::Duration::from_secs(5));
    assert!(
        store
            .set_home_country(&app.tenant, country.map(str::to_string))
            .await
            .expect("home country")
    );
}

async fn call(app: &TestApp, method: Method, path: &str, key: Option<&str>, body: Value) -> Answer {
    let mut req = app
        .request(method, path)
        .bearer_auth(&app.api_key)
        .json(&body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    answer(req.send().await.expect("request")).await
}

fn text(a: &Answer) -> String {
    String::from_utf8_lossy(&a.bytes).into_owned()
}

async fn national_numbers_are_read_in_the_home_country(backend: Backend) {
    let app = spawn_app_on(backend).await;
    home(&app, Some("SA")).await;
    for (i, to) in WRITTEN.iter().enumerate() {
        let a = app
            .post(&format!("m-{i}"), &sms(to, "Order confirmed"))
            .await;
        assert_eq!(a.status / 100, 2, "{to}: {}", text(&a));
        assert_eq!(a.json()["to"], E164, "{to}");
    }
    eventually("the provider to get the E.164 number", || async {
        app.mock
            .calls()
            .iter()
            .any(|c| c.body["to"] == E164)
            .then_some(())
    })
    .await;
    assert!(app.mock.calls().iter().all(|c| c.body["to"] == E164));

    let b = call(
        &app,
        Method::POST,
        "/messages/batch",
        None,
        json!({"messages": [{"idempotency_key": "b-1", "to": "00966501234568", "body": "hi"}]}),
    )
    .await;
    assert_eq!(b.status, 200, "{}", text(&b));
    assert_eq!(b.json()["results"][0]["status"], 202, "{}", text(&b));
    let m = app.get("/messages/b-1").await;
    assert_eq!(m.json()["to"], "+966501234568");

    let v = call(
        &app,
        Method::POST,
        "/verifications",
        Some("v-1"),
        json!({"to": "0501234569"}),
    )
    .await;
    assert_eq!(v.status, 201, "{}", text(&v));
    assert_eq!(v.json()["to"], "+966501234569");

    let o = call(
        &app,
        Method::POST,
        "/opt-outs",
        None,
        json!({"number": "0501234570"}),
    )
    .await;
    assert_eq!(o.status, 201, "{}", text(&o));
    assert_eq!(o.json()["number"], "+966501234570");
    let d = call(
        &app,
        Method::DELETE,
        "/opt-outs/0501234570",
        None,
        json!({}),
    )
    .await;
    assert_eq!(d.status, 204, "{}", text(&d));
}

async fn without_a_home_country_the_refusal_says_what_to_add(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let a = app.post("m-1", &sms("966501234567", "hi")).await;
    assert_eq!(a.status, 400, "{}", text(&a));
    assert!(text(&a).contains("+966501234567"), "{}", text(&a));
    let a = app.post("m-2", &sms("0501234567", "hi")).await;
    assert_eq!(a.status, 400, "{}", text(&a));
    assert!(text(&a).contains("home_country"), "{}", text(&a));
    assert!(text(&a).contains("country code"), "{}", text(&a));
    let v = call(
        &app,
        Method::POST,
        "/verifications",
        Some("v"),
        json!({"to": "0501234567"}),
    )
    .await;
    assert_eq!(v.status, 400, "{}", text(&v));
    assert!(text(&v).contains("home_country"), "{}", text(&v));
}

/// `123` in Arabic-Indic (U+0660..) or Eastern Arabic-Indic (U+06F0..)
/// digits.
fn arabic(code: &str, zero: char) -> String {
    code.chars()
        .map(|c| char::from_u32(zero as u32 + c.to_digit(10).expect("a digit")).expect("digit"))
        .collect()
}

async fn a_check_reads_arabic_digits_and_spaces_and_counts_once(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let to = "+14155550100";
    let v = call(
        &app,
        Method::POST,
        "/verifications",
        Some("v"),
        json!({"to": to}),
    )
    .await;
    assert_eq!(v.status, 201, "{}", text(&v));
    let id = v.json()["id"].as_str().expect("id").to_string();
    let body = eventually("the code's SMS", || async {
        app.mock
            .calls()
            .into_iter()
            .find(|c| c.body["to"] == to)
            .and_then(|c| c.body["body"].as_str().map(str::to_string))
    })
    .await;
    let code: String = body.chars().filter(char::is_ascii_digit).collect();
    let wrong: String = code
        .chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    let path = format!("/verifications/{id}/check");
    let bad = call(
        &app,
        Method::POST,
        &path,
        None,
        json!({"code": arabic(&wrong, '\u{06F0}')}),
    )
    .await;
    assert_eq!(bad.status, 200, "{}", text(&bad));
    assert_eq!(bad.json()["valid"], false);
    assert_eq!(bad.json()["checks_remaining"], 4, "one check, counted once");
    let good = call(
        &app,
        Method::POST,
        &path,
        None,
        json!({"code": format!("  {} ", arabic(&code, '\u{0660}'))}),
    )
    .await;
    assert_eq!(good.status, 200, "{}", text(&good));
    assert_eq!(good.json()["valid"], true, "{}", text(&good));
    assert_eq!(good.json()["status"], "approved");
}

on_both_backends!(
    national_numbers_are_read_in_the_home_country,
    without_a_home_country_the_refusal_says_what_to_add,
    a_check_reads_arabic_digits_and_spaces_and_counts_once,
);
