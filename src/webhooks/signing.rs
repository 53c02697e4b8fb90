//! Standard Webhooks signatures: `webhook-signature` is `v1,` + base64 of
//! HMAC-SHA256 over `{webhook-id}.{webhook-timestamp}.{body}`, keyed with the
//! base64-decoded part of the secret after `whsec_`; several signatures are
//! separated by spaces (a rotated-out secret signs beside the new one).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// What every secret starts with.
pub const SECRET_PREFIX: &str = "whsec_";
/// Random bytes in a new secret (the spec asks for 24 to 64).
pub const SECRET_BYTES: usize = 32;

/// A new secret: `whsec_` + base64 of [`SECRET_BYTES`] random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; SECRET_BYTES];
    rand::rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The key bytes of a `whsec_` secret; `None` if it is not one.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    let encoded = secret.strip_prefix(SECRET_PREFIX)?;
    STANDARD.decode(encoded).ok().filter(|k| !k.is_empty())
}

/// One signature (`v1,<base64>`) of a delivery with `key`.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` value: one signature per secret, space-separated.
/// Secrets that are not `whsec_` secrets are skipped.
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a str>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .into_iter()
        .filter_map(secret_key)
        .map(|key| sign(&key, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether any `v1` signature in `header` is the one `secret` makes
/// (constant-time comparison): what a receiver does.
pub fn verify(secret: &str, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(key) = secret_key(secret) else {
        return false;
    };
    let expected = sign(&key, id, timestamp, body);
    header
        .split(' ')
        .filter(|s| s.starts_with("v1,"))
        .any(|s| bool::from(s.as_bytes().ct_eq(expected.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The published vector of the Standard Webhooks reference libraries
    // (standard-webhooks/standard-webhooks, libraries/*: `test_sign`).
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TS: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const EXPECTED: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    #[test]
    fn signs_the_published_test_vector() {
        let key = secret_key(SECRET).expect("a whsec_ secret");
        assert_eq!(sign(&key, ID, TS, BODY), EXPECTED);
        assert_eq!(signature_header([SECRET], ID, TS, BODY), EXPECTED);
    }

    #[test]
    fn verifies_like_the_reference_libraries() {
        assert!(verify(SECRET, ID, TS, BODY, EXPECTED));
        // The reference's `test_no_verify` signature, and others around ours.
        let wrong = "v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU=";
        assert!(!verify(SECRET, ID, TS, BODY, wrong));
        let several = format!(
            "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= {EXPECTED} \
             v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE="
        );
        assert!(verify(SECRET, ID, TS, BODY, &several));
        // Another id, timestamp or body breaks it.
        assert!(!verify(SECRET, "msg_other", TS, BODY, EXPECTED));
        assert!(!verify(SECRET, ID, TS + 1, BODY, EXPECTED));
        assert!(!verify(SECRET, ID, TS, b"{}", EXPECTED));
        // A version other than v1 is not accepted.
        assert!(!verify(
            SECRET,
            ID,
            TS,
            BODY,
            &EXPECTED.replace("v1,", "v2,")
        ));
    }

    #[test]
    fn two_secrets_give_two_signatures() {
        let other = new_secret();
        let header = signature_header([SECRET, other.as_str()], ID, TS, BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], EXPECTED);
        assert!(verify(&other, ID, TS, BODY, &header));
        assert!(verify(SECRET, ID, TS, BODY, &header));
    }

    #[test]
    fn new_secrets_are_whsec_with_enough_entropy() {
        let s = new_secret();
        assert!(s.starts_with("whsec_"));
        assert_eq!(secret_key(&s).map(|k| k.len()), Some(SECRET_BYTES));
        assert_ne!(s, new_secret());
        assert_eq!(secret_key("nope"), None);
        assert_eq!(secret_key("whsec_%%%"), None);
    }
}
