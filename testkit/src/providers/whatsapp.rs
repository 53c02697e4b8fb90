//! The mock's WhatsApp Business Cloud API, written from Meta's documentation
//! and nothing more: `POST /{version}/{phone-number-id}/messages` with
//! `Authorization: Bearer <token>` and a JSON body (`messaging_product`
//! `whatsapp`, `to`, `type` `template`, `template.name`,
//! `template.language.code`, and for an authentication template the code as
//! the body's one text parameter and the `url` button's (index 0), at most
//! 15 characters; `biz_opaque_callback_data` optional). It answers
//! `{"messaging_product":"whatsapp","contacts":[{"input","wa_id"}],
//! "messages":[{"id":"wamid.…"}]}`, or Graph API's error object
//! `{"error":{"message","type","code","error_data":{"messaging_product",
//! "details"},"error_subcode","fbtrace_id"}}`: 190 (401) for another token,
//! 100 (400) for a malformed request, 131008 for a missing parameter,
//! 132000 when the template's parameters do not fit, 132001 (404) for a
//! template other than the one set.
//!
//! Meta documents no idempotency key, so every accepted send creates a new
//! message, however alike (counted per (to, code):
//! `MockProvider::deliveries_to`). The common behaviours (`MockProvider::push`,
//! then the random `Faults`) apply: a scripted failure whose body is a
//! Graph API error object is answered as it is ([`error_body`] makes one:
//! 130429, 131056, ...); one without is worded by its status (429: 130429,
//! 401: 190, 5xx: 131000, other 4xx: 100); accept-then-drop, hangs, slow
//! answers and the rest as everywhere.
//!
//! Status notifications go, once set ([`MockProvider::whatsapp_webhook`]),
//! to a configured URL for every message created, signed as Meta signs
//! them (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>` keyed
//! with the app secret): `delivered` (`sent`, `delivered`), `read` (`sent`,
//! `delivered`, `read`), `failed` (`sent`, `failed` with error 131026) or
//! none, in order or reversed, each once or twice. [`notification`] and
//! [`signature`] build one for a test to post itself.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::mock_provider::{
    Answer, Busy, Call, DropSwitch, MockProvider, Played, json_answer, play, receipt_client,
};

/// The Cloud API's send route.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router.route("/{version}/{phone_number_id}/messages", post(send))
}

/// Which statuses the mock posts for each message it creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// None.
    #[default]
    None,
    /// `sent`, then `delivered`.
    Delivered,
    /// `sent`, `delivered`, then `read`.
    Read,
    /// `sent`, then `failed` with error 131026 (message undeliverable).
    Failed,
}

/// Where and how the mock posts status notifications.
#[derive(Clone, Debug, Default)]
pub struct Webhook {
    /// The service's `/channels/whatsapp/webhook`.
    pub url: String,
    /// The Meta app secret the notifications are signed with.
    pub app_secret: String,
    pub outcome: Outcome,
    /// Last status first.
    pub reversed: bool,
    /// Each notification posted twice.
    pub duplicated: bool,
}

/// What only the Cloud API keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    /// The access token, when the mock checks it.
    token: Option<String>,
    /// The phone number id, when the mock checks it.
    phone_number_id: Option<String>,
    /// The one template (name, language) that exists, when the mock checks.
    template: Option<(String, String)>,
    messages: Vec<WhatsAppMessage>,
    webhook: Option<Webhook>,
    /// Notifications posted (answered or not), in order, with the HTTP
    /// status of the answer (0: none).
    posted: Vec<(String, String, u16)>,
}

/// A message the Cloud API created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhatsAppMessage {
    /// `wamid.…`.
    pub id: String,
    /// As the request gave it.
    pub to: String,
    pub code: String,
    pub template: String,
    pub language: String,
    pub biz_opaque_callback_data: Option<String>,
}

impl MockProvider {
    /// Checks the Bearer token (another: 401, code 190).
    pub fn set_whatsapp_token(&self, token: &str) {
        self.lock().protocol::<Protocol>().token = Some(token.into());
    }

    /// Checks the phone number id of the path (another: 400, code 100).
    pub fn set_whatsapp_phone_number_id(&self, id: &str) {
        self.lock().protocol::<Protocol>().phone_number_id = Some(id.into());
    }

    /// The one template that exists (another: 404, code 132001).
    pub fn set_whatsapp_template(&self, name: &str, language: &str) {
        self.lock().protocol::<Protocol>().template = Some((name.into(), language.into()));
    }

    /// Posts status notifications for every message created from now on.
    pub fn whatsapp_webhook(&self, webhook: Webhook) {
        self.lock().protocol::<Protocol>().webhook = Some(webhook);
    }

    /// The messages created, oldest first.
    pub fn whatsapp_messages(&self) -> Vec<WhatsAppMessage> {
        self.lock().protocol::<Protocol>().messages.clone()
    }

    /// The notifications posted, as (wamid, status, HTTP status of the
    /// answer; 0 when none came), in order.
    pub fn whatsapp_posted(&self) -> Vec<(String, String, u16)> {
        self.lock().protocol::<Protocol>().posted.clone()
    }

    fn whatsapp_create(&self, want: Want) -> WhatsAppMessage {
        let mut inner = self.lock();
        let m = WhatsAppMessage {
            id: format!(
                "wamid.HBgL{:016X}{:016X}",
                rand::random::<u64>(),
                rand::random::<u64>()
            ),
            to: want.to,
            code: want.code,
            template: want.template,
            language: want.language,
            biz_opaque_callback_data: want.biz_opaque_callback_data,
        };
        let key = (plus(&m.to), m.code.clone());
        *inner.by_recipient_body.entry(key).or_default() += 1;
        let p = inner.protocol::<Protocol>();
        p.messages.push(m.clone());
        if let Some(hook) = p.webhook.clone()
            && hook.outcome != Outcome::None
        {
            tokio::spawn(post_statuses(self.clone(), hook, m.clone()));
        }
        m
    }
}

/// `to` with a leading `+` (Meta takes the number with or without).
fn plus(to: &str) -> String {
    format!("+{}", to.trim_start_matches('+'))
}

/// Graph API's error object for `code`, as the Cloud API words it.
pub fn error_body(code: i64) -> serde_json::Value {
    let (title, details) = match code {
        130429 => (
            "Rate limit hit",
            "Cloud API message throughput has been reached.",
        ),
        131056 => (
            "(Business Account, Consumer Account) pair rate limit hit",
            "Message failed to send because there were too many messages sent from this \
             phone number to the same phone number in a short period of time.",
        ),
        131026 => ("Message undeliverable", "Unable to deliver message."),
        131000 => (
            "Something went wrong",
            "Message failed to send due to an unknown error.",
        ),
        131008 => (
            "Required parameter is missing",
            "The request is missing a required parameter.",
        ),
        131009 => (
            "Parameter value is not valid",
            "One or more parameter values are invalid.",
        ),
        132000 => (
            "Number of parameters does not match the expected number of params",
            "The number of variable parameter values included in the request did not \
             match the number of variable parameters defined in the template.",
        ),
        132001 => (
            "Template name does not exist in the translation",
            "The template does not exist in the specified language or the template has \
             not been approved.",
        ),
        190 => ("Access token has expired", "Your access token has expired."),
        100 => (
            "Invalid parameter",
            "The request included one or more unsupported or misspelled parameters.",
        ),
        _ => ("Error", "An error occurred."),
    };
    serde_json::json!({"error": {
        "message": format!("(#{code}) {title}"),
        "type": "OAuthException",
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": details},
        "error_subcode": 2494055,
        "fbtrace_id": format!("A{:016x}", rand::random::<u64>()),
    }})
}

/// An error answer with Graph API's error object.
fn error(status: u16, code: i64) -> Response {
    json_answer(
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        &error_body(code),
        None,
    )
}

/// A scripted failure, worded as the Cloud API words it.
fn failure(status: u16, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
    let status_code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if body.get("error").is_some_and(|e| e.get("code").is_some()) {
        return json_answer(status_code, body, retry_after);
    }
    let code = match status {
        429 => 130429,
        401 => 190,
        500..=599 => 131000,
        _ => body.get("code").and_then(|c| c.as_i64()).unwrap_or(100),
    };
    json_answer(status_code, &error_body(code), retry_after)
}

/// A send that passed validation.
struct Want {
    to: String,
    code: String,
    template: String,
    language: String,
    biz_opaque_callback_data: Option<String>,
}

/// A parameter's text: the one `{"type":"text","text":...}` of a component.
fn one_text(component: &serde_json::Value) -> Option<String> {
    let params = component.get("parameters")?.as_array()?;
    match params.as_slice() {
        [p] if p.get("type").and_then(|t| t.as_str()) == Some("text") => {
            p.get("text").and_then(|t| t.as_str()).map(str::to_string)
        }
        _ => None,
    }
}

/// Validates a send as the Cloud API documents it: `Err((status, code))`.
fn validate(body: &serde_json::Value, p: &Protocol) -> Result<Want, (u16, i64)> {
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
    if text(body.get("messaging_product")).as_deref() != Some("whatsapp") {
        return Err((400, 100));
    }
    let to = text(body.get("to")).ok_or((400, 131008))?;
    let digits = to.trim_start_matches('+');
    if !(1..=15).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err((400, 100));
    }
    if text(body.get("type")).as_deref() != Some("template") {
        return Err((400, 100));
    }
    let template = body.get("template").ok_or((400, 131008))?;
    let name = text(template.get("name")).ok_or((400, 131008))?;
    let language = text(template.pointer("/language/code")).ok_or((400, 131008))?;
    if let Some((want_name, want_language)) = &p.template
        && (want_name != &name || want_language != &language)
    {
        return Err((404, 132001));
    }
    let components = template
        .get("components")
        .and_then(|c| c.as_array())
        .ok_or((400, 132000))?;
    let of_type = |t: &str| {
        components
            .iter()
            .filter(|c| c.get("type").and_then(|x| x.as_str()) == Some(t))
            .collect::<Vec<_>>()
    };
    let (bodies, buttons) = (of_type("body"), of_type("button"));
    let [body_component] = bodies.as_slice() else {
        return Err((400, 132000));
    };
    let [button] = buttons.as_slice() else {
        return Err((400, 132000));
    };
    let index_zero = matches!(button.get("index"), Some(i) if i == "0" || i == 0);
    if button.get("sub_type").and_then(|s| s.as_str()) != Some("url") || !index_zero {
        return Err((400, 131009));
    }
    let code = one_text(body_component).ok_or((400, 132000))?;
    let button_code = one_text(button).ok_or((400, 132000))?;
    // "this value must appear twice in the payload. Maximum 15 characters."
    if code != button_code || code.is_empty() || code.chars().count() > 15 {
        return Err((400, 131009));
    }
    let biz_opaque_callback_data = text(body.get("biz_opaque_callback_data"));
    if biz_opaque_callback_data
        .as_deref()
        .is_some_and(|d| d.len() > 512)
    {
        return Err((400, 131009));
    }
    Ok(Want {
        to,
        code,
        template: name,
        language,
        biz_opaque_callback_data,
    })
}

fn accepted(m: &WhatsAppMessage) -> Response {
    json_answer(
        StatusCode::OK,
        &serde_json::json!({
            "messaging_product": "whatsapp",
            "contacts": [{"input": m.to, "wa_id": m.to.trim_start_matches('+')}],
            "messages": [{"id": m.id}],
        }),
        None,
    )
}

async fn send(
    State(mock): State<MockProvider>,
    Path((_version, phone_number_id)): Path<(String, String)>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let busy = Busy::new(&mock);
    let (behaviour, latency, want) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "whatsapp".into(),
            idempotency_key: None,
            authorization: authorization.clone(),
            body: json.clone(),
        });
        let (behaviour, latency) = inner.next_behaviour();
        let p = inner.protocol::<Protocol>();
        let bearer = authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "));
        if bearer.is_none() || p.token.as_deref().is_some_and(|t| Some(t) != bearer) {
            return error(401, 190);
        }
        if p
            .phone_number_id
            .as_deref()
            .is_some_and(|id| id != phone_number_id)
        {
            return error(400, 100);
        }
        (behaviour, latency, validate(&json, p))
    };
    let want = match want {
        Ok(want) => want,
        Err((status, code)) => return error(status, code),
    };
    let code = want.code.clone();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let mock = mock.clone();
        move || mock.whatsapp_create(want)
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(m) => return accepted(&m),
        Played::Lost => return error(500, 131000),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => accepted(&create()),
        Answer::Fail {
            status,
            body,
            retry_after,
        } => failure(status, &body, retry_after),
        Answer::AcceptThenFail { status } => {
            create();
            failure(status.max(500), &serde_json::Value::Null, None)
        }
        Answer::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            failure(status.max(500), &serde_json::Value::Null, Some(retry_after))
        }
        Answer::RejectQuoting { status } => {
            let mut body = error_body(131009);
            body["error"]["error_data"]["details"] =
                serde_json::json!(format!("Parameter value {code} is not valid"));
            json_answer(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                &body,
                None,
            )
        }
    }
}

/// `X-Hub-Signature-256` of `body` under `app_secret`, as Meta signs a
/// notification: `sha256=` and the hex HMAC-SHA256 of the raw body.
pub fn signature(app_secret: &str, body: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(app_secret.as_bytes()) else {
        unreachable!("HMAC-SHA256 refused a key");
    };
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// One status of a message, as a notification's `statuses[]` carries it.
pub fn status(m: &WhatsAppMessage, word: &str, timestamp: i64) -> serde_json::Value {
    let mut s = serde_json::json!({
        "id": m.id,
        "status": word,
        "timestamp": timestamp.to_string(),
        "recipient_id": m.to.trim_start_matches('+'),
    });
    if let Some(data) = &m.biz_opaque_callback_data {
        s["biz_opaque_callback_data"] = serde_json::json!(data);
    }
    if word == "failed" {
        s["errors"] = serde_json::json!([{
            "code": 131026,
            "title": "Message undeliverable",
            "message": "Message undeliverable",
            "error_data": {"details": "Message Undeliverable."},
        }]);
    } else {
        s["pricing"] = serde_json::json!({
            "billable": true, "pricing_model": "PMP", "category": "authentication",
        });
    }
    s
}

/// A `messages` webhook notification carrying `statuses`.
pub fn notification(statuses: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{
            "id": "102290129340398",
            "changes": [{
                "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {
                        "display_phone_number": "15550783881",
                        "phone_number_id": "106540352242922",
                    },
                    "statuses": statuses,
                },
                "field": "messages",
            }],
        }],
    })
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Posts `m`'s statuses as `hook` says, one notification each, signed.
async fn post_statuses(mock: MockProvider, hook: Webhook, m: WhatsAppMessage) {
    let Some(client) = receipt_client() else {
        return;
    };
    let mut words: Vec<&str> = match hook.outcome {
        Outcome::None => Vec::new(),
        Outcome::Delivered => vec!["sent", "delivered"],
        Outcome::Read => vec!["sent", "delivered", "read"],
        Outcome::Failed => vec!["sent", "failed"],
    };
    let at = now();
    let mut stamped: Vec<(&str, i64)> = words
        .drain(..)
        .zip(0..)
        .map(|(w, i)| (w, at + i))
        .collect();
    if hook.reversed {
        stamped.reverse();
    }
    for (word, timestamp) in stamped {
        let body = notification(vec![status(&m, word, timestamp)]).to_string();
        let times = if hook.duplicated { 2 } else { 1 };
        for _ in 0..times {
            let answer = client
                .post(&hook.url)
                .header(header::CONTENT_TYPE, "application/json")
                .header("X-Hub-Signature-256", signature(&hook.app_secret, body.as_bytes()))
                .body(body.clone())
                .send()
                .await;
            let code = answer.as_ref().map_or(0, |r| r.status().as_u16());
            if let Err(e) = &answer {
                tracing::warn!(error = %e, "mock provider: a WhatsApp notification failed");
            }
            mock.lock()
                .protocol::<Protocol>()
                .posted
                .push((m.id.clone(), word.to_string(), code));
        }
        // Meta's notifications come one after the other.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_provider::Behaviour;

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
        (mock, format!("http://{addr}/v21.0/106540352242922/messages"), client)
    }

    fn template(to: &str, code: &str, button: &str) -> serde_json::Value {
        serde_json::json!({
            "messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
            "type": "template",
            "template": {"name": "verification_code", "language": {"code": "en_US"},
                "components": [
                    {"type": "body", "parameters": [{"type": "text", "text": code}]},
                    {"type": "button", "sub_type": "url", "index": "0",
                     "parameters": [{"type": "text", "text": button}]}]},
            "biz_opaque_callback_data": "msg_1",
        })
    }

    async fn call(
        client: &reqwest::Client,
        url: &str,
        token: &str,
        body: &serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let resp = client
            .post(url)
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("send: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or_default())
    }

    #[tokio::test]
    async fn every_accepted_send_is_a_new_message() {
        let (mock, url, client) = start().await;
        mock.set_whatsapp_token("tok");
        mock.set_whatsapp_template("verification_code", "en_US");
        let body = template("+14155550123", "482913", "482913");
        for _ in 0..2 {
            let (status, answer) = call(&client, &url, "tok", &body).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["messaging_product"], "whatsapp");
            assert_eq!(answer["contacts"][0]["wa_id"], "14155550123");
            let id = answer["messages"][0]["id"].as_str().unwrap_or_default();
            assert!(id.starts_with("wamid."), "{answer}");
        }
        // No idempotency key documented: the same code twice is two messages.
        assert_eq!(mock.deliveries_to("+14155550123", "482913"), 2);
        let sent = mock.whatsapp_messages();
        assert_ne!(sent[0].id, sent[1].id);
        assert_eq!(sent[0].biz_opaque_callback_data.as_deref(), Some("msg_1"));
        assert_eq!(mock.calls()[0].endpoint, "whatsapp");
    }

    #[tokio::test]
    async fn refusals_carry_graph_api_error_objects() {
        let (mock, url, client) = start().await;
        mock.set_whatsapp_token("tok");
        mock.set_whatsapp_template("verification_code", "en_US");
        let good = template("+14155550123", "482913", "482913");
        let (status, answer) = call(&client, &url, "other", &good).await;
        assert_eq!((status, answer["error"]["code"].as_i64()), (401, Some(190)));
        let mut other_template = good.clone();
        other_template["template"]["name"] = "nope".into();
        let mut no_button = good.clone();
        no_button["template"]["components"] =
            serde_json::json!([good["template"]["components"][0].clone()]);
        let rows = [
            (template("+14155550123", "482913", "000000"), 400, 131009),
            (template("+14155550123", "1234567890123456", "1234567890123456"), 400, 131009),
            (template("not a number", "1", "1"), 400, 100),
            (other_template, 404, 132001),
            (no_button, 400, 132000),
        ];
        for (body, want_status, want_code) in rows {
            let (status, answer) = call(&client, &url, "tok", &body).await;
            assert_eq!(
                (status, answer["error"]["code"].as_i64()),
                (want_status, Some(want_code)),
                "{answer}"
            );
            assert!(answer["error"]["fbtrace_id"].is_string());
        }
        assert!(mock.whatsapp_messages().is_empty());

        mock.push([
            Behaviour::Fail {
                status: 400,
                body: error_body(131056),
                retry_after: None,
            },
            Behaviour::Fail {
                status: 429,
                body: serde_json::json!({}),
                retry_after: Some(2),
            },
            Behaviour::AcceptThenFail { status: 503 },
        ]);
        let (status, answer) = call(&client, &url, "tok", &good).await;
        assert_eq!((status, answer["error"]["code"].as_i64()), (400, Some(131056)));
        let (status, answer) = call(&client, &url, "tok", &good).await;
        assert_eq!((status, answer["error"]["code"].as_i64()), (429, Some(130429)));
        let (status, answer) = call(&client, &url, "tok", &good).await;
        assert_eq!((status, answer["error"]["code"].as_i64()), (503, Some(131000)));
        // The last one was created before its 503.
        assert_eq!(mock.deliveries_to("+14155550123", "482913"), 1);
    }

    #[test]
    fn notifications_are_signed_as_meta_signs_them() {
        // python3 -c 'import hmac,hashlib;
        //   print(hmac.new(b"app-secret", b"{}", hashlib.sha256).hexdigest())'
        assert_eq!(
            signature("app-secret", b"{}"),
            "sha256=bd9549eb87a414d3df28b5a60ea86d4a11e2f1c6258edbd18f56d3c23c0f908d"
        );
        // The service's own check agrees.
        assert_eq!(
            signature("app-secret", b"{\"a\":1}"),
            sendonce::provider::whatsapp::webhook::signature("app-secret", b"{\"a\":1}")
        );
    }
}
