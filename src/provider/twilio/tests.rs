//! The adapter's pure parts as tables: signatures, error classes, matching.

use super::lookup::Match;
use super::*;

fn sms(body: &str) -> OutgoingSms {
    OutgoingSms {
        message_id: crate::domain::MessageId::new(),
        to: crate::domain::Recipient::from_stored("+14155550100", &[]).expect("E.164"),
        from: None,
        body: body.into(),
        validity: None,
        attempt: 1,
        prepared: None,
    }
}

#[test]
fn signature_matches_twilios_documented_example() {
    // From Twilio's security documentation ("Validating signatures").
    let params: Vec<(String, String)> = [
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+14158675309"),
        ("Digits", "1234"),
        ("From", "+14158675309"),
        ("To", "+18005551212"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
    let token = "12345";
    let sig = signature(token, url, &params);
    assert_eq!(sig, "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
    assert!(verify_signature(token, url, &params, &sig));
    assert!(!verify_signature("54321", url, &params, &sig));
    assert!(!verify_signature(token, url, &params[1..], &sig));
    assert!(!verify_signature(token, url, &params, "not base64!"));
    assert!(!verify_signature(token, url, &params, ""));

    // Repeated names: values sorted, identical pairs once.
    let repeated: Vec<(String, String)> = [
        ("Sid", "CA123"),
        ("SidAccount", "AC123"),
        ("Digits", "5678"),
        ("Digits", "1234"),
        ("Digits", "1234"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(
        signature(token, url, &repeated),
        "IK+Dwps556ElfBT0I3Rgjkr1wJU="
    );
}

#[test]
fn error_classes() {
    let err = |code: i64| {
        Some(TwilioError {
            code: Some(serde_json::json!(code)),
            message: Some("nope".into()),
            more_info: Some(format!("https://www.twilio.com/docs/errors/{code}")),
        })
    };
    let c = |s: u16, e| classify_status(StatusCode::from_u16(s).unwrap(), e, None);
    for code in [21211, 21610, 21408, 21614] {
        match c(400, err(code)) {
            SendOutcome::Rejected {
                provider_code,
                message,
                ..
            } => {
                assert_eq!(provider_code, Some(code.to_string()));
                assert!(message.starts_with("nope ("), "{message}");
            }
            other => panic!("{code}: {other:?}"),
        }
    }
    assert!(matches!(c(429, err(20429)), SendOutcome::Retryable { .. }));
    assert!(matches!(c(400, err(20429)), SendOutcome::Retryable { .. }));
    assert!(matches!(c(401, err(20003)), SendOutcome::Refused { .. }));
    assert!(matches!(c(403, err(20005)), SendOutcome::Refused { .. }));
    assert!(matches!(c(400, err(21211)), SendOutcome::Rejected { .. }));
    assert!(matches!(c(404, None), SendOutcome::Rejected { .. }));
    assert!(matches!(c(500, err(20500)), SendOutcome::Ambiguous { .. }));
    assert!(matches!(c(503, None), SendOutcome::Ambiguous { .. }));
}

#[test]
fn validity_rounds_up_within_twilios_range() {
    assert_eq!(validity_period(Duration::from_millis(300)), 1);
    assert_eq!(validity_period(Duration::from_millis(1_500)), 2);
    assert_eq!(validity_period(Duration::from_secs(300)), 300);
    assert_eq!(validity_period(Duration::from_secs(99_999)), 36_000);
    assert_eq!(validity_period(Duration::ZERO), 1);
}

/// A listed message like the one `sms("Your code is 1234")` creates when
/// sent as `+14155550000`, a second after 10:00:00.
fn listed() -> TwilioMessage {
    TwilioMessage {
        sid: Some("SM1".into()),
        to: Some("+14155550100".into()),
        from: Some("+14155550000".into()),
        messaging_service_sid: None,
        body: Some("Your code is 1234".into()),
        direction: Some("outbound-api".into()),
        date_created: Some("Mon, 02 Mar 2026 10:00:01 +0000".into()),
    }
}

#[test]
fn matching_a_listed_message() {
    use super::lookup::Match::*;
    let since = time::macros::datetime!(2026-03-02 10:00:00 UTC);
    let nb = since - CLOCK_SLACK;
    let by_number = Sender {
        from: Some("+14155550000".into()),
        messaging_service_sid: None,
    };
    const SERVICE: &str = "MG0123456789abcdef0123456789abcdef";
    let by_service = Sender {
        from: None,
        messaging_service_sid: Some(SERVICE.into()),
    };
    let both = Sender {
        from: Some("+14155550000".into()),
        messaging_service_sid: Some(SERVICE.into()),
    };
    let ours = sms("Your code is 1234");
    type Edit = fn(&mut TwilioMessage);
    let table: &[(&str, &Sender, Edit, Match)] = &[
        ("ours", &by_number, |_| {}, Same),
        (
            "trial prefix",
            &by_number,
            |m| m.body = Some(format!("{TRIAL_PREFIX}Your code is 1234")),
            Same,
        ),
        (
            "another prefix",
            &by_number,
            |m| m.body = Some("Hi! Your code is 1234".into()),
            Other,
        ),
        (
            "ends with ours only",
            &by_number,
            |m| m.body = Some("Your code is 91234".into()),
            Other,
        ),
        (
            "another body",
            &by_number,
            |m| m.body = Some("Your code is 9999".into()),
            Other,
        ),
        (
            "body with more after ours",
            &by_number,
            |m| m.body = Some("Your code is 1234.".into()),
            Other,
        ),
        (
            "redacted body",
            &by_number,
            |m| m.body = Some(String::new()),
            Maybe,
        ),
        ("no body", &by_number, |m| m.body = None, Maybe),
        (
            "another number",
            &by_number,
            |m| m.to = Some("+14155550199".into()),
            Other,
        ),
        (
            "inbound",
            &by_number,
            |m| m.direction = Some("inbound".into()),
            Other,
        ),
        (
            "outbound-reply",
            &by_number,
            |m| m.direction = Some("outbound-reply".into()),
            Other,
        ),
        ("no direction", &by_number, |m| m.direction = None, Maybe),
        (
            "another sender",
            &by_number,
            |m| m.from = Some("+14155559999".into()),
            Other,
        ),
        (
            "alphanumeric sender",
            &by_number,
            |m| m.from = Some("ACME".into()),
            Other,
        ),
        ("no sender shown", &by_number, |m| m.from = None, Maybe),
        (
            "no sender shown, through a service we did not use",
            &by_number,
            |m| {
                m.from = None;
                m.messaging_service_sid = Some(SERVICE.into())
            },
            Other,
        ),
        (
            "created at the start",
            &by_number,
            |m| m.date_created = Some("Mon, 02 Mar 2026 10:00:00 +0000".into()),
            Same,
        ),
        (
            "created in the slack",
            &by_number,
            |m| m.date_created = Some("Mon, 02 Mar 2026 09:59:55 +0000".into()),
            Same,
        ),
        (
            "created before the slack",
            &by_number,
            |m| m.date_created = Some("Mon, 02 Mar 2026 09:59:54 +0000".into()),
            Other,
        ),
        (
            "an hour before",
            &by_number,
            |m| m.date_created = Some("Mon, 02 Mar 2026 09:00:00 +0000".into()),
            Other,
        ),
        (
            "garbled date",
            &by_number,
            |m| m.date_created = Some("garbled".into()),
            Maybe,
        ),
        ("no date", &by_number, |m| m.date_created = None, Maybe),
        (
            "garbled date, other body",
            &by_number,
            |m| {
                m.date_created = None;
                m.body = Some("x".into())
            },
            Other,
        ),
        (
            "service, sender not chosen yet",
            &by_service,
            |m| {
                m.from = None;
                m.messaging_service_sid = Some(SERVICE.into())
            },
            Same,
        ),
        (
            "service, sender chosen",
            &by_service,
            |m| m.messaging_service_sid = Some(SERVICE.into()),
            Same,
        ),
        (
            "another service",
            &by_service,
            |m| m.messaging_service_sid = Some("MGffffffffffffffffffffffffffffffff".into()),
            Other,
        ),
        ("no service shown", &by_service, |_| {}, Maybe),
        (
            "number and service",
            &both,
            |m| m.messaging_service_sid = Some(SERVICE.into()),
            Same,
        ),
        (
            "number and service, no sender yet",
            &both,
            |m| {
                m.from = None;
                m.messaging_service_sid = Some(SERVICE.into())
            },
            Same,
        ),
        (
            "number and service, another sender",
            &both,
            |m| {
                m.from = Some("+14155559999".into());
                m.messaging_service_sid = Some(SERVICE.into())
            },
            Other,
        ),
    ];
    for (name, sender, edit, want) in table {
        let mut m = listed();
        edit(&mut m);
        assert_eq!(compare(&m, &ours, sender, nb), *want, "{name}");
    }
    // The request's own `from` is the sender when it has one.
    let mut m = listed();
    m.from = Some("ACME".into());
    let acme = Sender {
        from: Some("ACME".into()),
        messaging_service_sid: None,
    };
    assert_eq!(compare(&m, &ours, &acme, nb), Same);
}

#[test]
fn the_verdict_takes_exactly_one_candidate() {
    let tally = |same: &[&str], maybe: usize| Tally {
        same: same.iter().map(|s| s.to_string()).collect(),
        maybe,
    };
    // None listed is no answer yet: Twilio documents no bound on how soon
    // a message it created is listed.
    assert!(matches!(tally(&[], 0).verdict(), Reconciled::Pending(_)));
    assert_eq!(
        tally(&["SM1"], 0).verdict(),
        Reconciled::Sent {
            provider_message_id: "SM1".into()
        }
    );
    for (same, maybe) in [(&["SM1", "SM2"][..], 0), (&["SM1"][..], 1), (&[][..], 1)] {
        match tally(same, maybe).verdict() {
            Reconciled::Unknown(reason) => {
                for sid in same {
                    assert!(reason.contains(sid), "{reason}");
                }
            }
            other => panic!("{same:?} {maybe}: {other:?}"),
        }
    }
    // A sid-less message that is ours by every field is no answer.
    let mut t = Tally::default();
    t.add(
        &TwilioMessage {
            sid: None,
            ..listed()
        },
        Match::Same,
    );
    assert!(matches!(t.verdict(), Reconciled::Unknown(_)));
}

#[test]
fn next_pages_are_followed_only_to_the_configured_list() {
    let provider = |base: &str| {
        TwilioProvider::new(TwilioSettings {
            base_url: base.into(),
            account_sid: "AC0123456789abcdef0123456789abcdef".into(),
            auth_token: "token".into(),
            from: None,
            messaging_service_sid: None,
            status_callback: None,
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        })
        .unwrap()
    };
    let list = "/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Messages.json";
    let twilio = provider("https://api.twilio.com");
    let next = format!("{list}?To=%2B14155550100&PageSize=100&Page=1&PageToken=PAx");
    assert_eq!(
        twilio.next_page_url(&next).unwrap().as_str(),
        format!("https://api.twilio.com{next}")
    );
    // A base URL with a path (a proxy) keeps it.
    let proxied = provider("https://proxy.example/twilio/");
    assert_eq!(
        proxied.next_page_url(&next).unwrap().as_str(),
        format!("https://proxy.example/twilio{next}")
    );
    for refused in [
        format!("https://evil.example{list}"),
        format!("http://api.twilio.com{list}"),
        format!("https://api.twilio.com:8443{list}"),
        format!("//evil.example{list}"),
        format!("/\\evil.example{list}"),
        format!("@evil.example{list}"),
        format!("{list}/../../../../Accounts/ACother/Messages.json"),
        "/2010-04-01/Accounts/ACother/Messages.json".to_string(),
        "/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Calls.json".to_string(),
        "Messages.json?Page=1".to_string(),
        String::new(),
    ] {
        assert!(twilio.next_page_url(&refused).is_err(), "{refused}");
    }
}

/// The lookup window starts at the earlier of the attempt's start on our
/// clock and Twilio's own now less the attempt's age and one call, less the
/// slack: a host clock ahead of Twilio's (issue 24, finding 10) or behind
/// it hides nothing.
#[test]
fn the_window_starts_on_the_earlier_clock() {
    use crate::provider::AttemptRef;
    let ours = time::macros::datetime!(2026-12-01 12:00:10 UTC);
    let call = std::time::Duration::from_secs(1);
    // The call returned 2 s ago (its request written at most a call
    // before that).
    let attempt = AttemptRef {
        started_at: ours,
        age: std::time::Duration::from_secs(2),
        sender: None,
    };
    // Twilio 10 s behind us: its now is 12:00:03, the request was written
    // at most 3 s ago, so at 12:00:00 on Twilio's clock at the earliest.
    let behind = time::macros::datetime!(2026-12-01 12:00:03 UTC);
    assert_eq!(
        window_start(&attempt, Some(behind), call),
        time::macros::datetime!(2026-12-01 12:00:00 UTC) - CLOCK_SLACK
    );
    // Twilio ahead of us: our own start is the earlier.
    let ahead = time::macros::datetime!(2026-12-01 12:00:30 UTC);
    assert_eq!(window_start(&attempt, Some(ahead), call), ours - CLOCK_SLACK);
    // No Date header: our clock alone, as before.
    assert_eq!(window_start(&attempt, None, call), ours - CLOCK_SLACK);
}

/// An attempt's recorded sender, not this instance's configuration, is what
/// a reconciliation matches (issue 24, finding 9).
#[test]
fn the_recorded_sender_is_the_one_matched() {
    use crate::provider::{AttemptRef, Provider};
    let p = TwilioProvider::new(TwilioSettings {
        base_url: "https://api.twilio.com".into(),
        account_sid: "AC0123456789abcdef0123456789abcdef".into(),
        auth_token: "token".into(),
        from: Some("+14155550001".into()),
        messaging_service_sid: None,
        status_callback: None,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    })
    .unwrap();
    let recorded = Provider::sender(&p, None).expect("a sender");
    let sender: Sender = serde_json::from_str(&recorded).expect("JSON");
    assert_eq!(sender.from.as_deref(), p.settings.from.as_deref());
    let other = AttemptRef {
        started_at: time::OffsetDateTime::UNIX_EPOCH,
        age: std::time::Duration::ZERO,
        sender: Some(r#"{"from":"+14155550002","messaging_service_sid":null}"#.into()),
    };
    assert_eq!(
        p.sender_of(&sms("hi"), &other).from.as_deref(),
        Some("+14155550002")
    );
}
