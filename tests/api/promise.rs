//! The ten ways an outside audit found one key becoming two messages, a lost
//! send, a stuck send or a false answer (issue 24), one test each, named
//! after the finding. Every "one message" here is counted as messages the
//! mock *created* per recipient and body, at a mock that does not
//! de-duplicate (Twilio's endpoint never does; the `http` endpoint only
//! where a test says so, because the `http` contract requires it).

use std::sync::Arc;
use std::time::Duration;

use sendonce::provider::{Provider, TwilioProvider, TwilioSettings};
use testkit::mock_provider::{Behaviour, Dedup, MockProvider};
use tokio::sync::Notify;

use crate::helpers::*;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, DEFAULT_FROM};

const TO: &str = "+14155550142";

/// Twilio at `base`, calls bounded by `timeout`, sending as `from`.
pub(crate) fn twilio_provider(base: &str, timeout: Duration, from: &str) -> Arc<dyn Provider> {
    Arc::new(
        TwilioProvider::new(TwilioSettings {
            base_url: base.to_string(),
            account_sid: ACCOUNT.into(),
            auth_token: AUTH_TOKEN.into(),
            from: Some(from.into()),
            messaging_service_sid: None,
            status_callback: None,
            timeout,
            connect_timeout: Duration::from_secs(1),
        })
        .expect("twilio provider"),
    )
}

/// Twilio at the instance's mock, with the settings' provider timeout.
fn twilio_as(from: &'static str) -> ProviderFactory {
    Box::new(move |mock, _app, settings| {
        twilio_provider(mock, settings.delivery.provider_timeout, from)
    })
}

/// Options for another instance on `first`'s database and mock.
fn beside(first: &TestApp, settings: sendonce::config::Settings) -> TestOptions {
    TestOptions {
        settings,
        database: Some(first.database.clone()),
        mock: Some((first.mock.clone(), first.mock_url.clone())),
        api_key: Some(first.api_key.clone()),
        ..TestOptions::default()
    }
}

/// Test settings with a provider timeout of `timeout`, a lease of
/// `2 x timeout + 2 s` (the configuration's minimum), and the scheduler
/// scanning every 50 ms (`quiet`: never on its own).
fn timed(timeout: Duration, quiet: bool) -> sendonce::config::Settings {
    let mut s = test_settings();
    s.delivery.provider_timeout = timeout;
    s.delivery.lease = timeout * 2 + Duration::from_secs(2);
    if quiet {
        s.scheduler.poll_interval = Duration::from_secs(3600);
    }
    s
}

/// The message `key` once it is in `status`, waiting up to `limit`.
async fn final_within(
    app: &TestApp,
    key: &str,
    status: &str,
    limit: Duration,
) -> serde_json::Value {
    let path = format!("/messages/{key}");
    within(limit, &format!("{key} to be {status}"), || async {
        let a = app.get(&path).await;
        let m = a.json();
        assert!(
            !(m["status"] != status
                && ["sent", "failed", "unknown", "canceled"]
                    .contains(&m["status"].as_str().unwrap_or(""))),
            "{key} ended {} instead of {status}: {m}",
            m["status"]
        );
        (m["status"] == status).then_some(m)
    })
    .await
}

/// Waits until `mock` has finished every request it got (a request cut off
/// by its caller may still be creating a message): only then is counting
/// its messages a count of everything that reached the phone.
async fn settled(mock: &MockProvider) {
    within(
        Duration::from_secs(20),
        "the provider to finish its requests",
        || async { (mock.busy() == 0).then_some(()) },
    )
    .await;
}

async fn post_async(app: &TestApp, key: &str, body: &str) {
    let r = app
        .post_with(Some(key), &sms(TO, body), &[("prefer", "respond-async")])
        .await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.bytes));
}

/// Finding 1: a rolling deploy cut a Twilio call off at the end of the
/// grace period and released the lease at once; another instance claimed,
/// reconciled while Twilio was still creating the message, and sent again.
async fn a_graceful_shutdown_never_double_sends_through_twilio(backend: Backend) {
    let mut settings = timed(Duration::from_secs(2), true);
    settings.server.shutdown_grace = Duration::from_millis(200);
    let mut a = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..beside(&a, timed(Duration::from_secs(2), false))
    })
    .await;
    // Twilio takes 1.5 s to create it, whatever the caller does meanwhile.
    a.mock
        .push([Behaviour::Processing(Duration::from_millis(1500))]);
    post_async(&a, "DEPLOY", "Your order 1 shipped").await;
    within(Duration::from_secs(5), "the call at Twilio", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    a.stop().await;

    let m = final_within(&b, "DEPLOY", "sent", Duration::from_secs(20)).await;
    settled(&a.mock).await;
    assert_eq!(
        a.mock.deliveries_to(TO, "Your order 1 shipped"),
        1,
        "one message created at Twilio"
    );
    assert_eq!(m["provider_message_id"], a.mock.twilio_sids()[0].as_str());
}

/// Infobip at `base` with its idempotency declared (the instance resends
/// an open attempt under the same `messageId` instead of asking), calls
/// bounded by `timeout`. Its mock's idempotency stays off, so a second
/// send under the id is a second message there: counted, never hidden.
fn infobip_resending(base: &str, timeout: Duration) -> Arc<dyn Provider> {
    let settings = sendonce::provider::InfobipSettings {
        timeout,
        ..crate::infobip::settings(base, Some(Duration::from_secs(24 * 3600)))
    };
    Arc::new(sendonce::provider::InfobipProvider::new(settings).expect("infobip provider"))
}

/// Finding 2: after moving on to the next provider, the task waited for a
/// send slot longer than its lease, after its last lease check; another
/// instance took the message over and sent it, then the first sent too.
/// The next provider is one the instance that takes over resends through
/// at once (Infobip with its idempotency declared) at a mock that creates
/// a message per send: two there would be the first instance's send after
/// it lost the lease. (A provider whose lookup may lag, Twilio, would have
/// the taker ask again rather than resend, and hide the finding.)
async fn a_failover_checks_its_lease_after_waiting_for_a_send_slot(backend: Backend) {
    let timeout = Duration::from_secs(1);
    let (second, _, addr) = MockProvider::start().await.expect("second mock");
    let second_base = format!("http://{addr}");
    let mut settings = timed(timeout, true);
    settings.delivery.max_concurrent_sends = 1;
    // The primary's circuit stays closed, so the queued messages' calls
    // really hang there, one after the other.
    settings.provider.circuit.failures = 0;
    let mut other = timed(timeout, false);
    other.provider.circuit.failures = 0;
    let a = spawn_with(TestOptions {
        backend,
        settings,
        provider_timeout: timeout,
        fallbacks: vec![infobip_resending(&second_base, timeout)],
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        provider_timeout: timeout,
        fallbacks: vec![infobip_resending(&second_base, timeout)],
        ..beside(&a, other)
    })
    .await;
    // The primary (`http`) answers M's call only when told, with "not now";
    // six more messages queue for the one send slot meanwhile, each of
    // whose calls hangs for the whole timeout: M's wait for a slot after
    // it moves on to Infobip outlasts its 4 s lease.
    let gate = Arc::new(Notify::new());
    a.mock.push([Behaviour::After(
        gate.clone(),
        Box::new(Behaviour::Fail {
            status: 503,
            body: serde_json::json!({"message": "maintenance"}),
            retry_after: Some(1),
        }),
    )]);
    // (Retries of those calls hang too, on either instance: every call to
    // the primary from here on takes the whole timeout.)
    a.mock.push((0..40).map(|_| Behaviour::Hang));
    post_async(&a, "BROWNOUT", "Your order 2 shipped").await;
    within(Duration::from_secs(5), "M's call", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    for i in 0..6 {
        let r = a
            .post_with(
                Some(&format!("QUEUED-{i}")),
                &sms("+14155550199", &format!("queued {i}")),
                &[("prefer", "respond-async")],
            )
            .await;
        assert_eq!(r.status, 202);
    }
    within(
        Duration::from_secs(5),
        "six queued for the slot",
        || async { (a.handle.deliverer.queued() == 6).then_some(()) },
    )
    .await;
    gate.notify_one();

    final_within(&b, "BROWNOUT", "sent", Duration::from_secs(30)).await;
    // Until a's task for BROWNOUT has had its slot (behind the six) and
    // ended, it could still send.
    within(
        Duration::from_secs(30),
        "a's BROWNOUT task to end",
        || async { (a.handle.deliverer.in_flight() == 0).then_some(()) },
    )
    .await;
    settled(&second).await;
    assert_eq!(
        second.deliveries_to(TO, "Your order 2 shipped"),
        1,
        "one message created at the second provider"
    );
}

/// Finding 3: two keys to one number with one body a second apart; the
/// second's create timed out and Twilio never created it, the first's was
/// created at once but answered slowly. The second's reconciliation found
/// the first's message and took it (a plain "who owns this sid?" read, and
/// no unique constraint): both `sent` under one sid, one message sent.
/// Now the second never takes it, and (Twilio's list may lag, so nothing
/// of its own listed is no answer) never resends either: `unknown` at its
/// retry deadline, one message on the phone, the first's.
async fn a_reconciliation_never_takes_a_siblings_message(backend: Backend) {
    let mut settings = timed(Duration::from_secs(2), false);
    settings.delivery.retry.deadline = Duration::from_secs(12);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    let body = "Your order has shipped";
    // Key 2 first: never created, its call times out after 2 s, and 2 s
    // later (once Twilio could no longer be acting on it) it asks Twilio.
    // Key 1 is posted a second after key 2's timeout: created at once,
    // answered 1.8 s later, so its message is listed, without an owner,
    // when key 2 asks. (The second is a position in time, not a wait for
    // something to happen: key 1 must be mid-call at key 2's lookup.)
    app.mock.push([Behaviour::Hang]);
    post_async(&app, "ORDER-2", body).await;
    within(
        Duration::from_secs(10),
        "key 2's call to time out",
        || async { (app.mock.call_count() == 1 && app.mock.busy() == 0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    app.mock
        .push([Behaviour::AcceptThenDelay(Duration::from_millis(1800))]);
    post_async(&app, "ORDER-1", body).await;

    let first = final_within(&app, "ORDER-1", "sent", Duration::from_secs(20)).await;
    let second = final_within(&app, "ORDER-2", "unknown", Duration::from_secs(30)).await;
    assert!(
        second["provider_message_id"].is_null(),
        "one Twilio message belongs to one key: {second}"
    );
    assert_eq!(second["attempts"], 1, "key 2 was resent: {second}");
    assert_eq!(app.mock.deliveries_to(TO, body), 1, "key 1's message alone");
    let sids = app.mock.twilio_sids();
    let sid = first["provider_message_id"].as_str().unwrap_or_default();
    assert_eq!(sids, [sid.to_string()], "key 1's was created");
}

/// Found by the model (docs/model.md): a sibling that ended `unknown` owns
/// a message nobody learned the id of. Another key to the same number with
/// the same text, never created, must not take that message as its own
/// (`sent` for a message that is not on the phone): it cannot tell, so it
/// ends `unknown` too.
async fn an_unknown_siblings_message_is_never_taken(backend: Backend) {
    let mut settings = timed(Duration::from_secs(1), false);
    settings.delivery.retry.deadline = Duration::from_secs(6);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    let body = "Your parcel is on its way";
    // Key 1: created, then the connection drops, and the lookup fails:
    // `unknown`, its message on the phone under an id nobody knows.
    app.mock.push([Behaviour::AcceptThenDrop]);
    app.mock.fail_lookups(1);
    post_async(&app, "PARCEL-1", body).await;
    final_within(&app, "PARCEL-1", "unknown", Duration::from_secs(20)).await;
    // Key 2: never created (its call hangs); its lookup lists key 1's.
    app.mock.push([Behaviour::Hang]);
    post_async(&app, "PARCEL-2", body).await;
    // While it asks again later, its attempt open: cancel is refused (over
    // Twilio's wire format; a `canceled` could be false).
    within(
        Duration::from_secs(20),
        "key 2 to ask again later",
        || async {
            let m = app.get("/messages/PARCEL-2").await.json();
            (m["status"] == "processing" && m["error"]["code"] == "provider_ambiguous")
                .then_some(())
        },
    )
    .await;
    let cancel = app
        .request(reqwest::Method::POST, "/messages/PARCEL-2/cancel")
        .bearer_auth(&app.api_key)
        .send()
        .await
        .expect("cancel");
    let cancel = answer(cancel).await;
    assert_eq!(
        cancel.status,
        409,
        "{}",
        String::from_utf8_lossy(&cancel.bytes)
    );
    let m = within(Duration::from_secs(30), "key 2 to end", || async {
        let m = app.get("/messages/PARCEL-2").await.json();
        (m["status"] != "processing").then_some(m)
    })
    .await;
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(app.mock.deliveries_to(TO, body), 1);
}

/// Finding 4: after an ambiguous timeout, the retry under the same key
/// reached an IETF-draft provider still processing the first request; its
/// 409 ("still being processed") was taken as a rejection: `failed`, for a
/// message the provider then delivered.
async fn a_409_while_the_key_is_in_flight_is_not_a_failure(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        settings: timed(Duration::from_secs(1), false),
        provider_timeout: Duration::from_secs(1),
        ..TestOptions::default()
    })
    .await;
    app.mock.set_dedup(Dedup::Ietf);
    // The provider goes on with the first request for 3 s after our 1 s
    // timeout; retries meanwhile are answered 409 with Retry-After: 1.
    app.mock
        .push([Behaviour::Processing(Duration::from_secs(3))]);
    post_async(&app, "IN-FLIGHT", "Your code is 4711").await;
    let m = final_within(&app, "IN-FLIGHT", "sent", Duration::from_secs(20)).await;
    assert_eq!(app.mock.created(), 1);
    let history = app.get("/messages/IN-FLIGHT/attempts").await.json();
    let statuses: Vec<u64> = history["data"]
        .as_array()
        .expect("attempts")
        .iter()
        .filter_map(|a| a["http_status"].as_u64())
        .collect();
    assert!(statuses.contains(&409), "a 409 was answered: {history}");
    assert_eq!(m["provider_message_id"], "prov_1");
}

/// Finding 5: the database's clock stepped forward during a call (NTP, a
/// VM resume, a failover to a standby whose clock is ahead): the lease ran
/// out on it while the owner's call was in flight, and the owner's own
/// scheduler took the message over, reconciled at once and sent again.
/// Here the step is made by moving the lease's expiry back by 30 s, which
/// is what a +30 s step of the database's clock does to it.
async fn a_step_of_the_database_clock_never_hands_a_call_to_a_second_owner(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        settings: timed(Duration::from_secs(2), false),
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    app.mock
        .push([Behaviour::Processing(Duration::from_millis(1500))]);
    post_async(&app, "STEP", "Your order 5 shipped").await;
    within(Duration::from_secs(5), "the call at Twilio", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    let stepped = step_database_clock(&app, 30).await;
    assert_eq!(stepped, 1);

    let m = final_within(&app, "STEP", "sent", Duration::from_secs(20)).await;
    settled(&app.mock).await;
    assert_eq!(app.mock.deliveries_to(TO, "Your order 5 shipped"), 1);
    assert_eq!(m["provider_message_id"], app.mock.twilio_sids()[0].as_str());
}

/// Findings 1 and 5 together: an instance that took a message over (the
/// database's clock stepped) is waiting out the previous owner's call when
/// it is shut down. Releasing it then would let a third instance ask Twilio
/// at once, while that call may still be creating the message: it is held
/// like a call in flight.
async fn a_shutdown_during_a_takeover_wait_holds_the_message(backend: Backend) {
    let timeout = Duration::from_secs(2);
    let a = spawn_with(TestOptions {
        backend,
        settings: timed(timeout, true),
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    let mut quick_exit = timed(timeout, false);
    quick_exit.server.shutdown_grace = Duration::from_millis(200);
    let mut b = spawn_with(TestOptions {
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..beside(&a, quick_exit)
    })
    .await;
    a.mock
        .push([Behaviour::Processing(Duration::from_millis(1500))]);
    post_async(&a, "HANDOVER", "Your order 11 shipped").await;
    within(Duration::from_secs(5), "the call at Twilio", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    assert_eq!(step_database_clock(&a, 30).await, 1);
    within(Duration::from_secs(5), "b to take it over", || async {
        (b.handle.deliverer.in_flight() == 1).then_some(())
    })
    .await;
    b.stop().await;
    let c = spawn_with(TestOptions {
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..beside(&a, timed(timeout, false))
    })
    .await;

    let m = final_within(&c, "HANDOVER", "sent", Duration::from_secs(30)).await;
    settled(&a.mock).await;
    assert_eq!(a.mock.deliveries_to(TO, "Your order 11 shipped"), 1);
    assert_eq!(m["provider_message_id"], a.mock.twilio_sids()[0].as_str());
}

/// What a forward step of `secs` seconds of the database's clock does to
/// the leases of processing messages: each runs out that much earlier.
pub(crate) async fn step_database_clock(app: &TestApp, secs: i64) -> u64 {
    match &app.db {
        Db::Pg(p) => sqlx::query(
            "UPDATE messages SET lease_expires_at = lease_expires_at - $1 * interval '1 second' \
             WHERE lease_expires_at IS NOT NULL AND status = 'processing'",
        )
        .bind(secs)
        .execute(p)
        .await
        .expect("step")
        .rows_affected(),
        Db::Sqlite(p) => sqlx::query(
            "UPDATE messages SET lease_expires_at = lease_expires_at - ?1 * 1000000 \
             WHERE lease_expires_at IS NOT NULL AND status = 'processing'",
        )
        .bind(secs)
        .execute(p)
        .await
        .expect("step")
        .rows_affected(),
    }
}

/// Finding 7: the provider sent, then answered 500 with Retry-After: the
/// attempt was ambiguous and a retry scheduled, and cancel answered
/// `canceled` (replays too) for a message on the phone.
async fn cancel_refuses_a_message_that_may_have_been_sent(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.mock.set_dedup(Dedup::Ietf);
    app.mock.push([Behaviour::AcceptThenRetryLater {
        status: 500,
        retry_after: 120,
    }]);
    post_async(&app, "CANCEL-ME", "Your order 7 shipped").await;
    within(
        Duration::from_secs(10),
        "the retry to be scheduled",
        || async {
            let m = app.get("/messages/CANCEL-ME").await.json();
            m["next_attempt_at"].is_string().then_some(())
        },
    )
    .await;
    assert_eq!(app.mock.deliveries_to(TO, "Your order 7 shipped"), 1);
    let r = app
        .request(reqwest::Method::POST, "/messages/CANCEL-ME/cancel")
        .bearer_auth(&app.api_key)
        .send()
        .await
        .expect("cancel");
    let r = answer(r).await;
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.bytes));
    assert_eq!(r.slug(), "not-cancelable");
    let m = app.get("/messages/CANCEL-ME").await.json();
    assert_eq!(m["status"], "processing");
}

/// Finding 9: an instance configured with another `TWILIO_FROM` resumed a
/// crashed instance's message and matched Twilio's list on its own sender:
/// the first instance's message was not recognised, and it was sent again.
async fn a_rescue_under_another_twilio_from_matches_the_sender_used(backend: Backend) {
    let timeout = Duration::from_secs(1);
    let mut a = spawn_with(TestOptions {
        backend,
        settings: timed(timeout, true),
        provider: Some(twilio_as("+14155550001")),
        ..TestOptions::default()
    })
    .await;
    let b = spawn_with(TestOptions {
        provider: Some(twilio_as("+14155550002")),
        ..beside(&a, timed(timeout, false))
    })
    .await;
    app_push_created_then_silent(&a.mock);
    post_async(&a, "RESCUED", "Your order 9 shipped").await;
    within(Duration::from_secs(5), "a's call at Twilio", || async {
        (a.mock.call_count() == 1).then_some(())
    })
    .await;
    a.crash().await;

    let m = final_within(&b, "RESCUED", "sent", Duration::from_secs(20)).await;
    assert_eq!(a.mock.deliveries_to(TO, "Your order 9 shipped"), 1);
    assert_eq!(m["provider_message_id"], a.mock.twilio_sids()[0].as_str());
}

/// Twilio creates the message and never answers.
fn app_push_created_then_silent(mock: &MockProvider) {
    mock.push([Behaviour::AcceptThenHang]);
}

/// Finding 10: with the host's clock more than 5 s ahead of Twilio's, the
/// lookup window (the attempt's start on our clock, less 5 s) began after
/// the message Twilio had created: not found, sent again.
async fn a_host_clock_ahead_of_twilios_still_finds_the_message(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        settings: timed(Duration::from_secs(2), false),
        provider: Some(twilio_as(DEFAULT_FROM)),
        ..TestOptions::default()
    })
    .await;
    // Twilio's clock is 10 s behind this host's.
    app.mock
        .set_twilio_clock_offset(time::Duration::seconds(-10));
    app.mock.push([Behaviour::AcceptThenDrop]);
    post_async(&app, "SKEWED", "Your order 10 shipped").await;
    let m = final_within(&app, "SKEWED", "sent", Duration::from_secs(20)).await;
    assert_eq!(app.mock.deliveries_to(TO, "Your order 10 shipped"), 1);
    assert_eq!(m["provider_message_id"], app.mock.twilio_sids()[0].as_str());
}

/// Finding 8: a verification's first send got a 429; the service came back
/// with another `SENDONCE_VERIFY_SECRET`; the sealed body would not open on
/// resume, which was taken for "the database is away": nothing was written,
/// and the message was claimed again every lease, `processing` forever.
async fn a_sealed_body_that_cannot_be_opened_ends_instead_of_sticking(backend: Backend) {
    let mut first = timed(Duration::from_secs(1), true);
    first.verify.secret = Some(sendonce::config::VerifySecret(vec![1; 32]));
    let mut a = spawn_with(TestOptions {
        backend,
        settings: first,
        provider_timeout: Duration::from_secs(1),
        ..TestOptions::default()
    })
    .await;
    a.mock.push([Behaviour::Fail {
        status: 429,
        body: serde_json::json!({"message": "slow down"}),
        retry_after: Some(1),
    }]);
    let started = a
        .request(reqwest::Method::POST, "/verifications")
        .bearer_auth(&a.api_key)
        .header("Idempotency-Key", "SEALED-1")
        .json(&serde_json::json!({ "to": TO }))
        .send()
        .await
        .expect("POST /verifications");
    let started = answer(started).await;
    assert_eq!(
        started.status,
        201,
        "{}",
        String::from_utf8_lossy(&started.bytes)
    );
    let id = started.json()["id"].as_str().expect("id").to_string();
    within(
        Duration::from_secs(10),
        "the 429 retry to be scheduled",
        || async { (a.mock.call_count() == 1).then_some(()) },
    )
    .await;
    a.crash().await;

    // Back with another secret: the code sealed under the first cannot be
    // opened, ever. The message ends (never sent: `failed`), and says why.
    let mut second = timed(Duration::from_secs(1), false);
    second.verify.secret = Some(sendonce::config::VerifySecret(vec![2; 32]));
    let b = spawn_with(TestOptions {
        provider_timeout: Duration::from_secs(1),
        ..beside(&a, second)
    })
    .await;
    let m = within(Duration::from_secs(20), "the message to end", || async {
        let v = b.get(&format!("/verifications/{id}")).await.json();
        let m = v["messages"][0].clone();
        (m["status"] != "processing").then_some(m)
    })
    .await;
    assert_eq!(m["status"], "failed", "{m}");
    assert_eq!(a.mock.call_count(), 1, "nothing more reached the provider");
    let key = m["idempotency_key"].as_str().expect("key");
    let full = b.get(&format!("/messages/{key}")).await.json();
    assert_eq!(full["error"]["code"], "unsendable", "{full}");
}

on_both_backends!(
    an_unknown_siblings_message_is_never_taken,
    a_shutdown_during_a_takeover_wait_holds_the_message,
    a_sealed_body_that_cannot_be_opened_ends_instead_of_sticking,
    a_graceful_shutdown_never_double_sends_through_twilio,
    a_failover_checks_its_lease_after_waiting_for_a_send_slot,
    a_reconciliation_never_takes_a_siblings_message,
    a_409_while_the_key_is_in_flight_is_not_a_failure,
    a_step_of_the_database_clock_never_hands_a_call_to_a_second_owner,
    cancel_refuses_a_message_that_may_have_been_sent,
    a_rescue_under_another_twilio_from_matches_the_sender_used,
    a_host_clock_ahead_of_twilios_still_finds_the_message,
);
