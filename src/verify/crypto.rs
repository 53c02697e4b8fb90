//! The verify secret and what is derived from it: the HMAC that stores a
//! code, and the sealing (authenticated encryption) of a code and of a
//! verification message's body.
//!
//! Sealing is ChaCha20-Poly1305 (RFC 8439), ring's `aead`, with a 96-bit
//! random nonce per seal; its key is derived from the verify secret with
//! ring's HKDF-SHA256 (one `info` per purpose). A sealed value is the
//! version tag `SOv3`, the nonce, the ciphertext and the 16-byte tag. The
//! associated data binds a sealed value to the row it belongs to (a
//! verification's code to its id, a message body to the message id and its
//! shown text, a page cursor to its list), so a sealed value copied into
//! another row does not open.
//!
//! Values sealed before (issue 41) by our own encrypt-then-MAC over
//! HMAC-SHA256 (keystream HMAC(enc key, nonce || counter), tag
//! HMAC(auth key, aad || nonce || ciphertext)) still open, until they expire
//! or are purged; nothing new is sealed so. The stored code's HMAC-SHA256
//! (the `hmac` crate's) is unchanged.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use rand::{Rng, RngCore};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::store::{Store, StoreError};

type HmacSha256 = Hmac<Sha256>;

const NONCE: usize = 16;
const TAG: usize = 32;

/// What a value sealed with the AEAD starts with (the version tag); any
/// other sealed value is of the first construction.
const AEAD_V3: &[u8] = b"SOv3";
/// HKDF's salt (fixed: the secret is already uniformly random).
const HKDF_SALT: &[u8] = b"sendonce verify hkdf v3";
/// HKDF's info for the sealing key.
const INFO_SEAL: &[u8] = b"sendonce verify seal chacha20-poly1305 v3";

pub use crate::domain::sealed::{
    SEALED_MARK, SEALED_PREFIX, SEALED_UNSHOWN, SEALED_V1, is_sealed, shown_body,
};

/// Keys derived from the verify secret, one per purpose.
pub struct Keys {
    code_mac: [u8; 32],
    /// ChaCha20-Poly1305, from HKDF: what seals now.
    seal: ring::aead::LessSafeKey,
    /// The first construction's keys: they only open.
    enc: [u8; 32],
    auth: [u8; 32],
}

/// The sealing key ring's HKDF-SHA256 derives from `secret`.
fn seal_key(secret: &[u8]) -> ring::aead::LessSafeKey {
    use ring::aead::{CHACHA20_POLY1305, LessSafeKey, UnboundKey};
    let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, HKDF_SALT).extract(secret);
    let info = [INFO_SEAL];
    // 32 bytes is far below HKDF's limit of 255 blocks: this cannot fail.
    let okm = prk
        .expand(&info, &CHACHA20_POLY1305)
        .unwrap_or_else(|_| unreachable!("HKDF-SHA256 gives 32 bytes"));
    LessSafeKey::new(UnboundKey::from(okm))
}

/// The AEAD's nonce length (96 bits).
const AEAD_NONCE: usize = 12;

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Why a sealed value did not open.
#[derive(Debug, thiserror::Error)]
#[error("sealed value does not open (wrong secret, or not sealed for this row)")]
pub struct OpenError;

impl Keys {
    pub fn derive(secret: &[u8]) -> Self {
        Self {
            code_mac: hmac(secret, &[b"sendonce verify code-mac v1"]),
            seal: seal_key(secret),
            enc: hmac(secret, &[b"sendonce verify enc v1"]),
            auth: hmac(secret, &[b"sendonce verify auth v1"]),
        }
    }

    /// The stored form of `code` for verification `id`.
    pub fn code_mac(&self, id: Uuid, code: &str) -> [u8; 32] {
        hmac(&self.code_mac, &[id.as_bytes(), b":", code.as_bytes()])
    }

    /// Whether `code` is the code whose stored form is `stored`, in
    /// constant time.
    pub fn code_matches(&self, id: Uuid, code: &str, stored: &[u8]) -> bool {
        bool::from(self.code_mac(id, code).as_slice().ct_eq(stored))
    }

    fn keystream_xor(&self, nonce: &[u8], data: &mut [u8]) {
        for (i, chunk) in data.chunks_mut(32).enumerate() {
            let counter = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
            let block = hmac(&self.enc, &[nonce, &counter]);
            for (b, k) in chunk.iter_mut().zip(block) {
                *b ^= k;
            }
        }
    }

    fn tag(&self, aad: &[u8], nonce: &[u8], ct: &[u8]) -> [u8; 32] {
        let len = u64::try_from(aad.len()).unwrap_or(u64::MAX).to_be_bytes();
        hmac(&self.auth, &[&len, aad, nonce, ct])
    }

    /// `plain` encrypted and authenticated (ChaCha20-Poly1305), bound to
    /// `aad`: `SOv3`, the nonce, the ciphertext and its tag.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        use ring::aead::{Aad, Nonce};
        let mut nonce = [0u8; AEAD_NONCE];
        rand::rng().fill_bytes(&mut nonce);
        let mut buf = plain.to_vec();
        // Sealing fails only on an input longer than 256 GiB.
        let sealed = self.seal.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        );
        if sealed.is_err() {
            unreachable!("a sealed value is far below ChaCha20-Poly1305's limit");
        }
        let mut out = Vec::with_capacity(AEAD_V3.len() + AEAD_NONCE + buf.len());
        out.extend_from_slice(AEAD_V3);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        out
    }

    /// The plain text of a value [`Keys::seal`] made with the same `aad`
    /// (or one sealed by the first construction).
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        use ring::aead::{Aad, Nonce};
        if let Some(rest) = sealed.strip_prefix(AEAD_V3)
            && rest.len() >= AEAD_NONCE + self.seal.algorithm().tag_len()
        {
            let (nonce, ct) = rest.split_at(AEAD_NONCE);
            let mut buf = ct.to_vec();
            if let Ok(nonce) = Nonce::try_assume_unique_for_key(nonce)
                && let Ok(plain) = self.seal.open_in_place(nonce, Aad::from(aad), &mut buf)
            {
                return Ok(plain.to_vec());
            }
            // Not ours: a first-construction value that happens to start
            // with the tag (one in 2^32) is tried as one below.
        }
        self.open_v1(aad, sealed)
    }

    /// A value of the first construction (encrypt-then-MAC over
    /// HMAC-SHA256), as it was sealed before the AEAD.
    fn open_v1(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < NONCE + TAG {
            return Err(OpenError);
        }
        let (nonce, rest) = sealed.split_at(NONCE);
        let (ct, tag) = rest.split_at(rest.len() - TAG);
        if !bool::from(self.tag(aad, nonce, ct).as_slice().ct_eq(tag)) {
            return Err(OpenError);
        }
        let mut plain = ct.to_vec();
        self.keystream_xor(nonce, &mut plain);
        Ok(plain)
    }

    /// A message body as stored: sealed to the message id, as text, with
    /// `shown` (the body with its code masked) beside it in the clear and
    /// bound to it.
    pub fn seal_body(&self, message_id: Uuid, body: &str, shown: &str) -> String {
        let sealed = self.seal(&body_aad(message_id, shown), body.as_bytes());
        format!(
            "{SEALED_PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(shown),
            URL_SAFE_NO_PAD.encode(sealed)
        )
    }

    /// The body to send for a stored body: a sealed one opened, any other
    /// as it is.
    pub fn open_body(&self, message_id: Uuid, stored: &str) -> Result<String, OpenError> {
        let (aad, b64) = if let Some(rest) = stored.strip_prefix(SEALED_PREFIX) {
            let (shown, b64) = rest.split_once('.').ok_or(OpenError)?;
            let shown = URL_SAFE_NO_PAD.decode(shown).map_err(|_| OpenError)?;
            let shown = String::from_utf8(shown).map_err(|_| OpenError)?;
            (body_aad(message_id, &shown), b64)
        } else if let Some(b64) = stored.strip_prefix(SEALED_V1) {
            (message_id.as_bytes().to_vec(), b64)
        } else if is_sealed(stored) {
            return Err(OpenError);
        } else {
            return Ok(stored.to_string());
        };
        let sealed = URL_SAFE_NO_PAD.decode(b64).map_err(|_| OpenError)?;
        let plain = self.open(&aad, &sealed)?;
        String::from_utf8(plain).map_err(|_| OpenError)
    }
}

/// What a sealed body is bound to: its message and the text shown for it.
fn body_aad(message_id: Uuid, shown: &str) -> Vec<u8> {
    [message_id.as_bytes().as_slice(), shown.as_bytes()].concat()
}

/// A code of `len` decimal digits from the thread's CSPRNG (ChaCha, seeded
/// from the operating system).
pub fn generate_code(len: u32) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect()
}

/// The verify secret, configured or loaded (created on first use) from the
/// store, and the keys derived from it; loaded once per instance.
pub struct SecretSource {
    configured: Option<Vec<u8>>,
    store: Arc<dyn Store>,
    keys: OnceCell<Arc<Keys>>,
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretSource(..)")
    }
}

impl SecretSource {
    pub fn new(configured: Option<Vec<u8>>, store: Arc<dyn Store>) -> Self {
        Self {
            configured,
            store,
            keys: OnceCell::new(),
        }
    }

    /// The keys: from `SENDONCE_VERIFY_SECRET`, else from the secret kept in
    /// the database (32 random bytes written by the first instance that
    /// needed one; every instance then reads the same).
    pub async fn keys(&self) -> Result<Arc<Keys>, StoreError> {
        self.keys
            .get_or_try_init(|| async {
                let secret = match &self.configured {
                    Some(s) => s.clone(),
                    None => {
                        let mut candidate = [0u8; 32];
                        rand::rng().fill_bytes(&mut candidate);
                        self.store.verify_secret(&candidate).await?
                    }
                };
                Ok(Arc::new(Keys::derive(&secret)))
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_row() {
        let k = Keys::derive(b"secret one");
        let other = Keys::derive(b"secret two");
        let id = Uuid::now_v7();
        let body = k.seal_body(id, "Your code is 123456", "Your code is ******");
        assert!(is_sealed(&body));
        assert!(!body.contains("123456"));
        assert_eq!(shown_body(&body), "Your code is ******");
        assert_eq!(k.open_body(id, &body).unwrap(), "Your code is 123456");
        // The shown text is bound: another one beside the sealed body does not open.
        let (_, sealed) = body.rsplit_once('.').unwrap();
        let swapped = format!("{SEALED_PREFIX}{}.{sealed}", URL_SAFE_NO_PAD.encode("x"));
        assert!(k.open_body(id, &swapped).is_err());
        assert_eq!(shown_body(&swapped), "x");
        // The first format still opens (messages sealed before v2), shown
        // without its text; an unknown version never opens.
        let v1 = format!(
            "{SEALED_V1}{}",
            URL_SAFE_NO_PAD.encode(k.seal(id.as_bytes(), b"Your code is 1"))
        );
        assert_eq!(k.open_body(id, &v1).unwrap(), "Your code is 1");
        assert_eq!(shown_body(&v1), SEALED_UNSHOWN);
        assert!(k.open_body(id, "sendonce-sealed:v9:abc").is_err());
        assert_eq!(shown_body("plain"), "plain");
        assert!(other.open_body(id, &body).is_err());
        assert!(k.open_body(Uuid::now_v7(), &body).is_err());
        // A flipped bit anywhere is refused.
        let mut raw = k.seal(b"a", &[7u8; 70]);
        raw[20] ^= 1;
        assert!(k.open(b"a", &raw).is_err());
        // Bodies that were never sealed pass through.
        assert_eq!(k.open_body(id, "hello").unwrap(), "hello");
        // Two seals of one value differ (random nonce).
        assert_ne!(k.seal(b"a", b"x"), k.seal(b"a", b"x"));
        assert!(k.open(b"a", &[0u8; 10]).is_err());
    }

    #[test]
    fn codes_match_only_their_verification() {
        let k = Keys::derive(b"s");
        let id = Uuid::now_v7();
        let mac = k.code_mac(id, "123456");
        assert!(k.code_matches(id, "123456", &mac));
        assert!(!k.code_matches(id, "123457", &mac));
        assert!(!k.code_matches(Uuid::now_v7(), "123456", &mac));
        assert!(!Keys::derive(b"t").code_matches(id, "123456", &mac));
    }

    #[test]
    fn generated_codes_have_the_asked_length_and_digits_only() {
        for len in 4..=10 {
            let c = generate_code(len);
            assert_eq!(c.len(), len as usize);
            assert!(c.bytes().all(|b| b.is_ascii_digit()));
        }
        // Not constant: 20 six-digit codes are not all equal.
        let codes: std::collections::HashSet<_> = (0..20).map(|_| generate_code(6)).collect();
        assert!(codes.len() > 1);
    }

    /// Values sealed by the code before the AEAD (encrypt-then-MAC over
    /// HMAC-SHA256), written by it for this test: they still open.
    #[test]
    fn values_sealed_before_the_aead_still_open() {
        let k = Keys::derive(b"fixture verify secret");
        let id = Uuid::parse_str("01a24c00-0000-7000-8000-000000000041").unwrap();
        let code = "b1c9bc6a4bb749a34b86e16440e919c8768a6c3e6ce018471d4c27bd5a273669\
                    d4e81c46ce768e2e95d73c5cff736840d54c920d0851";
        let code: Vec<u8> = (0..code.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&code[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(k.open(id.as_bytes(), &code).unwrap(), b"482913");
        assert!(k.open(Uuid::now_v7().as_bytes(), &code).is_err());
        let body = "sendonce-sealed:v2:WW91ciBjb2RlIGlzICoqKioqKg.fKiwyiqRA8j6CZQmpff6D0ziF-\
                    0zIyn7VcUg_RKUukAAOn_kdJeiGCGhDAaT0C7VvePPY1mjIfxXsRXLwNhA6q4klQ";
        assert_eq!(k.open_body(id, body).unwrap(), "Your code is 482913");
        assert_eq!(shown_body(body), "Your code is ******");
        // The stored code's HMAC is unchanged too (verifications in flight
        // still check).
        let mac: String = k
            .code_mac(id, "482913")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            mac,
            "d0d856f905f3983f1f25cf1749e9b655d0aa4ab40b9d5d0eb3f53b2ab69b8fcc"
        );
    }

    /// New values are ChaCha20-Poly1305 (ring) under the version tag, with
    /// the key ring's HKDF derives for sealing: opened here by ring itself.
    #[test]
    fn new_values_are_chacha20_poly1305_under_their_version_tag() {
        use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
        let secret = b"another verify secret";
        let k = Keys::derive(secret);
        let sealed = k.seal(b"row 1", b"Your code is 123456");
        assert!(sealed.starts_with(AEAD_V3), "{sealed:?}");
        let rest = &sealed[AEAD_V3.len()..];
        let (nonce, ct) = rest.split_at(12);
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, HKDF_SALT).extract(secret);
        let info = [INFO_SEAL];
        let okm = prk.expand(&info, &CHACHA20_POLY1305).unwrap();
        let key = LessSafeKey::new(UnboundKey::from(okm));
        let mut buf = ct.to_vec();
        let nonce = Nonce::try_assume_unique_for_key(nonce).unwrap();
        let plain = key
            .open_in_place(nonce, Aad::from(b"row 1"), &mut buf)
            .unwrap();
        assert_eq!(plain, b"Your code is 123456");
        assert_eq!(k.open(b"row 1", &sealed).unwrap(), b"Your code is 123456");
        assert!(k.open(b"row 2", &sealed).is_err(), "bound to its row");
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(k.open(b"row 1", &flipped).is_err());
        assert!(Keys::derive(b"x").open(b"row 1", &sealed).is_err());
    }

    /// RFC 8439, section 2.8.2: ring's ChaCha20-Poly1305 gives the
    /// published ciphertext and tag.
    #[test]
    fn the_aead_matches_rfc_8439() {
        use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let key: Vec<u8> = (0x80..=0x9f).collect();
        let nonce = hex("07000000 40414243 44454647");
        let aad = hex("50515253 c0c1c2c3 c4c5c6c7");
        let plain = b"Ladies and Gentlemen of the class of '99: If I could offer you only one \
                      tip for the future, sunscreen would be it.";
        let want_ct = hex(
            "d31a8d34648e60db7b86afbc53ef7ec2 a4aded51296e08fea9e2b5a736ee62d6 \
             3dbea45e8ca9671282fafb69da92728b 1a71de0a9e060b2905d6a5b67ecd3b36 \
             92ddbd7f2d778b8c9803aee328091b58 fab324e4fad675945585808b4831d7bc \
             3ff4def08e4b7a9de576d26586cec64b 6116",
        );
        let want_tag = hex("1ae10b594f09e26a7e902ecbd0600691");
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
        let mut buf = plain.to_vec();
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::try_assume_unique_for_key(&nonce).unwrap(),
                Aad::from(&aad),
                &mut buf,
            )
            .unwrap();
        assert_eq!(buf, want_ct);
        assert_eq!(tag.as_ref(), want_tag.as_slice());
    }
}
