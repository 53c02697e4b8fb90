//! `GET /metrics` and the request id.

use reqwest::Method;

use crate::helpers::{answer, sms, spawn_app};

/// The value of the sample `name{labels}` in a Prometheus text exposition,
/// matching every `label="value"` pair given (in any order).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labelset, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        labels
            .iter()
            .all(|(k, v)| labelset.split(',').any(|p| p == format!("{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

async fn metrics_text(app: &crate::helpers::TestApp) -> String {
    let a = answer(
        app.request(Method::GET, "/metrics")
            .send()
            .await
            .expect("GET /metrics"),
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(
        a.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        a.header("content-type")
    );
    String::from_utf8(a.bytes).expect("UTF-8")
}

const POST: &[(&str, &str)] = &[("method", "POST"), ("route", "/messages")];

fn requests(text: &str, outcome: &str) -> Option<f64> {
    let mut labels = POST.to_vec();
    labels.push(("outcome", outcome));
    sample(text, "sendonce_http_requests_total", &labels)
}

#[tokio::test]
async fn metrics_count_created_and_replayed_sends() {
    let app = spawn_app().await;

    let before = metrics_text(&app).await;
    assert_eq!(requests(&before, "created"), Some(0.0));
    assert_eq!(requests(&before, "replayed"), Some(0.0));

    let body = sms("+14155550100", "Your code is 123456");
    let first = app.post("OBS-1", &body).await;
    assert_eq!(first.status, 201);
    let replay = app.post("OBS-1", &body).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let reused = app
        .post("OBS-1", &sms("+14155550100", "another body"))
        .await;
    assert_eq!(reused.status, 422);
    let unauthorized = answer(
        app.request(Method::POST, "/messages")
            .bearer_auth("so_not-a-key-000000000000000")
            .header("Idempotency-Key", "OBS-2")
            .json(&body)
            .send()
            .await
            .expect("POST"),
    )
    .await;
    assert_eq!(unauthorized.status, 401);

    let text = metrics_text(&app).await;
    assert_eq!(requests(&text, "created"), Some(1.0), "{text}");
    assert_eq!(requests(&text, "replayed"), Some(1.0), "{text}");
    assert_eq!(requests(&text, "reused"), Some(1.0), "{text}");
    assert_eq!(requests(&text, "unauthorized"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            "sendonce_provider_attempts_total",
            &[("provider", "http"), ("class", "ok")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "sendonce_messages_final_total",
            &[("status", "sent")]
        ),
        Some(1.0),
        "{text}"
    );
    // The four POSTs, timed.
    assert_eq!(
        sample(&text, "sendonce_http_request_duration_seconds_count", POST),
        Some(4.0),
        "{text}"
    );
    assert!(sample(&text, "sendonce_deliveries_in_flight", &[]).is_some());
    assert_eq!(
        sample(&text, "sendonce_oldest_processing_age_seconds", &[]),
        Some(0.0)
    );
    // Never a key, a number or a body in a label.
    assert!(!text.contains("OBS-1") && !text.contains("4155550100"));
    assert!(!text.contains(&app.api_key));
}

#[tokio::test]
async fn request_id_is_echoed_or_made() {
    let app = spawn_app().await;

    let given = app
        .post_with(
            Some("RID-1"),
            &sms("+14155550100", "hello"),
            &[("X-Request-Id", "trace-abc_123:xyz")],
        )
        .await;
    assert_eq!(given.status, 201);
    assert_eq!(given.header("x-request-id"), Some("trace-abc_123:xyz"));

    // Made when absent, on every route, errors included.
    for path in ["/healthz", "/messages/RID-404", "/nowhere"] {
        let a = app.get(path).await;
        let id = a.header("x-request-id").expect("a request id");
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{path}: {id}");
    }
    let one = app.get("/healthz").await;
    let two = app.get("/healthz").await;
    assert_ne!(one.header("x-request-id"), two.header("x-request-id"));

    // Replaced when not 1 to 128 visible ASCII characters.
    let too_long = "x".repeat(129);
    for bad in ["has space", too_long.as_str()] {
        let a = answer(
            app.request(Method::GET, "/healthz")
                .header("X-Request-Id", bad)
                .send()
                .await
                .expect("GET"),
        )
        .await;
        let id = a.header("x-request-id").expect("a request id");
        assert_ne!(id, bad);
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    }
    let longest = "y".repeat(128);
    let a = answer(
        app.request(Method::GET, "/healthz")
            .header("X-Request-Id", &longest)
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(a.header("x-request-id"), Some(longest.as_str()));
}

#[tokio::test]
async fn every_route_is_labelled_by_its_template() {
    let app = spawn_app().await;
    // Routes a hand-written map of paths once missed: each must be counted
    // under its router template, never the concrete path.
    let calls: &[(Method, &str, &str)] = &[
        (Method::GET, "/opt-outs", "/opt-outs"),
        (Method::POST, "/opt-outs", "/opt-outs"),
        (
            Method::DELETE,
            "/opt-outs/+14155550100",
            "/opt-outs/{number}",
        ),
        (Method::POST, "/inbound", "/inbound"),
        (
            Method::POST,
            "/providers/twilio/status",
            "/providers/twilio/status",
        ),
        (
            Method::POST,
            "/providers/http/status",
            "/providers/http/status",
        ),
        (
            Method::GET,
            "/messages/EVT-1/events",
            "/messages/{key}/events",
        ),
    ];
    for (method, path, _) in calls {
        let a = answer(
            app.request(method.clone(), path)
                .bearer_auth(&app.api_key)
                .send()
                .await
                .expect("request"),
        )
        .await;
        assert!(a.status >= 200, "{path}");
    }
    // Unknown paths share one label, so they cannot grow the series.
    for path in ["/nowhere", "/nowhere/else", "/messages/a/b/c"] {
        assert_eq!(app.get(path).await.status, 404);
    }

    let text = metrics_text(&app).await;
    for (method, path, route) in calls {
        assert!(
            sample(
                &text,
                "sendonce_http_request_duration_seconds_count",
                &[("method", method.as_str()), ("route", route)]
            )
            .is_some_and(|n| n >= 1.0),
            "{method} {path} not counted under {route}:\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            "sendonce_http_request_duration_seconds_count",
            &[("method", "GET"), ("route", "unmatched")]
        ),
        Some(3.0),
        "{text}"
    );
    assert!(
        !text.contains("EVT-1") && !text.contains("nowhere"),
        "{text}"
    );
    assert!(!text.contains("4155550100"), "{text}");
}
