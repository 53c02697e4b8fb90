//! The body of `POST /messages`, parsed into a [`SendRequest`] that is valid by
//! construction, and its fingerprint.
//!
//! Parsing goes JSON text -> `serde_json::Value` -> typed fields -> domain
//! checks, so every problem is reported per field with our own wording:
//! messages never echo the rejected value back (it may be a phone number or a
//! one-time code).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use validator::Validate;

use super::recipient::{InvalidRecipient, ParsedRecipient, Recipient};
use super::segments::{self, SegmentCount};

pub const BODY_MAX_CHARS: u64 = 1600;
pub const VALIDITY_MIN: i64 = 1;
pub const VALIDITY_MAX: i64 = 36_000;
pub const METADATA_MAX_ENTRIES: u64 = 16;
pub const METADATA_KEY_MAX: usize = 40;
pub const METADATA_VALUE_MAX: usize = 500;
pub const SENDER_ID_MAX: usize = 11;
/// Longest field name echoed back in an error's `field` (longer names, such
/// as an unknown field or a long path, are cut to this many characters).
pub const FIELD_LABEL_MAX: usize = 40;
/// Most unknown fields listed in one answer.
pub const UNKNOWN_FIELDS_LISTED: usize = 10;

#[rustfmt::skip]
const FIELDS: &[&str] = &["to", "body", "from", "validity_seconds", "metadata", "send_at", "quiet_hours"];

/// One field's problem, as returned in the `errors` array of a 400.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Why a body is not a send request.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Not JSON at all.
    Malformed,
    /// JSON, but fields are missing or wrong.
    Invalid(Vec<FieldError>),
}

/// A validated request to send one SMS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SendRequest {
    /// Who it goes to; an SMS recipient is serialized (fingerprinted) as its
    /// E.164 number, e.g. `+14155550100`.
    pub to: Recipient,
    /// The destination's ISO 3166-1 region, for an SMS recipient (for
    /// per-tenant allow-lists).
    #[serde(skip)]
    pub to_country: Option<String>,
    /// E.164 number or alphanumeric sender id; `None` lets the provider choose.
    pub from: Option<String>,
    pub body: String,
    pub validity_seconds: Option<i32>,
    pub metadata: BTreeMap<String, String>,
    /// When to send, in UTC; with `quiet_hours`, fingerprinted only if given.
    #[serde(skip_serializing_if = "Option::is_none", with = "super::schedule::utc")]
    pub send_at: Option<time::OffsetDateTime>,
    /// `false`: send at once even inside the tenant's quiet hours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<bool>,
    #[serde(skip)]
    pub segments: SegmentCount,
}

/// The typed shape, before domain checks; `validator` checks lengths and ranges.
#[derive(Debug, Default, Validate)]
struct Input {
    to: Option<String>,
    #[validate(length(min = 1, max = 1600))]
    body: Option<String>,
    from: Option<String>,
    #[validate(range(min = 1, max = 36000))]
    validity_seconds: Option<i64>,
    #[validate(length(max = 16))]
    metadata: Option<BTreeMap<String, String>>,
}

impl SendRequest {
    /// Parses and validates a JSON body.
    /// A `to` may be a phone number only (see [`SendRequest::parse_in`]).
    pub fn parse(bytes: &[u8]) -> Result<Self, RequestError> {
        Self::parse_in(bytes, None, &[])
    }

    /// [`SendRequest::parse`], a `to` without `+` read in `home` (the
    /// tenant's `home_country`, see [`super::phone::parse_in`]), and a chat
    /// (`<channel>:<chat id>`) of one of `chats`.
    pub fn parse_in(
        bytes: &[u8],
        home: Option<&str>,
        chats: &[super::Channel],
    ) -> Result<Self, RequestError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|_| RequestError::Malformed)?;
        if let Some(path) = duplicate_key(bytes) {
            return Err(RequestError::Invalid(vec![FieldError::new(
                path,
                "appears more than once in the JSON object",
            )]));
        }
        let Value::Object(map) = value else {
            return Err(RequestError::Invalid(vec![FieldError::new(
                "",
                "the request body must be a JSON object",
            )]));
        };
        let mut errors = Vec::new();
        errors.extend(unknown_fields(map.keys(), FIELDS));
        let mut input = Input::default();
        let string = |name: &str, errors: &mut Vec<FieldError>| match map.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                errors.push(FieldError::new(name, "must be a string"));
                None
            }
        };
        input.to = string("to", &mut errors);
        input.body = string("body", &mut errors);
        input.from = string("from", &mut errors);
        match map.get("validity_seconds") {
            None | Some(Value::Null) => {}
            // JSON Schema's `integer` is any number without a fractional
            // part, so 300.0 is 300.
            Some(Value::Number(n)) => match n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                    .map(|f| f as i64)
            }) {
                Some(v) => input.validity_seconds = Some(v),
                None => errors.push(FieldError::new(
                    "validity_seconds",
                    "must be a whole number of seconds from 1 to 36000",
                )),
            },
            Some(_) => errors.push(FieldError::new(
                "validity_seconds",
                "must be a whole number of seconds from 1 to 36000",
            )),
        }
        match map.get("metadata") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    match v {
                        Value::String(s) => {
                            out.insert(k.clone(), s.clone());
                        }
                        _ => errors.push(FieldError::new(
                            format!("metadata.{}", field_label(k)),
                            "metadata values must be strings",
                        )),
                    }
                }
                input.metadata = Some(out);
            }
            Some(_) => errors.push(FieldError::new(
                "metadata",
                "must be an object of string keys to string values",
            )),
        }

        let (send_at, quiet_hours) = super::schedule::parse_fields(&map, &mut errors);

        if let Err(e) = input.validate() {
            for field in e.field_errors().keys() {
                let message = match field.as_ref() {
                    "body" => "must be 1 to 1600 characters",
                    "validity_seconds" => "must be a whole number of seconds from 1 to 36000",
                    "metadata" => "may have at most 16 entries",
                    _ => "is invalid",
                };
                errors.push(FieldError::new(field.to_string(), message));
            }
        }

        let missing = |name: &str| matches!(map.get(name), None | Some(Value::Null));
        let to = match input.to {
            None => {
                if missing("to") {
                    errors.push(FieldError::new("to", "is required"));
                }
                None
            }
            Some(to) => match Recipient::parse_in(&to, home, chats) {
                Ok(to) => Some(to),
                Err(InvalidRecipient(message)) => {
                    errors.push(FieldError::new("to", message));
                    None
                }
            },
        };
        let from = match input.from {
            None => None,
            Some(from) => match parse_sender(&from) {
                Some(from) => Some(from),
                None => {
                    errors.push(FieldError::new(
                        "from",
                        "must be an E.164 phone number or an alphanumeric sender id of at most 11 letters, digits and spaces",
                    ));
                    None
                }
            },
        };
        let body = match input.body {
            None => {
                if missing("body") {
                    errors.push(FieldError::new("body", "is required"));
                }
                None
            }
            Some(body) => {
                if body.trim().is_empty() && !body.is_empty() {
                    errors.push(FieldError::new("body", "must not be only whitespace"));
                    None
                } else if super::sealed::is_sealed(&body) {
                    // It would be taken for a sealed one-time code message,
                    // which is opened rather than sent (issue 29, finding 13).
                    let why = "must not start with `sendonce-sealed:` (the stored form of a one-time code message)";
                    errors.push(FieldError::new("body", why));
                    None
                } else if super::segments::has_refused_control(&body) {
                    errors.push(FieldError::new(
                        "body",
                        "must not contain control characters other than newline and tab",
                    ));
                    None
                } else {
                    Some(body)
                }
            }
        };
        let metadata = input.metadata.unwrap_or_default();
        for (k, v) in &metadata {
            if k.is_empty() || k.chars().count() > METADATA_KEY_MAX {
                errors.push(FieldError::new(
                    "metadata",
                    "metadata keys must be 1 to 40 characters",
                ));
            }
            if v.chars().count() > METADATA_VALUE_MAX {
                errors.push(FieldError::new(
                    format!("metadata.{}", field_label(k)),
                    "metadata values must be at most 500 characters",
                ));
            }
        }

        if !errors.is_empty() {
            errors.sort_by(|a, b| a.field.cmp(&b.field));
            errors.dedup();
            return Err(RequestError::Invalid(errors));
        }
        let (Some(to), Some(body)) = (to, body) else {
            return Err(RequestError::Invalid(vec![FieldError::new(
                "",
                "is invalid",
            )]));
        };
        let ParsedRecipient {
            recipient: to,
            country: to_country,
        } = to;
        let validity_seconds = input.validity_seconds.and_then(|v| i32::try_from(v).ok());
        let segments = to.segments(&body);
        Ok(SendRequest {
            to,
            to_country,
            from,
            body,
            validity_seconds,
            metadata,
            send_at,
            quiet_hours,
            segments,
        })
    }

    /// SHA-256 of the canonical request: the parsed fields in a fixed order,
    /// metadata sorted by key. Two bodies that mean the same send (other key
    /// order, other whitespace, a quoted `null` left out) have one fingerprint.
    pub fn fingerprint(&self) -> [u8; 32] {
        // Serializing a struct with a BTreeMap cannot fail.
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        let mut h = Sha256::new();
        h.update(b"sendonce.request.v1\n");
        h.update(&canonical);
        h.finalize().into()
    }
}

/// The path of the first key that appears twice in one JSON object, if any.
/// JSON parsers disagree on which duplicate wins, so a request that has one
/// means different things to different readers: it is refused.
pub fn duplicate_key(bytes: &[u8]) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    struct Scan<'a> {
        path: &'a str,
        found: &'a mut Option<String>,
    }
    impl<'de> DeserializeSeed<'de> for Scan<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Scan<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = if self.path.is_empty() {
                    field_label(&key)
                } else {
                    format!("{}.{}", self.path, field_label(&key))
                };
                if !seen.insert(key) && self.found.is_none() {
                    *self.found = Some(path.clone());
                }
                map.next_value_seed(Scan {
                    path: &path,
                    found: &mut *self.found,
                })?;
            }
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq
                .next_element_seed(Scan {
                    path: self.path,
                    found: &mut *self.found,
                })?
                .is_some()
            {}
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    let _ = IgnoredAny;
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let _ = Scan {
        path: "",
        found: &mut found,
    }
    .deserialize(&mut de);
    found.map(|path| field_label(&path))
}

/// A name as shown in an error's `field`, cut to [`FIELD_LABEL_MAX`]
/// characters so a huge key is not echoed back.
pub fn field_label(k: &str) -> String {
    k.chars().take(FIELD_LABEL_MAX).collect()
}

/// One "unknown field" error per name not in `known`, at most
/// [`UNKNOWN_FIELDS_LISTED`] of them, names cut by [`field_label`].
pub fn unknown_fields<'a>(
    names: impl IntoIterator<Item = &'a String>,
    known: &[&str],
) -> Vec<FieldError> {
    names
        .into_iter()
        .filter(|n| !known.contains(&n.as_str()))
        .take(UNKNOWN_FIELDS_LISTED)
        .map(|n| FieldError::new(field_label(n), "unknown field"))
        .collect()
}

/// A sender: a valid phone number (returned in E.164), or an alphanumeric
/// sender id (1 to 11 of A-Z, a-z, 0-9 and space, with at least one letter,
/// not starting or ending with a space).
pub fn parse_sender(s: &str) -> Option<String> {
    if s.trim_start().starts_with('+') {
        return super::phone::parse(s).map(|p| p.e164);
    }
    let ok = !s.is_empty()
        && s.len() <= SENDER_ID_MAX
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ')
        && s.bytes().any(|b| b.is_ascii_alphabetic())
        && !s.starts_with(' ')
        && !s.ends_with(' ');
    ok.then(|| s.to_string())
}

impl Default for SegmentCount {
    fn default() -> Self {
        segments::count("")
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
