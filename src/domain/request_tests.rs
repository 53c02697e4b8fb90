//! `SendRequest::parse`, as tables where it decides.

use super::*;

fn fields(body: &str) -> Vec<String> {
    match SendRequest::parse(body.as_bytes()) {
        Err(RequestError::Invalid(e)) => e.into_iter().map(|e| e.field).collect(),
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn parses_a_full_request() {
    let r = SendRequest::parse(
        br#"{"to":"+14155550100","body":"Your code is 123456","from":"ACME","validity_seconds":300,"metadata":{"order":"92831"}}"#,
    )
    .unwrap();
    assert_eq!(r.to, "+14155550100");
    assert_eq!(r.from.as_deref(), Some("ACME"));
    assert_eq!(r.validity_seconds, Some(300));
    assert_eq!(r.metadata.get("order").map(String::as_str), Some("92831"));
    assert_eq!(r.segments.segments, 1);
}

#[test]
fn duplicate_keys_are_refused_wherever_they_are() {
    assert_eq!(
        fields(r#"{"to":"+14155550100","to":"+14155550101","body":"hi"}"#),
        vec!["to"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","metadata":{"a":"1","a":"2"}}"#),
        vec!["metadata.a"]
    );
}

#[test]
fn numbers_are_normalised_to_e164() {
    let a =
        SendRequest::parse(br#"{"to":"+1 (415) 555-2671","body":"hi","from":"+44 20 7946 0958"}"#)
            .unwrap();
    assert_eq!(a.to, "+14155552671");
    assert_eq!(a.to_country.as_deref(), Some("US"));
    assert_eq!(a.from.as_deref(), Some("+442079460958"));
    let b =
        SendRequest::parse(br#"{"to":"+14155552671","body":"hi","from":"+442079460958"}"#).unwrap();
    assert_eq!(
        a.fingerprint(),
        b.fingerprint(),
        "same number, same request"
    );
}

#[test]
fn malformed_json_is_malformed() {
    assert_eq!(
        SendRequest::parse(b"{\"to\":"),
        Err(RequestError::Malformed)
    );
}

#[test]
fn reports_each_bad_field() {
    assert_eq!(fields(r#"{}"#), vec!["body", "to"]);
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","x":1}"#),
        vec!["x"]
    );
    assert_eq!(fields(r#"{"to":"+1415","body":"hi"}"#), vec!["to"]);
    assert_eq!(fields(r#"{"to":"14155550100","body":"hi"}"#), vec!["to"]);
    assert_eq!(fields(r#"{"to":5,"body":"hi"}"#), vec!["to"]);
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"   "}"#),
        vec!["body"]
    );
    assert_eq!(fields(r#"{"to":"+14155550100","body":""}"#), vec!["body"]);
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"a\u0000b"}"#),
        vec!["body"]
    );
    let long = "a".repeat(1601);
    assert_eq!(
        fields(&format!(r#"{{"to":"+14155550100","body":"{long}"}}"#)),
        vec!["body"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","from":"TWELVECHARSX"}"#),
        vec!["from"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","from":"12345"}"#),
        vec!["from"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","validity_seconds":0}"#),
        vec!["validity_seconds"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","validity_seconds":36001}"#),
        vec!["validity_seconds"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","validity_seconds":1.5}"#),
        vec!["validity_seconds"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","metadata":{"a":1}}"#),
        vec!["metadata.a"]
    );
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","metadata":[]}"#),
        vec!["metadata"]
    );
    assert_eq!(fields(r#"[1]"#), vec![""]);
}

#[test]
fn whole_numbers_written_as_floats_are_whole_numbers() {
    let whole =
        SendRequest::parse(br#"{"to":"+14155550100","body":"hi","validity_seconds":300.0}"#)
            .unwrap();
    assert_eq!(whole.validity_seconds, Some(300));
    assert_eq!(
        fields(r#"{"to":"+14155550100","body":"hi","validity_seconds":1e20}"#),
        vec!["validity_seconds"]
    );
}

#[test]
fn metadata_limits() {
    let many: Vec<String> = (0..17).map(|i| format!(r#""k{i}":"v""#)).collect();
    let body = format!(
        r#"{{"to":"+14155550100","body":"hi","metadata":{{{}}}}}"#,
        many.join(",")
    );
    assert_eq!(fields(&body), vec!["metadata"]);
    let key = "k".repeat(41);
    assert_eq!(
        fields(&format!(
            r#"{{"to":"+14155550100","body":"hi","metadata":{{"{key}":"v"}}}}"#
        )),
        vec!["metadata"]
    );
    let val = "v".repeat(501);
    assert_eq!(
        fields(&format!(
            r#"{{"to":"+14155550100","body":"hi","metadata":{{"k":"{val}"}}}}"#
        )),
        vec!["metadata.k"]
    );
}

#[test]
fn messages_do_not_echo_the_value() {
    let Err(RequestError::Invalid(errors)) =
        SendRequest::parse(br#"{"to":"SECRET-123456","body":"hi"}"#)
    else {
        panic!("expected invalid");
    };
    assert!(errors.iter().all(|e| !e.message.contains("SECRET")));
}

#[test]
fn fingerprint_ignores_key_order_and_formatting() {
    let a =
        SendRequest::parse(br#"{"to":"+14155550100","body":"hi","metadata":{"a":"1","b":"2"}}"#)
            .unwrap();
    let b = SendRequest::parse(
        br#"{ "metadata": {"b":"2","a":"1"}, "body": "hi", "to": "+14155550100" }"#,
    )
    .unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    let c =
        SendRequest::parse(br#"{"to":"+14155550101","body":"hi","metadata":{"a":"1","b":"2"}}"#)
            .unwrap();
    assert_ne!(a.fingerprint(), c.fingerprint());
}
