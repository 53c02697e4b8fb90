//! The drivers themselves (issue 25): each store statement and transaction
//! the two backends now share, called directly on the store (no HTTP), on
//! Postgres and on SQLite, the way River tests its drivers. One case, two
//! tests: `driver::postgres::name` and `driver::sqlite::name`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sendonce::domain::{AttemptOutcome, Encoding, IdempotencyKey, MessageId, Phone, Status};
use sendonce::store::{
    AttemptResult, Circuit, CircuitState, Claim, DeliveryAttempt, DeliveryNext, Finish, Lease,
    MessageEvent, MoveOn, NewApiKey, NewMessage, NewReceipt, NewSession, NewWebhookEndpoint, Store,
    StoredResponse,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::helpers::*;

mod messages;
mod verifications;

const T0: OffsetDateTime = time::macros::datetime!(2026-11-29 12:00:00.123456 UTC);
const LIVE: Duration = Duration::from_secs(30);

struct Fixture {
    store: Arc<dyn Store>,
    db: Db,
    tenant: Uuid,
    key: NewApiKey,
}

async fn fixture(backend: Backend) -> Fixture {
    let url = fresh_database_on(backend).await;
    let (store, db) = open_store(&url, Duration::from_secs(5));
    let key = sendonce::apikey::generate();
    let tenant = store.create_tenant("t", &key.stored).await.unwrap();
    Fixture {
        store,
        db,
        tenant,
        key: key.stored,
    }
}

fn message(tenant_id: Uuid, key: &str) -> NewMessage {
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: vec![1; 32],
        to: Phone::from_e164("+14155550100").unwrap().into(),
        from: None,
        body: "hi".into(),
        segments: 1,
        encoding: Encoding::Gsm7,
        metadata: BTreeMap::new(),
        validity_seconds: None,
        provider: "a".into(),
        route: None,
        route_order: None,
        sender: None,
        created_at: T0,
        expires_at: None,
        deadline_at: T0 + time::Duration::hours(1),
        cost: None,
    }
}

/// A message in flight on provider `a`, its first attempt open.
async fn in_flight(f: &Fixture, key: &str) -> (MessageId, Lease) {
    let lease = Lease::new("i1", LIVE);
    let m = message(f.tenant, key);
    let claim = f.store.insert_message(&m, &lease).await.unwrap();
    assert!(matches!(claim, Claim::Created(_)));
    (m.id, lease)
}

/// The premise of the shared SQL: both drivers bind `$N` by its number,
/// out of order and repeated.
async fn numbered_parameters_bind_by_number(backend: Backend) {
    let f = fixture(backend).await;
    let sql = "SELECT CAST($2 AS TEXT) || CAST($1 AS TEXT) || CAST($2 AS TEXT)";
    let got: String = match &f.db {
        Db::Pg(p) => {
            sqlx::query_scalar(sql)
                .bind("x")
                .bind("y")
                .fetch_one(p)
                .await
        }
        Db::Sqlite(p) => {
            sqlx::query_scalar(sql)
                .bind("x")
                .bind("y")
                .fetch_one(p)
                .await
        }
    }
    .unwrap();
    assert_eq!(got, "yxy");
}

async fn circuits_are_compare_and_set_on_the_version(backend: Backend) {
    let f = fixture(backend).await;
    assert!(f.store.circuits().await.unwrap().is_empty());
    let mut c = Circuit::closed("a", T0);
    c.version = 1;
    c.state = CircuitState::Open;
    c.failures = 3;
    c.window_started_at = Some(T0 - time::Duration::seconds(5));
    c.opened_at = Some(T0);
    assert!(f.store.put_circuit(&c).await.unwrap(), "the first write");
    assert!(
        !f.store.put_circuit(&c).await.unwrap(),
        "a second writer of version 1 loses"
    );
    let stored = f.store.circuits().await.unwrap();
    assert_eq!(stored, vec![c.clone()]);
    c.version = 2;
    c.state = CircuitState::HalfOpen;
    c.probe_started_at = Some(T0 + time::Duration::seconds(1));
    assert!(f.store.put_circuit(&c).await.unwrap());
    let mut b = Circuit::closed("b", T0);
    b.version = 1;
    assert!(f.store.put_circuit(&b).await.unwrap());
    let stored = f.store.circuits().await.unwrap();
    assert_eq!(stored, vec![c, b], "in provider order, as last written");
}

async fn message_events_are_kept_in_time_order(backend: Backend) {
    let f = fixture(backend).await;
    let (id, _) = in_flight(&f, "K").await;
    let event = |at, kind: &str| MessageEvent {
        at,
        kind: kind.into(),
        provider: "a".into(),
        to_provider: None,
        detail: format!("{kind} detail"),
    };
    let later = event(T0 + time::Duration::seconds(2), "circuit_closed");
    let earlier = event(T0, "circuit_opened");
    f.store.add_message_event(id, &later).await.unwrap();
    f.store.add_message_event(id, &earlier).await.unwrap();
    let events = f.store.message_events(id).await.unwrap();
    assert_eq!(events, vec![earlier, later]);
    assert!(
        f.store
            .message_events(MessageId::new())
            .await
            .unwrap()
            .is_empty()
    );
}

fn move_on(id: MessageId, lease: &Lease, closing: Option<AttemptResult>) -> MoveOn {
    MoveOn {
        id,
        lease: lease.clone(),
        from: "a".into(),
        to: "b".into(),
        closing,
        reason: "a is down".into(),
        now: T0 + time::Duration::seconds(1),
        sender: Some("Acme".into()),
        cost_micros: None,
    }
}

async fn move_on_moves_the_open_attempt_when_nothing_was_sent(backend: Backend) {
    let f = fixture(backend).await;
    let (id, lease) = in_flight(&f, "K").await;
    let number = f.store.move_on(&move_on(id, &lease, None)).await.unwrap();
    assert_eq!(number, Some(1), "the same attempt, now on b");
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.provider, "b");
    assert_eq!(m.attempts, 1);
    let attempts = f.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].provider, "b");
    assert_eq!(attempts[0].finished_at, None);
    let events = f.store.message_events(id).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "failover");
    assert_eq!(events[0].to_provider.as_deref(), Some("b"));
    assert_eq!(events[0].detail, "a is down");
}

async fn move_on_closes_the_answered_attempt_and_opens_the_next(backend: Backend) {
    let f = fixture(backend).await;
    let (id, lease) = in_flight(&f, "K").await;
    let closing = AttemptResult {
        number: 1,
        outcome: AttemptOutcome::Refused,
        http_status: Some(401),
        provider_code: Some("auth".into()),
        error: Some("refused".into()),
        provider_message_id: None,
        finished_at: T0 + time::Duration::seconds(1),
    };
    let number = f
        .store
        .move_on(&move_on(id, &lease, Some(closing)))
        .await
        .unwrap();
    assert_eq!(number, Some(2));
    let attempts = f.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].provider, "a");
    assert_eq!(attempts[0].outcome.as_deref(), Some("refused"));
    assert_eq!(attempts[0].http_status, Some(401));
    assert_eq!(attempts[1].provider, "b");
    assert_eq!(attempts[1].finished_at, None);
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!((m.provider.as_str(), m.attempts), ("b", 2));
    assert_eq!(m.last_attempt_sender.as_deref(), Some("Acme"));
    let held = m.lease.expect("still leased");
    assert_eq!(held.token, lease.token);
}

async fn move_on_is_fenced_on_the_lease(backend: Backend) {
    let f = fixture(backend).await;
    let (id, _) = in_flight(&f, "K").await;
    let stranger = Lease::new("i2", LIVE);
    assert_eq!(
        f.store
            .move_on(&move_on(id, &stranger, None))
            .await
            .unwrap(),
        None
    );
    let m = f.store.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.provider, "a", "nothing moved");
    assert!(f.store.message_events(id).await.unwrap().is_empty());
}

async fn opt_outs_add_once_list_in_pages_and_remove(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    for n in ["+3", "+1", "+2"] {
        assert!(s.add_opt_out(f.tenant, n, "api", T0).await.unwrap());
    }
    assert!(!s.add_opt_out(f.tenant, "+1", "inbound", T0).await.unwrap());
    let page = s.list_opt_outs(f.tenant, None, 2).await.unwrap();
    let numbers: Vec<_> = page.iter().map(|o| o.number.as_str()).collect();
    assert_eq!(numbers, ["+1", "+2"]);
    assert_eq!(page[0].source, "api", "the first add stands");
    assert_eq!(page[0].created_at, T0);
    let rest = s.list_opt_outs(f.tenant, Some("+2"), 2).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].number, "+3");
    assert!(
        s.list_opt_outs(Uuid::new_v4(), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.remove_opt_out(f.tenant, "+2").await.unwrap());
    assert!(!s.remove_opt_out(f.tenant, "+2").await.unwrap());
    assert_eq!(s.list_opt_outs(f.tenant, None, 10).await.unwrap().len(), 2);
}

fn session(f: &Fixture, id: u8, at: OffsetDateTime) -> NewSession {
    NewSession {
        id_hash: vec![id; 32],
        tenant_id: f.tenant,
        key_hash: f.key.hash.clone(),
        key_prefix: f.key.prefix.clone(),
        csrf_token: format!("csrf-{id}"),
        at,
    }
}

async fn console_sessions_live_until_idle_or_revoked(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    s.create_session(&session(&f, 1, T0), T0).await.unwrap();
    let got = s.session(&[1; 32]).await.unwrap().expect("the session");
    assert_eq!(got.tenant_id, f.tenant);
    assert_eq!(got.csrf_token, "csrf-1");
    assert_eq!(got.last_seen_at, T0);
    let later = T0 + time::Duration::minutes(5);
    s.touch_session(&[1; 32], later).await.unwrap();
    assert_eq!(
        s.session(&[1; 32]).await.unwrap().unwrap().last_seen_at,
        later
    );
    // A new session sweeps those idle since before the cutoff.
    s.create_session(&session(&f, 2, later), later + time::Duration::seconds(1))
        .await
        .unwrap();
    assert!(
        s.session(&[1; 32]).await.unwrap().is_none(),
        "swept as idle"
    );
    assert!(s.session(&[2; 32]).await.unwrap().is_some());
    s.delete_session(&[2; 32]).await.unwrap();
    assert!(s.session(&[2; 32]).await.unwrap().is_none());
    s.create_session(&session(&f, 3, later), T0).await.unwrap();
    assert!(s.revoke_key(f.key.id, later).await.unwrap());
    assert!(
        s.session(&[3; 32]).await.unwrap().is_none(),
        "a revoked key ends its sessions"
    );
}

async fn console_lists_a_numbers_messages_newest_first_in_pages(backend: Backend) {
    let f = fixture(backend).await;
    let mut ids = Vec::new();
    for (i, key) in ["A", "B", "C"].into_iter().enumerate() {
        let mut m = message(f.tenant, key);
        m.created_at = T0 + time::Duration::seconds(i as i64);
        f.store
            .insert_message(&m, &Lease::new("i1", LIVE))
            .await
            .unwrap();
        ids.push(m.id);
    }
    let page = f
        .store
        .messages_to(f.tenant, "+14155550100", None, 2)
        .await
        .unwrap();
    let keys: Vec<_> = page.iter().map(|m| m.idempotency_key.as_str()).collect();
    assert_eq!(keys, ["C", "B"]);
    assert_eq!(page[0].attempts, 1);
    assert_eq!(page[0].provider, "a");
    let last = &page[1];
    let rest = f
        .store
        .messages_to(
            f.tenant,
            "+14155550100",
            Some((last.created_at, last.id)),
            2,
        )
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id, ids[0]);
    assert!(
        f.store
            .messages_to(Uuid::new_v4(), "+14155550100", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        f.store
            .messages_by_provider_id(f.tenant, "nobody", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let own = f.store.tenant_message(f.tenant, ids[1]).await.unwrap();
    assert_eq!(
        own.map(|m| m.idempotency_key.as_str().to_string())
            .as_deref(),
        Some("B")
    );
    assert!(
        f.store
            .tenant_message(Uuid::new_v4(), ids[1])
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        f.store
            .message_webhook_deliveries(f.tenant, ids[1])
            .await
            .unwrap()
            .is_empty()
    );
}

async fn console_overview_counts_what_is_in_flight(backend: Backend) {
    let f = fixture(backend).await;
    in_flight(&f, "A").await;
    in_flight(&f, "B").await;
    let counts = f
        .store
        .overview(f.tenant, T0 - time::Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(
        counts.by_status_provider,
        vec![("processing".to_string(), "a".to_string(), 2)]
    );
    assert_eq!(counts.attempts_by_provider, vec![("a".to_string(), 2, 0)]);
    assert_eq!(counts.processing, 2);
    assert_eq!(counts.waiting_retries, 0);
    assert_eq!(counts.oldest_processing, Some(T0));
    assert_eq!(counts.waiting_webhooks, 0);
    let later = f
        .store
        .overview(f.tenant, T0 + time::Duration::hours(1))
        .await
        .unwrap();
    assert!(later.by_status_provider.is_empty(), "nothing since then");
}

async fn console_opt_outs_name_who_added_them_and_search_by_prefix(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    assert!(
        s.add_opt_out_by(f.tenant, "+1415", "so_ab", T0)
            .await
            .unwrap()
    );
    assert!(
        !s.add_opt_out_by(f.tenant, "+1415", "so_cd", T0)
            .await
            .unwrap()
    );
    assert!(s.add_opt_out(f.tenant, "+1416", "api", T0).await.unwrap());
    assert!(s.add_opt_out(f.tenant, "+2415", "api", T0).await.unwrap());
    let found = s.search_opt_outs(f.tenant, "+141", None, 10).await.unwrap();
    let numbers: Vec<_> = found.iter().map(|o| o.number.as_str()).collect();
    assert_eq!(numbers, ["+1415", "+1416"]);
    assert_eq!(found[0].source, "console");
    assert_eq!(found[0].added_by.as_deref(), Some("so_ab"));
    let after = s
        .search_opt_outs(f.tenant, "+141", Some("+1415"), 10)
        .await
        .unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].number, "+1416");
    assert!(
        s.search_opt_outs(f.tenant, "+3", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A message the provider accepted as `pmid` on provider `a`.
async fn sent(f: &Fixture, key: &str, pmid: &str) -> MessageId {
    let (id, lease) = in_flight(f, key).await;
    let at = T0 + time::Duration::seconds(1);
    let done = f
        .store
        .finish(&Finish {
            id,
            lease_token: lease.token,
            status: Status::Sent,
            provider_message_id: Some(pmid.into()),
            error: None,
            sent_at: Some(at),
            updated_at: at,
            response: StoredResponse {
                status_code: 201,
                body: b"{}".to_vec(),
            },
            attempt: None,
            opt_out: None,
        })
        .await
        .unwrap();
    assert!(done);
    id
}

fn receipt(event: &str, pmid: &str, status: Option<Status>, secs: i64) -> NewReceipt {
    NewReceipt {
        provider: "a".into(),
        event_id: event.into(),
        provider_message_id: pmid.into(),
        provider_status: format!("{status:?}").to_lowercase(),
        status,
        error_code: (status == Some(Status::Undelivered)).then(|| "30003".into()),
        received_at: T0 + time::Duration::seconds(secs),
        message_id: None,
    }
}

async fn receipts_apply_the_first_final_status_once(backend: Backend) {
    let f = fixture(backend).await;
    let id = sent(&f, "K", "pm-1").await;
    let s = &f.store;
    let out = s
        .record_receipt(&receipt("e1", "pm-1", Some(Status::Undelivered), 2))
        .await
        .unwrap();
    assert_eq!(
        (out.duplicate, out.message_id, out.applied),
        (false, Some(id), true)
    );
    let again = s
        .record_receipt(&receipt("e1", "pm-1", Some(Status::Undelivered), 2))
        .await
        .unwrap();
    assert_eq!(
        (again.duplicate, again.message_id, again.applied),
        (true, Some(id), false)
    );
    let late = s
        .record_receipt(&receipt("e2", "pm-1", Some(Status::Delivered), 3))
        .await
        .unwrap();
    assert!(!late.applied, "a final status is never replaced");
    let m = s.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.status, Status::Undelivered);
    assert_eq!(m.delivery_status_at, Some(T0 + time::Duration::seconds(2)));
    assert_eq!(m.error.map(|e| e.provider_code), Some(Some("30003".into())));
    let rows = s.receipts(id).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0].applied && !rows[1].applied);
    assert_eq!(rows[0].message_id, Some(id.to_string()));
    // Its webhook event is written in the same transaction.
    let events: i64 =
        f.db.count("SELECT count(*) FROM webhook_events WHERE type = 'message.undelivered'")
            .await;
    assert_eq!(events, 1);
}

async fn receipts_before_their_message_wait_unmatched_then_attach(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let early = s
        .record_receipt(&receipt("e1", "pm-1", Some(Status::Delivered), 2))
        .await
        .unwrap();
    assert_eq!((early.message_id, early.applied), (None, false));
    assert!(s.has_unmatched_receipts("a", "pm-1").await.unwrap());
    assert!(!s.has_unmatched_receipts("a", "pm-2").await.unwrap());
    let unmatched = s.unmatched_receipts(10).await.unwrap();
    assert_eq!(unmatched.len(), 1);
    assert_eq!(unmatched[0].event_id, "e1");
    assert_eq!(unmatched[0].message_id, None);
    let id = sent(&f, "K", "pm-1").await;
    assert!(
        s.attach_receipts("a", "pm-1", T0 + time::Duration::seconds(3))
            .await
            .unwrap()
    );
    assert!(!s.has_unmatched_receipts("a", "pm-1").await.unwrap());
    assert!(s.unmatched_receipts(10).await.unwrap().is_empty());
    let m = s.message_by_id(id).await.unwrap().unwrap();
    assert_eq!(m.status, Status::Delivered);
    assert!(
        !s.attach_receipts("a", "pm-1", T0).await.unwrap(),
        "nothing left to apply"
    );
}

async fn receipts_page_by_arrival(backend: Backend) {
    let f = fixture(backend).await;
    let id = sent(&f, "K", "pm-1").await;
    for (i, secs) in [(1, 5), (2, 5), (3, 7)] {
        f.store
            .record_receipt(&receipt(&format!("e{i}"), "pm-1", Some(Status::Sent), secs))
            .await
            .unwrap();
    }
    let first = f.store.receipts_after(id, None, 2).await.unwrap();
    let events: Vec<_> = first.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(events, ["e1", "e2"]);
    let last = &first[1];
    let rest = f
        .store
        .receipts_after(id, Some((last.received_at, last.seq)), 2)
        .await
        .unwrap();
    let events: Vec<_> = rest.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(events, ["e3"]);
    assert!(
        f.store
            .receipts_after(MessageId::new(), None, 2)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn tenants_and_their_keys(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    assert_eq!(s.tenant_count().await.unwrap(), 1);
    let other = sendonce::apikey::generate().stored;
    assert!(
        s.create_tenant("t", &other).await.is_err(),
        "the name is taken"
    );
    assert_eq!(s.tenant_count().await.unwrap(), 1, "nothing of it stays");
    let auth = s.tenant_for_key(&f.key.hash).await.unwrap().unwrap();
    assert_eq!(auth.id, f.tenant);
    assert_eq!(
        (
            auth.allowed_countries,
            auth.allowed_senders,
            auth.bootstrap_tenant
        ),
        (None, None, false)
    );
    assert!(s.add_key("nobody", &other).await.unwrap().is_none());
    assert_eq!(s.add_key("t", &other).await.unwrap(), Some(other.id));
    assert_eq!(
        s.tenant_for_key(&other.hash).await.unwrap().map(|a| a.id),
        Some(f.tenant)
    );
    let names: Vec<_> = s
        .list_tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, n, _)| n)
        .collect();
    assert_eq!(names, ["t"]);
    assert!(s.revoke_key(other.id, T0).await.unwrap());
    assert!(!s.revoke_key(Uuid::new_v4(), T0).await.unwrap());
    assert!(s.tenant_for_key(&other.hash).await.unwrap().is_none());
    let keys = s.list_keys().await.unwrap();
    assert_eq!(keys.len(), 2);
    let revoked = keys.iter().find(|k| k.id == other.id).unwrap();
    assert_eq!(revoked.revoked_at, Some(T0));
    assert_eq!(revoked.tenant_name, "t");
}

async fn a_new_bootstrap_key_revokes_the_old_one_and_never_back(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let old = sendonce::apikey::generate().stored;
    let new = sendonce::apikey::generate().stored;
    let first = s.ensure_bootstrap_key("default", &old, T0).await.unwrap();
    assert!(first.revoked.is_empty() && !first.configured_key_revoked);
    let again = s.ensure_bootstrap_key("default", &old, T0).await.unwrap();
    assert!(again.revoked.is_empty(), "idempotent");
    let auth = s.tenant_for_key(&old.hash).await.unwrap().unwrap();
    assert!(auth.bootstrap_tenant);
    let rotated = s.ensure_bootstrap_key("default", &new, T0).await.unwrap();
    assert_eq!(rotated.revoked, vec![(old.id, old.prefix.clone())]);
    assert!(s.tenant_for_key(&old.hash).await.unwrap().is_none());
    let stale = s.ensure_bootstrap_key("default", &old, T0).await.unwrap();
    assert!(stale.configured_key_revoked, "an old value stays revoked");
    assert!(stale.revoked.is_empty(), "and revokes nothing");
    assert!(s.tenant_for_key(&new.hash).await.unwrap().is_some());
    assert!(
        s.tenant_for_key(&f.key.hash).await.unwrap().is_some(),
        "keys added otherwise are never bootstrap keys"
    );
}

async fn tenant_settings_round_trip(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let countries = vec!["US".to_string(), "FR".to_string()];
    assert!(
        s.set_allowed_countries("t", Some(&countries))
            .await
            .unwrap()
    );
    assert!(!s.set_allowed_countries("nobody", None).await.unwrap());
    let quiet = sendonce::domain::quiet::QuietHours::parse("22:00-07:30").unwrap();
    assert!(s.set_quiet_hours("t", Some(quiet)).await.unwrap());
    let auth = s.tenant_for_key(&f.key.hash).await.unwrap().unwrap();
    assert_eq!(auth.allowed_countries, Some(countries));
    assert_eq!(auth.quiet_hours, Some(quiet));
    assert!(s.set_allowed_countries("t", None).await.unwrap());
    assert!(s.set_quiet_hours("t", None).await.unwrap());
    let auth = s.tenant_for_key(&f.key.hash).await.unwrap().unwrap();
    assert_eq!((auth.allowed_countries, auth.quiet_hours), (None, None));

    assert_eq!(s.allowed_senders("t").await.unwrap(), Some(None));
    assert_eq!(s.allowed_senders("nobody").await.unwrap(), None);
    assert_eq!(s.edit_senders("nobody", "Acme", true).await.unwrap(), None);
    assert_eq!(s.edit_senders("t", "Acme", true).await.unwrap(), Some(true));
    assert_eq!(
        s.edit_senders("t", "Acme", true).await.unwrap(),
        Some(false)
    );
    assert_eq!(
        s.edit_senders("t", "+1415", true).await.unwrap(),
        Some(true)
    );
    let list = s.allowed_senders("t").await.unwrap().unwrap().unwrap();
    assert_eq!(list.len(), 2);
    assert!(list.contains(&"Acme".to_string()) && list.contains(&"+1415".to_string()));
    assert_eq!(
        s.edit_senders("t", "Acme", false).await.unwrap(),
        Some(true)
    );
    assert_eq!(
        s.edit_senders("t", "+1415", false).await.unwrap(),
        Some(true)
    );
    assert_eq!(
        s.allowed_senders("t").await.unwrap(),
        Some(Some(vec![])),
        "the last removed leaves an empty list, not none"
    );
    let auth = s.tenant_for_key(&f.key.hash).await.unwrap().unwrap();
    assert_eq!(auth.allowed_senders, Some(vec![]));
}

async fn retention_purges_only_what_is_final_and_old(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    s.ping().await.unwrap();
    assert_eq!(s.oldest_processing().await.unwrap(), None);
    let done = sent(&f, "A", "pm-1").await;
    let (open, _) = in_flight(&f, "B").await;
    assert_eq!(s.oldest_processing().await.unwrap(), Some(T0));
    assert_eq!(
        s.purge(T0, 10).await.unwrap(),
        0,
        "nothing before the cutoff"
    );
    let cutoff = T0 + time::Duration::seconds(1);
    assert_eq!(s.purge(cutoff, 10).await.unwrap(), 1);
    assert!(s.message_by_id(done).await.unwrap().is_none());
    assert!(
        s.message_by_id(open).await.unwrap().is_some(),
        "in flight stays"
    );
    for (i, secs) in [(1, 0), (2, 1), (3, 5)] {
        s.record_receipt(&receipt(&format!("e{i}"), "nobody", None, secs))
            .await
            .unwrap();
    }
    assert_eq!(
        s.purge_unmatched_receipts(T0 + time::Duration::seconds(2), 1)
            .await
            .unwrap(),
        1,
        "at most the batch"
    );
    assert_eq!(
        s.purge_unmatched_receipts(T0 + time::Duration::seconds(2), 10)
            .await
            .unwrap(),
        1
    );
    let left = s.unmatched_receipts(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].event_id, "e3");
}

fn endpoint(f: &Fixture, url: &str) -> NewWebhookEndpoint {
    NewWebhookEndpoint {
        id: Uuid::new_v4(),
        tenant_id: f.tenant,
        url: url.into(),
        events: None,
        secret: "whsec_one".into(),
        created_at: T0,
    }
}

async fn webhook_endpoints_are_created_listed_rotated_and_deleted(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    assert!(!s.any_webhook_endpoints().await.unwrap());
    let mut second = endpoint(&f, "https://b.example/hook");
    second.events = Some(vec!["message.delivered".into()]);
    second.created_at = T0 + time::Duration::seconds(1);
    let a = s
        .create_webhook_endpoint(&endpoint(&f, "https://a.example/hook"), 20)
        .await
        .unwrap()
        .expect("under the cap");
    assert!(a.enabled);
    assert_eq!((a.secret.as_str(), a.created_at), ("whsec_one", T0));
    let b = s
        .create_webhook_endpoint(&second, 20)
        .await
        .unwrap()
        .expect("under the cap");
    assert_eq!(b.events, Some(vec!["message.delivered".to_string()]));
    assert!(s.any_webhook_endpoints().await.unwrap());
    let urls: Vec<_> = s
        .webhook_endpoints(f.tenant)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.url)
        .collect();
    assert_eq!(urls, ["https://a.example/hook", "https://b.example/hook"]);
    assert!(
        s.webhook_endpoint(Uuid::new_v4(), a.id)
            .await
            .unwrap()
            .is_none()
    );
    let later = T0 + time::Duration::minutes(1);
    let until = later + time::Duration::hours(24);
    let rotated = s
        .rotate_webhook_secret(f.tenant, a.id, "whsec_two", until, later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.secret, "whsec_two");
    assert_eq!(rotated.previous_secret.as_deref(), Some("whsec_one"));
    assert_eq!(rotated.previous_secret_expires_at, Some(until));
    assert_eq!(rotated.updated_at, later);
    assert!(
        s.rotate_webhook_secret(Uuid::new_v4(), a.id, "x", until, later)
            .await
            .unwrap()
            .is_none()
    );
    assert!(s.delete_webhook_endpoint(f.tenant, a.id).await.unwrap());
    assert!(!s.delete_webhook_endpoint(f.tenant, a.id).await.unwrap());
    assert_eq!(s.webhook_endpoints(f.tenant).await.unwrap().len(), 1);
}

/// Deliveries in flight (live leases) count against their endpoint's and
/// tenant's caps at every claim (issue 29, finding 5).
async fn webhook_claims_keep_to_the_in_flight_caps(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    for url in ["https://a.example/hook", "https://b.example/hook"] {
        s.create_webhook_endpoint(&endpoint(&f, url), 20)
            .await
            .unwrap()
            .expect("under the cap");
    }
    for i in 0..3 {
        sent(&f, &format!("K{i}"), &format!("pm-{i}")).await;
    }
    let far = T0 + time::Duration::days(1);
    let caps = |per_endpoint, per_tenant| sendonce::store::InFlightCaps {
        per_endpoint,
        per_tenant,
    };
    let claim = |c| s.claim_webhook_deliveries("w1", far, LIVE, 10, c);
    let first = claim(caps(1, 10)).await.unwrap();
    let mut endpoints: Vec<_> = first.iter().map(|d| d.endpoint.id).collect();
    endpoints.dedup();
    assert_eq!((first.len(), endpoints.len()), (2, 2), "one per endpoint");
    assert!(
        claim(caps(1, 10)).await.unwrap().is_empty(),
        "both in flight"
    );
    assert_eq!(
        claim(caps(5, 3)).await.unwrap().len(),
        1,
        "the tenant's third"
    );
    assert!(claim(caps(5, 3)).await.unwrap().is_empty());
    assert_eq!(claim(caps(5, 10)).await.unwrap().len(), 3, "the rest");
}

async fn webhook_attempts_are_listed_for_their_tenant_and_events_purged(backend: Backend) {
    let f = fixture(backend).await;
    let s = &f.store;
    let e = s
        .create_webhook_endpoint(&endpoint(&f, "https://a.example/hook"), 20)
        .await
        .unwrap()
        .expect("under the cap");
    sent(&f, "K", "pm-1").await;
    let far = T0 + time::Duration::days(1);
    let claimed = s
        .claim_webhook_deliveries(
            "w1",
            far,
            LIVE,
            10,
            sendonce::store::InFlightCaps {
                per_endpoint: 10,
                per_tenant: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let d = &claimed[0];
    assert_eq!(d.endpoint.id, e.id);
    let attempt = DeliveryAttempt {
        delivery_id: d.id,
        lease_token: d.lease_token,
        endpoint_id: e.id,
        event_id: d.event.id,
        event_type: d.event.event_type.clone(),
        started_at: far,
        finished_at: far + time::Duration::seconds(1),
        http_status: Some(200),
        error: None,
        response_excerpt: Some("ok".into()),
        next: DeliveryNext::Succeeded,
    };
    assert!(s.finish_webhook_attempt(&attempt).await.unwrap());
    let attempts = s.webhook_attempts(f.tenant, e.id, None, 10).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].number, 1);
    assert_eq!(attempts[0].outcome, "succeeded");
    assert_eq!(attempts[0].http_status, Some(200));
    assert_eq!(attempts[0].event_type, d.event.event_type);
    assert!(
        s.webhook_attempts(Uuid::new_v4(), e.id, None, 10)
            .await
            .unwrap()
            .is_empty(),
        "another tenant's endpoint shows nothing"
    );
    assert_eq!(s.purge_webhook_events(T0, 10).await.unwrap(), 0);
    assert_eq!(s.purge_webhook_events(far, 10).await.unwrap(), 1);
    assert_eq!(s.purge_webhook_events(far, 10).await.unwrap(), 0);
}

on_both_backends!(
    numbered_parameters_bind_by_number,
    circuits_are_compare_and_set_on_the_version,
    message_events_are_kept_in_time_order,
    move_on_moves_the_open_attempt_when_nothing_was_sent,
    move_on_closes_the_answered_attempt_and_opens_the_next,
    move_on_is_fenced_on_the_lease,
    opt_outs_add_once_list_in_pages_and_remove,
    console_sessions_live_until_idle_or_revoked,
    console_lists_a_numbers_messages_newest_first_in_pages,
    console_overview_counts_what_is_in_flight,
    console_opt_outs_name_who_added_them_and_search_by_prefix,
    receipts_apply_the_first_final_status_once,
    receipts_before_their_message_wait_unmatched_then_attach,
    receipts_page_by_arrival,
    tenants_and_their_keys,
    a_new_bootstrap_key_revokes_the_old_one_and_never_back,
    tenant_settings_round_trip,
    retention_purges_only_what_is_final_and_old,
    webhook_endpoints_are_created_listed_rotated_and_deleted,
    webhook_attempts_are_listed_for_their_tenant_and_events_purged,
    webhook_claims_keep_to_the_in_flight_caps,
);
