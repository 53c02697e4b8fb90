//! A scriptable stand-in for an SMS provider that speaks the `http`
//! provider protocol, for tests, the chaos run and demos.
//!
//! It behaves like a provider that de-duplicates on `Idempotency-Key`: a key
//! it already accepted is answered with the same id and not delivered again.
//! It counts calls per key and deliveries (distinct keys accepted), so a test
//! can assert "one message on the phone". Behaviours can be queued: each call
//! takes the next one; once the queue is empty, each call draws one at
//! random from the configured [`Faults`] (none by default: accept).
//!
//! It serves HTTP/1.1 connection by connection (hyper directly rather than
//! `axum::serve`) so that it can drop a connection after accepting a message
//! and before answering: the most dangerous thing a provider can do.

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
    /// Deliver, then close the connection without answering.
    AcceptThenDrop,
}

/// Random misbehaviour for calls that have no queued behaviour. Rates are
/// probabilities in [0, 1], drawn in this order for each call.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Latency added to every answer, drawn uniformly from this range.
    pub latency: (Duration, Duration),
    /// 500 without delivering.
    pub error_500: f64,
    /// 429 with `Retry-After: retry_after_secs`.
    pub rate_limited: f64,
    pub retry_after_secs: u64,
    /// Never answer.
    pub hang: f64,
    /// Deliver, then drop the connection.
    pub accept_then_drop: f64,
    /// Deliver, then answer 500.
    pub accept_then_500: f64,
}

impl Faults {
    /// Reads `MOCK_LATENCY_MS` (`min-max` or `n`), `MOCK_FAIL_500`,
    /// `MOCK_RATE_LIMIT`, `MOCK_RETRY_AFTER_SECS`, `MOCK_HANG`,
    /// `MOCK_ACCEPT_THEN_DROP`, `MOCK_ACCEPT_THEN_500`.
    pub fn from_env() -> Result<Faults, String> {
        let rate = |name: &str| -> Result<f64, String> {
            match std::env::var(name) {
                Err(_) => Ok(0.0),
                Ok(v) => match v.parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(format!("{name} must be a probability between 0 and 1")),
                },
            }
        };
        let latency = match std::env::var("MOCK_LATENCY_MS") {
            Err(_) => (Duration::ZERO, Duration::ZERO),
            Ok(v) => {
                let (lo, hi) = v.split_once('-').unwrap_or((&v, &v));
                let ms = |s: &str| {
                    s.trim()
                        .parse::<u64>()
                        .map(Duration::from_millis)
                        .map_err(|_| {
                            "MOCK_LATENCY_MS must be N or MIN-MAX milliseconds".to_string()
                        })
                };
                let (lo, hi) = (ms(lo)?, ms(hi)?);
                if hi < lo {
                    return Err("MOCK_LATENCY_MS: MAX must not be below MIN".into());
                }
                (lo, hi)
            }
        };
        Ok(Faults {
            latency,
            error_500: rate("MOCK_FAIL_500")?,
            rate_limited: rate("MOCK_RATE_LIMIT")?,
            retry_after_secs: std::env::var("MOCK_RETRY_AFTER_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
            hang: rate("MOCK_HANG")?,
            accept_then_drop: rate("MOCK_ACCEPT_THEN_DROP")?,
            accept_then_500: rate("MOCK_ACCEPT_THEN_500")?,
        })
    }

    fn draw(&self) -> Behaviour {
        use rand::Rng;
        let mut rng = rand::rng();
        let mut roll = |p: f64| p > 0.0 && rng.random_bool(p.min(1.0));
        if roll(self.error_500) {
            Behaviour::Fail {
                status: 500,
                body: serde_json::json!({"message": "injected failure"}),
                retry_after: None,
            }
        } else if roll(self.rate_limited) {
            Behaviour::Fail {
                status: 429,
                body: serde_json::json!({"message": "injected rate limit"}),
                retry_after: Some(self.retry_after_secs),
            }
        } else if roll(self.hang) {
            Behaviour::Hang
        } else if roll(self.accept_then_drop) {
            Behaviour::AcceptThenDrop
        } else if roll(self.accept_then_500) {
            Behaviour::AcceptThenFail { status: 500 }
        } else {
            Behaviour::Accept
        }
    }

    fn latency(&self) -> Duration {
        use rand::Rng;
        let (lo, hi) = self.latency;
        if hi <= lo {
            return lo;
        }
        let span = u64::try_from((hi - lo).as_micros()).unwrap_or(u64::MAX);
        lo + Duration::from_micros(rand::rng().random_range(0..=span))
    }
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
    faults: Faults,
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
    /// Keys delivered more than once: SMS a phone got twice.
    pub duplicate_keys: usize,
}

impl MockProvider {
    /// A mock that misbehaves at random as `faults` says.
    pub fn with_faults(faults: Faults) -> Self {
        let mock = MockProvider::default();
        mock.lock().faults = faults;
        mock
    }

    /// Serves on `listener` until the returned task is aborted.
    pub fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let app = Router::new()
            .route("/messages", post(send))
            .route("/stats", get(stats))
            .with_state(self.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let app = app.clone();
                tokio::spawn(serve_connection(stream, app));
            }
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
            duplicate_keys: inner.deliveries.values().filter(|n| **n > 1).count(),
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

/// A handler's way to close its own connection without answering.
#[derive(Clone)]
struct DropSwitch(Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

async fn serve_connection(stream: tokio::net::TcpStream, app: Router) {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt;

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let switch = DropSwitch(Arc::new(Mutex::new(Some(tx))));
    let service = tower::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(switch.clone());
        app.clone().oneshot(req.map(axum::body::Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::select! {
        _ = conn => {}
        // Dropping the connection future closes the socket mid-request.
        _ = rx => {}
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
    let (behaviour, latency) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            idempotency_key: key.clone(),
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        });
        let behaviour = match inner.script.pop_front() {
            Some(b) => b,
            None => inner.faults.draw(),
        };
        (behaviour, inner.faults.latency())
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
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
        Behaviour::AcceptThenDrop => {
            mock.deliver(key.as_deref());
            if let Some(axum::Extension(DropSwitch(switch))) = switch
                && let Some(tx) = switch.lock().unwrap_or_else(PoisonError::into_inner).take()
            {
                let _ = tx.send(());
            }
            std::future::pending().await
        }
    }
}

async fn stats(State(mock): State<MockProvider>) -> Response {
    axum::Json(mock.stats()).into_response()
}
