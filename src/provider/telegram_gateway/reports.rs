//! The Gateway's delivery reports: `POST /channels/telegram/gateway/reports`,
//! the `callback_url` a send passes when `SENDONCE_PUBLIC_URL` is https.
//!
//! A report is a `RequestStatus` as JSON, signed: `X-Request-Timestamp`
//! (unix seconds) and `X-Request-Signature`, the hex HMAC-SHA256 of the
//! timestamp, a newline and the body, keyed with the SHA-256 digest of the
//! API token. A timestamp more than [`MAX_SKEW`] from our clock, or a
//! signature that does not match (compared in constant time), is refused
//! before anything is recorded. The report becomes a receipt of the message
//! whose provider id is its `request_id`, through the service's one
//! receipt handling: `sent` → sent, `delivered` and `read` → delivered,
//! `expired` and `revoked` → undelivered (which is what makes the next
//! channel go at once); the Gateway's word is kept in the history.

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use crate::domain::Status;

/// The most a report's timestamp may be off our clock (either way).
pub const MAX_SKEW: time::Duration = time::Duration::minutes(5);

const TIMESTAMP: &str = "x-request-timestamp";
const SIGNATURE: &str = "x-request-signature";

/// The reports endpoint with the key its signatures are checked with.
pub struct GatewayReports {
    /// SHA-256 of the API token; `None` (no token configured): every report
    /// is refused.
    key: Option<[u8; 32]>,
}

impl std::fmt::Debug for GatewayReports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayReports")
            .field("key", &self.key.map(|_| "***"))
            .finish()
    }
}

impl GatewayReports {
    /// The endpoint for the API token `token`.
    pub fn new(token: Option<&str>) -> Self {
        GatewayReports {
            key: token.map(|t| Sha256::digest(t.trim().as_bytes()).into()),
        }
    }
}

/// The hex HMAC-SHA256 the Gateway signs a report with.
pub fn signature(key: &[u8; 32], timestamp: &str, body: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(timestamp.as_bytes());
    mac.update(b"\n");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Deserialize)]
struct Report {
    request_id: String,
    #[serde(default)]
    delivery_status: Option<DeliveryStatus>,
}

#[derive(Deserialize)]
struct DeliveryStatus {
    status: String,
}

impl ReceiptRoute for GatewayReports {
    fn admit(&self, req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        if self.key.is_none() {
            return Err(ReceiptError::Forbidden);
        }
        timestamp(req).ok_or(ReceiptError::Forbidden)?;
        if req.headers.get(SIGNATURE).is_none() {
            return Err(ReceiptError::Forbidden);
        }
        Ok(())
    }

    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError> {
        use subtle::ConstantTimeEq;
        self.admit(req)?;
        let key = self.key.as_ref().ok_or(ReceiptError::Forbidden)?;
        let header = |name| {
            req.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .ok_or(ReceiptError::Forbidden)
        };
        let want = signature(key, header(TIMESTAMP)?, body);
        let given = header(SIGNATURE)?.to_ascii_lowercase();
        if !bool::from(want.as_bytes().ct_eq(given.as_bytes())) {
            return Err(ReceiptError::Forbidden);
        }
        // Authentic: only now is its age worth a word. The Gateway asks
        // that the timestamp be checked against outdated data; a report
        // this far off is refused, and said loudly, since the likelier
        // cause is our own clock (the fallback then asks the Gateway
        // before it moves a code on, so a refused report of delivery puts
        // no code on a second channel).
        let at = timestamp(req).ok_or(ReceiptError::Forbidden)?;
        let skew = skew_seconds(req.now.unix_timestamp(), at);
        if skew > MAX_SKEW.whole_seconds().unsigned_abs() {
            tracing::warn!(
                skew_seconds = skew,
                "an authentic Telegram Gateway report is stamped too far from this host's clock; \
                 refused (is the clock right?)"
            );
            return Err(ReceiptError::Forbidden);
        }
        let report: Report = serde_json::from_slice(body).map_err(|_| ReceiptError::MalformedJson)?;
        if report.request_id.is_empty() || report.request_id.len() > MAX_ID_LEN {
            return Err(ReceiptError::field(
                "request_id",
                "must be a request id of at most 255 bytes",
            ));
        }
        let Some(status) = report.delivery_status.map(|d| d.status) else {
            return Err(ReceiptError::field("delivery_status", "is required"));
        };
        if status.is_empty() || status.len() > MAX_STATUS_LEN {
            return Err(ReceiptError::field(
                "delivery_status.status",
                "must be a status of at most 64 bytes",
            ));
        }
        Ok(Receipt {
            provider_message_id: report.request_id,
            status,
            error_code: None,
            message_id: None,
        })
    }

    fn delivery_status(&self, status: &str) -> Option<Status> {
        report_status(status)
    }
}

/// The report's `X-Request-Timestamp`, if it is a number.
fn timestamp(req: &ReceiptRequest<'_>) -> Option<i64> {
    req.headers
        .get(TIMESTAMP)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
}

/// How far apart two unix times are, in seconds, whatever they are (no
/// overflow for a timestamp near `i64::MIN` or `i64::MAX`).
fn skew_seconds(now: i64, at: i64) -> u64 {
    now.abs_diff(at)
}

/// What a report's `delivery_status.status` means for the message.
pub fn report_status(status: &str) -> Option<Status> {
    match status.to_ascii_lowercase().as_str() {
        "sent" => Some(Status::Sent),
        "delivered" | "read" => Some(Status::Delivered),
        "expired" | "revoked" => Some(Status::Undelivered),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, Method};

    use super::*;

    const TOKEN_VALUE: &str = "gateway-token";

    fn request(headers: &HeaderMap, now: time::OffsetDateTime) -> ReceiptRequest<'_> {
        ReceiptRequest {
            method: &Method::POST,
            headers,
            path_and_query: "/channels/telegram/gateway/reports",
            public_url: None,
            now,
        }
    }

    fn signed(at: i64, body: &str, token: &str) -> HeaderMap {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut h = HeaderMap::new();
        h.insert(TIMESTAMP, at.to_string().parse().expect("header"));
        h.insert(
            SIGNATURE,
            signature(&key, &at.to_string(), body.as_bytes())
                .parse()
                .expect("header"),
        );
        h
    }

    #[test]
    fn the_signature_is_hmac_sha256_keyed_with_the_tokens_digest() {
        // python3 -c 'import hmac,hashlib; k=hashlib.sha256(b"gateway-token").digest();
        //   print(hmac.new(k, b"1700000000\n{}", hashlib.sha256).hexdigest())'
        let key: [u8; 32] = Sha256::digest(TOKEN_VALUE.as_bytes()).into();
        assert_eq!(
            signature(&key, "1700000000", b"{}"),
            "cb84c873b00a878f16af42a972372bfe7a42168d1815b3ba6cde8da2ec23ac73"
        );
    }

    #[test]
    fn reports_are_taken_only_signed_and_on_time() {
        let r = GatewayReports::new(Some(TOKEN_VALUE));
        let now = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("time");
        let t = now.unix_timestamp();
        let body = r#"{"request_id":"r1","phone_number":"+1","request_cost":0.01,"delivery_status":{"status":"delivered","updated_at":1700000000}}"#;
        let ok = r.read(&request(&signed(t, body, TOKEN_VALUE), now), body.as_bytes());
        assert_eq!(ok.map(|x| (x.provider_message_id, x.status)), Ok(("r1".into(), "delivered".into())));
        // (timestamp, token signed with, body changed after signing)
        let rows = [
            (t - 301, TOKEN_VALUE, false),
            (t + 301, TOKEN_VALUE, false),
            // The far ends of the number line: refused, never an overflow.
            (i64::MIN, TOKEN_VALUE, false),
            (i64::MAX, TOKEN_VALUE, false),
            (t, "another-token", false),
            (t, TOKEN_VALUE, true),
        ];
        for (at, token, tampered) in rows {
            let headers = signed(at, body, token);
            let sent = if tampered { body.replace("delivered", "expired") } else { body.to_string() };
            assert_eq!(
                r.read(&request(&headers, now), sent.as_bytes()).map(|_| ()),
                Err(ReceiptError::Forbidden),
                "{at} {token} {tampered}"
            );
        }
        assert_eq!(r.admit(&request(&HeaderMap::new(), now)), Err(ReceiptError::Forbidden));
        let unconfigured = GatewayReports::new(None);
        assert_eq!(
            unconfigured.read(&request(&signed(t, body, TOKEN_VALUE), now), body.as_bytes()).map(|_| ()),
            Err(ReceiptError::Forbidden)
        );
    }

    #[test]
    fn report_words_are_statuses() {
        let rows = [
            ("sent", Some(Status::Sent)),
            ("delivered", Some(Status::Delivered)),
            ("read", Some(Status::Delivered)),
            ("expired", Some(Status::Undelivered)),
            ("revoked", Some(Status::Undelivered)),
            ("something", None),
        ];
        for (word, want) in rows {
            assert_eq!(report_status(word), want, "{word}");
        }
    }
}
