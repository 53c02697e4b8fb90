//! `mock-provider`: the scriptable stand-in SMS provider as a process, for
//! demos (docker-compose) and the chaos run. It speaks the `http` provider
//! protocol on `POST /messages` (de-duplicating on `Idempotency-Key` as
//! `MOCK_DEDUP` says: `none`, the default, `replay` or `ietf`) and
//! Twilio's Messages endpoint (`/2010-04-01/Accounts/{sid}/Messages.json`)
//! and Vonage's SMS API (`POST /sms/json`; its receipts signed with
//! `MOCK_VONAGE_SIGNATURE_SECRET` and `MOCK_VONAGE_SIGNATURE_METHOD` when
//! set), and reports messages created per key and per (To, Body) on `GET /stats`.
//!
//! `MOCK_LISTEN` (default 127.0.0.1:9090) sets the address; the fault
//! variables of [`Faults::from_env`] make it misbehave at random; those of
//! [`ReceiptConfig::from_env`] make it send delivery receipts back.

use testkit::mock_provider::{Dedup, Faults, MockProvider, ReceiptConfig};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sendonce::telemetry::init(sendonce::config::LogFormat::Text);
    let listen = std::env::var("MOCK_LISTEN").unwrap_or_else(|_| "127.0.0.1:9090".into());
    let faults = match Faults::from_env() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mock-provider: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let dedup = match Dedup::from_env() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("mock-provider: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let receipts = match ReceiptConfig::from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mock-provider: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mock-provider: cannot listen on {listen}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tracing::info!(%listen, ?faults, "mock provider listening");
    let mock = MockProvider::with_faults(faults);
    mock.set_receipts(receipts);
    if let Ok(secret) = std::env::var("MOCK_VONAGE_SIGNATURE_SECRET")
        && !secret.is_empty()
    {
        let method = std::env::var("MOCK_VONAGE_SIGNATURE_METHOD").unwrap_or_default();
        let method = if method.is_empty() {
            Some(sendonce::provider::vonage::SignatureMethod::default())
        } else {
            sendonce::provider::vonage::SignatureMethod::parse(&method)
        };
        let Some(method) = method else {
            eprintln!(
                "mock-provider: MOCK_VONAGE_SIGNATURE_METHOD must be md5hash, md5, sha1, sha256 or sha512"
            );
            return std::process::ExitCode::from(2);
        };
        mock.set_vonage_signing(&secret, method);
    }
    mock.set_dedup(dedup);
    let task = mock.serve(listener);
    tokio::select! {
        _ = task => {}
        () = sendonce::shutdown::signal() => {}
    }
    std::process::ExitCode::SUCCESS
}
