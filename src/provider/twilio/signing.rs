//! Twilio's request signatures (`X-Twilio-Signature`): HMAC-SHA1 over the
//! URL and the sorted POST parameters.

use super::*;

/// The MAC Twilio computes for a request to `url` with POST `params`.
fn mac(auth_token: &str, url: &str, params: &[(String, String)]) -> Option<Hmac<Sha1>> {
    // Sorted by name, then value; a repeated identical pair counts once
    // (as in Twilio's own validators).
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut mac = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()).ok()?;
    mac.update(url.as_bytes());
    for (name, value) in sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    Some(mac)
}

/// `X-Twilio-Signature` for a request to `url` with POST `params`: base64 of
/// HMAC-SHA1(auth token, url + every name and value, sorted by name).
pub fn signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    mac(auth_token, url, params)
        .map(|m| BASE64.encode(m.finalize().into_bytes()))
        .unwrap_or_default()
}

/// Whether `given` is the right signature, compared in constant time.
pub fn verify_signature(
    auth_token: &str,
    url: &str,
    params: &[(String, String)],
    given: &str,
) -> bool {
    let Ok(given) = BASE64.decode(given.trim()) else {
        return false;
    };
    mac(auth_token, url, params).is_some_and(|m| m.verify_slice(&given).is_ok())
}
