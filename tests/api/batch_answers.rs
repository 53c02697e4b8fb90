//! What a batch answer tells an importer re-running a file (issue 26):
//! which items were replays of an earlier request (nothing new went out for
//! them), and, when any item was refused by a limit, how long to wait
//! (`Retry-After` on the answer, besides each item's `retry_after`).

use sendonce::ratelimit::{Limits, Rate};
use serde_json::{Value, json};

use crate::helpers::*;

async fn batch(app: &TestApp, items: Value) -> Answer {
    answer(
        app.request(reqwest::Method::POST, "/messages/batch")
            .bearer_auth(&app.api_key)
            .json(&json!({ "messages": items }))
            .send()
            .await
            .expect("POST /messages/batch"),
    )
    .await
}

fn item(key: &str, to: &str) -> Value {
    json!({ "idempotency_key": key, "to": to, "body": format!("Order {key} confirmed") })
}

async fn replayed_items_are_marked(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let first = batch(&app, json!([item("ORD-1", "+14155550101")])).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["results"][0]["status"], 202);
    assert_eq!(first.json()["results"][0]["replayed"], false);
    app.wait_for_status("ORD-1", "sent").await;
    // The file again, with one more line, repeated.
    let again = batch(
        &app,
        json!([
            item("ORD-1", "+14155550101"),
            item("ORD-2", "+14155550102"),
            item("ORD-2", "+14155550102"),
        ]),
    )
    .await;
    assert_eq!(
        again.status,
        200,
        "{}",
        String::from_utf8_lossy(&again.bytes)
    );
    let results = again.json()["results"].clone();
    let got: Vec<(Value, Value)> = results
        .as_array()
        .expect("results")
        .iter()
        .map(|r| (r["status"].clone(), r["replayed"].clone()))
        .collect();
    assert_eq!(
        got,
        [
            (json!(201), json!(true)),
            (json!(202), json!(false)),
            // Still being sent: what a POST right after would get.
            (json!(409), json!(false)),
        ],
        "{results}"
    );
    assert_eq!(again.header("retry-after"), None, "no item was limited");
    // `POST /messages` says the same with its header.
    let post = app
        .post("ORD-1", &sms("+14155550101", "Order ORD-1 confirmed"))
        .await;
    assert_eq!(post.header("idempotent-replayed"), Some("true"));
}

async fn a_limited_item_gives_the_batch_a_retry_after(backend: Backend) {
    let mut settings = test_settings();
    settings.limits.rates = Limits {
        number: Rate {
            capacity: 1,
            per: std::time::Duration::from_secs(3600),
        },
        ..Limits::NONE
    };
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let a = batch(
        &app,
        json!([item("L-1", "+14155550101"), item("L-2", "+14155550101")]),
    )
    .await;
    assert_eq!(a.status, 200);
    let results = a.json()["results"].clone();
    assert_eq!(results[0]["status"], 202);
    assert_eq!(results[1]["status"], 429, "{results}");
    let item_wait = results[1]["problem"]["retry_after"]
        .as_u64()
        .expect("the item's wait");
    let header: u64 = a
        .header("retry-after")
        .expect("Retry-After on the batch answer")
        .parse()
        .expect("seconds");
    assert_eq!(header, item_wait);
    assert!((1..=3600).contains(&header), "{header}");
}

/// The default per-prefix limit fits a shop's confirmations to one town
/// (issue 26: 100 an hour was hit by ordinary order confirmations); a
/// number's own limit still holds.
async fn ordinary_confirmations_fit_the_default_prefix_limit(backend: Backend) {
    let mut settings = test_settings();
    settings.limits = sendonce::config::LimitSettings::default();
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    // 150 customers in one exchange (+1 415 555 ....), one order each.
    let items: Vec<Value> = (0..150)
        .map(|i| item(&format!("ORDER-{i}"), &format!("+1415555{:04}", 1000 + i)))
        .collect();
    let a = batch(&app, Value::Array(items)).await;
    assert_eq!(a.status, 200);
    let refused: Vec<Value> = a.json()["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["status"] != 202)
        .cloned()
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    // One customer's 11th message in the hour is still refused.
    let one: Vec<Value> = (0..11)
        .map(|i| item(&format!("SAME-{i}"), "+14155559999"))
        .collect();
    let a = batch(&app, Value::Array(one)).await;
    let statuses: Vec<Value> = a.json()["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["status"].clone())
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 10);
    assert_eq!(statuses[10], 429);
}

on_both_backends!(
    replayed_items_are_marked,
    a_limited_item_gives_the_batch_a_retry_after,
    ordinary_confirmations_fit_the_default_prefix_limit
);
