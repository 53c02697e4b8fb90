//! A verification's requests as they arrive: `POST /verifications`
//! (validated field by field, each refusal naming its field) and a check's
//! code.

use sha2::{Digest, Sha256};

use super::{
    Channels, DEFAULT_FALLBACK_AFTER, FALLBACK_AFTER_SECONDS, FallbackAfter, MIN_CODE_LENGTH,
    PLACEHOLDER,
};
use crate::domain::{FieldError, Phone};

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
    /// How long each step has to report delivery before the next channel.
    pub fallback_after: FallbackAfter,
    /// Whether the body named `channels` (else they are the tenant's
    /// default) and `fallback_after_seconds`: what the fingerprint says.
    pub channels_given: bool,
    pub fallback_after_given: bool,
}

impl StartRequest {
    /// Parses a JSON body; `Err(None)`: not a JSON object.
    pub fn parse(body: &[u8]) -> Result<Self, Option<Vec<FieldError>>> {
        Self::parse_in(body, None)
    }

    /// [`StartRequest::parse_in`], with the tenant's default `channels`
    /// for a body that names none.
    pub fn parse_for(
        body: &[u8],
        home: Option<&str>,
        default_channels: Option<&Channels>,
    ) -> Result<Self, Option<Vec<FieldError>>> {
        Self::parse_with(body, home, default_channels)
    }

    /// [`StartRequest::parse`], a `to` without `+` read in `home` (the
    /// tenant's `home_country`, see [`crate::domain::phone::parse_in`]).
    pub fn parse_in(body: &[u8], home: Option<&str>) -> Result<Self, Option<Vec<FieldError>>> {
        Self::parse_with(body, home, None)
    }

    fn parse_with(
        body: &[u8],
        home: Option<&str>,
        default_channels: Option<&Channels>,
    ) -> Result<Self, Option<Vec<FieldError>>> {
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
            Some(Some(s)) => match crate::domain::phone::parse_in(s, home) {
                Ok(p) => to = Some(p.into_parts()),
                Err(message) => errors.push(err("to", &message)),
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
        let known = crate::provider::registry::verify_channels();
        let channels = match obj.get("channels") {
            None => default_channels.cloned().unwrap_or_default(),
            Some(v) => Channels::from_json(v, &known).unwrap_or_else(|why| {
                errors.push(err("channels", &why));
                Channels::default()
            }),
        };
        // Each channel's provider takes the code lengths it documents.
        for channel in channels.iter() {
            if let Some((_, needs)) = crate::provider::registry::verify_adapter(channel)
                && !needs.code_digits.contains(&code_length)
            {
                errors.push(err(
                    "code_length",
                    &format!(
                        "must be from {} to {} when channels include {channel} (what its provider takes)",
                        needs.code_digits.start(),
                        needs.code_digits.end()
                    ),
                ));
            }
        }
        let steps_after_first = channels.len().saturating_sub(1);
        let fallback_after = match obj.get("fallback_after_seconds") {
            Some(_) if steps_after_first == 0 => {
                errors.push(err(
                    "fallback_after_seconds",
                    "applies only when channels name more than one channel",
                ));
                FallbackAfter::default()
            }
            _ if steps_after_first == 0 => FallbackAfter::default(),
            None => {
                // Unsaid, it is never past half the verification's life.
                FallbackAfter::Every(DEFAULT_FALLBACK_AFTER.min((ttl_seconds / 2).max(5)))
            }
            Some(v) if v.is_array() => match fallback_list(v, steps_after_first, ttl_seconds) {
                Ok(list) => FallbackAfter::Each(list),
                Err(why) => {
                    errors.push(err("fallback_after_seconds", &why));
                    FallbackAfter::default()
                }
            },
            Some(_) => {
                let (lo, hi) = (
                    *FALLBACK_AFTER_SECONDS.start(),
                    *FALLBACK_AFTER_SECONDS.end(),
                );
                let n = int(
                    "fallback_after_seconds",
                    lo,
                    hi,
                    DEFAULT_FALLBACK_AFTER,
                    &mut errors,
                );
                if n >= ttl_seconds {
                    errors.push(err(
                        "fallback_after_seconds",
                        "must be less than ttl_seconds (the next channel must go while the code is valid)",
                    ));
                }
                FallbackAfter::Every(n)
            }
        };
        match to {
            Some((to, country)) if errors.is_empty() => Ok(Self {
                to,
                country,
                code_length,
                ttl_seconds,
                template,
                channels,
                fallback_after,
                channels_given: obj.contains_key("channels"),
                fallback_after_given: obj.contains_key("fallback_after_seconds"),
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
        // Channels taken from the tenant's default are not the request's:
        // a replay after the default changed is the same request.
        if self.channels_given && self.channels != Channels::default() {
            h.update(format!(
                "\0c{}\0{}",
                self.channels.stored(),
                self.fallback_after.first()
            ));
            // A list: said only when given, so that one number keeps the
            // fingerprint it had before lists existed.
            if let Some(list) = self.fallback_after.stored_list() {
                h.update(format!("\0l{list}"));
            }
        } else if self.fallback_after_given {
            h.update(format!("\0f{}", self.fallback_after.first()));
            if let Some(list) = self.fallback_after.stored_list() {
                h.update(format!("\0l{list}"));
            }
        }
        h.finalize().to_vec()
    }
}

/// `fallback_after_seconds` as a list: one whole number per step after the
/// first, each in [`FALLBACK_AFTER_SECONDS`], together less than the
/// verification's life (every step must go while the code is valid).
fn fallback_list(v: &serde_json::Value, steps: u32, ttl_seconds: u32) -> Result<Vec<u32>, String> {
    let (lo, hi) = (
        *FALLBACK_AFTER_SECONDS.start(),
        *FALLBACK_AFTER_SECONDS.end(),
    );
    let shape = || {
        format!(
            "must be one whole number from {lo} to {hi}, or a list of {steps} of them (one per channel after the first)"
        )
    };
    let list = v.as_array().ok_or_else(shape)?;
    if u32::try_from(list.len()).ok() != Some(steps) {
        return Err(shape());
    }
    let mut out = Vec::new();
    for item in list {
        let n = item
            .as_u64()
            .filter(|n| FALLBACK_AFTER_SECONDS.contains(n))
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(shape)?;
        out.push(n);
    }
    if out.iter().map(|n| u64::from(*n)).sum::<u64>() >= u64::from(ttl_seconds) {
        return Err(
            "must add up to less than ttl_seconds (every channel must go while the code is valid)"
                .into(),
        );
    }
    Ok(out)
}

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

/// A code as typed: spaces around it dropped, Arabic-Indic (U+0660..0669)
/// and Eastern Arabic-Indic (U+06F0..06F9) digits read as ASCII ones, so
/// the constant-time compare sees the digits the code was made of. `None`:
/// something else than digits.
fn ascii_digits(typed: &str) -> Option<String> {
    typed
        .trim()
        .chars()
        .map(|c| match c {
            '0'..='9' => Some(c),
            '\u{0660}'..='\u{0669}' => char::from_digit(c as u32 - 0x0660, 10),
            '\u{06F0}'..='\u{06F9}' => char::from_digit(c as u32 - 0x06F0, 10),
            _ => None,
        })
        .collect()
}

/// A check's code: 4 to 10 digits (ASCII, Arabic-Indic or Eastern
/// Arabic-Indic, spaces around them allowed), returned in ASCII.
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
        Some(serde_json::Value::String(c)) => match ascii_digits(c) {
            Some(code) if (4..=10).contains(&code.len()) => Ok(code),
            _ => Err(bad("must be a string of 4 to 10 digits")),
        },
        Some(_) => Err(bad("must be a string of 4 to 10 digits")),
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
        // Issue 42: digits as an Arabic keyboard types them, spaces around.
        for typed in [
            "\u{0660}\u{0667}\u{0667}\u{0669}\u{0667}\u{0663}",
            "\u{06F0}\u{06F7}\u{06F7}\u{06F9}\u{06F7}\u{06F3}",
            " 077973\t",
        ] {
            let body = serde_json::json!({ "code": typed }).to_string();
            assert_eq!(parse_check(body.as_bytes()).unwrap(), "077973", "{typed}");
        }
        for typed in ["07 7973", "\u{0966}77973", "+77973", " "] {
            let body = serde_json::json!({ "code": typed }).to_string();
            assert!(
                matches!(parse_check(body.as_bytes()), Err(Some(_))),
                "{typed}"
            );
        }
    }
}
