//! The HTTP/1.1 server loop, connection by connection.
//!
//! `axum::serve` offers no header-read timeout, so a client that opens
//! connections and sends its headers a byte a minute (slowloris) would hold
//! them forever. Serving each connection with hyper directly sets one, bounds
//! the header buffer, and keeps HTTP/1.1 keep-alive and pipelining (requests
//! on one connection are answered in order). Shutdown is graceful: the
//! listener closes, idle connections close, in-flight requests finish.
//!
//! Open connections are capped (`max_connections`): a connection is accepted
//! only once a permit is free, and its task holds the permit until the
//! connection ends, so past the cap clients wait in the kernel's listen
//! backlog instead of costing a task and buffers each.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub use crate::config::ConnectionLimits;

/// Serves `router` until `stop` is cancelled, then waits for open requests
/// to finish (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192))
        .pipeline_flush(true);
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed.
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little
                    // instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = tower::service_fn(move |req: axum::http::Request<Incoming>| {
            router.clone().oneshot(req.map(axum::body::Body::new))
        });
        let conn =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
