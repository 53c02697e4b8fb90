//! A scriptable stand-in for an SMS provider that speaks the `http`
//! provider protocol and Twilio's Messages endpoint, for tests, the chaos run
//! and demos. What is common to every protocol is here (behaviours, faults,
//! counting, receipts' plan, the connection loop); each protocol is one
//! module of [`crate::providers`], listed once in [`crate::providers::routes`].
//! (The Telegram Gateway API's mock, with its at-most-once request ids, is
//! [`crate::providers::telegram_gateway`].)
//!
//! Twilio: `POST /2010-04-01/Accounts/{sid}/Messages.json` (form-encoded;
//! every accepted call creates a message, as Twilio does: no de-duplication)
//! and `GET` on the same path (the list, filtered by `To` and `DateSent>`,
//! newest first by creation, paged), with Twilio's error bodies. As at
//! Twilio, a created message stays `queued` with a null `date_sent` (which
//! `DateSent` filters never match) until it is handed to the carrier
//! ([`MockProvider::twilio_hand_over`]). Both protocols can send
//! delivery receipts back ([`ReceiptConfig`]): in order, out of order, or
//! duplicated; Twilio's signed with the auth token the request was
//! authenticated with.
//!
//! It counts every message it creates, per idempotency key and per (To,
//! Body) over both protocols, so a test can assert "one message on the
//! phone" by counting creations. Whether its `http` endpoint de-duplicates on
//! `Idempotency-Key` is a mode ([`Dedup`]): by default it does not (every
//! accepted call creates a message, as Twilio's endpoint always does), so a
//! test never counts the mock's own de-duplication as ours; `Replay`
//! answers a key it already accepted with the same id and creates nothing;
//! `Ietf` follows the IETF Idempotency-Key draft (as Stripe does): a replay
//! as above, `409` while a request with the same key is still being
//! processed, `422` for the key with another payload. Behaviours can be
//! queued: each call takes the next one; once the queue is empty, each call
//! draws one at random from the configured [`Faults`] (none by default:
//! accept).
//!
//! It serves HTTP/1.1 connection by connection (hyper directly rather than
//! `axum::serve`) so that it can drop a connection after accepting a message
//! and before answering: the most dangerous thing a provider can do.

use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
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
    /// Deliver, then answer this status with `Retry-After` (seconds).
    AcceptThenRetryLater { status: u16, retry_after: u64 },
    /// Wait for the gate to open, then accept.
    Gate(Arc<Notify>),
    /// Never answer (the caller times out).
    Hang,
    /// Wait, then accept.
    Delay(Duration),
    /// Deliver, then close the connection without answering.
    AcceptThenDrop,
    /// Deliver, then never answer (the caller times out after the send).
    AcceptThenHang,
    /// Deliver at once, then answer after this long (a slow answer to a
    /// message that already exists).
    AcceptThenDelay(Duration),
    /// Refuse the message with this status, quoting its text in the error
    /// (as some providers do), without creating it; the `http` protocol
    /// quotes it in the error code as well.
    RejectQuoting { status: u16 },
    /// Wait for the gate to open, then behave as the inner behaviour says.
    After(Arc<Notify>, Box<Behaviour>),
    /// Go on processing for this long whatever the caller does, then create
    /// the message (and answer, if the caller still waits): a provider that
    /// acts on a request its caller already gave up on (a timeout, a
    /// shutdown that cut the call off).
    Processing(Duration),
}

impl Behaviour {
    /// The behaviour to carry out once every gate in front of it opened.
    pub(crate) async fn after_gates(self) -> Behaviour {
        let mut b = self;
        while let Behaviour::After(gate, inner) = b {
            gate.notified().await;
            b = *inner;
        }
        b
    }
}

/// A behaviour about what the answer says, which each protocol words in its
/// own wire format (the rest are about timing and are played out the same
/// way for every protocol, by [`play`]).
#[derive(Clone, Debug)]
pub(crate) enum Answer {
    /// Accept (or, where the protocol de-duplicates, answer the earlier
    /// message).
    Accept,
    Fail {
        status: u16,
        body: serde_json::Value,
        retry_after: Option<u64>,
    },
    AcceptThenFail {
        status: u16,
    },
    AcceptThenRetryLater {
        status: u16,
        retry_after: u64,
    },
    RejectQuoting {
        status: u16,
    },
}

/// What [`play`] leaves to the protocol.
pub(crate) enum Played<T, F> {
    /// The message was created: answer it as the protocol accepts.
    Accepted(T),
    /// The processing task was lost before it answered: the protocol's 500.
    Lost,
    /// Word this answer; `create` makes the message when the answer says
    /// it was made.
    Answer(Answer, F),
}

/// Plays out `behaviour` (its gates already opened) for one call whose
/// message `create` makes: every timing behaviour (a gate, a hang, a delay,
/// a provider still processing after its caller left, a message made and
/// then never answered or its connection dropped) is the same at every
/// protocol, so it is written once here. `busy` counts the call as being
/// processed until the message is made or the call is answered; `switch`
/// drops the caller's connection.
pub(crate) async fn play<T, F>(
    behaviour: Behaviour,
    create: F,
    busy: Busy,
    switch: Option<axum::Extension<DropSwitch>>,
) -> Played<T, F>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match behaviour {
        Behaviour::Accept | Behaviour::After(..) => Played::Answer(Answer::Accept, create),
        Behaviour::Fail {
            status,
            body,
            retry_after,
        } => Played::Answer(
            Answer::Fail {
                status,
                body,
                retry_after,
            },
            create,
        ),
        Behaviour::AcceptThenFail { status } => {
            Played::Answer(Answer::AcceptThenFail { status }, create)
        }
        Behaviour::AcceptThenRetryLater {
            status,
            retry_after,
        } => Played::Answer(
            Answer::AcceptThenRetryLater {
                status,
                retry_after,
            },
            create,
        ),
        Behaviour::RejectQuoting { status } => {
            Played::Answer(Answer::RejectQuoting { status }, create)
        }
        Behaviour::Gate(gate) => {
            gate.notified().await;
            Played::Accepted(create())
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Delay(d) => {
            tokio::time::sleep(d).await;
            Played::Accepted(create())
        }
        Behaviour::AcceptThenDelay(d) => {
            let made = create();
            tokio::time::sleep(d).await;
            Played::Accepted(made)
        }
        Behaviour::Processing(d) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let _ = tx.send(create());
                drop(busy);
            });
            match rx.await {
                Ok(made) => Played::Accepted(made),
                Err(_) => Played::Lost,
            }
        }
        Behaviour::AcceptThenHang => {
            create();
            std::future::pending().await
        }
        Behaviour::AcceptThenDrop => {
            create();
            drop_connection(switch);
            std::future::pending().await
        }
    }
}

/// How the mock's `http` endpoint treats a repeated `Idempotency-Key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dedup {
    /// Every accepted call creates a message (Twilio's endpoint always
    /// behaves so: it has no idempotency key).
    #[default]
    None,
    /// A key already accepted is answered with its id; nothing is created.
    Replay,
    /// The IETF Idempotency-Key draft: a key already accepted is answered
    /// with its id (the scripted behaviour queue is not consumed); a key
    /// whose first request is still being processed is answered `409`; the
    /// key with another payload `422`.
    Ietf,
}

impl Dedup {
    /// Reads `MOCK_DEDUP`: `none` (default), `replay` or `ietf`.
    pub fn from_env() -> Result<Dedup, String> {
        match std::env::var("MOCK_DEDUP").ok().as_deref() {
            None | Some("") | Some("none") => Ok(Dedup::None),
            Some("replay") => Ok(Dedup::Replay),
            Some("ietf") => Ok(Dedup::Ietf),
            Some(_) => Err("MOCK_DEDUP must be none, replay or ietf".into()),
        }
    }
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

    pub(crate) fn draw(&self) -> Behaviour {
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

    pub(crate) fn latency(&self) -> Duration {
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
    /// `http` or `twilio`.
    pub endpoint: String,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) faults: Faults,
    /// Requests being processed now (answered or not), over every protocol.
    pub(crate) busy: usize,
    pub(crate) script: VecDeque<Behaviour>,
    pub(crate) calls: Vec<Call>,
    /// Messages created per key (more than one is a duplicate on a phone).
    pub(crate) deliveries: HashMap<String, u32>,
    /// Deliveries per (To, Body), over every protocol.
    pub(crate) by_recipient_body: HashMap<(String, String), u32>,
    pub(crate) receipts: ReceiptConfig,
    /// Reconciliation lookups made (Twilio's message list).
    pub(crate) lookups: usize,
    /// How each receipt post was answered (`200`, `503`, or the error), in
    /// the order sent: what a test's failed wait for receipts says.
    pub(crate) receipt_answers: Vec<String>,
    /// Each protocol's own state, by its type (`providers::*::Protocol`).
    protocols: HashMap<TypeId, Box<dyn Any + Send>>,
}

impl Inner {
    /// What the next call does (the script first, then the random faults)
    /// and how long its answer is held back.
    pub(crate) fn next_behaviour(&mut self) -> (Behaviour, Duration) {
        let behaviour = match self.script.pop_front() {
            Some(b) => b,
            None => self.faults.draw(),
        };
        (behaviour, self.faults.latency())
    }

    /// The state protocol module `P` keeps, made on first use.
    pub(crate) fn protocol<P: Default + Send + 'static>(&mut self) -> &mut P {
        let state = self
            .protocols
            .entry(TypeId::of::<P>())
            .or_insert_with(|| Box::new(P::default()));
        match state.downcast_mut::<P>() {
            Some(p) => p,
            // Keyed by its own type: always a `P`.
            None => unreachable!("protocol state under another type's id"),
        }
    }
}

/// Which receipts the mock sends back for each message it delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReceiptOrder {
    /// None (the default).
    #[default]
    None,
    /// `sent`, then the final status.
    InOrder,
    /// The final status, then `sent`.
    OutOfOrder,
    /// `sent`, the final status, and the final status again (same event).
    Duplicated,
}

/// Receipts the mock sends back.
#[derive(Clone, Debug, Default)]
pub struct ReceiptConfig {
    pub order: ReceiptOrder,
    /// The final status reported: `delivered` (default) or e.g. `undelivered`.
    pub final_status: Option<String>,
    /// `ErrorCode` / `error_code` sent with the final status.
    pub error_code: Option<String>,
    /// Where receipts of the `http` protocol go (`.../providers/http/status`);
    /// Twilio receipts go to each message's `StatusCallback`.
    pub http_url: Option<String>,
    /// Sent as `X-Receipt-Secret` with `http` receipts.
    pub http_secret: Option<String>,
}

impl ReceiptConfig {
    /// Reads `MOCK_RECEIPTS` (`none`, `in-order`, `out-of-order`,
    /// `duplicated`), `MOCK_RECEIPT_STATUS`, `MOCK_RECEIPT_ERROR_CODE`,
    /// `MOCK_HTTP_RECEIPT_URL` and `MOCK_RECEIPT_SECRET`.
    pub fn from_env() -> Result<ReceiptConfig, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let order = match var("MOCK_RECEIPTS").as_deref() {
            None | Some("none") => ReceiptOrder::None,
            Some("in-order") => ReceiptOrder::InOrder,
            Some("out-of-order") => ReceiptOrder::OutOfOrder,
            Some("duplicated") => ReceiptOrder::Duplicated,
            Some(_) => {
                return Err(
                    "MOCK_RECEIPTS must be none, in-order, out-of-order or duplicated".into(),
                );
            }
        };
        Ok(ReceiptConfig {
            order,
            final_status: var("MOCK_RECEIPT_STATUS"),
            error_code: var("MOCK_RECEIPT_ERROR_CODE"),
            http_url: var("MOCK_HTTP_RECEIPT_URL"),
            http_secret: var("MOCK_RECEIPT_SECRET"),
        })
    }

    /// The (status, event number) pairs to send, in order; a repeated event
    /// number is a redelivery of the same event.
    pub(crate) fn plan(&self) -> Vec<(String, usize)> {
        let done = self
            .final_status
            .clone()
            .unwrap_or_else(|| "delivered".into());
        match self.order {
            ReceiptOrder::None => Vec::new(),
            ReceiptOrder::InOrder => vec![("sent".into(), 0), (done, 1)],
            ReceiptOrder::OutOfOrder => vec![(done, 1), ("sent".into(), 0)],
            ReceiptOrder::Duplicated => vec![("sent".into(), 0), (done.clone(), 1), (done, 1)],
        }
    }
}

#[derive(Clone, Default)]
pub struct MockProvider {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Serialize)]
pub struct Stats {
    pub calls: usize,
    /// Messages created, over both protocols.
    pub created: u32,
    pub deliveries: u32,
    pub keys_delivered: usize,
    pub max_deliveries_per_key: u32,
    /// Keys delivered more than once: SMS a phone got twice.
    pub duplicate_keys: usize,
    /// Distinct (To, Body) pairs delivered, over both protocols.
    pub recipient_bodies_delivered: usize,
    pub max_deliveries_per_recipient_body: u32,
    /// (To, Body) pairs delivered more than once (Twilio has no idempotency
    /// key, so this is how its duplicates show).
    pub duplicate_recipient_bodies: usize,
    /// Twilio message list lookups (reconciliations).
    pub lookups: usize,
}

impl MockProvider {
    /// A mock that misbehaves at random as `faults` says.
    pub fn with_faults(faults: Faults) -> Self {
        let mock = MockProvider::default();
        mock.lock().faults = faults;
        mock
    }

    /// Requests the mock is still processing (some may create a message
    /// yet, whatever their caller did): a test counts messages once this is
    /// zero.
    pub fn busy(&self) -> usize {
        self.lock().busy
    }

    /// Messages created in all (over both protocols).
    pub fn created(&self) -> u32 {
        self.lock().by_recipient_body.values().sum()
    }

    /// Messages created for recipient `to`, whatever their bodies.
    pub fn created_to(&self, to: &str) -> u32 {
        self.lock()
            .by_recipient_body
            .iter()
            .filter(|((recipient, _), _)| recipient == to)
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
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
            created: inner.by_recipient_body.values().sum(),
            deliveries: inner.deliveries.values().sum(),
            keys_delivered: inner.deliveries.len(),
            max_deliveries_per_key: inner.deliveries.values().copied().max().unwrap_or(0),
            duplicate_keys: inner.deliveries.values().filter(|n| **n > 1).count(),
            recipient_bodies_delivered: inner.by_recipient_body.len(),
            max_deliveries_per_recipient_body: inner
                .by_recipient_body
                .values()
                .copied()
                .max()
                .unwrap_or(0),
            duplicate_recipient_bodies: inner
                .by_recipient_body
                .values()
                .filter(|n| **n > 1)
                .count(),
            lookups: inner.lookups,
        }
    }

    /// Deliveries made to `to` with `body`, over both protocols.
    pub fn deliveries_to(&self, to: &str, body: &str) -> u32 {
        self.lock()
            .by_recipient_body
            .get(&(to.to_string(), body.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Sends these receipts for every message delivered from now on.
    pub fn set_receipts(&self, receipts: ReceiptConfig) {
        self.lock().receipts = receipts;
    }

    /// How each receipt post of the protocols that record it (Vonage) was
    /// answered, in the order sent: `<provider message id> <status>: <HTTP
    /// status or error>`.
    pub fn receipt_answers(&self) -> Vec<String> {
        self.lock().receipt_answers.clone()
    }
}

/// A handler's way to close its own connection without answering.
#[derive(Clone)]
pub(crate) struct DropSwitch(Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

pub(crate) async fn serve_connection(stream: tokio::net::TcpStream, app: Router) {
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

/// Counts a request as being processed until dropped.
pub(crate) struct Busy(MockProvider);

impl Busy {
    pub(crate) fn new(mock: &MockProvider) -> Self {
        mock.lock().busy += 1;
        Busy(mock.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.lock().busy -= 1;
    }
}

/// Closes the caller's connection without an answer.
pub(crate) fn drop_connection(switch: Option<axum::Extension<DropSwitch>>) {
    if let Some(axum::Extension(DropSwitch(switch))) = switch
        && let Some(tx) = switch.lock().unwrap_or_else(PoisonError::into_inner).take()
    {
        let _ = tx.send(());
    }
}

pub(crate) async fn stats(State(mock): State<MockProvider>) -> Response {
    axum::Json(mock.stats()).into_response()
}

/// A JSON answer, with `Retry-After` in seconds when given.
pub(crate) fn json_answer(
    status: StatusCode,
    body: &serde_json::Value,
    retry_after: Option<u64>,
) -> Response {
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

pub(crate) fn receipt_client() -> Option<reqwest::Client> {
    sendonce::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()
}
