//! API keys: `so_` followed by 192 random bits (base64url), stored only as a
//! SHA-256 hash.
//!
//! A fast hash is enough here: with 192 random bits nobody can brute-force a
//! key from its hash, and a fast hash lets every request find its tenant by an
//! index lookup. Because the lookup is by hash, the comparison that matters
//! happens on the hash inside the index, never on the secret itself.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::store::NewApiKey;

pub const PREFIX: &str = "so_";
/// How a test-mode key starts (issue 27): it is still a key of [`PREFIX`].
pub const TEST_PREFIX: &str = "so_test_";
/// Random bytes in a generated key.
const RANDOM_BYTES: usize = 24;
/// Shortest key accepted as a bootstrap key: 128 bits of base64url.
pub const MIN_KEY_LEN: usize = PREFIX.len() + 22;

/// A freshly generated key: the secret (shown once) and what is stored.
pub struct GeneratedKey {
    pub secret: String,
    pub stored: NewApiKey,
}

pub fn generate() -> GeneratedKey {
    generate_in(false)
}

/// A new key, of test mode (`so_test_`) when `test`.
pub fn generate_in(test: bool) -> GeneratedKey {
    let prefix = if test { TEST_PREFIX } else { PREFIX };
    let secret = loop {
        let mut bytes = [0u8; RANDOM_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let secret = format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes));
        // A live key never looks like a test key (one in 2^30 would).
        if test || !secret.starts_with(TEST_PREFIX) {
            break secret;
        }
    };
    let mut stored = stored_form(&secret);
    stored.test = test;
    GeneratedKey { secret, stored }
}

/// What is stored for a given (live) key. Its listed prefix shows six
/// characters past `so_`, or past `so_test_` for a test-mode key.
pub fn stored_form(secret: &str) -> NewApiKey {
    let shown = if secret.starts_with(TEST_PREFIX) {
        TEST_PREFIX.len()
    } else {
        PREFIX.len()
    };
    NewApiKey {
        id: Uuid::now_v7(),
        hash: hash(secret),
        prefix: secret.chars().take(shown + 6).collect(),
        scopes: crate::scopes::Scopes::DEFAULT,
        label: None,
        test: false,
    }
}

pub fn hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Whether `s` has the shape of a key we could have issued (a bootstrap key
/// from configuration must).
/// The fewest random bits [`estimated_bits`] must find in a bootstrap key.
pub const MIN_BOOTSTRAP_BITS: f64 = 64.0;

/// An estimate of the random bits in a key (after its prefix): its length
/// times the entropy of its characters' frequencies. A generated key has
/// about 150; a run of one character none; `so_demo-key-change-me-0000000000`
/// about 90. A typed key that passes may still be guessable: it catches
/// the obvious, no more.
pub fn estimated_bits(key: &str) -> f64 {
    let secret = key.strip_prefix(PREFIX).unwrap_or(key);
    let mut counts = std::collections::HashMap::new();
    for c in secret.chars() {
        *counts.entry(c).or_insert(0u32) += 1;
    }
    #[allow(clippy::cast_precision_loss)]
    let n = secret.chars().count() as f64;
    let per_char: f64 = counts
        .values()
        .map(|&k| {
            let p = f64::from(k) / n;
            -p * p.log2()
        })
        .sum();
    per_char * n
}

pub fn well_formed(s: &str) -> bool {
    s.len() >= MIN_KEY_LEN
        && s.len() <= 200
        && s.starts_with(PREFIX)
        && s[PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_keys_have_few_estimated_bits() {
        for (key, low) in [
            ("so_0000000000000000000000", true),
            ("so_abababababababababababab", true),
            ("so_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true),
            ("so_demo-key-change-me-0000000000", false),
        ] {
            assert_eq!(estimated_bits(key) < MIN_BOOTSTRAP_BITS, low, "{key}");
        }
        for _ in 0..100 {
            let key = generate().secret;
            assert!(estimated_bits(&key) > 120.0, "{key}");
        }
    }

    #[test]
    fn generated_keys_are_prefixed_unique_and_well_formed() {
        let a = generate();
        let b = generate();
        assert!(a.secret.starts_with("so_"));
        assert_eq!(a.secret.len(), 3 + 32);
        assert!(well_formed(&a.secret));
        assert_ne!(a.secret, b.secret);
        assert_eq!(a.stored.hash, hash(&a.secret));
        assert!(!a.stored.hash.windows(3).any(|w| w == b"so_"));
    }

    #[test]
    fn test_keys_are_prefixed_and_flagged() {
        let t = generate_in(true);
        assert!(t.secret.starts_with("so_test_"), "{}", t.secret);
        assert!(well_formed(&t.secret));
        assert!(t.stored.test);
        assert_eq!(t.stored.prefix.len(), "so_test_".len() + 6);
        assert!(t.stored.prefix.starts_with("so_test_"));
        let live = generate_in(false);
        assert!(!live.secret.starts_with("so_test_"));
        assert!(!live.stored.test);
        assert_eq!(live.stored.prefix.len(), 3 + 6);
    }

    #[test]
    fn bootstrap_keys_must_look_like_keys() {
        assert!(!well_formed("so_short"));
        assert!(!well_formed("xx_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
        assert!(!well_formed("so_aaaaaaaaaaaaaaaaaaaaaa aaaaaaaa"));
        assert!(well_formed("so_aaaaaaaaaaaaaaaaaaaaaa"));
    }
}
