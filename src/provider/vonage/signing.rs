//! Vonage's request signatures (`sig`), as its signing guide and its
//! client libraries compute them: every parameter but `sig`, sorted by
//! name, each value with `&` and `=` replaced by `_`, joined as
//! `&name=value&name=value...`; then either `md5hash` (the lower-case hex
//! MD5 of that string followed by the signature secret, Vonage's default)
//! or an HMAC keyed with the secret (`md5`, `sha1`, `sha256`, `sha512`),
//! upper-case hex. The HMACs are the `hmac` crate's, not our own. Vonage compares signatures without regard to case, and
//! so does [`verify`], in constant time.

use subtle::ConstantTimeEq;

/// How Vonage signs (the account's setting on its dashboard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SignatureMethod {
    /// MD5 of the parameters followed by the secret (Vonage's default).
    #[default]
    Md5Hash,
    HmacMd5,
    HmacSha1,
    HmacSha256,
    HmacSha512,
}

impl SignatureMethod {
    /// `VONAGE_SIGNATURE_METHOD`'s words, as Vonage names them.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "md5hash" => Some(Self::Md5Hash),
            "md5" => Some(Self::HmacMd5),
            "sha1" => Some(Self::HmacSha1),
            "sha256" => Some(Self::HmacSha256),
            "sha512" => Some(Self::HmacSha512),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Md5Hash => "md5hash",
            Self::HmacMd5 => "md5",
            Self::HmacSha1 => "sha1",
            Self::HmacSha256 => "sha256",
            Self::HmacSha512 => "sha512",
        }
    }
}

/// The string Vonage signs for these parameters (`sig` left out).
pub fn signed_string(params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().filter(|(k, _)| k != "sig").collect();
    sorted.sort();
    let mut out = String::new();
    for (name, value) in sorted {
        out.push('&');
        out.push_str(name);
        out.push('=');
        out.push_str(&value.replace(['&', '='], "_"));
    }
    out
}

fn md5(data: &[u8]) -> Vec<u8> {
    <md5::Md5 as md5::Digest>::digest(data).to_vec()
}

/// The HMAC (RFC 2104) of `data` keyed with `key` for one of the HMAC
/// methods (the `hmac` crate's; `Md5Hash` is no HMAC: empty).
pub fn mac(method: SignatureMethod, key: &[u8], data: &[u8]) -> Vec<u8> {
    // `new_from_slice` takes a key of any length (HMAC hashes a long one).
    fn of<M: hmac::Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
        match <M as hmac::digest::KeyInit>::new_from_slice(key) {
            Ok(mut m) => {
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Err(_) => Vec::new(),
        }
    }
    match method {
        SignatureMethod::Md5Hash => Vec::new(),
        SignatureMethod::HmacMd5 => {
            use hmac_digest011::{KeyInit as _, Mac as _};
            match hmac_digest011::Hmac::<md5::Md5>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            }
        }
        SignatureMethod::HmacSha1 => of::<hmac::Hmac<sha1::Sha1>>(key, data),
        SignatureMethod::HmacSha256 => of::<hmac::Hmac<sha2::Sha256>>(key, data),
        SignatureMethod::HmacSha512 => of::<hmac::Hmac<sha2::Sha512>>(key, data),
    }
}

fn hex(bytes: &[u8], upper: bool) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = if upper {
            write!(s, "{b:02X}")
        } else {
            write!(s, "{b:02x}")
        };
        s
    })
}

/// The `sig` Vonage computes for `params` with `secret`.
pub fn sign(method: SignatureMethod, secret: &str, params: &[(String, String)]) -> String {
    let base = signed_string(params);
    match method {
        SignatureMethod::Md5Hash => hex(&md5(format!("{base}{secret}").as_bytes()), false),
        hmac_method => hex(&mac(hmac_method, secret.as_bytes(), base.as_bytes()), true),
    }
}

/// Whether `given` is the right `sig` for `params`: compared in constant
/// time, without regard to case (as Vonage's libraries compare).
pub fn verify(
    method: SignatureMethod,
    secret: &str,
    params: &[(String, String)],
    given: &str,
) -> bool {
    let want = sign(method, secret, params).to_ascii_lowercase();
    let given = given.trim().to_ascii_lowercase();
    bool::from(want.as_bytes().ct_eq(given.as_bytes()))
}
