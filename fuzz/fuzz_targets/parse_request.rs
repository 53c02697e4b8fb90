//! Fuzzes the request parsing path: the `Idempotency-Key` header, the JSON
//! body of `POST /messages`, segment counting and the fingerprint. Nothing
//! a client sends may panic, and a parsed request must keep its invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sendonce::domain::{IdempotencyKey, SendRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse_header(data) {
        let k = key.as_str();
        assert!(!k.is_empty() && k.len() <= 255);
        assert!(k.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    }
    if let Ok(request) = SendRequest::parse(data) {
        assert!(request.to.starts_with('+'));
        let chars = request.body.chars().count();
        assert!((1..=1600).contains(&chars));
        assert!(request.segments.segments >= 1);
        // The same request, re-serialised, has the same fingerprint.
        let again = serde_json::to_vec(&request).expect("serialisable");
        let reparsed = SendRequest::parse(&again).expect("a parsed request parses again");
        assert_eq!(reparsed.fingerprint(), request.fingerprint());
    }
});
