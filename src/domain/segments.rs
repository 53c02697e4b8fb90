//! How many SMS segments a body takes, and in which encoding.
//!
//! A body made only of characters from the GSM 03.38 default alphabet is sent
//! as GSM-7: 160 septets in one message, or 153 per segment once it needs a
//! concatenation header. Characters of the extension table (`{}[]~^|\€` and
//! form feed) take two septets (escape + character), and an escape pair is
//! never split across segments. Any other character makes the whole body
//! UCS-2: 70 UTF-16 code units in one message, 67 per segment, and a surrogate
//! pair is never split.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Gsm7,
    Ucs2,
    /// A channel that carries text as UTF-8, whole (a Telegram chat).
    Utf8,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Gsm7 => "gsm7",
            Encoding::Ucs2 => "ucs2",
            Encoding::Utf8 => "utf8",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gsm7" => Some(Encoding::Gsm7),
            "ucs2" => Some(Encoding::Ucs2),
            "utf8" => Some(Encoding::Utf8),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentCount {
    pub encoding: Encoding,
    pub segments: u32,
}

const GSM7_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?\
¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
const GSM7_EXTENSION: &str = "\u{0C}^{}\\[~]|€";

/// Septets a character takes in GSM-7, or `None` if it is not in the alphabet.
fn gsm7_septets(c: char) -> Option<u32> {
    if c.is_ascii_alphanumeric() || c == ' ' {
        return Some(1);
    }
    if GSM7_BASIC.contains(c) {
        Some(1)
    } else if GSM7_EXTENSION.contains(c) {
        Some(2)
    } else {
        None
    }
}

/// Counts segments for `body`. An empty body is one (empty) message.
pub fn count(body: &str) -> SegmentCount {
    let septets: Option<Vec<u32>> = body.chars().map(gsm7_septets).collect();
    match septets {
        Some(units) => SegmentCount {
            encoding: Encoding::Gsm7,
            segments: pack(&units, 160, 153),
        },
        None => {
            let units: Vec<u32> = body.chars().map(|c| c.len_utf16() as u32).collect();
            SegmentCount {
                encoding: Encoding::Ucs2,
                segments: pack(&units, 70, 67),
            }
        }
    }
}

/// Packs indivisible units into segments: one if they fit in `single`,
/// otherwise as many `multi`-sized segments as greedy packing needs.
fn pack(units: &[u32], single: u32, multi: u32) -> u32 {
    let total: u32 = units.iter().sum();
    if total <= single {
        return 1;
    }
    let mut segments = 1;
    let mut used = 0;
    for &u in units {
        if used + u > multi {
            segments += 1;
            used = 0;
        }
        used += u;
    }
    segments
}

/// Whether an SMS text holds a control character other than newline and
/// tab (NUL, escape, ...): refused in message bodies and verification
/// templates alike.
pub fn has_refused_control(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(body: &str) -> (Encoding, u32) {
        let c = count(body);
        (c.encoding, c.segments)
    }

    #[test]
    fn gsm7_boundaries() {
        assert_eq!(seg("hello"), (Encoding::Gsm7, 1));
        assert_eq!(seg(&"a".repeat(160)), (Encoding::Gsm7, 1));
        assert_eq!(seg(&"a".repeat(161)), (Encoding::Gsm7, 2));
        assert_eq!(seg(&"a".repeat(306)), (Encoding::Gsm7, 2));
        assert_eq!(seg(&"a".repeat(307)), (Encoding::Gsm7, 3));
    }

    #[test]
    fn extension_characters_take_two_septets_and_are_not_split() {
        assert_eq!(seg(&"€".repeat(80)), (Encoding::Gsm7, 1));
        assert_eq!(seg(&"€".repeat(81)), (Encoding::Gsm7, 2));
        // 152 septets then an escape pair: the pair moves to segment two.
        let body = format!("{}{}{}", "a".repeat(152), "{", "a".repeat(7));
        assert_eq!(seg(&body), (Encoding::Gsm7, 2));
        let body = format!("{}{}", "a".repeat(152), "{".repeat(77));
        // 152 + 2 septets do not fit 153, so the first escape opens segment 2,
        // which holds 76 pairs; the 77th opens segment 3.
        assert_eq!(seg(&body), (Encoding::Gsm7, 3));
    }

    #[test]
    fn gsm7_specials_are_gsm7() {
        assert_eq!(seg("Ünïcode").0, Encoding::Ucs2); // ï is not in GSM 03.38
        assert_eq!(seg("Für 5€ @ Straße"), (Encoding::Gsm7, 1));
        assert_eq!(seg("line\nbreak"), (Encoding::Gsm7, 1));
    }

    #[test]
    fn ucs2_boundaries() {
        assert_eq!(seg(&"ж".repeat(70)), (Encoding::Ucs2, 1));
        assert_eq!(seg(&"ж".repeat(71)), (Encoding::Ucs2, 2));
        assert_eq!(seg(&"ж".repeat(134)), (Encoding::Ucs2, 2));
        assert_eq!(seg(&"ж".repeat(135)), (Encoding::Ucs2, 3));
    }

    #[test]
    fn surrogate_pairs_count_two_and_are_not_split() {
        assert_eq!(seg(&"😀".repeat(35)), (Encoding::Ucs2, 1));
        assert_eq!(seg(&"😀".repeat(36)), (Encoding::Ucs2, 2));
        // 66 units + a pair: the pair moves to the next segment.
        let body = format!("{}{}", "ж".repeat(66), "😀");
        assert_eq!(seg(&body), (Encoding::Ucs2, 1)); // 68 units fit in one SMS
        let body = format!("{}{}{}", "ж".repeat(66), "😀", "ж".repeat(10));
        assert_eq!(seg(&body), (Encoding::Ucs2, 2));
    }
}
