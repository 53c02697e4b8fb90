//! Infobip's delivery reports: `POST /providers/infobip/status`, JSON
//! `{"results":[{"messageId","to","sender","status":{"groupName","name",...},
//! "error":{"name",...},...}]}`, several reports per request.
//!
//! Infobip does not sign its reports. The URL it posts to is the one each
//! message carried (`webhooks.delivery.url`), and that URL carries
//! `INFOBIP_RECEIPT_SECRET` as its `secret` query parameter; a request whose
//! `secret` parameter, or the password of its HTTP Basic credentials (for a
//! URL configured with userinfo on Infobip's side), is the secret is
//! authentic. Both are compared in constant time, before the body is read;
//! without a configured secret every report is refused.
//!
//! Each result is one receipt, matched by its `messageId` (our message id,
//! which Infobip's id of the message is). Its provider status is
//! `GROUP/NAME` (`DELIVERED/DELIVERED_TO_HANDSET`), its error code the
//! error's name unless it is `NO_ERROR`. What the status means:
//! `DELIVERED` delivered, except `DELIVERED_TO_OPERATOR` (Infobip calls it
//! intermediate: the handset may still not get it), which is only `sent`;
//! `UNDELIVERABLE`, `EXPIRED` and `REJECTED` undelivered; `PENDING` sent
//! (recorded, changes nothing on a sent message).
//! `REJECTED_DUPLICATE_MESSAGE_ID` is the refusal of a repeat of our id,
//! not of the message first sent under it: recorded, changes nothing.

use std::sync::Arc;

use axum::http::header;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use super::super::registry::{Context, VarError, Vars};
use super::Status;
use crate::domain::Status as MessageStatus;

/// The receipt secret's variable.
pub const RECEIPT_SECRET: &str = "INFOBIP_RECEIPT_SECRET";

/// The query parameter of the delivery URL that carries the secret.
pub const SECRET_PARAM: &str = "secret";

/// The most results one request may carry (Infobip sends up to 100 by
/// default; its `maxBucketSize` can be raised).
pub const MAX_RESULTS: usize = 1000;

/// The endpoint, with its secret (none: every report is refused).
pub struct InfobipReceipts {
    secret: Option<String>,
}

impl std::fmt::Debug for InfobipReceipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.secret.is_some() {
            "set"
        } else {
            "unset"
        };
        f.debug_struct("InfobipReceipts")
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
    Ok(Arc::new(InfobipReceipts { secret }))
}

impl InfobipReceipts {
    /// The route with this secret (tests).
    pub fn with_secret(secret: Option<&str>) -> Self {
        Self {
            secret: secret.map(str::to_string),
        }
    }
}

/// What the request offers as the secret: its `secret` query parameters and
/// the password of its Basic credentials.
fn offered(req: &ReceiptRequest<'_>) -> Vec<Vec<u8>> {
    let mut offered = Vec::new();
    if let Some((_, query)) = req.path_and_query.split_once('?') {
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if name == SECRET_PARAM {
                offered.push(value.as_bytes().to_vec());
            }
        }
    }
    let basic = req
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .and_then(|(_, encoded)| BASE64.decode(encoded.trim()).ok());
    if let Some(decoded) = basic
        && let Some(colon) = decoded.iter().position(|b| *b == b':')
    {
        offered.push(decoded[colon + 1..].to_vec());
    }
    offered
}

/// One delivery report.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    message_id: Option<String>,
    status: Option<Status>,
    error: Option<ReportError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReportError {
    id: Option<i64>,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Reports {
    results: Vec<Report>,
}

/// `GROUP/NAME` of a status, or whichever of the two it has.
pub fn status_word(status: &Status) -> Option<String> {
    let group = status
        .group_name
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_ascii_uppercase);
    let name = status
        .name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty());
    match (group, name) {
        (Some(g), Some(n)) => Some(format!("{g}/{n}")),
        (Some(g), None) => Some(g),
        (None, Some(n)) => Some(n.to_string()),
        (None, None) => None,
    }
}

/// What a provider status word ([`status_word`]) means for the message.
pub fn infobip_status(word: &str) -> Option<MessageStatus> {
    let (group, name) = match word.split_once('/') {
        Some((g, n)) => (g.to_ascii_uppercase(), n.to_ascii_uppercase()),
        // A name alone: its group is its prefix (`DELIVERED_TO_HANDSET`).
        None => {
            let n = word.to_ascii_uppercase();
            let g = ["PENDING", "UNDELIVERABLE", "DELIVERED", "EXPIRED", "REJECTED"]
                .into_iter()
                .find(|g| n.starts_with(g))
                .map(str::to_string)
                .unwrap_or_else(|| n.clone());
            (g, n)
        }
    };
    match group.as_str() {
        // About a repeat, not the message: nothing to apply.
        _ if name == super::DUPLICATE_MESSAGE_ID => None,
        "DELIVERED" if name == "DELIVERED_TO_OPERATOR" => Some(MessageStatus::Sent),
        "DELIVERED" => Some(MessageStatus::Delivered),
        "UNDELIVERABLE" | "EXPIRED" | "REJECTED" => Some(MessageStatus::Undelivered),
        "PENDING" | "ACCEPTED" => Some(MessageStatus::Sent),
        _ => None,
    }
}

impl ReceiptRoute for InfobipReceipts {
    fn admit(&self, req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        let Some(secret) = self.secret.as_deref() else {
            tracing::warn!(
                "an Infobip delivery report arrived but INFOBIP_RECEIPT_SECRET is not set"
            );
            return Err(ReceiptError::Forbidden);
        };
        // Every offer is compared, so the time taken says nothing about
        // which one came close.
        let authentic = offered(req)
            .iter()
            .fold(false, |ok, o| ok | bool::from(o.ct_eq(secret.as_bytes())));
        if !authentic {
            tracing::warn!("rejected an Infobip delivery report without the receipt secret");
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
        let mut all = self.read_all(req, body)?;
        match all.len() {
            1 => Ok(all.remove(0)),
            _ => Err(ReceiptError::field(
                "results",
                "must hold exactly one report here",
            )),
        }
    }

    fn read_all(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Vec<Receipt>, ReceiptError> {
        self.admit(req)?;
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| ReceiptError::MalformedJson)?;
        if let Some(path) = crate::domain::request::duplicate_key(body) {
            return Err(ReceiptError::field(
                &path,
                "appears more than once in the JSON object",
            ));
        }
        let reports: Reports = serde_json::from_value(value)
            .map_err(|_| ReceiptError::field("results", "must be an array of reports"))?;
        if reports.results.len() > MAX_RESULTS {
            return Err(ReceiptError::field(
                "results",
                "holds more than 1000 reports",
            ));
        }
        // Every report is checked before any is recorded: a request is
        // taken whole or refused whole.
        reports
            .results
            .into_iter()
            .enumerate()
            .map(|(i, r)| receipt(i, r))
            .collect()
    }

    fn delivery_status(&self, status: &str) -> Option<MessageStatus> {
        infobip_status(status)
    }
}

fn receipt(i: usize, r: Report) -> Result<Receipt, ReceiptError> {
    let field = |name: &str| format!("results[{i}].{name}");
    let id = r
        .message_id
        .filter(|id| !id.trim().is_empty())
        .ok_or_else(|| ReceiptError::field(&field("messageId"), "is required"))?;
    if id.len() > MAX_ID_LEN {
        return Err(ReceiptError::field(
            &field("messageId"),
            "is longer than 255 characters",
        ));
    }
    let status = r
        .status
        .as_ref()
        .and_then(status_word)
        .ok_or_else(|| ReceiptError::field(&field("status"), "is required"))?;
    if status.len() > MAX_STATUS_LEN {
        return Err(ReceiptError::field(
            &field("status"),
            "is longer than 64 characters",
        ));
    }
    let error_code = r
        .error
        .filter(|e| e.id != Some(0))
        .and_then(|e| e.name)
        .filter(|n| !n.is_empty() && n != "NO_ERROR")
        .map(|n| n.chars().take(MAX_STATUS_LEN).collect());
    Ok(Receipt {
        provider_message_id: id,
        status,
        error_code,
        // Infobip's id is ours already: matching by it is exact.
        message_id: None,
    })
}
