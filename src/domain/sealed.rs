//! The stored form of a sealed message body (a verification's SMS, whose
//! text holds a one-time code), as far as everything that only *shows* a
//! body needs it: recognising one, and the masked text stored beside it.
//! Sealing and opening are `verify::crypto`'s.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What every sealed message body starts with; `POST /messages` refuses a
/// body that does (it could never be sent as written).
pub const SEALED_MARK: &str = "sendonce-sealed:";
/// The first format: the sealed body alone (base64url). Still opened, for
/// messages sealed before v2; shown as [`SEALED_UNSHOWN`].
pub const SEALED_V1: &str = "sendonce-sealed:v1:";
/// The format written now: base64url of the text to show (the body with its
/// code masked, as the verification resource shows it), `.`, base64url of
/// the body sealed to the message id and that text.
pub const SEALED_PREFIX: &str = "sendonce-sealed:v2:";
/// What a sealed body whose shown text is unknown (v1) is shown as.
pub const SEALED_UNSHOWN: &str =
    "(a one-time code message: its text is stored sealed and never shown)";

/// Whether a stored message body is sealed.
pub fn is_sealed(body: &str) -> bool {
    body.starts_with(SEALED_MARK)
}

/// A stored body as every answer, event, webhook, page and log line shows
/// it: a sealed body is never shown, only the masked text stored beside it
/// (the verification resource's); any other body as it is.
pub fn shown_body(stored: &str) -> std::borrow::Cow<'_, str> {
    if !is_sealed(stored) {
        return std::borrow::Cow::Borrowed(stored);
    }
    let shown = stored
        .strip_prefix(SEALED_PREFIX)
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(shown, _)| URL_SAFE_NO_PAD.decode(shown).ok())
        .and_then(|shown| String::from_utf8(shown).ok());
    std::borrow::Cow::Owned(shown.unwrap_or_else(|| SEALED_UNSHOWN.to_string()))
}
