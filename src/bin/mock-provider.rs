//! `mock-provider`: the scriptable stand-in SMS provider as a process, for
//! demos (docker-compose) and the chaos run. It speaks the `http` provider
//! protocol on `POST /messages`, de-duplicates on `Idempotency-Key`, and
//! reports deliveries per key on `GET /stats`.
//!
//! `MOCK_LISTEN` (default 127.0.0.1:9090) sets the address; the fault
//! variables of [`Faults::from_env`] make it misbehave at random.

use sendonce::mock_provider::{Faults, MockProvider};

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
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mock-provider: cannot listen on {listen}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tracing::info!(%listen, ?faults, "mock provider listening");
    let task = MockProvider::with_faults(faults).serve(listener);
    tokio::select! {
        _ = task => {}
        () = sendonce::shutdown::signal() => {}
    }
    std::process::ExitCode::SUCCESS
}
