//! Every error the API answers with, as RFC 9457 `application/problem+json`.
//!
//! `type` is `urn:sendonce:problem:<slug>`; the slug is the stable part
//! clients match on. Database and internal errors are logged with their
//! detail and answered without it: no SQL or stack trace leaves the service.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::FieldError;
use crate::domain::idempotency_key::KeyError;
use crate::store::StoreError;

pub const PROBLEM_TYPE_PREFIX: &str = "urn:sendonce:problem:";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid API key")]
    Unauthorized,
    /// The key's tenant was disabled by an operator.
    #[error("tenant disabled")]
    TenantDisabled,
    /// The key lacks the scope the operation needs.
    #[error("insufficient scope: needs {0}")]
    InsufficientScope(crate::scopes::Scope),
    /// A test-mode key on an `admin` route: a test key never administers,
    /// whatever scopes it lists (issue 41, finding 5).
    #[error("a test-mode key has no admin powers")]
    AdminInTestMode,
    /// A resource of that name already exists (the admin API).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A receipt whose signature or shared secret is missing or wrong.
    #[error("receipt not authenticated")]
    Forbidden,
    #[error("missing Idempotency-Key")]
    MissingIdempotencyKey,
    #[error("invalid Idempotency-Key: {0}")]
    InvalidIdempotencyKey(KeyError),
    #[error("invalid request")]
    Validation(Vec<FieldError>),
    #[error("malformed JSON")]
    MalformedJson,
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("payload too large")]
    PayloadTooLarge,
    #[error("Idempotency-Key reused with another request")]
    KeyReused,
    #[error("Idempotency-Key in use")]
    KeyInUse,
    /// The message is final, or an attempt may have reached the provider.
    #[error("not cancelable")]
    NotCancelable,
    /// Too many of the tenant's requests already wait for messages in flight.
    #[error("too many waiting requests")]
    TooManyWaiters,
    /// The queue of sends waiting for a provider slot is full.
    #[error("send queue full")]
    Overloaded,
    #[error("rate limited: {limit}")]
    RateLimited {
        limit: &'static str,
        retry_after: std::time::Duration,
    },
    #[error("request timeout")]
    RequestTimeout,
    /// A check, resend or cancel of a verification that is no longer pending.
    #[error("verification not pending: {0}")]
    VerificationNotPending(&'static str),
    #[error("resend too soon")]
    ResendTooSoon(std::time::Duration),
    #[error("max sends reached")]
    MaxSendsReached,
    /// A send that would take the tenant's total past a spend cap.
    #[error("spend cap reached: {cap}")]
    SpendCapReached {
        cap: &'static str,
        retry_after: std::time::Duration,
    },
    /// The SMS-pumping defence paused the destination prefix or country.
    #[error("destination paused")]
    DestinationPaused(std::time::Duration),
    #[error("URI too long")]
    UriTooLong,
    #[error("not found")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("service unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => ApiError::Unavailable(m.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<&'a [FieldError]>,
    /// The `Retry-After` seconds, also in the body: a batch item's problem
    /// has no header of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
    /// The scope an `insufficient-scope` problem's operation needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    required_scope: Option<&'static str>,
}

impl ApiError {
    /// 422 on one field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        ApiError::Validation(vec![crate::domain::FieldError::new(field, message)])
    }

    /// The wait a limit asks for, in whole seconds rounded up (never
    /// inviting a retry that is too early), at least 1.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after, .. }
            | ApiError::ResendTooSoon(retry_after)
            | ApiError::SpendCapReached { retry_after, .. }
            | ApiError::DestinationPaused(retry_after) => {
                let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                Some(secs.max(1))
            }
            _ => None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized | ApiError::TenantDisabled => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::InsufficientScope(_) | ApiError::AdminInTestMode => {
                StatusCode::FORBIDDEN
            }
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::MissingIdempotencyKey
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::Validation(_)
            | ApiError::MalformedJson => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::KeyInUse | ApiError::TooManyWaiters | ApiError::NotCancelable => {
                StatusCode::CONFLICT
            }
            ApiError::RateLimited { .. } | ApiError::SpendCapReached { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::VerificationNotPending(_) => StatusCode::CONFLICT,
            ApiError::ResendTooSoon(_)
            | ApiError::MaxSendsReached
            | ApiError::DestinationPaused(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) | ApiError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable problem slug.
    pub fn slug(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::TenantDisabled => "tenant-disabled",
            ApiError::InsufficientScope(_) | ApiError::AdminInTestMode => "insufficient-scope",
            ApiError::Conflict(_) => "conflict",
            ApiError::Forbidden => "forbidden",
            ApiError::MissingIdempotencyKey => "missing-idempotency-key",
            ApiError::InvalidIdempotencyKey(_) => "invalid-idempotency-key",
            ApiError::Validation(_) => "validation",
            ApiError::MalformedJson => "malformed-json",
            ApiError::UnsupportedMediaType => "unsupported-media-type",
            ApiError::PayloadTooLarge => "payload-too-large",
            ApiError::KeyReused => "idempotency-key-reused",
            ApiError::KeyInUse => "idempotency-key-in-use",
            ApiError::NotCancelable => "not-cancelable",
            ApiError::TooManyWaiters => "too-many-waiters",
            ApiError::Overloaded => "overloaded",
            ApiError::RateLimited { .. } => "rate-limited",
            ApiError::RequestTimeout => "request-timeout",
            ApiError::VerificationNotPending(_) => "verification-not-pending",
            ApiError::ResendTooSoon(_) => "resend-too-soon",
            ApiError::MaxSendsReached => "max-sends-reached",
            ApiError::SpendCapReached { .. } => "spend-cap-reached",
            ApiError::DestinationPaused(_) => "destination-paused",
            ApiError::UriTooLong => "uri-too-long",
            ApiError::NotFound => "not-found",
            ApiError::MethodNotAllowed => "method-not-allowed",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "Unauthorized",
            ApiError::TenantDisabled => "Tenant disabled",
            ApiError::InsufficientScope(_) | ApiError::AdminInTestMode => "Insufficient scope",
            ApiError::Conflict(_) => "Conflict",
            ApiError::Forbidden => "Forbidden",
            ApiError::MissingIdempotencyKey => "Missing Idempotency-Key",
            ApiError::InvalidIdempotencyKey(_) => "Invalid Idempotency-Key",
            ApiError::Validation(_) => "Invalid request",
            ApiError::MalformedJson => "Malformed JSON",
            ApiError::UnsupportedMediaType => "Unsupported media type",
            ApiError::PayloadTooLarge => "Payload too large",
            ApiError::KeyReused => "Idempotency-Key reused",
            ApiError::KeyInUse => "Idempotency-Key in use",
            ApiError::NotCancelable => "Not cancelable",
            ApiError::TooManyWaiters => "Too many waiting requests",
            ApiError::Overloaded => "Overloaded",
            ApiError::RateLimited { .. } => "Too many requests",
            ApiError::RequestTimeout => "Request timeout",
            ApiError::VerificationNotPending(_) => "Verification not pending",
            ApiError::ResendTooSoon(_) => "Resend too soon",
            ApiError::MaxSendsReached => "Max sends reached",
            ApiError::SpendCapReached { .. } => "Spend cap reached",
            ApiError::DestinationPaused(_) => "Destination paused",
            ApiError::UriTooLong => "URI too long",
            ApiError::NotFound => "Not found",
            ApiError::MethodNotAllowed => "Method not allowed",
            ApiError::Unavailable(_) => "Service unavailable",
            ApiError::Internal(_) => "Internal error",
        }
    }

    fn detail(&self) -> String {
        match self {
            ApiError::Unauthorized => {
                "send a valid API key as `Authorization: Bearer <key>`".into()
            }
            ApiError::TenantDisabled => {
                "this API key's tenant is disabled by the operator; nothing was changed".into()
            }
            ApiError::AdminInTestMode => "a test-mode key never has the `admin` scope (it \
                 cannot administer tenants, live or test): use a live key with `admin`; \
                 nothing was changed"
                .into(),
            ApiError::InsufficientScope(scope) => format!(
                "this API key does not have the `{scope}` scope this operation needs; nothing was changed"
            ),
            ApiError::Conflict(what) => format!("{what}; nothing was changed"),
            ApiError::Forbidden => {
                "the request's signature or receipt secret is missing or wrong; nothing was changed"
                    .into()
            }
            ApiError::MissingIdempotencyKey => {
                "this request requires an Idempotency-Key header naming it".into()
            }
            ApiError::InvalidIdempotencyKey(e) => format!("{e}"),
            ApiError::Validation(_) => "one or more fields are invalid; see `errors`".into(),
            ApiError::MalformedJson => "the request body is not valid JSON".into(),
            ApiError::UnsupportedMediaType => "send the request body as application/json".into(),
            ApiError::PayloadTooLarge => "the request body is larger than 64 KiB".into(),
            ApiError::KeyReused => {
                "this Idempotency-Key was already used with a different request; \
                use a new key for a different message"
                    .into()
            }
            ApiError::NotCancelable => {
                "the message is final, or an attempt to send it may already \
                have reached the provider; GET the message to see its status"
                    .into()
            }
            ApiError::KeyInUse => "a request with this Idempotency-Key is still being processed; \
                retry after the time in Retry-After to get its result"
                .into(),
            ApiError::TooManyWaiters => {
                "a request with this Idempotency-Key is still being processed and too many of \
                this account's requests already wait for results; retry after the time in \
                Retry-After to get its result"
                    .into()
            }
            ApiError::Overloaded => {
                "too many sends wait for the provider on this instance; nothing was stored, \
                retry after the time in Retry-After"
                    .into()
            }
            ApiError::RateLimited { limit, .. } => format!(
                "the limit on {limit} is reached; retry after the time in Retry-After (nothing was stored)"
            ),
            ApiError::RequestTimeout => "the request body did not arrive in time".into(),
            ApiError::VerificationNotPending(status) => {
                format!("the verification is {status}, no longer pending; nothing was changed")
            }
            ApiError::ResendTooSoon(_) => {
                "the last code was sent too recently; retry after the time in Retry-After".into()
            }
            ApiError::SpendCapReached { cap, .. } => format!(
                "this send would take the account past its {cap} spend cap: nothing was sent \
                 or stored; retry after the cap's period ends (UTC)"
            ),
            ApiError::MaxSendsReached => {
                "this verification was sent the most times allowed; start a new one".into()
            }
            ApiError::DestinationPaused(_) => {
                "verifications to this destination's number range or country are paused because too few recent ones \
                were approved (SMS-pumping defence); retry after the time in Retry-After"
                    .into()
            }
            ApiError::UriTooLong => "the request URI is longer than 2048 bytes".into(),
            ApiError::NotFound => "no such resource".into(),
            ApiError::MethodNotAllowed => "this method is not allowed on this resource".into(),
            ApiError::Unavailable(_) => {
                "the service cannot reach its database right now; nothing was stored, retry later"
                    .into()
            }
            ApiError::Internal(_) => "an internal error occurred; it has been logged".into(),
        }
    }
}

fn problem(e: &ApiError) -> Problem<'_> {
    Problem {
        kind: format!("{PROBLEM_TYPE_PREFIX}{}", e.slug()),
        title: e.title(),
        status: e.status().as_u16(),
        detail: e.detail(),
        errors: match e {
            ApiError::Validation(errors) => Some(errors),
            _ => None,
        },
        retry_after: e.retry_after_secs(),
        required_scope: match e {
            ApiError::InsufficientScope(s) => Some(s.as_str()),
            ApiError::AdminInTestMode => Some(crate::scopes::Scope::Admin.as_str()),
            _ => None,
        },
    }
}

/// The problem document for `e` as a JSON value (a batch item's `problem`).
pub fn problem_value(e: &ApiError) -> serde_json::Value {
    serde_json::to_value(problem(e)).unwrap_or_default()
}

/// A problem+json response for `e`, with the headers its status calls for.
pub fn problem_response(e: &ApiError) -> Response {
    let status = e.status();
    let body = serde_json::to_vec(&problem(e)).unwrap_or_default();
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    match e {
        ApiError::Unauthorized | ApiError::TenantDisabled => {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        ApiError::KeyInUse
        | ApiError::TooManyWaiters
        | ApiError::Overloaded
        | ApiError::Unavailable(_) => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        ApiError::RateLimited { .. }
        | ApiError::ResendTooSoon(_)
        | ApiError::SpendCapReached { .. }
        | ApiError::DestinationPaused(_) => {
            if let Some(secs) = e.retry_after_secs() {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
        }
        _ => {}
    }
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(m) => tracing::error!(error = %m, "internal error"),
            ApiError::Unavailable(m) => tracing::warn!(error = %m, "database unavailable"),
            _ => {}
        }
        problem_response(&self)
    }
}
