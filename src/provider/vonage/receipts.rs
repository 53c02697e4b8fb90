//! Vonage's delivery receipts: `POST /providers/vonage/status` (form or
//! JSON) or `GET` (query string), as the account's webhook method says.
//! Fields: `msisdn`, `to`, `network-code`, `messageId`, `price`, `status`,
//! `scts`, `err-code`, `client-ref`, `message-timestamp`, and when the
//! account signs its webhooks `timestamp`, `nonce` and `sig`.
//!
//! With `VONAGE_SIGNATURE_SECRET` set, a receipt must carry a `sig` that
//! matches every other parameter under `VONAGE_SIGNATURE_METHOD`
//! ([`super::signing`]; compared in constant time), or it is refused (403).
//! Without a secret every receipt is refused, unless
//! `VONAGE_RECEIPTS_UNSIGNED=true` says to take them unsigned (unsafe:
//! anyone who knows the URL can then mark messages delivered).
//!
//! The signature's `timestamp` is not held to a window: Vonage documents
//! none for SMS receipts, and a redelivered receipt keeps its signature. A
//! captured receipt replayed later is the same receipt (its identity is
//! the message id, status and error code it authenticates) and changes
//! nothing.

use std::sync::Arc;

use axum::http::{Method, header};

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use super::super::registry::{Context, VarError, Vars};
use super::signing::{SignatureMethod, verify};
use crate::domain::{MessageId, Status};

pub const SIGNATURE_SECRET: &str = "VONAGE_SIGNATURE_SECRET";
pub const SIGNATURE_METHOD: &str = "VONAGE_SIGNATURE_METHOD";
pub const RECEIPTS_UNSIGNED: &str = "VONAGE_RECEIPTS_UNSIGNED";

/// The endpoint, with the key of the signatures.
pub struct VonageReceipts {
    secret: Option<String>,
    method: SignatureMethod,
    /// Take receipts without a signature when no secret is set.
    unsigned: bool,
}

impl std::fmt::Debug for VonageReceipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.secret.is_some() {
            "set"
        } else {
            "unset"
        };
        f.debug_struct("VonageReceipts")
            .field("secret", &set)
            .field("method", &self.method)
            .field("unsigned", &self.unsigned)
            .finish()
    }
}

pub(super) fn configure(vars: &Vars, _ctx: &Context) -> Result<Arc<dyn ReceiptRoute>, VarError> {
    let method = match vars.get(SIGNATURE_METHOD) {
        None => SignatureMethod::default(),
        Some(m) => SignatureMethod::parse(m).ok_or_else(|| {
            VarError::invalid(
                SIGNATURE_METHOD,
                "must be md5hash, md5, sha1, sha256 or sha512",
            )
        })?,
    };
    let unsigned = match vars.get(RECEIPTS_UNSIGNED).map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(VarError::invalid(RECEIPTS_UNSIGNED, "must be true or false")),
    };
    Ok(Arc::new(VonageReceipts {
        secret: vars.get(SIGNATURE_SECRET).map(str::to_string),
        method,
        unsigned,
    }))
}

impl VonageReceipts {
    /// The endpoint with these settings (tests).
    pub fn new(secret: Option<&str>, method: SignatureMethod, unsigned: bool) -> Self {
        VonageReceipts {
            secret: secret.map(str::to_string),
            method,
            unsigned,
        }
    }
}

/// The receipt's parameters: the query string of a `GET` (or of a `POST`
/// without a body), else the form or JSON body.
fn params(req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Vec<(String, String)>, ReceiptError> {
    let query = req
        .path_and_query
        .split_once('?')
        .map_or("", |(_, q)| q)
        .as_bytes();
    if *req.method == Method::GET || body.iter().all(u8::is_ascii_whitespace) {
        return Ok(form_urlencoded::parse(query).into_owned().collect());
    }
    let media = req
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match media.as_str() {
        "application/x-www-form-urlencoded" => {
            Ok(form_urlencoded::parse(body).into_owned().collect())
        }
        "application/json" => {
            if crate::domain::request::duplicate_key(body).is_some() {
                return Err(ReceiptError::field(
                    "",
                    "a field appears more than once in the JSON object",
                ));
            }
            let value: serde_json::Value =
                serde_json::from_slice(body).map_err(|_| ReceiptError::MalformedJson)?;
            let Some(object) = value.as_object() else {
                return Err(ReceiptError::field(
                    "",
                    "the request body must be a JSON object",
                ));
            };
            let mut out = Vec::with_capacity(object.len());
            for (k, v) in object {
                let v = match v {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) => n.to_string(),
                    serde_json::Value::Bool(b) => b.to_string(),
                    serde_json::Value::Null => String::new(),
                    _ => return Err(ReceiptError::field(k, "must be a string or a number")),
                };
                out.push((k.clone(), v));
            }
            Ok(out)
        }
        _ => Err(ReceiptError::UnsupportedMediaType),
    }
}

impl ReceiptRoute for VonageReceipts {
    fn warnings(&self) -> Vec<String> {
        if self.secret.is_none() && self.unsigned {
            vec![format!(
                "{RECEIPTS_UNSIGNED}=true and no {SIGNATURE_SECRET}: Vonage delivery receipts are \
                 taken unsigned, and anyone who knows the URL can forge them"
            )]
        } else {
            Vec::new()
        }
    }

    fn admit(&self, _req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        if self.secret.is_none() && !self.unsigned {
            tracing::warn!(
                "a Vonage delivery receipt arrived but VONAGE_SIGNATURE_SECRET is not set \
                 (and VONAGE_RECEIPTS_UNSIGNED is not true)"
            );
            return Err(ReceiptError::Forbidden);
        }
        Ok(())
    }

    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError> {
        self.admit(req)?;
        let params = params(req, body)?;
        for (i, (k, _)) in params.iter().enumerate() {
            if params[..i].iter().any(|(o, _)| o == k) {
                return Err(ReceiptError::field(k, "appears more than once"));
            }
        }
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        if let Some(secret) = self.secret.as_deref() {
            let authentic = param("sig").is_some_and(|sig| verify(self.method, secret, &params, &sig));
            if !authentic {
                tracing::warn!("rejected a Vonage delivery receipt with a missing or bad signature");
                return Err(ReceiptError::Forbidden);
            }
        }
        let id = param("messageId").ok_or_else(|| ReceiptError::field("messageId", "is required"))?;
        let status = param("status").ok_or_else(|| ReceiptError::field("status", "is required"))?;
        if id.len() > MAX_ID_LEN {
            return Err(ReceiptError::field(
                "messageId",
                "is longer than 255 characters",
            ));
        }
        if status.len() > MAX_STATUS_LEN {
            return Err(ReceiptError::field(
                "status",
                "is longer than 64 characters",
            ));
        }
        // `err-code` 0 is "delivered": no error.
        let error_code = param("err-code")
            .filter(|c| !c.trim_start_matches('0').is_empty())
            .filter(|c| c.len() <= MAX_STATUS_LEN);
        // Our id, echoed: matched by only when the signature covers it.
        let message_id = param("client-ref")
            .filter(|_| self.secret.is_some())
            .and_then(|r| our_id(&r));
        Ok(Receipt {
            provider_message_id: id,
            status,
            error_code,
            message_id,
        })
    }

    fn delivery_status(&self, status: &str) -> Option<Status> {
        delivery_status(status)
    }
}

/// Our message id as we send it in `client-ref` (`msg_` and 32 hex digits).
fn our_id(client_ref: &str) -> Option<MessageId> {
    let hex = client_ref.strip_prefix("msg_")?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    uuid::Uuid::try_parse(hex).ok().map(MessageId)
}

/// What Vonage's receipt `status` means: `delivered`; `expired`, `failed`
/// and `rejected` (after Vonage accepted it: not delivered); `accepted`
/// and `buffered` (still on its way: `sent`); `unknown` (nothing we can
/// use: kept in the history).
pub fn delivery_status(status: &str) -> Option<Status> {
    match status.to_ascii_lowercase().as_str() {
        "delivered" => Some(Status::Delivered),
        "expired" | "failed" | "rejected" => Some(Status::Undelivered),
        "accepted" | "buffered" => Some(Status::Sent),
        _ => None,
    }
}
