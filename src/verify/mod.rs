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
use crate::domain::{FieldError, IdempotencyKey, MessageId, Phone, Recipient, segments};
use crate::store::{MessageRecord, NewMessage, VerificationRecord, send_key};

pub mod channels;
pub mod crypto;
pub mod decide;
pub mod expiry;
pub mod fallback;
pub mod settings;

pub use channels::{Channel, Channels};
pub use crypto::{Keys, SecretSource};
pub use decide::VerificationStatus;
pub use settings::VerifySettings;

/// The text sent when a start names no template.
pub const DEFAULT_TEMPLATE: &str = "Your verification code is {code}";
/// Where the code goes in a template.
pub const PLACEHOLDER: &str = "{code}";
/// The fewest digits a new verification's code may have (`code_length`).
pub const MIN_CODE_LENGTH: u64 = 6;
/// How long a Telegram message has to be reported delivered before the
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

/// A parsed, valid `POST /verifications` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRequest {
    pub to: Phone,
    pub country: Option<String>,
    pub code_length: u32,
    pub ttl_seconds: u32,
    pub template: Option<String>,
    /// The channels its code goes through, in order.
    pub channels: Channels,
    /// How long Telegram has to report delivery before the next channel.
    pub fallback_after_seconds: u32,
}

impl StartRequest {
    /// Parses a JSON body; `Err(None)`: not a JSON object.
    pub fn parse(body: &[u8]) -> Result<Self, Option<Vec<FieldError>>> {
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| None)?;
        refuse_duplicate_keys(body)?;
        let obj = value.as_object().ok_or(None)?;
        let mut errors = Vec::new();
        let err = |field: &str, message: &str| FieldError {
            field: field.into(),
            message: message.into(),
        };
        for k in obj.keys() {
            if !matches!(
                k.as_str(),
                "to" | "code_length"
                    | "ttl_seconds"
                    | "template"
                    | "channels"
                    | "fallback_after_seconds"
            ) {
                errors.push(err(k, "unknown field"));
            }
        }
        let mut to = None;
        match obj.get("to").map(|v| v.as_str()) {
            None => errors.push(err("to", "is required")),
            Some(None) => errors.push(err("to", "must be a string")),
            Some(Some(s)) => match crate::domain::phone::parse(s) {
                Some(p) => to = Some(p.into_parts()),
                None => errors.push(err(
                    "to",
                    "must be a valid phone number in E.164 (+ and digits)",
                )),
            },
        }
        let int =
            |field: &str, lo: u64, hi: u64, default: u32, errors: &mut Vec<FieldError>| match obj
                .get(field)
            {
                None => default,
                // JSON Schema's `integer` includes `7.0`.
                Some(v) => match v
                    .as_u64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| f.fract() == 0.0 && (0.0..=1e9).contains(f))
                            .map(|f| f as u64)
                    })
                    .filter(|n| (lo..=hi).contains(n))
                {
                    Some(n) => u32::try_from(n).unwrap_or(default),
                    None => {
                        errors.push(FieldError {
                            field: field.into(),
                            message: format!("must be a whole number from {lo} to {hi}"),
                        });
                        default
                    }
                },
            };
        // Fewer than 6 digits is a one-in-ten-thousand guess per check.
        let code_length = int("code_length", MIN_CODE_LENGTH, 10, 6, &mut errors);
        let ttl_seconds = int("ttl_seconds", 30, 3600, 600, &mut errors);
        let template = match obj.get("template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(t)) => {
                let braces = t.chars().filter(|c| matches!(c, '{' | '}')).count();
                if t.matches(PLACEHOLDER).count() != 1 || braces != 2 {
                    errors.push(err(
                        "template",
                        "must contain {code} exactly once, and no other { or }",
                    ));
                } else if t.chars().count() > 1000 {
                    errors.push(err("template", "must be at most 1000 characters"));
                } else if crate::domain::segments::has_refused_control(t) {
                    errors.push(err(
                        "template",
                        "must not contain control characters other than newline and tab",
                    ));
                }
                Some(t.clone())
            }
            Some(_) => {
                errors.push(err("template", "must be a string"));
                None
            }
        };
        let channels = match obj.get("channels") {
            None => Channels::default(),
            Some(v) => Channels::from_json(v).unwrap_or_else(|why| {
                errors.push(err("channels", why));
                Channels::default()
            }),
        };
        let telegram = channels.contains(Channel::Telegram);
        let digits = crate::provider::telegram_gateway::CODE_DIGITS;
        if telegram && !digits.contains(&code_length) {
            errors.push(err(
                "code_length",
                "must be at most 8 when channels include telegram (the Telegram Gateway takes 4 to 8 digits)",
            ));
        }
        let falls_back = channels.after(Channel::Telegram).is_some();
        let fallback_after_seconds = if obj.contains_key("fallback_after_seconds") && !falls_back {
            errors.push(err(
                "fallback_after_seconds",
                "applies only when channels start with telegram and name a next channel",
            ));
            0
        } else if falls_back {
            let (lo, hi) = (
                *FALLBACK_AFTER_SECONDS.start(),
                *FALLBACK_AFTER_SECONDS.end(),
            );
            let given = obj.contains_key("fallback_after_seconds");
            let n = int(
                "fallback_after_seconds",
                lo,
                hi,
                DEFAULT_FALLBACK_AFTER,
                &mut errors,
            );
            // Unsaid, it is never past half the verification's life.
            let n = if given {
                n
            } else {
                n.min((ttl_seconds / 2).max(5))
            };
            if given && n >= ttl_seconds {
                errors.push(err(
                    "fallback_after_seconds",
                    "must be less than ttl_seconds (the next channel must go while the code is valid)",
                ));
            }
            n
        } else {
            0
        };
        match to {
            Some((to, country)) if errors.is_empty() => Ok(Self {
                to,
                country,
                code_length,
                ttl_seconds,
                template,
                channels,
                fallback_after_seconds,
            }),
            _ => Err(Some(errors)),
        }
    }

    /// SHA-256 of the request's meaning, to tell a replay from another
    /// request under the same key.
    pub fn fingerprint(&self) -> Vec<u8> {
        let mut h = Sha256::new();
        h.update(b"verification v1\0");
        h.update(self.to.as_str());
        h.update(format!("\0{}\0{}\0", self.code_length, self.ttl_seconds));
        match &self.template {
            Some(t) => {
                h.update(b"t");
                h.update(t);
            }
            None => h.update(b"-"),
        }
        // Said only when not the default, so that an SMS-only start keeps
        // the fingerprint it had before channels existed.
        if self.channels != Channels::default() {
            h.update(format!(
                "\0c{}\0{}",
                self.channels.stored(),
                self.fallback_after_seconds
            ));
        }
        h.finalize().to_vec()
    }
}

/// A check's code: 4 to 10 digits.
/// A JSON key twice in one object means different things to different
/// parsers (the last `to` won): refused, as in every other body.
fn refuse_duplicate_keys(body: &[u8]) -> Result<(), Option<Vec<FieldError>>> {
    match crate::domain::request::duplicate_key(body) {
        None => Ok(()),
        Some(path) => Err(Some(vec![FieldError {
            field: path,
            message: "appears more than once in the JSON object".into(),
        }])),
    }
}

pub fn parse_check(body: &[u8]) -> Result<String, Option<Vec<FieldError>>> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| None)?;
    refuse_duplicate_keys(body)?;
    let obj = value.as_object().ok_or(None)?;
    let bad = |message: &str| {
        Some(vec![FieldError {
            field: "code".into(),
            message: message.into(),
        }])
    };
    if let Some(k) = obj.keys().find(|k| k.as_str() != "code") {
        return Err(Some(vec![FieldError {
            field: k.clone(),
            message: "unknown field".into(),
        }]));
    }
    match obj.get("code") {
        None => Err(bad("is required")),
        Some(serde_json::Value::String(c))
            if (4..=10).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Ok(c.clone())
        }
        Some(_) => Err(bad("must be a string of 4 to 10 digits")),
    }
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

/// The provider a verification's message starts on, and who its first
/// attempt sends as there.
#[derive(Clone, Debug)]
pub struct Via {
    pub provider: String,
    pub sender: Option<String>,
    /// The route (`SENDONCE_ROUTES` prefix) the number took, if routed.
    pub route: Option<String>,
}

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

/// The next channel's message of send `n`, when Telegram did not deliver
/// it: the same code, under the key `ver_<id>:send:<n>:sms`. `None` when
/// the code does not open (the verify secret changed) or the row is broken.
pub fn fallback_message(
    keys: &Keys,
    v: &VerificationRecord,
    n: u32,
    via: &Via,
    retry_deadline: std::time::Duration,
    now: OffsetDateTime,
) -> Option<NewMessage> {
    let code = opened_code(keys, v)?;
    let key = crate::store::fallback_key(v.id, n);
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
    let channel = Channel::of_provider(&via.provider);
    // The Gateway is handed the code alone (its own text carries it).
    let body = match channel {
        Channel::Telegram => code.to_string(),
        Channel::Sms => render(v.template.as_deref(), code),
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
        sender: via.sender.clone(),
        created_at: now,
        expires_at: Some(v.expires_at),
        deadline_at: (now + to_time(retry_deadline)).min(v.expires_at),
        cost: None,
    })
}

/// The text of a verification's message on `channel` with its code
/// masked: the template's for SMS, the code's digits for Telegram.
pub fn masked_as(v: &VerificationRecord, channel: Channel) -> String {
    match channel {
        Channel::Sms => masked(v),
        Channel::Telegram => "*".repeat(usize::try_from(v.code_length).unwrap_or(6)),
    }
}

/// A verification's message as answered: never its body's code.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SentMessage {
    pub id: String,
    pub idempotency_key: String,
    /// `sms`, or `telegram` (through the Telegram Gateway).
    pub channel: &'static str,
    pub status: crate::domain::Status,
    pub body: String,
    /// The Gateway's last word on a Telegram message (`sent`,
    /// `delivered`, `read`, `expired`, `revoked`), once it reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_report: Option<String>,
}

impl SentMessage {
    /// A send about to be inserted, as its claimed row will stand
    /// (`processing`).
    pub fn queued(m: &NewMessage, v: &VerificationRecord) -> Self {
        let channel = Channel::of_provider(&m.provider);
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
        let channel = Channel::of_provider(&m.provider);
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
    /// How long Telegram has to report delivery before the next channel
    /// (when there is one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_after_seconds: Option<u32>,
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
            fallback_after_seconds: v
                .channels
                .after(Channel::Telegram)
                .map(|_| v.fallback_after_seconds),
            messages,
            valid: None,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_are_validated_field_by_field() {
        let ok = StartRequest::parse(br#"{"to": "+14155552671"}"#).unwrap();
        assert_eq!(
            (ok.code_length, ok.ttl_seconds, ok.template.as_deref()),
            (6, 600, None)
        );
        let rows: [(&[u8], Option<&str>); 15] = [
            (
                br#"{"to": "+14155552671", "code_length": 3}"#,
                Some("code_length"),
            ),
            (
                br#"{"to": "+14155552671", "code_length": 11}"#,
                Some("code_length"),
            ),
            (
                br#"{"to": "+14155552671", "ttl_seconds": 29}"#,
                Some("ttl_seconds"),
            ),
            (
                br#"{"to": "+14155552671", "ttl_seconds": 3601}"#,
                Some("ttl_seconds"),
            ),
            (
                br#"{"to": "+14155552671", "template": "no code"}"#,
                Some("template"),
            ),
            (
                br#"{"to": "+14155552671", "template": "{code}{code}"}"#,
                Some("template"),
            ),
            (br#"{"to": "12"}"#, Some("to")),
            (br#"{"to": "+14155552671", "x": 1}"#, Some("x")),
            (
                br#"{"to": "+14155552671", "template": "{x} {code}"}"#,
                Some("template"),
            ),
            (br#"[]"#, None),
            // Issue 29, finding 14: fewer than 6 digits, and the control
            // characters a message body refuses.
            (
                br#"{"to": "+14155552671", "code_length": 4}"#,
                Some("code_length"),
            ),
            (
                br#"{"to": "+14155552671", "code_length": 5}"#,
                Some("code_length"),
            ),
            (
                br#"{"to": "+14155552671", "template": "Code\u0000 {code}"}"#,
                Some("template"),
            ),
            (
                br#"{"to": "+14155552671", "template": "\u001b[2J{code}"}"#,
                Some("template"),
            ),
            (
                br#"{"to": "+14155552671", "template": "{code}\u007f"}"#,
                Some("template"),
            ),
        ];
        for (body, field) in rows {
            match StartRequest::parse(body) {
                Ok(r) => panic!("accepted {r:?}"),
                Err(None) => assert_eq!(field, None),
                Err(Some(e)) => assert_eq!(Some(e[0].field.as_str()), field),
            }
        }
        let t = StartRequest::parse(
            br#"{"to": "+14155552671", "code_length": 8.0, "ttl_seconds": 60, "template": "Code: {code}"}"#,
        )
        .unwrap();
        assert_eq!(t.code_length, 8);
        assert_ne!(t.fingerprint(), ok.fingerprint());
    }

    #[test]
    fn check_codes_are_digits() {
        assert_eq!(parse_check(br#"{"code": "123456"}"#).unwrap(), "123456");
        assert!(matches!(
            parse_check(br#"{"code": "12a456"}"#),
            Err(Some(_))
        ));
        assert!(matches!(parse_check(br#"{"code": 123456}"#), Err(Some(_))));
        assert!(matches!(parse_check(br#"{"code": "123"}"#), Err(Some(_))));
        assert!(matches!(parse_check(br#"{}"#), Err(Some(_))));
        assert!(matches!(parse_check(b"nope"), Err(None)));
    }

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
