use super::*;

#[test]
fn statuses_are_classified() {
    assert_eq!(classify(status::RTHROTTLED).class(), "retryable");
    assert_eq!(classify(status::RMSGQFUL).class(), "retryable");
    assert_eq!(classify(status::RINVDSTADR).class(), "permanent");
    assert_eq!(classify(status::RINVSRCADR).class(), "permanent");
    assert_eq!(classify(0x45).class(), "permanent");
    for s in [status::RBINDFAIL, status::RINVPASWD, status::RINVSYSID] {
        assert_eq!(classify(s).class(), "refused", "{s:#x}");
        assert!(refuses_account(s));
    }
    assert!(!refuses_account(status::RTHROTTLED));
    assert_eq!(delivery_status("DELIVRD"), Some(Status::Delivered));
    assert_eq!(delivery_status("undeliv"), Some(Status::Undelivered));
    assert_eq!(delivery_status("ENROUTE"), Some(Status::Sent));
    assert_eq!(delivery_status("UNKNOWN"), None);
}

/// A turn under SMPP_RATE past the send's write-by instant is not taken
/// (the send is retryable with nothing written) and not reserved either:
/// the next send with room gets it.
#[tokio::test(start_paused = true)]
async fn a_rate_turn_too_far_away_is_refused_not_reserved() {
    let mut s = SmppSettings::new("127.0.0.1", 1, "a", "b");
    s.rate = 2; // a turn every 500 ms
    let p = SmppProvider::new(s);
    let now = Instant::now();
    assert_eq!(p.inner.pace(Some(now)).await, Ok(()));
    let wait = p.inner.pace(Some(now + Duration::from_millis(100))).await;
    assert_eq!(wait, Err(Duration::from_millis(500)));
    // Not reserved: the turn at +500 ms is still the next one.
    assert_eq!(p.inner.pace(Some(now + Duration::from_millis(500))).await, Ok(()));
    assert_eq!(Instant::now(), now + Duration::from_millis(500));
    // Without a limit (a later part) the turn is waited for.
    assert_eq!(p.inner.pace(None).await, Ok(()));
    assert_eq!(Instant::now(), now + Duration::from_secs(1));
}
