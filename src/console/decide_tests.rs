//! The console's decisions, as tables.

use std::collections::BTreeMap;
use std::time::Duration;

use time::OffsetDateTime;
use time::macros::datetime;

use super::decide::*;
use crate::domain::{Encoding, IdempotencyKey, MessageError, MessageId, Phone, Status};
use crate::store::{
    AttemptRow, MessageRecord, MessageWebhookAttempt, MessageWebhookDelivery, OverviewCounts,
    ReceiptRow,
};

const T0: OffsetDateTime = datetime!(2026-12-01 14:02:11 UTC);

fn at(secs: i64) -> OffsetDateTime {
    T0 + time::Duration::seconds(secs)
}

fn message(status: Status) -> MessageRecord {
    MessageRecord {
        id: MessageId::new(),
        tenant_id: uuid::Uuid::nil(),
        idempotency_key: IdempotencyKey::parse("ORDER-1").unwrap(),
        fingerprint: Vec::new(),
        status,
        to: Phone::from_e164("+14155550100").unwrap().into(),
        from: None,
        body: "hi".into(),
        segments: 1,
        encoding: Encoding::Gsm7,
        metadata: BTreeMap::new(),
        validity_seconds: None,
        provider: "http".into(),
        route: None,
        route_order: None,
        provider_message_id: None,
        attempts: 1,
        maybe_sent: false,
        error: None,
        response: None,
        lease: None,
        next_attempt_at: None,
        send_at: None,
        created_at: T0,
        updated_at: T0,
        sent_at: None,
        delivery_status_at: None,
        expires_at: None,
        deadline_at: at(3600),
        last_attempt_open: false,
        last_attempt_started_at: None,
        last_attempt_sender: None,
        recipient_opted_out: false,
        cost: None,
        prepared_token: None,
        verification_id: None,
    }
}

fn attempt(number: u32, start: i64, end: i64, outcome: &str) -> AttemptRow {
    AttemptRow {
        number,
        lease_owner: None,
        started_at: at(start),
        finished_at: Some(at(end)),
        outcome: Some(outcome.into()),
        http_status: Some(if outcome == "sent" { 200 } else { 503 }),
        provider_code: None,
        error: None,
        provider_message_id: None,
        provider: "http".into(),
    }
}

#[test]
fn search_entries_are_read_as_every_kind_they_can_be() {
    let id = MessageId::new();
    /// (is a message id, phone, usable as a key), or `None` for bad input.
    type Reading<'a> = Option<(bool, Option<&'a str>, bool)>;
    let cases: Vec<(String, Reading)> = vec![
        // (entry, Some((is a message id, phone, usable as a key)) or bad input)
        (id.to_string(), Some((true, None, true))),
        ("ORDER-92831-SMS".into(), Some((false, None, true))),
        (
            "+14155550100".into(),
            Some((false, Some("+14155550100"), true)),
        ),
        (
            "+1 415 555 0100".into(),
            Some((false, Some("+14155550100"), false)),
        ),
        ("msg_nothex".into(), Some((false, None, true))),
        ("   ".into(), None),
        ("K".repeat(256), None),
        ("ümlaut key".into(), None),
    ];
    for (q, want) in cases {
        let got = classify(&q, None).map(|c| (c.message_id.is_some(), c.phone, c.key.is_some()));
        let want = want.map(|(m, p, k)| (m, p.map(str::to_string), k));
        assert_eq!(got, want, "{q:?}");
    }
}

#[test]
fn national_numbers_are_read_in_the_home_country_only() {
    let phone = |q: &str, home: Option<&str>| classify(q, home).and_then(|c| c.phone);
    let cases: [(&str, Option<&str>, Option<&str>); 7] = [
        ("4155550100", Some("US"), Some("+14155550100")),
        ("(415) 555-0100", Some("US"), Some("+14155550100")),
        ("020 7946 0018", Some("GB"), Some("+442079460018")),
        // Without a home country only international form is a number.
        ("4155550100", None, None),
        ("+14155550100", None, Some("+14155550100")),
        // Not a valid number there, or not digits.
        ("12345", Some("US"), None),
        ("ORDER-4155550100", Some("US"), None),
    ];
    for (q, home, want) in cases {
        assert_eq!(phone(q, home).as_deref(), want, "{q:?} in {home:?}");
    }
    assert!(classify("4155550100", None).is_some_and(|c| c.national));
    assert!(classify("ORDER-1", None).is_some_and(|c| !c.national));
}

#[test]
fn cursors_round_trip_and_garbage_is_refused() {
    let id = MessageId::new();
    let c = cursor(at(5), id);
    assert_eq!(parse_cursor(&c), Some((at(5), id)));
    for bad in [
        "",
        "garbage",
        "12.",
        ".abc",
        "x.00000000000000000000000000000000",
    ] {
        assert_eq!(parse_cursor(bad), None, "{bad:?}");
    }
}

#[test]
fn opt_out_searches_take_number_prefixes_only() {
    for (q, want) in [
        ("+1415", Some("+1415")),
        ("1415", Some("+1415")),
        ("+1 (415) 555-01", Some("+141555501")),
        ("", Some("+")),
        ("abc", None),
        ("+1415%", None),
        ("+1234567890123456", None),
    ] {
        assert_eq!(number_prefix(q).as_deref(), want, "{q:?}");
    }
}

#[test]
fn codes_are_masked_only_where_the_body_speaks_of_one() {
    for (body, want) in [
        ("Your code is 481516", "Your code is ••••••"),
        (
            "123456 is your verification code",
            "•••••• is your verification code",
        ),
        (
            "OTP: 9876. Order 92831 ships today",
            "OTP: ••••. Order ••••• ships today",
        ),
        ("Your PIN 12 expires", "Your PIN 12 expires"),
        ("Order 92831 is confirmed", "Order 92831 is confirmed"),
        ("Code 12345678901 is long", "Code 12345678901 is long"),
        ("Use barcode 1234", "Use barcode 1234"),
    ] {
        assert_eq!(masked_body(body), want, "{body:?}");
    }
    let sealed = format!("{}abcdef", crate::verify::crypto::SEALED_PREFIX);
    assert!(!masked_body(&sealed).contains("abcdef"));
}

#[test]
fn plain_words_say_what_to_tell_the_customer() {
    let mut delivered = message(Status::Delivered);
    delivered.sent_at = Some(at(0));
    delivered.delivery_status_at = Some(at(3));
    let mut waiting = message(Status::Processing);
    waiting.attempts = 2;
    waiting.next_attempt_at = Some(at(120));
    let mut opted_out = message(Status::Failed);
    opted_out.error = Some(MessageError {
        code: "recipient_opted_out".into(),
        message: "the recipient opted out".into(),
        provider_code: None,
    });
    let mut unknown = message(Status::Unknown);
    unknown.attempts = 5;
    let mut scheduled = message(Status::Scheduled);
    scheduled.attempts = 0;
    scheduled.send_at = Some(at(3600));
    scheduled.next_attempt_at = Some(at(3600));
    let mut quiet = message(Status::Scheduled);
    quiet.attempts = 0;
    quiet.next_attempt_at = Some(at(7200));
    let mut canceled = message(Status::Canceled);
    canceled.attempts = 0;
    canceled.updated_at = at(60);
    for (m, want) in [
        (
            scheduled,
            "Not sent yet: it is scheduled to go out at 2026-12-01 15:02:11 UTC, as requested.",
        ),
        (
            quiet,
            "Not sent yet: it is held for the quiet hours where the customer is, and goes out at 2026-12-01 16:02:11 UTC.",
        ),
        (
            canceled,
            "Not sent: it was canceled at 2026-12-01 14:03:11 UTC, before anything reached the provider. Nothing reached the phone.",
        ),
        (
            delivered,
            "Sent to the carrier at 2026-12-01 14:02:11 UTC; the carrier reported it delivered at 2026-12-01 14:02:14 UTC.",
        ),
        (
            waiting,
            "Not sent yet: the provider was tried once without success; sendonce tries again at 2026-12-01 14:04:11 UTC.",
        ),
        (
            opted_out,
            "Not sent: the number is on the opt-out list (it asked not to be messaged).",
        ),
        (
            unknown,
            "Unclear: the provider gave no clear answer after 5 attempts, so the message may or may not have reached the phone. Do not promise either way.",
        ),
    ] {
        assert_eq!(plain_words(&m, None), want);
    }
}

#[test]
fn the_timeline_puts_everything_on_one_axis() {
    let mut m = message(Status::Delivered);
    m.attempts = 2;
    m.sent_at = Some(at(3));
    m.delivery_status_at = Some(at(5));
    let attempts = vec![attempt(1, 0, 1, "retryable"), attempt(2, 2, 3, "sent")];
    let receipts = vec![ReceiptRow {
        seq: 1,
        provider: "http".into(),
        event_id: "e1".into(),
        provider_message_id: "p1".into(),
        message_id: None,
        provider_status: "delivered".into(),
        status: Some(Status::Delivered),
        error_code: None,
        applied: true,
        received_at: at(5),
    }];
    let entries = timeline(&m, &attempts, &[], &receipts, &[], None);
    let kinds: Vec<Kind> = entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::Accepted,
            Kind::Attempt,
            Kind::Retry,
            Kind::Attempt,
            Kind::Final,
            Kind::Receipt
        ]
    );
    assert_eq!(
        entries[2].title,
        "Retried: attempt 2 started at 2026-12-01 14:02:13 UTC"
    );
    assert!(entries[1].facts.contains(&("duration", "1.0 s".into())));
    // A retry still waiting shows its due time.
    let mut waiting = message(Status::Processing);
    waiting.next_attempt_at = Some(at(60));
    let entries = timeline(
        &waiting,
        &[attempt(1, 0, 1, "ambiguous")],
        &[],
        &[],
        &[],
        None,
    );
    assert_eq!(
        entries.last().map(|e| e.title.as_str()),
        Some("Retry scheduled: attempt 2 due at 2026-12-01 14:03:11 UTC")
    );
}

fn hook(status: &str, attempts: &[(i64, Option<u16>, &str)]) -> MessageWebhookDelivery {
    MessageWebhookDelivery {
        event_type: "message.sent".into(),
        event_at: at(3),
        url: "https://hooks.example.com/sms".into(),
        status: status.into(),
        next_attempt_at: (status == "pending").then(|| at(300)),
        updated_at: at(3 + attempts.last().map_or(0, |a| a.0 + 1)),
        endpoint_enabled: !matches!(status, "canceled")
            && attempts.last().is_none_or(|a| a.2 != "gone"),
        endpoint_disabled_reason: (status == "canceled"
            || attempts.last().is_some_and(|a| a.2 == "gone"))
        .then(|| "the endpoint answered 410 Gone".into()),
        attempts: attempts
            .iter()
            .enumerate()
            .map(|(i, (start, http_status, outcome))| MessageWebhookAttempt {
                number: u32::try_from(i + 1).unwrap(),
                outcome: (*outcome).into(),
                http_status: *http_status,
                error: http_status.is_none().then(|| "timed out after 10 s".into()),
                started_at: at(3 + start),
                finished_at: at(3 + start) + time::Duration::milliseconds(250),
            })
            .collect(),
    }
}

#[test]
fn webhook_deliveries_join_the_timeline_once_each_worded_as_webhooks() {
    const URL: &str = "https://hooks.example.com/sms";
    // (delivery, its entries' titles, where it stands on the last one)
    let cases: [(MessageWebhookDelivery, &[&str], Option<&str>); 6] = [
        (
            hook("pending", &[]),
            &[
                "Webhook to https://hooks.example.com/sms: first attempt due at 2026-12-01 14:07:11 UTC",
            ],
            None,
        ),
        (
            hook("pending", &[(0, Some(500), "failed")]),
            &["Webhook failed: HTTP 500"],
            Some("attempt 2 due at 2026-12-01 14:07:11 UTC"),
        ),
        (
            hook("succeeded", &[(0, Some(204), "succeeded")]),
            &["Webhook delivered to https://hooks.example.com/sms"],
            None,
        ),
        (
            hook("failed", &[(0, None, "failed"), (5, Some(503), "failed")]),
            &["Webhook failed: no answer", "Webhook failed: HTTP 503"],
            Some("given up after 2 attempts"),
        ),
        (
            hook("failed", &[(0, Some(410), "gone")]),
            &["Webhook failed: HTTP 410"],
            Some("endpoint disabled"),
        ),
        (
            hook("canceled", &[]),
            &["Webhook to https://hooks.example.com/sms: endpoint disabled"],
            None,
        ),
    ];
    for (d, titles, then) in cases {
        let mut m = message(Status::Sent);
        m.sent_at = Some(at(3));
        let entries = timeline(
            &m,
            &[attempt(1, 0, 3, "sent")],
            &[],
            &[],
            std::slice::from_ref(&d),
            None,
        );
        let hooks: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::Webhook).collect();
        let got: Vec<&str> = hooks.iter().map(|e| e.title.as_str()).collect();
        // One entry per attempt (none for attempt and result both), in order.
        assert_eq!(got, titles, "{titles:?}");
        for e in &hooks {
            assert!(!e.title.contains("attempt 1"), "{}", e.title);
            assert!(e.facts.contains(&("endpoint", URL.into())));
        }
        let last = hooks.last().unwrap();
        assert_eq!(entries.last().map(|e| &e.title), Some(&last.title));
        let stands = last
            .facts
            .iter()
            .find(|(n, _)| *n == "then")
            .map(|(_, v)| v.as_str());
        assert_eq!(stands, then, "{titles:?}");
        for (e, a) in hooks.iter().zip(&d.attempts) {
            assert_eq!(e.at, a.started_at);
            assert!(e.facts.contains(&("duration", "250 ms".into())));
            match a.http_status {
                Some(s) => assert!(e.facts.contains(&("HTTP status", s.to_string()))),
                None => assert!(e.facts.contains(&("error", "timed out after 10 s".into()))),
            }
        }
        // The final status comes before any webhook about it.
        let fin = entries.iter().position(|e| e.kind == Kind::Final).unwrap();
        let first_hook = entries
            .iter()
            .position(|e| e.kind == Kind::Webhook)
            .unwrap();
        assert!(fin < first_hook, "{titles:?}");
        let disabled = last.facts.iter().any(|(n, _)| *n == "endpoint disabled");
        let gone = d.status == "canceled" || d.attempts.last().is_some_and(|a| a.outcome == "gone");
        assert_eq!(disabled, gone, "{titles:?}");
    }
}

#[test]
fn an_opted_out_message_names_no_provider_call() {
    let m = message(Status::Failed);
    let entries = timeline(&m, &[attempt(1, 0, 0, "opted_out")], &[], &[], &[], None);
    let a = entries.iter().find(|e| e.kind == Kind::Attempt).unwrap();
    assert!(!a.title.contains("Attempt 1 to"), "{}", a.title);
    assert!(a.title.contains("opted out"), "{}", a.title);
    assert!(a.facts.iter().all(|(n, _)| *n != "provider"));
}

#[test]
fn the_overview_warns_above_the_threshold_only() {
    let counts = |rows: &[(&str, i64)]| OverviewCounts {
        by_status_provider: rows
            .iter()
            .map(|(s, n)| ((*s).to_string(), "http".to_string(), *n))
            .collect(),
        ..OverviewCounts::default()
    };
    for (rows, warns) in [
        (vec![("delivered", 95), ("failed", 5)], false),
        (vec![("delivered", 94), ("failed", 6)], true),
        (vec![("sent", 90), ("unknown", 4), ("undelivered", 4)], true),
        (vec![("failed", 9)], false),
        (vec![("processing", 500), ("failed", 1), ("sent", 9)], true),
        (vec![], false),
    ] {
        assert_eq!(warning(&counts(&rows)).is_some(), warns, "{rows:?}");
    }
}

#[test]
fn sign_ins_wait_once_too_many_failed_within_the_window() {
    let ten: Vec<_> = (0..10).map(at).collect();
    assert_eq!(signin_allowed(&ten[..9], at(10)), Ok(()));
    assert_eq!(signin_allowed(&ten, at(10)), Err(Duration::from_secs(50)));
    assert_eq!(
        signin_allowed(&ten, at(60)),
        Ok(()),
        "the oldest left the window"
    );
    assert_eq!(signin_allowed(&ten, at(59)), Err(Duration::from_secs(1)));
}

#[test]
fn sign_ins_count_against_the_address_or_its_ipv6_64() {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    for (from, counted_as) in [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::"),
        ("2001:db8:1:3::1", "2001:db8:1:3::"),
        ("::1", "::"),
    ] {
        assert_eq!(signin_peer(ip(from)), ip(counted_as), "{from}");
    }
}

#[test]
fn durations_read_naturally() {
    for (d, want) in [
        (Duration::from_millis(850), "850 ms"),
        (Duration::from_millis(12_300), "12.3 s"),
        (Duration::from_secs(250), "4 min 10 s"),
        (Duration::from_secs(3 * 3600 + 300), "3 h 5 min"),
    ] {
        assert_eq!(human(d), want);
    }
}
