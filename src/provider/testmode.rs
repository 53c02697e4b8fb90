//! Test mode's provider (issue 27): every message of a test key (`so_test_`)
//! goes here, whatever providers are configured, and nothing leaves the
//! process. It is not an adapter of the registry (no variable names it and
//! no route can lead to it): the deliverer holds it beside the configured
//! providers and hands it only messages stored with its name, which only a
//! test key's send gets.
//!
//! A few numbers of the range North America keeps for fiction (555-0100
//! to 555-0199 in every area code: never a real phone, and valid numbers
//! to the numbering-plan check, unlike the Ofcom drama range +44 7700
//! 900xxx, which libphonenumber refuses) end a certain way, so an
//! integration can see each outcome end to end, receipts and webhook
//! events included ([`MAGIC_NUMBERS`], the table of docs/api.md "Test
//! mode"); any other number is delivered. What a number does is decided by
//! [`answer`], a pure function of the number's outcome and the attempt.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::receipts::{Receipt, ReceiptSink, delivery_status};
use super::{AttemptRef, OutgoingSms, Provider, ProviderRuntime, Reconciled, SendOutcome};

/// The provider name stored with a test-mode message (no adapter has it).
pub const NAME: &str = "test";

/// How a test-mode message ends, by its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, then a receipt says delivered (every number not in the table).
    Delivered,
    /// Refused by the provider: `failed`.
    Failed,
    /// Sent, then a receipt says not delivered: `undelivered`.
    Undelivered,
    /// No clear answer and nobody can tell afterwards: `unknown`.
    Unknown,
    /// Longer than the sync wait: the request gets 202, then it is sent
    /// (and delivered).
    Slow,
    /// The provider answers 429 once; retried, sent (and delivered).
    RateLimited,
}

impl Outcome {
    /// The outcome's word in the docs' table.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Failed => "failed",
            Outcome::Undelivered => "undelivered",
            Outcome::Unknown => "unknown",
            Outcome::Slow => "slow",
            Outcome::RateLimited => "rate-limited",
        }
    }
}

/// The magic numbers (E.164) and what each does in test mode, in the
/// order of the docs' table. Sent with a live key they are ordinary
/// numbers.
pub const MAGIC_NUMBERS: [(&str, Outcome); 6] = [
    ("+12025550100", Outcome::Delivered),
    ("+12025550101", Outcome::Failed),
    ("+12025550102", Outcome::Undelivered),
    ("+12025550103", Outcome::Unknown),
    ("+12025550104", Outcome::Slow),
    ("+12025550105", Outcome::RateLimited),
];

/// The mode of a message stored with provider `provider`, as a metric
/// label: `test` for test mode's, else `live`.
pub fn mode_of(provider: &str) -> &'static str {
    if provider == NAME { "test" } else { "live" }
}

/// What a test-mode message to `to` (E.164) comes to.
pub fn outcome_for(to: &str) -> Outcome {
    MAGIC_NUMBERS
        .iter()
        .find(|(number, _)| *number == to)
        .map_or(Outcome::Delivered, |(_, o)| *o)
}

/// How long the 429 of a rate-limited number asks to wait (`Retry-After`).
pub const RATE_LIMIT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How much longer than the sync wait a slow number takes.
pub const SLOW_MARGIN: Duration = Duration::from_secs(1);

/// The provider error code of a failed number.
pub const FAILED_CODE: &str = "test_failed";

/// The receipt's error code of an undelivered number.
pub const UNDELIVERED_CODE: &str = "test_undelivered";

/// What the simulated provider answers one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Accepted; a receipt with this status word follows.
    Accept { receipt: &'static str },
    /// Refused (this message will never be sent).
    Reject,
    /// No answer it could be told from (it may have sent).
    NoAnswer,
    /// Not now: try again after `after`; `http_status` 429 for a rate limit.
    TryLater {
        http_status: Option<u16>,
        after: Duration,
    },
}

/// What attempt `attempt` (1 for the first) of a message whose number
/// means `outcome` is answered, with the sync wait `sync_wait` in force.
pub fn answer(outcome: Outcome, attempt: u32, sync_wait: Duration) -> Answer {
    match (outcome, attempt) {
        (Outcome::Failed, _) => Answer::Reject,
        (Outcome::Unknown, _) => Answer::NoAnswer,
        (Outcome::Undelivered, _) => Answer::Accept {
            receipt: "undelivered",
        },
        (Outcome::Slow, 0 | 1) => Answer::TryLater {
            http_status: None,
            after: sync_wait + SLOW_MARGIN,
        },
        (Outcome::RateLimited, 0 | 1) => Answer::TryLater {
            http_status: Some(429),
            after: RATE_LIMIT_RETRY_AFTER,
        },
        (Outcome::Delivered | Outcome::Slow | Outcome::RateLimited, _) => Answer::Accept {
            receipt: "delivered",
        },
    }
}

/// The test-mode provider of one instance.
#[derive(Default)]
pub struct TestProvider {
    /// The instance's default sync wait (`SENDONCE_SYNC_WAIT`), set when
    /// it is built; a slow number takes longer than it.
    sync_wait: OnceLock<Duration>,
    /// Where its receipts go, once the service started it.
    receipts: OnceLock<Arc<dyn ReceiptSink>>,
}

impl TestProvider {
    /// Sets the sync wait a slow number outlasts (once; later calls are
    /// ignored).
    pub fn set_sync_wait(&self, wait: Duration) {
        let _ = self.sync_wait.set(wait);
    }

    fn sync_wait(&self) -> Duration {
        self.sync_wait
            .get()
            .copied()
            .unwrap_or(Duration::from_secs(10))
    }

    /// Hands the receipt of `provider_message_id` with `word` to the
    /// service's receipt handling, as a provider's callback would, on a
    /// task of its own (it may overtake the write of the id: the service
    /// links such a receipt once the id is written).
    fn receipt(&self, provider_message_id: String, word: &'static str) {
        let Some(sink) = self.receipts.get() else {
            tracing::warn!("test mode: no receipt handling started; the receipt is dropped");
            return;
        };
        let sink = Arc::clone(sink);
        let receipt = Receipt {
            provider_message_id,
            status: word.to_string(),
            error_code: (word == "undelivered").then(|| UNDELIVERED_CODE.to_string()),
            message_id: None,
        };
        tokio::spawn(async move {
            if let Err(e) = sink.take(NAME, receipt, delivery_status(word)).await {
                tracing::warn!(error = %e, "test mode: the simulated receipt could not be stored");
            }
        });
    }
}

#[async_trait]
impl Provider for TestProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn dedupes_by_key(&self) -> bool {
        // As a real provider that cannot be asked: an unclear answer ends
        // `unknown`, never resent.
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let outcome = sms
            .to
            .phone()
            .map_or(Outcome::Delivered, |p| outcome_for(p.as_str()));
        tracing::info!(
            message_id = %sms.message_id,
            outcome = outcome.as_str(),
            attempt = sms.attempt,
            "test mode: simulated send"
        );
        match answer(outcome, sms.attempt, self.sync_wait()) {
            Answer::Accept { receipt } => {
                let id = format!("test_{}", Uuid::new_v4().as_simple());
                self.receipt(id.clone(), receipt);
                SendOutcome::Accepted {
                    provider_message_id: id,
                    http_status: None,
                }
            }
            Answer::Reject => SendOutcome::Rejected {
                http_status: Some(400),
                provider_code: Some(FAILED_CODE.into()),
                message: "test mode: this number always fails".into(),
            },
            Answer::NoAnswer => SendOutcome::Ambiguous {
                http_status: None,
                retry_after: None,
                message: "test mode: the simulated provider gave no clear answer".into(),
            },
            Answer::TryLater { http_status, after } => SendOutcome::Retryable {
                http_status,
                provider_code: None,
                retry_after: Some(after),
                message: if http_status == Some(429) {
                    "test mode: 429 Too Many Requests (once)".into()
                } else {
                    "test mode: slower than the sync wait (sent on the next attempt)".into()
                },
            },
        }
    }

    fn start(&self, runtime: ProviderRuntime) -> Option<tokio::task::JoinHandle<()>> {
        let _ = self.receipts.set(runtime.receipts);
        None
    }

    async fn reconcile(&self, _sms: &OutgoingSms, _attempt: &AttemptRef) -> Reconciled {
        Reconciled::Unknown("test mode: the simulated provider never tells what it did".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_magic_number_is_a_valid_number_nobody_has() {
        for (number, _) in MAGIC_NUMBERS {
            let parsed = crate::domain::phone::parse(number).expect(number);
            assert_eq!(parsed.e164, number);
            assert_eq!(parsed.country.as_deref(), Some("US"), "{number}");
            // NANP's fictional range: 555-0100 to 555-0199.
            assert!(number.starts_with("+120255501") && number.len() == 12);
        }
        // Why not the Ofcom drama range: the numbering-plan check refuses it.
        assert!(crate::domain::phone::parse("+447700900001").is_none());
        let mut numbers: Vec<&str> = MAGIC_NUMBERS.iter().map(|(n, _)| *n).collect();
        numbers.dedup();
        assert_eq!(numbers.len(), MAGIC_NUMBERS.len());
    }

    #[test]
    fn numbers_and_their_outcomes() {
        #[rustfmt::skip]
        let table = [
            ("+12025550100", "delivered"),
            ("+12025550101", "failed"),
            ("+12025550102", "undelivered"),
            ("+12025550103", "unknown"),
            ("+12025550104", "slow"),
            ("+12025550105", "rate-limited"),
            // Any other number, in the range or not: delivered.
            ("+12025550106", "delivered"),
            ("+12025550199", "delivered"),
            ("+14155550101", "delivered"),
            ("+447700900001", "delivered"),
        ];
        for (number, word) in table {
            assert_eq!(outcome_for(number).as_str(), word, "{number}");
        }
    }

    #[test]
    fn answers_by_outcome_and_attempt() {
        let wait = Duration::from_secs(10);
        let later = |http_status, after| Answer::TryLater { http_status, after };
        let delivered = Answer::Accept {
            receipt: "delivered",
        };
        #[rustfmt::skip]
        let table = [
            (Outcome::Delivered, 1, delivered.clone()),
            (Outcome::Delivered, 2, delivered.clone()),
            (Outcome::Failed, 1, Answer::Reject),
            (Outcome::Failed, 3, Answer::Reject),
            (Outcome::Undelivered, 1, Answer::Accept { receipt: "undelivered" }),
            (Outcome::Unknown, 1, Answer::NoAnswer),
            (Outcome::Unknown, 2, Answer::NoAnswer),
            (Outcome::Slow, 1, later(None, Duration::from_secs(11))),
            (Outcome::Slow, 2, delivered.clone()),
            (Outcome::RateLimited, 1, later(Some(429), RATE_LIMIT_RETRY_AFTER)),
            (Outcome::RateLimited, 2, delivered.clone()),
            (Outcome::RateLimited, 5, delivered.clone()),
        ];
        for (outcome, attempt, want) in table {
            assert_eq!(
                answer(outcome, attempt, wait),
                want,
                "{outcome:?} {attempt}"
            );
        }
        // A slow number outlasts whatever sync wait is in force.
        assert_eq!(
            answer(Outcome::Slow, 1, Duration::from_millis(300)),
            later(None, Duration::from_millis(1300))
        );
    }

    #[test]
    fn receipt_words_mean_what_the_table_says() {
        assert_eq!(
            delivery_status("delivered"),
            Some(crate::domain::Status::Delivered)
        );
        assert_eq!(
            delivery_status("undelivered"),
            Some(crate::domain::Status::Undelivered)
        );
    }
}
