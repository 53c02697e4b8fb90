//! A scriptable stand-in for an SMS provider that speaks the `http`
//! provider protocol and Twilio's Messages endpoint, for tests, the chaos run
//! and demos.
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

use std::collections::{HashMap, HashSet, VecDeque};
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
    /// (as some providers do), without creating it.
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
    async fn after_gates(self) -> Behaviour {
        let mut b = self;
        while let Behaviour::After(gate, inner) = b {
            gate.notified().await;
            b = *inner;
        }
        b
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
    /// `http` or `twilio`.
    pub endpoint: String,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct Inner {
    faults: Faults,
    dedup: Dedup,
    /// `Ietf`: keys whose request is being processed now.
    in_flight: HashSet<String>,
    /// Requests being processed now (answered or not), over both protocols.
    busy: usize,
    /// `Ietf`: the payload each accepted key came with.
    payloads: HashMap<String, serde_json::Value>,
    /// How far the mock Twilio's clock is from this machine's (its
    /// `date_created` and its `Date` header).
    twilio_clock_offset: time::Duration,
    script: VecDeque<Behaviour>,
    calls: Vec<Call>,
    /// Idempotency key -> the id it was accepted under.
    accepted: HashMap<String, String>,
    /// Messages created per key (more than one is a duplicate on a phone).
    deliveries: HashMap<String, u32>,
    next_id: u64,
    /// Deliveries per (To, Body), over both protocols.
    by_recipient_body: HashMap<(String, String), u32>,
    /// Messages created through the Twilio endpoint, oldest first.
    twilio_messages: Vec<TwilioRecord>,
    /// Message list lookups made, and how many of the next ones fail.
    lookups: usize,
    failing_lookups: usize,
    receipts: ReceiptConfig,
}

/// A message created through the Twilio endpoint.
#[derive(Clone, Debug)]
struct TwilioRecord {
    sid: String,
    account_sid: String,
    to: String,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    body: String,
    created_at: time::OffsetDateTime,
    /// `queued` until handed to the carrier, then `sent`.
    status: &'static str,
    /// Null until handed to the carrier, as at Twilio.
    date_sent: Option<time::OffsetDateTime>,
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
    fn plan(&self) -> Vec<(String, usize)> {
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

    /// Sets how the `http` endpoint treats a repeated key.
    pub fn set_dedup(&self, dedup: Dedup) {
        self.lock().dedup = dedup;
    }

    /// Sets the mock Twilio's clock `offset` from this machine's (positive:
    /// ahead): the times it shows and its `Date` header.
    pub fn set_twilio_clock_offset(&self, offset: time::Duration) {
        self.lock().twilio_clock_offset = offset;
    }

    /// `resp` with the mock Twilio's own `Date` header (its clock may be
    /// set apart from this machine's).
    fn twilio_dated(&self, mut resp: Response) -> Response {
        let offset = self.lock().twilio_clock_offset;
        let now = std::time::SystemTime::now();
        let at = if offset.is_negative() {
            now - offset.unsigned_abs()
        } else {
            now + offset.unsigned_abs()
        };
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
            resp.headers_mut().insert(header::DATE, v);
        }
        resp
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

    /// Serves on `listener` until the returned task is aborted.
    pub fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let app = Router::new()
            .route("/messages", post(send))
            .route(
                "/2010-04-01/Accounts/{account_sid}/Messages.json",
                post(twilio_send).get(twilio_list),
            )
            .route("/stats", get(stats))
            .with_state(self.clone());
        tokio::spawn(async move {
            let listener = &listener;
            crate::accept::accept_loop(
                move || async move { Some(listener.accept().await) },
                |(stream, _)| {
                    tokio::spawn(serve_connection(stream, app.clone()));
                },
            )
            .await;
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

    /// Makes the next `n` Twilio message list lookups answer 500.
    pub fn fail_lookups(&self, n: usize) {
        self.lock().failing_lookups = n;
    }

    /// Sends these receipts for every message delivered from now on.
    pub fn set_receipts(&self, receipts: ReceiptConfig) {
        self.lock().receipts = receipts;
    }

    /// Creates a Twilio message (a delivery) and returns its resource.
    fn twilio_create(&self, account_sid: &str, form: &HashMap<String, String>) -> TwilioRecord {
        let mut inner = self.lock();
        let now = time::OffsetDateTime::now_utc() + inner.twilio_clock_offset;
        let record = TwilioRecord {
            sid: format!("SM{}", uuid::Uuid::new_v4().simple()),
            account_sid: account_sid.to_string(),
            to: form.get("To").cloned().unwrap_or_default(),
            from: form.get("From").cloned(),
            messaging_service_sid: form.get("MessagingServiceSid").cloned(),
            body: form.get("Body").cloned().unwrap_or_default(),
            created_at: sendonce::clock::truncate_to_micros(now),
            status: "queued",
            date_sent: None,
        };
        *inner
            .by_recipient_body
            .entry((record.to.clone(), record.body.clone()))
            .or_default() += 1;
        inner.twilio_messages.push(record.clone());
        record
    }

    /// Hands every queued Twilio message to the carrier: `sent`, with
    /// `date_sent` now (Twilio sets it only then).
    pub fn twilio_hand_over(&self) {
        let mut inner = self.lock();
        let now = sendonce::clock::truncate_to_micros(
            time::OffsetDateTime::now_utc() + inner.twilio_clock_offset,
        );
        for m in &mut inner.twilio_messages {
            if m.date_sent.is_none() {
                m.status = "sent";
                m.date_sent = Some(now);
            }
        }
    }

    /// Moves the times of every Twilio message created so far back by `by`,
    /// as if they had been created that much earlier.
    pub fn twilio_backdate(&self, by: Duration) {
        let by = time::Duration::try_from(by).unwrap_or(time::Duration::ZERO);
        for m in &mut self.lock().twilio_messages {
            m.created_at -= by;
            m.date_sent = m.date_sent.map(|d| d - by);
        }
    }

    /// The sids of the messages created through the Twilio endpoint, oldest
    /// first.
    pub fn twilio_sids(&self) -> Vec<String> {
        self.lock()
            .twilio_messages
            .iter()
            .map(|m| m.sid.clone())
            .collect()
    }

    /// Creates the message and returns its id (with `Replay` or `Ietf`, a
    /// key already accepted gets its id and nothing is created); sends the
    /// receipts for a new message when configured.
    fn deliver(&self, key: Option<&str>, sms: &serde_json::Value) -> String {
        let mut inner = self.lock();
        if inner.dedup != Dedup::None
            && let Some(id) = key.and_then(|k| inner.accepted.get(k)).cloned()
        {
            return id;
        }
        inner.next_id += 1;
        let id = format!("prov_{}", inner.next_id);
        let key = key.map_or_else(|| id.clone(), str::to_string);
        inner.accepted.insert(key.clone(), id.clone());
        inner.payloads.insert(key.clone(), sms.clone());
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

/// Counts a request as being processed until dropped.
struct Busy(MockProvider);

impl Busy {
    fn new(mock: &MockProvider) -> Self {
        mock.lock().busy += 1;
        Busy(mock.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.lock().busy -= 1;
    }
}

/// `Ietf`: marks a key as being processed until dropped.
struct InFlight {
    mock: MockProvider,
    key: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.mock.lock().in_flight.remove(&key);
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
    let Some(key) = key.filter(|_| inner.dedup == Dedup::Ietf) else {
        return Ok(InFlight {
            mock: mock.clone(),
            key: None,
        });
    };
    if inner.in_flight.contains(key) {
        let body = serde_json::json!({
            "type": "https://developer.example.com/idempotency/in-flight",
            "title": "A request with this Idempotency-Key is still being processed",
            "message": "a request with this Idempotency-Key is still being processed",
        });
        return Err(Box::new(json_answer(StatusCode::CONFLICT, &body, Some(1))));
    }
    if let Some(id) = inner.accepted.get(key).cloned() {
        if inner.payloads.get(key).is_some_and(|p| p != sms) {
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
    inner.in_flight.insert(key.to_string());
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
        let behaviour = match inner.script.pop_front() {
            Some(b) => b,
            None => inner.faults.draw(),
        };
        (behaviour, inner.faults.latency())
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let quoted = sms["body"].as_str().unwrap_or_default().to_string();
    let create = {
        let mock = mock.clone();
        move || mock.deliver(key.as_deref(), &sms)
    };
    match behaviour {
        // (`After` was unwrapped above.)
        Behaviour::Accept | Behaviour::After(..) => accepted(create()),
        Behaviour::Fail {
            status,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_answer(status, &body, retry_after)
        }
        Behaviour::AcceptThenFail { status } => {
            create();
            StatusCode::from_u16(status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                .into_response()
        }
        Behaviour::RejectQuoting { status } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            let text = quoted.clone();
            json_answer(
                status,
                &serde_json::json!({ "message": format!("invalid message '{text}'") }),
                None,
            )
        }
        Behaviour::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            drop(in_flight);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_answer(
                status,
                &serde_json::json!({"message": "injected failure after sending"}),
                Some(retry_after),
            )
        }
        Behaviour::Gate(gate) => {
            gate.notified().await;
            accepted(create())
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Delay(d) => {
            tokio::time::sleep(d).await;
            accepted(create())
        }
        Behaviour::AcceptThenDelay(d) => {
            let id = create();
            drop(in_flight);
            tokio::time::sleep(d).await;
            accepted(id)
        }
        Behaviour::Processing(d) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let id = create();
                drop(in_flight);
                drop(busy);
                let _ = tx.send(id);
            });
            match rx.await {
                Ok(id) => accepted(id),
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        }
        Behaviour::AcceptThenHang => {
            create();
            drop(in_flight);
            std::future::pending().await
        }
        Behaviour::AcceptThenDrop => {
            create();
            drop(in_flight);
            drop_connection(switch);
            std::future::pending().await
        }
    }
}

/// Closes the caller's connection without an answer.
fn drop_connection(switch: Option<axum::Extension<DropSwitch>>) {
    if let Some(axum::Extension(DropSwitch(switch))) = switch
        && let Some(tx) = switch.lock().unwrap_or_else(PoisonError::into_inner).take()
    {
        let _ = tx.send(());
    }
}

async fn stats(State(mock): State<MockProvider>) -> Response {
    axum::Json(mock.stats()).into_response()
}

/// Twilio's error body.
fn twilio_error(status: u16, code: i64, message: &str, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "code": code,
        "message": message,
        "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
        "status": status.as_u16(),
    });
    json_answer(status, &body, retry_after)
}

/// A JSON answer, with `Retry-After` in seconds when given.
fn json_answer(status: StatusCode, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
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

/// A scripted failure as Twilio would send it: the scripted body when it is
/// already Twilio's shape, else wrapped in one.
fn twilio_failure(status: u16, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
    if body.get("code").is_some() {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return resp;
    }
    let code = match status {
        429 => 20429,
        500..=599 => 20500,
        _ => 21000,
    };
    let message = body["message"].as_str().unwrap_or("injected failure");
    twilio_error(status, code, message, retry_after)
}

/// The password of `Basic` credentials whose user is `account_sid`.
fn basic_password(headers: &HeaderMap, account_sid: &str) -> Option<String> {
    use base64::Engine;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    (user == account_sid && !password.is_empty()).then(|| password.to_string())
}

fn rfc2822(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc2822)
        .unwrap_or_default()
}

/// A Message resource as Twilio shows it.
fn twilio_resource(m: &TwilioRecord) -> serde_json::Value {
    let date = rfc2822(m.created_at);
    let status = m.status;
    serde_json::json!({
        "account_sid": m.account_sid,
        "api_version": "2010-04-01",
        "body": m.body,
        "date_created": date,
        "date_sent": m.date_sent.map(rfc2822),
        "date_updated": rfc2822(m.date_sent.unwrap_or(m.created_at)),
        "direction": "outbound-api",
        "error_code": null,
        "error_message": null,
        "from": m.from,
        "messaging_service_sid": m.messaging_service_sid,
        "num_media": "0",
        "num_segments": "1",
        "price": null,
        "price_unit": "USD",
        "sid": m.sid,
        "status": status,
        "subresource_uris": {
            "media": format!("/2010-04-01/Accounts/{}/Messages/{}/Media.json", m.account_sid, m.sid),
        },
        "to": m.to,
        "uri": format!("/2010-04-01/Accounts/{}/Messages/{}.json", m.account_sid, m.sid),
    })
}

async fn twilio_send(
    State(mock): State<MockProvider>,
    axum::extract::Path(account_sid): axum::extract::Path<String>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let busy = Busy::new(&mock);
    let (behaviour, latency) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "twilio".into(),
            idempotency_key: None,
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: serde_json::to_value(&form).unwrap_or(serde_json::Value::Null),
        });
        let behaviour = match inner.script.pop_front() {
            Some(b) => b,
            None => inner.faults.draw(),
        };
        (behaviour, inner.faults.latency())
    };
    let Some(token) = basic_password(&headers, &account_sid) else {
        return twilio_error(401, 20003, "Authenticate", None);
    };
    if form.get("To").is_none_or(String::is_empty) {
        return twilio_error(400, 21604, "A 'To' phone number is required.", None);
    }
    if form.get("Body").is_none_or(String::is_empty) {
        return twilio_error(400, 21602, "Message body is required.", None);
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, account_sid, form) = (mock.clone(), account_sid.clone(), form.clone());
        move || {
            let record = mock.twilio_create(&account_sid, &form);
            let receipts = mock.lock().receipts.clone();
            if let Some(callback) = form.get("StatusCallback").cloned()
                && receipts.order != ReceiptOrder::None
            {
                tokio::spawn(send_twilio_receipts(
                    receipts,
                    callback,
                    token.clone(),
                    record.clone(),
                ));
            }
            record
        }
    };
    let created = |record: &TwilioRecord| {
        mock.twilio_dated(
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                twilio_resource(record).to_string(),
            )
                .into_response(),
        )
    };
    match behaviour {
        // (`After` was unwrapped above.)
        Behaviour::Accept | Behaviour::After(..) => created(&create()),
        Behaviour::Fail {
            status,
            body,
            retry_after,
        } => twilio_failure(status, &body, retry_after),
        Behaviour::AcceptThenFail { status } => {
            create();
            twilio_error(status, 20500, "Internal Server Error", None)
        }
        Behaviour::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            twilio_error(status, 20500, "Internal Server Error", Some(retry_after))
        }
        Behaviour::RejectQuoting { status } => {
            let text = form.get("Body").cloned().unwrap_or_default();
            twilio_error(status, 21617, &format!("invalid message '{text}'"), None)
        }
        Behaviour::Gate(gate) => {
            gate.notified().await;
            created(&create())
        }
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Delay(d) => {
            tokio::time::sleep(d).await;
            created(&create())
        }
        Behaviour::AcceptThenDelay(d) => {
            let record = create();
            tokio::time::sleep(d).await;
            created(&record)
        }
        Behaviour::Processing(d) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let _ = tx.send(create());
                drop(busy);
            });
            match rx.await {
                Ok(record) => created(&record),
                Err(_) => twilio_error(500, 20500, "Internal Server Error", None),
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

/// `DateSent>`'s value: an RFC 3339 time or a `YYYY-MM-DD` date (GMT).
fn parse_date_filter(value: &str) -> Option<time::OffsetDateTime> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(value, &Rfc3339) {
        return Some(t);
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(value, &format)
        .ok()
        .map(|d| d.midnight().assume_utc())
}

async fn twilio_list(
    State(mock): State<MockProvider>,
    axum::extract::Path(account_sid): axum::extract::Path<String>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let query: HashMap<String, String> =
        form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    {
        let mut inner = mock.lock();
        inner.lookups += 1;
        if inner.failing_lookups > 0 {
            inner.failing_lookups -= 1;
            return twilio_error(500, 20500, "injected lookup failure", None);
        }
    }
    if basic_password(&headers, &account_sid).is_none() {
        return twilio_error(401, 20003, "Authenticate", None);
    }
    let after = match query.get("DateSent>") {
        None => None,
        Some(v) => match parse_date_filter(v) {
            Some(t) => Some(t),
            None => return twilio_error(400, 20001, "Invalid DateSent", None),
        },
    };
    let page_size = query
        .get("PageSize")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(50)
        .clamp(1, 1000);
    let page = query
        .get("Page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut matching: Vec<TwilioRecord> = mock
        .lock()
        .twilio_messages
        .iter()
        .rev()
        .filter(|m| m.account_sid == account_sid)
        .filter(|m| query.get("To").is_none_or(|to| &m.to == to))
        // Twilio's date filters match `date_sent`: never a message not sent yet.
        .filter(|m| after.is_none_or(|a| m.date_sent.is_some_and(|d| d >= a)))
        .cloned()
        .collect();
    // Newest first by creation.
    matching.sort_by_key(|m| std::cmp::Reverse(m.created_at));
    let messages: Vec<serde_json::Value> = matching
        .iter()
        .skip(page * page_size)
        .take(page_size)
        .map(twilio_resource)
        .collect();
    let path = format!("/2010-04-01/Accounts/{account_sid}/Messages.json");
    let page_uri = |n: usize| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(to) = query.get("To") {
            q.append_pair("To", to);
        }
        if let Some(after) = query.get("DateSent>") {
            q.append_pair("DateSent>", after);
        }
        q.append_pair("PageSize", &page_size.to_string());
        q.append_pair("Page", &n.to_string());
        format!("{path}?{}", q.finish())
    };
    let more = matching.len() > (page + 1) * page_size;
    let body = serde_json::json!({
        "messages": messages,
        "first_page_uri": page_uri(0),
        "next_page_uri": more.then(|| page_uri(page + 1)),
        "previous_page_uri": (page > 0).then(|| page_uri(page - 1)),
        "page": page,
        "page_size": page_size,
        "uri": page_uri(page),
        "end": page * page_size + messages.len().saturating_sub(1),
        "start": page * page_size,
    });
    mock.twilio_dated(axum::Json(body).into_response())
}

fn receipt_client() -> Option<reqwest::Client> {
    sendonce::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()
}

/// Posts Twilio status callbacks for `m`, one after the other, signed.
async fn send_twilio_receipts(
    config: ReceiptConfig,
    callback: String,
    auth_token: String,
    m: TwilioRecord,
) {
    let Some(client) = receipt_client() else {
        return;
    };
    for (status, event) in config.plan() {
        let mut params = vec![
            ("AccountSid".to_string(), m.account_sid.clone()),
            ("ApiVersion".to_string(), "2010-04-01".to_string()),
            ("MessageSid".to_string(), m.sid.clone()),
            ("MessageStatus".to_string(), status.clone()),
            ("SmsSid".to_string(), m.sid.clone()),
            ("SmsStatus".to_string(), status.clone()),
            ("To".to_string(), m.to.clone()),
        ];
        if let Some(from) = &m.from {
            params.push(("From".to_string(), from.clone()));
        }
        if event == 1
            && let Some(code) = &config.error_code
        {
            params.push(("ErrorCode".to_string(), code.clone()));
        }
        let signature = sendonce::provider::twilio::signature(&auth_token, &callback, &params);
        let sent = client
            .post(&callback)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .header(
                "I-Twilio-Idempotency-Token",
                format!("mock-{}-{event}", m.sid),
            )
            .body(sendonce::provider::twilio::encode_form(&params))
            .send()
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "mock provider: a status callback failed");
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
