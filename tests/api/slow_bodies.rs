//! Request bodies that never come (issue 29, finding 1): a request head
//! announcing a body, and then nothing, must not hold a connection longer
//! than the body-read timeout, on any route that reads a body.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

/// The console's four forms, and the API's bodies.
const ROUTES: [&str; 7] = [
    "/console/login",
    "/console/logout",
    "/console/opt-outs",
    "/console/opt-outs/remove",
    "/messages",
    "/messages/batch",
    "/verifications",
];

async fn stalled_bodies_are_cut_off_at_the_timeout(backend: Backend) {
    let mut settings = test_settings();
    settings.server.body_read_timeout = Duration::from_secs(1);
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut stalled = Vec::new();
    for i in 0..280 {
        let route = ROUTES[i % ROUTES.len()];
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        let content_type = if route.starts_with("/console") {
            "application/x-www-form-urlencoded"
        } else {
            "application/json"
        };
        let head = format!(
            "POST {route} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: \"SLOW-{i}\"\r\nContent-Type: {content_type}\r\n\
             Content-Length: 65000\r\n\r\n",
            app.api_key
        );
        s.write_all(head.as_bytes()).await.expect("head");
        stalled.push((route, s));
    }
    // The server keeps answering meanwhile.
    let health = app.get("/healthz").await;
    assert_eq!(health.status, 200);
    // Every stalled request is answered (408, or 413 for a form announcing
    // more than a form may hold) and its connection closed, within the
    // timeout and a margin.
    for (route, mut s) in stalled {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{route}: the connection is still open"));
        assert!(read.is_ok(), "{route}: {read:?}");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.1 413"),
            "{route}: {text}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cut off in {:?}",
        started.elapsed()
    );
    assert_eq!(app.message_count().await, 0, "nothing was stored");
}

on_both_backends!(stalled_bodies_are_cut_off_at_the_timeout);
