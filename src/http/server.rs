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
//!
//! A request answered before its body was read to the end (a 401, a bad
//! `Idempotency-Key`, a 413, ...) leaves bytes on the connection that hyper
//! will not parse as the next request: hyper closes the connection after the
//! answer. Such answers say so with `Connection: close` (RFC 9112, 9.6), so
//! a client's connection pool does not send its next request into a
//! connection that is closing (httpx: "Server disconnected without sending
//! a response").

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
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
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
            let router = router.clone();
            async move {
                let (mut parts, body) = req.into_parts();
                // The TCP peer, for limits kept per client address (the
                // console's failed sign-ins).
                parts.extensions.insert(ConnectInfo(peer));
                let (body, read_to_end) = TrackedBody::new(body);
                let req = axum::http::Request::from_parts(parts, axum::body::Body::new(body));
                let mut res = router.oneshot(req).await?;
                if !read_to_end.load(Ordering::Acquire) {
                    res.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, std::convert::Infallible>(res)
            }
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

/// A request body that records whether it was read to its end (an empty
/// body counts as read).
struct TrackedBody {
    inner: Incoming,
    read_to_end: Arc<AtomicBool>,
}

impl TrackedBody {
    fn new(inner: Incoming) -> (Self, Arc<AtomicBool>) {
        let read_to_end = Arc::new(AtomicBool::new(inner.is_end_stream()));
        let body = TrackedBody {
            inner,
            read_to_end: Arc::clone(&read_to_end),
        };
        (body, read_to_end)
    }
}

impl Body for TrackedBody {
    type Data = <Incoming as Body>::Data;
    type Error = <Incoming as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read_to_end.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
