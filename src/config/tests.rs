use std::time::Duration;

use clap::{CommandFactory, Parser};

use super::*;

fn args(extra: &[&str]) -> Result<Settings, ConfigError> {
    let mut argv = vec!["sendonce", "--database-url", "postgres://u:secret@h/db"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv)
        .expect("clap parses")
        .config
        .validate()
}

/// `Settings` holds types of other modules without `PartialEq`; their
/// derived `Debug` shows every field.
fn same(a: &Settings, b: &Settings) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

#[test]
fn nothing_given_is_exactly_the_defaults() {
    let resolved = Settings::from_args(&ConfigArgs::default()).unwrap();
    assert!(same(&resolved, &Settings::default()), "{resolved:#?}");
    // Through clap too, unless this process's environment sets one of the
    // variables (then clap would rightly read it).
    let cli = Cli::command();
    let set: Vec<String> = cli
        .get_arguments()
        .filter_map(|a| a.get_env())
        .filter(|var| std::env::var_os(var).is_some())
        .map(|var| var.to_string_lossy().into_owned())
        .collect();
    if set.is_empty() {
        let parsed = Cli::try_parse_from(["sendonce"]).unwrap().config;
        let resolved = parsed.validate().unwrap();
        assert!(same(&resolved, &Settings::default()), "{resolved:#?}");
    } else {
        eprintln!("skipping the clap half: {set:?} set in the environment");
    }
    // A different value is noticed by the comparison.
    let other = args(&["--lease", "31s"]).unwrap();
    assert!(!same(&other, &Settings::default()));
}

#[test]
fn log_bodies_reach_the_default_provider() {
    let simulated = |c: &Settings| {
        c.provider
            .kind
            .as_any()
            .downcast_ref::<crate::provider::SimulatedProvider>()
            .map(|p| p.log_bodies)
    };
    assert_eq!(simulated(&args(&[]).unwrap()), Some(false));
    assert_eq!(simulated(&args(&["--log-bodies"]).unwrap()), Some(true));
    let c = args(&["--provider", "simulated", "--log-bodies"]).unwrap();
    assert_eq!(simulated(&c), Some(true));
}

#[test]
fn the_default_database_is_an_sqlite_file() {
    let d = Settings::default();
    assert_eq!(d.database.url, "sqlite://sendonce.db");
    assert_eq!(d.database.backend(), Backend::Sqlite);
    assert_eq!(Backend::of("mysql://x"), None);
}

#[test]
fn defaults_are_valid() {
    let c = args(&[]).unwrap();
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.provider.kind.name(), "simulated");
    assert_eq!(c.server.wait.default, Duration::from_secs(10));
    assert_eq!(c.retention.period, Duration::from_secs(30 * 86_400));
    assert_eq!(c.server.connection.max_connections, 1024);
    assert_eq!(c.database.backend(), Backend::Postgres);
}

#[test]
fn durations_by_new_and_old_names_land_in_their_groups() {
    let c = args(&[
        "--shutdown-grace",
        "1m 30s",
        "--lease-secs",
        "40",
        "--retention",
        "12h",
        "--poll-interval-ms",
        "250",
        "--db-acquire-timeout",
        "750ms",
        "--header-read-timeout",
        "5s",
        "--max-connections",
        "7",
    ])
    .unwrap();
    assert_eq!(c.server.shutdown_grace, Duration::from_secs(90));
    assert_eq!(c.delivery.lease, Duration::from_secs(40));
    assert_eq!(c.retention.period, Duration::from_secs(12 * 3600));
    assert_eq!(c.scheduler.poll_interval, Duration::from_millis(250));
    assert_eq!(c.database.acquire_timeout, Duration::from_millis(750));
    assert_eq!(
        c.server.connection.header_read_timeout,
        Duration::from_secs(5)
    );
    assert_eq!(c.server.connection.max_connections, 7);
    let c = args(&["--retention-days", "2", "--max-wait", "1m"]).unwrap();
    assert_eq!(c.retention.period, Duration::from_secs(2 * 86_400));
    assert_eq!(c.server.wait.max, Duration::from_secs(60));
}

#[test]
fn invalid_settings_are_one_line_reasons() {
    for (extra, want) in [
        (&["--listen", "nope"][..], "SENDONCE_LISTEN"),
        (&["--provider", "http"][..], "SENDONCE_HTTP_PROVIDER_URL"),
        (
            &["--provider", "http", "--http-provider-url", "ftp://x"][..],
            "SENDONCE_HTTP_PROVIDER_URL",
        ),
        (
            &["--bootstrap-api-key", "short"][..],
            "SENDONCE_BOOTSTRAP_API_KEY",
        ),
        (
            &["--bootstrap-api-key", "so_0000000000000000000000000000"][..],
            "SENDONCE_BOOTSTRAP_API_KEY looks typed",
        ),
        (&["--lease-secs", "5"][..], "SENDONCE_LEASE_SECS"),
        (&["--lease", "5s"][..], "SENDONCE_LEASE must be at least"),
        (
            &["--retry-max-attempts", "0"][..],
            "SENDONCE_RETRY_MAX_ATTEMPTS",
        ),
        (&["--sync-wait-ms", "60000"][..], "SENDONCE_MAX_WAIT"),
        (
            &["--sync-wait", "1m"][..],
            "must not be below SENDONCE_SYNC_WAIT",
        ),
        (
            &["--shutdown-grace", "20s", "--shutdown-grace-secs", "20"][..],
            "both SENDONCE_SHUTDOWN_GRACE and SENDONCE_SHUTDOWN_GRACE_SECS",
        ),
        (&["--retention", "forever"][..], "SENDONCE_RETENTION="),
        (&["--max-connections", "0"][..], "SENDONCE_MAX_CONNECTIONS"),
        (
            &["--max-connections", "many"][..],
            "SENDONCE_MAX_CONNECTIONS=",
        ),
        (&["--max-segments", "0"][..], "SENDONCE_MAX_SEGMENTS"),
        (
            &["--max-concurrent-sends", "4", "--spare-send-slots", "4"][..],
            "SENDONCE_SPARE_SEND_SLOTS must be below",
        ),
        (
            &["--spare-send-slots", "some"][..],
            "SENDONCE_SPARE_SEND_SLOTS=",
        ),
        (
            &["--rate-tenant-rps", "300"][..],
            "SENDONCE_RATE_TENANT_BURST must not be below",
        ),
    ] {
        let err = args(extra).unwrap_err();
        let line = err.to_string();
        assert!(line.contains(want), "{extra:?}: {line}");
        assert!(!line.contains('\n'), "{line}");
    }
}

#[test]
fn an_unknown_database_is_refused() {
    let a = ConfigArgs {
        database_url: Some("mysql://x".into()),
        ..ConfigArgs::default()
    };
    let err = Settings::from_args(&a).unwrap_err();
    assert_eq!(
        err.to_string(),
        "DATABASE_URL is not a postgres:// or sqlite:// URL"
    );
}

/// Spare send slots: a sixteenth of the slots unless given; 0 is allowed.
#[test]
fn spare_send_slots_default_to_a_sixteenth() {
    let d = args(&[]).unwrap().delivery;
    assert_eq!((d.spare_send_slots, d.spare_slots()), (None, 4));
    let d = args(&["--max-concurrent-sends", "8"]).unwrap().delivery;
    assert_eq!(d.spare_slots(), 0, "below 16 slots: none");
    let d = args(&["--max-concurrent-sends", "8", "--spare-send-slots", "2"])
        .unwrap()
        .delivery;
    assert_eq!(d.spare_slots(), 2);
    let d = args(&["--spare-send-slots", "0"]).unwrap().delivery;
    assert_eq!(d.spare_slots(), 0);
}

#[test]
fn rates_keep_the_other_half_of_their_default() {
    let c = args(&["--rate-tenant-burst", "500"]).unwrap();
    assert_eq!(c.limits.rates.tenant.capacity, 500);
    assert_eq!(c.limits.rates.tenant.per, Duration::from_secs(5));
    let c = args(&["--rate-tenant-rps", "0", "--rate-number-per-hour", "0"]).unwrap();
    assert!(c.limits.rates.tenant.is_unlimited());
    assert!(c.limits.rates.number.is_unlimited());
    assert_eq!(c.limits.rates.prefix, LimitSettings::default().rates.prefix);
}

#[test]
fn secrets_stay_out_of_debug() {
    let key = "so_0123456789abcdefghijklmnop";
    let c = args(&[
        "--provider",
        "http",
        "--http-provider-url",
        "http://p.example",
        "--http-provider-token",
        "tok-secret",
        "--bootstrap-api-key",
        key,
    ])
    .unwrap();
    let shown = format!("{c:?}");
    for secret in ["tok-secret", key, "secret@"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// Every variable an adapter marks secret, the bootstrap key, the verify
/// secret and the database password, all set at once with each SMS adapter
/// (and both Telegram channels): none shows in the settings' `Debug`, so a
/// secret field a hand-written `Debug` forgets fails here (the reason the
/// settings keep their own `Debug` impls rather than `secrecy`: see
/// docs/security.md).
#[test]
fn no_configured_secret_shows_in_debug() {
    let secret_vars: Vec<&crate::provider::registry::Var> =
        crate::provider::registry::Vars::known()
            .filter(|v| v.secret)
            .collect();
    assert!(secret_vars.len() >= 10, "{secret_vars:?}");
    let value = |env: &str| match env {
        // BotFather's shape: `<bot id>:<secret>`.
        "TELEGRAM_BOT_TOKEN" => "987654321:AAs3cr3t_telegram_bot_token_q9".to_string(),
        // SMPP's password is at most 8 characters.
        "SMPP_PASSWORD" => "pw9Xq7Zk".to_string(),
        _ => format!("s3cr3t-{}-q9", env.to_ascii_lowercase().replace('_', "-")),
    };
    let required: [&[&str]; 5] = [
        &[
            "--provider",
            "http",
            "--http-provider-url",
            "https://p.example",
        ],
        &[
            "--provider",
            "twilio",
            "--twilio-account-sid",
            "AC0123456789abcdef0123456789abcdef",
            "--twilio-from",
            "+14155550000",
        ],
        &[
            "--provider",
            "infobip",
            "--infobip-base-url",
            "https://xyz.api.infobip.com",
            "--infobip-from",
            "ACME",
        ],
        &[
            "--provider",
            "vonage",
            "--vonage-api-key",
            "k123456",
            "--vonage-from",
            "ACME",
        ],
        &[
            "--provider",
            "smpp",
            "--smpp-host",
            "smsc.example",
            "--smpp-system-id",
            "acme",
        ],
    ];
    let verify = "v3rify-secret-0123456789abcdef0123456789abcdef";
    let bootstrap = "so_Zq8Lr2Xw9Kp4Tn7Vb1Hc6Md3Fs5Gj0";
    for extra in required {
        let mut argv: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for v in &secret_vars {
            argv.push(format!("--{}", v.flag));
            argv.push(value(v.env));
        }
        argv.extend(
            [
                "--public-url",
                "https://sms.example.com",
                "--verify-secret",
                verify,
                "--bootstrap-api-key",
                bootstrap,
                // The WhatsApp channel's token turns it on: what else it
                // needs.
                "--whatsapp-phone-number-id",
                "106540352242922",
                "--whatsapp-template-name",
                "login_code",
            ]
            .map(str::to_string),
        );
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let c = args(&argv).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let shown = format!("{c:?}");
        for v in &secret_vars {
            let secret = value(v.env);
            assert!(!shown.contains(&secret), "{} shown: {shown}", v.env);
        }
        for secret in [verify, bootstrap, "secret@"] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
    }
}

#[test]
fn redacts_passwords() {
    assert_eq!(
        redact_url("postgres://u:secret@h/db"),
        "postgres://u:***@h/db"
    );
    assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(
        redact_url("postgres://u@h/db?sslmode=require&password=secret"),
        "postgres://u@h/db?sslmode=require&password=***"
    );
    assert_eq!(
        redact_url("postgres://u:a@h/db?PASSWORD=b&sslpassword=c"),
        "postgres://u:***@h/db?PASSWORD=***&sslpassword=***"
    );
    assert_eq!(
        redact_url("sqlite://sendonce.db?mode=rwc"),
        "sqlite://sendonce.db?mode=rwc"
    );
}

#[test]
fn twilio_and_receipt_settings() {
    let sid = "AC0123456789abcdef0123456789abcdef";
    let twilio = ["--provider", "twilio", "--twilio-account-sid", sid];
    let mut ok = twilio.to_vec();
    ok.extend([
        "--twilio-auth-token",
        "tok",
        "--twilio-from",
        "+14155550000",
        "--public-url",
        "https://sms.example.com/",
        "--receipt-secret",
        "0123456789abcdef",
        "--provider-timeout",
        "4s",
    ]);
    let c = args(&ok).unwrap();
    let Some(t) = c
        .provider
        .kind
        .as_any()
        .downcast_ref::<crate::provider::TwilioSettings>()
    else {
        panic!("{:?}", c.provider);
    };
    assert_eq!(t.base_url, "https://api.twilio.com");
    assert_eq!(t.timeout, Duration::from_secs(4));
    assert_eq!(t.connect_timeout, Duration::from_secs(3));
    assert_eq!(
        t.status_callback.as_deref(),
        Some("https://sms.example.com/providers/twilio/status")
    );
    assert!(!format!("{:?}", c.provider).contains("tok\""));
    assert_eq!(
        c.server.public_url.as_deref(),
        Some("https://sms.example.com")
    );
    let receipts = format!("{:?}", c.provider.receipts);
    assert!(
        receipts.contains(r#"HttpReceipts { secret: "set" }"#)
            && receipts.contains(r#"TwilioReceipts { auth_token: "set" }"#),
        "{receipts}"
    );
    assert!(!receipts.contains("0123456789abcdef"), "{receipts}");

    let with = |extra: &[&'static str]| {
        let mut v = twilio.to_vec();
        v.extend_from_slice(extra);
        args(&v)
    };
    for (extra, want) in [
        (&["--twilio-from", "+1"][..], "TWILIO_AUTH_TOKEN"),
        (&["--twilio-auth-token", "t"][..], "TWILIO_FROM"),
        (
            &[
                "--twilio-auth-token",
                "t",
                "--twilio-messaging-service-sid",
                "MG1",
            ][..],
            "TWILIO_MESSAGING_SERVICE_SID",
        ),
        (
            &[
                "--twilio-auth-token",
                "t",
                "--twilio-from",
                "+1",
                "--twilio-base-url",
                "ftp://x",
            ][..],
            "TWILIO_BASE_URL",
        ),
        (
            &[
                "--twilio-auth-token",
                "t",
                "--twilio-from",
                "+1",
                "--public-url",
                "nope",
            ][..],
            "SENDONCE_PUBLIC_URL",
        ),
    ] {
        let err = with(extra).unwrap_err();
        assert!(err.to_string().contains(want), "{extra:?}: {err}");
    }
    let err = args(&["--provider", "twilio", "--twilio-account-sid", "AC12"]).unwrap_err();
    assert_eq!(err.var(), "TWILIO_ACCOUNT_SID");
    let err = args(&["--receipt-secret", "short"]).unwrap_err();
    assert_eq!(err.var(), "SENDONCE_RECEIPT_SECRET");
}

#[test]
fn a_bad_url_keeps_its_parse_error_as_the_source() {
    let err = args(&["--public-url", "https://"]).unwrap_err();
    assert_eq!(err.var(), "SENDONCE_PUBLIC_URL");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
}

#[test]
fn the_metrics_listener_is_an_address_other_than_the_api() {
    assert_eq!(args(&[]).unwrap().server.metrics_listen, None);
    let c = args(&["--metrics-listen", "127.0.0.1:9090"]).unwrap();
    assert_eq!(
        c.server.metrics_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:9090")
    );
    assert!(args(&["--metrics-listen", "nowhere"]).is_err());
    assert!(
        args(&[
            "--listen",
            "127.0.0.1:9090",
            "--metrics-listen",
            "127.0.0.1:9090"
        ])
        .is_err()
    );
}

#[test]
fn routes_replace_the_provider_list_and_name_only_known_providers() {
    let sid = "AC0123456789abcdef0123456789abcdef";
    let base = [
        "--twilio-account-sid",
        sid,
        "--twilio-auth-token",
        "tok",
        "--twilio-from",
        "+14155550000",
        "--http-provider-url",
        "http://127.0.0.1:9/messages",
    ];
    let with = |extra: &[&'static str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        args(&v)
    };
    let c = with(&["--routes", "+966=twilio,http; +1=http; *=simulated"]).unwrap();
    // Every provider a route names is configured, longest prefix's first.
    let names: Vec<&str> = c.provider.all().iter().map(|p| p.name()).collect();
    assert_eq!(names, ["twilio", "http", "simulated"]);
    let routes = c.provider.routes.as_ref().unwrap();
    assert_eq!(
        routes.lookup("+966501234567").unwrap().providers,
        ["twilio", "http"]
    );
    assert_eq!(routes.lookup("+14155550100").unwrap().providers, ["http"]);
    // Without routes there are none.
    assert!(
        with(&["--provider", "http"])
            .unwrap()
            .provider
            .routes
            .is_none()
    );
    for (extra, want) in [
        (
            &["--routes", "+1=twillio"][..],
            "SENDONCE_ROUTES is refused: the route +1 names no provider \"twillio\"",
        ),
        (
            &["--routes", "1=http"][..],
            "SENDONCE_ROUTES is refused: entry 1: \"1\" is not a prefix",
        ),
        (
            &["--routes", "*=http", "--provider", "twilio"][..],
            "SENDONCE_ROUTES replaces SENDONCE_PROVIDER",
        ),
    ] {
        let e = with(extra).unwrap_err();
        assert!(e.to_string().contains(want), "{extra:?}: {e}");
    }
    // A provider a route names needs its own variables.
    let e = args(&["--routes", "*=twilio"]).unwrap_err();
    assert!(e.to_string().contains("TWILIO_ACCOUNT_SID"), "{e}");
}

#[test]
fn providers_in_order_and_the_circuit() {
    let sid = "AC0123456789abcdef0123456789abcdef";
    let base = [
        "--twilio-account-sid",
        sid,
        "--twilio-auth-token",
        "tok",
        "--twilio-from",
        "+14155550000",
        "--http-provider-url",
        "http://127.0.0.1:9/messages",
    ];
    let with = |provider: &'static str, extra: &[&'static str]| {
        let mut v = base.to_vec();
        v.extend(["--provider", provider]);
        v.extend_from_slice(extra);
        args(&v)
    };
    let c = with("twilio,http", &[]).unwrap();
    assert_eq!(c.provider.kind.name(), "twilio");
    let fallbacks: Vec<&str> = c.provider.fallbacks.iter().map(|p| p.name()).collect();
    assert_eq!(fallbacks, ["http"]);
    assert_eq!(c.provider.all().len(), 2);
    assert_eq!(
        c.provider.circuit,
        crate::delivery::CircuitPolicy::default()
    );
    let c = with("http", &[]).unwrap();
    assert!(c.provider.fallbacks.is_empty());
    let e = with("twilio,http,twilio", &[]).unwrap_err();
    assert!(e.to_string().contains("SENDONCE_PROVIDER"), "{e}");
    // Each provider of the list needs its own variables.
    let e = args(&["--provider", "simulated,http"]).unwrap_err();
    assert!(e.to_string().contains("SENDONCE_HTTP_PROVIDER_URL"), "{e}");
    let c = with(
        "twilio,http",
        &[
            "--circuit-failures",
            "10",
            "--circuit-window",
            "1m",
            "--circuit-open-for",
            "2m",
            "--circuit-refresh",
            "0s",
        ],
    )
    .unwrap();
    assert_eq!(
        c.provider.circuit,
        crate::delivery::CircuitPolicy {
            failures: 10,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(120),
            refresh: Duration::ZERO,
        }
    );
    assert!(with("twilio,http", &["--circuit-open-for", "0s"]).is_err());
    assert!(with("twilio,http", &["--circuit-failures", "many"]).is_err());
}

#[test]
fn a_transaction_pooler_needs_a_direct_url() {
    let c = args(&[]).unwrap();
    assert_eq!(c.database.pooler, Pooler::None);
    assert_eq!(c.database.direct_url, None);
    let direct = "postgres://u:direct-secret@h1:5432,h2:5432/db?target_session_attrs=read-write";
    let c = args(&[
        "--database-pooler",
        "transaction",
        "--database-direct-url",
        direct,
    ])
    .unwrap();
    assert_eq!(c.database.pooler, Pooler::Transaction);
    assert_eq!(c.database.direct_url.as_deref(), Some(direct));
    assert!(!format!("{c:?}").contains("direct-secret"));
    // A direct URL alone is fine: session work goes there.
    assert!(args(&["--database-direct-url", direct]).is_ok());
    let table: &[(&[&str], &str)] = &[
        (
            &["--database-pooler", "transaction"],
            "SENDONCE_DATABASE_DIRECT_URL",
        ),
        (
            &[
                "--database-pooler",
                "transaction",
                "--database-direct-url",
                "sqlite://x.db",
            ],
            "SENDONCE_DATABASE_DIRECT_URL",
        ),
        (
            &[
                "--database-url",
                "sqlite://x.db",
                "--database-direct-url",
                direct,
            ],
            "SENDONCE_DATABASE_DIRECT_URL",
        ),
        (
            &[
                "--database-url",
                "sqlite://x.db",
                "--database-pooler",
                "transaction",
            ],
            "SENDONCE_DATABASE_",
        ),
    ];
    for (extra, var) in table {
        let sqlite = extra.contains(&"--database-url");
        let line = if sqlite {
            let mut argv = vec!["sendonce"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
                .expect("clap parses")
                .config
                .validate()
        } else {
            args(extra)
        }
        .unwrap_err()
        .to_string();
        assert!(line.contains(var), "{extra:?}: {line}");
        assert!(!line.contains('\n'), "{line}");
    }
    assert!(
        Cli::try_parse_from(["sendonce", "--database-pooler", "statement"]).is_err(),
        "statement mode (no transactions at all) is not offered"
    );
}

#[test]
fn prices_come_from_a_file_or_the_default() {
    let dir = std::env::temp_dir().join(format!("sendonce-prices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.csv");
    std::fs::write(
        &good,
        "country,provider,price_per_segment,currency\n*,*,0.05,EUR\nGB,*,0.04,EUR\n",
    )
    .unwrap();
    let two = dir.join("two.csv");
    std::fs::write(
        &two,
        "country,provider,price_per_segment,currency\n*,*,0.05,EUR\nGB,*,0.04,USD\n",
    )
    .unwrap();
    let s = args(&["--prices", good.to_str().unwrap()]).unwrap();
    assert_eq!(s.prices.currency(), "EUR");
    assert_eq!(s.prices.per_segment(Some("GB"), "http"), Some(40_000));
    assert_eq!(
        args(&[]).unwrap().prices.per_segment(None, "x"),
        Some(100_000)
    );
    for (path, want) in [
        (two.to_str().unwrap(), "SENDONCE_PRICES"),
        (
            two.to_str().unwrap(),
            "line 3: currency USD differs from EUR",
        ),
        ("/nonexistent/prices.csv", "cannot read"),
    ] {
        let e = args(&["--prices", path]).unwrap_err();
        assert!(e.to_string().contains(want), "{path}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_telegram_bot_is_a_channel_on_when_its_token_is_set() {
    let c = args(&[]).unwrap();
    assert!(c.provider.channels.is_empty(), "off without a token");
    let c = args(&["--telegram-bot-token", "123456:secret-part"]).unwrap();
    let channels: Vec<&str> = c.provider.channels.iter().map(|p| p.name()).collect();
    assert_eq!(channels, ["telegram"]);
    assert_eq!(c.provider.kind.name(), "simulated", "SMS goes as before");
    let names: Vec<&str> = c.provider.all().iter().map(|p| p.name()).collect();
    assert_eq!(
        names,
        ["simulated", "telegram"],
        "the channel after the SMS list"
    );
    let s = c.provider.channels[0]
        .as_any()
        .downcast_ref::<crate::provider::TelegramSettings>()
        .expect("telegram settings");
    assert_eq!(s.api_url, "https://api.telegram.org");
    assert!(
        !format!("{c:?}").contains("secret-part"),
        "the token is never shown"
    );
    // (arguments, the variable the error names)
    let refused: &[(&[&str], &str)] = &[
        (
            &["--telegram-bot-token", "not-a-token"],
            "TELEGRAM_BOT_TOKEN",
        ),
        (
            &[
                "--telegram-bot-token",
                "12:x",
                "--telegram-bot-api-url",
                "ftp://x",
            ],
            "TELEGRAM_BOT_API_URL",
        ),
        (&["--provider", "telegram"], "SENDONCE_PROVIDER"),
        (&["--routes", "+1=telegram"], "SENDONCE_ROUTES"),
    ];
    for (argv, var) in refused {
        let e = args(argv).unwrap_err();
        assert!(e.to_string().contains(var), "{argv:?}: {e}");
    }
    let e = args(&["--provider", "telegram"]).unwrap_err();
    assert!(
        e.to_string().contains("TELEGRAM_BOT_TOKEN"),
        "says what turns it on: {e}"
    );
}

/// Issue 42, item 4: a provider whose delivery reports cannot arrive (no
/// `SENDONCE_PUBLIC_URL` to give it, or no secret to check them with) is
/// named at start, with the setting that would turn them on.
#[test]
fn reports_that_cannot_arrive_are_warned_of_at_start() {
    let reports = |extra: &[&str]| -> Vec<String> {
        args(extra)
            .unwrap_or_else(|e| panic!("{extra:?}: {e}"))
            .warnings()
            .into_iter()
            .filter(|w| w.contains("delivery reports") || w.contains("reports are off"))
            .collect()
    };
    let public = ["--public-url", "https://sms.example.com"];
    let infobip = [
        "--provider",
        "infobip",
        "--infobip-api-key",
        "k",
        "--infobip-base-url",
        "https://xyz.api.infobip.com",
    ];
    let secret = ["--infobip-receipt-secret", "0123456789abcdef0123"];
    let sid = "AC0123456789abcdef0123456789abcdef";
    let twilio = [
        "--provider",
        "twilio",
        "--twilio-account-sid",
        sid,
        "--twilio-auth-token",
        "tok",
        "--twilio-from",
        "+14155550000",
    ];
    let vonage = [
        "--provider",
        "vonage",
        "--vonage-api-key",
        "k",
        "--vonage-api-secret",
        "s",
        "--vonage-from",
        "Shop",
    ];
    let gateway = ["--telegram-gateway-token", "tok"];
    let http = [
        "--provider",
        "http",
        "--http-provider-url",
        "http://127.0.0.1:9/send",
    ];
    let http_secret = ["--receipt-secret", "0123456789abcdef"];
    let cat = |parts: &[&[&'static str]]| -> Vec<&'static str> { parts.concat() };
    // (arguments, a word every warning must have; None: no warning)
    let cases: Vec<(Vec<&str>, Option<&str>)> = vec![
        (cat(&[&infobip, &secret]), Some("SENDONCE_PUBLIC_URL")),
        (cat(&[&infobip, &public]), Some("INFOBIP_RECEIPT_SECRET")),
        (cat(&[&infobip, &public, &secret]), None),
        (cat(&[&twilio]), Some("SENDONCE_PUBLIC_URL")),
        (cat(&[&twilio, &public]), None),
        (cat(&[&vonage]), Some("SENDONCE_PUBLIC_URL")),
        (cat(&[&vonage, &public]), None),
        (cat(&[&gateway]), Some("SENDONCE_PUBLIC_URL")),
        (
            cat(&[&gateway, &["--public-url", "http://sms.example.com"]]),
            Some("https"),
        ),
        (cat(&[&gateway, &public]), None),
        (cat(&[&http]), Some("SENDONCE_RECEIPT_SECRET")),
        (cat(&[&http, &http_secret]), None),
        (Vec::new(), None),
    ];
    for (extra, want) in cases {
        let got = reports(&extra);
        match want {
            None => assert!(got.is_empty(), "{extra:?}: {got:?}"),
            Some(word) => {
                assert_eq!(got.len(), 1, "{extra:?}: {got:?}");
                assert!(got[0].contains(word), "{extra:?}: {got:?}");
            }
        }
    }
}

/// Issue 42, item 6: `--provider` offers the SMS providers only (a channel
/// of its own is refused there), and `--rate-tenant-rps` says what counts,
/// as docs/configuration.md does.
#[test]
fn help_offers_what_is_taken_and_says_what_counts() {
    let cli = Cli::command();
    let arg = |id: &str| {
        cli.get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("{id}"))
    };
    let offered: Vec<String> = arg("provider")
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    let sms: Vec<&str> = crate::provider::registry::ADAPTERS
        .iter()
        .filter(|a| a.channel == crate::provider::registry::Channel::Sms)
        .map(|a| a.name)
        .collect();
    assert_eq!(offered, sms);
    assert!(offered.iter().any(|n| n == "smpp"), "{offered:?}");
    let help = arg("rate_tenant_rps")
        .get_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    for counted in [
        "POST /messages",
        "batch item",
        "POST /verifications",
        "resend",
    ] {
        assert!(help.contains(counted), "{help}");
    }
}

/// Issue 42, item 6: with routes alone, a missing provider variable names
/// SENDONCE_ROUTES, the setting that asked for the provider.
#[test]
fn a_routes_error_names_routes() {
    let e = args(&["--routes", "+966=infobip; *=simulated"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("SENDONCE_ROUTES") && e.contains("INFOBIP_API_KEY"),
        "{e}"
    );
    assert!(!e.contains("SENDONCE_PROVIDER"), "{e}");
}

/// Issue 42, item 6: the docs name every adapter: configuration.md's
/// provider list every SMS one, providers.md's `adapters!` line all.
#[test]
fn the_docs_name_every_adapter() {
    let config = include_str!("../../docs/configuration.md");
    let row = config
        .lines()
        .find(|l| l.starts_with("| `SENDONCE_PROVIDER` |"))
        .expect("the SENDONCE_PROVIDER row");
    let adapters = crate::provider::registry::ADAPTERS;
    for a in adapters
        .iter()
        .filter(|a| a.channel == crate::provider::registry::Channel::Sms)
    {
        assert!(
            row.contains(&format!("`{}`", a.name)),
            "{} not in {row}",
            a.name
        );
    }
    let providers = include_str!("../../docs/providers.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let names: Vec<&str> = adapters.iter().map(|a| a.name).collect();
    let line = format!("adapters!({})", names.join(", "));
    assert!(providers.contains(&line), "docs/providers.md lacks {line}");
}

/// Issue 42, item 6: the README and docs/console.md give the console's
/// session lifetimes the code has, and docs/api.md the OTP template's
/// `{code}`.
#[test]
fn the_docs_say_the_session_lifetimes_and_the_template() {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let idle = crate::console::IDLE_TIMEOUT.as_secs() / 60;
    let life = crate::console::SESSION_LIFETIME.as_secs() / 3600;
    let readme = one_line(include_str!("../../README.md"));
    let said = format!("after {idle} minutes unused or {life} hours after sign-in");
    assert!(readme.contains(&said), "README lacks {said:?}");
    let console = one_line(include_str!("../../docs/console.md"));
    assert!(console.contains(&said), "docs/console.md lacks {said:?}");
    let api = one_line(include_str!("../../docs/api.md"));
    assert!(
        api.contains("`\"template\"`, the SMS text with `{code}`"),
        "docs/api.md"
    );
}

/// Issue 41, finding 10: a bootstrap key with the test-mode prefix would be
/// stored as a live all-scope key that reads as a test key: refused, saying
/// what to use instead.
#[test]
fn a_test_mode_bootstrap_key_is_refused() {
    let key = format!(
        "{}{}",
        crate::apikey::TEST_PREFIX,
        &crate::apikey::generate().secret[crate::apikey::PREFIX.len()..]
    );
    let e = args(&["--bootstrap-api-key", &key]).expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("SENDONCE_BOOTSTRAP_API_KEY"), "{text}");
    assert!(text.contains("so_test_"), "{text}");
    assert!(text.contains("sendonce key create"), "{text}");
}

/// Issue 42, item 6: a subcommand's help shows its own flags; the server's
/// are in `sendonce --help` and `sendonce serve --help`, and still taken
/// everywhere.
#[test]
fn a_subcommands_help_shows_its_own_flags() {
    let help = |path: &[&str]| {
        let mut cmd = Cli::command_line();
        let mut sub = &mut cmd;
        for p in path {
            sub = sub.find_subcommand_mut(p).expect("subcommand");
        }
        sub.render_long_help().to_string()
    };
    for path in [
        &["tenant"][..],
        &["tenant", "create"],
        &["key", "create"],
        &["outbox"],
    ] {
        let h = help(path);
        assert!(
            !h.contains("--listen") && !h.contains("--database-url"),
            "{path:?}: {h}"
        );
    }
    assert!(help(&["key", "create"]).contains("--scopes"));
    assert!(help(&["outbox"]).contains("--follow"));
    for path in [&[][..], &["serve"]] {
        let h = help(path);
        assert!(
            h.contains("--listen") && h.contains("--database-url"),
            "{path:?}"
        );
    }
    for argv in [
        &["sendonce", "serve", "--database-url", "sqlite://a.db"][..],
        &["sendonce", "--database-url", "sqlite://a.db", "serve"],
        &["sendonce", "--database-url", "sqlite://a.db"],
        &[
            "sendonce",
            "tenant",
            "list",
            "--database-url",
            "sqlite://a.db",
        ],
    ] {
        let m = Cli::command_line()
            .try_get_matches_from(argv)
            .expect("parses");
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m).expect("reads");
        assert_eq!(
            cli.config.database_url.as_deref(),
            Some("sqlite://a.db"),
            "{argv:?}"
        );
    }
}

/// `sendonce --help`, one section per heading: the heading's line to the
/// next heading (a line ending in `:` at the start of a line).
fn help_sections(help: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            sections.push((line.trim_end_matches(':').to_string(), String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    sections
}

/// Issue 42, item 6: `sendonce --help` lists the server's settings under
/// headings (each area, each provider's variables), none left in the
/// catch-all "Options"; `sendonce -h` (and `sendonce serve -h`) is a short
/// summary that says where the rest is.
#[test]
fn the_servers_help_is_grouped_and_short_help_is_short() {
    let render = |path: &[&str], long: bool| {
        let mut cmd = Cli::command_line();
        let mut sub = &mut cmd;
        for p in path {
            sub = sub.find_subcommand_mut(p).expect("subcommand");
        }
        if long {
            sub.render_long_help().to_string()
        } else {
            sub.render_help().to_string()
        }
    };
    for path in [&[][..], &["serve"]] {
        let long = render(path, true);
        let sections = help_sections(&long);
        let under = |heading: &str, flag: &str| {
            sections
                .iter()
                .find(|(h, _)| h == heading)
                .unwrap_or_else(|| panic!("{path:?}: no heading {heading:?} in\n{long}"))
                .1
                .split_whitespace()
                .any(|w| w == format!("--{flag}"))
        };
        for (heading, flags) in [
            (cli::DATABASE, &["database-url", "db-max-connections"][..]),
            (cli::SERVER, &["listen", "public-url"]),
            (cli::PROVIDERS, &["provider", "routes", "provider-timeout"]),
            ("Provider http", &["http-provider-url", "receipt-secret"]),
            ("Provider twilio", &["twilio-account-sid", "twilio-from"]),
            ("Provider infobip", &["infobip-api-key"]),
            ("Provider vonage", &["vonage-api-key"]),
            ("Provider smpp", &["smpp-password"]),
            ("Provider telegram", &["telegram-bot-token"]),
            ("Provider telegram_gateway", &["telegram-gateway-token"]),
            (
                cli::DELIVERY,
                &["retry-base", "lease", "max-concurrent-sends"],
            ),
            (cli::CACHES, &["key-cache-ttl", "replay-cache-entries"]),
            (cli::LIMITS, &["rate-tenant-rps", "max-segments"]),
            (cli::RETENTION, &["retention"]),
            (cli::LOGGING, &["log-format"]),
            (cli::VERIFICATIONS, &["verify-secret", "verify-max-checks"]),
            (cli::WEBHOOKS, &["webhook-allow-private"]),
        ] {
            for flag in flags {
                assert!(
                    under(heading, flag),
                    "{path:?}: --{flag} not under {heading}"
                );
            }
        }
        // "Options" keeps only -h and -V.
        let options = &sections
            .iter()
            .find(|(h, _)| h == "Options")
            .expect("Options")
            .1;
        let listed = options
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .count();
        assert_eq!(listed, if path.is_empty() { 2 } else { 1 }, "{options}");

        let short = render(path, false);
        assert!(
            short.lines().count() <= 40,
            "{path:?}: -h is {} lines:\n{short}",
            short.lines().count()
        );
        assert!(long.lines().count() > 3 * short.lines().count(), "{path:?}");
        for flag in ["--database-url", "--provider", "--listen"] {
            assert!(short.contains(flag), "{path:?}: -h lacks {flag}");
        }
        assert!(
            !short.contains("--retry-base") && !short.contains("--twilio-auth-token"),
            "{short}"
        );
        assert!(
            short.contains("`sendonce --help`") && short.contains(cli::WEBHOOKS),
            "{short}"
        );
    }
    // Every server setting has its heading.
    let cmd = Cli::command_line();
    let bare: Vec<_> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set() && a.get_help_heading().is_none())
        .map(|a| a.get_id().to_string())
        .collect();
    assert!(bare.is_empty(), "no heading: {bare:?}");
}
