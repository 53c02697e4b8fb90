//! The delivery path: races, disconnects, retries and their classes.

use std::sync::Arc;
use std::time::Duration;

use sendonce::clock::Clock;
use serde_json::json;
use testkit::mock_provider::{Behaviour, Dedup};
use tokio::sync::Notify;

use crate::helpers::*;

fn fail(status: u16) -> Behaviour {
    Behaviour::Fail {
        status,
        body: json!({"message": "provider says no", "code": "E42"}),
        retry_after: None,
    }
}

async fn a_hundred_concurrent_identical_posts_send_once(backend: Backend) {
    let app = spawn_app_on(backend).await;
    // Hold the provider call so that every request arrives while it runs.
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let body = sms("+14155550100", "Your code is 424242");
    let requests = (0..100).map(|_| app.post("OTP-RACE", &body));
    let release = async {
        eventually("the first call to reach the provider", || async {
            (app.mock.call_count() == 1).then_some(())
        })
        .await;
        gate.notify_one();
    };
    let (answers, ()) = tokio::join!(futures_join_all(requests), release);

    assert_eq!(app.mock.call_count(), 1, "exactly one provider call");
    let finals: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    assert!(!finals.is_empty());
    for a in &answers {
        assert!(a.status == 201 || a.status == 409, "status {}", a.status);
    }
    for a in &finals {
        assert_eq!(
            a.bytes, finals[0].bytes,
            "every final answer is the same message"
        );
    }
    assert_eq!(
        finals
            .iter()
            .filter(|a| a.header("idempotent-replayed").is_none())
            .count(),
        1
    );
    let later = app.post("OTP-RACE", &body).await;
    assert_eq!(later.status, 201);
    assert_eq!(later.bytes, finals[0].bytes);
    assert_eq!(later.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.message_count().await, 1);
}

/// `join_all` without another dependency: spawn nothing, poll all together.
pub async fn futures_join_all<F: std::future::Future>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}

async fn a_client_that_disconnects_does_not_cancel_the_send(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let gate = Arc::new(Notify::new());
    app.mock.push([Behaviour::Gate(gate.clone())]);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let sent = impatient
        .post(format!("{}/messages", app.base))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "GONE")
        .json(&sms("+14155550100", "hi"))
        .send()
        .await;
    assert!(
        sent.is_err(),
        "the client gave up before the provider answered"
    );
    eventually("the provider to hold the call", || async {
        (app.mock.call_count() == 1).then_some(())
    })
    .await;
    gate.notify_one();
    let m = app.wait_for_status("GONE", "sent").await;
    assert_eq!(m["attempts"], 1);
    assert_eq!(app.mock.call_count(), 1);
    // The client's retry replays the result.
    let retry = app.post("GONE", &sms("+14155550100", "hi")).await;
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.json()["status"], "sent");
}

async fn two_500s_then_success_is_one_message_with_three_attempts_under_one_key(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.mock.push([fail(500), fail(500)]);
    let a = app.post("RETRY", &sms("+14155550100", "hi")).await;
    assert_eq!(a.status, 201);
    let m = a.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 3);
    let calls = app.mock.calls();
    assert_eq!(calls.len(), 3);
    let id = m["id"].as_str().unwrap();
    assert!(
        calls
            .iter()
            .all(|c| c.idempotency_key.as_deref() == Some(id))
    );
    assert_eq!(app.mock.deliveries_for(id), 1);
}

async fn a_permanent_rejection_fails_after_one_call(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.mock.push([fail(400)]);
    let a = app.post("REJECT", &sms("+14155550100", "hi")).await;
    assert_eq!(a.status, 201);
    let m = a.json();
    assert_eq!(m["status"], "failed");
    assert_eq!(m["attempts"], 1);
    assert_eq!(m["provider_message_id"], serde_json::Value::Null);
    assert_eq!(m["error"]["code"], "provider_rejected");
    assert_eq!(m["error"]["message"], "provider says no");
    assert_eq!(m["error"]["provider_code"], "E42");
    assert_eq!(app.mock.call_count(), 1);
    // Final: a replay is the same failure, and nothing is sent again.
    let again = app.post("REJECT", &sms("+14155550100", "hi")).await;
    assert_eq!(again.bytes, a.bytes);
    assert_eq!(app.mock.call_count(), 1);
}

async fn retryable_answers_are_retried_until_the_attempts_run_out(backend: Backend) {
    let app = spawn_app_on(backend).await;
    app.mock.push((0..5).map(|_| fail(429)));
    let m = app.post("BUSY", &sms("+14155550100", "hi")).await.json();
    assert_eq!(m["status"], "failed", "429 means the provider did not act");
    assert_eq!(m["attempts"], 5);
    assert_eq!(m["error"]["code"], "retries_exhausted");
    assert_eq!(app.mock.call_count(), 5);
}

async fn ambiguous_answers_exhausting_the_attempts_end_unknown(backend: Backend) {
    let app = spawn_app_on(backend).await;
    // The `http` contract: the bridge de-duplicates on Idempotency-Key
    // (and here answers every retry with the same 502).
    app.mock.set_dedup(Dedup::Replay);
    app.mock
        .push((0..5).map(|_| Behaviour::AcceptThenFail { status: 502 }));
    let m = app.post("MAYBE", &sms("+14155550100", "hi")).await.json();
    assert_eq!(
        m["status"], "unknown",
        "a 5xx may have been sent: never call it failed"
    );
    assert_eq!(m["error"]["code"], "outcome_unknown");
    let id = m["id"].as_str().unwrap();
    assert_eq!(
        app.mock.deliveries_for(id),
        1,
        "the same key never delivers twice"
    );
}

async fn a_provider_timeout_is_ambiguous_and_resent_under_the_same_key(backend: Backend) {
    let app = spawn_with(TestOptions {
        backend,
        provider_timeout: Duration::from_millis(300),
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Hang]);
    let m = app.post("SLOW", &sms("+14155550100", "hi")).await.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 2);
    let calls = app.mock.calls();
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    let attempts = app.get("/messages/SLOW/attempts").await.json();
    assert_eq!(attempts["data"][0]["outcome"], "ambiguous");
}

async fn retry_after_is_honoured_to_the_second(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings,
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Fail {
        status: 429,
        body: json!({"message": "slow down"}),
        retry_after: Some(120),
    }]);
    let a = app
        .post_with(
            Some("LATER"),
            &sms("+14155550100", "hi"),
            &[("prefer", "wait=1")],
        )
        .await;
    assert_eq!(a.status, 202, "a 120 s retry does not fit a 1 s wait");
    let m = app.get("/messages/LATER").await.json();
    assert_eq!(m["status"], "processing");
    assert_eq!(m["next_attempt_at"], "2026-11-29T12:02:00Z");
    assert_eq!(m["error"]["code"], "provider_unavailable");
    // No lease is held while the retry waits.
    let leased = app
        .db
        .count("SELECT count(*) FROM messages WHERE lease_owner IS NOT NULL")
        .await;
    assert_eq!(leased, 0);

    clock.advance(Duration::from_secs(119));
    assert_eq!(app.handle.scheduler.tick().await.unwrap(), 0, "not due yet");
    assert_eq!(app.mock.call_count(), 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(app.handle.scheduler.tick().await.unwrap(), 1, "due now");
    let m = app.wait_for_status("LATER", "sent").await;
    assert_eq!(m["attempts"], 2);
    assert_eq!(m["next_attempt_at"], serde_json::Value::Null);
    assert_eq!(app.mock.call_count(), 2);
}

async fn nothing_is_handed_to_the_provider_after_the_validity_period(backend: Backend) {
    let clock = Clock::manual(time::macros::datetime!(2026-11-29 12:00:00 UTC));
    let mut settings = test_settings();
    settings.scheduler.poll_interval = Duration::from_secs(3600);
    let app = spawn_with(TestOptions {
        backend,
        clock: clock.clone(),
        settings,
        ..TestOptions::default()
    })
    .await;
    app.mock.push([Behaviour::Fail {
        status: 503,
        body: json!({}),
        retry_after: Some(90),
    }]);
    let body = json!({"to": "+14155550100", "body": "Your code is 123456", "validity_seconds": 60});
    let m = app.post("OTP-EXPIRES", &body).await.json();
    assert_eq!(m["status"], "failed");
    assert_eq!(m["error"]["code"], "validity_expired");
    assert_eq!(app.mock.call_count(), 1);
}

async fn provider_calls_are_capped_per_instance(backend: Backend) {
    let mut settings = test_settings();
    settings.delivery.max_concurrent_sends = 2;
    let app = spawn_with(TestOptions {
        backend,
        settings,
        ..TestOptions::default()
    })
    .await;
    let gates: Vec<Arc<Notify>> = (0..5).map(|_| Arc::new(Notify::new())).collect();
    app.mock.push(gates.iter().cloned().map(Behaviour::Gate));
    for i in 0..5 {
        let a = app
            .post_with(
                Some(&format!("CAP-{i}")),
                &sms("+14155550100", "hi"),
                &[("prefer", "respond-async")],
            )
            .await;
        assert_eq!(a.status, 202);
    }
    eventually("two calls in flight", || async {
        (app.mock.call_count() == 2).then_some(())
    })
    .await;
    assert_eq!(app.handle.deliverer.free_permits(), 0);
    assert_eq!(app.handle.deliverer.in_flight(), 5, "three wait for a slot");
    assert_eq!(app.mock.call_count(), 2);
    for g in &gates {
        g.notify_one();
    }
    for i in 0..5 {
        app.wait_for_status(&format!("CAP-{i}"), "sent").await;
    }
    assert_eq!(app.mock.call_count(), 5);
}

async fn accept_then_drop_is_ambiguous_and_the_resend_does_not_send_twice(backend: Backend) {
    let app = spawn_app_on(backend).await;
    // The `http` contract: the bridge de-duplicates on Idempotency-Key.
    app.mock.set_dedup(Dedup::Ietf);
    app.mock.push([Behaviour::AcceptThenDrop]);
    let m = app.post("DROPPED", &sms("+14155550100", "hi")).await.json();
    assert_eq!(m["status"], "sent");
    assert_eq!(m["attempts"], 2);
    let id = m["id"].as_str().unwrap();
    assert_eq!(app.mock.call_count(), 2);
    assert_eq!(
        app.mock.deliveries_for(id),
        1,
        "the provider de-duplicated the resend"
    );
    let attempts = app.get("/messages/DROPPED/attempts").await.json();
    assert_eq!(attempts["data"][0]["outcome"], "ambiguous");
    assert_eq!(attempts["data"][1]["provider_message_id"], "prov_1");
}

on_both_backends!(
    a_hundred_concurrent_identical_posts_send_once,
    a_client_that_disconnects_does_not_cancel_the_send,
    two_500s_then_success_is_one_message_with_three_attempts_under_one_key,
    a_permanent_rejection_fails_after_one_call,
    retryable_answers_are_retried_until_the_attempts_run_out,
    ambiguous_answers_exhausting_the_attempts_end_unknown,
    a_provider_timeout_is_ambiguous_and_resent_under_the_same_key,
    retry_after_is_honoured_to_the_second,
    nothing_is_handed_to_the_provider_after_the_validity_period,
    provider_calls_are_capped_per_instance,
    accept_then_drop_is_ambiguous_and_the_resend_does_not_send_twice,
);
