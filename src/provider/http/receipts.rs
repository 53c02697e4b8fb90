//! The `http` provider's receipts: `POST /providers/http/status`, JSON
//! `{"id","status","event_id","error_code"?}`, authenticated by the shared
//! secret `SENDONCE_RECEIPT_SECRET` in `X-Receipt-Secret` (compared in
//! constant time, before the body is read).
//!
//! The provider's `event_id` is required but is not the receipt's identity:
//! the whole body is what the secret authenticates, and a replay of it with
//! a fresh `event_id` is the same event.

use std::sync::Arc;

use axum::http::header;
use subtle::ConstantTimeEq;

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use super::super::registry::{Context, VarError, Vars};
use crate::domain::FieldError;
use crate::domain::request::duplicate_key;

/// The shared secret's variable.
pub const RECEIPT_SECRET: &str = "SENDONCE_RECEIPT_SECRET";

/// Where the `http` provider posts receipts.
pub const STATUS_PATH: &str = "/providers/http/status";
/// The header carrying `SENDONCE_RECEIPT_SECRET`.
pub const SECRET_HEADER: &str = "x-receipt-secret";

/// The endpoint, with its secret (none: every receipt is refused).
pub struct HttpReceipts {
    secret: Option<String>,
}

impl std::fmt::Debug for HttpReceipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.secret.is_some() {
            "set"
        } else {
            "unset"
        };
        f.debug_struct("HttpReceipts")
            .field("secret", &set)
            .finish()
    }
}

pub(super) fn configure(vars: &Vars, _ctx: &Context) -> Result<Arc<dyn ReceiptRoute>, VarError> {
    let secret = vars.get(RECEIPT_SECRET).map(str::to_string);
    if secret.as_deref().is_some_and(|s| s.len() < 16) {
        return Err(VarError::invalid(
            RECEIPT_SECRET,
            "must be at least 16 characters",
        ));
    }
    Ok(Arc::new(HttpReceipts { secret }))
}

/// The receipt secret docker-compose.yml publishes for its demo.
pub const DEMO_RECEIPT_SECRET: &str = "demo-receipt-secret-change-me";

impl ReceiptRoute for HttpReceipts {
    fn warnings(&self) -> Vec<String> {
        if self.secret.as_deref() == Some(DEMO_RECEIPT_SECRET) {
            vec![format!(
                "{RECEIPT_SECRET} is the demo secret published in docker-compose.yml: \
                 anyone can forge delivery receipts; set your own"
            )]
        } else {
            Vec::new()
        }
    }

    fn admit(&self, req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        let Some(secret) = self.secret.as_deref() else {
            tracing::warn!(
                "an http provider receipt arrived but SENDONCE_RECEIPT_SECRET is not set"
            );
            return Err(ReceiptError::Forbidden);
        };
        let given = req
            .headers
            .get(SECRET_HEADER)
            .map(|v| v.as_bytes())
            .ok_or(ReceiptError::Forbidden)?;
        if !bool::from(given.ct_eq(secret.as_bytes())) {
            tracing::warn!("rejected an http provider receipt with a wrong secret");
            return Err(ReceiptError::Forbidden);
        }
        let json_body = req
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !json_body {
            return Err(ReceiptError::UnsupportedMediaType);
        }
        Ok(())
    }

    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError> {
        self.admit(req)?;
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| ReceiptError::MalformedJson)?;
        // Parsers disagree on which duplicate wins: refused, as on POST /messages.
        if let Some(path) = duplicate_key(body) {
            return Err(ReceiptError::field(
                &path,
                "appears more than once in the JSON object",
            ));
        }
        let Some(object) = value.as_object() else {
            return Err(ReceiptError::field(
                "",
                "the request body must be a JSON object",
            ));
        };
        fields(object)
    }
}

fn fields(object: &serde_json::Map<String, serde_json::Value>) -> Result<Receipt, ReceiptError> {
    let mut errors = Vec::new();
    let mut text = |name: &str, max: usize| -> Option<String> {
        match object.get(name) {
            Some(serde_json::Value::String(s)) if !s.is_empty() && s.chars().count() <= max => {
                Some(s.clone())
            }
            Some(serde_json::Value::String(s)) if !s.is_empty() => {
                errors.push(FieldError {
                    field: name.into(),
                    message: format!("must be at most {max} characters"),
                });
                None
            }
            None | Some(serde_json::Value::Null) => {
                errors.push(FieldError {
                    field: name.into(),
                    message: "is required".into(),
                });
                None
            }
            Some(_) => {
                errors.push(FieldError {
                    field: name.into(),
                    message: "must be a non-empty string".into(),
                });
                None
            }
        }
    };
    let id = text("id", MAX_ID_LEN);
    let status = text("status", MAX_STATUS_LEN);
    let event_id = text("event_id", MAX_ID_LEN);
    let error_code = match object.get("error_code") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) if s.chars().count() <= MAX_STATUS_LEN => {
            Some(s.clone())
        }
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(_) => {
            errors.push(FieldError {
                field: "error_code".into(),
                message: "must be a string of at most 64 characters, a number or null".into(),
            });
            None
        }
    };
    let (Some(id), Some(status), Some(_event_id)) = (id, status, event_id) else {
        errors.sort_by(|a, b| a.field.cmp(&b.field));
        return Err(ReceiptError::Invalid(errors));
    };
    if !errors.is_empty() {
        return Err(ReceiptError::Invalid(errors));
    }
    Ok(Receipt {
        provider_message_id: id,
        status,
        error_code,
        message_id: None,
    })
}
