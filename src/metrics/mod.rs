//! This instance's metrics, rendered in the Prometheus text format. A leaf:
//! it knows no HTTP, delivery or provider types; callers hand it plain
//! labels (the request middleware and `GET /metrics` live in
//! `http::metrics`).
//!
//! Each instance owns its own [`PrometheusRecorder`]: no global recorder is
//! installed, so several instances in one process (the tests) keep separate
//! counts. Handles are registered on that recorder directly instead of
//! through the `metrics` macros, which only reach a global one. Incrementing
//! a registered handle is an atomic add. Labelled handles are registered
//! once, on first use, and kept in small maps keyed by their labels; gauges
//! that describe the database (the oldest `processing` message) are read
//! when `/metrics` is scraped.
//!
//! The metrics and their labels are tabled in `docs/architecture.md`
//! (Observability); a test checks that table against what is rendered.
//!
//! Nothing here is labelled with a tenant, a key, a number or a body.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio_util::sync::CancellationToken;

const REQUESTS: &str = "sendonce_http_requests_total";
const REQUEST_SECONDS: &str = "sendonce_http_request_duration_seconds";
const PROVIDER_ATTEMPTS: &str = "sendonce_provider_attempts_total";
const PROVIDER_SECONDS: &str = "sendonce_provider_duration_seconds";
const RETRIES: &str = "sendonce_retries_scheduled_total";
const FINAL: &str = "sendonce_messages_final_total";
const IN_FLIGHT: &str = "sendonce_deliveries_in_flight";
const OLDEST: &str = "sendonce_oldest_processing_age_seconds";
const TAKEOVERS: &str = "sendonce_rescuer_takeovers_total";
const RECEIPTS: &str = "sendonce_receipts_total";
const PURGED: &str = "sendonce_purged_messages_total";
const INTERRUPTED: &str = "sendonce_deliveries_interrupted_total";
const FAILOVERS: &str = "sendonce_provider_failovers_total";
const CIRCUIT: &str = "sendonce_provider_circuit_state";
const BATCH_SIZE: &str = "sendonce_store_batch_size";
const VERIFY: &str = "sendonce_verify_events_total";
const DB_CONNECTS: &str = "sendonce_db_connections_opened_total";
const DB_SWITCHES: &str = "sendonce_db_host_switches_total";
const SPEND: &str = "sendonce_spend_cap_events_total";
const ROUTE_QUALITY: &str = "sendonce_route_quality";
const ROUTE_POSITION: &str = "sendonce_route_provider_position";
const ROUTE_CHANGES: &str = "sendonce_route_order_changes_total";

/// The reasons of [`Metrics::delivery_interrupted`], in its counters' order.
const INTERRUPTIONS: [&str; 3] = ["lease_lost", "store_down", "stopped"];

/// Latency buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static META: Metadata<'static> = Metadata::new("sendonce", Level::INFO, Some(module_path!()));

/// One instance's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    retries: Counter,
    /// By reason: `lease_lost`, `store_down`, `stopped`.
    interrupted: [Counter; 3],
    takeovers: Counter,
    purged: Counter,
    db_connects: Counter,
    db_switches: Counter,
    in_flight: Gauge,
    oldest_processing: Gauge,
    /// Labelled handles, registered on first use and reused after: a
    /// request costs a map lookup under a read lock, not a registration.
    requests: Handles<(&'static str, &'static str), Counter>,
    request_seconds: Handles<&'static str, Histogram>,
    provider_attempts: Handles<&'static str, Counter>,
    provider_seconds: Handles<&'static str, Histogram>,
    finals: Handles<&'static str, Counter>,
    receipts: Handles<&'static str, Counter>,
    failovers: Handles<(), Counter>,
    circuits: Handles<(), Gauge>,
    verify: Handles<&'static str, Counter>,
    spend: Handles<&'static str, Counter>,
    /// By measure, then `route provider`.
    route_quality: Handles<&'static str, Gauge>,
    route_position: Handles<(), Gauge>,
    route_changes: Handles<(), Counter>,
    /// The store's coalesced writes, when the store batches (Postgres).
    batch_sizes: OnceLock<Arc<BatchSizes>>,
}

/// Which coalesced write a batch was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKind {
    /// Claiming inserts (`insert_message`).
    Claim = 0,
    /// Fenced final writes (`finish`).
    Finish = 1,
    /// Looks for receipts that overtook a final write (a read).
    Look = 2,
    /// SQLite: the writer's jobs per group commit (one transaction).
    Group = 3,
}

/// Upper bounds of the batch size buckets (rows per statement).
const BATCH_BUCKETS: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Rows per coalesced write, by kind: a histogram kept with atomic adds by
/// the store (which is built before the metrics, so it owns these counts)
/// and rendered with the rest of `/metrics` once attached with
/// [`Metrics::attach_batch_sizes`]. The count of a kind is the number of
/// statements (and commits) that kind took.
#[derive(Debug, Default)]
pub struct BatchSizes {
    kinds: [BatchHistogram; 4],
}

#[derive(Debug, Default)]
struct BatchHistogram {
    /// Per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BATCH_BUCKETS.len() + 1],
    count: AtomicU64,
    sum: AtomicU64,
}

impl BatchSizes {
    /// One statement that carried `rows` rows.
    pub fn record(&self, kind: BatchKind, rows: usize) {
        let h = &self.kinds[kind as usize];
        let rows = rows as u64;
        let i = BATCH_BUCKETS
            .iter()
            .position(|b| rows <= *b)
            .unwrap_or(BATCH_BUCKETS.len());
        h.buckets[i].fetch_add(1, Ordering::Relaxed);
        h.count.fetch_add(1, Ordering::Relaxed);
        h.sum.fetch_add(rows, Ordering::Relaxed);
    }

    /// (statements, rows) of a kind so far.
    pub fn totals(&self, kind: BatchKind) -> (u64, u64) {
        let h = &self.kinds[kind as usize];
        (
            h.count.load(Ordering::Relaxed),
            h.sum.load(Ordering::Relaxed),
        )
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP {BATCH_SIZE} Rows per coalesced store statement, by kind (claim, finish, receipt_look; Postgres), and jobs per group commit (group; SQLite)"
        );
        let _ = writeln!(out, "# TYPE {BATCH_SIZE} histogram");
        for (kind, h) in ["claim", "finish", "receipt_look", "group"]
            .iter()
            .zip(&self.kinds)
        {
            let mut cumulative = 0;
            for (i, n) in h.buckets.iter().enumerate() {
                cumulative += n.load(Ordering::Relaxed);
                let le = BATCH_BUCKETS
                    .get(i)
                    .map_or_else(|| "+Inf".to_string(), u64::to_string);
                let _ = writeln!(
                    out,
                    "{BATCH_SIZE}_bucket{{kind=\"{kind}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let sum = h.sum.load(Ordering::Relaxed);
            let count = h.count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{BATCH_SIZE}_sum{{kind=\"{kind}\"}} {sum}");
            let _ = writeln!(out, "{BATCH_SIZE}_count{{kind=\"{kind}\"}} {count}");
        }
    }
}

/// Handles by a fixed part `K` and one free-text label value (a route, a
/// provider, a status). The label values come from a bounded set (the
/// router's templates, the providers), so the map stays small.
struct Handles<K, H>(RwLock<HashMap<K, HashMap<Box<str>, H>>>);

impl<K: Hash + Eq + Copy, H: Clone> Handles<K, H> {
    fn new() -> Self {
        Self(RwLock::new(HashMap::new()))
    }

    fn get(&self, fixed: K, label: &str, register: impl FnOnce() -> H) -> H {
        let known = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fixed)
            .and_then(|m| m.get(label))
            .cloned();
        if let Some(h) = known {
            return h;
        }
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(fixed)
            .or_default()
            .entry(label.into())
            .or_insert_with(register)
            .clone()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
            .expect("latency buckets are not empty")
            .build_recorder();
        let text = |s: &'static str| SharedString::const_str(s);
        for (name, what) in [
            (REQUESTS, "HTTP requests answered, by route and outcome"),
            (
                PROVIDER_ATTEMPTS,
                "Provider calls, by provider and outcome class",
            ),
            (RETRIES, "Provider attempts that ended in a scheduled retry"),
            (
                FINAL,
                "Messages made final by this instance, by status and mode (live, test)",
            ),
            (
                TAKEOVERS,
                "Messages claimed after their owner's lease expired",
            ),
            (PURGED, "Messages deleted past retention"),
            (
                DB_CONNECTS,
                "Database connections the pool opened (every reconnect included)",
            ),
            (
                DB_SWITCHES,
                "Times the pool followed a failover to another Postgres host",
            ),
            (
                INTERRUPTED,
                "Delivery runs that ended neither final nor rescheduled, by reason (lease_lost, store_down, stopped)",
            ),
            (
                RECEIPTS,
                "Delivery receipts, by provider and outcome (applied, recorded, duplicate, unmatched)",
            ),
            (
                FAILOVERS,
                "Messages moved on to the next provider, by the provider left and the one taken",
            ),
            (
                VERIFY,
                "Verification events (start, send, check, approval, expiry, max_attempts, pause), by destination country",
            ),
            (
                SPEND,
                "Spend cap events: `warning` (a send crossed 80 % of a cap) and `refused` (a send the cap refused), by cap (daily, monthly, international_daily_messages)",
            ),
        ] {
            recorder.describe_counter(KeyName::from_const_str(name), None, text(what));
        }
        for (name, what) in [
            (REQUEST_SECONDS, "HTTP request latency"),
            (PROVIDER_SECONDS, "Provider call latency"),
        ] {
            recorder.describe_histogram(
                KeyName::from_const_str(name),
                Some(Unit::Seconds),
                text(what),
            );
        }
        recorder.describe_gauge(
            KeyName::from_const_str(IN_FLIGHT),
            None,
            text("Deliveries running in this instance"),
        );
        recorder.describe_gauge(
            KeyName::from_const_str(OLDEST),
            Some(Unit::Seconds),
            text("Age of the oldest message still processing (0 when none)"),
        );
        recorder.describe_gauge(
            KeyName::from_const_str(CIRCUIT),
            None,
            text("Each provider's circuit breaker: 0 closed, 1 half-open, 2 open"),
        );
        recorder.describe_gauge(
            KeyName::from_const_str(ROUTE_QUALITY),
            None,
            text("A route's provider as last measured over the quality window, by measure"),
        );
        recorder.describe_gauge(
            KeyName::from_const_str(ROUTE_POSITION),
            None,
            text("A provider's place in its route's current order (1: where new messages start)"),
        );
        recorder.describe_counter(
            KeyName::from_const_str(ROUTE_CHANGES),
            None,
            text("Route orders this instance changed by measured quality"),
        );
        let counter = |name: &'static str| recorder.register_counter(&Key::from_name(name), &META);
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_name(name), &META);
        let metrics = Metrics {
            retries: counter(RETRIES),
            interrupted: INTERRUPTIONS.map(|reason| {
                recorder.register_counter(
                    &Key::from_parts(
                        INTERRUPTED,
                        vec![Label::from_static_parts("reason", reason)],
                    ),
                    &META,
                )
            }),
            takeovers: counter(TAKEOVERS),
            purged: counter(PURGED),
            db_connects: counter(DB_CONNECTS),
            db_switches: counter(DB_SWITCHES),
            in_flight: gauge(IN_FLIGHT),
            oldest_processing: gauge(OLDEST),
            handle: recorder.handle(),
            recorder,
            requests: Handles::new(),
            request_seconds: Handles::new(),
            provider_attempts: Handles::new(),
            provider_seconds: Handles::new(),
            finals: Handles::new(),
            receipts: Handles::new(),
            failovers: Handles::new(),
            circuits: Handles::new(),
            batch_sizes: OnceLock::new(),
            verify: Handles::new(),
            spend: Handles::new(),
            route_quality: Handles::new(),
            route_position: Handles::new(),
            route_changes: Handles::new(),
        };
        // The series a dashboard looks for first exist from the start, at 0.
        for outcome in ["created", "replayed"] {
            metrics
                .request_counter("POST", "/messages", outcome)
                .absolute(0);
        }
        metrics
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &META)
    }

    fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.recorder
            .register_histogram(&Key::from_parts(name, labels), &META)
    }

    fn request_counter(&self, method: &'static str, route: &str, outcome: &'static str) -> Counter {
        self.requests.get((method, outcome), route, || {
            self.counter(
                REQUESTS,
                vec![
                    Label::from_static_parts("method", method),
                    Label::new("route", route.to_owned()),
                    Label::from_static_parts("outcome", outcome),
                ],
            )
        })
    }

    /// A request answered with `outcome` after `elapsed`. `route` is the
    /// route's template (never a concrete path: labels must stay bounded).
    pub fn request(
        &self,
        method: &'static str,
        route: &str,
        outcome: &'static str,
        elapsed: Duration,
    ) {
        self.request_counter(method, route, outcome).increment(1);
        self.request_seconds
            .get(method, route, || {
                self.histogram(
                    REQUEST_SECONDS,
                    vec![
                        Label::from_static_parts("method", method),
                        Label::new("route", route.to_owned()),
                    ],
                )
            })
            .record(elapsed.as_secs_f64());
    }

    /// One provider call; `class` is `ok`, `permanent`, `refused`,
    /// `retryable` or `ambiguous`.
    pub fn provider_attempt(&self, provider: &'static str, class: &'static str, elapsed: Duration) {
        let labels = || {
            vec![
                Label::from_static_parts("provider", provider),
                Label::from_static_parts("class", class),
            ]
        };
        self.provider_attempts
            .get(class, provider, || {
                self.counter(PROVIDER_ATTEMPTS, labels())
            })
            .increment(1);
        self.provider_seconds
            .get(class, provider, || {
                self.histogram(PROVIDER_SECONDS, labels())
            })
            .record(elapsed.as_secs_f64());
    }

    pub fn retry_scheduled(&self) {
        self.retries.increment(1);
    }

    /// A verification event (`start`, `send`, `check`, `approval`,
    /// `expiry`, `max_attempts`, `pause`) for a destination country (an ISO
    /// 3166-1 alpha-2 code, or `unknown`: a bounded set).
    pub fn verify_event(&self, event: &'static str, country: Option<&str>) {
        let country = match country {
            Some(c) if c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase()) => c,
            _ => "unknown",
        };
        self.verify
            .get(event, country, || {
                self.counter(
                    VERIFY,
                    vec![
                        Label::from_static_parts("event", event),
                        Label::new("country", country.to_owned()),
                    ],
                )
            })
            .increment(1);
    }

    /// A spend cap event (`warning`, `refused`) for `cap` (a bounded set:
    /// [`crate::spend::Cap::as_str`]).
    pub fn spend_event(&self, event: &'static str, cap: &'static str) {
        self.spend
            .get(event, cap, || {
                self.counter(
                    SPEND,
                    vec![
                        Label::from_static_parts("event", event),
                        Label::from_static_parts("cap", cap),
                    ],
                )
            })
            .increment(1);
    }

    /// A message this instance made final with `status`, in `mode`
    /// (`live`, or `test`: a test key's message).
    pub fn message_final(&self, status: &'static str, mode: &'static str) {
        self.finals
            .get(mode, status, || {
                self.counter(
                    FINAL,
                    vec![
                        Label::from_static_parts("status", status),
                        Label::from_static_parts("mode", mode),
                    ],
                )
            })
            .increment(1);
    }

    /// One delivery receipt taken: `outcome` is `applied` (it moved the
    /// status), `recorded` (kept in the history only), `duplicate` or
    /// `unmatched` (no known message). `provider` is the adapter's name
    /// (from the registry, so the label's values stay a bounded set).
    pub fn receipt(&self, provider: &'static str, outcome: &'static str) {
        self.receipts
            .get(outcome, provider, || {
                self.counter(
                    RECEIPTS,
                    vec![
                        Label::from_static_parts("provider", provider),
                        Label::from_static_parts("outcome", outcome),
                    ],
                )
            })
            .increment(1);
    }

    /// A delivery run that ended neither final nor rescheduled: `reason` is
    /// one of `lease_lost`, `store_down`, `stopped` (anything else is
    /// counted as `stopped`).
    pub fn delivery_interrupted(&self, reason: &'static str) {
        let i = INTERRUPTIONS.iter().position(|r| *r == reason).unwrap_or(2);
        self.interrupted[i].increment(1);
    }

    /// A message moved from provider `from` to provider `to`.
    pub fn failover(&self, from: &str, to: &str) {
        self.failovers
            .get((), &format!("{from}\n{to}"), || {
                self.counter(
                    FAILOVERS,
                    vec![
                        Label::new("from", from.to_owned()),
                        Label::new("to", to.to_owned()),
                    ],
                )
            })
            .increment(1);
    }

    /// A provider's circuit as this instance last read it (`value`: 0
    /// closed, 1 half-open, 2 open).
    pub fn circuit(&self, provider: &str, value: f64) {
        self.circuits
            .get((), provider, || {
                self.recorder.register_gauge(
                    &Key::from_parts(CIRCUIT, vec![Label::new("provider", provider.to_owned())]),
                    &META,
                )
            })
            .set(value);
    }

    /// A route's provider as last measured (issue 43): one gauge per
    /// measure (`delivery_rate`, `slow_share`, `conversion`,
    /// `delivery_seconds_p50`, `delivery_seconds_p90`, `messages`); a
    /// measure without samples is not set.
    pub fn route_quality(&self, route: &str, provider: &str, m: &crate::domain::quality::Measured) {
        let values = [
            ("messages", Some(f64::from(m.messages))),
            ("delivery_rate", m.delivery_rate()),
            ("slow_share", m.slow_share()),
            ("conversion", m.conversion()),
            (
                "delivery_seconds_p50",
                m.delivery_seconds(0.5).map(f64::from),
            ),
            (
                "delivery_seconds_p90",
                m.delivery_seconds(0.9).map(f64::from),
            ),
        ];
        let label = format!("{route}\u{0}{provider}");
        for (measure, value) in values {
            let Some(value) = value else { continue };
            self.route_quality
                .get(measure, &label, || {
                    self.recorder.register_gauge(
                        &Key::from_parts(
                            ROUTE_QUALITY,
                            vec![
                                Label::new("route", route.to_owned()),
                                Label::new("provider", provider.to_owned()),
                                Label::from_static_parts("measure", measure),
                            ],
                        ),
                        &META,
                    )
                })
                .set(value);
        }
    }

    /// A provider's place on a route's current order (1: first).
    pub fn route_position(&self, route: &str, provider: &str, position: usize) {
        let label = format!("{route}\u{0}{provider}");
        self.route_position
            .get((), &label, || {
                self.recorder.register_gauge(
                    &Key::from_parts(
                        ROUTE_POSITION,
                        vec![
                            Label::new("route", route.to_owned()),
                            Label::new("provider", provider.to_owned()),
                        ],
                    ),
                    &META,
                )
            })
            .set(position as f64);
    }

    /// A route's order changed by quality (this instance wrote it).
    pub fn route_order_change(&self, route: &str) {
        self.route_changes
            .get((), route, || {
                self.recorder.register_counter(
                    &Key::from_parts(ROUTE_CHANGES, vec![Label::new("route", route.to_owned())]),
                    &META,
                )
            })
            .increment(1);
    }

    /// A circuit change this instance wrote (logged; the gauge follows).
    pub fn circuit_change(&self, provider: &str, state: &str) {
        let value = match state {
            "closed" => 0.0,
            "half_open" => 1.0,
            _ => 2.0,
        };
        self.circuit(provider, value);
    }

    pub fn takeover(&self) {
        self.takeovers.increment(1);
    }

    pub fn purged(&self, n: u64) {
        self.purged.increment(n);
    }

    /// Renders the store's batch sizes from now on (once; later calls are
    /// ignored).
    pub fn attach_batch_sizes(&self, sizes: Arc<BatchSizes>) {
        let _ = self.batch_sizes.set(sizes);
    }

    /// The text exposition, with the gauges read at scrape time set first.
    /// Takes the connector's counts (kept by the store) before a render.
    pub fn set_db_connections(&self, opened: u64, host_switches: u64) {
        self.db_connects.absolute(opened);
        self.db_switches.absolute(host_switches);
    }

    pub fn render(&self, in_flight: usize, oldest_processing: Option<Duration>) -> String {
        self.in_flight.set(in_flight as f64);
        if let Some(age) = oldest_processing {
            self.oldest_processing.set(age.as_secs_f64());
        }
        let mut text = self.handle.render();
        if let Some(sizes) = self.batch_sizes.get() {
            sizes.render(&mut text);
        }
        text
    }

    /// Folds recorded histogram samples into their buckets every few seconds,
    /// so memory stays bounded when nobody scrapes.
    pub async fn run_upkeep(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(5)) => self.handle.run_upkeep(),
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
