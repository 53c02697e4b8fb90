//! The mock's `http` protocol: `POST /messages`, JSON
//! `{"to","from","body","reference"}` with `Idempotency-Key`, answered
//! `{"id","status"}`; de-duplication on the key only as [`Dedup`] says
//! (none by default); receipts to `ReceiptConfig::http_url` with
//! `X-Receipt-Secret`.

use std::collections::{HashMap, HashSet};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::mock_provider::{
    Dedup, Busy, Call, DropSwitch, MockProvider, ReceiptConfig, ReceiptOrder, Answer, Played, play,
    json_answer, receipt_client,
};

/// The `http` protocol's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router.route("/messages", post(send))
}

/// What only the `http` protocol keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    pub(crate) dedup: Dedup,
    /// `Ietf`: keys whose request is being processed now.
    in_flight: HashSet<String>,
    /// `Ietf`: the payload each accepted key came with.
    payloads: HashMap<String, serde_json::Value>,
    /// Idempotency key -> the id it was accepted under.
    accepted: HashMap<String, String>,
    next_id: u64,
}

impl MockProvider {
    /// Sets how the `http` endpoint treats a repeated key.
    pub fn set_dedup(&self, dedup: Dedup) {
        self.lock().protocol::<Protocol>().dedup = dedup;
    }

    /// Creates the message and returns its id (with `Replay` or `Ietf`, a
    /// key already accepted gets its id and nothing is created); sends the
    /// receipts for a new message when configured.
    fn deliver(&self, key: Option<&str>, sms: &serde_json::Value) -> String {
        let mut inner = self.lock();
        if inner.protocol::<Protocol>().dedup != Dedup::None
            && let Some(id) = key.and_then(|k| inner.protocol::<Protocol>().accepted.get(k)).cloned()
        {
            return id;
        }
        inner.protocol::<Protocol>().next_id += 1;
        let id = format!("prov_{}", inner.protocol::<Protocol>().next_id);
        let key = key.map_or_else(|| id.clone(), str::to_string);
        inner.protocol::<Protocol>().accepted.insert(key.clone(), id.clone());
        inner.protocol::<Protocol>().payloads.insert(key.clone(), sms.clone());
        *inner.deliveries.entry(key).or_default() += 1;
        let text = |name: &str| sms[name].as_str().unwrap_or_default().to_string();
        *inner
            .by_recipient_body
            .entry((text("to"), text("body")))
            .or_default() += 1;
        let receipts = inner.receipts.clone();
        drop(inner);
        if let Some(url) = receipts.http_url.clone()
            && receipts.order != ReceiptOrder::None
        {
            tokio::spawn(send_http_receipts(receipts, url, id.clone()));
        }
        id
    }
}

fn accepted(id: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "id": id, "status": "queued" }).to_string(),
    )
        .into_response()
}

/// `Ietf`: marks a key as being processed until dropped.
struct InFlight {
    mock: MockProvider,
    key: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.mock.lock().protocol::<Protocol>().in_flight.remove(&key);
        }
    }
}

/// What the `http` endpoint answers before running a behaviour, under the
/// IETF draft: a replay, 409 or 422; `None` to go on (the key is then held
/// as in flight by the returned guard).
fn ietf_answer(
    mock: &MockProvider,
    key: Option<&str>,
    sms: &serde_json::Value,
) -> Result<InFlight, Box<Response>> {
    let mut inner = mock.lock();
    let Some(key) = key.filter(|_| inner.protocol::<Protocol>().dedup == Dedup::Ietf) else {
        return Ok(InFlight {
            mock: mock.clone(),
            key: None,
        });
    };
    if inner.protocol::<Protocol>().in_flight.contains(key) {
        let body = serde_json::json!({
            "type": "https://developer.example.com/idempotency/in-flight",
            "title": "A request with this Idempotency-Key is still being processed",
            "message": "a request with this Idempotency-Key is still being processed",
        });
        return Err(Box::new(json_answer(StatusCode::CONFLICT, &body, Some(1))));
    }
    if let Some(id) = inner.protocol::<Protocol>().accepted.get(key).cloned() {
        if inner.protocol::<Protocol>().payloads.get(key).is_some_and(|p| p != sms) {
            let body = serde_json::json!({
                "title": "This Idempotency-Key was used with another payload",
                "message": "this Idempotency-Key was used with another payload",
            });
            return Err(Box::new(json_answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                &body,
                None,
            )));
        }
        return Err(Box::new(accepted(id)));
    }
    inner.protocol::<Protocol>().in_flight.insert(key.to_string());
    Ok(InFlight {
        mock: mock.clone(),
        key: Some(key.to_string()),
    })
}

async fn send(
    State(mock): State<MockProvider>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let sms: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let busy = Busy::new(&mock);
    mock.lock().calls.push(Call {
        endpoint: "http".into(),
        idempotency_key: key.clone(),
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: sms.clone(),
    });
    let in_flight = match ietf_answer(&mock, key.as_deref(), &sms) {
        Ok(guard) => guard,
        Err(answer) => return *answer,
    };
    let (behaviour, latency) = {
        let mut inner = mock.lock();
        inner.next_behaviour()
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let quoted = sms["body"].as_str().unwrap_or_default().to_string();
    let create = {
        let mock = mock.clone();
        // A key stops being in flight once its message is made.
        move || {
            let id = mock.deliver(key.as_deref(), &sms);
            drop(in_flight);
            id
        }
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(record) => return accepted(record),
        Played::Lost => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => accepted(create()),
        Answer::Fail {
            status,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_answer(status, &body, retry_after)
        }
        Answer::AcceptThenFail { status } => {
            create();
            StatusCode::from_u16(status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                .into_response()
        }
        Answer::RejectQuoting { status } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            let text = quoted.clone();
            json_answer(
                status,
                // The text quoted in the error code as well (issue 41,
                // finding 1): some providers put the refused content there.
                &serde_json::json!({
                    "message": format!("invalid message '{text}'"),
                    "code": format!("BLOCKED_CONTENT:{text}"),
                }),
                None,
            )
        }
        Answer::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_answer(
                status,
                &serde_json::json!({"message": "injected failure after sending"}),
                Some(retry_after),
            )
        }
    }
}

/// Posts `http` protocol receipts for the message accepted under `id`.
async fn send_http_receipts(config: ReceiptConfig, url: String, id: String) {
    let Some(client) = receipt_client() else {
        return;
    };
    for (status, event) in config.plan() {
        let error_code = (event == 1).then(|| config.error_code.clone()).flatten();
        let mut req = client.post(&url).json(&serde_json::json!({
            "id": id,
            "status": status,
            "event_id": format!("{id}-{event}"),
            "error_code": error_code,
        }));
        if let Some(secret) = &config.http_secret {
            req = req.header("X-Receipt-Secret", secret);
        }
        if let Err(e) = req.send().await {
            tracing::warn!(error = %e, "mock provider: a receipt failed");
        }
    }
}
