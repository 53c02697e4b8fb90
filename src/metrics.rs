//! Metrics in the Prometheus text format (`GET /metrics`), and the request
//! id every request's log lines carry.
//!
//! Each instance owns its own [`PrometheusRecorder`]: no global recorder is
//! installed, so several instances in one process (the tests) keep separate
//! counts. Handles are registered on that recorder directly instead of
//! through the `metrics` macros, which only reach a global one. Incrementing
//! a registered handle is an atomic add; gauges that describe the database
//! (the oldest `processing` message) are read when `/metrics` is scraped.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `sendonce_http_requests_total` | `method`, `route`, `outcome` | requests answered, by outcome (`created`, `replayed`, `accepted`, `in_use`, `reused`, `invalid`, `unauthorized`, `not_found`, `rate_limited`, `unavailable`, `error`, `ok`) |
//! | `sendonce_http_request_duration_seconds` | `method`, `route` | histogram: request start to response |
//! | `sendonce_provider_attempts_total` | `provider`, `class` | provider calls by outcome class (`ok`, `permanent`, `retryable`, `ambiguous`) |
//! | `sendonce_provider_duration_seconds` | `provider`, `class` | histogram: one provider call |
//! | `sendonce_retries_scheduled_total` | | attempts that ended in a scheduled retry |
//! | `sendonce_messages_final_total` | `status` | messages this instance made final (`sent`, `failed`, `unknown`) |
//! | `sendonce_deliveries_in_flight` | | deliveries running in this instance |
//! | `sendonce_oldest_processing_age_seconds` | | age of the oldest `processing` message (all instances; 0 when none) |
//! | `sendonce_rescuer_takeovers_total` | | messages claimed after their owner's lease expired |
//! | `sendonce_purged_messages_total` | | messages deleted past retention |
//!
//! Nothing here is labelled with a tenant, a key, a number or a body.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::http::SharedState;

/// The request id header, accepted from the client and always answered.
pub const REQUEST_ID: &str = "x-request-id";

const REQUESTS: &str = "sendonce_http_requests_total";
const REQUEST_SECONDS: &str = "sendonce_http_request_duration_seconds";
const PROVIDER_ATTEMPTS: &str = "sendonce_provider_attempts_total";
const PROVIDER_SECONDS: &str = "sendonce_provider_duration_seconds";
const RETRIES: &str = "sendonce_retries_scheduled_total";
const FINAL: &str = "sendonce_messages_final_total";
const IN_FLIGHT: &str = "sendonce_deliveries_in_flight";
const OLDEST: &str = "sendonce_oldest_processing_age_seconds";
const TAKEOVERS: &str = "sendonce_rescuer_takeovers_total";
const RECEIPTS: &str = "sendonce_receipts_total";
const PURGED: &str = "sendonce_purged_messages_total";

/// Latency buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static META: Metadata<'static> = Metadata::new("sendonce", Level::INFO, Some(module_path!()));

/// One instance's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    retries: Counter,
    takeovers: Counter,
    purged: Counter,
    in_flight: Gauge,
    oldest_processing: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
            .expect("latency buckets are not empty")
            .build_recorder();
        let text = |s: &'static str| SharedString::const_str(s);
        for (name, what) in [
            (REQUESTS, "HTTP requests answered, by route and outcome"),
            (
                PROVIDER_ATTEMPTS,
                "Provider calls, by provider and outcome class",
            ),
            (RETRIES, "Provider attempts that ended in a scheduled retry"),
            (FINAL, "Messages made final by this instance, by status"),
            (
                TAKEOVERS,
                "Messages claimed after their owner's lease expired",
            ),
            (PURGED, "Messages deleted past retention"),
            (
                RECEIPTS,
                "Delivery receipts, by provider and outcome (applied, recorded, duplicate, unmatched)",
            ),
        ] {
            recorder.describe_counter(KeyName::from_const_str(name), None, text(what));
        }
        for (name, what) in [
            (REQUEST_SECONDS, "HTTP request latency"),
            (PROVIDER_SECONDS, "Provider call latency"),
        ] {
            recorder.describe_histogram(
                KeyName::from_const_str(name),
                Some(Unit::Seconds),
                text(what),
            );
        }
        recorder.describe_gauge(
            KeyName::from_const_str(IN_FLIGHT),
            None,
            text("Deliveries running in this instance"),
        );
        recorder.describe_gauge(
            KeyName::from_const_str(OLDEST),
            Some(Unit::Seconds),
            text("Age of the oldest message still processing (0 when none)"),
        );
        let counter = |name: &'static str| recorder.register_counter(&Key::from_name(name), &META);
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_name(name), &META);
        let metrics = Metrics {
            retries: counter(RETRIES),
            takeovers: counter(TAKEOVERS),
            purged: counter(PURGED),
            in_flight: gauge(IN_FLIGHT),
            oldest_processing: gauge(OLDEST),
            handle: recorder.handle(),
            recorder,
        };
        // The series a dashboard looks for first exist from the start, at 0.
        for outcome in ["created", "replayed"] {
            metrics
                .labelled_counter(
                    REQUESTS,
                    [
                        ("method", "POST"),
                        ("route", "/messages"),
                        ("outcome", outcome),
                    ],
                )
                .absolute(0);
        }
        metrics
    }

    fn labelled_counter<const N: usize>(
        &self,
        name: &'static str,
        labels: [(&'static str, &'static str); N],
    ) -> Counter {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::from_static_parts(k, v))
            .collect();
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &META)
    }

    fn labelled_histogram<const N: usize>(
        &self,
        name: &'static str,
        labels: [(&'static str, &'static str); N],
    ) -> Histogram {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::from_static_parts(k, v))
            .collect();
        self.recorder
            .register_histogram(&Key::from_parts(name, labels), &META)
    }

    /// A request answered with `outcome` after `elapsed`.
    pub fn request(
        &self,
        method: &'static str,
        route: &'static str,
        outcome: &'static str,
        elapsed: Duration,
    ) {
        self.labelled_counter(
            REQUESTS,
            [("method", method), ("route", route), ("outcome", outcome)],
        )
        .increment(1);
        self.labelled_histogram(REQUEST_SECONDS, [("method", method), ("route", route)])
            .record(elapsed.as_secs_f64());
    }

    /// One provider call; `class` is `ok`, `permanent`, `retryable` or `ambiguous`.
    pub fn provider_attempt(&self, provider: &'static str, class: &'static str, elapsed: Duration) {
        self.labelled_counter(
            PROVIDER_ATTEMPTS,
            [("provider", provider), ("class", class)],
        )
        .increment(1);
        self.labelled_histogram(PROVIDER_SECONDS, [("provider", provider), ("class", class)])
            .record(elapsed.as_secs_f64());
    }

    pub fn retry_scheduled(&self) {
        self.retries.increment(1);
    }

    /// A message this instance made final with `status`.
    pub fn message_final(&self, status: &'static str) {
        self.labelled_counter(FINAL, [("status", status)])
            .increment(1);
    }

    /// One delivery receipt taken: `outcome` is `applied` (it moved the
    /// status), `recorded` (kept in the history only), `duplicate` or
    /// `unmatched` (no known message).
    pub fn receipt(&self, provider: &str, outcome: &'static str) {
        let provider = match provider {
            "twilio" => "twilio",
            "http" => "http",
            _ => "other",
        };
        self.labelled_counter(RECEIPTS, [("provider", provider), ("outcome", outcome)])
            .increment(1);
    }

    pub fn takeover(&self) {
        self.takeovers.increment(1);
    }

    pub fn purged(&self, n: u64) {
        self.purged.increment(n);
    }

    /// The text exposition, with the gauges read at scrape time set first.
    pub fn render(&self, in_flight: usize, oldest_processing: Option<Duration>) -> String {
        self.in_flight.set(in_flight as f64);
        if let Some(age) = oldest_processing {
            self.oldest_processing.set(age.as_secs_f64());
        }
        self.handle.render()
    }

    /// Folds recorded histogram samples into their buckets every few seconds,
    /// so memory stays bounded when nobody scrapes.
    pub async fn run_upkeep(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(5)) => self.handle.run_upkeep(),
                () = stop.cancelled() => return,
            }
        }
    }
}

/// The class of a provider outcome, as a metric label.
pub fn outcome_class(outcome: &crate::provider::SendOutcome) -> &'static str {
    use crate::provider::SendOutcome;
    match outcome {
        SendOutcome::Accepted { .. } => "ok",
        SendOutcome::Rejected { .. } => "permanent",
        SendOutcome::Retryable { .. } => "retryable",
        SendOutcome::Ambiguous { .. } => "ambiguous",
    }
}

/// What a response means, as a metric label.
pub fn request_outcome(status: u16, replayed: bool) -> &'static str {
    match status {
        _ if replayed => "replayed",
        201 => "created",
        202 => "accepted",
        409 => "in_use",
        422 => "reused",
        400 | 413 | 415 => "invalid",
        401 => "unauthorized",
        404 => "not_found",
        405 => "method_not_allowed",
        429 => "rate_limited",
        503 => "unavailable",
        500..=599 => "error",
        200..=299 => "ok",
        _ => "other",
    }
}

/// The route a path belongs to, as a metric label (bounded: never the key).
pub fn route_label(path: &str) -> &'static str {
    let mut segments = path.trim_start_matches('/').split('/');
    match (
        segments.next(),
        segments.next(),
        segments.next(),
        segments.next(),
    ) {
        (Some("messages"), None, _, _) => "/messages",
        (Some("messages"), Some(_), None, _) => "/messages/{key}",
        (Some("messages"), Some(_), Some("attempts"), None) => "/messages/{key}/attempts",
        (Some("healthz"), None, _, _) => "/healthz",
        (Some("readyz"), None, _, _) => "/readyz",
        (Some("metrics"), None, _, _) => "/metrics",
        _ => "other",
    }
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The client's `X-Request-Id` when it is 1 to 128 visible ASCII
/// characters, else a new UUID.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(REQUEST_ID) {
        let b = v.as_bytes();
        if (1..=128).contains(&b.len()) && b.iter().all(|c| (0x21..=0x7e).contains(c)) {
            return v.clone();
        }
    }
    let id = uuid::Uuid::new_v4().hyphenated().to_string();
    HeaderValue::from_str(&id).expect("a UUID is a valid header value")
}

/// Middleware around every request: a request id (in a tracing span, so on
/// every log line of the request, and in the response), the request counter
/// and the latency histogram.
pub async fn observe(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    let method = method_label(req.method());
    let route = route_label(req.uri().path());
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        method,
        route
    );
    let mut resp = next.run(req).instrument(span).await;
    let replayed = resp.headers().contains_key("idempotent-replayed");
    let outcome = request_outcome(resp.status().as_u16(), replayed);
    state
        .deliverer
        .metrics()
        .request(method, route, outcome, started.elapsed());
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}

/// `GET /metrics`: Prometheus text format. Unauthenticated, like the health
/// checks: it carries counts only, nothing about tenants or messages.
pub async fn scrape(State(state): State<SharedState>) -> Response {
    let deliverer = &state.deliverer;
    let oldest = match state.store.oldest_processing().await {
        Ok(Some(created)) => {
            Some(Duration::try_from(deliverer.clock().now() - created).unwrap_or(Duration::ZERO))
        }
        Ok(None) => Some(Duration::ZERO),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: could not read the oldest processing message");
            None
        }
    };
    let body = deliverer.metrics().render(deliverer.in_flight(), oldest);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_bounded() {
        assert_eq!(route_label("/messages"), "/messages");
        assert_eq!(route_label("/messages/ORDER-1"), "/messages/{key}");
        assert_eq!(
            route_label("/messages/ORDER-1/attempts"),
            "/messages/{key}/attempts"
        );
        assert_eq!(route_label("/messages/a/b/c"), "other");
        assert_eq!(route_label("/healthz"), "/healthz");
        assert_eq!(route_label("/nope"), "other");
    }

    #[test]
    fn request_ids() {
        let mut h = HeaderMap::new();
        assert_eq!(request_id(&h).len(), 36);
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert(REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h).len(), 36);
        h.insert(REQUEST_ID, HeaderValue::from_str(&"x".repeat(129)).unwrap());
        assert_eq!(request_id(&h).len(), 36);
        h.insert(REQUEST_ID, HeaderValue::from_str(&"x".repeat(128)).unwrap());
        assert_eq!(request_id(&h).len(), 128);
    }

    #[test]
    fn renders_counters() {
        let m = Metrics::new();
        m.request("POST", "/messages", "created", Duration::from_millis(3));
        m.message_final("sent");
        m.purged(3);
        let text = m.render(2, Some(Duration::from_secs(7)));
        assert!(text.contains(
            r#"sendonce_http_requests_total{method="POST",route="/messages",outcome="created"} 1"#
        ));
        assert!(text.contains(r#"sendonce_messages_final_total{status="sent"} 1"#));
        assert!(text.contains("sendonce_purged_messages_total 3"));
        assert!(text.contains("sendonce_deliveries_in_flight 2"));
        assert!(text.contains("sendonce_oldest_processing_age_seconds 7"));
        assert!(text.contains("sendonce_http_request_duration_seconds_bucket"));
    }
}
