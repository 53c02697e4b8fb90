//! Twilio's status callbacks: `POST /providers/twilio/status`, form-encoded,
//! authenticated by `X-Twilio-Signature` (HMAC-SHA1 keyed with
//! `TWILIO_AUTH_TOKEN` over the public URL of this endpoint and every POST
//! parameter; compared in constant time). The signature covers the body, so
//! only its presence (and a configured token) is checked before the body is
//! read. Twilio's `I-Twilio-Idempotency-Token` is not signed, so it is not
//! used: a captured callback replayed with fresh tokens is the same receipt.

use std::sync::Arc;

use axum::http::{HeaderMap, header};

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use super::super::registry::{Context, VarError, Vars};
use super::verify_signature;

/// The auth token's variable: the key of the signatures (and the Basic
/// auth password of the client).
pub const AUTH_TOKEN: &str = "TWILIO_AUTH_TOKEN";

/// The endpoint, with the key of the signatures (none: every callback is
/// refused).
pub struct TwilioReceipts {
    auth_token: Option<String>,
}

impl std::fmt::Debug for TwilioReceipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.auth_token.is_some() {
            "set"
        } else {
            "unset"
        };
        f.debug_struct("TwilioReceipts")
            .field("auth_token", &set)
            .finish()
    }
}

pub(super) fn configure(vars: &Vars, _ctx: &Context) -> Result<Arc<dyn ReceiptRoute>, VarError> {
    Ok(Arc::new(TwilioReceipts {
        auth_token: vars.get(AUTH_TOKEN).map(str::to_string),
    }))
}

/// The URLs Twilio may have signed for this request: the configured public
/// URL, or (none configured) this request's own address as http and https.
/// Trying several is safe: the signature must still match one of them.
pub fn signed_urls(
    public_url: Option<&str>,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Vec<String> {
    if let Some(base) = public_url {
        return vec![format!("{base}{path_and_query}")];
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return Vec::new();
    };
    vec![
        format!("https://{host}{path_and_query}"),
        format!("http://{host}{path_and_query}"),
    ]
}

impl TwilioReceipts {
    fn token_and_signature<'a>(
        &'a self,
        req: &ReceiptRequest<'a>,
    ) -> Result<(&'a str, &'a str), ReceiptError> {
        let Some(token) = self.auth_token.as_deref() else {
            tracing::warn!("a Twilio status callback arrived but TWILIO_AUTH_TOKEN is not set");
            return Err(ReceiptError::Forbidden);
        };
        let signature = req
            .headers
            .get("x-twilio-signature")
            .and_then(|v| v.to_str().ok())
            .ok_or(ReceiptError::Forbidden)?;
        Ok((token, signature))
    }
}

impl ReceiptRoute for TwilioReceipts {
    fn admit(&self, req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        self.token_and_signature(req).map(|_| ())
    }

    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError> {
        let (token, signature) = self.token_and_signature(req)?;
        let params: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
        let authentic = signed_urls(req.public_url, req.headers, req.path_and_query)
            .iter()
            .any(|url| verify_signature(token, url, &params, signature));
        if !authentic {
            tracing::warn!("rejected a Twilio status callback with a bad signature");
            return Err(ReceiptError::Forbidden);
        }
        let param = |names: &[&str]| {
            names.iter().find_map(|n| {
                params
                    .iter()
                    .find(|(k, v)| k == n && !v.is_empty())
                    .map(|(_, v)| v.clone())
            })
        };
        let sid = param(&["MessageSid", "SmsSid"])
            .ok_or_else(|| ReceiptError::field("MessageSid", "is required"))?;
        let status = param(&["MessageStatus", "SmsStatus"])
            .ok_or_else(|| ReceiptError::field("MessageStatus", "is required"))?;
        if sid.len() > MAX_ID_LEN {
            return Err(ReceiptError::field(
                "MessageSid",
                "is longer than 255 characters",
            ));
        }
        if status.len() > MAX_STATUS_LEN {
            return Err(ReceiptError::field(
                "MessageStatus",
                "is longer than 64 characters",
            ));
        }
        Ok(Receipt {
            provider_message_id: sid,
            status,
            error_code: param(&["ErrorCode"]),
            message_id: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_urls_prefer_the_public_url() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "10.0.0.5:8080".parse().unwrap());
        assert_eq!(
            signed_urls(
                Some("https://sms.example.com"),
                &headers,
                super::super::STATUS_CALLBACK_PATH
            ),
            vec!["https://sms.example.com/providers/twilio/status"]
        );
        assert_eq!(
            signed_urls(None, &headers, "/providers/twilio/status?a=1"),
            vec![
                "https://10.0.0.5:8080/providers/twilio/status?a=1",
                "http://10.0.0.5:8080/providers/twilio/status?a=1"
            ]
        );
        let debug = format!(
            "{:?}",
            TwilioReceipts {
                auth_token: Some("secret-token".into()),
            }
        );
        assert!(!debug.contains("secret-token"), "{debug}");
    }
}
