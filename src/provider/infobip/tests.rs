//! The adapter's pure parts as tables: base URLs, the idempotency grace
//! period, answer classes, log entries, receipt statuses, the request body.

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
fn idempotency_grace_periods_outlast_the_retry_deadline_by_an_hour() {
    let deadline = Duration::from_secs(15 * 60);
    assert_eq!(idempotency_grace(None, deadline).unwrap(), None);
    // (given, taken)
    #[rustfmt::skip]
    let table = [
        ("24h", Some(Duration::from_secs(24 * 3600))),
        (" 2h ", Some(Duration::from_secs(7200))),
        ("75m", Some(Duration::from_secs(75 * 60))),
        ("74m 59s", None),
        ("1h", None),
        ("15m", None),
        ("0s", None),
        ("soon", None),
        ("86400", None),
    ];
    for (given, taken) in table {
        match (idempotency_grace(Some(given), deadline), taken) {
            (Ok(got), Some(want)) => assert_eq!(got, Some(want), "{given:?}"),
            (Err(e), None) => {
                assert!(e.to_string().contains(IDEMPOTENCY_GRACE), "{given:?}: {e}");
            }
            (got, want) => panic!("{given:?}: got {got:?}, want {want:?}"),
        }
    }
    // The refusal names both variables.
    let e = idempotency_grace(Some("1h"), deadline).unwrap_err().to_string();
    assert!(
        e.contains("INFOBIP_IDEMPOTENCY_GRACE") && e.contains("SENDONCE_RETRY_DEADLINE"),
        "{e}"
    );
    // A longer deadline needs a longer grace period.
    let day = Duration::from_secs(24 * 3600);
    assert!(idempotency_grace(Some("24h"), day).is_err());
    assert!(idempotency_grace(Some("25h"), day).unwrap().is_some());
    assert_eq!(GRACE_MARGIN, Duration::from_secs(3600));
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
    let c = |s: Status| classify_accepted(200, id(), Some(&s), ours, false);
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
        classify_accepted(200, None, Some(&pending), ours, false).class(),
        "ambiguous"
    );
    assert_eq!(
        classify_accepted(200, id(), None, ours, false).class(),
        "ambiguous"
    );
    // The duplicate answer, without idempotency declared, names our id and
    // says it is never resent: a repeat may be a second message, and its
    // refusal says nothing of whether the first was accepted.
    match c(status("REJECTED", DUPLICATE_MESSAGE_ID)) {
        SendOutcome::Ambiguous { message, .. } => {
            assert!(message.contains(ours) && message.contains(DUPLICATE_MESSAGE_ID));
        }
        other => panic!("{other:?}"),
    }
    // Declared: Infobip accepted a message with our id within the grace
    // period, so it is accepted under our id (whatever id the answer
    // carries).
    assert_eq!(
        classify_accepted(200, None, Some(&status("REJECTED", DUPLICATE_MESSAGE_ID)), ours, true),
        SendOutcome::Accepted {
            provider_message_id: ours.into(),
            http_status: Some(200),
        }
    );
    // Idempotency changes nothing else.
    for (group, name) in [("PENDING", "PENDING_ACCEPTED"), ("REJECTED", "REJECTED_DESTINATION")] {
        let s = status(group, name);
        assert_eq!(
            classify_accepted(200, id(), Some(&s), ours, true),
            classify_accepted(200, id(), Some(&s), ours, false),
            "{name}"
        );
    }
}

/// The log entries a lookup by our id returns, read by status.
#[test]
fn log_entries_by_status() {
    use super::lookup::read_logs;
    let ours = "0190a1b2-0000-7000-8000-000000000001";
    let entry = |group: &str, name: &str| LogEntry {
        message_id: Some(ours.into()),
        status: Some(status(group, name)),
    };
    let pending = || entry("PENDING", "PENDING_ACCEPTED");
    let dup = || entry("REJECTED", DUPLICATE_MESSAGE_ID);
    let destination = || entry("REJECTED", "REJECTED_DESTINATION");
    let credits = || entry("REJECTED", "REJECTED_NOT_ENOUGH_CREDITS");
    let system = || entry("REJECTED", "REJECTED_SYSTEM_ERROR");
    let someone_elses = LogEntry {
        message_id: Some("not-ours".into()),
        status: Some(status("PENDING", "PENDING_ACCEPTED")),
    };
    let no_status = LogEntry {
        message_id: Some(ours.into()),
        status: None,
    };
    let sent = Reconciled::Sent {
        provider_message_id: ours.into(),
    };
    // What a row wants: Sent, Pending, or the shown answer's class and code.
    #[derive(Debug, PartialEq)]
    enum Want {
        Sent,
        Pending,
        Shown(&'static str, String),
    }
    // (entries, attempt number, want)
    #[rustfmt::skip]
    let table: Vec<(&str, Vec<LogEntry>, u32, Want)> = vec![
        ("none: the log may lag", vec![], 1, Want::Pending),
        ("only another message's", vec![someone_elses], 1, Want::Pending),
        ("pending", vec![pending()], 1, Want::Sent),
        ("delivered", vec![entry("DELIVERED", "DELIVERED_TO_HANDSET")], 1, Want::Sent),
        ("undeliverable: it was sent", vec![entry("UNDELIVERABLE", "UNDELIVERABLE_NOT_DELIVERED")], 1, Want::Sent),
        ("expired: it was sent", vec![entry("EXPIRED", "EXPIRED_EXPIRED")], 1, Want::Sent),
        ("the group from the name alone", vec![LogEntry { message_id: Some(ours.into()), status: Some(Status { name: Some("REJECTED_DESTINATION".into()), ..Status::default() }) }], 1, Want::Shown("permanent", "REJECTED_DESTINATION".into())),
        ("rejected, the destination", vec![destination()], 1, Want::Shown("permanent", "REJECTED_DESTINATION".into())),
        ("rejected, the account", vec![credits()], 1, Want::Shown("refused", "REJECTED_NOT_ENOUGH_CREDITS".into())),
        ("rejected, Infobip's own error", vec![system()], 1, Want::Shown("retryable", "REJECTED_SYSTEM_ERROR".into())),
        ("only a repeat refused: nothing of the first", vec![dup()], 1, Want::Pending),
        ("a repeat refused, the first accepted", vec![dup(), pending()], 2, Want::Sent),
        ("a repeat refused, the first rejected", vec![destination(), dup()], 2, Want::Shown("permanent", "REJECTED_DESTINATION".into())),
        ("a second message under our id: sent", vec![system(), pending()], 2, Want::Sent),
        ("an earlier attempt's system error, this one's not shown yet", vec![system()], 2, Want::Pending),
        ("both attempts' system errors", vec![system(), system()], 2, Want::Shown("retryable", "REJECTED_SYSTEM_ERROR".into())),
        ("an earlier system error, this attempt's destination refusal", vec![system(), destination()], 2, Want::Shown("permanent", "REJECTED_DESTINATION".into())),
        ("the message refused over the account", vec![credits(), destination()], 1, Want::Shown("permanent", "REJECTED_DESTINATION".into())),
        ("no status", vec![no_status], 1, Want::Pending),
        ("a group Infobip does not document", vec![entry("SOMETHING_NEW", "SOMETHING_NEW")], 1, Want::Pending),
    ];
    for (name, entries, attempt, want) in table {
        let got = read_logs(&entries, ours, attempt);
        let as_want = match &got {
            r if *r == sent => Want::Sent,
            Reconciled::Pending(_) => Want::Pending,
            Reconciled::Answered(o) => {
                let code = match o {
                    SendOutcome::Rejected { provider_code, .. }
                    | SendOutcome::Refused { provider_code, .. }
                    | SendOutcome::Retryable { provider_code, .. } => provider_code.clone(),
                    _ => None,
                };
                Want::Shown(o.class(), code.unwrap_or_default())
            }
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(as_want, want, "{name}: {got:?}");
        // A log is not an HTTP answer: no status is made up for it.
        if let Reconciled::Answered(
            SendOutcome::Rejected { http_status, .. }
            | SendOutcome::Refused { http_status, .. }
            | SendOutcome::Retryable { http_status, .. },
        ) = &got
        {
            assert_eq!(*http_status, None, "{name}");
        }
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
    let ours = "0190a1b2-0000-7000-8000-000000000001";
    let c = |s: u16, e| classify_status(StatusCode::from_u16(s).unwrap(), e, None, ours, false);
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
        ours,
        false,
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
    // The duplicate refusal in an error answer reads as in a 2xx one:
    // ambiguous, or accepted under our id with idempotency declared.
    let dup = c(400, body("REJECTED_DUPLICATE_MESSAGE_ID", "duplicate"));
    assert!(
        matches!(&dup, SendOutcome::Ambiguous { message, .. } if message.contains(DUPLICATE_MESSAGE_ID)),
        "{dup:?}"
    );
    let declared = classify_status(
        StatusCode::BAD_REQUEST,
        body("REJECTED_DUPLICATE_MESSAGE_ID", "duplicate"),
        None,
        ours,
        true,
    );
    assert_eq!(
        declared,
        SendOutcome::Accepted {
            provider_message_id: ours.into(),
            http_status: Some(400),
        }
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
        // A repeat's refusal is about the repeat: recorded, changes nothing.
        ("REJECTED", "REJECTED_DUPLICATE_MESSAGE_ID", "REJECTED/REJECTED_DUPLICATE_MESSAGE_ID", None),
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
    assert_eq!(infobip_status("REJECTED_DUPLICATE_MESSAGE_ID"), None);
    assert_eq!(infobip_status(""), None);
}

#[test]
fn the_body_carries_our_id_the_sender_validity_and_the_delivery_url() {
    let p = InfobipProvider::new(InfobipSettings {
        base_url: "https://xk3e9.api.infobip.com".into(),
        api_key: "key".into(),
        from: Some("ACME".into()),
        delivery_url: Some("https://sms.example.com/providers/infobip/status?secret=s".into()),
        idempotency_grace: None,
        warnings: Vec::new(),
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
        to: crate::domain::Recipient::from_stored("+14155550100", &[]).expect("E.164"),
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
    use super::super::registry::{self, Configured, ReceiptRoutes, Vars};
    let adapter = registry::adapter("infobip").expect("registered");
    let ctx = |public: Option<&str>| super::super::registry::Context {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        public_url: public.map(str::to_string),
        log_bodies: false,
        retry_deadline: Duration::from_secs(15 * 60),
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
        ("INFOBIP_IDEMPOTENCY_GRACE", "24h"),
    ];
    let s = settings(&full, Some("https://sms.example.com")).unwrap();
    assert_eq!(s.base_url, "https://xk3e9.api.infobip.com");
    assert_eq!(s.api_key, "k3y");
    assert_eq!(s.from.as_deref(), Some("ACME"));
    assert_eq!(s.idempotency_grace, Some(Duration::from_secs(24 * 3600)));
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert!(s.build().unwrap().dedupes_by_key());
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
    // No idempotency unless declared, and errors that name their variable.
    let s = settings(&full[..2], Some("https://sms.example.com")).unwrap();
    assert_eq!(s.idempotency_grace, None);
    assert!(!s.build().unwrap().dedupes_by_key());
    assert!(!s.build().unwrap().rejection_covers_earlier_attempts());
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
    // A grace period the retry deadline could outlast is refused at start.
    let e = settings(&[full[0], full[1], ("INFOBIP_IDEMPOTENCY_GRACE", "30m")], None).unwrap_err();
    assert!(e.to_string().contains("INFOBIP_IDEMPOTENCY_GRACE"), "{e}");
    assert!(e.to_string().contains("SENDONCE_RETRY_DEADLINE"), "{e}");
    // INFOBIP_LOOKUP_AFTER is still accepted, whatever it says, with a
    // warning that it does nothing.
    for old in ["90s", "2h"] {
        let s = settings(
            &[full[0], full[1], full[3], ("INFOBIP_LOOKUP_AFTER", old)],
            Some("https://sms.example.com"),
        )
        .unwrap();
        assert_eq!(s.warnings.len(), 1, "{old}");
        assert!(s.warnings[0].contains("INFOBIP_LOOKUP_AFTER"), "{:?}", s.warnings);
        assert_eq!(s.warnings, s.warnings(), "the warning reaches the start");
    }
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
