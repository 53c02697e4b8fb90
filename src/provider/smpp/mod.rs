//! The `smpp` provider: an SMPP v3.4 client (ESME) holding bound
//! transceiver sessions to an SMSC.
//!
//! Each instance keeps `SMPP_BINDS` sessions open (`bind_transceiver`),
//! each with at most `SMPP_WINDOW` requests awaiting their response, sends
//! `enquire_link` every `SMPP_ENQUIRE_LINK_INTERVAL` (no answer within
//! `SMPP_RESPONSE_TIMEOUT` ends the session) and reconnects with backoff
//! when a session drops or a bind fails. The sessions are started and
//! stopped with the service ([`Provider::start`]).
//!
//! A message is one `submit_sm` per part ([`text::parts`]: GSM-7 or UCS-2,
//! concatenated with a UDH past one segment), all on one session, with
//! `registered_delivery` 1 on the last part: the message's provider id is
//! the last part's `message_id`, whose receipt is the message's.
//!
//! Classes ([`classify`]): `ESME_ROK` for every part accepted; throttled
//! (0x58), message queue full (0x14), system error (0x08) and "not bound"
//! (0x04) retryable (the SMSC answered that it did not take it); bind
//! failures (0x0D, 0x0E, 0x0F) refused; any other status rejected. No
//! session bound (nothing written) is retryable, or refused while the SMSC
//! refuses our bind for the account. No response within the timeout, or a
//! session lost after the PDU was handed to it, is ambiguous, and so is any
//! failure after a first part was accepted (parts are on the phone). SMPP
//! has no lookup by our id and does not de-duplicate: an ambiguous message
//! ends `unknown`, never resent.
//!
//! `deliver_sm` receipts (`esm_class` 0x04; `receipted_message_id` and
//! `message_state` TLVs, else the `id:… stat:… err:…` text) go to the
//! service's shared receipt handling and are answered `deliver_sm_resp`
//! (`ESME_RSYSERR` when it could not be stored, so the SMSC sends it
//! again). A PDU that cannot be read is answered, never a crash.

pub mod pdu;
mod session;
pub mod settings;
pub mod text;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::receipts::{Receipt, ReceiptSink};
use super::{OutgoingSms, Provider, ProviderRuntime, SendOutcome};
use crate::domain::Status;
use pdu::{id, status};
use session::{Lost, Session, bind_loop};

pub use settings::{ADAPTER, SmppSettings};

/// Shortest and longest wait before reconnecting.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long an `unbind` at shutdown waits for its answer.
const UNBIND_WAIT: Duration = Duration::from_secs(2);
/// Retries of a throttled later part of a long message (the first parts
/// are on the phone: giving up then ends it `unknown`).
const PART_RETRIES: u32 = 5;

/// What the SMSC's receipt status words mean.
pub fn delivery_status(stat: &str) -> Option<Status> {
    match stat.to_ascii_uppercase().as_str() {
        "DELIVRD" => Some(Status::Delivered),
        "ENROUTE" | "ACCEPTD" => Some(Status::Sent),
        "EXPIRED" | "DELETED" | "UNDELIV" | "REJECTD" => Some(Status::Undelivered),
        _ => None,
    }
}

/// The class of a `submit_sm_resp` (or `generic_nack`) status other than
/// `ESME_ROK`.
pub fn classify(command_status: u32) -> SendOutcome {
    let code = Some(format!("0x{command_status:08X}"));
    let message = format!("SMSC answered command_status 0x{command_status:08X}");
    match command_status {
        status::RTHROTTLED | status::RMSGQFUL | status::RSYSERR | 0x04 => SendOutcome::Retryable {
            http_status: None,
            provider_code: code,
            retry_after: None,
            message,
        },
        status::RBINDFAIL | status::RINVPASWD | status::RINVSYSID => SendOutcome::Refused {
            http_status: None,
            provider_code: code,
            message,
        },
        _ => SendOutcome::Rejected {
            http_status: None,
            provider_code: code,
            message,
        },
    }
}

/// A bind answered with one of these is a refusal of the account.
fn refuses_account(command_status: u32) -> bool {
    matches!(
        command_status,
        status::RBINDFAIL | status::RINVPASWD | status::RINVSYSID
    )
}

#[derive(Debug)]
pub struct SmppProvider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: SmppSettings,
    /// One slot per bind: the session when bound.
    sessions: Mutex<Vec<Option<Arc<Session>>>>,
    /// Woken when a session is bound or lost, or a bind refused.
    changed: Notify,
    /// The status of the last bind refused for the account, until a bind
    /// succeeds.
    refused: Mutex<Option<u32>>,
    next: AtomicUsize,
    reference: AtomicU8,
    /// When the next submit may go (`SMPP_RATE`).
    pace: tokio::sync::Mutex<Instant>,
}

impl SmppProvider {
    pub fn new(settings: SmppSettings) -> Self {
        let binds = settings.binds.max(1);
        SmppProvider {
            inner: Arc::new(Inner {
                settings,
                sessions: Mutex::new(vec![None; binds]),
                changed: Notify::new(),
                refused: Mutex::new(None),
                next: AtomicUsize::new(0),
                reference: AtomicU8::new(rand::random()),
                pace: tokio::sync::Mutex::new(Instant::now()),
            }),
        }
    }

    /// Sessions bound now.
    pub fn bound(&self) -> usize {
        lock(&self.inner.sessions).iter().flatten().count()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn retryable(message: impl Into<String>) -> SendOutcome {
    SendOutcome::Retryable {
        http_status: None,
        provider_code: None,
        retry_after: None,
        message: message.into(),
    }
}

fn ambiguous(message: impl Into<String>) -> SendOutcome {
    SendOutcome::Ambiguous {
        http_status: None,
        retry_after: None,
        message: message.into(),
    }
}

impl Inner {
    fn pick(&self) -> Option<Arc<Session>> {
        let sessions = lock(&self.sessions);
        let n = sessions.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .filter_map(|k| sessions[(start + k) % n].as_ref())
            .find(|s| !s.closed.is_cancelled())
            .cloned()
    }

    /// A bound session, waiting until `deadline` for one.
    async fn session(&self, deadline: Instant) -> Result<Arc<Session>, SendOutcome> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(s) = self.pick() {
                return Ok(s);
            }
            if let Some(code) = *lock(&self.refused) {
                return Err(SendOutcome::Refused {
                    http_status: None,
                    provider_code: Some(format!("0x{code:08X}")),
                    message: format!("the SMSC refuses our bind (command_status 0x{code:08X})"),
                });
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(retryable("no SMPP session is bound; nothing was written"));
            }
        }
    }

    /// Waits for this submit's turn under `SMPP_RATE`. A turn later than
    /// `by` is not taken: `Err` says how far away it is (nothing written).
    async fn pace(&self, by: Option<Instant>) -> Result<(), Duration> {
        let rate = self.settings.rate.max(1);
        let step = Duration::from_secs(1) / rate;
        let at = {
            let mut next = self.pace.lock().await;
            let now = Instant::now();
            let at = (*next).max(now);
            if by.is_some_and(|by| at > by) {
                return Err(at - now);
            }
            *next = at + step;
            at
        };
        tokio::time::sleep_until(at).await;
        Ok(())
    }

    fn set(&self, slot: usize, session: Option<Arc<Session>>) {
        if let Some(s) = lock(&self.sessions).get_mut(slot) {
            *s = session;
        }
        self.changed.notify_waiters();
    }
}

#[async_trait]
impl Provider for SmppProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        // SMPP carries no key of ours, and an SMSC creates a message for
        // every submit_sm.
        false
    }

    fn sender(&self, from: Option<&str>) -> Option<String> {
        from.map(str::to_string)
            .or_else(|| self.inner.settings.source_addr.clone())
    }

    fn start(&self, runtime: ProviderRuntime) -> Option<tokio::task::JoinHandle<()>> {
        let inner = Arc::clone(&self.inner);
        Some(tokio::spawn(async move {
            let binds = lock(&inner.sessions).len();
            let tasks: Vec<_> = (0..binds)
                .map(|slot| tokio::spawn(bind_loop(Arc::clone(&inner), slot, runtime.clone())))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        }))
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let to = match sms.phone() {
            Ok(p) => p.as_str().to_string(),
            Err(outcome) => return outcome,
        };
        let inner = &self.inner;
        let source = self.sender(sms.from.as_deref()).unwrap_or_default();
        let reference = inner.reference.fetch_add(1, Ordering::Relaxed);
        let parts = text::parts(&sms.body, reference);
        // Waiting for a session, a turn under SMPP_RATE or room in the
        // window ends by then with nothing written (retryable): past the
        // service's own call timeout a wait would read as "no answer" and
        // end a message that was never sent `unknown`.
        let write_by = Instant::now() + inner.settings.queue_wait;
        let session = match inner.session(write_by).await {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        let total = parts.len();
        let mut last_id = String::new();
        for (i, part) in parts.into_iter().enumerate() {
            let submit = pdu::Submit {
                source_addr: source.clone(),
                destination_addr: to.clone(),
                esm_class: part.esm_class,
                registered_delivery: u8::from(i + 1 == total),
                data_coding: part.data_coding,
                short_message: part.short_message,
            };
            let body = submit.body();
            let mut tries = 0;
            let answer = loop {
                // The first part may give up before it is written; a
                // later one may not (the first parts are on the phone).
                let by = (i == 0).then_some(write_by);
                if let Err(wait) = inner.pace(by).await {
                    return SendOutcome::Retryable {
                        http_status: None,
                        provider_code: None,
                        retry_after: Some(wait),
                        message: "SMPP_RATE reached; nothing was written".into(),
                    };
                }
                let answer = session
                    .request(
                        id::SUBMIT_SM,
                        &body,
                        by,
                        inner.settings.response_timeout,
                    )
                    .await;
                let throttled = matches!(&answer, Ok(r)
                    if matches!(r.status, status::RTHROTTLED | status::RMSGQFUL));
                if i > 0 && throttled && tries < PART_RETRIES {
                    tries += 1;
                    tokio::time::sleep(BACKOFF_MIN * 2u32.pow(tries)).await;
                    continue;
                }
                break answer;
            };
            let after = if i == 0 {
                String::new()
            } else {
                format!(" after {i} of {total} parts were accepted (they are on the phone)")
            };
            match answer {
                Ok(r) if r.status == status::ROK => last_id = pdu::resp_id(&r.body),
                Ok(r) if i == 0 => return classify(r.status),
                Ok(r) => {
                    return ambiguous(format!(
                        "the SMSC answered command_status 0x{:08X}{after}",
                        r.status
                    ));
                }
                Err(Lost::NotWritten) if i == 0 => {
                    return retryable("the SMPP session closed before the submit was written");
                }
                Err(Lost::NotWritten | Lost::Dropped) => {
                    return ambiguous(format!("the SMPP session dropped{after}"));
                }
                Err(Lost::Timeout) => {
                    return ambiguous(format!("no submit_sm_resp within the timeout{after}"));
                }
            }
        }
        if last_id.is_empty() {
            // Accepted without an id: receipts cannot be matched, but the
            // message is sent.
            last_id = format!("smpp-{}", sms.message_id);
        }
        SendOutcome::Accepted {
            provider_message_id: last_id,
            http_status: None,
        }
    }
}

#[cfg(test)]
mod tests;
