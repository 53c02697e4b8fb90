//! The `Idempotency-Key` header.
//!
//! The IETF draft (draft-ietf-httpapi-idempotency-key-header) makes the value
//! a Structured Field string (`"ORDER-92831-CONFIRMATION-SMS"`); most clients
//! in the wild send a bare token. Both are accepted and name the same key.
//! The key itself is 1 to 255 characters of visible ASCII (0x21..=0x7E).

/// A valid idempotency key. Once you hold one, it is valid.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a key.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    #[error(
        "the Idempotency-Key may contain only visible ASCII characters (no spaces or control characters)"
    )]
    NotVisibleAscii,
    #[error("the quoted Idempotency-Key is not a valid structured-field string")]
    BadQuoting,
}

pub const MAX_LEN: usize = 255;

impl IdempotencyKey {
    /// Parses a header value (bytes, since a header may hold non-UTF-8).
    pub fn parse_header(raw: &[u8]) -> Result<Self, KeyError> {
        let raw = trim_ows(raw);
        let key = if raw.first() == Some(&b'"') {
            unquote_sf_string(raw)?
        } else {
            raw.to_vec()
        };
        Self::from_bytes(key)
    }

    /// Validates an already unquoted key (for example from a URL path).
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        Self::from_bytes(key.as_bytes().to_vec())
    }

    fn from_bytes(key: Vec<u8>) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        if key.len() > MAX_LEN {
            return Err(KeyError::TooLong);
        }
        // Visible ASCII is valid UTF-8.
        String::from_utf8(key)
            .map(Self)
            .map_err(|_| KeyError::NotVisibleAscii)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 8941 section 4.2.5: a string is DQUOTE *(unescaped / "\" ( DQUOTE / "\" )) DQUOTE,
/// with unescaped characters in 0x20..=0x7E other than DQUOTE and backslash.
fn unquote_sf_string(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let inner = raw.strip_prefix(b"\"").ok_or(KeyError::BadQuoting)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => {
                // The closing quote must end the value.
                return if bytes.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting)
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::BadQuoting),
        }
    }
    Err(KeyError::BadQuoting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse_header(b"ORDER-92831-CONFIRMATION-SMS").unwrap();
        let quoted = IdempotencyKey::parse_header(b"\"ORDER-92831-CONFIRMATION-SMS\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), "ORDER-92831-CONFIRMATION-SMS");
    }

    #[test]
    fn escapes_in_quoted_form_are_decoded() {
        let k = IdempotencyKey::parse_header(br#""a\"b\\c""#).unwrap();
        assert_eq!(k.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn rejects_what_is_not_a_key() {
        let cases: &[(&[u8], KeyError)] = &[
            (b"", KeyError::Empty),
            (b"\"\"", KeyError::Empty),
            (b"has space", KeyError::NotVisibleAscii),
            (b"\"has space\"", KeyError::NotVisibleAscii),
            (b"caf\xc3\xa9", KeyError::NotVisibleAscii),
            (b"\"unterminated", KeyError::BadQuoting),
            (b"\"a\"b", KeyError::BadQuoting),
            (b"\"bad\\escape\"", KeyError::BadQuoting),
            (b"tab\there", KeyError::NotVisibleAscii),
        ];
        for (raw, want) in cases {
            assert_eq!(
                IdempotencyKey::parse_header(raw).unwrap_err(),
                *want,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn length_limit_is_255() {
        let ok = "k".repeat(255);
        assert!(IdempotencyKey::parse_header(ok.as_bytes()).is_ok());
        let long = "k".repeat(256);
        assert_eq!(
            IdempotencyKey::parse_header(long.as_bytes()).unwrap_err(),
            KeyError::TooLong
        );
    }
}
