//! The Twilio adapter against the mock's Twilio endpoint, class by class, and
//! against Stoplight Prism serving Twilio's own OpenAPI description.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use sendonce::domain::MessageId;
use sendonce::provider::{
    OutgoingSms, Provider, Reconciled, SendOutcome, TwilioProvider, TwilioSettings,
};
use serde_json::json;
use testkit::mock_provider::{Behaviour, Dedup};

use crate::helpers::*;

pub const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";
pub const AUTH_TOKEN: &str = "twilio-test-auth-token";
pub const DEFAULT_FROM: &str = "+14155550000";

pub(crate) fn settings(base_url: &str, status_callback: Option<String>) -> TwilioSettings {
    TwilioSettings {
        base_url: base_url.to_string(),
        account_sid: ACCOUNT.into(),
        auth_token: AUTH_TOKEN.into(),
        from: Some(DEFAULT_FROM.into()),
        messaging_service_sid: None,
        status_callback,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
    }
}

/// The Twilio provider aimed at the mock, with this instance's public URL as
/// the receipt address and the auth token to check signatures with.
pub fn twilio() -> ProviderFactory {
    twilio_at(None)
}

/// Same, aimed at `base_url` instead of the mock when given.
fn twilio_at(base_url: Option<String>) -> ProviderFactory {
    Box::new(move |mock, app, settings_| {
        settings_.provider.receipts = sendonce::provider::registry::ReceiptRoutes::from_pairs([(
            "TWILIO_AUTH_TOKEN",
            AUTH_TOKEN,
        )])
        .unwrap();
        settings_.server.public_url = Some(app.to_string());
        let s = settings(
            base_url.as_deref().unwrap_or(mock),
            Some(format!("{app}/providers/twilio/status")),
        );
        Arc::new(TwilioProvider::new(s).expect("twilio provider"))
    })
}

pub async fn spawn_twilio(backend: Backend) -> TestApp {
    spawn_with(TestOptions {
        backend,
        provider: Some(twilio()),
        ..TestOptions::default()
    })
    .await
}

/// A scripted Twilio error answer.
fn twilio_error(status: u16, code: u32, message: &str) -> Behaviour {
    Behaviour::Fail {
        status,
        body: json!({
            "code": code,
            "message": message,
            "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
            "status": status,
        }),
        retry_after: None,
    }
}

fn twilio_calls(app: &TestApp) -> Vec<serde_json::Value> {
    app.mock
        .calls()
        .into_iter()
        .filter(|c| c.endpoint == "twilio")
        .map(|c| c.body)
        .collect()
}

async fn sends_form_encoded_with_basic_auth_and_keeps_the_sid(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.allow_sender("ACME").await;
    let mut body = sms("+14155550100", "Your order 92831 is confirmed.");
    body["from"] = json!("ACME");
    body["validity_seconds"] = json!(300);
    let a = app.post("ORDER-92831", &body).await;
    assert_eq!(a.status, 201);
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["provider"], "twilio");
    let sid = m["provider_message_id"].as_str().expect("sid");
    assert!(sid.starts_with("SM") && sid.len() == 34, "{sid}");

    let calls = app.mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].endpoint, "twilio");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{ACCOUNT}:{AUTH_TOKEN}"));
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Basic {basic}").as_str())
    );
    let form = &calls[0].body;
    assert_eq!(form["To"], "+14155550100");
    assert_eq!(form["Body"], "Your order 92831 is confirmed.");
    assert_eq!(form["From"], "ACME");
    let validity: u32 = form["ValidityPeriod"].as_str().unwrap().parse().unwrap();
    assert!((1..=300).contains(&validity), "{validity}");
    assert_eq!(
        form["StatusCallback"],
        format!("{}/providers/twilio/status", app.base)
    );
    assert!(form.get("MessagingServiceSid").is_none());

    // No `from` in the request: TWILIO_FROM; no validity: no ValidityPeriod.
    let a = app
        .post("ORDER-92832", &sms("+14155550100", "Order 92832."))
        .await;
    assert_eq!(a.json()["status"], "sent");
    let form = &twilio_calls(&app)[1];
    assert_eq!(form["From"], DEFAULT_FROM);
    assert!(form.get("ValidityPeriod").is_none());
    assert_eq!(app.mock.stats().duplicate_recipient_bodies, 0);
}

async fn permanent_errors_fail_at_once_with_twilios_code(backend: Backend) {
    let app = spawn_twilio(backend).await;
    for (code, text) in [
        (21211, "The 'To' number is not a valid phone number."),
        (21610, "Attempt to send to unsubscribed recipient"),
        (
            21408,
            "Permission to send an SMS has not been enabled for the region",
        ),
        (21614, "'To' number is not a valid mobile number"),
    ] {
        app.mock.push([twilio_error(400, code, text)]);
        let key = format!("PERM-{code}");
        let a = app.post(&key, &sms("+14155550100", "hi")).await;
        assert_eq!(a.status, 201);
        let m = a.json();
        assert_eq!(m["status"], "failed", "{code}");
        assert_eq!(m["attempts"], 1);
        assert_eq!(m["error"]["code"], "provider_rejected");
        assert_eq!(m["error"]["provider_code"], code.to_string());
        let message = m["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(text), "{message}");
        assert!(message.contains(&format!("errors/{code}")), "{message}");
        let attempts = app.get(&format!("/messages/{key}/attempts")).await.json();
        assert_eq!(attempts["data"][0]["outcome"], "rejected");
        assert_eq!(attempts["data"][0]["http_status"], 400);
    }
    assert_eq!(app.mock.call_count(), 4, "one call each, no retry");
    assert_eq!(app.mock.stats().lookups, 0, "a refusal needs no lookup");
}

async fn rate_limits_are_retried(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.mock.push([
        twilio_error(429, 20429, "Too Many Requests"),
        twilio_error(400, 20429, "Too Many Requests"),
    ]);
    let a = app.post("RATE", &sms("+14155550100", "hi")).await;
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 3);
    let attempts = app.get("/messages/RATE/attempts").await.json();
    assert_eq!(attempts["data"][0]["outcome"], "retryable");
    assert_eq!(attempts["data"][0]["provider_code"], "20429");
    assert_eq!(attempts["data"][1]["outcome"], "retryable");
    assert_eq!(app.mock.deliveries_to("+14155550100", "hi"), 1);
    assert_eq!(app.mock.stats().lookups, 0);
}

async fn connection_failures_are_retried_and_end_failed(backend: Backend) {
    // A port nobody listens on: every attempt fails before anything is sent.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(twilio_at(Some(format!("http://{closed}")))),
        ..TestOptions::default()
    })
    .await;
    let a = app.post("NOWHERE", &sms("+14155550100", "hi")).await;
    let m = a.json();
    assert_eq!(m["status"], "failed", "never sent, so certainly not sent");
    assert_eq!(m["attempts"], 5);
    assert_eq!(m["error"]["code"], "retries_exhausted");
}

async fn timeout_after_accept_reconciles_and_sends_once(backend: Backend) {
    let mut settings = test_settings();
    settings.delivery.provider_timeout = Duration::from_millis(400);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(twilio()),
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::AcceptThenHang]);
    let a = app
        .post("HANG", &sms("+14155550100", "Your code is 1234"))
        .await;
    let m = a.json();
    assert_eq!(m["status"], "sent", "{m}");
    assert_eq!(m["attempts"], 1, "found by the lookup, not resent");
    let sid = m["provider_message_id"].as_str().unwrap();
    assert!(sid.starts_with("SM"));
    assert_eq!(
        app.mock.deliveries_to("+14155550100", "Your code is 1234"),
        1
    );
    assert_eq!(twilio_calls(&app).len(), 1);
    assert_eq!(app.mock.stats().lookups, 1);
}

async fn a_dropped_connection_after_accept_reconciles_and_sends_once(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.mock.push([Behaviour::AcceptThenDrop]);
    let a = app
        .post("DROP", &sms("+14155550100", "Order 7 shipped"))
        .await;
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(app.mock.deliveries_to("+14155550100", "Order 7 shipped"), 1);
    assert_eq!(twilio_calls(&app).len(), 1);
    // The same body to the same number under another key is another message.
    let a = app
        .post("DROP-2", &sms("+14155550100", "Order 7 shipped"))
        .await;
    assert_eq!(a.json()["status"], "sent");
    assert_eq!(app.mock.deliveries_to("+14155550100", "Order 7 shipped"), 2);
}

/// A 500 that created nothing: the list shows nothing, which is no answer
/// (Twilio documents no bound on how soon it lists a message), so it is
/// asked again, never resent (and ends `unknown` at the retry deadline).
async fn a_500_that_sent_nothing_is_never_resent(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.mock
        .push([twilio_error(500, 20500, "Internal Server Error")]);
    let a = app
        .post_with(
            Some("FIVE"),
            &sms("+14155550100", "hello"),
            &[("prefer", "respond-async")],
        )
        .await;
    assert_eq!(a.status, 202);
    eventually("three lookups", || async {
        (app.mock.stats().lookups >= 3).then_some(())
    })
    .await;
    let m = app.get("/messages/FIVE").await.json();
    assert_eq!(m["status"], "processing", "{m}");
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["error"]["code"], "provider_ambiguous", "{m}");
    assert_eq!(app.mock.deliveries_to("+14155550100", "hello"), 0);
    assert_eq!(twilio_calls(&app).len(), 1, "never resent");
    let attempts = app.get("/messages/FIVE/attempts").await.json();
    assert_eq!(
        attempts["data"].as_array().map(Vec::len),
        Some(1),
        "{attempts}"
    );
}

async fn a_500_after_sending_is_found_and_not_resent(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.mock.push([Behaviour::AcceptThenFail { status: 500 }]);
    let a = app.post("SENT-500", &sms("+14155550100", "hello")).await;
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 1);
    assert_eq!(app.mock.deliveries_to("+14155550100", "hello"), 1);
}

async fn a_failed_lookup_ends_unknown_and_never_resends(backend: Backend) {
    let app = spawn_twilio(backend).await;
    app.mock.push([Behaviour::AcceptThenFail { status: 502 }]);
    app.mock.fail_lookups(1);
    let a = app.post("LOST", &sms("+14155550100", "hello")).await;
    let m = a.json();
    assert_eq!(m["status"], "unknown", "{m}");
    assert_eq!(m["error"]["code"], "outcome_unknown");
    assert_eq!(twilio_calls(&app).len(), 1, "never resent");
    assert_eq!(app.mock.deliveries_to("+14155550100", "hello"), 1);
}

async fn timeout_after_accept_with_http_resends_the_same_key_and_delivers_once(backend: Backend) {
    let mut settings = test_settings();
    settings.delivery.provider_timeout = Duration::from_millis(400);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider_timeout: Duration::from_millis(400),
        ..TestOptions::default()
    })
    .await;
    // The `http` contract: the bridge de-duplicates on Idempotency-Key.
    app.mock.set_dedup(Dedup::Ietf);
    app.mock.push([Behaviour::AcceptThenHang]);
    let a = app.post("HTTP-HANG", &sms("+14155550100", "hi")).await;
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 2);
    let calls = app.mock.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    let key = calls[0].idempotency_key.clone().unwrap();
    assert_eq!(app.mock.deliveries_for(&key), 1);
    assert_eq!(app.mock.deliveries_to("+14155550100", "hi"), 1);
}

on_both_backends!(
    sends_form_encoded_with_basic_auth_and_keeps_the_sid,
    permanent_errors_fail_at_once_with_twilios_code,
    rate_limits_are_retried,
    connection_failures_are_retried_and_end_failed,
    timeout_after_accept_reconciles_and_sends_once,
    a_dropped_connection_after_accept_reconciles_and_sends_once,
    a_500_that_sent_nothing_is_never_resent,
    a_500_after_sending_is_found_and_not_resent,
    a_failed_lookup_ends_unknown_and_never_resends,
    timeout_after_accept_with_http_resends_the_same_key_and_delivers_once,
);

/// Prism serving Twilio's OpenAPI description validates every request the
/// adapter makes: a request Twilio would refuse as malformed fails here.
#[tokio::test]
async fn prism_accepts_the_adapters_requests() {
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("SENDONCE_REQUIRE_PRISM").is_none(),
            "SENDONCE_REQUIRE_PRISM is set but Node.js is not installed"
        );
        eprintln!(
            "\n\n******** SKIPPED: the Twilio contract test (Prism) needs Node.js, \
             which is not installed. Install nodejs and npm to run it. ********\n\n"
        );
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let mut prism = tokio::process::Command::new(format!("{root}/scripts/prism.sh"))
        .arg("mock")
        .arg(port.to_string())
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start scripts/prism.sh");
    // Installing (first run) and loading a 1.5 MB description take a while,
    // and Prism may accept connections before it answers quickly: ready is
    // its first HTTP answer (to a request without credentials), with time
    // to spare, so the adapter's own short timeouts below meet a warm server.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    sendonce::install_crypto_provider();
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let probe_url = format!("http://127.0.0.1:{port}/2010-04-01/Accounts.json");
    loop {
        if probe.get(&probe_url).send().await.is_ok() {
            break;
        }
        if let Ok(Some(status)) = prism.try_wait() {
            panic!("Prism exited before listening: {status} (see scripts/prism.sh's output above)");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Prism did not listen within 3 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let base = format!("http://127.0.0.1:{port}");
    let outgoing = |from: Option<&str>, validity: Option<Duration>| OutgoingSms {
        message_id: MessageId::new(),
        to: sendonce::domain::Recipient::from_stored("+14155550100", &[]).expect("E.164"),
        from: from.map(str::to_string),
        body: "Your order 92831 is confirmed.".into(),
        validity,
        attempt: 1,
        prepared: None,
    };
    let full = TwilioProvider::new(settings(
        &base,
        Some("https://sms.example.com/providers/twilio/status".into()),
    ))
    .unwrap();
    let with_service = TwilioProvider::new(TwilioSettings {
        from: None,
        messaging_service_sid: Some("MG0123456789abcdef0123456789abcdef".into()),
        ..settings(&base, None)
    })
    .unwrap();
    for (provider, sms) in [
        (
            &full,
            outgoing(Some("ACME"), Some(Duration::from_millis(299_500))),
        ),
        (&full, outgoing(None, None)),
        (&with_service, outgoing(None, Some(Duration::from_secs(60)))),
        (&with_service, outgoing(Some("+14155550199"), None)),
    ] {
        match provider.send(&sms).await {
            SendOutcome::Accepted {
                provider_message_id,
                http_status,
            } => {
                assert_eq!(http_status, Some(201));
                assert!(provider_message_id.starts_with("SM"));
            }
            other => panic!(
                "Prism refused {:?}: {other:?}",
                provider.form(&sms, sms.to.phone().expect("an SMS recipient"))
            ),
        }
        // The lookup's request must be well-formed too (what Prism answers
        // is its example list, which may run to many pages).
        let since = time::OffsetDateTime::now_utc();
        if let Reconciled::Unknown(reason) = provider.reconcile(&sms, &attempt_at(since)).await {
            assert!(
                !reason.contains("answered"),
                "Prism refused the message lookup: {reason}"
            );
        }
    }

    // The check has teeth: a malformed request (a bad account SID) is refused.
    let malformed = TwilioProvider::new(TwilioSettings {
        account_sid: "AC-not-a-sid".into(),
        ..settings(&base, None)
    })
    .unwrap();
    let refused = malformed.send(&outgoing(None, None)).await;
    assert!(
        matches!(
            refused,
            SendOutcome::Rejected {
                http_status: Some(422),
                ..
            }
        ),
        "{refused:?}"
    );
    let _ = prism.kill().await;
}
