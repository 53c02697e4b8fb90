//! What WhatsApp users write to the business number: the `messages[]` of
//! the notifications Meta posts to the same webhook as the statuses
//! (Meta's messages webhook reference: "The messages webhook describes
//! messages sent from a WhatsApp user to a business and the status of
//! messages sent by a business to a WhatsApp user";
//! https://developers.facebook.com/documentation/business-messaging/whatsapp/webhooks/reference/messages).
//! Declared in the registry (`Adapter::inbound`, on the webhook's path):
//! the receipts handler takes the statuses, then hands the same signed body
//! to this route.
//!
//! | what a user wrote | effect |
//! |---|---|
//! | a text to our number (`metadata.phone_number_id`), first word STOP, UNSUBSCRIBE, … | a `message.received` event, and the number opted out **of WhatsApp** for every tenant |
//! | a text, first word START (or UNSTOP, YES) | the event, and WhatsApp's own opt-out of the number lifted |
//! | any other text | the event |
//! | anything else (media, reactions, a message to another number of the app) | taken, nothing else |
//!
//! **The address form.** A WhatsApp opt-out is stored as
//! `whatsapp:<E.164>`: it stops this channel's messages to the number and
//! no other (the store matches an opt-out of `<adapter>:<number>` to the
//! adapter's messages only). An opt-out of the bare number (an SMS STOP, a
//! tenant's own list) stops every channel to it, WhatsApp included. The
//! business number is the installation's (one `WHATSAPP_PHONE_NUMBER_ID`),
//! so a STOP counts for every tenant, as a Telegram chat's `/stop` does.
//!
//! Authentication is the statuses': `X-Hub-Signature-256` over the raw
//! body with `WHATSAPP_APP_SECRET`, constant time. A message is taken once
//! under its `wamid` (Meta delivers a notification again until it is
//! answered 200).

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::webhook::{Notification, signed_by};
use crate::domain::inbound::{Effect, Update};
use crate::provider::registry::InboundRoute;

/// The tenant that owns the events when `WHATSAPP_TENANT` is not set.
pub const DEFAULT_TENANT: &str = "default";

/// How long a taken message's id is kept. A `wamid` is never reused, so
/// this only has to outlast Meta's redeliveries of an unanswered
/// notification; Meta's reference does not say for how long it retries, so
/// a week (what guides report) is kept. A redelivery after that would add a
/// second `message.received` event; its opt-out changes nothing twice.
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The largest notification read (bytes).
pub const MAX_BYTES: usize = 256 * 1024;

/// The route, configured when the app secret and the phone number id are.
#[derive(Clone)]
pub struct WhatsAppInbound {
    /// Our business number's id (`metadata.phone_number_id`).
    phone_number_id: String,
    source: i64,
    tenant: String,
    app_secret: Vec<u8>,
}

impl std::fmt::Debug for WhatsAppInbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppInbound")
            .field("phone_number_id", &self.phone_number_id)
            .field("tenant", &self.tenant)
            .field("app_secret", &"***")
            .finish()
    }
}

impl WhatsAppInbound {
    pub fn new(phone_number_id: &str, tenant: &str, app_secret: &str) -> Self {
        WhatsAppInbound {
            phone_number_id: phone_number_id.to_string(),
            // The id is digits (checked when configured); one that does not
            // fit an i64 is keyed by its hash.
            source: phone_number_id
                .parse()
                .unwrap_or_else(|_| id_of(phone_number_id)),
            tenant: tenant.to_string(),
            app_secret: app_secret.trim().as_bytes().to_vec(),
        }
    }
}

/// A stable 63-bit key for a string id (the first 8 bytes of its SHA-256).
fn id_of(id: &str) -> i64 {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 1) as i64
}

/// The address a WhatsApp user's `from` names: `whatsapp:` and the number
/// in E.164, when it is a valid number.
pub fn address_of(from: &str) -> Option<String> {
    let digits = from.trim().trim_start_matches('+');
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    crate::domain::phone::parse(&format!("+{digits}"))
        .map(|p| format!("{}:{}", super::NAME, p.e164))
}

/// Reads a notification's incoming messages (statuses are the webhook's).
pub fn read(body: &[u8], ours: &str) -> Result<Vec<Update>, &'static str> {
    let note: Notification =
        serde_json::from_slice(body).map_err(|_| "the body is not a WhatsApp notification")?;
    let mut out = Vec::new();
    for value in note.values() {
        let to_us = value
            .metadata
            .as_ref()
            .and_then(|m| m.phone_number_id.as_deref())
            == Some(ours);
        for m in value.messages {
            let id = m.id.unwrap_or_default();
            if id.is_empty() || id.len() > 255 {
                return Err("a message has an id of 1 to 255 bytes");
            }
            let text = match (&m.kind, m.text.and_then(|t| t.body)) {
                (Some(kind), Some(text)) if kind == "text" => Some(text),
                _ => None,
            };
            let effect = match (to_us, text, m.from.as_deref().and_then(address_of)) {
                (true, Some(text), Some(address)) => {
                    let event = serde_json::json!({
                        "channel": super::NAME,
                        "from": address,
                        "text": text,
                        "message_id": id,
                        "timestamp": m.timestamp,
                    });
                    Effect::Received {
                        address,
                        event: event.to_string().into_bytes(),
                        opt_out: crate::domain::opt_out::keyword(&text),
                    }
                }
                _ => Effect::None,
            };
            out.push(Update {
                event_id: id_of(&id),
                effect,
            });
        }
    }
    Ok(out)
}

impl InboundRoute for WhatsAppInbound {
    fn channel(&self) -> &'static str {
        super::NAME
    }

    fn source(&self) -> i64 {
        self.source
    }

    fn tenant(&self) -> &str {
        &self.tenant
    }

    fn admits(&self, headers: &axum::http::HeaderMap, body: &[u8]) -> bool {
        signed_by(&self.app_secret, headers, body)
    }

    fn read(&self, body: &[u8]) -> Result<Vec<Update>, &'static str> {
        read(body, &self.phone_number_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(phone_number_id: &str, from: &str, kind: &str, text: &str, id: &str) -> String {
        serde_json::json!({
            "object": "whatsapp_business_account",
            "entry": [{"id": "102290129340398", "changes": [{"field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"display_phone_number": "15550783881", "phone_number_id": phone_number_id},
                "contacts": [{"profile": {"name": "Ann"}, "wa_id": from}],
                "messages": [{"from": from, "id": id, "timestamp": "1749416383",
                              "type": kind, kind: {"body": text}}]
            }}]}]
        })
        .to_string()
    }

    /// Ok(Some(opt-out)): a text to us from a number; Ok(None): taken,
    /// nothing else; Err: refused.
    #[test]
    fn messages_read_as_a_table() {
        const OURS: &str = "106540352242922";
        type Want = Result<Option<Option<bool>>, ()>;
        let rows: Vec<(String, Want)> = vec![
            (note(OURS, "14155550123", "text", "hello", "wamid.1"), Ok(Some(None))),
            (note(OURS, "14155550123", "text", "STOP", "wamid.2"), Ok(Some(Some(true)))),
            (note(OURS, "14155550123", "text", "stop please", "wamid.3"), Ok(Some(Some(true)))),
            (note(OURS, "14155550123", "text", "Start", "wamid.4"), Ok(Some(Some(false)))),
            (note(OURS, "14155550123", "text", "don't stop", "wamid.5"), Ok(Some(None))),
            // To another number of the same app: not ours to act on.
            (note("999", "14155550123", "text", "STOP", "wamid.6"), Ok(None)),
            // Not a text.
            (note(OURS, "14155550123", "image", "STOP", "wamid.7"), Ok(None)),
            // A `from` that is no valid number.
            (note(OURS, "1", "text", "STOP", "wamid.8"), Ok(None)),
            (note(OURS, "14155550123", "text", "STOP", ""), Err(())),
            (r#"{"entry":[{"changes":[{"value":{"statuses":[]}}]}]}"#.into(), Ok(None)),
            ("not json".into(), Err(())),
        ];
        for (body, want) in rows {
            let got = read(body.as_bytes(), OURS).map(|updates| {
                updates.into_iter().next().and_then(|u| match u.effect {
                    Effect::Received { address, opt_out, .. } => {
                        assert_eq!(address, "whatsapp:+14155550123", "{body}");
                        Some(opt_out)
                    }
                    Effect::None => None,
                })
            });
            assert_eq!(got.map_err(|_| ()), want, "{body}");
        }
    }

    #[test]
    fn a_message_is_keyed_by_its_wamid() {
        let a = read(note("1", "14155550123", "text", "x", "wamid.A").as_bytes(), "1").expect("read");
        let b = read(note("1", "14155550123", "text", "y", "wamid.A").as_bytes(), "1").expect("read");
        let c = read(note("1", "14155550123", "text", "x", "wamid.B").as_bytes(), "1").expect("read");
        assert_eq!(a[0].event_id, b[0].event_id);
        assert_ne!(a[0].event_id, c[0].event_id);
        assert!(a[0].event_id >= 0);
    }

    #[test]
    fn only_the_app_secrets_signature_admits() {
        let route = WhatsAppInbound::new("106540352242922", "default", "app-secret-0123");
        let body = b"{\"entry\":[]}";
        let mut headers = axum::http::HeaderMap::new();
        assert!(!route.admits(&headers, body));
        let good = super::super::webhook::signature("app-secret-0123", body);
        headers.insert(super::super::webhook::SIGNATURE, good.parse().expect("header"));
        assert!(route.admits(&headers, body));
        assert!(!route.admits(&headers, b"{\"entry\":[1]}"));
        let wrong = super::super::webhook::signature("another", body);
        headers.insert(super::super::webhook::SIGNATURE, wrong.parse().expect("header"));
        assert!(!route.admits(&headers, body));
    }
}
