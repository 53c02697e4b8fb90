//! The delivery loop: claims due deliveries, POSTs each signed event, and
//! records the attempt (fenced on the lease). Runs on every instance.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::schedule::{self, Answer, Next};
use super::signing::signature_header;
use super::ssrf::{FilteringResolver, check_form};
use crate::clock::{Clock, to_time};
use crate::config::WebhookSettings;
use crate::store::{ClaimedDelivery, DeliveryAttempt, DeliveryNext, Store, StoreError};

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
        Ok(Self {
            client: builder.build()?,
            store,
            clock,
            settings,
            owner,
            endpoints: std::sync::Mutex::new(None),
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

    /// Claims what is due now and delivers it, waiting for every attempt to
    /// be recorded. Returns how many deliveries were claimed.
    pub async fn tick(self: &Arc<Self>) -> Result<usize, StoreError> {
        let claimed = self
            .store
            .claim_webhook_deliveries(
                &self.owner,
                self.clock.now(),
                self.settings.lease,
                self.settings.concurrency.max(1),
            )
            .await?;
        let n = claimed.len();
        let mut tasks = tokio::task::JoinSet::new();
        for d in claimed {
            let me = Arc::clone(self);
            tasks.spawn(async move { me.deliver(d).await });
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "recording a webhook attempt failed"),
                Err(e) => tracing::warn!(error = %e, "a webhook delivery task failed"),
            }
        }
        Ok(n)
    }

    /// Delivers until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            if !self.worth_claiming().await {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(self.settings.poll_interval) => {}
                }
                continue;
            }
            let busy = match self.tick().await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming webhook deliveries failed");
                    false
                }
            };
            if stop.is_cancelled() {
                return;
            }
            // A full batch: look again at once.
            let pause = if busy {
                Duration::from_millis(1)
            } else {
                self.settings.poll_interval
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
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
