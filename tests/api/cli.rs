//! The tenant commands as an operator runs them (issue 26): each says what
//! it changed, `tenant show` and `tenant list` show every setting, names
//! are checked, and `tenant home-country` sets the country the console
//! reads national numbers in. On both stores.

use crate::helpers::*;

async fn run(database: &str, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sendonce"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", database)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run sendonce");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn tenant_commands_say_what_they_changed(backend: Backend) {
    let db = fresh_database_on(backend).await;
    let (ok, _, err) = run(&db, &["tenant", "create", "Mobile Backend!"]).await;
    assert!(!ok && err.contains("not a tenant name"), "{err}");
    let (ok, key, _) = run(&db, &["tenant", "create", "mobile-backend"]).await;
    assert!(ok && key.trim().starts_with("so_"), "{key}");

    for (args, said) in [
        (
            vec!["tenant", "quiet-hours", "mobile-backend", "21:00-08:00"],
            "quiet hours 21:00-08:00",
        ),
        (
            vec!["tenant", "allow-countries", "mobile-backend", "us", "CA"],
            "allowed countries US, CA",
        ),
        (
            vec!["tenant", "senders", "mobile-backend", "add", "ACME"],
            "added sender \"ACME\"",
        ),
        (
            vec!["tenant", "home-country", "mobile-backend", "us"],
            "home country US",
        ),
    ] {
        let (ok, out, err) = run(&db, &args).await;
        assert!(ok, "{args:?}: {err}");
        assert!(
            out.contains("mobile-backend") && out.contains(said),
            "{args:?}: {out:?}"
        );
    }
    let (ok, _, err) = run(&db, &["tenant", "home-country", "mobile-backend", "USA"]).await;
    assert!(!ok && err.contains("ISO 3166-1"), "{err}");
    let (ok, _, err) = run(&db, &["tenant", "home-country", "nobody", "US"]).await;
    assert!(!ok && err.contains("no tenant"), "{err}");

    let (ok, show, err) = run(&db, &["tenant", "show", "mobile-backend"]).await;
    assert!(ok, "{err}");
    for line in [
        "name: mobile-backend",
        "quiet hours: 21:00-08:00",
        "senders: ACME",
        "allowed countries: US, CA",
        "home country: US",
    ] {
        assert!(show.contains(line), "{line:?} in {show}");
    }
    let (ok, _, err) = run(&db, &["tenant", "show", "nobody"]).await;
    assert!(!ok && err.contains("no tenant"), "{err}");

    let (ok, list, _) = run(&db, &["tenant", "list"]).await;
    assert!(ok);
    let line = list
        .lines()
        .find(|l| l.contains("\tmobile-backend\t"))
        .expect("the tenant's line");
    for part in ["21:00-08:00", "ACME", "US, CA", "home US"] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    let (ok, out, _) = run(&db, &["tenant", "quiet-hours", "mobile-backend", "off"]).await;
    assert!(ok && out.contains("quiet hours off"), "{out}");
    let (ok, out, _) = run(&db, &["tenant", "home-country", "mobile-backend", "off"]).await;
    assert!(ok && out.contains("home country off"), "{out}");
}

/// The key and disable commands (issue 27) go through the admin API's code:
/// they say what they changed and each change is in the audit log, as the
/// CLI's.
async fn key_and_disable_commands_are_audited(backend: Backend) {
    let db = fresh_database_on(backend).await;
    let (ok, _, err) = run(&db, &["tenant", "create", "shop"]).await;
    assert!(ok, "{err}");
    let (ok, key, err) = run(
        &db,
        &[
            "key",
            "create",
            "shop",
            "--scopes",
            "read,opt-outs",
            "--label",
            "support desk",
        ],
    )
    .await;
    assert!(ok && key.trim().starts_with("so_"), "{err}");
    assert!(
        err.contains("scopes read,opt-outs") && err.contains("support desk"),
        "{err}"
    );
    let (ok, _, err) = run(&db, &["key", "create", "shop", "--scopes", "root"]).await;
    assert!(!ok && err.contains("not a scope"), "{err}");
    // A test-mode key: `so_test_`, listed under its tenant as `test`.
    let (ok, test_key, err) = run(&db, &["key", "create", "shop", "--test", "--label", "ci"]).await;
    assert!(ok && test_key.trim().starts_with("so_test_"), "{err}");
    assert!(err.contains("test mode"), "{err}");
    let (ok, list, _) = run(&db, &["key", "list"]).await;
    assert!(ok);
    let line = list
        .lines()
        .find(|l| l.contains("\tci\t"))
        .expect("the test key");
    assert!(
        line.contains("\tshop\tso_test_") && line.contains("\ttest\t"),
        "{line}"
    );
    assert!(!list.contains('~'), "no shadow tenant is listed: {list}");
    let (ok, tenants, _) = run(&db, &["tenant", "list"]).await;
    assert!(ok && !tenants.contains('~'), "{tenants}");
    let line = list
        .lines()
        .find(|l| l.contains("support desk"))
        .expect("the labelled key");
    assert!(
        line.contains("read,opt-outs") && line.contains("last used never"),
        "{line}"
    );
    let id = line.split('\t').next().unwrap().to_string();
    let (ok, out, _) = run(&db, &["tenant", "disable", "shop"]).await;
    assert!(ok && out.contains("\"shop\": disabled"), "{out}");
    let (ok, show, _) = run(&db, &["tenant", "show", "shop"]).await;
    assert!(ok && show.contains("disabled: yes"), "{show}");
    let (ok, out, _) = run(&db, &["key", "revoke", &id]).await;
    assert!(ok && out.contains("revoked key"), "{out}");

    let store = open_store(&db, std::time::Duration::from_secs(2)).0;
    let log = store.audit_log(None, 10).await.expect("audit log");
    let actions: Vec<&str> = log.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "key.revoke",
            "tenant.update",
            "key.create",
            "key.create",
            "key.create",
            "tenant.create"
        ]
    );
    // The test key's creation says so.
    assert_eq!(log[2].detail["test"], true, "{:?}", log[2].detail);
    assert_eq!(log[3].detail["test"], false, "{:?}", log[3].detail);
    assert!(log.iter().all(|r| r.via == "cli" && r.key_id.is_none()));
    assert_eq!(log[1].detail, serde_json::json!({"disabled": true}));
}

/// Issue 42, item 6: times in RFC 3339, and an empty list says so.
async fn times_are_rfc3339_and_an_empty_list_says_so(backend: Backend) {
    let db = fresh_database_on(backend).await;
    let (ok, _, err) = run(&db, &["tenant", "create", "shop"]).await;
    assert!(ok, "{err}");
    let (ok, out, err) = run(&db, &["tenant", "list"]).await;
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("\tshop\t"))
        .expect("the tenant's line");
    let created = line.split('\t').nth(2).expect("created");
    time::OffsetDateTime::parse(created, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{created:?}: {e}"));
    let (ok, out, err) = run(&db, &["tenant", "show", "shop"]).await;
    assert!(ok, "{err}");
    let created = out
        .lines()
        .find_map(|l| l.strip_prefix("created: "))
        .expect("created line");
    time::OffsetDateTime::parse(created, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{created:?}: {e}"));
    let (ok, out, err) = run(&db, &["receipts", "unmatched"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no unmatched receipts", "{out:?}");
}

/// Issue 42, item 4: a database that does not exist is said once, on one
/// line, with what to do.
#[tokio::test]
async fn a_missing_database_is_one_line_said_once() {
    let mut url = reqwest::Url::parse(&admin_url()).expect("admin URL");
    let name = format!("sendonce_absent_{}", uuid::Uuid::new_v4().simple());
    url.set_path(&name);
    let (ok, _, err) = run(url.as_str(), &["migrate"]).await;
    assert!(!ok, "{err}");
    let said = err.trim_end();
    assert_eq!(said.lines().count(), 1, "{said}");
    assert_eq!(said.matches("does not exist").count(), 1, "{said}");
    assert!(said.contains(&name), "{said}");
    assert!(said.contains("createdb"), "{said}");
}

on_both_backends!(
    times_are_rfc3339_and_an_empty_list_says_so,
    tenant_commands_say_what_they_changed,
    key_and_disable_commands_are_audited,
);
