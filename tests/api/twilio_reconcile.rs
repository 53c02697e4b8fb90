//! Twilio reconciliation through the real adapter: a message Twilio created
//! but has not handed to the carrier yet (`queued`, `date_sent` null) is
//! found, never resent; nobody else's message is ever taken for ours, and
//! nothing of ours listed is asked again, never resent (Twilio documents no
//! bound on how soon its list shows a message); the lookup's paging,
//! addresses and answer sizes are bounded.
//!
//! End to end (both backends) where the outcome is the service's; against
//! the adapter directly where it is the adapter's answer. A stand-in server
//! (`stub`) plays a Twilio that answers what the mock never would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode, header};
use sendonce::domain::MessageId;
use sendonce::provider::twilio::{LIST_PAGE_SIZE, MAX_LOOKUP_PAGES};
use sendonce::provider::{
    HttpProvider, OutgoingSms, Provider, Reconciled, SendOutcome, TwilioProvider, TwilioSettings,
};
use serde_json::json;
use testkit::mock_provider::{Behaviour, MockProvider};
use time::OffsetDateTime;

use crate::helpers::*;
use crate::twilio::{ACCOUNT, AUTH_TOKEN, DEFAULT_FROM, twilio};

const TO: &str = "+14155550100";
const SERVICE_1: &str = "MG11111111111111111111111111111111";
const SERVICE_2: &str = "MG22222222222222222222222222222222";

fn settings_at(base: &str) -> TwilioSettings {
    TwilioSettings {
        base_url: base.to_string(),
        account_sid: ACCOUNT.into(),
        auth_token: AUTH_TOKEN.into(),
        from: Some(DEFAULT_FROM.into()),
        messaging_service_sid: None,
        status_callback: None,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
    }
}

fn provider(base: &str, edit: impl FnOnce(&mut TwilioSettings)) -> TwilioProvider {
    let mut s = settings_at(base);
    edit(&mut s);
    TwilioProvider::new(s).unwrap()
}

fn outgoing(body: &str, from: Option<&str>) -> OutgoingSms {
    OutgoingSms {
        message_id: MessageId::new(),
        to: sendonce::domain::Recipient::from_stored(TO, &[]).expect("E.164"),
        from: from.map(str::to_string),
        body: body.into(),
        validity: None,
        attempt: 1,
        prepared: None,
    }
}

/// A mock and its base URL (`http://host:port`).
async fn mock() -> (MockProvider, String) {
    let (mock, url, _) = MockProvider::start().await.unwrap();
    (mock, url.trim_end_matches("/messages").to_string())
}

async fn sent(p: &TwilioProvider, sms: &OutgoingSms) -> String {
    match p.send(sms).await {
        SendOutcome::Accepted {
            provider_message_id,
            ..
        } => provider_message_id,
        other => panic!("{other:?}"),
    }
}

/// A moment before anything the test is about to send.
fn attempt_start() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// The mock's Twilio list, as Twilio's client would read it.
async fn mock_list(base: &str, query: &[(&str, &str)]) -> serde_json::Value {
    let url = reqwest::Url::parse_with_params(
        &format!("{base}/2010-04-01/Accounts/{ACCOUNT}/Messages.json"),
        query,
    )
    .unwrap();
    reqwest::Client::new()
        .get(url)
        .basic_auth(ACCOUNT, Some(AUTH_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// What the stand-in answers: (status, JSON body) for the n-th call
/// (from 0) with this method.
type Answerer = Arc<dyn Fn(&Method, usize) -> (u16, String) + Send + Sync>;

/// A stand-in HTTP server: every request gets `answer`'s answer. Returns its
/// base URL, the number of requests and their `Authorization` headers.
async fn stub(answer: Answerer) -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let auths = Arc::new(Mutex::new(Vec::new()));
    let (c, a) = (calls.clone(), auths.clone());
    let app = axum::Router::new().fallback(move |method: Method, headers: HeaderMap| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        if let Some(v) = headers.get(header::AUTHORIZATION) {
            a.lock()
                .unwrap()
                .push(v.to_str().unwrap_or_default().to_string());
        }
        let (status, body) = answer(&method, n);
        async move {
            (
                StatusCode::from_u16(status).unwrap(),
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, calls, auths)
}

/// A list page with one message to `TO` created now that is not ours.
fn page_of_someone_elses(next_page_uri: Option<String>) -> String {
    let now = OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc2822)
        .unwrap();
    json!({
        "messages": [{
            "sid": "SM00000000000000000000000000000001",
            "to": TO,
            "from": DEFAULT_FROM,
            "body": "someone else's",
            "direction": "outbound-api",
            "status": "queued",
            "date_created": now,
            "date_sent": null,
        }],
        "next_page_uri": next_page_uri,
    })
    .to_string()
}

fn list_path() -> String {
    format!("/2010-04-01/Accounts/{ACCOUNT}/Messages.json")
}

// (a) ----------------------------------------------------------------------

async fn an_accepted_message_still_queued_is_found_and_not_resent(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(twilio()),
        ..TestOptions::default()
    })
    .await;
    let base = app.mock_url.trim_end_matches("/messages").to_string();
    for (key, behaviour) in [
        ("QUEUED-500", Behaviour::AcceptThenFail { status: 500 }),
        ("QUEUED-DROP", Behaviour::AcceptThenDrop),
    ] {
        let body = format!("Your order {key} shipped");
        app.mock.push([behaviour]);
        let lookups = app.mock.stats().lookups;
        let m = app.post(key, &sms(TO, &body)).await.json();
        assert_eq!(app.mock.stats().lookups, lookups + 1, "{key}");
        assert_eq!(m["status"], "sent", "{key}: {m}");
        assert_eq!(m["attempts"], 1, "{key}: found, not resent");
        assert_eq!(app.mock.deliveries_to(TO, &body), 1, "{key}");
        let sid = app.mock.twilio_sids().last().cloned().unwrap();
        assert_eq!(m["provider_message_id"], sid.as_str(), "{key}");
        // ... while Twilio still has it queued, not sent.
        let listed = mock_list(&base, &[("To", TO)]).await;
        let it = listed["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["sid"] == sid.as_str())
            .cloned()
            .unwrap();
        assert_eq!(it["status"], "queued");
        assert!(it["date_sent"].is_null());
    }
    assert_eq!(app.mock.twilio_sids().len(), 2, "one create per message");
}

// (b) ----------------------------------------------------------------------

/// Tenant A sends `a_body` (sent, then handed to the carrier, so any lookup
/// lists it); then tenant B, sharing A's database, mock and Twilio account,
/// sends `b_body` to the same number, and B's first create fails with a 500
/// that created nothing. Returns A's instance, A's sid and B's message once
/// B's first lookup was made.
async fn tenant_b_after_tenant_a(
    backend: Backend,
    a_body: &str,
    b_body: &str,
) -> (TestApp, String, serde_json::Value) {
    let a = spawn_with(TestOptions {
        backend,
        provider: Some(twilio()),
        ..TestOptions::default()
    })
    .await;
    let first = a.post("A-1", &sms(TO, a_body)).await.json();
    assert_eq!(first["status"], "sent");
    let a_sid = first["provider_message_id"].as_str().unwrap().to_string();
    a.mock.twilio_hand_over();

    let b = spawn_with(TestOptions {
        backend,
        database: Some(a.database.clone()),
        mock: Some((a.mock.clone(), a.mock_url.clone())),
        provider: Some(twilio()),
        ..TestOptions::default()
    })
    .await;
    assert_ne!(a.tenant, b.tenant);
    a.mock.push([Behaviour::Fail {
        status: 500,
        body: json!({"code": 20500, "message": "Internal Server Error"}),
        retry_after: None,
    }]);
    let lookups = a.mock.stats().lookups;
    b.post_with(
        Some("B-1"),
        &sms(TO, b_body),
        &[("prefer", "respond-async")],
    )
    .await;
    eventually("B's lookup", || async {
        (a.mock.stats().lookups > lookups).then_some(())
    })
    .await;
    let m = b.get("/messages/B-1").await.json();
    assert_ne!(
        m["provider_message_id"],
        a_sid.as_str(),
        "tenant A's message taken for B's: {m}"
    );
    (a, a_sid, m)
}

/// B's message after its lookup: not sent under anyone's sid, not resent
/// (nothing of B's was listed, which on a list that may lag is no answer
/// yet: asked again, `unknown` at the retry deadline).
fn asked_again(m: &serde_json::Value) {
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(m["attempts"], 1, "B was resent: {m}");
    assert!(m["provider_message_id"].is_null(), "{m}");
}

async fn another_tenants_message_ending_in_ours_is_not_taken_for_it(backend: Backend) {
    // B's body is one A's ends with.
    let (a, _, m) = tenant_b_after_tenant_a(backend, "Your code is 123456", "123456").await;
    asked_again(&m);
    assert_eq!(a.mock.deliveries_to(TO, "123456"), 0);
    assert_eq!(a.mock.deliveries_to(TO, "Your code is 123456"), 1);
}

// Never a provider message id another message already owns --------------

async fn a_sid_another_message_owns_is_never_ours(backend: Backend) {
    // The very same text from the same sender: the lookup lists exactly one
    // candidate, and it is A's, which A's message already holds.
    let body = "Your code is 654321";
    let (a, _, m) = tenant_b_after_tenant_a(backend, body, body).await;
    asked_again(&m);
    assert_eq!(a.mock.deliveries_to(TO, body), 1, "A's message is not B's");
}

on_both_backends!(
    an_accepted_message_still_queued_is_found_and_not_resent,
    another_tenants_message_ending_in_ours_is_not_taken_for_it,
    a_sid_another_message_owns_is_never_ours,
);

// (c) ----------------------------------------------------------------------

#[tokio::test]
async fn a_message_from_another_sender_is_not_ours() {
    let (mock, base) = mock().await;
    let ours = provider(&base, |_| {});
    let since = attempt_start();

    // Another configured number sent the same body.
    let other_number = provider(&base, |s| s.from = Some("+14155559999".into()));
    sent(&other_number, &outgoing("Your code is 111", None)).await;
    // A request that named its own sender.
    let acme = sent(&ours, &outgoing("Your code is 222", Some("ACME"))).await;
    // Other messaging services.
    let service_1 = provider(&base, |s| {
        s.from = None;
        s.messaging_service_sid = Some(SERVICE_1.into());
    });
    let service_2 = provider(&base, |s| {
        s.from = None;
        s.messaging_service_sid = Some(SERVICE_2.into());
    });
    let by_service_1 = sent(&service_1, &outgoing("Your code is 333", None)).await;
    mock.twilio_hand_over();

    let r = |p: &TwilioProvider, body: &str, from: Option<&str>| {
        let sms = outgoing(body, from);
        let p = p.clone();
        async move { p.reconcile(&sms, &attempt_at(since)).await }
    };
    // Nothing of ours listed: not known yet (Twilio's list may lag), never
    // "not sent".
    let nothing_yet = |r: Reconciled| matches!(r, Reconciled::Pending(_));
    assert!(nothing_yet(r(&ours, "Your code is 111", None).await));
    assert!(nothing_yet(r(&ours, "Your code is 222", None).await));
    assert_eq!(
        r(&ours, "Your code is 222", Some("ACME")).await,
        Reconciled::Sent {
            provider_message_id: acme
        }
    );
    assert!(nothing_yet(r(&service_2, "Your code is 333", None).await));
    assert!(nothing_yet(r(&ours, "Your code is 333", None).await));
    assert_eq!(
        r(&service_1, "Your code is 333", None).await,
        Reconciled::Sent {
            provider_message_id: by_service_1
        }
    );
}

// (d) ----------------------------------------------------------------------

#[tokio::test]
async fn two_candidates_are_unknown_not_a_guess() {
    let (_mock, base) = mock().await;
    let p = provider(&base, |_| {});
    let since = attempt_start();
    let sms = outgoing("Your code is 4321", None);
    let first = sent(&p, &sms).await;
    let second = sent(&p, &sms).await;
    match p.reconcile(&sms, &attempt_at(since)).await {
        Reconciled::Unknown(reason) => {
            assert!(
                reason.contains(&first) && reason.contains(&second),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}

// (e) ----------------------------------------------------------------------

#[tokio::test]
async fn a_next_page_at_another_host_is_not_followed() {
    // Whoever listens elsewhere records what reaches it.
    let (elsewhere, contacted, stolen) =
        stub(Arc::new(|_, _| (200, page_of_someone_elses(None)))).await;
    let host = elsewhere.trim_start_matches("http://").to_string();
    for next in [
        format!("{elsewhere}{}?Page=1", list_path()),
        format!("//{host}{}?Page=1", list_path()),
        format!("/\\{host}{}?Page=1", list_path()),
    ] {
        let page = page_of_someone_elses(Some(next.clone()));
        let (base, calls, _) = stub(Arc::new(move |_, _| (200, page.clone()))).await;
        let p = provider(&base, |_| {});
        let r = p
            .reconcile(
                &outgoing("Your code is 5555", None),
                &attempt_at(attempt_start()),
            )
            .await;
        assert!(matches!(r, Reconciled::Unknown(_)), "{next}: {r:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{next}");
    }
    assert_eq!(contacted.load(Ordering::SeqCst), 0, "{:?}", stolen.lock());
}

// (f) ----------------------------------------------------------------------

#[tokio::test]
async fn paging_stops_once_messages_are_older_than_the_window() {
    let (mock, base) = mock().await;
    let p = provider(&base, |_| {});
    let old = LIST_PAGE_SIZE + LIST_PAGE_SIZE / 2;
    for i in 0..old {
        sent(&p, &outgoing(&format!("old {i}"), None)).await;
    }
    mock.twilio_backdate(Duration::from_secs(3600));
    let since = attempt_start();
    let target = sent(&p, &outgoing("Your code is 8080", None)).await;
    let newer = LIST_PAGE_SIZE + LIST_PAGE_SIZE / 5;
    for i in 0..newer {
        sent(&p, &outgoing(&format!("new {i}"), None)).await;
    }
    // Newest first: page 1 is newer messages, page 2 holds ours and the
    // first old ones; page 3 (old messages only) is never asked for.
    let before = mock.stats().lookups;
    assert_eq!(
        p.reconcile(&outgoing("Your code is 8080", None), &attempt_at(since))
            .await,
        Reconciled::Sent {
            provider_message_id: target
        }
    );
    assert_eq!(mock.stats().lookups - before, 2);
    let before = mock.stats().lookups;
    assert!(matches!(
        p.reconcile(&outgoing("Your code is 9090", None), &attempt_at(since))
            .await,
        Reconciled::Pending(_)
    ));
    assert_eq!(mock.stats().lookups - before, 2);
}

#[tokio::test]
async fn endless_pages_within_the_window_are_unknown() {
    let next = format!("{}?Page=1", list_path());
    let (base, calls, auths) = stub(Arc::new(move |_, _| {
        (200, page_of_someone_elses(Some(next.clone())))
    }))
    .await;
    let p = provider(&base, |_| {});
    let r = p
        .reconcile(
            &outgoing("Your code is 1", None),
            &attempt_at(attempt_start()),
        )
        .await;
    assert!(matches!(r, Reconciled::Unknown(_)), "{r:?}");
    assert_eq!(calls.load(Ordering::SeqCst), MAX_LOOKUP_PAGES);
    assert_eq!(auths.lock().unwrap().len(), MAX_LOOKUP_PAGES);
}

// (g) ----------------------------------------------------------------------

#[tokio::test]
async fn oversized_answers_are_not_read() {
    // A list page of 3 MB.
    let huge = json!({
        "messages": [{"sid": "SM1", "to": TO, "body": "x".repeat(3 << 20)}],
        "next_page_uri": null,
    })
    .to_string();
    let (base, _, _) = stub(Arc::new(move |_, _| (200, huge.clone()))).await;
    let p = provider(&base, |_| {});
    match p
        .reconcile(
            &outgoing("Your code is 2", None),
            &attempt_at(attempt_start()),
        )
        .await
    {
        Reconciled::Unknown(reason) => assert!(reason.contains("larger"), "{reason}"),
        other => panic!("{other:?}"),
    }

    // A 201 of 100 KB: it may have created the message, so ambiguous.
    let big = json!({"sid": "SM1", "padding": "x".repeat(100 << 10)}).to_string();
    let (base, _, _) = stub(Arc::new(move |_, _| (201, big.clone()))).await;
    let outcome = provider(&base, |_| {}).send(&outgoing("hi", None)).await;
    assert!(
        matches!(&outcome, SendOutcome::Ambiguous { message, .. } if message.contains("larger")),
        "{outcome:?}"
    );

    // A refusal with a 5000-character message: kept, cut.
    let long = json!({"code": 21211, "message": "m".repeat(5000)}).to_string();
    let (base, _, _) = stub(Arc::new(move |_, _| (400, long.clone()))).await;
    match provider(&base, |_| {}).send(&outgoing("hi", None)).await {
        SendOutcome::Rejected { message, .. } => {
            assert_eq!(
                message.chars().count(),
                sendonce::provider::MAX_ERROR_TEXT + 1
            );
            assert!(message.ends_with('…'));
        }
        other => panic!("{other:?}"),
    }

    // The `http` provider reads its answers the same way.
    let big = json!({"id": "p1", "padding": "x".repeat(100 << 10)}).to_string();
    let (base, _, _) = stub(Arc::new(move |_, _| (200, big.clone()))).await;
    let http = HttpProvider::new(
        &format!("{base}/messages"),
        None,
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .unwrap();
    let outcome = http.send(&outgoing("hi", None)).await;
    assert!(
        matches!(&outcome, SendOutcome::Ambiguous { message, .. } if message.contains("larger")),
        "{outcome:?}"
    );
}

// The mock ------------------------------------------------------------------

#[tokio::test]
async fn the_mock_lists_like_twilio() {
    let (mock, base) = mock().await;
    let p = provider(&base, |_| {});
    let first = sent(&p, &outgoing("one", None)).await;
    let second = sent(&p, &outgoing("two", None)).await;
    let all = mock_list(&base, &[("To", TO)]).await;
    let sids: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["sid"].as_str().unwrap())
        .collect();
    assert_eq!(sids, [second.as_str(), first.as_str()], "newest first");
    for m in all["messages"].as_array().unwrap() {
        assert_eq!(m["status"], "queued");
        assert!(m["date_sent"].is_null());
    }
    // `DateSent>` matches only messages already sent.
    let after = [("To", TO), ("DateSent>", "2000-01-01")];
    let none = mock_list(&base, &after).await;
    assert_eq!(none["messages"].as_array().unwrap().len(), 0);
    mock.twilio_hand_over();
    let both = mock_list(&base, &after).await;
    assert_eq!(both["messages"].as_array().unwrap().len(), 2);
    assert_eq!(both["messages"][0]["status"], "sent");
    assert!(both["messages"][0]["date_sent"].is_string());
}
