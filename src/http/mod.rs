//! The HTTP API: router, shared state and extractors. Each resource module
//! owns its routes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use uuid::Uuid;

use crate::apikey;
use crate::cache::{KeyCache, ReplayCache, Waiters};
use crate::clock::Clock;
use crate::delivery::Deliverer;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;
use crate::store::{Store, TenantAuth};

pub mod admin;
pub mod batch;
pub mod health;
pub mod history;
pub mod inbound;
pub(crate) mod input;
pub mod messages;
pub mod metrics;
pub mod opt_outs;
pub mod page;
pub mod receipts;
pub mod routes;
pub mod server;
pub mod verifications;
pub mod webhooks;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

pub use crate::config::WaitSettings;

pub struct AppState {
    pub store: Arc<dyn Store>,
    pub deliverer: Arc<Deliverer>,
    /// The service's clock: handlers read the time here.
    pub clock: Clock,
    /// This instance's metrics.
    pub metrics: Arc<Metrics>,
    pub wait: WaitSettings,
    pub limiter: Arc<RateLimiter>,
    /// The send protocol (`POST /messages`, batch items).
    pub sends: crate::send::Sends,
    /// The whole request body must arrive within this.
    pub body_read_timeout: Duration,
    /// Every adapter's receipt endpoint, and this service's public URL.
    pub receipts: receipts::ReceiptSettings,
    /// The inbound routes of channels of their own that are configured
    /// (a Telegram bot's updates).
    pub inbound: Vec<std::sync::Arc<dyn crate::provider::registry::InboundRoute>>,
    /// API keys, so most requests authenticate without the database.
    pub keys: Arc<KeyCache>,
    /// Final responses, so most replays touch no database.
    pub replays: Arc<ReplayCache>,
    /// Requests waiting for a message another request sends, per tenant.
    pub waiters: Arc<Waiters>,
    /// Verifications (one-time codes).
    pub verify: Arc<crate::verify::Verifier>,
    /// Webhook endpoint rules (private targets allowed or not).
    pub webhooks: crate::config::WebhookSettings,
    /// This instance's webhook deliveries (told when an endpoint is created).
    pub webhook_dispatcher: Arc<crate::webhooks::Dispatcher>,
    /// Routes' quality and order (`GET /routes`, pins).
    pub quality: Arc<crate::delivery::route_quality::RouteQuality>,
}

pub type SharedState = Arc<AppState>;

/// The API, with `pages` (the support console's routes) beside it, under
/// the same limits and middleware; `GET /metrics` and `/readyz`'s details
/// only if `serve_metrics` (otherwise they are served by [`metrics_router`]
/// on its own listener, `SENDONCE_METRICS_LISTEN`). The console is handed in, so this module
/// does not depend on it.
pub fn router_with(state: SharedState, pages: Router<SharedState>, serve_metrics: bool) -> Router {
    let mut api = Router::new()
        .merge(messages::router())
        .merge(batch::router())
        .merge(opt_outs::router())
        .merge(receipts::router())
        .merge(inbound::router())
        .merge(history::router())
        .merge(verifications::router())
        .merge(webhooks::router())
        .merge(admin::router())
        .merge(routes::router())
        .merge(health::router(serve_metrics))
        .merge(pages);
    if serve_metrics {
        api = api.merge(metrics::router());
    }
    api.fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(hygiene))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            metrics::observe,
        ))
        .with_state(state)
}

/// `GET /metrics` and the detailed `GET /readyz`, for the separate metrics
/// listener.
pub fn metrics_router(state: SharedState) -> Router {
    Router::new()
        .merge(metrics::router())
        .route("/readyz", axum::routing::get(health::readyz))
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn(hygiene))
        .with_state(state)
}

/// Longest request URI accepted (a 255-character key percent-encoded
/// fits with room to spare).
pub const MAX_URI_BYTES: usize = 2048;

/// The length of `uri` as written in the request line, without writing it
/// out (every request passes here).
fn uri_len(uri: &axum::http::Uri) -> usize {
    let scheme = uri.scheme_str().map_or(0, |s| s.len() + 3);
    let authority = uri.authority().map_or(0, |a| a.as_str().len());
    let path_and_query = uri
        .path_and_query()
        .map_or(uri.path().len(), |p| p.as_str().len());
    scheme + authority + path_and_query
}

/// Refuses over-long URIs and adds the headers every answer should carry:
/// they are JSON with personal data in them, never to be sniffed, framed or
/// cached.
async fn hygiene(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::HeaderValue;
    use axum::response::IntoResponse;
    let mut resp = if uri_len(req.uri()) > MAX_URI_BYTES {
        ApiError::UriTooLong.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    // The console's pages set a policy of their own.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
        );
    }
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// The tenant an API key belongs to.
#[derive(Clone, Copy, Debug)]
pub struct Tenant(pub Uuid);

/// The tenant an API key belongs to, with its settings.
#[derive(Clone, Debug)]
pub struct Authenticated(pub TenantAuth);

impl FromRequestParts<SharedState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Self, Self::Rejection> {
        let key = bearer_token(&parts.headers).ok_or(ApiError::Unauthorized)?;
        if !key.starts_with(apikey::PREFIX) || key.len() > 200 {
            return Err(ApiError::Unauthorized);
        }
        let hash = apikey::hash(key);
        let auth = match state.keys.get(&hash) {
            Some(auth) => auth,
            None => {
                let ticket = state.keys.ticket();
                let auth = state
                    .store
                    .tenant_for_key(&hash)
                    .await?
                    .ok_or(ApiError::Unauthorized)?;
                state.keys.put(&hash, &auth, ticket);
                auth
            }
        };
        let path = parts
            .extensions
            .get::<MatchedPath>()
            .map_or("", MatchedPath::as_str);
        admit(&auth, &parts.method, path)?;
        let now = state.clock.now();
        if state.keys.touch_due(auth.key_id, now)
            && let Err(e) = state.store.touch_key(auth.key_id, now).await
        {
            tracing::warn!(error = %e, "could not record the API key's last use");
        }
        Ok(Authenticated(auth))
    }
}

/// Whether a key may make this request: its tenant not disabled, and the
/// scope the route needs held ([`crate::scopes::ROUTES`]; a route missing
/// there is refused to every key), and never `admin` with a test-mode key.
pub fn admit(auth: &TenantAuth, method: &axum::http::Method, path: &str) -> Result<(), ApiError> {
    if auth.disabled {
        return Err(ApiError::TenantDisabled);
    }
    let Some(scope) = crate::scopes::required(method, path) else {
        return Err(ApiError::Internal(format!(
            "route {method} {path} takes an API key but has no scope in scopes::ROUTES"
        )));
    };
    // A test key administers nothing, whatever it lists (one stored with
    // `admin` before that was refused at its making).
    if scope == crate::scopes::Scope::Admin && auth.is_test() {
        return Err(ApiError::AdminInTestMode);
    }
    if auth.scopes.contains(scope) {
        Ok(())
    } else {
        Err(ApiError::InsufficientScope(scope))
    }
}

impl FromRequestParts<SharedState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Self, Self::Rejection> {
        let Authenticated(auth) = Authenticated::from_request_parts(parts, state).await?;
        Ok(Tenant(auth.id))
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// What `Prefer` asks of the wait (RFC 7240: `respond-async`, `wait=N`).
pub fn preferred_wait(headers: &HeaderMap, settings: &WaitSettings) -> Duration {
    let mut wait = None;
    for value in headers.get_all("prefer") {
        let Ok(value) = value.to_str() else { continue };
        for pref in value.split(',') {
            let token = pref.split(';').next().unwrap_or("").trim();
            let (name, val) = match token.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (token, None),
            };
            if name.eq_ignore_ascii_case("respond-async") {
                return Duration::ZERO;
            }
            if name.eq_ignore_ascii_case("wait")
                && let Some(secs) = val.and_then(|v| v.parse::<u64>().ok())
            {
                wait = Some(Duration::from_secs(secs));
            }
        }
    }
    wait.map_or(settings.default, |w| w.min(settings.max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn wait(prefer: &[&str]) -> Duration {
        let mut h = HeaderMap::new();
        for p in prefer {
            h.append("prefer", HeaderValue::from_str(p).unwrap());
        }
        preferred_wait(
            &h,
            &WaitSettings {
                default: Duration::from_secs(10),
                max: Duration::from_secs(30),
            },
        )
    }

    #[test]
    fn a_uri_is_measured_as_written() {
        let long = format!("/messages/{}", "k".repeat(3000));
        for uri in [
            "/",
            "/messages",
            "/messages/ORDER-1?x=1&y=%20",
            "*",
            "http://example.com/messages?a=b",
            "https://example.com:8443/",
            long.as_str(),
        ] {
            let parsed: axum::http::Uri = uri.parse().unwrap();
            assert_eq!(uri_len(&parsed), parsed.to_string().len(), "{uri}");
        }
    }

    #[test]
    fn who_is_admitted() {
        use crate::scopes::{Scope, Scopes};
        let auth = |scopes: Scopes, disabled: bool| TenantAuth {
            id: Uuid::nil(),
            key_id: Uuid::nil(),
            key_label: None,
            scopes,
            disabled,
            allowed_countries: None,
            allowed_senders: None,
            bootstrap_tenant: false,
            quiet_hours: None,
            home_country: None,
            verify_channels: None,
            spend_caps: crate::spend::SpendCaps::default(),
            live_id: None,
        };
        let send = Scopes::of(&[Scope::Send]);
        let post = axum::http::Method::POST;
        let slug = |r: Result<(), ApiError>| r.err().map(|e| e.slug());
        // (key, route, refusal)
        for (a, path, want) in [
            (auth(send, false), "/messages", None),
            (auth(send, false), "/opt-outs", Some("insufficient-scope")),
            (
                auth(Scopes::ALL, true),
                "/messages",
                Some("tenant-disabled"),
            ),
            (
                auth(Scopes::ALL, false),
                "/no-scope-given",
                Some("internal"),
            ),
        ] {
            assert_eq!(slug(admit(&a, &post, path)), want, "{path}");
        }
    }

    #[test]
    fn prefer_header() {
        assert_eq!(wait(&[]), Duration::from_secs(10));
        assert_eq!(wait(&["wait=3"]), Duration::from_secs(3));
        assert_eq!(wait(&["wait=300"]), Duration::from_secs(30));
        assert_eq!(wait(&["respond-async"]), Duration::ZERO);
        assert_eq!(wait(&["wait=5, respond-async"]), Duration::ZERO);
        assert_eq!(
            wait(&["handling=lenient", "wait=2"]),
            Duration::from_secs(2)
        );
        assert_eq!(wait(&["wait=abc"]), Duration::from_secs(10));
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer so_abc"),
        );
        assert_eq!(bearer_token(&h), Some("so_abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  so_abc "),
        );
        assert_eq!(bearer_token(&h), Some("so_abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic eDp5"),
        );
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&h), None);
    }
}
