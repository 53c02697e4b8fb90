//! One pagination convention for every list (issue 26): `?limit=` and
//! `?cursor=`, answered with `next_cursor` (null on the last page); any
//! other parameter, a malformed limit or a foreign cursor is a 400 naming
//! it. And the events feed's cursor tells a tenant nothing about another
//! tenant's events (issue 29, finding 12).

use serde_json::{Value, json};

use crate::helpers::*;

/// Every item of the list at `path` (which has no query), walked
/// `limit` at a time; also the number of pages.
async fn walk(app: &TestApp, path: &str, limit: u32) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut next: Option<String> = None;
    for pages in 1..=50 {
        let url = match &next {
            None => format!("{path}?limit={limit}"),
            Some(c) => format!("{path}?limit={limit}&cursor={c}"),
        };
        let a = app.get(&url).await;
        assert_eq!(
            a.status,
            200,
            "{url}: {}",
            String::from_utf8_lossy(&a.bytes)
        );
        let body = a.json();
        let data = body["data"].as_array().expect("data").clone();
        assert!(data.len() <= limit as usize, "{url}");
        assert!(
            body.as_object()
                .expect("object")
                .contains_key("next_cursor"),
            "{url}"
        );
        items.extend(data);
        match body["next_cursor"].as_str() {
            Some(c) => next = Some(c.to_string()),
            None => return (items, pages),
        }
    }
    panic!("{path}: the pages never end");
}

async fn every_list_pages_the_same_way(backend: Backend) {
    let app = spawn_app_on(backend).await;
    for n in ["+14155550101", "+14155550102", "+14155550103"] {
        let a = answer(
            app.request(reqwest::Method::POST, "/opt-outs")
                .bearer_auth(&app.api_key)
                .json(&json!({ "number": n }))
                .send()
                .await
                .expect("POST /opt-outs"),
        )
        .await;
        assert_eq!(a.status, 201);
    }
    let mut endpoint = String::new();
    for i in 0..3 {
        let a = answer(
            app.request(reqwest::Method::POST, "/webhook-endpoints")
                .bearer_auth(&app.api_key)
                // Subscribed to an event nothing here makes, so that the
                // attempts list stays empty however soon the dispatcher
                // runs (the sends below make `message.sent` events).
                .json(&json!({
                    "url": format!("https://hooks{i}.example.com/in"),
                    "events": ["verification.approved"],
                }))
                .send()
                .await
                .expect("POST /webhook-endpoints"),
        )
        .await;
        assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.bytes));
        endpoint = a.json()["id"].as_str().expect("id").to_string();
    }
    assert_eq!(
        app.post("PAGE-1", &sms("+14155550100", "hi")).await.status,
        201
    );
    app.post("PAGE-2", &sms("+14155550100", "hi again")).await;
    app.post("PAGE-3", &sms("+14155550100", "and again")).await;

    let lists = [
        ("/opt-outs", 3),
        ("/webhook-endpoints", 3),
        (&*format!("/webhook-endpoints/{endpoint}/attempts"), 0),
        ("/messages/PAGE-1/attempts", 1),
        ("/messages/PAGE-1/events", 1),
    ];
    for (path, count) in lists {
        let whole = app.get(path).await.json();
        assert_eq!(
            whole["data"].as_array().map(Vec::len),
            Some(count),
            "{path}"
        );
        assert_eq!(whole["next_cursor"], Value::Null, "{path}: one page");
        let (paged, pages) = walk(&app, path, 2).await;
        assert_eq!(
            paged,
            whole["data"].as_array().cloned().unwrap_or_default(),
            "{path}"
        );
        assert_eq!(pages, count.div_ceil(2).max(1), "{path}");
        for (query, field) in [
            ("after=x", "after"),
            ("cursor=x", "cursor"),
            ("limit=0", "limit"),
            ("limit=two", "limit"),
            ("offset=2", "offset"),
        ] {
            let a = app.get(&format!("{path}?{query}")).await;
            assert_eq!(a.status, 400, "{path}?{query}");
            assert_eq!(a.header("content-type"), Some("application/problem+json"));
            assert_eq!(a.json()["errors"][0]["field"], field, "{path}?{query}");
        }
    }
    // The feed: three events, two pages.
    let events = eventually("three events", || async {
        let v = app.get("/events").await.json();
        (v["data"].as_array().map(Vec::len) == Some(3)).then_some(v)
    })
    .await;
    let (paged, pages) = walk(&app, "/events", 2).await;
    assert_eq!((paged.len(), pages), (3, 2));
    let ids = |v: &[Value]| v.iter().map(|e| e["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&paged), ids(events["data"].as_array().expect("data")));
    // A list's cursor is no other list's.
    let v = app.get("/opt-outs?limit=1").await.json();
    let next = v["next_cursor"].as_str().expect("more").to_string();
    let a = app.get(&format!("/events?cursor={next}")).await;
    assert_eq!(
        (a.status, a.json()["errors"][0]["field"].clone()),
        (400, json!("cursor"))
    );
}

/// The position of an event in the old, readable cursor form.
fn readable(cursor: &str) -> bool {
    cursor.split_once('-').is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
    })
}

/// The cursor of the last of `n` events in `app`'s tenant's feed.
async fn cursor_of_last(app: &TestApp, n: usize) -> String {
    let v = eventually(&format!("{n} events"), || async {
        let v = app.get("/events?limit=1000").await.json();
        (v["data"].as_array().map(Vec::len) == Some(n)).then_some(v)
    })
    .await;
    v["data"][n - 1]["cursor"]
        .as_str()
        .expect("cursor")
        .to_string()
}

async fn feed_cursors_tell_nothing_of_other_tenants(backend: Backend) {
    let a = spawn_app_on(backend).await;
    let b = spawn_with(TestOptions {
        backend,
        database: Some(a.database.clone()),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(a.post("A-1", &sms("+14155550100", "a")).await.status, 201);
    let first = cursor_of_last(&a, 1).await;
    for i in 0..12 {
        assert_eq!(
            b.post(&format!("B-{i}"), &sms("+14155550100", "b"))
                .await
                .status,
            201
        );
    }
    assert_eq!(a.post("A-2", &sms("+14155550100", "a")).await.status, 201);
    let second = cursor_of_last(&a, 2).await;
    let theirs = cursor_of_last(&b, 12).await;
    for c in [&first, &second, &theirs] {
        assert!(!readable(c), "a readable position: {c}");
        assert!(!c.chars().all(|c| c.is_ascii_digit() || c == '-'), "{c}");
    }
    assert_eq!(
        first.len(),
        second.len(),
        "no length moves with the position"
    );
    // A's cursor goes on from A's first event, whatever B did.
    let next = a.get(&format!("/events?cursor={first}")).await.json();
    assert_eq!(next["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(next["data"][0]["data"]["idempotency_key"], "A-2");
    // Another tenant's cursor is refused, not read.
    let refused = a.get(&format!("/events?cursor={theirs}")).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["errors"][0]["field"], "cursor");
}

on_both_backends!(
    every_list_pages_the_same_way,
    feed_cursors_tell_nothing_of_other_tenants
);
