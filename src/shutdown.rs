//! The process's shutdown signal: SIGTERM or SIGINT (Ctrl-C).

pub async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}

/// Runs `pass` every `interval` until `stop` is cancelled (a background
/// sweep's loop); a failed pass is logged as `what` and tried again on the
/// next beat.
pub async fn every<F, Fut, T, E>(
    interval: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
    what: &str,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    loop {
        if let Err(e) = pass().await {
            tracing::warn!(error = %e, "{what} failed");
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
