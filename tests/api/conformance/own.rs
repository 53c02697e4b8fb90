//! The situations run over the adapters of a channel of their own
//! (`Column::Own`), through the service on both backends, with creations
//! counted at the adapter's testkit mock (which never de-duplicates):
//!
//! | situation | what must hold |
//! |---|---|
//! | accepted | the message ends `sent`: one send call, one message created |
//! | certainly refused | `failed`: one call, nothing created, no retry |
//! | ambiguous (created, then the connection dropped; created, then no answer within the timeout) | one call, one message: never sent twice; it ends as the adapter's documented rule says ([`Driver::ambiguous_ends`]) |
//! | rate limited | nothing created; waiting for its retry; the retry, once due, sends it: `sent`, two calls, one message |
//! | inbound forged | refused (401/403), nothing stored, nothing changes |
//! | inbound authentic | taken (200, not a duplicate), stored once, it changes what it says |
//! | inbound repeated | taken as a duplicate, nothing stored, nothing changes |
//! | inbound out of order (an earlier status after a later one) | stored, nothing changes |
//!
//! "Inbound" is what the provider posts to us about the send: its receipt
//! or report, or, for a channel whose provider documents none, what its
//! endpoint does take. A situation that does not apply to an adapter is
//! [`Applies::No`] in its [`Driver`], with the reason.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sendonce::clock::Clock;
use serde_json::json;
use testkit::mock_provider::{Behaviour, MockProvider};

use crate::helpers::*;

/// A hook's future.
pub(crate) type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whether a situation applies to an adapter; if not, why.
pub(crate) enum Applies<T> {
    Yes(T),
    No(&'static str),
}

/// How an inbound post is authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Auth {
    Authentic,
    Forged,
}

/// Which status an inbound post carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Word {
    /// A final one (delivered).
    Later,
    /// One that comes before it (sent).
    Earlier,
}

/// One adapter's column: how the situations drive it.
pub(crate) struct Driver {
    /// An instance sending through the adapter against its testkit mock,
    /// on `clock`.
    pub spawn: fn(Backend, Clock) -> Fut<'static, TestApp>,
    /// Makes one send under `key` the way a client sends on this channel;
    /// what the send is looked up by.
    pub send: for<'a> fn(&'a TestApp, &'a str) -> Fut<'a, String>,
    /// The status of the send's message, as the API shows it (`none`
    /// before there is one).
    pub status: for<'a> fn(&'a TestApp, &'a str) -> Fut<'a, String>,
    /// Send calls the mock got for this adapter.
    pub calls: fn(&MockProvider) -> usize,
    /// Messages the mock created for this adapter.
    pub created: fn(&MockProvider) -> usize,
    /// A certain refusal of the message, in the provider's wire format.
    pub refusal: Applies<fn() -> Behaviour>,
    /// How an ambiguous send ends, as the adapter's documented rule says:
    /// `unknown` (it cannot be asked), `sent` (asked, and it has it).
    pub ambiguous_ends: Applies<&'static str>,
    /// A rate limit in the provider's wire format, and the seconds it says
    /// to wait.
    pub rate_limit: Applies<(fn() -> Behaviour, u64)>,
    /// What the provider posts to us about a send.
    pub inbound: Applies<Inbound>,
}

/// How the provider's posts about a send are made and seen.
pub(crate) struct Inbound {
    /// Posts one about the send `handle`, stamped `now` (unix seconds).
    pub post: for<'a> fn(&'a TestApp, &'a str, Word, Auth, i64) -> Fut<'a, Answer>,
    /// What a post may change, as the API shows it.
    pub effect: for<'a> fn(&'a TestApp, &'a str) -> Fut<'a, String>,
    /// Posts stored.
    pub stored: fn(&TestApp) -> Fut<'_, i64>,
    /// An earlier status after a later one (`Word::Earlier`).
    pub out_of_order: Applies<()>,
}

/// Runs every situation of the table over `name`'s column.
pub(crate) async fn run(backend: Backend, name: &str, d: &Driver) {
    accepted(backend, name, d).await;
    match &d.refusal {
        Applies::Yes(refusal) => refused(backend, name, d, *refusal).await,
        Applies::No(why) => assert!(!why.is_empty(), "{name}: a reason"),
    }
    match &d.ambiguous_ends {
        Applies::Yes(ends) => {
            ambiguous(backend, name, d, Behaviour::AcceptThenDrop, ends).await;
            ambiguous(backend, name, d, Behaviour::AcceptThenHang, ends).await;
        }
        Applies::No(why) => assert!(!why.is_empty(), "{name}: a reason"),
    }
    match &d.rate_limit {
        Applies::Yes((limit, secs)) => rate_limited(backend, name, d, *limit, *secs).await,
        Applies::No(why) => assert!(!why.is_empty(), "{name}: a reason"),
    }
    match &d.inbound {
        Applies::Yes(inbound) => inbound_posts(backend, name, d, inbound).await,
        Applies::No(why) => assert!(!why.is_empty(), "{name}: a reason"),
    }
}

/// Waits until the send's message has `want` as its status.
async fn status_is(app: &TestApp, d: &Driver, handle: &str, what: &str, want: &str) {
    eventually(&format!("{what}: {want}"), || async {
        ((d.status)(app, handle).await == want).then_some(())
    })
    .await;
}

async fn accepted(backend: Backend, name: &str, d: &Driver) {
    let what = format!("{name} / accepted");
    let mut app = (d.spawn)(backend, Clock::system()).await;
    let handle = (d.send)(&app, "CONF-OK").await;
    status_is(&app, d, &handle, &what, "sent").await;
    assert_eq!((d.calls)(&app.mock), 1, "{what}");
    assert_eq!((d.created)(&app.mock), 1, "{what}");
    app.stop().await;
}

async fn refused(backend: Backend, name: &str, d: &Driver, refusal: fn() -> Behaviour) {
    let what = format!("{name} / certainly refused");
    let mut app = (d.spawn)(backend, Clock::system()).await;
    app.mock.push([refusal()]);
    let handle = (d.send)(&app, "CONF-REFUSED").await;
    status_is(&app, d, &handle, &what, "failed").await;
    assert_eq!((d.calls)(&app.mock), 1, "{what}: never retried");
    assert_eq!((d.created)(&app.mock), 0, "{what}");
    app.stop().await;
}

async fn ambiguous(backend: Backend, name: &str, d: &Driver, first: Behaviour, ends: &str) {
    let what = format!("{name} / ambiguous ({first:?})");
    let mut app = (d.spawn)(backend, Clock::system()).await;
    app.mock.push([first]);
    let handle = (d.send)(&app, "CONF-AMBIGUOUS").await;
    status_is(&app, d, &handle, &what, ends).await;
    assert_eq!((d.calls)(&app.mock), 1, "{what}: sent twice");
    assert_eq!((d.created)(&app.mock), 1, "{what}");
    // Nothing of it is left to do: no later pass sends it again.
    no_message_processing(&app, &what).await;
    assert_eq!((d.calls)(&app.mock), 1, "{what}: sent twice");
    app.stop().await;
}

async fn no_message_processing(app: &TestApp, what: &str) {
    eventually(&format!("{what}: nothing processing"), || async {
        (app.db
            .count("SELECT count(*) FROM messages WHERE status = 'processing'")
            .await
            == 0)
            .then_some(())
    })
    .await;
}

async fn rate_limited(
    backend: Backend,
    name: &str,
    d: &Driver,
    limit: fn() -> Behaviour,
    secs: u64,
) {
    let what = format!("{name} / rate limited");
    let clock = Clock::manual(time::macros::datetime!(2026-12-06 12:00:00 UTC));
    let mut app = (d.spawn)(backend, clock.clone()).await;
    app.mock.push([limit()]);
    let handle = (d.send)(&app, "CONF-LIMITED").await;
    // Its retry recorded (due, not leased) before the clock moves.
    let waiting = "SELECT count(*) FROM messages WHERE status = 'processing' \
         AND lease_token IS NULL AND next_attempt_at IS NOT NULL";
    eventually(&format!("{what}: waiting for its retry"), || async {
        (app.db.count(waiting).await == 1).then_some(())
    })
    .await;
    assert_eq!((d.calls)(&app.mock), 1, "{what}");
    assert_eq!((d.created)(&app.mock), 0, "{what}");
    clock.advance(Duration::from_secs(secs + 1));
    status_is(&app, d, &handle, &what, "sent").await;
    assert_eq!((d.calls)(&app.mock), 2, "{what}: retried once");
    assert_eq!((d.created)(&app.mock), 1, "{what}");
    app.stop().await;
}

/// 200 with `duplicate`, or refused.
fn taken(a: &Answer, what: &str) -> Option<bool> {
    match a.status {
        200 => Some(a.json()["duplicate"].as_bool().unwrap_or_else(|| {
            panic!(
                "{what}: no `duplicate` in {}",
                String::from_utf8_lossy(&a.bytes)
            )
        })),
        401 | 403 => None,
        s => panic!("{what}: {s} {}", String::from_utf8_lossy(&a.bytes)),
    }
}

async fn inbound_posts(backend: Backend, name: &str, d: &Driver, i: &Inbound) {
    let clock = Clock::manual(time::macros::datetime!(2026-12-06 12:00:00 UTC));
    let mut app = (d.spawn)(backend, clock.clone()).await;
    let handle = (d.send)(&app, "CONF-INBOUND").await;
    status_is(&app, d, &handle, &format!("{name} / inbound"), "sent").await;
    let now = clock.now().unix_timestamp();
    let post = |word, auth| (i.post)(&app, &handle, word, auth, now);

    let what = format!("{name} / inbound forged");
    let (before, stored) = ((i.effect)(&app, &handle).await, (i.stored)(&app).await);
    let a = post(Word::Later, Auth::Forged).await;
    assert_eq!(taken(&a, &what), None, "{what}: taken");
    assert_eq!((i.effect)(&app, &handle).await, before, "{what}");
    assert_eq!((i.stored)(&app).await, stored, "{what}");

    let what = format!("{name} / inbound authentic");
    let a = post(Word::Later, Auth::Authentic).await;
    assert_eq!(taken(&a, &what), Some(false), "{what}");
    let after = (i.effect)(&app, &handle).await;
    assert_ne!(after, before, "{what}: changed nothing");
    assert_eq!((i.stored)(&app).await, stored + 1, "{what}");

    let what = format!("{name} / inbound repeated");
    let a = post(Word::Later, Auth::Authentic).await;
    assert_eq!(taken(&a, &what), Some(true), "{what}");
    assert_eq!((i.effect)(&app, &handle).await, after, "{what}");
    assert_eq!((i.stored)(&app).await, stored + 1, "{what}");

    match &i.out_of_order {
        Applies::Yes(()) => {
            let what = format!("{name} / inbound out of order");
            let a = post(Word::Earlier, Auth::Authentic).await;
            assert_eq!(taken(&a, &what), Some(false), "{what}");
            assert_eq!((i.effect)(&app, &handle).await, after, "{what}");
            assert_eq!((i.stored)(&app).await, stored + 2, "{what}");
        }
        Applies::No(why) => assert!(!why.is_empty(), "{name}: a reason"),
    }
    assert_eq!((d.calls)(&app.mock), 1, "{name} / inbound: one send");
    assert_eq!((d.created)(&app.mock), 1, "{name} / inbound: one message");
    app.stop().await;
}

/// The Telegram bot (`telegram`): `POST /messages` to `telegram:42`,
/// `sendMessage` at the mock's Bot API.
pub(crate) static TELEGRAM: Driver = Driver {
    spawn: |backend, clock| Box::pin(bot::spawn(backend, clock)),
    send: |app, key| Box::pin(bot::send(app, key)),
    status: |app, key| Box::pin(bot::status(app, key)),
    calls: |mock| count_calls(mock, "telegram"),
    created: |mock| mock.telegram_messages().len(),
    // 400 "Bad Request: chat not found": about this message, not retried.
    refusal: Applies::Yes(|| Behaviour::Fail {
        status: 400,
        body: json!({"description": "Bad Request: chat not found"}),
        retry_after: None,
    }),
    // The Bot API has no idempotency key and no way to ask whether a
    // message went out (docs/providers.md): `unknown`, never resent.
    ambiguous_ends: Applies::Yes("unknown"),
    // Flood control: 429 with `parameters.retry_after`.
    rate_limit: Applies::Yes((
        || Behaviour::Fail {
            status: 429,
            body: json!({}),
            retry_after: Some(7),
        },
        7,
    )),
    // The Bot API documents no delivery receipts; what it posts to us is
    // updates (`POST /channels/telegram/updates`, authenticated by
    // `X-Telegram-Bot-Api-Secret-Token`): here the chat's `/stop`, which
    // opts it out.
    inbound: Applies::Yes(Inbound {
        post: |app, _, _, auth, _| Box::pin(bot::post_stop(app, auth)),
        effect: |app, key| Box::pin(bot::effect(app, key)),
        stored: |app| {
            Box::pin(async move { app.db.count("SELECT count(*) FROM inbound_updates").await })
        },
        out_of_order: Applies::No(
            "an update carries no status of a message, so none is earlier than \
             another; each is taken once under its update_id (tests/api/telegram_updates.rs)",
        ),
    }),
};

/// The Telegram Gateway (`telegram_gateway`): verification codes only, so
/// its send is `POST /verifications` with `channels: ["telegram"]` (it has
/// no `POST /messages` send), `sendVerificationMessage` at the mock's
/// Gateway API.
pub(crate) static TELEGRAM_GATEWAY: Driver = Driver {
    spawn: |backend, clock| Box::pin(crate::telegram_gateway::spawn_gateway(backend, clock)),
    send: |app, key| {
        Box::pin(verification::send(
            app,
            key,
            "telegram",
            crate::telegram_gateway::TO,
        ))
    },
    status: |app, id| Box::pin(verification::status(app, id)),
    calls: |mock| count_calls(mock, "telegram_gateway"),
    created: |mock| mock.gateway_messages().len(),
    // An error about the number: `Rejected`.
    refusal: Applies::Yes(|| Behaviour::Fail {
        status: 400,
        body: json!({"ok": false, "error": "PHONE_NUMBER_INVALID"}),
        retry_after: None,
    }),
    // The Gateway is asked (`checkVerificationStatus`), never sent to
    // again: it has the message, so `sent`.
    ambiguous_ends: Applies::Yes("sent"),
    rate_limit: Applies::Yes((
        || Behaviour::Fail {
            status: 429,
            body: json!({"ok": false, "error": "FLOOD_WAIT_20"}),
            retry_after: None,
        },
        20,
    )),
    // Its delivery reports, signed with the token.
    inbound: Applies::Yes(Inbound {
        post: |app, _, word, auth, now| Box::pin(gateway::report(app, word, auth, now)),
        effect: |app, id| Box::pin(gateway::effect(app, id)),
        stored: |app| Box::pin(async move { app.db.count("SELECT count(*) FROM receipts").await }),
        out_of_order: Applies::Yes(()),
    }),
};

/// WhatsApp authentication templates (`whatsapp`): codes only, so its send
/// is a verification with `channels: ["whatsapp"]`; `POST
/// /{phone-number-id}/messages` at the mock's Cloud API.
pub(crate) static WHATSAPP: Driver = Driver {
    spawn: |backend, clock| Box::pin(crate::whatsapp::spawn_whatsapp_with(backend, clock)),
    send: |app, key| {
        Box::pin(verification::send(
            app,
            key,
            "whatsapp",
            crate::whatsapp::TO,
        ))
    },
    status: |app, id| Box::pin(verification::status(app, id)),
    calls: |mock| count_calls(mock, "whatsapp"),
    created: |mock| mock.whatsapp_messages().len(),
    // 131026: the message is undeliverable to this number.
    refusal: Applies::Yes(|| Behaviour::Fail {
        status: 400,
        body: testkit::providers::whatsapp::error_body(131026),
        retry_after: None,
    }),
    // No idempotency key, no lookup: `unknown`, never resent.
    ambiguous_ends: Applies::Yes("unknown"),
    // 130429 (throughput): retried with our backoff, no wait of its own.
    rate_limit: Applies::Yes((
        || Behaviour::Fail {
            status: 400,
            body: testkit::providers::whatsapp::error_body(130429),
            retry_after: None,
        },
        0,
    )),
    // Its status webhook, signed with the app secret.
    inbound: Applies::Yes(Inbound {
        post: |app, _, word, auth, now| {
            Box::pin(async move {
                let m = app.mock.whatsapp_messages()[0].clone();
                let word = match word {
                    Word::Later => "delivered",
                    Word::Earlier => "sent",
                };
                let secret = match auth {
                    Auth::Authentic => crate::whatsapp::APP_SECRET,
                    Auth::Forged => "not-the-app-secret",
                };
                crate::whatsapp::post_status(app, &m, word, now, secret).await
            })
        },
        effect: |app, id| Box::pin(verification::status(app, id)),
        stored: |app| Box::pin(async move { app.db.count("SELECT count(*) FROM receipts").await }),
        out_of_order: Applies::Yes(()),
    }),
};

fn count_calls(mock: &MockProvider, endpoint: &str) -> usize {
    mock.calls()
        .iter()
        .filter(|c| c.endpoint == endpoint)
        .count()
}

/// The message's status at `GET /messages/{key}`.
async fn message_status(app: &TestApp, key: &str) -> String {
    let a = app.get(&format!("/messages/{key}")).await;
    if a.status != 200 {
        return "none".into();
    }
    a.json()["status"].as_str().unwrap_or("?").to_string()
}

mod bot {
    use super::*;

    const CHAT: &str = "telegram:42";

    pub(super) async fn spawn(backend: Backend, clock: Clock) -> TestApp {
        // The bot's updates belong to a tenant named up front: the
        // instance acts as it.
        let (database, key) = crate::telegram_updates::owned_database(backend).await;
        crate::telegram_updates::spawn_inbound(backend, &database, &key, clock, None).await
    }

    pub(super) async fn send(app: &TestApp, key: &str) -> String {
        let a = app
            .post_with(
                Some(key),
                &json!({"to": CHAT, "body": "conformance"}),
                &[("prefer", "wait=1")],
            )
            .await;
        assert!(
            matches!(a.status, 201 | 202),
            "{key}: {} {}",
            a.status,
            String::from_utf8_lossy(&a.bytes)
        );
        key.to_string()
    }

    pub(super) async fn status(app: &TestApp, key: &str) -> String {
        message_status(app, key).await
    }

    pub(super) async fn post_stop(app: &TestApp, auth: Auth) -> Answer {
        let secret = match auth {
            Auth::Authentic => crate::telegram_updates::SECRET,
            Auth::Forged => "not-the-webhook-secret",
        };
        let update = crate::telegram_updates::text_update(1000, 42, "/stop");
        crate::telegram_updates::post_update(app, Some(secret), update.to_string().as_bytes()).await
    }

    /// The message's status and the chat's opt-out.
    pub(super) async fn effect(app: &TestApp, key: &str) -> String {
        let list = app.get("/opt-outs").await.json();
        let opted_out = list["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|o| o["number"] == CHAT));
        format!("{} opted out: {opted_out}", status(app, key).await)
    }
}

/// A channel that carries verification codes only: its send is a
/// verification on that channel alone, its message the verification's
/// first.
mod verification {
    use super::*;

    pub(super) async fn send(app: &TestApp, key: &str, channel: &str, to: &str) -> String {
        crate::telegram_gateway::started(app, key, json!({"to": to, "channels": [channel]})).await
    }

    pub(super) async fn status(app: &TestApp, id: &str) -> String {
        crate::telegram_gateway::verification(app, id).await["messages"][0]["status"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    }
}

mod gateway {
    use super::*;
    use crate::telegram_gateway::TOKEN;

    /// The message's status. (Its `delivery_report` is documented as the
    /// last report that came, out of order or not: not compared.)
    pub(super) async fn effect(app: &TestApp, id: &str) -> String {
        verification::status(app, id).await
    }

    pub(super) async fn report(app: &TestApp, word: Word, auth: Auth, now: i64) -> Answer {
        let request_id = app.mock.gateway_messages()[0].request_id.clone();
        let status = match word {
            Word::Later => "delivered",
            Word::Earlier => "sent",
        };
        app.mock.gateway_set_status(&request_id, status);
        let token = match auth {
            Auth::Authentic => TOKEN,
            Auth::Forged => "not-the-token",
        };
        crate::telegram_gateway::report(app, &request_id, now, token).await
    }
}
