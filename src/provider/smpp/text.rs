//! A message body as `submit_sm` short messages: GSM-7 (`data_coding` 0)
//! or UCS-2 (`data_coding` 8), as the service's segment counter
//! (`domain::segments`) chose, and long bodies as concatenated parts.
//!
//! On SMPP, `data_coding` 0 (the SMSC default alphabet) carries GSM 03.38
//! **unpacked**: one octet per septet, an extension character as the escape
//! 0x1B and its code; the SMSC packs septets for the air interface. A long
//! message's parts each start with a user data header (`esm_class` 0x40):
//! `05 00 03 <reference> <total> <number>` (IEI 0x00, 8-bit reference), and
//! carry at most 153 septets (GSM-7) or 67 UTF-16 units (134 octets), never
//! splitting an escape pair or a surrogate pair.

use crate::domain::segments::{self, Encoding};

/// GSM 03.38 default alphabet, in code order (0x1B, the escape, is a
/// placeholder never matched).
const BASIC: [char; 128] = [
    '@', '£', '$', '¥', 'è', 'é', 'ù', 'ì', 'ò', 'Ç', '\n', 'Ø', 'ø', '\r', 'Å', 'å', 'Δ', '_',
    'Φ', 'Γ', 'Λ', 'Ω', 'Π', 'Ψ', 'Σ', 'Θ', 'Ξ', '\u{1B}', 'Æ', 'æ', 'ß', 'É', ' ', '!', '"', '#',
    '¤', '%', '&', '\'', '(', ')', '*', '+', ',', '-', '.', '/', '0', '1', '2', '3', '4', '5', '6',
    '7', '8', '9', ':', ';', '<', '=', '>', '?', '¡', 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I',
    'J', 'K', 'L', 'M', 'N', 'O', 'P', 'Q', 'R', 'S', 'T', 'U', 'V', 'W', 'X', 'Y', 'Z', 'Ä', 'Ö',
    'Ñ', 'Ü', '§', '¿', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o',
    'p', 'q', 'r', 's', 't', 'u', 'v', 'w', 'x', 'y', 'z', 'ä', 'ö', 'ñ', 'ü', 'à',
];

/// The extension table: character and its code after the escape.
const EXTENSION: [(char, u8); 10] = [
    ('\u{0C}', 0x0A),
    ('^', 0x14),
    ('{', 0x28),
    ('}', 0x29),
    ('\\', 0x2F),
    ('[', 0x3C),
    ('~', 0x3D),
    (']', 0x3E),
    ('|', 0x40),
    ('€', 0x65),
];

const ESCAPE: u8 = 0x1B;

/// `c` in unpacked GSM-7: one septet, or the escape and one.
fn gsm7(c: char) -> Option<Vec<u8>> {
    if c != '\u{1B}'
        && let Some(i) = BASIC.iter().position(|&b| b == c)
    {
        return u8::try_from(i).ok().map(|b| vec![b]);
    }
    EXTENSION
        .iter()
        .find(|(e, _)| *e == c)
        .map(|(_, code)| vec![ESCAPE, *code])
}

/// One `submit_sm`'s worth of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub data_coding: u8,
    pub esm_class: u8,
    /// With its user data header when there are several parts.
    pub short_message: Vec<u8>,
}

/// What a body becomes: its parts, in order.
pub fn parts(body: &str, reference: u8) -> Vec<Part> {
    let encoding = segments::count(body).encoding;
    // Units: each character's octets, which must stay together.
    let (data_coding, units, single, per_part): (u8, Vec<Vec<u8>>, usize, usize) = match encoding {
        Encoding::Gsm7 => {
            let units: Option<Vec<Vec<u8>>> = body.chars().map(gsm7).collect();
            match units {
                Some(units) => (0, units, 160, 153),
                // The counter and this table disagree: UCS-2 is always right.
                None => (8, ucs2_units(body), 140, 134),
            }
        }
        // `count` never answers UTF-8 for a body (that is a Telegram
        // chat's, counted elsewhere); were it to, UCS-2 carries any text.
        Encoding::Ucs2 | Encoding::Utf8 => (8, ucs2_units(body), 140, 134),
    };
    let total: usize = units.iter().map(Vec::len).sum();
    if total <= single {
        return vec![Part {
            data_coding,
            esm_class: 0,
            short_message: units.concat(),
        }];
    }
    let mut chunks: Vec<Vec<u8>> = vec![Vec::new()];
    for unit in units {
        let fits = chunks
            .last()
            .is_some_and(|c| c.len() + unit.len() <= per_part);
        if !fits {
            chunks.push(Vec::new());
        }
        if let Some(last) = chunks.last_mut() {
            last.extend_from_slice(&unit);
        }
    }
    // At most 255 parts fit an 8-bit count; the service refuses bodies
    // far shorter than that (SENDONCE_MAX_SEGMENTS).
    chunks.truncate(255);
    let n = u8::try_from(chunks.len()).unwrap_or(u8::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut sm = vec![0x05, 0x00, 0x03, reference, n, u8::try_from(i + 1).unwrap_or(n)];
            sm.extend_from_slice(&chunk);
            Part {
                data_coding,
                esm_class: super::pdu::ESM_UDHI,
                short_message: sm,
            }
        })
        .collect()
}

/// Each character as UTF-16BE (two or four octets).
fn ucs2_units(body: &str) -> Vec<Vec<u8>> {
    body.chars()
        .map(|c| {
            let mut buf = [0u16; 2];
            c.encode_utf16(&mut buf)
                .iter()
                .flat_map(|u| u.to_be_bytes())
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm7_is_unpacked_with_escapes() {
        let p = parts("A@{é", 1);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].data_coding, 0);
        assert_eq!(p[0].esm_class, 0);
        assert_eq!(p[0].short_message, vec![0x41, 0x00, 0x1B, 0x28, 0x05]);
        assert_eq!(gsm7('Æ'), Some(vec![0x1C]));
        assert_eq!(gsm7('à'), Some(vec![0x7F]));
        assert_eq!(gsm7('€'), Some(vec![0x1B, 0x65]));
        assert_eq!(gsm7('\u{1B}'), None);
    }

    #[test]
    fn one_part_up_to_160_septets_then_153() {
        assert_eq!(parts(&"a".repeat(160), 1).len(), 1);
        let p = parts(&"a".repeat(161), 7);
        assert_eq!(p.len(), 2);
        assert_eq!(&p[0].short_message[..6], &[5, 0, 3, 7, 2, 1]);
        assert_eq!(&p[1].short_message[..6], &[5, 0, 3, 7, 2, 2]);
        assert_eq!(p[0].short_message.len(), 6 + 153);
        assert_eq!(p[1].short_message.len(), 6 + 8);
        assert!(p.iter().all(|x| x.esm_class == 0x40 && x.data_coding == 0));
        // An escape pair is never split: 152 septets and then `{`.
        let body = format!("{}{{{}", "a".repeat(152), "b".repeat(10));
        let p = parts(&body, 1);
        assert_eq!(p[0].short_message.len(), 6 + 152);
        assert_eq!(&p[1].short_message[6..8], &[0x1B, 0x28]);
    }

    #[test]
    fn ucs2_parts_of_67_units_agree_with_the_counter() {
        let body = "Привет ".repeat(25); // 175 characters
        let p = parts(&body, 3);
        assert_eq!(p.len() as u32, segments::count(&body).segments);
        assert_eq!(p.len(), 3);
        assert!(p.iter().all(|x| x.data_coding == 8));
        assert_eq!(p[0].short_message.len(), 6 + 134);
        let text: Vec<u16> = p
            .iter()
            .flat_map(|x| {
                x.short_message[6..]
                    .chunks(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(String::from_utf16(&text).ok().as_deref(), Some(body.as_str()));
        // 70 units fit one message.
        assert_eq!(parts(&"Ж".repeat(70), 1).len(), 1);
        // A surrogate pair is never split.
        let body = format!("{}😀{}", "Ж".repeat(66), "Ж".repeat(3));
        let p = parts(&body, 1);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].short_message.len(), 6 + 132);
        assert_eq!(p[1].short_message.len(), 6 + 4 + 6);
    }

    #[test]
    fn gsm_part_counts_agree_with_the_counter() {
        for n in [1, 159, 160, 161, 306, 307, 459, 460] {
            let body = "x".repeat(n);
            assert_eq!(
                parts(&body, 1).len() as u32,
                segments::count(&body).segments,
                "{n}"
            );
        }
    }
}
