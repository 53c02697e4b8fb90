//! A scriptable stand-in for an SMS provider that speaks the `http`
//! provider protocol, for tests, the chaos run and demos.
//!
//! It behaves like a provider that de-duplicates on `Idempotency-Key`: a key
//! it already accepted is answered with the same id and not delivered again.
//! It counts calls per key and deliveries (distinct keys accepted), so a test
//! can assert "one message on the phone". Behaviours can be queued: each call
//! takes the next one, and accepts once the queue is empty.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// What the mock does with one call.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Accept (or answer the earlier id for a key it already accepted).
    Accept,
    /// Answer this status and JSON body without delivering.
    Fail {
        status: u16,
        body: serde_json::Value,
        retry_after: Option<u64>,
    },
    /// Deliver, then answer this status (a 5xx after acting: the dangerous case).
    AcceptThenFail { status: u16 },
    /// Wait for the gate to open, then accept.
    Gate(Arc<Notify>),
    /// Never answer (the caller times out).
    Hang,
    /// Wait, then accept.
    Delay(Duration),
}

/// One recorded call.
#[derive(Clone, Debug, Serialize)]
pub struct Call {
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Behaviour>,
    calls: Vec<Call>,
    /// Idempotency key -> the id it was accepted under.
    accepted: HashMap<String, String>,
    /// Deliveries per key (more than one would be a duplicate on a phone).
    deliveries: HashMap<String, u32>,
    next_id: u64,
}

#[derive(Clone, Default)]
pub struct MockProvider {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Serialize)]
pub struct Stats {
    pub calls: usize,
    pub deliveries: u32,
    pub keys_delivered: usize,
    pub max_deliveries_per_key: u32,
}

impl MockProvider {
    /// Serves on `listener` until the returned task is dropped or aborted.
    pub fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let app = Router::new()
            .route("/messages", post(send))
            .route("/stats", get(stats))
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
    }

    /// Starts on a free loopback port; returns the mock and its send URL.
    pub async fn start() -> std::io::Result<(MockProvider, String, SocketAddr)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mock = MockProvider::default();
        mock.serve(listener);
        Ok((mock, format!("http://{addr}/messages"), addr))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues behaviours for the next calls, in order.
    pub fn push(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.lock().script.extend(behaviours);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    pub fn call_count(&self) -> usize {
        self.lock().calls.len()
    }

    /// Deliveries made for one idempotency key.
    pub fn deliveries_for(&self, key: &str) -> u32 {
        self.lock().deliveries.get(key).copied().unwrap_or(0)
    }

    pub fn stats(&self) -> Stats {
        let inner = self.lock();
        Stats {
            calls: inner.calls.len(),
            deliveries: inner.deliveries.values().sum(),
            keys_delivered: inner.deliveries.len(),
            max_deliveries_per_key: inner.deliveries.values().copied().max().unwrap_or(0),
        }
    }

    /// Delivers (once per key) and returns the id.
    fn deliver(&self, key: Option<&str>) -> String {
        let mut inner = self.lock();
        if let Some(id) = key.and_then(|k| inner.accepted.get(k)).cloned() {
            return id;
        }
        inner.next_id += 1;
        let id = format!("prov_{}", inner.next_id);
        let key = key.map_or_else(|| id.clone(), str::to_string);
        inner.accepted.insert(key.clone(), id.clone());
        *inner.deliveries.entry(key).or_default() += 1;
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

async fn send(State(mock): State<MockProvider>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let behaviour = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            idempotency_key: key.clone(),
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        });
        inner.script.pop_front().unwrap_or(Behaviour::Accept)
    };
    match behaviour {
        Behaviour::Accept => accepted(mock.deliver(key.as_deref())),
        Behaviour::Fail {
            status,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp = (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response();
            if let Some(secs) = retry_after {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            resp
        }
        Behaviour::AcceptThenFail { status } => {
            mock.deliver(key.as_deref());
            StatusCode::from_u16(status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                .into_response()
        }
        Behaviour::Gate(gate) => {
            gate.notified().await;
            accepted(mock.deliver(key.as_deref()))
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Delay(d) => {
            tokio::time::sleep(d).await;
            accepted(mock.deliver(key.as_deref()))
        }
    }
}

async fn stats(State(mock): State<MockProvider>) -> Response {
    axum::Json(mock.stats()).into_response()
}
