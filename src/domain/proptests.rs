//! Property tests for the parsers the idempotency protocol rests on.

use proptest::prelude::*;

use super::idempotency_key::{IdempotencyKey, KeyError};
use super::request::SendRequest;
use super::segments::{self, Encoding};

/// Visible ASCII, 1 to 255 characters: exactly the valid keys.
fn key() -> impl Strategy<Value = String> {
    proptest::collection::vec(0x21u8..=0x7e, 1..=255)
        .prop_map(|b| String::from_utf8(b).unwrap_or_default())
}

fn sf_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

proptest! {
    #[test]
    fn every_valid_key_parses_bare_and_quoted_to_itself(k in key()) {
        prop_assume!(!k.starts_with('"'));
        let bare = IdempotencyKey::parse_header(k.as_bytes()).unwrap();
        prop_assert_eq!(bare.as_str(), k.as_str());
        let quoted = IdempotencyKey::parse_header(sf_quote(&k).as_bytes()).unwrap();
        prop_assert_eq!(quoted, bare);
    }

    #[test]
    fn quoted_keys_roundtrip_even_when_they_start_with_a_quote(k in key()) {
        let quoted = IdempotencyKey::parse_header(sf_quote(&k).as_bytes()).unwrap();
        prop_assert_eq!(quoted.as_str(), k.as_str());
    }

    #[test]
    fn keys_with_anything_but_visible_ascii_are_refused(
        prefix in "[!-~]{0,10}",
        bad in prop::char::any().prop_filter("not visible ASCII", |c| !('!'..='~').contains(c)),
        suffix in "[!-~]{0,10}",
    ) {
        let raw = format!("{prefix}{bad}{suffix}");
        prop_assume!(!raw.trim_matches([' ', '\t']).is_empty() || raw.contains(|c: char| c != ' ' && c != '\t'));
        match IdempotencyKey::parse_header(raw.as_bytes()) {
            Ok(k) => {
                // Only surrounding spaces and tabs may be trimmed away.
                prop_assert!(matches!(bad, ' ' | '\t'));
                prop_assert!(k.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
            Err(e) => prop_assert!(matches!(e, KeyError::NotVisibleAscii | KeyError::BadQuoting | KeyError::Empty)),
        }
    }

    #[test]
    fn overlong_keys_are_refused(k in proptest::collection::vec(0x21u8..=0x7e, 256..400)) {
        prop_assume!(k[0] != b'"');
        prop_assert_eq!(IdempotencyKey::parse_header(&k).unwrap_err(), KeyError::TooLong);
    }

    #[test]
    fn plain_gsm_bodies_take_the_textbook_number_of_segments(body in "[a-zA-Z0-9 .,!?]{1,1600}") {
        let c = segments::count(&body);
        prop_assert_eq!(c.encoding, Encoding::Gsm7);
        let n = body.len() as u32;
        let want = if n <= 160 { 1 } else { n.div_ceil(153) };
        prop_assert_eq!(c.segments, want);
    }

    #[test]
    fn segments_fit_the_body_and_never_shrink_when_it_grows(body in "\\PC{0,400}", extra in "\\PC") {
        let c = segments::count(&body);
        prop_assert!(c.segments >= 1);
        let units: u32 = match c.encoding {
            Encoding::Gsm7 => body.chars().map(|ch| if "^{}\\[~]|€\u{c}".contains(ch) { 2 } else { 1 }).sum(),
            Encoding::Ucs2 => body.chars().map(|ch| ch.len_utf16() as u32).sum(),
            Encoding::Utf8 => return Err(TestCaseError::fail("an SMS body counted as UTF-8")),
        };
        let (single, multi) = match c.encoding { Encoding::Gsm7 => (160, 153), _ => (70, 67) };
        if c.segments == 1 {
            prop_assert!(units <= single);
        } else {
            prop_assert!(units > single);
            prop_assert!(c.segments * multi >= units);
            // Greedy packing wastes at most one unit per segment boundary.
            prop_assert!((c.segments - 1) * (multi - 1) < units);
        }
        let longer = segments::count(&format!("{body}{extra}"));
        prop_assert!(longer.segments >= c.segments || longer.encoding != c.encoding);
    }

    #[test]
    fn fingerprints_ignore_key_order_and_see_every_field(
        entries in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..6),
        body in "[a-zA-Z0-9][a-zA-Z0-9 ]{0,49}",
        validity in proptest::option::of(1i64..=36000),
        seed in any::<u64>(),
    ) {
        let mut fields: Vec<(String, serde_json::Value)> = vec![
            ("to".into(), serde_json::json!("+14155552671")),
            ("body".into(), serde_json::json!(body)),
            ("metadata".into(), serde_json::json!(entries)),
        ];
        if let Some(v) = validity {
            fields.push(("validity_seconds".into(), serde_json::json!(v)));
        }
        let render = |fields: &[(String, serde_json::Value)], meta_reversed: bool| {
            let parts: Vec<String> = fields.iter().map(|(k, v)| {
                let v = if k == "metadata" && meta_reversed {
                    let pairs: Vec<String> = entries.iter().rev()
                        .map(|(mk, mv)| format!("{}:{}", serde_json::json!(mk), serde_json::json!(mv)))
                        .collect();
                    format!("{{{}}}", pairs.join(","))
                } else {
                    v.to_string()
                };
                format!("{}: {v}", serde_json::json!(k))
            }).collect();
            format!("{{{}}}", parts.join(", "))
        };
        let a = SendRequest::parse(render(&fields, false).as_bytes()).unwrap();
        let mut shuffled = fields.clone();
        let n = shuffled.len();
        shuffled.rotate_left((seed as usize) % n);
        let b = SendRequest::parse(render(&shuffled, true).as_bytes()).unwrap();
        prop_assert_eq!(a.fingerprint(), b.fingerprint());

        let mut other = fields.clone();
        other[0].1 = serde_json::json!("+14155552672");
        let c = SendRequest::parse(render(&other, false).as_bytes()).unwrap();
        prop_assert_ne!(a.fingerprint(), c.fingerprint());
        let mut other = fields.clone();
        other[1].1 = serde_json::json!(format!("{body}!"));
        let d = SendRequest::parse(render(&other, false).as_bytes()).unwrap();
        prop_assert_ne!(a.fingerprint(), d.fingerprint());
    }
}
