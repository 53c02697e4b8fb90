//! The mock's Infobip, from Infobip's SMS API reference:
//!
//! - `POST /sms/3/messages` (JSON, `Authorization: App <key>`): every
//!   accepted destination creates a message under the destination's
//!   `messageId` (one of ours when none is given). Nothing is
//!   de-duplicated by default: a repeated `messageId` creates a second
//!   message, as at an account whose idempotency Infobip has not enabled
//!   (Infobip documents its idempotency as opt-in, "enabled for your
//!   channels" on request). With idempotency on
//!   ([`MockProvider::infobip_set_idempotency`]) a `messageId` it created
//!   within the grace period is refused: answered `200` with the status
//!   `REJECTED_DUPLICATE_MESSAGE_ID` (group `REJECTED`), nothing created.
//!   Answers `{"bulkId","messages":[{"messageId","status":{...},
//!   "destination","details":{"messageCount"}}]}`; errors as
//!   `{"requestError":{"serviceException":{"messageId","text"}}}`.
//! - `GET /sms/3/logs?messageId=...` (comma-separated ids allowed):
//!   `{"results":[{"sender","destination","bulkId","messageId","sentAt",
//!   "doneAt","messageCount","status","content":{"text"}}]}`, one entry per
//!   message it created (`PENDING_ACCEPTED`) and per send it rejected (its
//!   `REJECTED` status), with a configurable lag (an entry made less than
//!   the lag ago is not in the logs yet: Infobip documents no bound on how
//!   soon a message shows) and lookups that fail (500).
//! - Delivery reports `{"results":[...]}` posted to each message's
//!   `webhooks.delivery.url`, as the receipt plan says, and on demand for
//!   all messages in one request ([`MockProvider::infobip_report_all`]).
//!
//! Faults beyond the common behaviours: dropping the connection before
//! creating anything ([`MockProvider::infobip_drop_before_create`]),
//! answering the next sends with a `REJECTED` status of one's choice
//! ([`MockProvider::infobip_reject_next`]), and rejecting the next send
//! but dropping the connection before the answer
//! ([`MockProvider::infobip_reject_then_drop`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::mock_provider::{
    Busy, Call, DropSwitch, MockProvider, ReceiptConfig, ReceiptOrder, Answer, Played, play, drop_connection,
    json_answer, receipt_client,
};

/// Infobip's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router
        .route("/sms/3/messages", post(infobip_send))
        .route("/sms/3/logs", get(infobip_logs))
}

/// What only the Infobip protocol keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    /// Messages created, oldest first.
    messages: Vec<InfobipRecord>,
    /// The logs: every message created and every send rejected, oldest
    /// first.
    log: Vec<InfobipRecord>,
    /// How long an entry stays out of the logs.
    log_lag: Duration,
    /// Idempotency as Infobip enables it on request: a `messageId` created
    /// less than this long ago is refused, nothing created. `None` (the
    /// default): every send creates a message.
    idempotency_grace: Option<Duration>,
    /// `REJECTED` status names the next sends are rejected with, the
    /// connection dropped before the answer.
    rejections_dropped: VecDeque<String>,
    /// How many of the next log lookups fail.
    failing_lookups: usize,
    /// How many of the next sends drop the connection before creating.
    drops_before_create: usize,
    /// `REJECTED` status names the next sends are answered with.
    rejections: VecDeque<String>,
    next_bulk: u64,
}

/// A message created through the Infobip endpoint.
#[derive(Clone, Debug)]
pub struct InfobipRecord {
    pub message_id: String,
    pub bulk_id: String,
    /// As given (E.164 without `+`, as Infobip writes numbers).
    pub destination: String,
    pub sender: Option<String>,
    pub text: String,
    pub delivery_url: Option<String>,
    /// Its status in the logs (`PENDING_ACCEPTED` for a message created).
    pub status: String,
    created: Instant,
    created_at: time::OffsetDateTime,
}

/// `(groupId, groupName, id, name, description)` of a status.
type StatusRow = (i64, &'static str, i64, &'static str, &'static str);

const PENDING_ACCEPTED: StatusRow = (
    1,
    "PENDING",
    26,
    "PENDING_ACCEPTED",
    "Message sent to next instance",
);
const DUPLICATE: StatusRow = (
    5,
    "REJECTED",
    23,
    "REJECTED_DUPLICATE_MESSAGE_ID",
    "Rejected duplicate message ID",
);

fn status_json(s: StatusRow) -> serde_json::Value {
    serde_json::json!({
        "groupId": s.0, "groupName": s.1, "id": s.2, "name": s.3, "description": s.4,
    })
}

/// The status a receipt plan's word stands for.
fn report_status(word: &str) -> StatusRow {
    match word.to_ascii_lowercase().as_str() {
        "delivered" => (3, "DELIVERED", 5, "DELIVERED_TO_HANDSET", "Message delivered to handset"),
        "undelivered" | "failed" => (
            2,
            "UNDELIVERABLE",
            9,
            "UNDELIVERABLE_NOT_DELIVERED",
            "Message sent not delivered",
        ),
        "expired" => (4, "EXPIRED", 15, "EXPIRED_EXPIRED", "Message expired"),
        "rejected" => (5, "REJECTED", 52, "REJECTED_DESTINATION", "Rejected by destination"),
        _ => (1, "PENDING", 7, "PENDING_ENROUTE", "Message sent to next instance"),
    }
}

fn rejection(name: &str) -> serde_json::Value {
    serde_json::json!({
        "groupId": 5, "groupName": "REJECTED", "id": 0, "name": name,
        "description": "scripted rejection",
    })
}

/// The status JSON of a log entry's status name.
fn logged_status(name: &str) -> serde_json::Value {
    if name == PENDING_ACCEPTED.3 {
        status_json(PENDING_ACCEPTED)
    } else if name == DUPLICATE.3 {
        status_json(DUPLICATE)
    } else {
        rejection(name)
    }
}

impl MockProvider {
    /// Makes log entries stay out of Infobip's logs for `lag` after they
    /// were made (judged at each lookup: setting it to zero shows every
    /// entry at once).
    pub fn infobip_set_log_lag(&self, lag: Duration) {
        self.lock().protocol::<Protocol>().log_lag = lag;
    }

    /// Turns Infobip's idempotency on with this grace period (`None`: off,
    /// the default): a send whose `messageId` it created less than `grace`
    /// ago is refused `REJECTED_DUPLICATE_MESSAGE_ID`, nothing created.
    pub fn infobip_set_idempotency(&self, grace: Option<Duration>) {
        self.lock().protocol::<Protocol>().idempotency_grace = grace;
    }

    /// Rejects the next send with this `REJECTED` status (logged, nothing
    /// created) and drops the connection before answering.
    pub fn infobip_reject_then_drop(&self, name: &str) {
        self.lock()
            .protocol::<Protocol>()
            .rejections_dropped
            .push_back(name.to_string());
    }

    /// The log entries of `message_id`'s sends: each status name, oldest
    /// first (lag or not).
    pub fn infobip_logged(&self, message_id: &str) -> Vec<String> {
        self.lock()
            .protocol::<Protocol>()
            .log
            .iter()
            .filter(|r| r.message_id == message_id)
            .map(|r| r.status.clone())
            .collect()
    }

    /// Makes the next `n` log lookups answer 500.
    pub fn infobip_fail_lookups(&self, n: usize) {
        self.lock().protocol::<Protocol>().failing_lookups = n;
    }

    /// Makes the next `n` sends close the connection before creating
    /// anything.
    pub fn infobip_drop_before_create(&self, n: usize) {
        self.lock().protocol::<Protocol>().drops_before_create = n;
    }

    /// Answers the next send `200` with this `REJECTED` status, creating
    /// nothing.
    pub fn infobip_reject_next(&self, name: &str) {
        self.lock()
            .protocol::<Protocol>()
            .rejections
            .push_back(name.to_string());
    }

    /// The messages created through the Infobip endpoint, oldest first.
    pub fn infobip_messages(&self) -> Vec<InfobipRecord> {
        self.lock().protocol::<Protocol>().messages.clone()
    }

    /// Posts one delivery report request holding a report with `status`
    /// (a plan word: `delivered`, `undelivered`, ...) for every message
    /// created with a delivery URL, to that URL (the first message's, when
    /// they differ: Infobip batches per URL). Returns the answer's status.
    pub async fn infobip_report_all(&self, status: &str) -> Option<u16> {
        let messages: Vec<InfobipRecord> = self
            .infobip_messages()
            .into_iter()
            .filter(|m| m.delivery_url.is_some())
            .collect();
        let url = messages.first()?.delivery_url.clone()?;
        let results: Vec<serde_json::Value> = messages
            .iter()
            .filter(|m| m.delivery_url.as_deref() == Some(url.as_str()))
            .map(|m| report(m, status, None))
            .collect();
        let client = receipt_client()?;
        let resp = client
            .post(&url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(serde_json::json!({ "results": results }).to_string())
            .send()
            .await
            .ok()?;
        Some(resp.status().as_u16())
    }

    /// Creates an Infobip message (a delivery); `None`, creating nothing,
    /// when idempotency is on and a message with its id was created within
    /// the grace period (checked under the same lock, so two racing sends
    /// of one id create one message then). Without idempotency, every call
    /// creates a message, a repeated id included.
    fn infobip_create(&self, m: &Wanted) -> Option<InfobipRecord> {
        let mut inner = self.lock();
        let p = inner.protocol::<Protocol>();
        if let Some(grace) = p.idempotency_grace
            && p
                .messages
                .iter()
                .any(|r| r.message_id == m.message_id && r.created.elapsed() < grace)
        {
            let refused = p.entry(m, DUPLICATE.3);
            p.log.push(refused);
            return None;
        }
        let record = p.entry(m, PENDING_ACCEPTED.3);
        p.messages.push(record.clone());
        p.log.push(record.clone());
        // Counted as the number the phone has, `+` and all.
        let to = format!("+{}", record.destination.trim_start_matches('+'));
        *inner
            .by_recipient_body
            .entry((to, record.text.clone()))
            .or_default() += 1;
        *inner
            .deliveries
            .entry(record.message_id.clone())
            .or_default() += 1;
        Some(record)
    }
}

impl Protocol {
    /// A log entry for the send `m` with this status, made now.
    fn entry(&mut self, m: &Wanted, status: &str) -> InfobipRecord {
        self.next_bulk += 1;
        InfobipRecord {
            message_id: m.message_id.clone(),
            bulk_id: format!("bulk-{}", self.next_bulk),
            destination: m.to.clone(),
            sender: m.sender.clone(),
            text: m.text.clone(),
            delivery_url: m.delivery_url.clone(),
            status: status.to_string(),
            created: Instant::now(),
            created_at: sendonce::clock::truncate_to_micros(time::OffsetDateTime::now_utc()),
        }
    }

    /// Logs the send `m` as rejected with `status`, creating nothing.
    fn reject(&mut self, m: &Wanted, status: &str) {
        let entry = self.entry(m, status);
        self.log.push(entry);
    }
}

/// What a send asks for (its first message's first destination).
#[derive(Clone, Debug)]
struct Wanted {
    message_id: String,
    to: String,
    sender: Option<String>,
    text: String,
    delivery_url: Option<String>,
}

fn wanted(body: &serde_json::Value) -> Option<Wanted> {
    let m = body.get("messages")?.get(0)?;
    let d = m.get("destinations")?.get(0)?;
    let to = d.get("to")?.as_str()?.to_string();
    let text = m.get("content")?.get("text")?.as_str()?.to_string();
    Some(Wanted {
        message_id: d
            .get("messageId")
            .and_then(|v| v.as_str())
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string),
        to,
        sender: m.get("sender").and_then(|v| v.as_str()).map(str::to_string),
        text,
        delivery_url: m
            .pointer("/webhooks/delivery/url")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    })
}

/// Infobip's error body.
fn infobip_error(status: u16, code: &str, text: &str, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "requestError": { "serviceException": { "messageId": code, "text": text } }
    });
    json_answer(status, &body, retry_after)
}

/// A scripted failure as Infobip would send it: the scripted body when it
/// is already Infobip's shape, else wrapped in one.
fn infobip_failure(status: u16, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
    if body.get("requestError").is_some() {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return json_answer(code, body, retry_after);
    }
    let code = match status {
        400 => "BAD_REQUEST",
        401 => "UNAUTHORIZED",
        403 => "FORBIDDEN",
        429 => "TOO_MANY_REQUESTS",
        500..=599 => "GENERAL_ERROR",
        _ => "ERROR",
    };
    let text = body["message"].as_str().unwrap_or("injected failure");
    infobip_error(status, code, text, retry_after)
}

/// The send answer for one message with `status`.
fn sent(message_id: &str, destination: &str, status: serde_json::Value, bulk: &str) -> Response {
    let body = serde_json::json!({
        "bulkId": bulk,
        "messages": [{
            "messageId": message_id,
            "status": status,
            "destination": destination,
            "details": { "messageCount": 1 },
        }],
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn created(r: &InfobipRecord) -> Response {
    sent(
        &r.message_id,
        &r.destination,
        status_json(PENDING_ACCEPTED),
        &r.bulk_id,
    )
}

fn has_api_key(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(scheme, key)| scheme == "App" && !key.trim().is_empty())
}

async fn infobip_send(
    State(mock): State<MockProvider>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let busy = Busy::new(&mock);
    let (behaviour, latency, drop_first, rejection_name, rejected_dropped) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "infobip".into(),
            idempotency_key: None,
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: json.clone(),
        });
        let (behaviour, latency) = inner.next_behaviour();
        let p = inner.protocol::<Protocol>();
        let drop_first = p.drops_before_create > 0;
        if drop_first {
            p.drops_before_create -= 1;
        }
        let rejection_name = p.rejections.pop_front();
        let rejected_dropped = if rejection_name.is_none() {
            p.rejections_dropped.pop_front()
        } else {
            None
        };
        (
            behaviour,
            latency,
            drop_first,
            rejection_name,
            rejected_dropped,
        )
    };
    if !has_api_key(&headers) {
        return infobip_error(401, "UNAUTHORIZED", "Invalid login details", None);
    }
    let Some(want) = wanted(&json) else {
        return infobip_error(400, "BAD_REQUEST", "Bad request", None);
    };
    if drop_first {
        drop_connection(switch);
        return std::future::pending().await;
    }
    if let Some(name) = rejection_name {
        mock.lock().protocol::<Protocol>().reject(&want, &name);
        return sent(&want.message_id, &want.to, rejection(&name), "bulk-rejected");
    }
    if let Some(name) = rejected_dropped {
        mock.lock().protocol::<Protocol>().reject(&want, &name);
        drop_connection(switch);
        return std::future::pending().await;
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, want) = (mock.clone(), want.clone());
        // `None`: Infobip's idempotency refused an id it has, creating
        // nothing.
        move || -> Option<InfobipRecord> {
            let record = mock.infobip_create(&want)?;
            let receipts = mock.lock().receipts.clone();
            if let Some(url) = record.delivery_url.clone()
                && receipts.order != ReceiptOrder::None
            {
                tokio::spawn(send_infobip_reports(receipts, url, record.clone()));
            }
            Some(record)
        }
    };
    let duplicate = sent(
        &want.message_id,
        &want.to,
        status_json(DUPLICATE),
        "bulk-duplicate",
    );
    let answer = move |r: Option<InfobipRecord>| match r {
        Some(record) => created(&record),
        None => duplicate,
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(record) => return answer(record),
        Played::Lost => return infobip_error(500, "GENERAL_ERROR", "Internal Server Error", None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => answer(create()),
        Answer::Fail {
            status,
            body,
            retry_after,
        } => infobip_failure(status, &body, retry_after),
        Answer::AcceptThenFail { status } => {
            let _ = create();
            infobip_error(status, "GENERAL_ERROR", "Internal Server Error", None)
        }
        Answer::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            let _ = create();
            infobip_error(
                status,
                "GENERAL_ERROR",
                "Internal Server Error",
                Some(retry_after),
            )
        }
        Answer::RejectQuoting { status } => {
            // Quoting the request whole: the text and the delivery URL,
            // the receipt secret in its query.
            let text = match &want.delivery_url {
                Some(url) => format!("invalid message '{}' (reports to {url})", want.text),
                None => format!("invalid message '{}'", want.text),
            };
            infobip_error(status, "BAD_REQUEST", &text, None)
        }
    }
}

fn iso(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

async fn infobip_logs(
    State(mock): State<MockProvider>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let ids: Vec<String> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .filter(|(k, _)| k == "messageId")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect();
    let visible: Vec<InfobipRecord> = {
        let mut inner = mock.lock();
        inner.lookups += 1;
        let p = inner.protocol::<Protocol>();
        if p.failing_lookups > 0 {
            p.failing_lookups -= 1;
            return infobip_error(500, "GENERAL_ERROR", "injected lookup failure", None);
        }
        let lag = p.log_lag;
        p.log
            .iter()
            .filter(|m| m.created.elapsed() >= lag)
            .filter(|m| ids.is_empty() || ids.contains(&m.message_id))
            .cloned()
            .collect()
    };
    if !has_api_key(&headers) {
        return infobip_error(401, "UNAUTHORIZED", "Invalid login details", None);
    }
    let results: Vec<serde_json::Value> = visible
        .iter()
        .rev()
        .take(1000)
        .map(|m| {
            serde_json::json!({
                "sender": m.sender,
                "destination": m.destination,
                "bulkId": m.bulk_id,
                "messageId": m.message_id,
                "sentAt": iso(m.created_at),
                "doneAt": iso(m.created_at),
                "messageCount": 1,
                "status": logged_status(&m.status),
                "content": { "text": m.text },
            })
        })
        .collect();
    let mut resp = axum::Json(serde_json::json!({ "results": results })).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
}

/// One delivery report for `m`.
fn report(m: &InfobipRecord, word: &str, error: Option<&str>) -> serde_json::Value {
    let status = report_status(word);
    let error = match error {
        Some(name) => serde_json::json!({
            "groupId": 1, "groupName": "HANDSET_ERRORS", "id": 1, "name": name,
            "description": "scripted error", "permanent": true,
        }),
        None => serde_json::json!({
            "groupId": 0, "groupName": "OK", "id": 0, "name": "NO_ERROR",
            "description": "No Error", "permanent": false,
        }),
    };
    serde_json::json!({
        "bulkId": m.bulk_id,
        "messageId": m.message_id,
        "to": m.destination,
        "sender": m.sender,
        "sentAt": iso(m.created_at),
        "doneAt": iso(m.created_at),
        "messageCount": 1,
        "price": { "pricePerMessage": 0.01, "currency": "EUR" },
        "status": status_json(status),
        "error": error,
    })
}

/// Posts Infobip delivery reports for `m`, one request per event.
async fn send_infobip_reports(config: ReceiptConfig, url: String, m: InfobipRecord) {
    let Some(client) = receipt_client() else {
        return;
    };
    for (status, event) in config.plan() {
        let error = (event == 1).then_some(config.error_code.as_deref()).flatten();
        let body = serde_json::json!({ "results": [report(&m, &status, error)] });
        let sent = client
            .post(&url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "mock provider: an Infobip delivery report failed");
        }
    }
}
