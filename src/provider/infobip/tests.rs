//! The adapter's pure parts as tables: base URLs, the lookup delay, answer
//! classes, receipt statuses, the request body.

use super::receipts::{infobip_status, status_word};
use super::*;
use reqwest::StatusCode;
use crate::domain::Status as MessageStatus;

fn status(group: &str, name: &str) -> Status {
    Status {
        group_id: None,
        group_name: Some(group.into()),
        id: None,
        name: Some(name.into()),
        description: Some("described".into()),
    }
}

#[test]
fn base_urls_with_or_without_a_scheme() {
    // (given, wanted)
    #[rustfmt::skip]
    let ok = [
        ("xk3e9.api.infobip.com", "https://xk3e9.api.infobip.com"),
        ("  xk3e9.api.infobip.com  ", "https://xk3e9.api.infobip.com"),
        ("xk3e9.api.infobip.com/", "https://xk3e9.api.infobip.com"),
        ("https://xk3e9.api.infobip.com", "https://xk3e9.api.infobip.com"),
        ("https://xk3e9.api.infobip.com/", "https://xk3e9.api.infobip.com"),
        ("HTTPS://XK3E9.API.INFOBIP.COM", "https://xk3e9.api.infobip.com"),
        ("http://127.0.0.1:4010", "http://127.0.0.1:4010"),
        ("127.0.0.1:4010", "https://127.0.0.1:4010"),
    ];
    for (given, want) in ok {
        assert_eq!(base_url(given).as_deref(), Ok(want), "{given:?}");
    }
    for bad in [
        "",
        "https://",
        "ftp://xk3e9.api.infobip.com",
        "https://xk3e9.api.infobip.com/sms/3/messages",
        "https://xk3e9.api.infobip.com?x=1",
        "https://xk3e9.api.infobip.com#top",
        "https://user:pass@xk3e9.api.infobip.com",
        "xk3e9 .api.infobip.com",
    ] {
        assert!(base_url(bad).is_err(), "{bad:?} was taken");
    }
}

#[test]
fn lookup_delays() {
    assert_eq!(lookup_after(None).unwrap(), Duration::from_secs(60));
    assert_eq!(lookup_after(Some("90s")).unwrap(), Duration::from_secs(90));
    assert_eq!(lookup_after(Some(" 2m ")).unwrap(), Duration::from_secs(120));
    assert_eq!(lookup_after(Some("1h")).unwrap(), MAX_LOOKUP_AFTER);
    assert_eq!(lookup_after(Some("1s")).unwrap(), MIN_LOOKUP_AFTER);
    for bad in ["0s", "500ms", "61m", "2h", "soon", "60"] {
        assert!(lookup_after(Some(bad)).is_err(), "{bad:?} was taken");
    }
}

#[test]
fn the_delivery_url_carries_the_secret_as_a_query_parameter() {
    assert_eq!(
        delivery_url("https://sms.example.com/", "s3cret&more=1 x"),
        "https://sms.example.com/providers/infobip/status?secret=s3cret%26more%3D1+x"
    );
}

#[test]
fn accepted_answers_by_status() {
    let ours = "0190a1b2-0000-7000-8000-000000000001";
    let id = || Some(ours.to_string());
    let c = |s: Status| classify_accepted(200, id(), Some(&s), ours);
    // (group, name, class, provider code)
    #[rustfmt::skip]
    let table = [
        ("PENDING", "PENDING_ACCEPTED", "ok", None),
        ("PENDING", "MESSAGE_ACCEPTED", "ok", None),
        ("PENDING", "PENDING_ENROUTE", "ok", None),
        ("DELIVERED", "DELIVERED_TO_HANDSET", "ok", None),
        ("REJECTED", "REJECTED_DESTINATION", "permanent", Some("REJECTED_DESTINATION")),
        ("REJECTED", "REJECTED_INVALID_DESTINATION", "permanent", Some("REJECTED_INVALID_DESTINATION")),
        ("REJECTED", "MISSING_TO", "permanent", Some("MISSING_TO")),
        ("REJECTED", "REJECTED_DND", "permanent", Some("REJECTED_DND")),
        ("REJECTED", "REJECTED_MESSAGE_TOO_LONG", "permanent", Some("REJECTED_MESSAGE_TOO_LONG")),
        ("REJECTED", "REJECTED_NOT_ENOUGH_CREDITS", "refused", Some("REJECTED_NOT_ENOUGH_CREDITS")),
        ("REJECTED", "REJECTED_PREPAID_PACKAGE_EXPIRED", "refused", Some("REJECTED_PREPAID_PACKAGE_EXPIRED")),
        ("REJECTED", "REJECTED_SYSTEM_ERROR", "retryable", Some("REJECTED_SYSTEM_ERROR")),
        ("REJECTED", "REJECTED_DUPLICATE_MESSAGE_ID", "ambiguous", None),
        ("SOMETHING_NEW", "SOMETHING_NEW", "ambiguous", None),
    ];
    for (group, name, class, code) in table {
        let outcome = c(status(group, name));
        assert_eq!(outcome.class(), class, "{name}: {outcome:?}");
        let got = match &outcome {
            SendOutcome::Rejected { provider_code, .. }
            | SendOutcome::Refused { provider_code, .. }
            | SendOutcome::Retryable { provider_code, .. } => provider_code.clone(),
            _ => None,
        };
        assert_eq!(got.as_deref(), code, "{name}");
    }
    // Accepted under the id Infobip answered with.
    assert_eq!(
        c(status("PENDING", "PENDING_ACCEPTED")),
        SendOutcome::Accepted {
            provider_message_id: ours.into(),
            http_status: Some(200),
        }
    );
    // No id, or no status: it may have the message, so ambiguous.
    let pending = status("PENDING", "PENDING_ACCEPTED");
    assert_eq!(
        classify_accepted(200, None, Some(&pending), ours).class(),
        "ambiguous"
    );
    assert_eq!(classify_accepted(200, id(), None, ours).class(), "ambiguous");
    // The duplicate answer names our id and says it is never resent.
    match c(status("REJECTED", DUPLICATE_MESSAGE_ID)) {
        SendOutcome::Ambiguous { message, .. } => {
            assert!(message.contains(ours) && message.contains(DUPLICATE_MESSAGE_ID));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn error_answers_by_http_status() {
    let body = |code: &str, text: &str| {
        serde_json::from_value::<ErrorBody>(serde_json::json!({
            "requestError": {"serviceException": {"messageId": code, "text": text}}
        }))
        .ok()
    };
    let c = |s: u16, e| classify_status(StatusCode::from_u16(s).unwrap(), e, None);
    // (status, class)
    let table = [
        (400, "permanent"),
        (404, "permanent"),
        (301, "permanent"),
        (401, "refused"),
        (403, "refused"),
        (429, "retryable"),
        (500, "ambiguous"),
        (502, "ambiguous"),
        (503, "ambiguous"),
    ];
    for (s, class) in table {
        assert_eq!(c(s, body("X", "nope")).class(), class, "{s}");
        assert_eq!(c(s, None).class(), class, "{s} without a body");
    }
    match c(401, body("UNAUTHORIZED", "Invalid login details")) {
        SendOutcome::Refused {
            provider_code,
            message,
            ..
        } => {
            assert_eq!(provider_code.as_deref(), Some("UNAUTHORIZED"));
            assert_eq!(message, "Invalid login details");
        }
        other => panic!("{other:?}"),
    }
    let throttled = classify_status(
        StatusCode::TOO_MANY_REQUESTS,
        body("TOO_MANY_REQUESTS", "Too many requests"),
        Some(Duration::from_secs(7)),
    );
    assert_eq!(
        throttled,
        SendOutcome::Retryable {
            http_status: Some(429),
            provider_code: Some("TOO_MANY_REQUESTS".into()),
            retry_after: Some(Duration::from_secs(7)),
            message: "Too many requests".into(),
        }
    );
    // The duplicate refusal in an error answer is still "Infobip has it".
    let dup = c(400, body("REJECTED_DUPLICATE_MESSAGE_ID", "duplicate"));
    assert!(
        matches!(&dup, SendOutcome::Ambiguous { message, .. } if message.contains(DUPLICATE_MESSAGE_ID)),
        "{dup:?}"
    );
    // The newer error shape reads the same.
    let newer = serde_json::from_value::<ErrorBody>(serde_json::json!({
        "errorCode": "E400", "description": "Bad request", "action": "fix it"
    }))
    .ok();
    match c(400, newer) {
        SendOutcome::Rejected {
            provider_code,
            message,
            ..
        } => {
            assert_eq!(provider_code.as_deref(), Some("E400"));
            assert_eq!(message, "Bad request");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn report_statuses() {
    // (group, name, word, meaning)
    #[rustfmt::skip]
    let table = [
        ("DELIVERED", "DELIVERED_TO_HANDSET", "DELIVERED/DELIVERED_TO_HANDSET", Some(MessageStatus::Delivered)),
        ("DELIVERED", "DELIVERED_TO_OPERATOR", "DELIVERED/DELIVERED_TO_OPERATOR", Some(MessageStatus::Sent)),
        ("UNDELIVERABLE", "UNDELIVERABLE_NOT_DELIVERED", "UNDELIVERABLE/UNDELIVERABLE_NOT_DELIVERED", Some(MessageStatus::Undelivered)),
        ("EXPIRED", "EXPIRED_EXPIRED", "EXPIRED/EXPIRED_EXPIRED", Some(MessageStatus::Undelivered)),
        ("REJECTED", "MISSING_TO", "REJECTED/MISSING_TO", Some(MessageStatus::Undelivered)),
        ("PENDING", "PENDING_WAITING_DELIVERY", "PENDING/PENDING_WAITING_DELIVERY", Some(MessageStatus::Sent)),
        ("delivered", "DELIVERED_TO_HANDSET", "DELIVERED/DELIVERED_TO_HANDSET", Some(MessageStatus::Delivered)),
        ("NEW_GROUP", "WHATEVER", "NEW_GROUP/WHATEVER", None),
    ];
    for (group, name, word, meaning) in table {
        assert_eq!(status_word(&status(group, name)).as_deref(), Some(word));
        assert_eq!(infobip_status(word), meaning, "{word}");
    }
    // A name or a group alone.
    assert_eq!(infobip_status("DELIVERED_TO_HANDSET"), Some(MessageStatus::Delivered));
    assert_eq!(infobip_status("EXPIRED"), Some(MessageStatus::Undelivered));
    assert_eq!(infobip_status("delivered"), Some(MessageStatus::Delivered));
    assert_eq!(infobip_status(""), None);
}

#[test]
fn the_body_carries_our_id_the_sender_validity_and_the_delivery_url() {
    let p = InfobipProvider::new(InfobipSettings {
        base_url: "https://xk3e9.api.infobip.com".into(),
        api_key: "key".into(),
        from: Some("ACME".into()),
        delivery_url: Some("https://sms.example.com/providers/infobip/status?secret=s".into()),
        lookup_after: DEFAULT_LOOKUP_AFTER,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    })
    .unwrap();
    assert_eq!(
        p.send_url.as_str(),
        "https://xk3e9.api.infobip.com/sms/3/messages"
    );
    assert_eq!(p.logs_url.as_str(), "https://xk3e9.api.infobip.com/sms/3/logs");
    let sms = OutgoingSms {
        message_id: crate::domain::MessageId::new(),
        to: crate::domain::Recipient::from_stored("+14155550100").expect("E.164"),
        from: None,
        body: "Your code is 1234".into(),
        validity: Some(Duration::from_millis(299_500)),
        attempt: 1,
        prepared: None,
    };
    let to = sms.phone().unwrap();
    let body = p.body(&sms, to);
    let m = &body["messages"][0];
    assert_eq!(m["destinations"][0]["to"], "14155550100");
    assert_eq!(m["destinations"][0]["messageId"], sms.message_id.to_string());
    assert_eq!(m["content"]["text"], "Your code is 1234");
    assert_eq!(m["sender"], "ACME");
    assert_eq!(m["options"]["validityPeriod"]["amount"], 300);
    assert_eq!(m["options"]["validityPeriod"]["timeUnit"], "SECONDS");
    assert_eq!(
        m["webhooks"]["delivery"]["url"],
        "https://sms.example.com/providers/infobip/status?secret=s"
    );
    // The request's sender wins; without a validity, no options.
    let mut named = sms.clone();
    named.from = Some("Other".into());
    named.validity = None;
    let body = p.body(&named, to);
    assert_eq!(body["messages"][0]["sender"], "Other");
    assert!(body["messages"][0].get("options").is_none());
    assert!(!format!("{p:?}").contains("secret=s"), "{p:?}");
}

#[test]
fn configuration_from_the_variables() {
    use super::super::registry::{self, ReceiptRoutes, Vars};
    let adapter = registry::adapter("infobip").expect("registered");
    let ctx = |public: Option<&str>| super::super::registry::Context {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        public_url: public.map(str::to_string),
        log_bodies: false,
    };
    let settings = |pairs: &[(&str, &str)], public: Option<&str>| {
        (adapter.configure)(&Vars::from_pairs(pairs.iter().copied()), &ctx(public)).map(|c| {
            c.as_any()
                .downcast_ref::<InfobipSettings>()
                .expect("infobip settings")
                .clone()
        })
    };
    let full = [
        ("INFOBIP_API_KEY", "k3y"),
        ("INFOBIP_BASE_URL", "xk3e9.api.infobip.com"),
        ("INFOBIP_FROM", "ACME"),
        ("INFOBIP_RECEIPT_SECRET", "receipt-secret-0123456789"),
        ("INFOBIP_LOOKUP_AFTER", "90s"),
    ];
    let s = settings(&full, Some("https://sms.example.com")).unwrap();
    assert_eq!(s.base_url, "https://xk3e9.api.infobip.com");
    assert_eq!(s.api_key, "k3y");
    assert_eq!(s.from.as_deref(), Some("ACME"));
    assert_eq!(s.lookup_after, Duration::from_secs(90));
    assert_eq!(s.timeout, Duration::from_secs(5));
    assert_eq!(
        s.delivery_url.as_deref(),
        Some("https://sms.example.com/providers/infobip/status?secret=receipt-secret-0123456789")
    );
    assert!(!format!("{s:?}").contains("k3y"), "{s:?}");
    assert!(!format!("{s:?}").contains("receipt-secret"), "{s:?}");
    // No public URL: no delivery URL (reports would have nowhere to go).
    let s = settings(&full, None).unwrap();
    assert_eq!(s.delivery_url, None);
    // The default delay, and errors that name their variable.
    let s = settings(&full[..2], Some("https://sms.example.com")).unwrap();
    assert_eq!(s.lookup_after, DEFAULT_LOOKUP_AFTER);
    assert_eq!(s.delivery_url, None, "no secret, no delivery URL");
    let e = settings(&full[1..], None).unwrap_err();
    assert!(e.to_string().contains("INFOBIP_API_KEY"), "{e}");
    let e = settings(&full[..1], None).unwrap_err();
    assert!(e.to_string().contains("INFOBIP_BASE_URL"), "{e}");
    let e = settings(
        &[full[0], ("INFOBIP_BASE_URL", "https://x.api.infobip.com/sms")],
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("INFOBIP_BASE_URL"), "{e}");
    let e = settings(&[full[0], full[1], ("INFOBIP_LOOKUP_AFTER", "2h")], None).unwrap_err();
    assert!(e.to_string().contains("INFOBIP_LOOKUP_AFTER"), "{e}");
    // The receipt route refuses a short secret, and refuses every report
    // without one.
    let e = ReceiptRoutes::from_pairs([("INFOBIP_RECEIPT_SECRET", "short")]).unwrap_err();
    assert!(e.to_string().contains("INFOBIP_RECEIPT_SECRET"), "{e}");
    let routes = ReceiptRoutes::from_pairs([]).unwrap();
    let route = routes.get("infobip").expect("an endpoint");
    let headers = axum::http::HeaderMap::new();
    let req = super::super::receipts::ReceiptRequest {
        method: &axum::http::Method::POST,
        headers: &headers,
        path_and_query: "/providers/infobip/status?secret=anything-at-all-0123",
        public_url: None,
        now: time::OffsetDateTime::now_utc(),
    };
    assert_eq!(
        route.admit(&req),
        Err(super::super::receipts::ReceiptError::Forbidden)
    );
}
