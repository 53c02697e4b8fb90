//! The message statements both backends share (`store/shared/messages.rs`):
//! the reads and the conditional cancel, called directly on both stores.

use sendonce::domain::Status;
use sendonce::store::{Claim, StoredResponse};

use super::{T0, fixture, in_flight, message, sent};
use crate::helpers::*;

async fn a_message_is_read_by_key_and_by_id_with_its_attempts(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let id = sent(&f, "K", "pm-1").await;
    let by_key = s.message(f.tenant, "K").await.unwrap().unwrap();
    let by_id = s.message_by_id(id).await.unwrap().unwrap();
    assert_eq!((by_key.id, by_id.id), (id, id));
    assert_eq!(by_id.status, Status::Sent);
    assert_eq!(by_id.provider_message_id.as_deref(), Some("pm-1"));
    let state = s.key_state(f.tenant, "K").await.unwrap().unwrap();
    assert_eq!((state.id, state.status), (id, Status::Sent));
    assert_eq!(state.response.map(|r| r.status_code), Some(201));
    let state = s.state_by_id(id).await.unwrap().unwrap();
    assert_eq!(state.fingerprint, vec![1; 32]);
    let attempts = s.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].number, 1);
    assert!(s.message(f.tenant, "other").await.unwrap().is_none());
    assert!(
        s.key_state(uuid::Uuid::new_v4(), "K")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.provider_message_owner("a", "pm-1").await.unwrap(),
        Some(id)
    );
    assert_eq!(s.provider_message_owner("b", "pm-1").await.unwrap(), None);
}

async fn an_in_flight_sibling_is_one_that_may_own_the_same_text(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let (first, _) = in_flight(&f, "A").await;
    let (second, _) = in_flight(&f, "B").await;
    assert_eq!(
        s.in_flight_sibling(second, "a", T0).await.unwrap(),
        Some(first),
        "the same number and body, its attempt open"
    );
    assert_eq!(s.in_flight_sibling(second, "b", T0).await.unwrap(), None);
    let done = sent(&f, "C", "pm-3").await;
    assert_ne!(
        s.in_flight_sibling(first, "a", T0).await.unwrap(),
        Some(done)
    );
}

async fn a_cancel_holds_only_while_the_row_qualifies(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let later = T0 + time::Duration::hours(1);
    let m = message(f.tenant, "S");
    let claim = s.schedule_message(&m, later, Some(later)).await.unwrap();
    assert!(matches!(claim, Claim::Created(_)));
    let response = StoredResponse {
        status_code: 200,
        body: b"canceled".to_vec(),
    };
    assert!(
        !s.cancel_message(m.id, 1, T0, &response).await.unwrap(),
        "rendered from a row with another attempt count"
    );
    assert!(s.cancel_message(m.id, 0, T0, &response).await.unwrap());
    let state = s.key_state(f.tenant, "S").await.unwrap().unwrap();
    assert_eq!(
        (state.status, state.response),
        (Status::Canceled, Some(response.clone()))
    );
    assert!(
        !s.cancel_message(m.id, 0, T0, &response).await.unwrap(),
        "once"
    );
    let (leased, _) = in_flight(&f, "L").await;
    assert!(
        !s.cancel_message(leased, 1, T0, &response).await.unwrap(),
        "never while leased"
    );
    assert_eq!(
        s.message_by_id(leased).await.unwrap().unwrap().status,
        Status::Processing
    );
}

on_both_backends!(
    a_message_is_read_by_key_and_by_id_with_its_attempts,
    an_in_flight_sibling_is_one_that_may_own_the_same_text,
    a_cancel_holds_only_while_the_row_qualifies,
);
