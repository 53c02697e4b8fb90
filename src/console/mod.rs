//! The support console: server-rendered pages under `/console` for the
//! people who answer "did my customer get the SMS?".
//!
//! Sign in with a tenant API key; the session is a random id in a
//! `__Host-` cookie (`Secure`, `Path=/`, `HttpOnly`, `SameSite=Strict`),
//! stored server-side as its SHA-256 with an idle timeout and an absolute
//! lifetime, and ends when its key is revoked. Every form carries the
//! session's CSRF token (the sign-in form a token of its own, in a cookie
//! beside it); a POST without the right one is refused with 403. Pages carry
//! a strict Content-Security-Policy: no script at all, style only from
//! `/console/console.css`. Failed sign-ins are rate limited per client
//! address.
//! One tenant sees only its own data: every read names the session's tenant,
//! and another tenant's message is "not found".
//!
//! The console is a reader of the store; it writes only its own sessions and
//! the opt-outs a support person adds or removes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::domain::phone;
use crate::http::SharedState;
use crate::store::{MessageRecord, MessageSummary, StoreError};

pub mod decide;
mod decide_hooks;
#[cfg(test)]
mod decide_tests;
mod entry;
mod pages;
mod routes_page;
mod session;

use session::*;

/// A session unused for this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in however busy it is (12 hours).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// A session's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);
/// How far back a search by part of a key or metadata value looks: a
/// substring scan, bounded to the tenant, this window and one page.
const SEARCH_WINDOW: time::Duration = time::Duration::days(30);

/// Messages per page of a search.
pub const PAGE: u32 = 25;
/// Opt-outs per page.
pub const OPT_OUT_PAGE: u32 = 50;

/// The session cookie. `__Host-`: a browser takes it only from this very
/// host, over https (or http://localhost), with `Secure` and `Path=/`, so a
/// sibling subdomain cannot plant one (login CSRF).
pub const SESSION_COOKIE: &str = "__Host-sendonce_console";
/// The sign-in form's CSRF cookie (there is no session yet).
pub const LOGIN_COOKIE: &str = "__Host-sendonce_console_login";

/// The console's Content-Security-Policy: no script, style only from our
/// own stylesheet, forms only to ourselves, never framed.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
    form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn router(state: SharedState) -> Router<SharedState> {
    let console = Router::new()
        .route("/", get(home))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/search", get(search))
        .route("/messages/{id}", get(timeline))
        .route("/verifications/{id}", get(verification))
        .route("/overview", get(overview))
        .route("/opt-outs", get(opt_outs).post(add_opt_out))
        .route("/opt-outs/remove", post(remove_opt_out))
        .route("/outbox", get(outbox))
        .route("/routes", get(routes))
        .route("/console.css", get(stylesheet))
        .fallback(|| async { PageError::NotFound })
        .method_not_allowed_fallback(|| async { PageError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(state, error_nav))
        .layer(axum::middleware::from_fn(console_headers))
        .layer(Extension(Arc::new(ConsoleState::default())));
    Router::new().nest("/console", console)
}

/// What an error page said, kept on its response so that [`error_nav`] can
/// draw it again with the signed-in navigation.
#[derive(Clone)]
struct ErrorPage {
    title: &'static str,
    detail: String,
}

/// An error page keeps the signed-in navigation: a page fails before or
/// without knowing its session, so it is looked up here, for errors only.
async fn error_nav(
    State(state): State<SharedState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = req.headers().clone();
    let resp = next.run(req).await;
    let Some(page) = resp.extensions().get::<ErrorPage>().cloned() else {
        return resp;
    };
    let Ok(Some(session)) = current(&state, &headers).await else {
        return resp;
    };
    let (mut parts, _) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let html = pages::error(page.title, &page.detail, Some(&session)).into_string();
    Response::from_parts(parts, axum::body::Body::from(html))
}

/// Pages are HTML with the console's policy; nothing is cached.
async fn console_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Why a page could not be shown, as a page.
#[derive(Debug)]
pub enum PageError {
    NotFound,
    MethodNotAllowed,
    BadRequest(String),
    Forbidden(&'static str),
    UnsupportedMediaType,
    RequestTimeout,
    PayloadTooLarge,
    TooManySignIns(Duration),
    Store(StoreError),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        PageError::Store(e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, title, detail) = match &self {
            PageError::NotFound => (
                StatusCode::NOT_FOUND,
                "Not found",
                "There is nothing here, or it belongs to another account.".to_string(),
            ),
            PageError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "Not allowed",
                "This page cannot be used that way.".to_string(),
            ),
            PageError::BadRequest(why) => (StatusCode::BAD_REQUEST, "Bad request", why.clone()),
            PageError::Forbidden(why) => (StatusCode::FORBIDDEN, "Refused", (*why).to_string()),
            PageError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported form",
                "Forms must be sent as application/x-www-form-urlencoded.".to_string(),
            ),
            PageError::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "Too slow",
                "The form did not arrive in time. Nothing was changed.".to_string(),
            ),
            PageError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "Too large",
                "The form was larger than any console form. Nothing was changed.".to_string(),
            ),
            PageError::TooManySignIns(wait) => (
                StatusCode::TOO_MANY_REQUESTS,
                "Too many failed sign-ins",
                format!(
                    "Too many sign-ins failed in the last minute. Try again in {}.",
                    decide::human(*wait)
                ),
            ),
            PageError::Store(StoreError::Unavailable(_)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Database unavailable",
                "The database did not answer. Try again in a moment.".to_string(),
            ),
            PageError::Store(e) => {
                tracing::error!(error = %e, "console page failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Something went wrong",
                    "The page could not be shown; the error was logged.".to_string(),
                )
            }
        };
        let mut resp = (
            status,
            Html(pages::error(title, &detail, None).into_string()),
        )
            .into_response();
        resp.extensions_mut().insert(ErrorPage { title, detail });
        if let PageError::TooManySignIns(wait) = self
            && let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

#[derive(Deserialize)]
struct SearchQuery {
    q: Option<String>,
    before: Option<String>,
}

fn summary(m: &MessageRecord) -> MessageSummary {
    MessageSummary {
        id: m.id,
        idempotency_key: m.idempotency_key.to_string(),
        status: m.status,
        to: m.to.to_string(),
        provider: m.provider.clone(),
        attempts: m.attempts,
        created_at: m.created_at,
    }
}

async fn search(
    State(state): State<SharedState>,
    headers: HeaderMap,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Query(query) = query.map_err(|_| PageError::BadRequest("Unreadable search.".into()))?;
    let q = query.q.unwrap_or_default();
    if q.trim().is_empty() {
        return Ok(Html(pages::search(&session, "", None).into_string()).into_response());
    }
    let tenant = session.tenant_id;
    let home = state.store.home_country(tenant).await?;
    let Some(kind) = decide::classify(&q, home.as_deref()) else {
        return Err(PageError::BadRequest(format!(
            "{} At most {} characters.",
            pages::SEARCHABLE,
            decide::MAX_QUERY
        )));
    };
    let before = match query.before.as_deref() {
        None | Some("") => None,
        Some(c) => Some(
            decide::parse_cursor(c)
                .ok_or_else(|| PageError::BadRequest("That page link is not valid.".into()))?,
        ),
    };
    if let Some(id) = kind.verification
        && state.store.verification(tenant, id).await?.is_some()
        && before.is_none()
    {
        return Ok(see_other(&format!(
            "/console/verifications/{}",
            crate::verify::public_id(id)
        )));
    }
    let mut exact: Vec<(&'static str, MessageSummary)> = Vec::new();
    if let Some(id) = kind.message_id
        && let Some(m) = state.store.tenant_message(tenant, id).await?
    {
        exact.push(("message id", summary(&m)));
    }
    if let Some(key) = &kind.key {
        if let Some(m) = state.store.message(tenant, key).await? {
            exact.push(("idempotency key", summary(&m)));
        }
        for m in state
            .store
            .messages_by_provider_id(tenant, key, PAGE)
            .await?
        {
            exact.push(("provider message id", m));
        }
        if before.is_none() {
            let since = state.clock.now() - SEARCH_WINDOW;
            for m in state
                .store
                .search_messages(tenant, key, since, PAGE)
                .await?
            {
                exact.push(("key or metadata contains it", m));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    exact.retain(|(_, m)| seen.insert(m.id));
    let by_phone = match &kind.phone {
        Some(number) => {
            let mut list = state
                .store
                .messages_to(tenant, number, before, PAGE + 1)
                .await?;
            let older = (list.len() > PAGE as usize).then(|| {
                list.truncate(PAGE as usize);
                list.last()
                    .map(|m| decide::cursor(m.created_at, m.id))
                    .unwrap_or_default()
            });
            Some((number.clone(), list, older))
        }
        None => None,
    };
    if by_phone.is_none()
        && before.is_none()
        && let [(_, only)] = exact.as_slice()
    {
        return Ok(see_other(&format!("/console/messages/{}", only.id)));
    }
    let results = pages::Results {
        exact,
        by_phone,
        paged: before.is_some(),
        national_without_home: kind.national && home.is_none(),
    };
    Ok(Html(pages::search(&session, &q, Some(&results)).into_string()).into_response())
}

async fn timeline(
    State(state): State<SharedState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Path(id) = id.map_err(|_| PageError::NotFound)?;
    let id = decide::parse_message_id(&id).ok_or(PageError::NotFound)?;
    let m = state
        .store
        .tenant_message(session.tenant_id, id)
        .await?
        .ok_or(PageError::NotFound)?;
    let attempts = state.store.attempts(m.id).await?;
    let routing = state.store.message_events(m.id).await?;
    let receipts = state.store.receipts(m.id).await?;
    let webhooks = state
        .store
        .message_webhook_deliveries(session.tenant_id, m.id)
        .await?;
    let entries = decide::timeline(&m, &attempts, &routing, &receipts, &webhooks, session.zone);
    // A verification's SMS is stored sealed: show its template, code masked.
    let verification = match m
        .metadata
        .get("verification_id")
        .and_then(|v| crate::verify::parse_id(v))
    {
        Some(id) => state.store.verification(session.tenant_id, id).await?,
        None => None,
    };
    let body = match &verification {
        Some(v) => crate::verify::masked(v),
        None => decide::masked_body(&m.body),
    };
    Ok(Html(
        pages::timeline(
            &session,
            &m,
            &body,
            verification.as_ref(),
            &entries,
            &webhooks,
        )
        .into_string(),
    )
    .into_response())
}

async fn verification(
    State(state): State<SharedState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Path(id) = id.map_err(|_| PageError::NotFound)?;
    let id = crate::verify::parse_id(&id).ok_or(PageError::NotFound)?;
    let v = state
        .store
        .verification(session.tenant_id, id)
        .await?
        .ok_or(PageError::NotFound)?;
    let mut messages = Vec::new();
    for n in 1..=v.sends {
        for key in v.step_keys(n) {
            let Some(m) = state.store.message(session.tenant_id, &key).await? else {
                break;
            };
            messages.push(summary(&m));
        }
    }
    let status = crate::verify::decide::status_at(&v.state(), state.clock.now());
    Ok(
        Html(pages::verification(&session, &v, status.as_str(), &messages).into_string())
            .into_response(),
    )
}

async fn overview(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let now = state.clock.now();
    let counts = state
        .store
        .overview(session.tenant_id, now - time::Duration::DAY)
        .await?;
    let spend = state.store.spend_summary(session.tenant_id, now).await?;
    Ok(Html(pages::overview(&session, &counts, &spend, now).into_string()).into_response())
}

/// The routes page: admin keys only (routes are the installation's).
async fn routes(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    if !session.scopes.contains(crate::scopes::Scope::Admin) || session.test {
        return Err(PageError::Forbidden(
            "The routes page needs a key with the admin scope: routes are the installation's, not one tenant's.",
        ));
    }
    let report = state.quality.report().await?;
    Ok(Html(routes_page::routes(&session, &report).into_string()).into_response())
}

/// Messages the outbox page shows.
const OUTBOX_PAGE: u32 = 50;

/// The local outbox (the simulated provider's sends, codes included), only
/// while every configured provider is `simulated`.
async fn outbox(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let refusal = crate::outbox::refusal(&state.deliverer.provider_names());
    let entries = match refusal {
        Some(_) => Vec::new(),
        None => {
            let entries = state
                .store
                .outbox(
                    crate::outbox::OUTBOX_PROVIDER,
                    Some(session.tenant_id),
                    None,
                    OUTBOX_PAGE,
                )
                .await?;
            crate::outbox::opened(entries, &state.verify.secret).await
        }
    };
    Ok(Html(pages::outbox(&session, refusal.as_deref(), &entries).into_string()).into_response())
}

#[derive(Deserialize)]
struct OptOutQuery {
    q: Option<String>,
    after: Option<String>,
    done: Option<String>,
}

async fn opt_outs(
    State(state): State<SharedState>,
    headers: HeaderMap,
    query: Result<Query<OptOutQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    let Some(session) = current(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Query(query) = query.map_err(|_| PageError::BadRequest("Unreadable search.".into()))?;
    let q = query.q.unwrap_or_default();
    let prefix = if q.trim().is_empty() {
        "+".to_string()
    } else {
        decide::number_prefix(&q).ok_or_else(|| {
            PageError::BadRequest(
                "Search opt-outs by a phone number or its beginning, e.g. +1415.".into(),
            )
        })?
    };
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(a) => Some(
            decide::number_prefix(a)
                .ok_or_else(|| PageError::BadRequest("That page link is not valid.".into()))?,
        ),
    };
    let mut list = state
        .store
        .search_opt_outs(
            session.tenant_id,
            &prefix,
            after.as_deref(),
            OPT_OUT_PAGE + 1,
        )
        .await?;
    let next = (list.len() > OPT_OUT_PAGE as usize).then(|| {
        list.truncate(OPT_OUT_PAGE as usize);
        list.last().map(|o| o.number.clone()).unwrap_or_default()
    });
    let notice = match query.done.as_deref() {
        Some("added") => Some("The number was added to the opt-out list."),
        Some("exists") => Some("The number was already on the opt-out list."),
        Some("removed") => Some("The number was removed from the opt-out list."),
        Some("absent") => Some("The number was not on the opt-out list."),
        _ => None,
    };
    Ok(
        Html(pages::opt_outs(&session, &q, &list, next.as_deref(), notice).into_string())
            .into_response(),
    )
}

/// Why an opt-out form was refused to a key without the scope.
const NO_OPT_OUT_SCOPE: &str = "This API key does not have the opt-outs scope: opt-outs can be viewed, not changed. Nothing was changed.";

fn posted_number(fields: &[(String, String)]) -> Result<String, PageError> {
    field(fields, "number")
        .and_then(phone::parse)
        .map(|p| p.e164)
        .ok_or_else(|| {
            PageError::BadRequest(
                "That is not a valid phone number in international form, e.g. +14155550100. Nothing was changed."
                    .into(),
            )
        })
}

async fn add_opt_out(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, PageError> {
    let body = read_form(&state, body).await?;
    let (session, fields) = posted(&state, &headers, &body).await?;
    if !session.may_edit_opt_outs() {
        return Err(PageError::Forbidden(NO_OPT_OUT_SCOPE));
    }
    let number = posted_number(&fields)?;
    let added = state
        .store
        .add_opt_out_by(
            session.tenant_id,
            &number,
            &session.key_prefix,
            state.clock.now(),
        )
        .await?;
    let done = if added { "added" } else { "exists" };
    Ok(see_other(&format!(
        "/console/opt-outs?done={done}&q={}",
        enc(&number)
    )))
}

async fn remove_opt_out(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, PageError> {
    let body = read_form(&state, body).await?;
    let (session, fields) = posted(&state, &headers, &body).await?;
    if !session.may_edit_opt_outs() {
        return Err(PageError::Forbidden(NO_OPT_OUT_SCOPE));
    }
    let number = posted_number(&fields)?;
    let removed = state
        .store
        .remove_opt_out(session.tenant_id, &number)
        .await?;
    let done = if removed { "removed" } else { "absent" };
    Ok(see_other(&format!("/console/opt-outs?done={done}")))
}
