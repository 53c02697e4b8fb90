//! The `smpp` adapter through the service, on both backends, against the
//! npm `smpp` package's SMSC (`npm_smsc.rs`, a package from a registry):
//! every message is counted at the SMSC, which does not de-duplicate, per
//! destination and body.

use std::sync::Arc;
use std::time::Duration;

use sendonce::provider::SimulatedProvider;
use sendonce::provider::smpp::{SmppProvider, SmppSettings};
use serde_json::json;

use crate::helpers::*;
use crate::npm_smsc::{NpmSmsc, Start, available};

/// The adapter aimed at the SMSC on `port`, as `adjust` changes it.
pub fn smpp_at(
    port: u16,
    adjust: impl FnOnce(&mut SmppSettings) + Send + 'static,
) -> ProviderFactory {
    Box::new(move |_, _, _| {
        let mut s = SmppSettings::new("127.0.0.1", port, "sendonce", "secret");
        s.response_timeout = Duration::from_secs(10);
        s.connect_timeout = Duration::from_secs(1);
        adjust(&mut s);
        Arc::new(SmppProvider::new(s))
    })
}

async fn app_at(backend: Backend, provider: ProviderFactory) -> TestApp {
    spawn_with(TestOptions {
        backend,
        provider: Some(provider),
        ..TestOptions::default()
    })
    .await
}

async fn accepted_then_delivered_by_its_receipt(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    let app = app_at(backend, smpp_at(smsc.port, |_| {})).await;
    let a = app
        .post("S-OK", &sms("+14155550100", "hello over smpp"))
        .await;
    assert_eq!(a.status, 201, "{:?}", a.bytes);
    let m = app.wait_for_status("S-OK", "sent").await;
    let submits = smsc.submits();
    assert_eq!(submits.len(), 1);
    assert_eq!(submits[0]["dest"], "14155550100");
    assert_eq!(submits[0]["data_coding"], 0);
    assert_eq!(submits[0]["registered_delivery"], 1);
    assert_eq!(m["provider_message_id"], submits[0]["message_id"]);
    let id = m["provider_message_id"]
        .as_str()
        .expect("an id")
        .to_string();
    smsc.deliver(&id, "DELIVRD").await;
    app.wait_for_status("S-OK", "delivered").await;
    smsc.wait(Duration::from_secs(10), "deliver_sm_resp", |ev| {
        ev.iter()
            .any(|e| e["event"] == "deliver_sm_resp" && e["status"] == 0)
            .then_some(())
    })
    .await;
    assert_eq!(smsc.created("+14155550100", "hello over smpp"), 1);
}

/// 0x58: the SMSC took nothing, so sending again is right; one message.
async fn throttled_then_sent_once(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    smsc.queue(&["0x58", "0x14"]).await;
    let app = app_at(backend, smpp_at(smsc.port, |_| {})).await;
    app.post("S-THR", &sms("+14155550101", "throttled first"))
        .await;
    let m = app.wait_for_status("S-THR", "sent").await;
    assert_eq!(m["attempts"], 3);
    let answers: Vec<_> = smsc.submits().iter().map(|s| s["answer"].clone()).collect();
    assert_eq!(answers, [json!("0x58"), json!("0x14"), json!("ok")]);
    assert_eq!(smsc.created("+14155550101", "throttled first"), 1);
}

async fn an_invalid_destination_fails(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    smsc.config(json!({"answer": "0x0B"})).await;
    let app = app_at(backend, smpp_at(smsc.port, |_| {})).await;
    app.post("S-BAD", &sms("+14155550102", "to nowhere")).await;
    let m = app.wait_for_status("S-BAD", "failed").await;
    assert_eq!(m["attempts"], 1);
    assert_eq!(smsc.submits().len(), 1);
    assert_eq!(smsc.created("+14155550102", "to nowhere"), 0);
}

/// ESME_RINVPASWD for our bind: a refusal of the account, so the next
/// provider takes the message; with none, it fails. Nothing at the SMSC.
async fn a_refused_bind_moves_on_to_the_next_provider(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let smsc = NpmSmsc::start(Start::default()).await;
    let wrong = |s: &mut SmppSettings| s.password = "wrong".into();
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(smpp_at(smsc.port, wrong)),
        fallbacks: vec![Arc::new(SimulatedProvider::default())],
        ..TestOptions::default()
    })
    .await;
    app.post("S-REF", &sms("+14155550103", "via the next one"))
        .await;
    let m = app.wait_for_status("S-REF", "sent").await;
    assert_eq!(m["provider"], "simulated");
    assert!(smsc.binds().iter().all(|b| b["ok"] == false));
    assert!(!smsc.binds().is_empty());
    assert!(smsc.submits().is_empty());

    let alone = app_at(backend, smpp_at(smsc.port, wrong)).await;
    alone
        .post("S-REF2", &sms("+14155550103", "no next one"))
        .await;
    alone.wait_for_status("S-REF2", "failed").await;
    assert!(smsc.submits().is_empty());
}

/// No submit_sm_resp within SMPP_RESPONSE_TIMEOUT: it may be on the
/// phone, and SMPP cannot be asked: `unknown`, one submit, never resent.
async fn no_response_ends_unknown_and_is_never_resent(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    smsc.queue(&["silent"]).await;
    let app = app_at(
        backend,
        smpp_at(smsc.port, |s| s.response_timeout = Duration::from_secs(1)),
    )
    .await;
    app.post("S-SIL", &sms("+14155550104", "no answer")).await;
    let m = app.wait_for_status("S-SIL", "unknown").await;
    assert_eq!(m["attempts"], 1);
    // The session is still bound (the SMSC answers the next): a later
    // message goes through, and the silent one was not sent again.
    app.post("S-SIL2", &sms("+14155550104", "the next one"))
        .await;
    app.wait_for_status("S-SIL2", "sent").await;
    assert_eq!(smsc.created("+14155550104", "no answer"), 1);
    assert_eq!(smsc.created("+14155550104", "the next one"), 1);
    assert_eq!(smsc.submits().len(), 2);
}

/// The SMSC drops the session with submits outstanding: those end
/// `unknown` (they may be on the phone), never resent; the adapter binds
/// again and new messages go through. Nothing twice at the SMSC.
async fn a_dropped_session_leaves_the_outstanding_unknown(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    smsc.config(json!({"answer": "silent"})).await;
    let app = app_at(backend, smpp_at(smsc.port, |s| s.window = 5)).await;
    let keys = ["S-DROP-1", "S-DROP-2", "S-DROP-3"];
    let bodies = keys.map(|k| sms("+14155550105", &format!("outstanding {k}")));
    tokio::join!(
        app.post(keys[0], &bodies[0]),
        app.post(keys[1], &bodies[1]),
        app.post(keys[2], &bodies[2]),
    );
    smsc.wait(Duration::from_secs(10), "3 outstanding submits", |ev| {
        (ev.iter().filter(|e| e["event"] == "submit").count() == 3).then_some(())
    })
    .await;
    smsc.config(json!({"answer": "ok"})).await;
    smsc.cmd(json!({"cmd": "drop"})).await;
    for k in keys {
        let m = app.wait_for_status(k, "unknown").await;
        assert_eq!(m["attempts"], 1, "{k}");
    }
    app.post("S-DROP-4", &sms("+14155550105", "after the drop"))
        .await;
    app.wait_for_status("S-DROP-4", "sent").await;
    assert_eq!(smsc.binds().len(), 2, "bound again once");
    for k in keys {
        assert_eq!(smsc.created("+14155550105", &format!("outstanding {k}")), 1);
    }
    assert_eq!(smsc.created("+14155550105", "after the drop"), 1);
    assert_eq!(smsc.submits().len(), 4);
}

/// Long messages: one submit_sm per part, one UDH reference, parts 1/n to
/// n/n, `data_coding` 8 for UCS-2 and 0 for GSM-7.
async fn long_messages_are_parts_with_one_reference(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let smsc = NpmSmsc::start(Start::default()).await;
    let app = app_at(backend, smpp_at(smsc.port, |_| {})).await;
    let ucs2 = "Ж".repeat(150); // 67 + 67 + 16 units
    let gsm = "g".repeat(400); // 153 + 153 + 94 septets
    for (key, to, body, dc) in [
        ("S-UCS2", "+14155550106", &ucs2, 8),
        ("S-GSM", "+14155550107", &gsm, 0),
    ] {
        app.post(key, &sms(to, body)).await;
        let m = app.wait_for_status(key, "sent").await;
        let parts = smsc.submits_to(to);
        assert_eq!(parts.len(), 3, "{key}");
        let reference = parts[0]["udh"]["ref"].clone();
        let mut text = String::new();
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p["data_coding"], dc, "{key}");
            assert_eq!(p["esm_class"].as_u64().unwrap_or(0) & 0x40, 0x40, "{key}");
            assert_eq!(p["udh"]["ref"], reference, "{key}");
            assert_eq!(p["udh"]["total"], 3, "{key}");
            assert_eq!(p["udh"]["part"], i + 1, "{key}");
            text.push_str(p["text"].as_str().unwrap_or(""));
        }
        assert_eq!(&text, body, "{key}");
        // The last part asks for the receipt and names the message.
        assert_eq!(parts[2]["registered_delivery"], 1);
        assert_eq!(m["provider_message_id"], parts[2]["message_id"]);
        assert_eq!(smsc.created(to, body), 1);
    }
}

/// A receipt for an id the SMSC never gave us: answered, stored as
/// unmatched (`sendonce receipts unmatched`), and the session stays up.
async fn an_unknown_receipt_is_acknowledged_and_kept(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let mut smsc = NpmSmsc::start(Start::default()).await;
    let app = app_at(backend, smpp_at(smsc.port, |_| {})).await;
    app.post("S-UNM-1", &sms("+14155550108", "first")).await;
    app.wait_for_status("S-UNM-1", "sent").await;
    smsc.deliver("never-given", "DELIVRD").await;
    smsc.wait(Duration::from_secs(10), "deliver_sm_resp", |ev| {
        ev.iter()
            .find(|e| e["event"] == "deliver_sm_resp")
            .map(|e| e["status"].clone())
    })
    .await
    .as_u64()
    .filter(|s| *s == 0)
    .expect("ESME_ROK");
    eventually("the unmatched receipt", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM receipts WHERE provider_message_id = 'never-given' AND message_id IS NULL")
            .await;
        (n == 1).then_some(())
    })
    .await;
    app.post("S-UNM-2", &sms("+14155550108", "second")).await;
    app.wait_for_status("S-UNM-2", "sent").await;
    assert_eq!(smsc.binds().len(), 1, "the session stayed up");
    assert!(smsc.events("closed").is_empty());
}

/// The SMSC is down when the service starts: the service starts, the
/// message waits (retried), and goes when the SMSC comes up.
async fn the_service_starts_with_the_smsc_down(backend: Backend) {
    if !available("the smpp end-to-end tests") {
        return;
    }
    let port = crate::process::free_port().await;
    let mut settings = test_settings();
    settings.delivery.retry.max_attempts = 1000;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        provider: Some(smpp_at(port, |s| {
            s.connect_timeout = Duration::from_millis(200)
        })),
        ..TestOptions::default()
    })
    .await;
    app.post("S-DOWN", &sms("+14155550109", "when it is up"))
        .await;
    eventually("two attempts while the SMSC is down", || async {
        let m = app.get("/messages/S-DOWN").await.json();
        (m["attempts"].as_u64().unwrap_or(0) >= 2 && m["status"] != "sent").then_some(())
    })
    .await;
    let smsc = NpmSmsc::start(Start { port, tls: None }).await;
    within(
        Duration::from_secs(60),
        "sent once the SMSC is up",
        || async {
            let m = app.get("/messages/S-DOWN").await.json();
            (m["status"] == "sent").then_some(())
        },
    )
    .await;
    assert_eq!(smsc.created("+14155550109", "when it is up"), 1);
}

/// A CA and a certificate for 127.0.0.1 signed by it, made now with the
/// openssl command line: (ca.pem, key.pem, cert.pem) in `dir`.
fn test_certificates(dir: &std::path::Path) -> (String, String, String) {
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("the openssl command (apt-get install openssl)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write leaf.ext");
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=sendonce test CA",
    ]
    .iter()
    .copied()
    .chain(["-keyout", &p("ca-key.pem"), "-out", &p("ca.pem")])
    .collect::<Vec<_>>());
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &p("key.pem"),
        "-out",
        &p("leaf.csr"),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p("leaf.csr"),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca-key.pem"),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &p("leaf.ext"),
        "-out",
        &p("cert.pem"),
    ]);
    (p("ca.pem"), p("key.pem"), p("cert.pem"))
}

/// SMPP_TLS=true against the npm server in TLS mode, its certificate from
/// a CA made for the test and trusted by SMPP_TLS_CA_FILE: sent and its
/// receipt delivered over TLS. Without the CA the handshake fails and
/// nothing is written (the platform's roots do not know it).
async fn over_tls_with_a_ca_of_its_own(backend: Backend) {
    if !available("the smpp TLS test") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sendonce-smpp-tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let (ca, key, cert) = test_certificates(&dir);
    let mut smsc = NpmSmsc::start(Start {
        port: 0,
        tls: Some((key, cert)),
    })
    .await;
    let ca2 = ca.clone();
    let app = app_at(
        backend,
        smpp_at(smsc.port, move |s| {
            s.tls = true;
            s.tls_ca_file = Some(ca2);
        }),
    )
    .await;
    app.post("S-TLS", &sms("+14155550111", "over tls")).await;
    let m = app.wait_for_status("S-TLS", "sent").await;
    let id = m["provider_message_id"]
        .as_str()
        .expect("an id")
        .to_string();
    smsc.deliver(&id, "DELIVRD").await;
    app.wait_for_status("S-TLS", "delivered").await;
    assert_eq!(smsc.created("+14155550111", "over tls"), 1);

    let untrusted = app_at(backend, smpp_at(smsc.port, |s| s.tls = true)).await;
    untrusted
        .post("S-TLS-2", &sms("+14155550112", "not trusted"))
        .await;
    eventually("attempts without a session", || async {
        let m = untrusted.get("/messages/S-TLS-2").await.json();
        (m["attempts"].as_u64().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    assert!(smsc.submits_to("+14155550112").is_empty());
    assert_eq!(smsc.binds().len(), 1, "only the trusting instance bound");
    let _ = std::fs::remove_dir_all(&dir);
}

on_both_backends!(
    accepted_then_delivered_by_its_receipt,
    throttled_then_sent_once,
    an_invalid_destination_fails,
    a_refused_bind_moves_on_to_the_next_provider,
    no_response_ends_unknown_and_is_never_resent,
    a_dropped_session_leaves_the_outstanding_unknown,
    long_messages_are_parts_with_one_reference,
    an_unknown_receipt_is_acknowledged_and_kept,
    the_service_starts_with_the_smsc_down,
    over_tls_with_a_ca_of_its_own,
);
