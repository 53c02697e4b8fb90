//! The adapter conformance suite: every adapter of the registry
//! (`sendonce::provider::registry::names`) has a column in [`COLUMNS`], and
//! one without fails every test here, naming it ([`columns`]). Each runs
//! against the real adapter code and its testkit mock speaking the
//! provider's documented wire format, messages counted where the mock
//! creates them.
//!
//! SMS adapters (`Column::Sms`) answer one table of situations. Where an
//! adapter cannot do a row (simulated has no network and no receipts, the
//! `http` bridge cannot be asked afterwards and is resent under the same
//! key instead), the table states what it does then; no row is skipped.
//! The mock never de-duplicates, except in the `http` rows after an
//! ambiguous answer: there, de-duplicating on our key is the bridge's
//! documented half of the promise (docs/providers.md), and the row checks
//! that the resend carries the same key.
//!
//! - Sending and reconciling need no service: [`every_adapter_answers_the_send_table`]
//!   calls the adapters directly.
//! - Receipts go through the service, on both backends:
//!   [`every_adapter_answers_the_receipt_table`].
//!
//! Adapters of a channel of their own (`Column::Own`: the Telegram bot, the
//! Telegram Gateway) are driven through the service, on both backends, by
//! their [`own::Driver`]: [`every_channel_adapter_answers_the_situations`]
//! runs the situations of [`own`] over each, a situation that does not
//! apply saying why in the driver.

mod own;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sendonce::domain::MessageId;
use sendonce::provider::registry;
use sendonce::provider::smpp::pdu::status;
use sendonce::provider::smpp::{SmppProvider, SmppSettings};
use sendonce::provider::{
    AttemptRef, HttpProvider, InfobipProvider, InfobipSettings, OutgoingSms, Provider, Reconciled,
    SendOutcome, SimulatedProvider, TwilioProvider, TwilioSettings, VonageProvider,
};
use serde_json::json;
use testkit::mock_provider::{Behaviour, Dedup, MockProvider};

use crate::smsc::Smsc;

use crate::helpers::*;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, DEFAULT_FROM};

/// The SMS adapters' columns of [`SEND_TABLE`] and [`RECEIPT_TABLE`]
/// (`Row::want` is indexed by this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Adapter {
    Simulated,
    Http,
    Twilio,
    Infobip,
    Vonage,
    Smpp,
}

impl Adapter {
    fn name(self) -> &'static str {
        match self {
            Adapter::Simulated => "simulated",
            Adapter::Http => "http",
            Adapter::Twilio => "twilio",
            Adapter::Infobip => "infobip",
            Adapter::Vonage => "vonage",
            Adapter::Smpp => "smpp",
        }
    }

    /// The provider ids of the messages the mock created for this adapter.
    fn created_ids(self, mock: &MockProvider) -> Vec<String> {
        match self {
            Adapter::Infobip => mock
                .infobip_messages()
                .into_iter()
                .map(|m| m.message_id)
                .collect(),
            _ => mock.twilio_sids(),
        }
    }

    /// The real adapter, aimed at the mock listening on `addr`.
    fn build(self, addr: std::net::SocketAddr) -> Arc<dyn Provider> {
        let t = Duration::from_secs(2);
        match self {
            Adapter::Simulated => Arc::new(SimulatedProvider::default()),
            Adapter::Http => Arc::new(
                HttpProvider::new(&format!("http://{addr}/messages"), None, t, t).expect("http"),
            ),
            Adapter::Twilio => Arc::new(
                TwilioProvider::new(TwilioSettings {
                    base_url: format!("http://{addr}"),
                    account_sid: ACCOUNT.into(),
                    auth_token: AUTH_TOKEN.into(),
                    from: Some(DEFAULT_FROM.into()),
                    messaging_service_sid: None,
                    status_callback: None,
                    timeout: t,
                    connect_timeout: t,
                })
                .expect("twilio"),
            ),
            Adapter::Infobip => Arc::new(
                InfobipProvider::new(InfobipSettings {
                    timeout: t,
                    connect_timeout: t,
                    ..crate::infobip::settings(&format!("http://{addr}"), None)
                })
                .expect("infobip"),
            ),
            Adapter::Vonage => Arc::new(
                VonageProvider::new(crate::vonage::settings(&format!("http://{addr}"), None))
                    .expect("vonage"),
            ),
            Adapter::Smpp => Arc::new(SmppProvider::new(smpp_settings(addr))),
        }
    }
}

/// The `smpp` adapter's settings against the SMSC at `addr`, with a short
/// response timeout.
fn smpp_settings(addr: std::net::SocketAddr) -> SmppSettings {
    let mut s = SmppSettings::new(&addr.ip().to_string(), addr.port(), "sendonce", "secret");
    s.response_timeout = Duration::from_secs(1);
    s.connect_timeout = Duration::from_secs(2);
    s
}

/// Receipts the conformance sends never reach (the SMPP rows have no
/// `deliver_sm`).
struct NoReceipts;

#[async_trait::async_trait]
impl sendonce::provider::receipts::ReceiptSink for NoReceipts {
    async fn take(
        &self,
        _: &'static str,
        _: sendonce::provider::receipts::Receipt,
        _: Option<sendonce::domain::Status>,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// How the suite drives one adapter: its column.
enum Column {
    /// An SMS adapter: its column of [`SEND_TABLE`] (the adapter called
    /// directly, against its mock) and of [`RECEIPT_TABLE`] (through the
    /// service, on both backends).
    Sms(Adapter),
    /// An adapter of a channel of its own: [`own::Driver`] says how to
    /// spawn an instance sending through it against its mock, make a send,
    /// and post a receipt, and per situation what does not apply and why;
    /// the situations of [`own`] run through the service, on both backends.
    Own(&'static own::Driver),
}

/// The per-adapter table, by the adapter's name in the registry. An
/// adapter of the registry without an entry here fails the suite
/// ([`columns`]), naming it. A new adapter of a channel of its own is one
/// entry, `("name", Column::Own(&own::NAME))`, with its `own::Driver`
/// written beside the others in `conformance/own.rs`.
static COLUMNS: &[(&str, Column)] = &[
    ("simulated", Column::Sms(Adapter::Simulated)),
    ("http", Column::Sms(Adapter::Http)),
    ("twilio", Column::Sms(Adapter::Twilio)),
    ("infobip", Column::Sms(Adapter::Infobip)),
    ("vonage", Column::Sms(Adapter::Vonage)),
    ("smpp", Column::Sms(Adapter::Smpp)),
    ("telegram", Column::Own(&own::TELEGRAM)),
    ("telegram_gateway", Column::Own(&own::TELEGRAM_GATEWAY)),
    ("whatsapp", Column::Own(&own::WHATSAPP)),
];

/// Every adapter of the registry (`sendonce::provider::registry::names`),
/// in its order, with its column. Panics naming each adapter that has no
/// column (and each column that names no adapter): no adapter is left out
/// of the suite by omission.
fn columns() -> Vec<(&'static str, &'static Column)> {
    let column = |name: &str| COLUMNS.iter().find(|(n, _)| *n == name).map(|(_, c)| c);
    let missing: Vec<&str> = registry::names().filter(|n| column(n).is_none()).collect();
    assert!(
        missing.is_empty(),
        "adapter(s) {missing:?} of the registry have no column in the conformance suite: \
         add an entry to `COLUMNS` in tests/api/conformance.rs (how to spawn an instance \
         sending through it against its testkit mock, make a send, post a receipt; per \
         situation that does not apply, why)"
    );
    let stale: Vec<&str> = COLUMNS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| registry::adapter(n).is_none())
        .collect();
    assert!(
        stale.is_empty(),
        "`COLUMNS` names {stale:?}, which the registry does not have"
    );
    for (n, c) in COLUMNS {
        if let Column::Sms(a) = c {
            assert_eq!(a.name(), *n, "the SMS column keyed {n}");
        }
    }
    registry::names()
        .filter_map(|n| column(n).map(|c| (n, c)))
        .collect()
}

/// The SMS adapters' columns, in the registry's order.
fn sms_columns() -> Vec<Adapter> {
    columns()
        .into_iter()
        .filter_map(|(_, c)| match c {
            Column::Sms(a) => Some(*a),
            Column::Own(_) => None,
        })
        .collect()
}

#[test]
fn every_adapter_of_the_registry_has_a_column() {
    let got: Vec<&str> = columns().into_iter().map(|(n, _)| n).collect();
    let registered: Vec<&str> = registry::names().collect();
    assert_eq!(got, registered);
}

/// What happens after the first answer of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Nothing more to ask.
    Done,
    /// Reconciled: it has the message, under the id the mock created.
    Found,
    /// It cannot tell (`unknown`, never resent).
    CannotTell,
    /// It cannot be asked, and it de-duplicates on our key instead: resent
    /// under the same `Idempotency-Key`, the bridge answers the one message.
    ResentUnderTheSameKey,
    /// Reconciled: nothing shown yet, or the lookup failed: not known yet,
    /// asked again later (`Pending`), never resent. No adapter's lookup is
    /// documented as complete, so nothing found is never "not sent" (a log
    /// or a list may lag without bound).
    AskAgain,
}

/// One adapter's expected outcome of a row.
#[derive(Clone, Copy, Debug)]
struct Want {
    /// The outcome's class (`SendOutcome::class`).
    class: &'static str,
    retry_after: Option<u64>,
    then: Then,
    /// Messages the mock created in all.
    created: u32,
}

const fn want(class: &'static str, retry_after: Option<u64>, then: Then, created: u32) -> Want {
    Want {
        class,
        retry_after,
        then,
        created,
    }
}

/// Simulated: nothing leaves the process and nothing can fail, so every
/// row is an acceptance (its mock is never called).
const SIMULATED: Want = want("ok", None, Then::Done, 0);

struct Row {
    name: &'static str,
    /// What the mock does with the first call (Twilio's error body shape;
    /// the `http` protocol reads its `message` and `code` alike).
    first: fn() -> Behaviour,
    /// Make the next reconciliation lookup fail.
    lookups_fail: bool,
    /// What the SMSC does in the `smpp` column (its wire format is SMPP).
    smpp: Smsc,
    /// simulated, http, twilio, infobip, vonage, smpp. Vonage answers in a `200` with a
    /// status per part: the mock's Vonage turns a scripted 400 into status
    /// 3 (invalid parameters), a 401 into 4 (invalid credentials), a 429
    /// into 1 (throttled, which carries no `Retry-After`), a 5xx into an
    /// HTTP 5xx; it has no lookup, so every ambiguous answer cannot be told.
    want: [Want; 6],
}

fn fail(status: u16, code: u32, retry_after: Option<u64>) -> Behaviour {
    Behaviour::Fail {
        status,
        body: json!({
            "code": code,
            "message": format!("scripted {status}"),
            "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
            "status": status,
        }),
        retry_after,
    }
}

#[rustfmt::skip]
const SEND_TABLE: &[Row] = &[
    Row { name: "accepted", first: || Behaviour::Accept, smpp: Smsc::Accept, lookups_fail: false,
          want: [SIMULATED, want("ok", None, Then::Done, 1), want("ok", None, Then::Done, 1), want("ok", None, Then::Done, 1), want("ok", None, Then::Done, 1), want("ok", None, Then::Done, 1)] },
    // An invalid number (Twilio 21211): a refusal of the message.
    Row { name: "rejected", first: || fail(400, 21211, None), smpp: Smsc::Answer(status::RINVDSTADR), lookups_fail: false,
          want: [SIMULATED, want("permanent", None, Then::Done, 0), want("permanent", None, Then::Done, 0), want("permanent", None, Then::Done, 0), want("permanent", None, Then::Done, 0), want("permanent", None, Then::Done, 0)] },
    // Bad credentials (Twilio 20003): a refusal of the account.
    Row { name: "refused", first: || fail(401, 20003, None), smpp: Smsc::RefuseBind(status::RINVPASWD), lookups_fail: false,
          want: [SIMULATED, want("refused", None, Then::Done, 0), want("refused", None, Then::Done, 0), want("refused", None, Then::Done, 0), want("refused", None, Then::Done, 0), want("refused", None, Then::Done, 0)] },
    Row { name: "retryable with Retry-After", first: || fail(429, 20429, Some(7)), smpp: Smsc::Answer(status::RTHROTTLED), lookups_fail: false,
          want: [SIMULATED, want("retryable", Some(7), Then::Done, 0), want("retryable", Some(7), Then::Done, 0), want("retryable", Some(7), Then::Done, 0), want("retryable", None, Then::Done, 0), want("retryable", None, Then::Done, 0)] },
    Row { name: "retryable without Retry-After", first: || fail(429, 20429, None), smpp: Smsc::Answer(status::RMSGQFUL), lookups_fail: false,
          want: [SIMULATED, want("retryable", None, Then::Done, 0), want("retryable", None, Then::Done, 0), want("retryable", None, Then::Done, 0), want("retryable", None, Then::Done, 0), want("retryable", None, Then::Done, 0)] },
    // The provider created the message, and the answer was a 500.
    Row { name: "ambiguous, then reconciled: found", first: || Behaviour::AcceptThenFail { status: 500 }, smpp: Smsc::AcceptSilently, lookups_fail: false,
          want: [SIMULATED, want("ambiguous", None, Then::ResentUnderTheSameKey, 1), want("ambiguous", None, Then::Found, 1), want("ambiguous", None, Then::Found, 1), want("ambiguous", None, Then::CannotTell, 1), want("ambiguous", None, Then::CannotTell, 1)] },
    // A 500 without creating anything: nothing found is no answer yet.
    Row { name: "ambiguous, then reconciled: nothing shown", first: || fail(500, 20500, None), smpp: Smsc::Silent, lookups_fail: false,
          want: [SIMULATED, want("ambiguous", None, Then::ResentUnderTheSameKey, 1), want("ambiguous", None, Then::AskAgain, 0), want("ambiguous", None, Then::AskAgain, 0), want("ambiguous", None, Then::CannotTell, 0), want("ambiguous", None, Then::CannotTell, 0)] },
    // Created, a 500, and the lookup fails: nobody can tell.
    Row { name: "ambiguous, then reconciliation not possible", first: || Behaviour::AcceptThenFail { status: 500 }, smpp: Smsc::AcceptSilently, lookups_fail: true,
          want: [SIMULATED, want("ambiguous", None, Then::ResentUnderTheSameKey, 1), want("ambiguous", None, Then::CannotTell, 1), want("ambiguous", None, Then::AskAgain, 1), want("ambiguous", None, Then::CannotTell, 1), want("ambiguous", None, Then::CannotTell, 1)] },
];

fn retry_after(outcome: &SendOutcome) -> Option<u64> {
    match outcome {
        SendOutcome::Retryable { retry_after, .. } | SendOutcome::Ambiguous { retry_after, .. } => {
            retry_after.map(|d| d.as_secs())
        }
        _ => None,
    }
}

/// The `smpp` column: the real adapter against an SMSC doing `row.smpp`.
async fn run_smpp_row(row: &Row, want: Want) {
    let what = format!("smpp / {}", row.name);
    let (addr, created) = crate::smsc::start(row.smpp).await;
    let provider = SmppProvider::new(smpp_settings(addr));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = provider.start(sendonce::provider::ProviderRuntime {
        stop: stop.clone(),
        receipts: Arc::new(NoReceipts),
    });
    let sms = OutgoingSms {
        message_id: MessageId::new(),
        to: sendonce::domain::Recipient::from_stored("+14155550100", &[]).expect("E.164"),
        from: None,
        body: format!("conformance: {}", row.name),
        validity: None,
        attempt: 1,
        prepared: None,
    };
    let outcome = provider.send(&sms).await;
    assert_eq!(outcome.class(), want.class, "{what}: {outcome:?}");
    assert_eq!(retry_after(&outcome), want.retry_after, "{what}");
    assert!(!provider.dedupes_by_key(), "{what}");
    if want.then == Then::CannotTell {
        let attempt = AttemptRef {
            started_at: time::OffsetDateTime::now_utc(),
            age: Duration::ZERO,
            sender: None,
        };
        let got = provider.reconcile(&sms, &attempt).await;
        assert!(matches!(got, Reconciled::Unknown(_)), "{what}: {got:?}");
    }
    assert_eq!(
        created.load(std::sync::atomic::Ordering::SeqCst),
        want.created,
        "{what}"
    );
    stop.cancel();
    if let Some(t) = task {
        let _ = t.await;
    }
}

async fn run_send_row(row: &Row, adapter: Adapter, want: Want) {
    if adapter == Adapter::Smpp {
        return run_smpp_row(row, want).await;
    }
    let what = format!("{} / {}", adapter.name(), row.name);
    let (mock, _, addr) = MockProvider::start().await.expect("mock");
    let provider = adapter.build(addr);
    mock.push([(row.first)()]);
    if row.lookups_fail {
        mock.fail_lookups(1);
        mock.infobip_fail_lookups(1);
    }
    if want.then == Then::ResentUnderTheSameKey {
        assert!(provider.dedupes_by_key(), "{what}");
        mock.set_dedup(Dedup::Replay);
    }
    let sms = OutgoingSms {
        message_id: MessageId::new(),
        to: sendonce::domain::Recipient::from_stored("+14155550100", &[]).expect("E.164"),
        from: None,
        body: format!("conformance: {}", row.name),
        validity: None,
        attempt: 1,
        prepared: None,
    };
    let started_at = time::OffsetDateTime::now_utc();
    let started = Instant::now();
    let outcome = provider.send(&sms).await;
    assert_eq!(outcome.class(), want.class, "{what}: {outcome:?}");
    assert_eq!(
        retry_after(&outcome),
        want.retry_after,
        "{what}: {outcome:?}"
    );
    let attempt = AttemptRef {
        started_at,
        age: started.elapsed(),
        sender: provider.sender(sms.from.as_deref()),
    };
    match want.then {
        Then::Done => {}
        Then::ResentUnderTheSameKey => {
            let again = provider.send(&sms).await;
            assert_eq!(again.class(), "ok", "{what}: {again:?}");
            let keys: Vec<Option<String>> = mock
                .calls()
                .into_iter()
                .map(|c| c.idempotency_key)
                .collect();
            let ours = Some(sms.message_id.to_string());
            assert_eq!(keys, [ours.clone(), ours], "{what}");
        }
        Then::Found | Then::CannotTell | Then::AskAgain => {
            assert!(!provider.dedupes_by_key(), "{what}");
            let got = provider.reconcile(&sms, &attempt).await;
            let ok = match (want.then, &got) {
                (
                    Then::Found,
                    Reconciled::Sent {
                        provider_message_id,
                    },
                ) => adapter.created_ids(&mock) == [provider_message_id.clone()],
                (Then::CannotTell, Reconciled::Unknown(_)) => true,
                (Then::AskAgain, Reconciled::Pending(_)) => true,
                _ => false,
            };
            assert!(ok, "{what}: wanted {:?}, got {got:?}", want.then);
            if want.then == Then::AskAgain && want.created == 0 {
                // Nothing was created: however old the attempt (within what
                // a lookup can see), still no answer, never "not sent".
                let later = AttemptRef {
                    age: attempt.age + Duration::from_secs(3600),
                    ..attempt.clone()
                };
                let got = provider.reconcile(&sms, &later).await;
                assert!(
                    matches!(got, Reconciled::Pending(_)),
                    "{what}: an hour on: {got:?}"
                );
            }
        }
    }
    if adapter == Adapter::Simulated {
        assert_eq!(mock.call_count(), 0, "{what}");
    }
    assert_eq!(mock.created(), want.created, "{what}");
}

#[tokio::test]
async fn every_adapter_answers_the_send_table() {
    sendonce::install_crypto_provider();
    let adapters = sms_columns();
    for row in SEND_TABLE {
        for &adapter in &adapters {
            run_send_row(row, adapter, row.want[adapter as usize]).await;
        }
    }
}

/// How a receipt of a row is sent.
#[derive(Clone, Copy, Debug)]
enum Auth {
    Authentic,
    Forged,
}

/// What one receipt request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ack {
    /// 200, with `duplicate` and `applied`.
    Taken { duplicate: bool, applied: bool },
    /// 403: not authenticated, nothing recorded.
    Forbidden,
    /// 404: the adapter has no receipt endpoint.
    NoEndpoint,
}

struct ReceiptRow {
    name: &'static str,
    /// The receipts sent, in order: status word and how it is authenticated.
    receipts: &'static [(&'static str, Auth)],
    /// For adapters with a receipt endpoint: each answer, then the
    /// message's status and the receipts stored.
    answers: &'static [Ack],
    status: &'static str,
    stored: i64,
}

const TAKEN: Ack = Ack::Taken {
    duplicate: false,
    applied: true,
};

#[rustfmt::skip]
const RECEIPT_TABLE: &[ReceiptRow] = &[
    ReceiptRow { name: "signed", receipts: &[("delivered", Auth::Authentic)],
                 answers: &[TAKEN], status: "delivered", stored: 1 },
    ReceiptRow { name: "forged", receipts: &[("delivered", Auth::Forged)],
                 answers: &[Ack::Forbidden], status: "sent", stored: 0 },
    ReceiptRow { name: "duplicated", receipts: &[("delivered", Auth::Authentic), ("delivered", Auth::Authentic)],
                 answers: &[TAKEN, Ack::Taken { duplicate: true, applied: false }], status: "delivered", stored: 1 },
    ReceiptRow { name: "out of order", receipts: &[("delivered", Auth::Authentic), ("sent", Auth::Authentic)],
                 answers: &[TAKEN, Ack::Taken { duplicate: false, applied: false }], status: "delivered", stored: 2 },
];

const RECEIPT_SECRET: &str = "conformance-receipt-secret";

async fn spawn_adapter(backend: Backend, adapter: Adapter) -> TestApp {
    let mut settings = test_settings();
    settings.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
        "SENDONCE_RECEIPT_SECRET",
        RECEIPT_SECRET,
    )])
    .expect("receipt settings");
    let provider: Option<ProviderFactory> = match adapter {
        Adapter::Simulated => Some(Box::new(|_, _, _| Arc::new(SimulatedProvider::default()))),
        Adapter::Http => None,
        Adapter::Twilio => Some(crate::twilio::twilio()),
        Adapter::Infobip => Some(crate::infobip::infobip()),
        Adapter::Vonage => Some(crate::vonage::vonage()),
        Adapter::Smpp => {
            let (addr, _) = crate::smsc::start(Smsc::Accept).await;
            Some(Box::new(move |_, _, _| {
                Arc::new(SmppProvider::new(smpp_settings(addr)))
            }))
        }
    };
    spawn_with(TestOptions {
        backend,
        settings,
        provider,
        ..TestOptions::default()
    })
    .await
}

/// Posts one receipt for provider id `id` the way `adapter`'s provider
/// does (its documented wire format and authentication).
async fn post_receipt(
    app: &TestApp,
    adapter: Adapter,
    id: &str,
    status: &str,
    auth: Auth,
) -> Answer {
    let path = format!("/providers/{}/status", adapter.name());
    let url = format!("{}{path}", app.base);
    let req = match adapter {
        Adapter::Simulated | Adapter::Smpp => app
            .client
            .post(&url)
            .header("Content-Type", "application/json")
            .body(json!({"id": id, "status": status}).to_string()),
        Adapter::Http => {
            let secret = match auth {
                Auth::Authentic => RECEIPT_SECRET,
                Auth::Forged => "a-forged-secret-0123456789",
            };
            app.client
                .post(&url)
                .header("Content-Type", "application/json")
                .header("X-Receipt-Secret", secret)
                .body(
                    json!({"id": id, "status": status, "event_id": format!("{id}-{status}")})
                        .to_string(),
                )
        }
        Adapter::Twilio => {
            let params: Vec<(String, String)> = [
                ("AccountSid", ACCOUNT),
                ("MessageSid", id),
                ("MessageStatus", status),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let key = match auth {
                Auth::Authentic => AUTH_TOKEN,
                Auth::Forged => "not-the-auth-token",
            };
            let signature = sendonce::provider::twilio::signature(key, &url, &params);
            app.client
                .post(&url)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .header("X-Twilio-Signature", signature)
                .body(sendonce::provider::twilio::encode_form(&params))
        }
        Adapter::Infobip => {
            let secret = match auth {
                Auth::Authentic => crate::infobip::RECEIPT_SECRET,
                Auth::Forged => "a-forged-secret-0123456789",
            };
            let (group, name) = match status {
                "delivered" => ("DELIVERED", "DELIVERED_TO_HANDSET"),
                "sent" => ("PENDING", "PENDING_ENROUTE"),
                other => ("UNDELIVERABLE", other),
            };
            app.client
                .post(format!("{url}?secret={secret}"))
                .header("Content-Type", "application/json")
                .body(
                    json!({"results": [{
                        "messageId": id,
                        "to": "14155550100",
                        "status": {"groupName": group, "name": name},
                    }]})
                    .to_string(),
                )
        }
        Adapter::Vonage => {
            use sendonce::provider::vonage::{SignatureMethod, sign};
            // Vonage's word for a message on its way.
            let status = if status == "sent" { "accepted" } else { status };
            let mut params: Vec<(String, String)> = [
                ("msisdn", "14155550100"),
                ("to", crate::vonage::FROM),
                ("messageId", id),
                ("status", status),
                ("err-code", "0"),
                ("timestamp", "1764680000"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let key = match auth {
                Auth::Authentic => crate::vonage::SIGNATURE_SECRET,
                Auth::Forged => "not-the-signature-secret",
            };
            let sig = sign(SignatureMethod::HmacSha256, key, &params);
            params.push(("sig".into(), sig));
            app.client
                .post(&url)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(sendonce::provider::twilio::encode_form(&params))
        }
    };
    answer(req.send().await.expect("receipt POST")).await
}

fn ack(a: &Answer) -> Option<Ack> {
    match a.status {
        200 => {
            let j = a.json();
            Some(Ack::Taken {
                duplicate: j["duplicate"].as_bool()?,
                applied: j["applied"].as_bool()?,
            })
        }
        403 => Some(Ack::Forbidden),
        404 => Some(Ack::NoEndpoint),
        _ => None,
    }
}

async fn every_adapter_answers_the_receipt_table(backend: Backend) {
    for adapter in sms_columns() {
        let app = spawn_adapter(backend, adapter).await;
        // Simulated has no receipts; SMPP's come as deliver_sm on its
        // session (tests/api/smpp.rs), not over HTTP.
        let has_endpoint = !matches!(adapter, Adapter::Simulated | Adapter::Smpp);
        for (i, row) in RECEIPT_TABLE.iter().enumerate() {
            let what = format!("{} / {}", adapter.name(), row.name);
            let key = format!("CONFORMANCE-{i}");
            let sent = app.post(&key, &sms("+14155550100", &what)).await;
            assert_eq!(sent.status, 201, "{what}");
            let id = sent.json()["provider_message_id"]
                .as_str()
                .expect("a provider message id")
                .to_string();
            let before = app.db.count("SELECT count(*) FROM receipts").await;
            let mut answers = Vec::new();
            for (status, auth) in row.receipts {
                let a = post_receipt(&app, adapter, &id, status, *auth).await;
                answers
                    .push(ack(&a).unwrap_or_else(|| panic!("{what}: {} {:?}", a.status, a.bytes)));
            }
            let stored = app.db.count("SELECT count(*) FROM receipts").await - before;
            let status = app.get(&format!("/messages/{key}")).await.json()["status"]
                .as_str()
                .map(str::to_string);
            if has_endpoint {
                assert_eq!(answers, row.answers, "{what}");
                assert_eq!(status.as_deref(), Some(row.status), "{what}");
                assert_eq!(stored, row.stored, "{what}");
            } else {
                // No HTTP endpoint: 404, nothing changes.
                assert!(
                    answers.iter().all(|a| *a == Ack::NoEndpoint),
                    "{what}: {answers:?}"
                );
                assert_eq!(status.as_deref(), Some("sent"), "{what}");
                assert_eq!(stored, 0, "{what}");
            }
        }
    }
}

/// The adapters of a channel of their own, through their columns
/// (`Column::Own`): every situation of [`own`].
async fn every_channel_adapter_answers_the_situations(backend: Backend) {
    for (name, column) in columns() {
        if let Column::Own(driver) = column {
            own::run(backend, name, driver).await;
        }
    }
}

on_both_backends!(
    every_adapter_answers_the_receipt_table,
    every_channel_adapter_answers_the_situations
);
