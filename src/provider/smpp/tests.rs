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
