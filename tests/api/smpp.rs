//! The `smpp` adapter through the service, on both backends, against the
//! scripted SMSC of `smsc.rs`: a message accepted at the SMSC is `sent`,
//! its `deliver_sm` receipt makes it `delivered`, and a receipt for an id
//! the SMSC never gave us is acknowledged and kept as unmatched.

use std::sync::Arc;
use std::time::Duration;

use sendonce::provider::smpp::{SmppProvider, SmppSettings};

use crate::helpers::*;
use crate::smsc::Smsc;

async fn accepted_and_its_receipt_matched(backend: Backend) {
    let (addr, created) = crate::smsc::start(Smsc::AcceptAndReceipt).await;
    let provider: ProviderFactory = Box::new(move |_, _, _| {
        let mut s = SmppSettings::new(&addr.ip().to_string(), addr.port(), "sendonce", "secret");
        s.response_timeout = Duration::from_secs(2);
        Arc::new(SmppProvider::new(s))
    });
    let app = spawn_with(TestOptions {
        backend,
        provider: Some(provider),
        ..TestOptions::default()
    })
    .await;
    let sent = app
        .post("SMPP-1", &sms("+14155550100", "hello over smpp"))
        .await;
    assert_eq!(sent.status, 201, "{:?}", sent.bytes);
    assert_eq!(sent.json()["provider_message_id"], "smsc-1");
    app.wait_for_status("SMPP-1", "delivered").await;
    assert_eq!(created.load(std::sync::atomic::Ordering::SeqCst), 1);
    let unmatched = eventually("the unknown receipt stored", || async {
        let n = app
            .db
            .count("SELECT count(*) FROM receipts WHERE provider_message_id = 'never-given-1'")
            .await;
        (n == 1).then_some(n)
    })
    .await;
    assert_eq!(unmatched, 1);
}

on_both_backends!(accepted_and_its_receipt_matched);
