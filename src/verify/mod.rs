//! Verifications: one-time codes sent through the ordinary exactly-once send
//! path (see docs/architecture.md, "Verifications").
//!
//! - A code is drawn from a CSPRNG and never stored, logged or answered in
//!   plain text: the row keeps an HMAC of it (checks compare in constant
//!   time) and the code sealed under a key derived from the verify secret
//!   (resends); each send is a message whose body is sealed to its message
//!   id and opened only by the delivery task, right before the provider call.
//! - Each send is a message under the idempotency key
//!   `ver_<id>:send:<n>`, inserted in the same transaction as the change that
//!   causes it (the start, or the resend that raised `sends` to n).
//! - What a check or resend may do is decided by the pure functions in
//!   [`decide`] from the row as read; the store writes the change only if
//!   the row is still so (and the caller decides again if not).

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::clock::to_time;
use crate::domain::{IdempotencyKey, MessageId, Phone, Recipient, segments};
use crate::store::{MessageRecord, NewMessage, VerificationRecord, send_key};

pub use crate::domain::channels;
pub mod crypto;
/// A verification's pure decisions live with the domain (the store uses
/// them too); here under their old name.
pub use crate::domain::verification as decide;
pub mod expiry;
mod request;
pub mod settings;

pub use crate::domain::{Channel, Channels, FallbackAfter};
pub use crypto::{Keys, SecretSource};
pub use decide::VerificationStatus;
pub use request::{StartRequest, parse_check};
pub use settings::VerifySettings;

/// The text sent when a start names no template.
pub const DEFAULT_TEMPLATE: &str = "Your verification code is {code}";
/// Where the code goes in a template.
pub const PLACEHOLDER: &str = "{code}";
/// The fewest digits a new verification's code may have (`code_length`).
pub const MIN_CODE_LENGTH: u64 = 6;
/// How long a step's message has to be reported delivered before the
/// next channel is used, unless a start says (`fallback_after_seconds`),
/// and the bounds a start may say.
pub const DEFAULT_FALLBACK_AFTER: u32 = 60;
pub const FALLBACK_AFTER_SECONDS: std::ops::RangeInclusive<u64> = 5..=600;

/// The verification service's parts an HTTP handler needs.
pub struct Verifier {
    pub settings: VerifySettings,
    pub secret: Arc<SecretSource>,
    /// Starts per destination number / prefix per hour (0: no limit).
    pub number_per_hour: u32,
    pub prefix_per_hour: u32,
}

/// The text of a verification's SMS with `code` in it.
pub fn render(template: Option<&str>, code: &str) -> String {
    template
        .unwrap_or(DEFAULT_TEMPLATE)
        .replacen(PLACEHOLDER, code, 1)
}

/// The text of a verification's SMS with its code masked, as answered.
pub fn masked(v: &VerificationRecord) -> String {
    let stars = "*".repeat(usize::try_from(v.code_length).unwrap_or(6));
    render(v.template.as_deref(), &stars)
}

/// The public id of a verification.
pub fn public_id(id: Uuid) -> String {
    format!("ver_{}", id.simple())
}

/// A path's verification id; `None` for anything that is not one.
pub fn parse_id(s: &str) -> Option<Uuid> {
    let hex = s.strip_prefix("ver_")?;
    if hex.len() != 32 {
        return None;
    }
    Uuid::try_parse(hex).ok()
}

pub use crate::domain::Via;

/// The message of send number `v.sends + 1`: the code opened, rendered,
/// and sealed again to the new message's id. `None` when the code does not
/// open (the verify secret changed).
pub fn next_send(
    keys: &Keys,
    v: &VerificationRecord,
    via: &Via,
    retry_deadline: std::time::Duration,
    now: OffsetDateTime,
) -> Option<NewMessage> {
    let code = opened_code(keys, v)?;
    send_message(keys, v, v.sends + 1, &code, via, retry_deadline, now)
}

/// `v`'s code, opened from its sealed copy; `None` when it does not open.
fn opened_code(keys: &Keys, v: &VerificationRecord) -> Option<String> {
    let code = keys.open(v.id.as_bytes(), &v.code_sealed).ok()?;
    String::from_utf8(code).ok()
}

/// The message of send number `n` of `code` on the channel `via` leads
/// to; `None` if the stored number is not E.164 (a broken row).
pub fn send_message(
    keys: &Keys,
    v: &VerificationRecord,
    n: u32,
    code: &str,
    via: &Via,
    retry_deadline: std::time::Duration,
    now: OffsetDateTime,
) -> Option<NewMessage> {
    build(keys, v, &send_key(v.id, n), code, via, retry_deadline, now)
}

/// The message of step `channel` of send `n`, when the step before did not
/// deliver it: the same code, under the key `ver_<id>:send:<n>:<channel>`.
/// `None` when the code does not open (the verify secret changed) or the
/// row is broken.
pub fn fallback_message(
    keys: &Keys,
    v: &VerificationRecord,
    n: u32,
    channel: Channel,
    via: &Via,
    retry_deadline: std::time::Duration,
    now: OffsetDateTime,
) -> Option<NewMessage> {
    let code = opened_code(keys, v)?;
    let key = crate::store::fallback_key(v.id, n, channel);
    build(keys, v, &key, &code, via, retry_deadline, now)
}

fn build(
    keys: &Keys,
    v: &VerificationRecord,
    key: &str,
    code: &str,
    via: &Via,
    retry_deadline: std::time::Duration,
    now: OffsetDateTime,
) -> Option<NewMessage> {
    let channel = channel_of_provider(&via.provider);
    // A channel whose own text carries the code is handed the code alone.
    let body = if code_only(channel) {
        code.to_string()
    } else {
        render(v.template.as_deref(), code)
    };
    let count = segments::count(&body);
    let id = MessageId::new();
    let remaining = (v.expires_at - now).whole_seconds().max(1);
    Some(NewMessage {
        id,
        tenant_id: v.tenant_id,
        // `ver_` + hex + `:send:` + digits (+ `:sms`): always a valid key.
        idempotency_key: IdempotencyKey::parse(key).ok()?,
        fingerprint: Sha256::digest(key.as_bytes()).to_vec(),
        to: Recipient::Sms(Phone::from_e164(&v.to)?),
        from: None,
        body: keys.seal_body(id.0, &body, &masked_as(v, channel)),
        segments: count.segments,
        encoding: count.encoding,
        metadata: BTreeMap::from([("verification_id".to_string(), public_id(v.id))]),
        validity_seconds: Some(i32::try_from(remaining).unwrap_or(i32::MAX)),
        provider: via.provider.clone(),
        route: via.route.clone(),
        route_order: via.order.clone(),
        sender: via.sender.clone(),
        created_at: now,
        expires_at: Some(v.expires_at),
        deadline_at: (now + to_time(retry_deadline)).min(v.expires_at),
        cost: None,
    })
}

/// The text of a verification's message on `channel` with its code
/// masked: the template's, or the code's digits where the channel is
/// handed the code alone.
pub fn masked_as(v: &VerificationRecord, channel: Channel) -> String {
    if code_only(channel) {
        "*".repeat(usize::try_from(v.code_length).unwrap_or(6))
    } else {
        masked(v)
    }
}

/// Whether `channel`'s provider is handed the code alone (the registry
/// says).
pub fn code_only(channel: Channel) -> bool {
    crate::provider::registry::verify_adapter(channel).is_some_and(|(_, v)| v.code_only)
}

/// A verification's message as answered: never its body's code.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SentMessage {
    pub id: String,
    pub idempotency_key: String,
    /// The channel it went on (`sms`, `telegram`, `whatsapp`).
    pub channel: &'static str,
    pub status: crate::domain::Status,
    pub body: String,
    /// The channel's last word on a message of a channel of its own
    /// (the Gateway's `sent`, `delivered`, `read`, `expired`, `revoked`),
    /// once it reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_report: Option<String>,
}

impl SentMessage {
    /// A send about to be inserted, as its claimed row will stand
    /// (`processing`).
    pub fn queued(m: &NewMessage, v: &VerificationRecord) -> Self {
        let channel = channel_of_provider(&m.provider);
        Self {
            id: m.id.to_string(),
            idempotency_key: m.idempotency_key.to_string(),
            channel: channel.as_str(),
            status: crate::domain::Status::Processing,
            body: masked_as(v, channel),
            delivery_report: None,
        }
    }

    pub fn of(m: &MessageRecord, v: &VerificationRecord) -> Self {
        let channel = channel_of_provider(&m.provider);
        Self {
            id: m.id.to_string(),
            idempotency_key: m.idempotency_key.to_string(),
            channel: channel.as_str(),
            status: m.status,
            body: masked_as(v, channel),
            delivery_report: None,
        }
    }
}

/// The verification resource (never the code).
#[derive(Clone, Debug, serde::Serialize)]
pub struct VerificationOut {
    pub id: String,
    pub status: VerificationStatus,
    pub to: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    pub sends: u32,
    pub checks_remaining: u32,
    #[serde(with = "time::serde::rfc3339::option")]
    pub resend_available_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub approved_at: Option<OffsetDateTime>,
    /// The channels its code goes through, in order.
    pub channels: Vec<&'static str>,
    /// How long a step has to report delivery before the next channel
    /// (when there is one): one number for every step, or one per step
    /// after the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_after_seconds: Option<serde_json::Value>,
    pub messages: Vec<SentMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
}

impl VerificationOut {
    pub fn of(
        v: &VerificationRecord,
        messages: Vec<SentMessage>,
        settings: &VerifySettings,
        now: OffsetDateTime,
    ) -> Self {
        let state = v.state();
        Self {
            id: public_id(v.id),
            status: decide::status_at(&state, now),
            to: v.to.clone(),
            created_at: v.created_at,
            expires_at: v.expires_at,
            sends: v.sends,
            checks_remaining: v.checks_remaining,
            resend_available_at: decide::resend_available_at(
                &state,
                now,
                settings.resend_cooldown,
                settings.max_sends,
            ),
            approved_at: v.approved_at,
            channels: v.channels.names(),
            fallback_after_seconds: (v.channels.len() > 1).then(|| match &v.fallback_after {
                FallbackAfter::Every(n) => serde_json::json!(n),
                FallbackAfter::Each(list) => serde_json::json!(list),
            }),
            messages,
            valid: None,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The channel of a message that went through `provider` (the registry
/// says).
pub fn channel_of_provider(provider: &str) -> Channel {
    crate::provider::registry::verify_channel_of(provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_and_mask() {
        assert_eq!(render(None, "123456"), "Your verification code is 123456");
        assert_eq!(render(Some("{code} is your code"), "42"), "42 is your code");
        let id = Uuid::now_v7();
        assert_eq!(parse_id(&public_id(id)), Some(id));
        assert_eq!(parse_id("ver_xyz"), None);
        assert_eq!(parse_id(&id.simple().to_string()), None);
    }
}
