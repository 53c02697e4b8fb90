use super::*;

#[test]
fn renders_counters() {
    let m = Metrics::new();
    m.request("POST", "/messages", "created", Duration::from_millis(3));
    m.message_final("sent", "live");
    m.message_final("delivered", "test");
    m.purged(3);
    let text = m.render(2, Some(Duration::from_secs(7)));
    assert!(text.contains(
        r#"sendonce_http_requests_total{method="POST",route="/messages",outcome="created"} 1"#
    ));
    assert!(text.contains(r#"sendonce_messages_final_total{status="sent",mode="live"} 1"#));
    assert!(text.contains(r#"sendonce_messages_final_total{status="delivered",mode="test"} 1"#));
    assert!(text.contains("sendonce_purged_messages_total 3"));
    assert!(text.contains("sendonce_deliveries_in_flight 2"));
    assert!(text.contains("sendonce_oldest_processing_age_seconds 7"));
    assert!(text.contains("sendonce_http_request_duration_seconds_bucket"));
}

#[test]
fn labelled_handles_are_registered_once_and_reused() {
    let m = Metrics::new();
    for _ in 0..3 {
        let route = String::from("/opt-outs/{number}");
        m.request("DELETE", &route, "not_found", Duration::from_millis(1));
        m.provider_attempt("http", "ok", Duration::from_millis(1));
        m.receipt("twilio", "unmatched");
    }
    assert_eq!(
        m.requests.0.read().unwrap().len(),
        3,
        "two at start, one used"
    );
    assert_eq!(m.provider_attempts.0.read().unwrap().len(), 1);
    let text = m.render(0, None);
    assert!(text.contains(
        r#"sendonce_http_requests_total{method="DELETE",route="/opt-outs/{number}",outcome="not_found"} 3"#
    ), "{text}");
    assert!(text.contains(r#"sendonce_provider_attempts_total{provider="http",class="ok"} 3"#));
    assert!(
        text.contains(r#"sendonce_receipts_total{provider="twilio",outcome="unmatched"} 3"#),
        "{text}"
    );
}

#[test]
fn the_documented_table_is_what_is_exported() {
    let m = Metrics::new();
    m.request("GET", "/healthz", "ok", Duration::from_millis(1));
    m.provider_attempt("http", "ok", Duration::from_millis(1));
    m.retry_scheduled();
    m.message_final("sent", "live");
    m.receipt("http", "applied");
    m.takeover();
    m.purged(1);
    m.delivery_interrupted("lease_lost");
    m.failover("twilio", "http");
    m.circuit("twilio", 2.0);
    let sizes = Arc::new(BatchSizes::default());
    sizes.record(BatchKind::Claim, 3);
    m.attach_batch_sizes(Arc::clone(&sizes));
    m.verify_event("start", Some("US"));
    m.verify_event("start", Some("not a country"));
    m.set_db_connections(3, 1);
    let measured = crate::domain::quality::Measured {
        messages: 40,
        delivered: 30,
        undelivered: 10,
        ..Default::default()
    };
    m.route_quality("+966", "twilio", &measured);
    m.route_position("+966", "twilio", 2);
    m.route_order_change("+966");
    let text = m.render(0, Some(Duration::ZERO));
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let doc = include_str!("../../docs/architecture.md");
    let documented: std::collections::BTreeSet<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.starts_with("sendonce_"))
        .collect();
    assert_eq!(exported.len(), 21, "{text}");
    assert!(
        text.contains(
            "sendonce_route_quality{route=\"+966\",provider=\"twilio\",measure=\"delivery_rate\"} 0.75"
        ),
        "{text}"
    );
    // A measure without samples is not set.
    assert!(!text.contains("measure=\"slow_share\""), "{text}");
    assert!(
        text.contains("sendonce_route_provider_position{route=\"+966\",provider=\"twilio\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("sendonce_route_order_changes_total{route=\"+966\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sendonce_provider_circuit_state{provider=\"twilio\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("sendonce_store_batch_size_bucket{kind=\"claim\",le=\"2\"} 0")
            && text.contains("sendonce_store_batch_size_bucket{kind=\"claim\",le=\"4\"} 1")
            && text.contains("sendonce_store_batch_size_sum{kind=\"claim\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("sendonce_verify_events_total{event=\"start\",country=\"unknown\"} 1"),
        "{text}"
    );
    assert!(text.contains("sendonce_db_host_switches_total 1"), "{text}");
    assert!(
        text.contains("sendonce_deliveries_interrupted_total{reason=\"lease_lost\"} 1"),
        "{text}"
    );
    assert_eq!(exported, documented);
}
