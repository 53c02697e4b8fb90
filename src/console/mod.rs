//! The support console: server-rendered pages under `/console` for the
//! people who answer "did my customer get the SMS?".
//!
//! Sign in with a tenant API key; the session is a random id in an
//! `HttpOnly`, `SameSite=Strict` cookie (`Secure` when
//! `SENDONCE_PUBLIC_URL` is https), stored server-side as its SHA-256 with
//! an idle timeout, and ends when its key is revoked. Every form carries the
//! session's CSRF token (the sign-in form a token of its own, in a cookie
//! beside it); a POST without the right one is refused with 403. Pages carry
//! a strict Content-Security-Policy: no script at all, style only from
//! `/console/console.css`. Failed sign-ins are rate limited per instance.
//! One tenant sees only its own data: every read names the session's tenant,
//! and another tenant's message is "not found".
//!
//! The console is a reader of the store; it writes only its own sessions and
//! the opt-outs a support person adds or removes.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::apikey;
use crate::domain::phone;
use crate::http::SharedState;
use crate::store::{MessageRecord, MessageSummary, NewSession, StoreError};

pub mod decide;
#[cfg(test)]
mod decide_tests;
mod pages;

/// A session unused for this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A session's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);
/// Messages per page of a search.
pub const PAGE: u32 = 25;
/// Opt-outs per page.
pub const OPT_OUT_PAGE: u32 = 50;

/// The session cookie.
pub const SESSION_COOKIE: &str = "sendonce_console";
/// The sign-in form's CSRF cookie (there is no session yet).
pub const LOGIN_COOKIE: &str = "sendonce_console_login";

/// The console's Content-Security-Policy: no script, style only from our
/// own stylesheet, forms only to ourselves, never framed.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
    form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's state in one instance: recent failed sign-ins.
#[derive(Debug, Default)]
pub struct ConsoleState {
    failures: Mutex<VecDeque<OffsetDateTime>>,
}

impl ConsoleState {
    fn allowed(&self, now: OffsetDateTime) -> Result<(), Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<_> = failures.iter().copied().collect();
        decide::signin_allowed(&list, now)
    }

    fn failed(&self, now: OffsetDateTime) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.push_back(now);
        while failures.len() > decide::SIGNIN_FAILURES {
            failures.pop_front();
        }
    }
}

pub fn router() -> Router<SharedState> {
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
        .route("/console.css", get(stylesheet))
        .fallback(|| async { PageError::NotFound })
        .method_not_allowed_fallback(|| async { PageError::MethodNotAllowed })
        .layer(axum::middleware::from_fn(console_headers));
    Router::new().nest("/console", console)
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
        let mut resp = (status, Html(pages::error(title, &detail).into_string())).into_response();
        if let PageError::TooManySignIns(wait) = self
            && let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// A signed-in console user.
#[derive(Clone, Debug)]
pub struct Session {
    id_hash: Vec<u8>,
    pub tenant_id: Uuid,
    /// The first characters of the API key signed in with: "who" on changes.
    pub key_prefix: String,
    pub csrf: String,
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The value of cookie `name`, if the request carries it.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for the console (`max_age` 0 removes it).
fn set_cookie(state: &SharedState, name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let secure = state
        .receipts
        .public_url
        .as_deref()
        .is_some_and(|u| u.to_ascii_lowercase().starts_with("https://"));
    let mut c = format!("{name}={value}; Path=/console; HttpOnly; SameSite=Strict");
    if secure {
        c.push_str("; Secure");
    }
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    // Tokens are base64url: always a valid header value.
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The request's live session: `None` without a cookie, with an unknown
/// one, after the idle timeout (the session is then deleted) or once its
/// key was revoked.
async fn current(state: &SharedState, headers: &HeaderMap) -> Result<Option<Session>, PageError> {
    let Some(id) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    if id.len() > 100 {
        return Ok(None);
    }
    let id_hash = hash(id);
    let Some(row) = state.store.session(&id_hash).await? else {
        return Ok(None);
    };
    let now = state.clock.now();
    let idle = Duration::try_from(now - row.last_seen_at).unwrap_or_default();
    if idle >= IDLE_TIMEOUT {
        state.store.delete_session(&id_hash).await?;
        return Ok(None);
    }
    if idle >= TOUCH_EVERY {
        state.store.touch_session(&id_hash, now).await?;
    }
    Ok(Some(Session {
        id_hash,
        tenant_id: row.tenant_id,
        key_prefix: row.key_prefix,
        csrf: row.csrf_token,
    }))
}

fn see_other(to: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

fn to_login() -> Response {
    see_other("/console/login")
}

/// A URL-encoded query value.
pub(crate) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The largest console form read (bytes): a sign-in key or a number and a
/// token; anything longer is refused (413) without being read on.
const FORM_LIMIT: usize = 8 * 1024;

/// A posted form's bytes, read within the body-read timeout and
/// [`FORM_LIMIT`] before anything else is done with the request: a request
/// head announcing a body that never comes is answered 408 at the timeout
/// and its connection closed, instead of holding a connection slot.
async fn read_form(state: &SharedState, body: Body) -> Result<Bytes, PageError> {
    crate::body::read_limited(body, state.body_read_timeout, FORM_LIMIT)
        .await
        .map_err(|e| match e {
            crate::body::BodyError::TooSlow => PageError::RequestTimeout,
            crate::body::BodyError::TooLarge => PageError::PayloadTooLarge,
            crate::body::BodyError::Broken => {
                PageError::BadRequest("The form could not be read.".into())
            }
        })
}

/// A posted form's fields, or why not (415 for another media type).
fn form(headers: &HeaderMap, body: &Bytes) -> Result<Vec<(String, String)>, PageError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(PageError::UnsupportedMediaType);
    }
    Ok(form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

const CSRF_REFUSED: &str = "This form was not sent from a page of this console (its CSRF token is missing or wrong). Nothing was changed.";

/// A POST of a signed-in user: the session, and the form once its CSRF
/// token is checked. Refused with 403 without a session or the token.
async fn posted(
    state: &SharedState,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Session, Vec<(String, String)>), PageError> {
    let Some(session) = current(state, headers).await? else {
        return Err(PageError::Forbidden(
            "You are not signed in (or your session ended). Nothing was changed.",
        ));
    };
    let fields = form(headers, body)?;
    match field(&fields, "csrf") {
        Some(token) if same(token, &session.csrf) => Ok((session, fields)),
        _ => Err(PageError::Forbidden(CSRF_REFUSED)),
    }
}

async fn home(State(state): State<SharedState>, headers: HeaderMap) -> Result<Response, PageError> {
    Ok(match current(&state, &headers).await? {
        Some(_) => see_other("/console/overview"),
        None => to_login(),
    })
}

async fn stylesheet() -> Response {
    let mut resp = include_str!("console.css").into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    resp
}

async fn login_page(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    if current(&state, &headers).await?.is_some() {
        return Ok(see_other("/console/overview"));
    }
    Ok(login_form(&state, &headers, StatusCode::OK, None))
}

/// The sign-in form with its CSRF token, set as a cookie beside it: the
/// browser's token if it has one (so two open sign-in tabs both work), else
/// a fresh one.
fn login_form(
    state: &SharedState,
    headers: &HeaderMap,
    status: StatusCode,
    error: Option<&str>,
) -> Response {
    let token = cookie(headers, LOGIN_COOKIE)
        .filter(|t| {
            t.len() == 43
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .map_or_else(random_token, str::to_string);
    let mut resp = (status, Html(pages::login(&token, error).into_string())).into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(state, LOGIN_COOKIE, &token, None),
    );
    resp
}

async fn login(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, PageError> {
    let body = read_form(&state, body).await?;
    let fields = form(&headers, &body)?;
    let expected = cookie(&headers, LOGIN_COOKIE);
    match (field(&fields, "csrf"), expected) {
        (Some(token), Some(expected)) if same(token, expected) => {}
        _ => return Err(PageError::Forbidden(CSRF_REFUSED)),
    }
    let now = state.clock.now();
    state
        .console
        .allowed(now)
        .map_err(PageError::TooManySignIns)?;
    let key = field(&fields, "api_key").unwrap_or("").trim();
    let auth = if key.starts_with(apikey::PREFIX) && key.len() <= 200 {
        state.store.tenant_for_key(&apikey::hash(key)).await?
    } else {
        None
    };
    let Some(auth) = auth else {
        state.console.failed(now);
        tracing::info!("console sign-in refused");
        return Ok(login_form(
            &state,
            &headers,
            StatusCode::UNAUTHORIZED,
            Some("That API key was not accepted."),
        ));
    };
    let id = random_token();
    let cutoff = now - time::Duration::try_from(IDLE_TIMEOUT).unwrap_or(time::Duration::HOUR);
    state
        .store
        .create_session(
            &NewSession {
                id_hash: hash(&id),
                tenant_id: auth.id,
                key_hash: apikey::hash(key),
                key_prefix: apikey::stored_form(key).prefix,
                csrf_token: random_token(),
                at: now,
            },
            cutoff,
        )
        .await?;
    let mut resp = see_other("/console/overview");
    let h = resp.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(&state, SESSION_COOKIE, &id, None),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(&state, LOGIN_COOKIE, "", Some(0)),
    );
    Ok(resp)
}

async fn logout(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, PageError> {
    let body = read_form(&state, body).await?;
    let (session, _) = posted(&state, &headers, &body).await?;
    state.store.delete_session(&session.id_hash).await?;
    let mut resp = see_other("/console/login");
    resp.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&state, SESSION_COOKIE, "", Some(0)),
    );
    Ok(resp)
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
    let Some(kind) = decide::classify(&q) else {
        return Err(PageError::BadRequest(format!(
            "Search for a message id (msg_…), an idempotency key, a provider message id or a phone number in international form (+…), at most {} characters.",
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
    let tenant = session.tenant_id;
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
    let entries = decide::timeline(&m, &attempts, &routing, &receipts, &webhooks);
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
        if let Some(m) = state
            .store
            .message(session.tenant_id, &crate::store::send_key(v.id, n))
            .await?
        {
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
    Ok(Html(pages::overview(&session, &counts, now).into_string()).into_response())
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
    let number = posted_number(&fields)?;
    let removed = state
        .store
        .remove_opt_out(session.tenant_id, &number)
        .await?;
    let done = if removed { "removed" } else { "absent" };
    Ok(see_other(&format!("/console/opt-outs?done={done}")))
}
