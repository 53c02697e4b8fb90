//! The verify secret and what is derived from it: the HMAC that stores a
//! code, and the sealing (authenticated encryption) of a code and of a
//! verification message's body.
//!
//! Sealing is encrypt-then-MAC over HMAC-SHA256 alone (already a
//! dependency): the keystream is HMAC(enc key, nonce || block counter) (a
//! PRF in counter mode), the tag HMAC(auth key, aad || nonce || ciphertext),
//! checked in constant time before anything is decrypted. A 16-byte random
//! nonce per seal; the associated data binds a sealed value to the row it
//! belongs to (a verification's code to its id, a message body to the
//! message id), so a sealed value copied into another row does not open.

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

pub use crate::domain::sealed::{
    SEALED_MARK, SEALED_PREFIX, SEALED_UNSHOWN, SEALED_V1, is_sealed, shown_body,
};

/// Keys derived from the verify secret, one per purpose.
pub struct Keys {
    code_mac: [u8; 32],
    enc: [u8; 32],
    auth: [u8; 32],
}

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

    /// `plain` encrypted and authenticated, bound to `aad`.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE];
        rand::rng().fill_bytes(&mut nonce);
        let mut out = Vec::with_capacity(NONCE + plain.len() + TAG);
        out.extend_from_slice(&nonce);
        let mut ct = plain.to_vec();
        self.keystream_xor(&nonce, &mut ct);
        let tag = self.tag(aad, &nonce, &ct);
        out.extend_from_slice(&ct);
        out.extend_from_slice(&tag);
        out
    }

    /// The plain text of a value [`Keys::seal`] made with the same `aad`.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
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
}
