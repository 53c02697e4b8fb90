//! One module per provider protocol the mock speaks, listed once (the
//! `protocols!` line below): a new provider's mock is one module and its
//! name there. State of its own is its `Protocol` type, which the mock
//! keeps for it (`Inner::protocol`). Serving is here too, since it takes
//! every protocol's routes.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::mock_provider::{MockProvider, serve_connection, stats};

/// Adds one protocol's routes to the mock's router.
pub type AddRoutes = fn(Router<MockProvider>) -> Router<MockProvider>;

macro_rules! protocols {
    ($($name:ident),+ $(,)?) => {
        $(pub mod $name;)+

        /// Every protocol's routes.
        pub const ROUTES: &[AddRoutes] = &[$($name::routes),+];
    };
}

protocols!(
    http,
    twilio,
    infobip,
    vonage,
    telegram,
    telegram_gateway,
    whatsapp
);

/// `router` with every protocol's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    ROUTES.iter().fold(router, |r, add| add(r))
}

impl MockProvider {
    /// Serves on `listener` until the returned task is aborted.
    pub fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let app = routes(Router::new())
            .route("/stats", get(stats))
            .with_state(self.clone());
        tokio::spawn(async move {
            let listener = &listener;
            crate::accept::accept_loop(
                move || async move { Some(listener.accept().await) },
                |(stream, _)| {
                    tokio::spawn(serve_connection(stream, app.clone()));
                },
            )
            .await;
        })
    }

    /// Starts on a free loopback port; returns the mock and its send URL.
    pub async fn start() -> std::io::Result<(MockProvider, String, SocketAddr)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mock = MockProvider::default();
        mock.serve(listener);
        Ok((mock, format!("http://{addr}/messages"), addr))
    }
}
