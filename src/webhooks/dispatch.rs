//! The delivery loop: claims due deliveries, POSTs each signed event, and
//! records the attempt (fenced on the lease). Runs on every instance.
//!
//! Fair between tenants and endpoints: the loop never waits for a claimed
//! batch; it claims as many as it has free slots (`concurrency`), each
//! delivery frees its slot when recorded and the loop claims again at once.
//! The claim itself keeps to the in-flight caps (`per_endpoint`,
//! `per_tenant`, counted in the database as live leases over every
//! instance), so endpoints that never answer hold their own slots, never
//! another tenant's: another tenant's webhook waits at most a poll.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::schedule::{self, Answer, Next};
use super::signing::signature_header;
use super::ssrf::{FilteringResolver, check_form};
use crate::clock::{Clock, to_time};
use crate::config::WebhookSettings;
use crate::store::{
    ClaimedDelivery, DeliveryAttempt, DeliveryNext, InFlightCaps, Store, StoreError,
};

/// Most characters of a receiver's answer kept with an attempt.
pub const EXCERPT_CHARS: usize = 256;

/// How long an idle instance trusts "there are no endpoints" before asking
/// the database again.
pub const IDLE_RECHECK: Duration = Duration::from_secs(30);

pub struct Dispatcher {
    store: Arc<dyn Store>,
    clock: Clock,
    client: reqwest::Client,
    settings: WebhookSettings,
    owner: String,
    /// When the database last said whether any endpoint exists, and what.
    endpoints: std::sync::Mutex<Option<(std::time::Instant, bool)>>,
    /// This instance's delivery slots (`concurrency`).
    slots: Arc<Semaphore>,
    /// A delivery was recorded: a slot is free.
    finished: Notify,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Clock,
        settings: WebhookSettings,
        owner: String,
    ) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.timeout)
            // A redirect could lead anywhere, the inside included.
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve names where the filter cannot see.
            .no_proxy()
            .user_agent("sendonce-webhooks/1");
        if !settings.allow_private {
            builder = builder.dns_resolver(Arc::new(FilteringResolver));
        }
        let slots = Arc::new(Semaphore::new(slot_count(&settings)));
        Ok(Self {
            client: builder.build()?,
            slots,
            store,
            clock,
            settings,
            owner,
            endpoints: std::sync::Mutex::new(None),
            finished: Notify::new(),
        })
    }

    /// An endpoint was just created here: deliver from the next poll on.
    pub fn endpoint_created(&self) {
        if let Ok(mut seen) = self.endpoints.lock() {
            *seen = Some((std::time::Instant::now(), true));
        }
    }

    /// Whether there may be something to deliver: while no endpoint exists
    /// the loop asks the database every [`IDLE_RECHECK`] instead of claiming
    /// every poll (an endpoint created on another instance is noticed then;
    /// its events wait, pending, meanwhile).
    async fn worth_claiming(&self) -> bool {
        let cached = self.endpoints.lock().ok().and_then(|seen| *seen);
        if let Some((at, any)) = cached
            && (any || at.elapsed() < IDLE_RECHECK)
        {
            return any;
        }
        match self.store.any_webhook_endpoints().await {
            Ok(any) => {
                if let Ok(mut seen) = self.endpoints.lock() {
                    // "Some" is remembered for good: deleting the last
                    // endpoint leaves a poll that finds nothing.
                    *seen = Some((std::time::Instant::now(), any));
                }
                any
            }
            Err(e) => {
                tracing::warn!(error = %e, "looking for webhook endpoints failed");
                false
            }
        }
    }

    /// Claims up to the free slots' worth of due deliveries (within the
    /// in-flight caps) and starts each in a task of `tasks` holding its
    /// slot. Returns how many were claimed.
    async fn start(
        self: &Arc<Self>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Result<usize, StoreError> {
        let free = self.slots.available_permits();
        if free == 0 {
            return Ok(0);
        }
        let claimed = self
            .store
            .claim_webhook_deliveries(
                &self.owner,
                self.clock.now(),
                self.settings.lease,
                u32::try_from(free).unwrap_or(u32::MAX),
                InFlightCaps {
                    per_endpoint: self.settings.per_endpoint.max(1),
                    per_tenant: self.settings.per_tenant.max(1),
                },
            )
            .await?;
        let n = claimed.len();
        for d in claimed {
            // Only this instance takes slots, so one is free for each
            // claimed delivery (a concurrent `tick` may take one first:
            // the delivery then goes ahead without).
            let slot = Arc::clone(&self.slots).try_acquire_owned().ok();
            let me = Arc::clone(self);
            tasks.spawn(async move {
                if let Err(e) = me.deliver(d).await {
                    tracing::warn!(error = %e, "recording a webhook attempt failed");
                }
                drop(slot);
                me.finished.notify_one();
            });
        }
        Ok(n)
    }

    /// Claims what is due now and delivers it, waiting for these attempts
    /// to be recorded (the loop in [`run`](Self::run) does not wait).
    /// Returns how many deliveries were claimed.
    pub async fn tick(self: &Arc<Self>) -> Result<usize, StoreError> {
        let mut tasks = tokio::task::JoinSet::new();
        let n = self.start(&mut tasks).await?;
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                tracing::warn!(error = %e, "a webhook delivery task failed");
            }
        }
        Ok(n)
    }

    /// Delivers until `stop`, then waits (at most an attempt's timeout) for
    /// the deliveries in flight to be recorded.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            // Reap what finished (its errors were logged by the task).
            while let Some(done) = tasks.try_join_next() {
                if let Err(e) = done {
                    tracing::warn!(error = %e, "a webhook delivery task failed");
                }
            }
            let mut pause = self.settings.poll_interval;
            if self.slots.available_permits() > 0 && self.worth_claiming().await {
                match self.start(&mut tasks).await {
                    // Claimed some: there may be more due; a free slot
                    // (or the poll) brings the next claim.
                    Ok(n) if n > 0 => pause = Duration::from_millis(1),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "claiming webhook deliveries failed"),
                }
            }
            if stop.is_cancelled() {
                break;
            }
            if self.slots.available_permits() == 0 {
                pause = self.settings.poll_interval;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
                () = self.finished.notified() => {}
            }
        }
        let grace = self.settings.timeout + Duration::from_secs(1);
        if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!(
                "webhook deliveries still in flight at shutdown were left to their leases"
            );
        }
    }

    /// One attempt of one delivery, recorded. False when the lease was lost.
    async fn deliver(&self, d: ClaimedDelivery) -> Result<bool, StoreError> {
        let started_at = self.clock.now();
        let (answer, http_status, error, excerpt) = self.post(&d, started_at).await;
        let number = d.attempts + 1;
        let draw: f64 = rand::rng().random();
        let finished_at = self.clock.now();
        let next = match schedule::next(answer, number, draw) {
            Next::Succeeded => DeliveryNext::Succeeded,
            Next::Retry(after) => DeliveryNext::RetryAt(finished_at + to_time(after)),
            Next::GiveUp => DeliveryNext::GaveUp,
            Next::Disable => {
                DeliveryNext::Disable("the endpoint answered 410 Gone: it was disabled".to_string())
            }
        };
        let attempt = DeliveryAttempt {
            delivery_id: d.id,
            lease_token: d.lease_token,
            endpoint_id: d.endpoint.id,
            event_id: d.event.id,
            event_type: d.event.event_type.clone(),
            started_at,
            finished_at,
            http_status,
            error,
            response_excerpt: excerpt,
            next,
        };
        let written = self.store.finish_webhook_attempt(&attempt).await?;
        if !written {
            tracing::info!(delivery = d.id, "a webhook delivery's lease was lost");
        }
        Ok(written)
    }

    /// The POST itself: what the receiver answered, its status, an error,
    /// and an excerpt of its body.
    async fn post(
        &self,
        d: &ClaimedDelivery,
        now: time::OffsetDateTime,
    ) -> (Answer, Option<u16>, Option<String>, Option<String>) {
        // Checked again at every attempt: an IP literal never meets the
        // resolver.
        let url = match check_form(&d.endpoint.url, self.settings.allow_private) {
            Ok(url) => url,
            Err(refused) => {
                return (
                    Answer::NoAnswer,
                    None,
                    Some(format!("the URL was refused: it {refused}")),
                    None,
                );
            }
        };
        let id = d.event.public_id();
        let timestamp = now.unix_timestamp();
        let body = d.event.body();
        let signature = signature_header(d.endpoint.signing_secrets(now), &id, timestamp, &body);
        let sent = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        match sent {
            Err(e) => (Answer::NoAnswer, None, Some(describe(&e)), None),
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                let excerpt = excerpt(&mut resp).await;
                (Answer::Status(status), Some(status), None, excerpt)
            }
        }
    }
}

/// This instance's delivery slots.
fn slot_count(settings: &WebhookSettings) -> usize {
    usize::try_from(settings.concurrency.max(1))
        .unwrap_or(1)
        .min(Semaphore::MAX_PERMITS)
}

/// Reads at most a short excerpt of an answer's body (the rest is dropped
/// unread), within the attempt's timeout.
async fn excerpt(resp: &mut reqwest::Response) -> Option<String> {
    let mut bytes = Vec::new();
    while bytes.len() < EXCERPT_CHARS * 4 {
        match resp.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .take(EXCERPT_CHARS)
        .collect();
    (!text.is_empty()).then_some(text)
}

/// A delivery error in a few words, with its cause.
fn describe(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut text = format!("the request {what}");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.chars().take(500).collect()
}
