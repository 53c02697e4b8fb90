//! The mock's Vonage SMS API: `POST /sms/json` (form-encoded or JSON, with
//! `api_key`/`api_secret` in the body), answered `200` with
//! `{"message-count", "messages": [...]}`, one entry per part of the
//! message (GSM-7 or, with `type=unicode`, UCS-2 parts, counted as
//! sendonce counts them), each with its `status`, `message-id` or
//! `error-text`. As at Vonage, `client-ref` is echoed and never
//! de-duplicated on: every accepted call creates a message.
//!
//! Faults, from the shared behaviours: a scripted 429 is Vonage's throttling
//! (`status` 1 in a `200`), 401/403 invalid credentials (4), another 4xx
//! invalid parameters (3) unless the scripted body names a
//! `"vonage-status"`, a 5xx an HTTP 5xx; accept-then-drop, hang and the
//! rest as for the other protocols. [`MockProvider::vonage_partial`] makes
//! the next multi-part messages accepted only in part (the first part
//! `0`, the others the given status): on the phone, in part.
//!
//! Delivery receipts (one per part, as Vonage sends them) go to the
//! request's `callback`, signed with the signature secret and method the
//! mock is given ([`MockProvider::set_vonage_signing`]), as a form `POST`,
//! a JSON `POST` or a `GET` ([`ReceiptStyle`]).

use std::collections::{HashMap, VecDeque};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use sendonce::provider::vonage::{SignatureMethod, sign};

use crate::mock_provider::{
    Busy, Call, DropSwitch, MockProvider, ReceiptConfig, ReceiptOrder, Answer, Played, play,
    json_answer, receipt_client,
};

/// Vonage's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router.route("/sms/json", post(vonage_send))
}

/// How the mock sends Vonage receipts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReceiptStyle {
    /// `POST`, form-encoded (the default).
    #[default]
    Form,
    /// `POST`, JSON.
    Json,
    /// `GET`, in the query string.
    Query,
}

/// What only the Vonage protocol keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    /// Messages created, oldest first.
    messages: Vec<VonageRecord>,
    /// For each of the next multi-part messages: the status its parts after
    /// the first are answered (the first is accepted).
    partial: VecDeque<u32>,
    /// The account's key and secret, when the mock checks them.
    credentials: Option<(String, String)>,
    /// The signature secret and method receipts are signed with (none:
    /// unsigned).
    signing: Option<(String, SignatureMethod)>,
    style: ReceiptStyle,
}

/// A message created through the Vonage endpoint.
#[derive(Clone, Debug)]
pub struct VonageRecord {
    /// One id per part accepted.
    pub part_ids: Vec<String>,
    pub to: String,
    pub from: String,
    pub text: String,
    pub client_ref: Option<String>,
}

impl MockProvider {
    /// The next `n` messages of more than one part are accepted only in
    /// part: the first part, and the others answered `status`.
    pub fn vonage_partial(&self, n: usize, status: u32) {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        p.partial.extend(std::iter::repeat_n(status, n));
    }

    /// Checks `api_key` and `api_secret` (a mismatch: status 4).
    pub fn set_vonage_credentials(&self, key: &str, secret: &str) {
        self.lock().protocol::<Protocol>().credentials = Some((key.into(), secret.into()));
    }

    /// Signs receipts with `secret` and `method`.
    pub fn set_vonage_signing(&self, secret: &str, method: SignatureMethod) {
        self.lock().protocol::<Protocol>().signing = Some((secret.into(), method));
    }

    /// Sends receipts as a form, JSON or a query.
    pub fn set_vonage_receipt_style(&self, style: ReceiptStyle) {
        self.lock().protocol::<Protocol>().style = style;
    }

    /// The messages created through the Vonage endpoint, oldest first.
    pub fn vonage_messages(&self) -> Vec<VonageRecord> {
        self.lock().protocol::<Protocol>().messages.clone()
    }

    fn vonage_create(&self, form: &HashMap<String, String>, parts: usize) -> VonageRecord {
        let mut inner = self.lock();
        let record = VonageRecord {
            part_ids: (0..parts)
                .map(|_| {
                    let u = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
                    u[..16].to_string()
                })
                .collect(),
            to: form.get("to").cloned().unwrap_or_default(),
            from: form.get("from").cloned().unwrap_or_default(),
            text: form.get("text").cloned().unwrap_or_default(),
            client_ref: form.get("client-ref").cloned(),
        };
        *inner
            .by_recipient_body
            .entry((record.to.clone(), record.text.clone()))
            .or_default() += 1;
        inner.protocol::<Protocol>().messages.push(record.clone());
        record
    }
}

/// The parts `text` takes, counted as sendonce counts them (GSM-7, or
/// UCS-2 for a text that is not GSM-7).
fn parts_of(text: &str) -> usize {
    let count = sendonce::domain::segments::count(text);
    usize::try_from(count.segments.max(1)).unwrap_or(1)
}

/// An answer of `n` parts, each with this status (0: accepted, with ids).
fn answer(to: &str, statuses: &[(u32, Option<&str>)], error_text: &str) -> Response {
    let messages: Vec<serde_json::Value> = statuses
        .iter()
        .map(|(status, id)| match id {
            Some(id) => serde_json::json!({
                "to": to,
                "message-id": id,
                "status": status.to_string(),
                "remaining-balance": "15.53590000",
                "message-price": "0.03330000",
                "network": "23410",
            }),
            None => serde_json::json!({
                "status": status.to_string(),
                "error-text": error_text,
            }),
        })
        .collect();
    json_answer(
        StatusCode::OK,
        &serde_json::json!({
            "message-count": statuses.len().to_string(),
            "messages": messages,
        }),
        None,
    )
}

/// One status for every part.
fn refusal(to: &str, parts: usize, status: u32, text: &str) -> Response {
    answer(to, &vec![(status, None); parts], text)
}

fn accepted(record: &VonageRecord) -> Response {
    let statuses: Vec<(u32, Option<&str>)> =
        record.part_ids.iter().map(|id| (0, Some(id.as_str()))).collect();
    answer(&record.to, &statuses, "")
}

/// A scripted failure as Vonage would answer it.
fn failure(to: &str, parts: usize, status: u16, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
    let text = body["message"].as_str().unwrap_or("injected failure");
    if let Some(s) = body["vonage-status"].as_str().and_then(|s| s.parse().ok()) {
        return refusal(to, parts, s, text);
    }
    match status {
        429 => refusal(to, parts, 1, "Throughput Rate Exceeded - please wait [ 1000 ] and retry"),
        401 | 403 => refusal(to, parts, 4, "Bad Credentials"),
        400..=499 => refusal(to, parts, 3, text),
        _ => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_answer(code, &serde_json::json!({"error": text}), retry_after)
        }
    }
}

async fn vonage_send(
    State(mock): State<MockProvider>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let form: HashMap<String, String> = if json_body {
        serde_json::from_slice::<HashMap<String, serde_json::Value>>(&body)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                (k, v)
            })
            .collect()
    } else {
        form_urlencoded::parse(&body).into_owned().collect()
    };
    let busy = Busy::new(&mock);
    let (behaviour, latency, credentials) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "vonage".into(),
            idempotency_key: None,
            authorization: None,
            body: serde_json::to_value(&form).unwrap_or(serde_json::Value::Null),
        });
        let (behaviour, latency) = inner.next_behaviour();
        (behaviour, latency, inner.protocol::<Protocol>().credentials.clone())
    };
    let to = form.get("to").cloned().unwrap_or_default();
    let parts = parts_of(form.get("text").map_or("", String::as_str));
    let get = |k: &str| form.get(k).filter(|v| !v.is_empty());
    for required in ["api_key", "api_secret", "from", "to", "text"] {
        if get(required).is_none() {
            return refusal(&to, 1, 2, &format!("Missing {required}"));
        }
    }
    if let Some((key, secret)) = credentials
        && (get("api_key") != Some(&key) || get("api_secret") != Some(&secret))
    {
        return refusal(&to, 1, 4, "Bad Credentials");
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, form) = (mock.clone(), form.clone());
        move || {
            let record = mock.vonage_create(&form, parts);
            let receipts = mock.lock().receipts.clone();
            if let Some(callback) = form.get("callback").cloned()
                && receipts.order != ReceiptOrder::None
                && form.get("status-report-req").is_some_and(|v| v == "1")
            {
                tokio::spawn(send_receipts(mock.clone(), receipts, callback, record.clone()));
            }
            record
        }
    };
    let internal_error = |status: u16, retry_after: Option<u64>| {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_answer(code, &serde_json::json!({"error": "Internal Server Error"}), retry_after)
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(record) => return accepted(&record),
        Played::Lost => return internal_error(500, None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => {
            let partial = (parts > 1)
                .then(|| mock.lock().protocol::<Protocol>().partial.pop_front())
                .flatten();
            match partial {
                None => accepted(&create()),
                Some(status) => {
                    // Only the first part goes out.
                    let record = mock.vonage_create(&form, 1);
                    let mut statuses = vec![(0, Some(record.part_ids[0].as_str()))];
                    statuses.extend(std::iter::repeat_n((status, None), parts - 1));
                    answer(&to, &statuses, "Throughput Rate Exceeded - please wait [ 1000 ] and retry")
                }
            }
        }
        Answer::Fail {
            status,
            body,
            retry_after,
        } => failure(&to, parts, status, &body, retry_after),
        Answer::AcceptThenFail { status } => {
            create();
            internal_error(status, None)
        }
        Answer::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            internal_error(status, Some(retry_after))
        }
        Answer::RejectQuoting { .. } => {
            let text = form.get("text").cloned().unwrap_or_default();
            refusal(&to, parts, 6, &format!("Invalid Message '{text}'"))
        }
    }
}

/// Vonage's word for a status of the receipt plan.
fn vonage_status(status: &str) -> &str {
    match status {
        "sent" => "accepted",
        "undelivered" => "failed",
        other => other,
    }
}

/// Sends the delivery receipts of `m`'s parts, one after the other.
async fn send_receipts(mock: MockProvider, config: ReceiptConfig, callback: String, m: VonageRecord) {
    let Some(client) = receipt_client() else {
        return;
    };
    let (signing, style) = {
        let mut inner = mock.lock();
        let p = inner.protocol::<Protocol>();
        (p.signing.clone(), p.style)
    };
    for (status, event) in config.plan() {
        for id in &m.part_ids {
            let mut params: Vec<(String, String)> = vec![
                ("msisdn".into(), m.to.clone()),
                ("to".into(), m.from.clone()),
                ("network-code".into(), "23410".into()),
                ("messageId".into(), id.clone()),
                ("price".into(), "0.03330000".into()),
                ("status".into(), vonage_status(&status).into()),
                ("scts".into(), "2001011400".into()),
                (
                    "err-code".into(),
                    match (&config.error_code, event) {
                        (Some(code), 1) => code.clone(),
                        _ => "0".into(),
                    },
                ),
                ("message-timestamp".into(), "2020-01-01 12:00:00".into()),
            ];
            if let Some(r) = &m.client_ref {
                params.push(("client-ref".into(), r.clone()));
            }
            if let Some((secret, method)) = &signing {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                params.push(("timestamp".into(), now.to_string()));
                params.push(("nonce".into(), uuid::Uuid::new_v4().to_string()));
                let sig = sign(*method, secret, &params);
                params.push(("sig".into(), sig));
            }
            let form = sendonce::provider::twilio::encode_form(&params);
            let req = match style {
                ReceiptStyle::Form => client
                    .post(&callback)
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                ReceiptStyle::Json => {
                    let object: serde_json::Map<String, serde_json::Value> = params
                        .iter()
                        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                        .collect();
                    client
                        .post(&callback)
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(serde_json::Value::Object(object).to_string())
                }
                ReceiptStyle::Query => {
                    let sep = if callback.contains('?') { '&' } else { '?' };
                    client.get(format!("{callback}{sep}{form}"))
                }
            };
            let answer = match req.send().await {
                Ok(r) => r.status().as_u16().to_string(),
                Err(e) => {
                    tracing::warn!(error = %e, "mock provider: a Vonage receipt failed");
                    e.to_string()
                }
            };
            mock.lock()
                .receipt_answers
                .push(format!("{id} {}: {answer}", vonage_status(&status)));
        }
    }
}
