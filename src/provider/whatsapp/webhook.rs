//! The WhatsApp webhook, `/channels/whatsapp/webhook`:
//!
//! - `GET`: Meta's subscription handshake. `hub.mode=subscribe` and
//!   `hub.verify_token` equal to `WHATSAPP_VERIFY_TOKEN` (compared in
//!   constant time, as SHA-256 digests so that not even its length shows)
//!   are answered 200 with `hub.challenge` as the body; anything else is
//!   403 ([`ReceiptRoute::handshake`]).
//! - `POST`: notifications, authenticated by `X-Hub-Signature-256:
//!   sha256=<hex>`, the HMAC-SHA256 of the raw body keyed with
//!   `WHATSAPP_APP_SECRET`, checked in constant time (`hmac`'s
//!   `verify_slice`); a missing, malformed or wrong signature, or no app
//!   secret configured, is 403 and records nothing. Every
//!   `entry[].changes[].value.statuses[]` becomes a receipt of the message
//!   whose provider id is its `id` (the `wamid`), with the first
//!   `errors[].code` as its error code and `biz_opaque_callback_data` (our
//!   message id, covered by the signature) to find a message whose send
//!   ended without the `wamid` (an ambiguous send). A notification without
//!   statuses (an account update) is answered 200 with no receipt; the
//!   messages users write are then taken by the inbound route on the same
//!   path ([`super::inbound`]).
//!
//! Meta delivers statuses more than once and in any order: the service's
//! one receipt handling stores each (id, status, error) once and moves a
//! message only forward from `sent` (a `sent` after `delivered` is kept in
//! the history and changes nothing). Words: `sent` → sent; `delivered` and
//! `read` → delivered ("A status is considered read only if it has been
//! delivered"); `failed` → undelivered (which makes a verification's next
//! channel go at once); any other word is kept and changes nothing.

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::super::receipts::{
    MAX_ID_LEN, MAX_STATUS_LEN, Receipt, ReceiptError, ReceiptRequest, ReceiptRoute,
};
use crate::domain::{MessageId, Status};

/// The signature header.
pub const SIGNATURE: &str = "x-hub-signature-256";

/// The longest `hub.challenge` echoed (Meta sends an integer).
pub const MAX_CHALLENGE_LEN: usize = 255;

/// The webhook with its secrets.
pub struct WhatsAppWebhook {
    /// `WHATSAPP_APP_SECRET`; `None`: every notification is refused.
    app_secret: Option<Vec<u8>>,
    /// SHA-256 of `WHATSAPP_VERIFY_TOKEN`; `None`: every handshake is
    /// refused.
    verify_token: Option<[u8; 32]>,
}

/// Never a secret.
impl std::fmt::Debug for WhatsAppWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppWebhook")
            .field("app_secret", &self.app_secret.as_ref().map(|_| "***"))
            .field("verify_token", &self.verify_token.map(|_| "***"))
            .finish()
    }
}

impl WhatsAppWebhook {
    pub fn new(app_secret: Option<&str>, verify_token: Option<&str>) -> Self {
        WhatsAppWebhook {
            app_secret: app_secret.map(|s| s.trim().as_bytes().to_vec()),
            verify_token: verify_token.map(|t| Sha256::digest(t.trim().as_bytes()).into()),
        }
    }

    /// Whether `headers` carry the body's signature under the app secret.
    fn verify(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<(), ReceiptError> {
        let key = self.app_secret.as_deref().ok_or(ReceiptError::Forbidden)?;
        if signed_by(key, req.headers, body) {
            Ok(())
        } else {
            Err(ReceiptError::Forbidden)
        }
    }
}

/// Whether `headers` carry `X-Hub-Signature-256` of `body` under `key`
/// (the app secret), checked in constant time (`hmac`'s `verify_slice`,
/// `subtle` underneath). Statuses and users' messages alike.
pub(super) fn signed_by(key: &[u8], headers: &axum::http::HeaderMap, body: &[u8]) -> bool {
    let Some(given) = headers
        .get(SIGNATURE)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(decode_hex)
    else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// `X-Hub-Signature-256` of `body` under `app_secret`: `sha256=` and the
/// hex HMAC-SHA256.
pub fn signature(app_secret: &str, body: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(app_secret.as_bytes()) else {
        return String::new();
    };
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// 32 bytes from 64 hex digits (either case); `None` for anything else.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    hex.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// A notification as Meta posts it: only what is used is read. Statuses
/// are read here, what users wrote by [`super::inbound`].
#[derive(Deserialize)]
pub(super) struct Notification {
    #[serde(default)]
    pub(super) entry: Vec<Entry>,
}

#[derive(Deserialize)]
pub(super) struct Entry {
    #[serde(default)]
    pub(super) changes: Vec<Change>,
}

#[derive(Deserialize)]
pub(super) struct Change {
    #[serde(default)]
    pub(super) value: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct Value {
    #[serde(default)]
    statuses: Vec<StatusNote>,
    #[serde(default)]
    pub(super) metadata: Option<Metadata>,
    #[serde(default)]
    pub(super) messages: Vec<Incoming>,
}

#[derive(Deserialize)]
pub(super) struct Metadata {
    #[serde(default)]
    pub(super) phone_number_id: Option<String>,
}

/// One message a user wrote (`value.messages[]`).
#[derive(Deserialize)]
pub(super) struct Incoming {
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) from: Option<String>,
    #[serde(default)]
    pub(super) timestamp: Option<String>,
    #[serde(default, rename = "type")]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) text: Option<Text>,
}

#[derive(Deserialize)]
pub(super) struct Text {
    #[serde(default)]
    pub(super) body: Option<String>,
}

impl Notification {
    /// Every change's value, in order.
    pub(super) fn values(self) -> impl Iterator<Item = Value> {
        self.entry
            .into_iter()
            .flat_map(|e| e.changes)
            .filter_map(|c| c.value)
    }
}

#[derive(Deserialize)]
struct StatusNote {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    errors: Vec<StatusError>,
    #[serde(default)]
    biz_opaque_callback_data: Option<String>,
}

#[derive(Deserialize)]
struct StatusError {
    #[serde(default)]
    code: Option<serde_json::Value>,
}

/// The receipts a notification carries, in order.
pub fn statuses(body: &[u8]) -> Result<Vec<Receipt>, ReceiptError> {
    let note: Notification =
        serde_json::from_slice(body).map_err(|_| ReceiptError::MalformedJson)?;
    let mut out = Vec::new();
    for status in note.values().flat_map(|v| v.statuses) {
        let id = status.id.unwrap_or_default();
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(ReceiptError::field(
                "entry[].changes[].value.statuses[].id",
                "must be a message id of at most 255 bytes",
            ));
        }
        let word = status.status.unwrap_or_default();
        if word.is_empty() || word.len() > MAX_STATUS_LEN {
            return Err(ReceiptError::field(
                "entry[].changes[].value.statuses[].status",
                "must be a status of at most 64 bytes",
            ));
        }
        let error_code = status
            .errors
            .first()
            .and_then(|e| match e.code.as_ref()? {
                serde_json::Value::Number(n) => Some(n.to_string()),
                serde_json::Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .filter(|c| !c.is_empty() && c.len() <= MAX_STATUS_LEN);
        out.push(Receipt {
            provider_message_id: id,
            status: word,
            error_code,
            message_id: status.biz_opaque_callback_data.as_deref().and_then(our_id),
        });
    }
    Ok(out)
}

/// Our message id as the adapter sends it (`msg_` and 32 hex digits).
pub fn our_id(data: &str) -> Option<MessageId> {
    let hex = data.strip_prefix("msg_")?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    uuid::Uuid::try_parse(hex).ok().map(MessageId)
}

/// What a status word means for the message.
pub fn status_of(word: &str) -> Option<Status> {
    match word.to_ascii_lowercase().as_str() {
        "sent" => Some(Status::Sent),
        "delivered" | "read" => Some(Status::Delivered),
        "failed" => Some(Status::Undelivered),
        _ => None,
    }
}

/// The handshake's answer to a query string.
fn challenge(verify_token: Option<&[u8; 32]>, query: &str) -> Result<String, ReceiptError> {
    use subtle::ConstantTimeEq;
    let want = verify_token.ok_or(ReceiptError::Forbidden)?;
    let mut mode = None;
    let mut token = None;
    let mut challenge = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "hub.mode" => mode = Some(v.into_owned()),
            "hub.verify_token" => token = Some(v.into_owned()),
            "hub.challenge" => challenge = Some(v.into_owned()),
            _ => {}
        }
    }
    let given: [u8; 32] = Sha256::digest(token.ok_or(ReceiptError::Forbidden)?.trim().as_bytes()).into();
    if !bool::from(given.ct_eq(want)) || mode.as_deref() != Some("subscribe") {
        return Err(ReceiptError::Forbidden);
    }
    match challenge {
        Some(c)
            if !c.is_empty()
                && c.len() <= MAX_CHALLENGE_LEN
                && c.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(c)
        }
        _ => Err(ReceiptError::field(
            "hub.challenge",
            "must be 1 to 255 visible ASCII characters",
        )),
    }
}

impl ReceiptRoute for WhatsAppWebhook {
    fn handshake(&self, req: &ReceiptRequest<'_>) -> Option<Result<String, ReceiptError>> {
        // Every GET here is a handshake: statuses come by POST only.
        let query = req.path_and_query.split_once('?').map_or("", |(_, q)| q);
        Some(challenge(self.verify_token.as_ref(), query))
    }

    fn admit(&self, req: &ReceiptRequest<'_>) -> Result<(), ReceiptError> {
        if self.app_secret.is_none()
            || req.method != axum::http::Method::POST
            || req.headers.get(SIGNATURE).is_none()
        {
            return Err(ReceiptError::Forbidden);
        }
        Ok(())
    }

    fn read(&self, req: &ReceiptRequest<'_>, body: &[u8]) -> Result<Receipt, ReceiptError> {
        self.read_all(req, body)?
            .into_iter()
            .next()
            .ok_or_else(|| ReceiptError::field("entry[].changes[].value.statuses", "is empty"))
    }

    fn read_all(
        &self,
        req: &ReceiptRequest<'_>,
        body: &[u8],
    ) -> Result<Vec<Receipt>, ReceiptError> {
        self.admit(req)?;
        self.verify(req, body)?;
        statuses(body)
    }

    fn delivery_status(&self, status: &str) -> Option<Status> {
        status_of(status)
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, Method};

    use super::*;

    const SECRET: &str = "app-secret-0123";

    fn request<'a>(
        method: &'a Method,
        headers: &'a HeaderMap,
        path_and_query: &'a str,
    ) -> ReceiptRequest<'a> {
        ReceiptRequest {
            method,
            headers,
            path_and_query,
            public_url: None,
            now: time::OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn signed(body: &str, secret: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            SIGNATURE,
            signature(secret, body.as_bytes()).parse().expect("header"),
        );
        h
    }

    const OURS: &str = "msg_0190f5a1b2c37d4e8f90a1b2c3d4e5f6";

    fn body(statuses: serde_json::Value) -> String {
        serde_json::json!({
            "object": "whatsapp_business_account",
            "entry": [{"id": "102290129340398", "changes": [{"field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
                "statuses": statuses
            }}]}]
        })
        .to_string()
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_raw_body_keyed_with_the_app_secret() {
        // python3 -c 'import hmac,hashlib;
        //   print(hmac.new(b"app-secret-0123", b"{}", hashlib.sha256).hexdigest())'
        assert_eq!(
            signature(SECRET, b"{}"),
            "sha256=800e6151b6467dd9ac9930df48564ff28dfb40ca142844e8d6a18821fdfad5a5"
        );
    }

    #[test]
    fn statuses_are_taken_only_signed_with_the_app_secret() {
        let hook = WhatsAppWebhook::new(Some(SECRET), Some("verify-me"));
        let post = Method::POST;
        let text = body(serde_json::json!([
            {"id": "wamid.A", "status": "delivered", "timestamp": "1749416383",
             "recipient_id": "14155550123", "biz_opaque_callback_data": OURS},
        ]));
        let headers = signed(&text, SECRET);
        let got = hook
            .read_all(&request(&post, &headers, "/channels/whatsapp/webhook"), text.as_bytes())
            .expect("authentic");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].provider_message_id, "wamid.A");
        assert_eq!(got[0].status, "delivered");
        assert_eq!(got[0].message_id.map(|m| m.to_string()).as_deref(), Some(OURS));

        let upper = {
            let mut h = HeaderMap::new();
            let sig = signature(SECRET, text.as_bytes());
            let hex = sig.trim_start_matches("sha256=").to_ascii_uppercase();
            h.insert(SIGNATURE, format!("sha256={hex}").parse().expect("h"));
            h
        };
        assert!(hook.read_all(&request(&post, &upper, "/"), text.as_bytes()).is_ok());

        // (what the signature header says, the body actually posted)
        let forged_body = text.replace("delivered", "failed");
        let wrong = signature("another-secret", text.as_bytes());
        let no_prefix = signature(SECRET, text.as_bytes()).replace("sha256=", "");
        let short = signature(SECRET, text.as_bytes())[..40].to_string();
        let sha1 = signature(SECRET, text.as_bytes()).replace("sha256=", "sha1=");
        let rows: Vec<(Option<String>, &str)> = vec![
            (None, &text),
            (Some(wrong), &text),
            (Some(signature(SECRET, text.as_bytes())), &forged_body),
            (Some(no_prefix), &text),
            (Some(short), &text),
            (Some(sha1), &text),
            (Some("sha256=zz".into()), &text),
            (Some(format!("sha256={}", "0".repeat(64))), &text),
        ];
        for (sig, posted) in rows {
            let mut h = HeaderMap::new();
            if let Some(s) = &sig {
                h.insert(SIGNATURE, s.parse().expect("header"));
            }
            assert_eq!(
                hook.read_all(&request(&post, &h, "/"), posted.as_bytes())
                    .map(|_| ()),
                Err(ReceiptError::Forbidden),
                "{sig:?}"
            );
        }
        // No app secret configured: nothing is taken, however signed.
        let unkeyed = WhatsAppWebhook::new(None, None);
        assert_eq!(
            unkeyed
                .read_all(&request(&post, &headers, "/"), text.as_bytes())
                .map(|_| ()),
            Err(ReceiptError::Forbidden)
        );
        assert!(!format!("{hook:?}").contains(SECRET));
    }

    #[test]
    fn notifications_parse_into_receipts() {
        let text = body(serde_json::json!([
            {"id": "wamid.A", "status": "sent", "timestamp": "1", "recipient_id": "1",
             "biz_opaque_callback_data": OURS,
             "pricing": {"billable": true, "pricing_model": "PMP", "category": "authentication"}},
            {"id": "wamid.A", "status": "read", "timestamp": "3", "recipient_id": "1"},
            {"id": "wamid.B", "status": "failed", "timestamp": "2", "recipient_id": "1",
             "errors": [{"code": 131026, "title": "Message undeliverable"}],
             "biz_opaque_callback_data": "not-ours"},
        ]));
        let got = statuses(text.as_bytes()).expect("parsed");
        let seen: Vec<(&str, &str, Option<&str>, bool)> = got
            .iter()
            .map(|r| {
                (
                    r.provider_message_id.as_str(),
                    r.status.as_str(),
                    r.error_code.as_deref(),
                    r.message_id.is_some(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("wamid.A", "sent", None, true),
                ("wamid.A", "read", None, false),
                ("wamid.B", "failed", Some("131026"), false),
            ]
        );
        // An incoming message, no statuses: nothing, and no error.
        let inbound = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "1",
            "changes": [{"field": "messages", "value": {"messages": [{"from": "1", "id": "wamid.in",
            "type": "text", "text": {"body": "STOP"}}]}}]}]});
        assert_eq!(statuses(inbound.to_string().as_bytes()), Ok(Vec::new()));
        assert_eq!(statuses(b"not json"), Err(ReceiptError::MalformedJson));
        for bad in [
            serde_json::json!([{"status": "sent"}]),
            serde_json::json!([{"id": "wamid.A"}]),
            serde_json::json!([{"id": "x".repeat(256), "status": "sent"}]),
        ] {
            assert!(
                matches!(statuses(body(bad.clone()).as_bytes()), Err(ReceiptError::Invalid(_))),
                "{bad}"
            );
        }
        let words = [
            ("sent", Some(Status::Sent)),
            ("delivered", Some(Status::Delivered)),
            ("read", Some(Status::Delivered)),
            ("failed", Some(Status::Undelivered)),
            ("deleted", None),
        ];
        for (word, want) in words {
            assert_eq!(status_of(word), want, "{word}");
        }
        assert_eq!(our_id("msg_0123"), None);
    }

    #[test]
    fn the_handshake_echoes_the_challenge_only_for_the_verify_token() {
        let hook = WhatsAppWebhook::new(Some(SECRET), Some("verify-me"));
        let get = Method::GET;
        let headers = HeaderMap::new();
        let shake = |pq: &str| hook.handshake(&request(&get, &headers, pq));
        assert_eq!(
            shake("/channels/whatsapp/webhook?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=verify-me"),
            Some(Ok("1158201444".into()))
        );
        let refused = [
            "/channels/whatsapp/webhook",
            "/w?hub.mode=subscribe&hub.challenge=1&hub.verify_token=verify-mE",
            "/w?hub.mode=subscribe&hub.challenge=1&hub.verify_token=verify-me-too",
            "/w?hub.mode=subscribe&hub.challenge=1",
            "/w?hub.mode=unsubscribe&hub.challenge=1&hub.verify_token=verify-me",
            "/w?hub.challenge=1&hub.verify_token=verify-me",
        ];
        for pq in refused {
            assert_eq!(shake(pq), Some(Err(ReceiptError::Forbidden)), "{pq}");
        }
        // The right token with a challenge that is not one.
        assert!(matches!(
            shake("/w?hub.mode=subscribe&hub.challenge=%3Cscript%3E%20x&hub.verify_token=verify-me"),
            Some(Err(ReceiptError::Invalid(_)))
        ));
        // No verify token configured: every handshake refused.
        let unkeyed = WhatsAppWebhook::new(Some(SECRET), None);
        assert_eq!(
            unkeyed.handshake(&request(
                &get,
                &headers,
                "/w?hub.mode=subscribe&hub.challenge=1&hub.verify_token="
            )),
            Some(Err(ReceiptError::Forbidden))
        );
        // A GET is never read as statuses.
        assert_eq!(
            hook.admit(&request(&get, &signed("{}", SECRET), "/")),
            Err(ReceiptError::Forbidden)
        );
    }
}
