use axum::http::{HeaderMap, Method};
use serde_json::json;

use super::receipts::delivery_status;
use super::signing::{mac, signed_string};
use super::*;
use crate::domain::{MessageId, Recipient, Status};
use crate::provider::receipts::{ReceiptError, ReceiptRequest, ReceiptRoute};

fn reply(v: serde_json::Value) -> Reply {
    serde_json::from_value(v).expect("a reply")
}

fn part(status: &str, id: Option<&str>) -> serde_json::Value {
    let mut p = json!({"status": status, "to": "447700900000"});
    match id {
        Some(id) => p["message-id"] = json!(id),
        None => p["error-text"] = json!(format!("scripted {status}")),
    }
    p
}

#[test]
fn every_status_is_classified() {
    // (parts' statuses, class, provider code)
    #[rustfmt::skip]
    let cases: &[(&[&str], &str, Option<&str>)] = &[
        (&["0"], "ok", None),
        (&["1"], "retryable", Some("1")),
        (&["2"], "permanent", Some("2")),
        (&["3"], "permanent", Some("3")),
        (&["4"], "refused", Some("4")),
        (&["5"], "ambiguous", None),
        (&["6"], "permanent", Some("6")),
        (&["7"], "permanent", Some("7")),
        (&["8"], "refused", Some("8")),
        (&["9"], "refused", Some("9")),
        (&["15"], "permanent", Some("15")),
        (&["29"], "permanent", Some("29")),
        (&["not a number"], "ambiguous", None),
        // Concatenated: every part accepted is the message accepted.
        (&["0", "0", "0"], "ok", None),
        // Some parts accepted, others not: on the phone in part.
        (&["0", "1"], "ambiguous", None),
        (&["0", "4"], "ambiguous", None),
        (&["0", "0", "6"], "ambiguous", None),
        (&["3", "0"], "ambiguous", None),
        // None accepted: the worst part decides.
        (&["1", "4"], "refused", Some("4")),
        (&["4", "6"], "permanent", Some("6")),
        (&["6", "5"], "ambiguous", None),
        (&["1", "1"], "retryable", Some("1")),
    ];
    for (statuses, class, code) in cases {
        let parts: Vec<serde_json::Value> = statuses
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let id = format!("0A00000{i}");
                part(s, (*s == "0").then_some(id.as_str()))
            })
            .collect();
        let r = reply(json!({"message-count": statuses.len().to_string(), "messages": parts}));
        let got = classify_reply(&r, 200);
        assert_eq!(got.class(), *class, "{statuses:?}: {got:?}");
        let got_code = match &got {
            SendOutcome::Rejected { provider_code, .. }
            | SendOutcome::Refused { provider_code, .. }
            | SendOutcome::Retryable { provider_code, .. } => provider_code.clone(),
            _ => None,
        };
        assert_eq!(got_code.as_deref(), *code, "{statuses:?}: {got:?}");
        if *class == "ok" {
            assert_eq!(
                got,
                SendOutcome::Accepted {
                    provider_message_id: "0A000000".into(),
                    http_status: Some(200)
                },
                "the first part's id"
            );
        }
    }
}

#[test]
fn odd_replies_are_not_taken_for_acceptances() {
    // Fewer parts listed than counted: one we know nothing about.
    let r = reply(json!({"message-count": "2", "messages": [part("0", Some("A"))]}));
    assert_eq!(classify_reply(&r, 200).class(), "ambiguous");
    // No parts at all.
    let r = reply(json!({"message-count": "0", "messages": []}));
    assert_eq!(classify_reply(&r, 200).class(), "ambiguous");
    // Accepted without an id.
    let r = reply(json!({"message-count": "1", "messages": [{"status": "0"}]}));
    assert_eq!(classify_reply(&r, 200).class(), "ambiguous");
    // Numbers instead of strings are read alike.
    let r = reply(json!({"message-count": 1, "messages": [{"status": 0, "message-id": "B"}]}));
    assert_eq!(classify_reply(&r, 200).class(), "ok");
    // The partial answer says what was refused.
    let r = reply(json!({"message-count": "2", "messages": [part("0", Some("A")), part("4", None)]}));
    let SendOutcome::Ambiguous { message, .. } = classify_reply(&r, 200) else {
        panic!("ambiguous")
    };
    assert!(message.contains("1 of the 2 parts"), "{message}");
}

#[test]
fn http_statuses_are_classified() {
    let t = |s: u16| classify_status(StatusCode::from_u16(s).expect("status"), None).class();
    assert_eq!(t(401), "refused");
    assert_eq!(t(403), "refused");
    assert_eq!(t(429), "retryable");
    assert_eq!(t(400), "permanent");
    assert_eq!(t(302), "permanent");
    assert_eq!(t(500), "ambiguous");
    assert_eq!(t(503), "ambiguous");
}

fn provider(callback: Option<&str>) -> VonageProvider {
    let t = Duration::from_secs(1);
    VonageProvider::new(VonageSettings {
        base_url: "https://rest.example.com/".into(),
        api_key: "key".into(),
        api_secret: "secret".into(),
        from: "AcmeInc".into(),
        callback: callback.map(str::to_string),
        timeout: t,
        connect_timeout: t,
    })
    .expect("provider")
}

fn outgoing(body: &str, validity: Option<Duration>) -> OutgoingSms {
    OutgoingSms {
        message_id: MessageId::new(),
        to: Recipient::from_stored("+447700900000", &[]).expect("E.164"),
        from: None,
        body: body.into(),
        validity,
        attempt: 1,
        prepared: None,
    }
}

#[test]
fn the_form_carries_our_id_the_encoding_and_the_callback() {
    let p = provider(Some("https://sms.example.com/providers/vonage/status"));
    assert_eq!(p.send_url.as_str(), "https://rest.example.com/sms/json");
    let sms = outgoing("Hello {world}", Some(Duration::from_millis(60_500)));
    let to = sms.phone().expect("phone");
    let form = p.form(&sms, to);
    let get = |k: &str| form.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("to"), Some("447700900000"));
    assert_eq!(get("from"), Some("AcmeInc"));
    assert_eq!(get("client-ref"), Some(sms.message_id.to_string().as_str()));
    assert_eq!(get("status-report-req"), Some("1"));
    assert_eq!(
        get("callback"),
        Some("https://sms.example.com/providers/vonage/status")
    );
    assert_eq!(get("ttl"), Some("60500"));
    // GSM-7 (extension characters included): no `type`.
    assert_eq!(get("type"), None);
    let sms = outgoing("Привет", Some(Duration::from_secs(1)));
    let form = p.form(&sms, sms.phone().expect("phone"));
    let get = |k: &str| form.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("type"), Some("unicode"));
    assert_eq!(get("ttl"), Some("20000"), "Vonage's minimum");
    let p = provider(None);
    let form = p.form(&sms, sms.phone().expect("phone"));
    assert!(!form.iter().any(|(n, _)| *n == "callback"));
    assert!(!p.dedupes_by_key());
    assert!(!format!("{:?}", p.settings).contains("\"secret\""));
}

#[test]
fn hmac_matches_the_rfc_vectors() {
    // RFC 2202 (MD5, SHA-1) and RFC 4231 (SHA-256, SHA-512), test case 2,
    // and a key longer than the block.
    use SignatureMethod::{HmacMd5, HmacSha1, HmacSha256, HmacSha512};
    let hex = |b: Vec<u8>| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (key, data) = (b"Jefe".as_slice(), b"what do ya want for nothing?".as_slice());
    assert_eq!(
        hex(mac(HmacMd5, key, data)),
        "750c783e6ab0b503eaa86e310a5db738"
    );
    assert_eq!(
        hex(mac(HmacSha1, key, data)),
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
    );
    assert_eq!(
        hex(mac(HmacSha256, key, data)),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    assert_eq!(
        hex(mac(HmacSha512, key, data)),
        "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
    );
    let data = b"Test Using Larger Than Block-Size Key - Hash Key First".as_slice();
    assert_eq!(
        hex(mac(HmacMd5, &[0xaa; 80], data)),
        "6b1ab7fe4bd7bf8f0b62e6ce61b9d0cd"
    );
    assert_eq!(
        hex(mac(HmacSha512, &[0xaa; 131], data)),
        "80b24263c7c1a3ebb71493c1dd7be8b49b46d1f41b4aeec1121b013783f8f3526b56d037e05f2598bd0fd2215d6a1e5295e64f73f63f0aec8b915a985d786598"
    );
}

/// A delivery receipt as Vonage sends it (values with `&` and `=` in
/// `client-ref` to exercise the replacement).
fn dlr() -> Vec<(String, String)> {
    [
        ("msisdn", "447700900000"),
        ("to", "AcmeInc"),
        ("network-code", "12345"),
        ("messageId", "0A0000001234567B"),
        ("price", "0.03330000"),
        ("status", "delivered"),
        ("scts", "2001011400"),
        ("err-code", "0"),
        ("client-ref", "my-ref=1&x"),
        ("message-timestamp", "2020-01-01 12:00:00"),
        ("timestamp", "1582288282"),
        ("nonce", "ec11dd3e-1e7f-4db5-9467-82b02cd223b9"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

const SECRET: &str = "the-signature-secret";

#[test]
fn signatures_match_an_independent_implementation() {
    // Computed with Python's hashlib/hmac over the same parameters:
    // base = "".join("&%s=%s" % (k, v.replace("&","_").replace("=","_"))
    //                for k, v in sorted(params.items()))
    assert_eq!(
        signed_string(&dlr()),
        "&client-ref=my-ref_1_x&err-code=0&message-timestamp=2020-01-01 12:00:00\
         &messageId=0A0000001234567B&msisdn=447700900000&network-code=12345\
         &nonce=ec11dd3e-1e7f-4db5-9467-82b02cd223b9&price=0.03330000&scts=2001011400\
         &status=delivered&timestamp=1582288282&to=AcmeInc"
    );
    #[rustfmt::skip]
    let cases = [
        (SignatureMethod::Md5Hash, "f9499615be66fada04308895d1bb7b13"),
        (SignatureMethod::HmacMd5, "B7B0A1F02A04B841ED03B5B2FF3D7F00"),
        (SignatureMethod::HmacSha1, "72FFC843F31BBE1D9D346C1CA623A4A9BE1A9BCB"),
        (SignatureMethod::HmacSha256, "91EA3D877F7ACAE0D2C658BA8CC41F9F9CC5B059398789006E8F4763992BC41B"),
        (SignatureMethod::HmacSha512, "62D320D3EF110BC7628ED608078EC88D97F56CBFD911874566353C862E0211FAA5AAC067645A1E84458498A09E7FC15C20187728A6A0B285398DF136AAB317B1"),
    ];
    for (method, want) in cases {
        let mut params = dlr();
        assert_eq!(sign(method, SECRET, &params), want, "{method:?}");
        // `sig` itself is not signed; case does not matter.
        params.push(("sig".into(), want.to_ascii_lowercase()));
        assert!(verify(method, SECRET, &params, &want.to_ascii_lowercase()));
        assert!(!verify(method, "another-secret", &params, want));
        assert!(!verify(method, SECRET, &params, &want[1..]));
        params[5].1 = "failed".into();
        assert!(!verify(method, SECRET, &params, want), "{method:?}: tampered");
    }
    for (word, method) in [
        ("md5hash", SignatureMethod::Md5Hash),
        ("md5", SignatureMethod::HmacMd5),
        ("SHA1", SignatureMethod::HmacSha1),
        ("sha256", SignatureMethod::HmacSha256),
        ("sha512", SignatureMethod::HmacSha512),
    ] {
        assert_eq!(SignatureMethod::parse(word), Some(method));
    }
    assert_eq!(SignatureMethod::parse("sha384"), None);
}

fn read(
    route: &VonageReceipts,
    method: Method,
    content_type: Option<&str>,
    path_and_query: &str,
    body: &[u8],
) -> Result<crate::provider::receipts::Receipt, ReceiptError> {
    let mut headers = HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(
            axum::http::header::CONTENT_TYPE,
            ct.parse().expect("header"),
        );
    }
    let req = ReceiptRequest {
        method: &method,
        headers: &headers,
        path_and_query,
        public_url: None,
        now: time::OffsetDateTime::now_utc(),
    };
    route.admit(&req)?;
    route.read(&req, body)
}

#[test]
fn receipts_are_read_from_a_form_json_or_the_query() {
    let route = VonageReceipts::new(Some(SECRET), SignatureMethod::HmacSha256, false);
    let mut params = dlr();
    params[5].1 = "failed".into();
    params[7].1 = "6".into();
    let sig = sign(SignatureMethod::HmacSha256, SECRET, &params);
    params.push(("sig".into(), sig));
    let form = crate::provider::twilio::encode_form(&params);
    let json = serde_json::Value::Object(
        params
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect(),
    )
    .to_string();
    let want = crate::provider::receipts::Receipt {
        provider_message_id: "0A0000001234567B".into(),
        status: "failed".into(),
        error_code: Some("6".into()),
        message_id: None,
    };
    let path = format!("{STATUS_PATH}?{form}");
    #[rustfmt::skip]
    let ways: [(Method, Option<&str>, &str, &[u8]); 3] = [
        (Method::POST, Some("application/x-www-form-urlencoded"), STATUS_PATH, form.as_bytes()),
        (Method::POST, Some("application/json; charset=utf-8"), STATUS_PATH, json.as_bytes()),
        (Method::GET, None, &path, b""),
    ];
    for (method, ct, path, body) in ways {
        assert_eq!(
            read(&route, method.clone(), ct, path, body).as_ref(),
            Ok(&want),
            "{method} {ct:?}"
        );
    }
    // Forged: signed with another secret, or not signed.
    let forged = VonageReceipts::new(Some("not-the-secret"), SignatureMethod::HmacSha256, false);
    assert_eq!(
        read(&forged, Method::GET, None, &path, b""),
        Err(ReceiptError::Forbidden)
    );
    let unsigned: Vec<(String, String)> = dlr();
    let form = crate::provider::twilio::encode_form(&unsigned);
    let ct = Some("application/x-www-form-urlencoded");
    assert_eq!(
        read(&route, Method::POST, ct, STATUS_PATH, form.as_bytes()),
        Err(ReceiptError::Forbidden)
    );
    // No secret: refused, unless unsigned receipts are allowed.
    let closed = VonageReceipts::new(None, SignatureMethod::Md5Hash, false);
    assert_eq!(
        read(&closed, Method::POST, ct, STATUS_PATH, form.as_bytes()),
        Err(ReceiptError::Forbidden)
    );
    assert!(closed.warnings().is_empty());
    let open = VonageReceipts::new(None, SignatureMethod::Md5Hash, true);
    let got = read(&open, Method::POST, ct, STATUS_PATH, form.as_bytes()).expect("taken");
    assert_eq!(got.status, "delivered");
    assert_eq!(got.error_code, None, "err-code 0 is no error");
    assert_eq!(got.message_id, None, "a client-ref that is not our id");
    let ours = MessageId::new();
    let with_ref = crate::provider::twilio::encode_form(&[
        ("messageId", "0A01"),
        ("status", "delivered"),
        ("client-ref", ours.to_string().as_str()),
    ]);
    let got = read(&open, Method::POST, ct, STATUS_PATH, with_ref.as_bytes()).expect("taken");
    assert_eq!(got.message_id, None, "unsigned: not matched by client-ref");
    let mut signed: Vec<(String, String)> = form_urlencoded::parse(with_ref.as_bytes())
        .into_owned()
        .collect();
    let sig = sign(SignatureMethod::HmacSha256, SECRET, &signed);
    signed.push(("sig".into(), sig));
    let signed = crate::provider::twilio::encode_form(&signed);
    let got = read(&route, Method::POST, ct, STATUS_PATH, signed.as_bytes()).expect("taken");
    assert_eq!(got.message_id, Some(ours));
    assert_eq!(open.warnings().len(), 1);
    // Another body type.
    assert_eq!(
        read(&open, Method::POST, Some("text/plain"), STATUS_PATH, b"x=1"),
        Err(ReceiptError::UnsupportedMediaType)
    );
    // A parameter given twice is not taken.
    let twice = format!("{form}&status=failed");
    assert!(matches!(
        read(&open, Method::POST, ct, STATUS_PATH, twice.as_bytes()),
        Err(ReceiptError::Invalid(_))
    ));
}

#[test]
fn receipt_statuses() {
    assert_eq!(delivery_status("delivered"), Some(Status::Delivered));
    assert_eq!(delivery_status("expired"), Some(Status::Undelivered));
    assert_eq!(delivery_status("failed"), Some(Status::Undelivered));
    assert_eq!(delivery_status("rejected"), Some(Status::Undelivered));
    assert_eq!(delivery_status("accepted"), Some(Status::Sent));
    assert_eq!(delivery_status("buffered"), Some(Status::Sent));
    assert_eq!(delivery_status("unknown"), None);
}

#[test]
fn configuration_errors_name_the_variable() {
    use crate::provider::registry::ReceiptRoutes;
    let e = ReceiptRoutes::from_pairs([("VONAGE_SIGNATURE_METHOD", "sha384")]).unwrap_err();
    assert!(e.to_string().contains("VONAGE_SIGNATURE_METHOD"), "{e}");
    let e = ReceiptRoutes::from_pairs([("VONAGE_RECEIPTS_UNSIGNED", "yes")]).unwrap_err();
    assert!(e.to_string().contains("VONAGE_RECEIPTS_UNSIGNED"), "{e}");
    assert!(ReceiptRoutes::from_pairs([("VONAGE_SIGNATURE_METHOD", "sha512")]).is_ok());
}
