//! Signing in and out of the console, its session cookie, and the forms
//! every POST reads: size and time limits, the session's CSRF token.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    IDLE_TIMEOUT, LOGIN_COOKIE, PageError, SESSION_COOKIE, SESSION_LIFETIME, TOUCH_EVERY, decide,
    pages,
};
use crate::apikey;
use crate::http::SharedState;
use crate::store::NewSession;

/// The console's state in one instance: recent failed sign-ins, per client
/// address ([`decide::signin_peer`]), so one client's failures never hold
/// back another's sign-in. The console's router owns it (an extension), so
/// the API's state knows nothing of the console.
#[derive(Debug, Default)]
pub struct ConsoleState {
    failures: Mutex<HashMap<IpAddr, VecDeque<OffsetDateTime>>>,
}

/// Most client addresses whose failures are remembered; past it the
/// addresses without a recent failure are forgotten first, then the ones
/// whose last failure is oldest.
pub const SIGNIN_PEERS: usize = 10_000;

impl ConsoleState {
    fn allowed(&self, peer: IpAddr, now: OffsetDateTime) -> Result<(), Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<_> = failures
            .get(&peer)
            .map(|f| f.iter().copied().collect())
            .unwrap_or_default();
        decide::signin_allowed(&list, now)
    }

    fn failed(&self, peer: IpAddr, now: OffsetDateTime) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let mine = failures.entry(peer).or_default();
        mine.push_back(now);
        while mine.len() > decide::SIGNIN_FAILURES {
            mine.pop_front();
        }
        if failures.len() > SIGNIN_PEERS {
            failures.retain(|_, f| recent(f, now));
        }
        while failures.len() > SIGNIN_PEERS {
            let oldest = failures
                .iter()
                .min_by_key(|(_, f)| f.back().copied())
                .map(|(ip, _)| *ip);
            match oldest {
                Some(ip) => failures.remove(&ip),
                None => break,
            };
        }
    }
}

/// Whether any of `failures` is still inside the sign-in window.
fn recent(failures: &VecDeque<OffsetDateTime>, now: OffsetDateTime) -> bool {
    let window = time::Duration::try_from(decide::SIGNIN_WINDOW).unwrap_or(time::Duration::MINUTE);
    failures.back().is_some_and(|t| now - *t < window)
}

/// A signed-in console user.
#[derive(Clone, Debug)]
pub struct Session {
    id_hash: Vec<u8>,
    pub tenant_id: Uuid,
    /// The first characters of the API key signed in with: "who" on changes.
    pub key_prefix: String,
    pub csrf: String,
    /// The key's scopes: opt-out forms need `opt-outs`.
    pub scopes: crate::scopes::Scopes,
    /// Signed in with a test-mode key, as the key's record says.
    pub test: bool,
    /// The zone its pages show times in (its tenant's home country's).
    pub zone: super::decide::Zone,
}

impl Session {
    /// Whether it was signed in with a test-mode key (it sees the tenant's
    /// test data only): the pages say so. Read from the key's record, not
    /// its text (issue 41, finding 10).
    pub fn is_test(&self) -> bool {
        self.test
    }

    /// Whether this session may add and remove opt-outs.
    pub fn may_edit_opt_outs(&self) -> bool {
        self.scopes.contains(crate::scopes::Scope::OptOuts)
    }
}

pub(super) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

pub(super) fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The value of cookie `name`, if the request carries it.
pub(super) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for the console (`max_age` 0 removes it): always
/// `Secure` with `Path=/` and no `Domain`, as its `__Host-` name requires.
/// Browsers keep such cookies over https, and over plain http only from
/// `localhost` (a secure context): the console is served over https, or
/// reached on localhost in development.
pub(super) fn set_cookie(name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let mut c = format!("{name}={value}; Path=/; Secure; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    // Tokens are base64url: always a valid header value.
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The request's live session: `None` without a cookie, with an unknown
/// one, after the idle timeout or [`SESSION_LIFETIME`] after sign-in (the
/// session is then deleted) or once its key was revoked.
pub(super) async fn current(
    state: &SharedState,
    headers: &HeaderMap,
) -> Result<Option<Session>, PageError> {
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
    if !row.scopes.contains(crate::scopes::Scope::Read) {
        return Ok(None);
    }
    let now = state.clock.now();
    let idle = Duration::try_from(now - row.last_seen_at).unwrap_or_default();
    let age = Duration::try_from(now - row.created_at).unwrap_or_default();
    if idle >= IDLE_TIMEOUT || age >= SESSION_LIFETIME {
        state.store.delete_session(&id_hash).await?;
        return Ok(None);
    }
    if idle >= TOUCH_EVERY {
        state.store.touch_session(&id_hash, now).await?;
    }
    let home = state.store.home_country(row.tenant_id).await?;
    Ok(Some(Session {
        zone: super::decide::zone_of(home.as_deref()),
        id_hash,
        tenant_id: row.tenant_id,
        key_prefix: row.key_prefix,
        csrf: row.csrf_token,
        scopes: row.scopes,
        test: row.test,
    }))
}

pub(super) fn see_other(to: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

pub(super) fn to_login() -> Response {
    see_other("/console/login")
}

/// A URL-encoded query value.
pub(crate) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The largest console form read (bytes): a sign-in key or a number and a
/// token; anything longer is refused (413) without being read on.
pub(super) const FORM_LIMIT: usize = 8 * 1024;

/// A posted form's bytes, read within the body-read timeout and
/// [`FORM_LIMIT`] before anything else is done with the request: a request
/// head announcing a body that never comes is answered 408 at the timeout
/// and its connection closed, instead of holding a connection slot.
pub(super) async fn read_form(state: &SharedState, body: Body) -> Result<Bytes, PageError> {
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
pub(super) fn form(headers: &HeaderMap, body: &Bytes) -> Result<Vec<(String, String)>, PageError> {
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

pub(super) fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

pub(super) const CSRF_REFUSED: &str = "This form was not sent from a page of this console (its CSRF token is missing or wrong). Nothing was changed.";

/// A POST of a signed-in user: the session, and the form once its CSRF
/// token is checked. Refused with 403 without a session or the token.
pub(super) async fn posted(
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

pub(super) async fn home(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    Ok(match current(&state, &headers).await? {
        Some(_) => see_other("/console/overview"),
        None => to_login(),
    })
}

pub(super) async fn stylesheet() -> Response {
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

pub(super) async fn login_page(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    if current(&state, &headers).await?.is_some() {
        return Ok(see_other("/console/overview"));
    }
    Ok(login_form(&headers, StatusCode::OK, None))
}

/// The sign-in form with its CSRF token, set as a cookie beside it: the
/// browser's token if it has one (so two open sign-in tabs both work), else
/// a fresh one.
pub(super) fn login_form(
    headers: &HeaderMap,
    status: StatusCode,
    error: Option<maud::Markup>,
) -> Response {
    let token = cookie(headers, LOGIN_COOKIE)
        .filter(|t| {
            t.len() == 43
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .map_or_else(random_token, str::to_string);
    let mut resp = (status, Html(pages::login(&token, error).into_string())).into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, &token, None));
    resp
}

pub(super) async fn login(
    State(state): State<SharedState>,
    Extension(signins): Extension<Arc<ConsoleState>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
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
    // Without a TCP peer (a router driven in-process) every sign-in counts
    // as one client's.
    let peer = decide::signin_peer(peer.map_or(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        |Extension(ConnectInfo(a))| a.ip(),
    ));
    signins
        .allowed(peer, now)
        .map_err(PageError::TooManySignIns)?;
    let key = field(&fields, "api_key").unwrap_or("").trim();
    let auth = if key.starts_with(apikey::PREFIX) && key.len() <= 200 {
        state.store.tenant_for_key(&apikey::hash(key)).await?
    } else {
        None
    };
    // The console reads: a key of a disabled tenant is refused as an
    // unknown one is; a key without `read` is told which scope it lacks
    // (as the API's 403 insufficient-scope says to its holder). Both count
    // as failed sign-ins.
    let refusal = match &auth {
        Some(a) if !a.disabled && a.scopes.contains(crate::scopes::Scope::Read) => None,
        Some(a) if !a.disabled => Some(maud::html! {
            "That API key does not have the " code { "read" } " scope the console needs. "
            "Sign in with a key that has it, or make one: "
            code { "sendonce key create TENANT --scopes read" } "."
        }),
        _ => Some(maud::html! { "That API key was not accepted." }),
    };
    let (Some(auth), None) = (auth, refusal.clone()) else {
        signins.failed(peer, now);
        tracing::info!("console sign-in refused");
        return Ok(login_form(&headers, StatusCode::UNAUTHORIZED, refusal));
    };
    // A sign-in is a use of the key (its "last used"), as an API call is.
    if let Err(e) = state.store.touch_key(auth.key_id, now).await {
        tracing::warn!(error = %e, "could not record the API key's last use");
    }
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
    h.append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, &id, None));
    h.append(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, "", Some(0)));
    Ok(resp)
}

pub(super) async fn logout(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, PageError> {
    let body = read_form(&state, body).await?;
    let (session, _) = posted(&state, &headers, &body).await?;
    state.store.delete_session(&session.id_hash).await?;
    let mut resp = see_other("/console/login");
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(SESSION_COOKIE, "", Some(0)));
    Ok(resp)
}
