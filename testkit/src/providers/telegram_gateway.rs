//! The mock's Telegram Gateway API (verification codes to a phone number's
//! Telegram account), written from <https://core.telegram.org/gateway/api>:
//! methods at `<base>/<methodName>` (served here at the root:
//! `POST /checkSendAbility`, `/sendVerificationMessage`,
//! `/revokeVerificationMessage`, `/checkVerificationStatus`), the token as
//! `Authorization: Bearer <token>` (or the `access_token` parameter), the
//! parameters as JSON or form, every answer `{"ok":true,"result":...}` or
//! `{"ok":false,"error":"ERROR_NAME"}`. The answers carry a
//! `RequestStatus` (`request_id`, `phone_number`, `request_cost`,
//! `remaining_balance`, and `delivery_status` once a message was sent).
//! The real API answers errors in the body; the mock also gives them an
//! HTTP status: 400 for an API error, 401 `ACCESS_TOKEN_INVALID` for a
//! token other than the one set, 429 `FLOOD_WAIT`, 500 `INTERNAL_ERROR`.
//!
//! `checkSendAbility` mints a request id bound to its phone number (or
//! `PHONE_NUMBER_NOT_FOUND` for a number made not on Telegram);
//! `sendVerificationMessage` with that `request_id` sends the message.
//! What a second send with the same request id does is left open by the
//! documentation ("repeated calls will result in an error": no error name,
//! nothing about whether the error means nothing went out, nor about a
//! repeat racing the first), so by default the mock takes the worst case:
//! every accepted send makes a message, a repeat included. On demand
//! ([`MockProvider::gateway_refuse_repeats`]) a repeat of a request id that
//! already made a message is answered with an error of the given name and
//! makes nothing, as the documentation says. Without a `request_id` every
//! accepted send is a new message. Messages are counted per (phone number,
//! code) (`MockProvider::deliveries_to`; the code is empty when the caller
//! let the Gateway make one, which the mock does not model).
//!
//! The common behaviours (`MockProvider::push`, then the random `Faults`)
//! apply to `sendVerificationMessage` as to the other protocols: a 429 is
//! `FLOOD_WAIT`, a 401 `ACCESS_TOKEN_INVALID`, a 5xx `INTERNAL_ERROR`,
//! another 4xx a 400 with the scripted body's `error` (else `BAD_REQUEST`);
//! accept-then-drop, hang and the rest as everywhere. `checkSendAbility`
//! has a queue of its own (`MockProvider::push_gateway_check`), then a
//! failure rate of its own (`MockProvider::set_gateway_check_failures`),
//! and otherwise answers as its state says. Delivery reports are not sent;
//! [`gateway_report`] signs one as the Gateway does (`X-Request-Timestamp`,
//! `X-Request-Signature`: hex HMAC-SHA256 over `timestamp + "\n" + body`,
//! keyed with the SHA-256 digest of the token).

use std::collections::{HashMap, HashSet, VecDeque};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::mock_provider::{
    Answer, Behaviour, Busy, Call, DropSwitch, MockProvider, Played, json_answer, play,
};

/// The Gateway API's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router
        .route("/checkSendAbility", post(check_send_ability))
        .route("/sendVerificationMessage", post(send_verification_message))
        .route(
            "/revokeVerificationMessage",
            post(revoke_verification_message),
        )
        .route("/checkVerificationStatus", post(check_verification_status))
}

/// What only the Gateway API keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    /// The API token, when the mock checks it.
    token: Option<String>,
    /// Numbers (digits only) with no Telegram account.
    not_on_telegram: HashSet<String>,
    /// Request ids issued, with the phone number each was issued for.
    issued: HashMap<String, String>,
    messages: Vec<GatewayMessage>,
    /// Phone numbers checked (`checkSendAbility`), in order, each with how
    /// many calls (`MockProvider::calls`, every protocol's) came before it.
    checks: Vec<(String, usize)>,
    /// Request ids revoked, in order.
    revoked: Vec<String>,
    /// Behaviours for the next `checkSendAbility` calls.
    check_script: VecDeque<Behaviour>,
    /// Once the script is empty: the share of `checkSendAbility` calls
    /// answered 500 `INTERNAL_ERROR` (a Gateway that cannot check now).
    check_failures: f64,
    /// The error a repeat of a request id that already made a message is
    /// answered with, making nothing; `None` (the default): a repeat makes
    /// another message.
    refuse_repeats: Option<String>,
    /// `revokeVerificationMessage` calls received (answered or not).
    revoke_calls: usize,
    /// While set, `revokeVerificationMessage` waits before it acts.
    revokes_held: Option<tokio::sync::watch::Receiver<bool>>,
    /// How long `revokeVerificationMessage` takes before it acts (drawn
    /// between zero and this), so that reports arrive during revokes.
    revoke_latency: std::time::Duration,
}

/// A verification message the Gateway sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayMessage {
    pub request_id: String,
    pub phone_number: String,
    /// The caller's code (`None`: it asked the Gateway to make one).
    pub code: Option<String>,
    pub ttl: Option<u64>,
    pub callback_url: Option<String>,
    pub payload: Option<String>,
    /// `sent`, `delivered`, `read`, `expired` or `revoked`.
    pub status: String,
    /// When `status` was set, in unix seconds.
    pub updated_at: i64,
}

impl MockProvider {
    /// Checks the Bearer token (a mismatch: 401 `ACCESS_TOKEN_INVALID`).
    pub fn set_gateway_token(&self, token: &str) {
        self.lock().protocol::<Protocol>().token = Some(token.into());
    }

    /// `phone` has no Telegram account: `PHONE_NUMBER_NOT_FOUND`.
    pub fn gateway_not_on_telegram(&self, phone: &str) {
        let digits = phone.trim_start_matches('+').to_string();
        self.lock()
            .protocol::<Protocol>()
            .not_on_telegram
            .insert(digits);
    }

    /// The messages sent, oldest first.
    pub fn gateway_messages(&self) -> Vec<GatewayMessage> {
        self.lock().protocol::<Protocol>().messages.clone()
    }

    /// The phone numbers `checkSendAbility` was called with, in order.
    pub fn gateway_checks(&self) -> Vec<String> {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        p.checks.iter().map(|(phone, _)| phone.clone()).collect()
    }

    /// The `checkSendAbility` calls in order, each as its phone number and
    /// how many of [`MockProvider::calls`] came before it (so that a check
    /// can be placed before or after another protocol's call).
    pub fn gateway_checks_placed(&self) -> Vec<(String, usize)> {
        self.lock().protocol::<Protocol>().checks.clone()
    }

    /// Answers a repeat of a request id that already made a message with
    /// the error `name` and makes nothing (as the documentation says of
    /// repeats); by default a repeat makes another message.
    pub fn gateway_refuse_repeats(&self, name: &str) {
        self.lock().protocol::<Protocol>().refuse_repeats = Some(name.into());
    }

    /// Holds the answer to every `revokeVerificationMessage` call (acted on
    /// when received, as the Gateway does) until the returned sender is
    /// dropped or sends `false`.
    pub fn gateway_hold_revokes(&self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(true);
        self.lock().protocol::<Protocol>().revokes_held = Some(rx);
        tx
    }

    /// Makes every `revokeVerificationMessage` answer take up to `latency`
    /// (drawn per call; it acts when received).
    pub fn set_gateway_revoke_latency(&self, latency: std::time::Duration) {
        self.lock().protocol::<Protocol>().revoke_latency = latency;
    }

    /// How many `revokeVerificationMessage` calls arrived (acted on or held).
    pub fn gateway_revoke_calls(&self) -> usize {
        self.lock().protocol::<Protocol>().revoke_calls
    }

    /// The request ids revoked, in order.
    pub fn gateway_revoked(&self) -> Vec<String> {
        self.lock().protocol::<Protocol>().revoked.clone()
    }

    /// Sets the delivery status of `request_id`'s message (`delivered`,
    /// `read`, `expired`...); nothing if there is none.
    pub fn gateway_set_status(&self, request_id: &str, status: &str) {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        if let Some(m) = p.messages.iter_mut().find(|m| m.request_id == request_id) {
            m.status = status.to_string();
            m.updated_at = now();
        }
    }

    /// Queues behaviours for the next `checkSendAbility` calls, in order.
    pub fn push_gateway_check(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.lock()
            .protocol::<Protocol>()
            .check_script
            .extend(behaviours);
    }

    /// Answers this share (0 to 1) of the `checkSendAbility` calls that
    /// have no scripted behaviour 500 `INTERNAL_ERROR`.
    pub fn set_gateway_check_failures(&self, share: f64) {
        self.lock().protocol::<Protocol>().check_failures = share.clamp(0.0, 1.0);
    }

    /// The `RequestStatus` a delivery report of `request_id`'s message
    /// would carry (`None` if no message was sent for it).
    pub fn gateway_report_of(&self, request_id: &str) -> Option<serde_json::Value> {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        p.messages
            .iter()
            .find(|m| m.request_id == request_id)
            .map(message_status)
    }

    fn gateway_mint(&self, phone: &str) -> String {
        let mut inner = self.lock();
        mint(inner.protocol::<Protocol>(), phone)
    }

    /// Makes the message unless `request_id` already has one.
    fn gateway_create(&self, want: Want) -> Result<GatewayMessage, String> {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        let request_id = match want.request_id {
            Some(id) if p.messages.iter().any(|m| m.request_id == id) => {
                if let Some(name) = &p.refuse_repeats {
                    return Err(name.clone());
                }
                id
            }
            Some(id) => id,
            None => mint(p, &want.phone_number),
        };
        let m = GatewayMessage {
            request_id,
            phone_number: want.phone_number,
            code: want.code,
            ttl: want.ttl,
            callback_url: want.callback_url,
            payload: want.payload,
            status: "sent".into(),
            updated_at: now(),
        };
        p.messages.push(m.clone());
        let key = (m.phone_number.clone(), m.code.clone().unwrap_or_default());
        *inner.by_recipient_body.entry(key).or_default() += 1;
        Ok(m)
    }
}

/// The hex HMAC-SHA256 the Gateway signs a delivery report with
/// (`X-Request-Signature`): over `timestamp + "\n" + body`, keyed with the
/// SHA-256 digest of the API token.
pub fn gateway_signature(token: &str, timestamp: &str, body: &[u8]) -> String {
    let key = Sha256::digest(token.as_bytes());
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        unreachable!("HMAC-SHA256 refused a 32-byte key");
    };
    mac.update(timestamp.as_bytes());
    mac.update(b"\n");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A delivery report of `request_status` as the Gateway posts it at
/// `timestamp` (unix seconds, its `X-Request-Timestamp`): the body and its
/// `X-Request-Signature`.
pub fn gateway_report(
    token: &str,
    timestamp: i64,
    request_status: &serde_json::Value,
) -> (String, String) {
    let body = request_status.to_string();
    let signature = gateway_signature(token, &timestamp.to_string(), body.as_bytes());
    (body, signature)
}

/// A send that passed validation.
struct Want {
    phone_number: String,
    request_id: Option<String>,
    code: Option<String>,
    ttl: Option<u64>,
    callback_url: Option<String>,
    payload: Option<String>,
}

type Params = HashMap<String, serde_json::Value>;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A new request id (16 hex digits) for `phone`.
fn mint(p: &mut Protocol, phone: &str) -> String {
    loop {
        let id = format!("{:016x}", rand::random::<u64>());
        if !p.issued.contains_key(&id) {
            p.issued.insert(id.clone(), phone.to_string());
            return id;
        }
    }
}

/// The number's digits, if it is one (`+` and 1 to 15 digits, or digits).
fn phone_digits(phone: &str) -> Option<&str> {
    let digits = phone.strip_prefix('+').unwrap_or(phone);
    let ok = (1..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit());
    ok.then_some(digits)
}

/// The parameters, from a JSON or a form body.
fn params(headers: &HeaderMap, body: &[u8]) -> Params {
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json_body {
        serde_json::from_slice(body).unwrap_or_default()
    } else {
        form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), serde_json::Value::String(v.into_owned())))
            .collect()
    }
}

/// A parameter as text (a JSON number too).
fn param(params: &Params, name: &str) -> Option<String> {
    match params.get(name)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Whether the call carries the token set (any, if none is).
fn authorized(token: Option<&str>, headers: &HeaderMap, params: &Params) -> bool {
    let Some(token) = token else { return true };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    bearer.or_else(|| param(params, "access_token")).as_deref() == Some(token)
}

fn request_status(
    request_id: &str,
    phone_number: &str,
    delivery: Option<(&str, i64)>,
) -> serde_json::Value {
    let mut status = serde_json::json!({
        "request_id": request_id,
        "phone_number": phone_number,
        "request_cost": 0.01,
        "remaining_balance": 100.0,
    });
    if let Some((s, updated_at)) = delivery {
        status["delivery_status"] = serde_json::json!({"status": s, "updated_at": updated_at});
    }
    status
}

fn message_status(m: &GatewayMessage) -> serde_json::Value {
    let mut status = request_status(
        &m.request_id,
        &m.phone_number,
        Some((&m.status, m.updated_at)),
    );
    if let Some(payload) = &m.payload {
        status["payload"] = serde_json::json!(payload);
    }
    status
}

fn ok(result: serde_json::Value) -> Response {
    json_answer(
        StatusCode::OK,
        &serde_json::json!({"ok": true, "result": result}),
        None,
    )
}

fn error(status: StatusCode, name: &str) -> Response {
    json_answer(
        status,
        &serde_json::json!({"ok": false, "error": name}),
        None,
    )
}

/// An API error (400).
fn refuse(name: &str) -> Response {
    error(StatusCode::BAD_REQUEST, name)
}

fn failure(status: u16, body: Option<&serde_json::Value>) -> Response {
    match status {
        429 => {
            let name = body
                .and_then(|b| b.get("error"))
                .and_then(|e| e.as_str())
                .unwrap_or("FLOOD_WAIT");
            error(StatusCode::TOO_MANY_REQUESTS, name)
        }
        401 => error(StatusCode::UNAUTHORIZED, "ACCESS_TOKEN_INVALID"),
        300..=499 => {
            let name = body
                .and_then(|b| b.get("error"))
                .and_then(|e| e.as_str())
                .unwrap_or("BAD_REQUEST");
            refuse(name)
        }
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR"),
    }
}

/// The phone number's refusal, if any: invalid, or not on Telegram.
fn phone_refusal(phone: &str, p: &mut Protocol) -> Option<&'static str> {
    match phone_digits(phone) {
        None => Some("PHONE_NUMBER_INVALID"),
        Some(digits) if p.not_on_telegram.contains(digits) => Some("PHONE_NUMBER_NOT_FOUND"),
        Some(_) => None,
    }
}

async fn check_send_ability(
    State(mock): State<MockProvider>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = params(&headers, &body);
    let phone = param(&params, "phone_number").unwrap_or_default();
    let busy = Busy::new(&mock);
    let (behaviour, refusal) = {
        let mut inner = mock.lock();
        let before = inner.calls.len();
        let p = inner.protocol::<Protocol>();
        p.checks.push((phone.clone(), before));
        let behaviour = p.check_script.pop_front().unwrap_or_else(|| {
            use rand::Rng;
            let fails = p.check_failures > 0.0 && rand::rng().random_bool(p.check_failures);
            if fails {
                Behaviour::Fail {
                    status: 500,
                    body: serde_json::json!({"ok": false, "error": "INTERNAL_ERROR"}),
                    retry_after: None,
                }
            } else {
                Behaviour::Accept
            }
        });
        if !authorized(p.token.as_deref(), &headers, &params) {
            return error(StatusCode::UNAUTHORIZED, "ACCESS_TOKEN_INVALID");
        }
        (behaviour, phone_refusal(&phone, p))
    };
    if let Some(name) = refusal {
        return refuse(name);
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, phone) = (mock.clone(), phone.clone());
        move || mock.gateway_mint(&phone)
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(id) => return ok(request_status(&id, &phone, None)),
        Played::Lost => return failure(500, None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => ok(request_status(&create(), &phone, None)),
        Answer::Fail { status, body, .. } => failure(status, Some(&body)),
        Answer::AcceptThenFail { status } | Answer::AcceptThenRetryLater { status, .. } => {
            create();
            failure(status.max(500), None)
        }
        Answer::RejectQuoting { .. } => refuse(&format!("PHONE_NUMBER_INVALID: {phone}")),
    }
}

/// Validates a send in the documented order (the request id last).
fn validate(params: &Params, p: &mut Protocol) -> Result<Want, String> {
    let phone_number = param(params, "phone_number").unwrap_or_default();
    if let Some(name) = phone_refusal(&phone_number, p) {
        return Err(name.into());
    }
    let code = param(params, "code");
    if let Some(c) = &code
        && !((4..=8).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("CODE_INVALID".into());
    }
    let ttl = match param(params, "ttl") {
        None => None,
        Some(t) => match t.parse::<u64>() {
            Ok(secs) if (30..=3600).contains(&secs) => Some(secs),
            _ => return Err("TTL_INVALID".into()),
        },
    };
    let callback_url = param(params, "callback_url");
    if callback_url
        .as_deref()
        .is_some_and(|u| !u.starts_with("https://"))
    {
        return Err("CALLBACK_URL_INVALID".into());
    }
    let request_id = param(params, "request_id");
    if let Some(id) = &request_id {
        let same_phone = p
            .issued
            .get(id)
            .is_some_and(|issued| phone_digits(issued) == phone_digits(&phone_number));
        if !same_phone {
            return Err("REQUEST_ID_INVALID".into());
        }
        if let Some(name) = &p.refuse_repeats
            && p.messages.iter().any(|m| &m.request_id == id)
        {
            return Err(name.clone());
        }
    }
    Ok(Want {
        phone_number,
        request_id,
        code,
        ttl,
        callback_url,
        payload: param(params, "payload"),
    })
}

async fn send_verification_message(
    State(mock): State<MockProvider>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = params(&headers, &body);
    let busy = Busy::new(&mock);
    let (behaviour, latency, want) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "telegram_gateway".into(),
            idempotency_key: None,
            authorization: None,
            body: serde_json::to_value(&params).unwrap_or(serde_json::Value::Null),
        });
        let (behaviour, latency) = inner.next_behaviour();
        let p = inner.protocol::<Protocol>();
        if !authorized(p.token.as_deref(), &headers, &params) {
            return error(StatusCode::UNAUTHORIZED, "ACCESS_TOKEN_INVALID");
        }
        (behaviour, latency, validate(&params, p))
    };
    let want = match want {
        Ok(want) => want,
        Err(name) => return refuse(&name),
    };
    let code = want.code.clone().unwrap_or_default();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let mock = mock.clone();
        move || mock.gateway_create(want)
    };
    let answer = |made: Result<GatewayMessage, String>| match made {
        Ok(m) => ok(message_status(&m)),
        Err(name) => refuse(&name),
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(made) => return answer(made),
        Played::Lost => return failure(500, None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => answer(create()),
        Answer::Fail { status, body, .. } => failure(status, Some(&body)),
        Answer::AcceptThenFail { status } | Answer::AcceptThenRetryLater { status, .. } => {
            let _ = create();
            failure(status.max(500), None)
        }
        Answer::RejectQuoting { .. } => refuse(&format!("CODE_INVALID: {code}")),
    }
}

async fn revoke_verification_message(
    State(mock): State<MockProvider>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = params(&headers, &body);
    // The Gateway acts on the revoke when it receives it (a message sent
    // under the request id later is not withdrawn by it); only its answer
    // takes the latency, or waits while a test holds revokes.
    let (answer, held, latency) = {
        let mut inner = mock.lock();
        let p = inner.protocol::<Protocol>();
        p.revoke_calls += 1;
        let answer = if !authorized(p.token.as_deref(), &headers, &params) {
            error(StatusCode::UNAUTHORIZED, "ACCESS_TOKEN_INVALID")
        } else if let Some(id) =
            param(&params, "request_id").filter(|id| p.issued.contains_key(id))
        {
            p.revoked.push(id.clone());
            if let Some(m) = p
                .messages
                .iter_mut()
                .find(|m| m.request_id == id && m.status == "sent")
            {
                m.status = "revoked".into();
                m.updated_at = now();
            }
            ok(serde_json::Value::Bool(true))
        } else {
            refuse("REQUEST_ID_INVALID")
        };
        (answer, p.revokes_held.clone(), p.revoke_latency)
    };
    if let Some(mut held) = held {
        // Until the test lets go (a sender dropped counts as letting go).
        let _ = held.wait_for(|on| !*on).await;
    }
    if !latency.is_zero() {
        let wait = {
            use rand::Rng;
            let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
            std::time::Duration::from_nanos(rand::rng().random_range(0..=nanos))
        };
        tokio::time::sleep(wait).await;
    }
    answer
}

async fn check_verification_status(
    State(mock): State<MockProvider>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = params(&headers, &body);
    let mut inner = mock.lock();
    let p = inner.protocol::<Protocol>();
    if !authorized(p.token.as_deref(), &headers, &params) {
        return error(StatusCode::UNAUTHORIZED, "ACCESS_TOKEN_INVALID");
    }
    let id = param(&params, "request_id").unwrap_or_default();
    let Some(phone) = p.issued.get(&id) else {
        return refuse("REQUEST_ID_INVALID");
    };
    let message = p.messages.iter().find(|m| m.request_id == id);
    let mut status = match message {
        Some(m) => message_status(m),
        None => request_status(&id, phone, None),
    };
    if let Some(entered) = param(&params, "code") {
        let verdict = match message {
            Some(m) if m.status == "expired" => "expired",
            Some(m) if m.code.as_deref() == Some(entered.as_str()) => "code_valid",
            _ => "code_invalid",
        };
        status["verification_status"] = serde_json::json!({
            "status": verdict,
            "updated_at": now(),
            "code_entered": entered,
        });
    }
    ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn start() -> (MockProvider, String, reqwest::Client) {
        sendonce::install_crypto_provider();
        let (mock, _, addr) = match MockProvider::start().await {
            Ok(started) => started,
            Err(e) => panic!("mock did not start: {e}"),
        };
        let client = match reqwest::Client::builder().build() {
            Ok(c) => c,
            Err(e) => panic!("no client: {e}"),
        };
        (mock, format!("http://{addr}"), client)
    }

    /// Calls `method` with a JSON body; the HTTP status and the answer.
    async fn call(
        client: &reqwest::Client,
        base: &str,
        method: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let resp = client
            .post(format!("{base}/{method}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, "Bearer tok")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or_default())
    }

    #[tokio::test]
    async fn a_request_id_sends_one_message_once() {
        let (mock, base, client) = start().await;
        mock.set_gateway_token("tok");
        let (status, check) = call(
            &client,
            &base,
            "checkSendAbility",
            serde_json::json!({"phone_number": "+15550001"}),
        )
        .await;
        assert_eq!(status, 200, "{check}");
        assert!(check["result"].get("delivery_status").is_none());
        let id = check["result"]["request_id"].as_str().unwrap_or_default();
        assert_eq!(id.len(), 16);
        assert_eq!(mock.gateway_checks(), ["+15550001"]);
        assert_eq!(mock.gateway_checks_placed(), [("+15550001".into(), 0)]);

        let send = serde_json::json!({
            "phone_number": "+15550001", "request_id": id, "code": "123456", "ttl": 60,
        });
        let (status, sent) = call(&client, &base, "sendVerificationMessage", send.clone()).await;
        assert_eq!(status, 200, "{sent}");
        assert_eq!(sent["result"]["request_id"], id);
        assert_eq!(sent["result"]["delivery_status"]["status"], "sent");
        assert_eq!(mock.deliveries_to("+15550001", "123456"), 1);

        // The documented error for a repeat, when asked for: nothing made.
        mock.gateway_refuse_repeats("REQUEST_ID_REPEATED");
        let (status, again) = call(&client, &base, "sendVerificationMessage", send).await;
        assert_eq!(
            (status, &again["error"]),
            (400, &"REQUEST_ID_REPEATED".into())
        );
        assert_eq!(mock.gateway_messages().len(), 1);
        assert_eq!(mock.deliveries_to("+15550001", "123456"), 1);
        assert_eq!(mock.calls().len(), 2);
        assert_eq!(mock.calls()[0].endpoint, "telegram_gateway");

        let (_, verified) = call(
            &client,
            &base,
            "checkVerificationStatus",
            serde_json::json!({"request_id": id, "code": "123456"}),
        )
        .await;
        assert_eq!(
            verified["result"]["verification_status"]["status"],
            "code_valid"
        );
        let (_, revoked) = call(
            &client,
            &base,
            "revokeVerificationMessage",
            serde_json::json!({"request_id": id}),
        )
        .await;
        assert_eq!(revoked["result"], true);
        assert_eq!(mock.gateway_revoked(), [id]);
        assert_eq!(mock.gateway_messages()[0].status, "revoked");
    }

    #[tokio::test]
    async fn by_default_a_repeated_request_id_makes_another_message() {
        let (mock, base, client) = start().await;
        let (_, check) = call(
            &client,
            &base,
            "checkSendAbility",
            serde_json::json!({"phone_number": "+15550003"}),
        )
        .await;
        let id = check["result"]["request_id"].as_str().unwrap_or_default();
        let send = serde_json::json!({
            "phone_number": "+15550003", "request_id": id, "code": "654321",
        });
        for _ in 0..2 {
            let (status, sent) = call(&client, &base, "sendVerificationMessage", send.clone()).await;
            assert_eq!(status, 200, "{sent}");
        }
        // The worst case the documentation leaves open: two on the phone.
        assert_eq!(mock.deliveries_to("+15550003", "654321"), 2);
        assert_eq!(mock.gateway_messages().len(), 2);
    }

    #[tokio::test]
    async fn refusals() {
        let (mock, base, client) = start().await;
        mock.set_gateway_token("tok");
        mock.gateway_not_on_telegram("+15550002");
        for method in ["checkSendAbility", "sendVerificationMessage"] {
            let (status, answer) = call(
                &client,
                &base,
                method,
                serde_json::json!({"phone_number": "15550002", "code": "1234"}),
            )
            .await;
            assert_eq!(status, 400, "{method}");
            assert_eq!(
                answer,
                serde_json::json!({"ok": false, "error": "PHONE_NUMBER_NOT_FOUND"})
            );
        }
        let cases = [
            (
                serde_json::json!({"phone_number": "+1-555"}),
                "PHONE_NUMBER_INVALID",
            ),
            (
                serde_json::json!({"phone_number": "+1555", "code": "12"}),
                "CODE_INVALID",
            ),
            (
                serde_json::json!({"phone_number": "+1555", "ttl": 10}),
                "TTL_INVALID",
            ),
            (
                serde_json::json!({"phone_number": "+1555", "callback_url": "http://x"}),
                "CALLBACK_URL_INVALID",
            ),
            (
                serde_json::json!({"phone_number": "+1555", "request_id": "nope"}),
                "REQUEST_ID_INVALID",
            ),
        ];
        for (body, want) in cases {
            let (status, answer) = call(&client, &base, "sendVerificationMessage", body).await;
            assert_eq!((status, answer["error"].as_str()), (400, Some(want)));
        }
        // A request id issued for another number.
        let (_, check) = call(
            &client,
            &base,
            "checkSendAbility",
            serde_json::json!({"phone_number": "+15550003"}),
        )
        .await;
        let (_, answer) = call(
            &client,
            &base,
            "sendVerificationMessage",
            serde_json::json!({"phone_number": "+15550004", "request_id": check["result"]["request_id"]}),
        )
        .await;
        assert_eq!(answer["error"], "REQUEST_ID_INVALID");
        assert!(mock.gateway_messages().is_empty());

        // Another token, and a form body without one.
        mock.set_gateway_token("other");
        let (status, answer) = call(
            &client,
            &base,
            "checkSendAbility",
            serde_json::json!({"phone_number": "+1555"}),
        )
        .await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (401, Some("ACCESS_TOKEN_INVALID"))
        );
        let resp = client
            .post(format!("{base}/sendVerificationMessage"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body("phone_number=%2B1555&code=1234&access_token=other")
            .send()
            .await
            .unwrap_or_else(|e| panic!("form send: {e}"));
        assert_eq!(resp.status(), 200);
        assert_eq!(mock.deliveries_to("+1555", "1234"), 1);
    }

    #[tokio::test]
    async fn scripted_behaviours() {
        let (mock, base, client) = start().await;
        mock.push_gateway_check([Behaviour::Fail {
            status: 429,
            body: serde_json::json!({}),
            retry_after: Some(3),
        }]);
        let phone = serde_json::json!({"phone_number": "+15550005"});
        let (status, answer) = call(&client, &base, "checkSendAbility", phone.clone()).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (429, Some("FLOOD_WAIT"))
        );
        let (status, _) = call(&client, &base, "checkSendAbility", phone).await;
        assert_eq!(status, 200);

        mock.push([
            Behaviour::AcceptThenDrop,
            Behaviour::Fail {
                status: 503,
                body: serde_json::json!({}),
                retry_after: None,
            },
        ]);
        let send = serde_json::json!({"phone_number": "+15550005", "code": "4321"});
        let dropped = client
            .post(format!("{base}/sendVerificationMessage"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(send.to_string())
            .send()
            .await;
        assert!(dropped.is_err(), "the connection was closed unanswered");
        assert_eq!(mock.gateway_messages().len(), 1);
        assert_eq!(mock.deliveries_to("+15550005", "4321"), 1);
        let (status, answer) = call(&client, &base, "sendVerificationMessage", send).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (500, Some("INTERNAL_ERROR"))
        );
        assert_eq!(mock.gateway_messages().len(), 1);
    }

    #[test]
    fn report_signature() {
        // python3 -c 'import hmac,hashlib; k=hashlib.sha256(b"tok").digest();
        //   print(hmac.new(k, b"1700000000\n{\"request_id\":\"r1\"}", hashlib.sha256).hexdigest())'
        let want = "c3bdb669a4a4a3357f914d475d0e4d821d01aba0e1a7645e19ded82ff8ecd75c";
        let (body, signature) = gateway_report(
            "tok",
            1_700_000_000,
            &serde_json::json!({"request_id": "r1"}),
        );
        assert_eq!(body, r#"{"request_id":"r1"}"#);
        assert_eq!(signature, want);
        assert_eq!(
            gateway_signature("tok", "1700000000", body.as_bytes()),
            want
        );
    }
}
