//! Reading a request body within a size and a time limit: the one way every
//! route reads a body, so that no request holds a connection longer than
//! the body-read timeout or makes us keep more than its limit (a request
//! head announcing a body that never comes is cut off at the timeout).

use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// It did not arrive within the timeout.
    TooSlow,
    /// It was longer than the limit.
    TooLarge,
    /// The connection broke or the body was malformed on the wire.
    Broken,
}

/// `body`, read within `limit` bytes and `timeout`.
pub async fn read_limited(body: Body, timeout: Duration, limit: usize) -> Result<Bytes, BodyError> {
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(BodyError::TooSlow),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Ok(Err(_)) => Err(BodyError::Broken),
    }
}
