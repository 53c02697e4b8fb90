//! The HTTP side of observability: `GET /metrics`, and the middleware that
//! gives every request an id and counts and times it in [`Metrics`].
//!
//! A request is labelled with the template of the route that matched it
//! (axum's [`MatchedPath`], e.g. `/messages/{key}`), so the labels follow the
//! router as it grows; a request no route matches is labelled `unmatched`,
//! so arbitrary paths cannot create series.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::Instrument;

use super::SharedState;
use crate::metrics::Metrics;

/// The request id header, accepted from the client and always answered.
pub const REQUEST_ID: &str = "x-request-id";

/// The route label of a request that matched no route.
pub const UNMATCHED: &str = "unmatched";

pub fn router() -> Router<SharedState> {
    Router::new().route("/metrics", get(scrape))
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
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("invalid-uuid"))
}

/// Middleware around every request: a request id (in a tracing span, so on
/// every log line of the request, and in the response), the request counter
/// and the latency histogram.
pub async fn observe(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    let method = method_label(req.method());
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or(UNMATCHED, MatchedPath::as_str);
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        method,
        route
    );
    let mut resp = next.run(req).instrument(span).await;
    let replayed = resp.headers().contains_key("idempotent-replayed");
    let outcome = request_outcome(resp.status().as_u16(), replayed);
    let metrics: &Metrics = &state.metrics;
    metrics.request(method, route, outcome, started.elapsed());
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}

/// `GET /metrics`: Prometheus text format. Unauthenticated, like the health
/// checks: it carries counts only, nothing about tenants or messages.
async fn scrape(State(state): State<SharedState>) -> Response {
    let oldest = match state.store.oldest_processing().await {
        Ok(Some(created)) => {
            Some(Duration::try_from(state.clock.now() - created).unwrap_or(Duration::ZERO))
        }
        Ok(None) => Some(Duration::ZERO),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: could not read the oldest processing message");
            None
        }
    };
    for c in state.deliverer.circuits().await {
        state.metrics.circuit(&c.provider, c.state.gauge());
    }
    let db = state.store.connection_stats();
    state
        .metrics
        .set_db_connections(db.connections_opened, db.host_switches);
    let body = state.metrics.render(state.deliverer.in_flight(), oldest);
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
    fn outcomes() {
        for (status, replayed, label) in [
            (201, false, "created"),
            (201, true, "replayed"),
            (202, false, "accepted"),
            (200, false, "ok"),
            (409, false, "in_use"),
            (422, false, "reused"),
            (400, false, "invalid"),
            (413, false, "invalid"),
            (404, false, "not_found"),
            (429, false, "rate_limited"),
            (503, false, "unavailable"),
            (500, false, "error"),
            (418, false, "other"),
        ] {
            assert_eq!(request_outcome(status, replayed), label, "{status}");
        }
    }
}
