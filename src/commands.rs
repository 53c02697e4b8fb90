//! What the binary's subcommands do. Only the binary calls these, so they
//! report failures as `anyhow::Error` with context over the library's typed
//! errors (print with `{:#}` for the whole cause chain).

use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use tokio::net::TcpListener;

use crate::admin::{Actor, Admin, AdminError, KeySpec, TenantPatch};
use crate::app::App;
use crate::clock::Clock;
use crate::config::{
    Backend, KeyCommand, ProviderConfig, ReceiptsCommand, SendersCommand, Settings, TenantCommand,
    redact_url,
};
use crate::domain::request::parse_sender;
use crate::provider::Provider;
use crate::scopes::{Scope, Scopes};
use crate::store::postgres::PoolSettings;
use crate::store::{PgStore, SqliteStore, Store, StoreError};
use crate::{apikey, shutdown};

/// A failure to report, with its causes.
pub type CommandError = anyhow::Error;

/// The store `DATABASE_URL` names.
pub fn store(settings: &Settings) -> Result<Arc<dyn Store>, CommandError> {
    let db = &settings.database;
    let at = || format!("opening the database at {}", redact_url(&db.url));
    Ok(match Backend::of(&db.url) {
        Some(Backend::Postgres) => Arc::new(
            PgStore::connect_lazy_via(
                &db.url,
                db.pooler,
                db.direct_url.as_deref(),
                &PoolSettings {
                    max_connections: db.max_connections,
                    acquire_timeout: db.acquire_timeout,
                },
            )
            .with_context(at)?,
        ),
        Some(Backend::Sqlite) => Arc::new(
            SqliteStore::connect_lazy(&db.url, db.max_connections, db.acquire_timeout)
                .with_context(at)?,
        ),
        None => bail!("DATABASE_URL must be a postgres:// or sqlite:// URL"),
    })
}

async fn migrated_store(settings: &Settings) -> Result<Arc<dyn Store>, CommandError> {
    let store = store(settings)?;
    store.migrate().await.map_err(|e| match e {
        StoreError::Unavailable(_) => anyhow!(e).context(format!(
            "cannot reach the database at {}",
            redact_url(&settings.database.url)
        )),
        other if database_missing(&other) => anyhow!(
            "the database at {} does not exist: create it (createdb NAME, or CREATE DATABASE) \
             or point DATABASE_URL at one that does",
            redact_url(&settings.database.url)
        ),
        other => anyhow!(other).context("migration failed"),
    })?;
    Ok(store)
}

/// Whether Postgres answered that the database named in the URL does not
/// exist (SQLSTATE 3D000, `invalid_catalog_name`).
fn database_missing(e: &StoreError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(sqlx::Error::Database(db)) = c.downcast_ref::<sqlx::Error>()
            && db.code().as_deref() == Some("3D000")
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A failure as one line: its causes joined by `: ` (as `{:#}` does), a
/// cause left out when the line already says it (a driver's error that
/// repeats its source's text), line breaks made spaces.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The client of one configured provider (its adapter builds it).
pub fn provider(config: &ProviderConfig) -> Result<Arc<dyn Provider>, CommandError> {
    config
        .build()
        .with_context(|| format!("setting up the {} provider", config.name()))
}

pub async fn migrate(settings: &Settings) -> Result<(), CommandError> {
    migrated_store(settings).await?;
    tracing::info!("migrations applied");
    Ok(())
}

pub async fn serve(settings: Settings) -> Result<(), CommandError> {
    let providers = settings
        .provider
        .all()
        .into_iter()
        .map(provider)
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<&str> = providers.iter().map(|p| p.name()).collect();
    let names = names.join(",");
    let store = migrated_store(&settings).await?;
    bootstrap(&settings, store.as_ref()).await?;
    let listen = settings.server.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let metrics_listener = match settings.server.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for metrics"))?,
        ),
        None => None,
    };
    let database = redact_url(&settings.database.url);
    let mut app = App::build_routed(settings, store, providers, Clock::system(), listener)
        .context("building the app")?;
    if let Some(listener) = metrics_listener {
        tracing::info!(
            metrics_listen = %listener.local_addr().context("reading the metrics address")?,
            "serving /metrics on its own listener only"
        );
        app = app.with_metrics_listener(listener);
    }
    let addr = app.local_addr().context("reading the listening address")?;
    tracing::info!(
        listen = %addr,
        database = %database,
        providers = %names,
        "sendonce listening"
    );
    app.run(shutdown::signal()).await.context("serving")?;
    tracing::info!("stopped");
    Ok(())
}

/// Makes sure a first run can be used at once: with a bootstrap key, tenant
/// `default` accepts exactly it (a previous bootstrap key is revoked, and
/// that is logged); with none and no tenant at all, tenant `default` is
/// created and its key printed once.
pub async fn bootstrap(settings: &Settings, store: &dyn Store) -> Result<(), CommandError> {
    if let Some(key) = &settings.server.bootstrap_api_key {
        let outcome = store
            .ensure_bootstrap_key("default", &apikey::stored_form(key), Clock::system().now())
            .await
            .context("bootstrapping tenant default")?;
        for (id, prefix) in &outcome.revoked {
            tracing::warn!(
                key_id = %id,
                key_prefix = %prefix,
                "SENDONCE_BOOTSTRAP_API_KEY changed: the previous bootstrap key is revoked"
            );
        }
        if outcome.configured_key_revoked {
            tracing::warn!(
                "SENDONCE_BOOTSTRAP_API_KEY names a key that is revoked (or another tenant's): \
                 it is refused, and no other key was revoked"
            );
        }
        return Ok(());
    }
    if store.tenant_count().await.context("counting tenants")? > 0 {
        return Ok(());
    }
    // The first run's key is this install's bootstrap key: it administers.
    let mut key = apikey::generate();
    key.stored.scopes = Scopes::ALL;
    key.stored.label = Some("bootstrap".into());
    match store.create_tenant("default", &key.stored).await {
        Ok(_) => {
            println!(
                "API key for tenant \"default\" (shown once): {}",
                key.secret
            );
            Ok(())
        }
        // Another instance created it first.
        Err(StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(anyhow!(e).context("creating tenant default")),
    }
}

pub async fn tenant(settings: &Settings, command: &TenantCommand) -> Result<(), CommandError> {
    let store = migrated_store(settings).await?;
    match command {
        TenantCommand::Create { name } => {
            let admin = Admin {
                store: store.as_ref(),
            };
            let now = Clock::system().now();
            let t = admin
                .create_tenant(&Actor::cli(), name, now)
                .await
                .map_err(|e| admin_error(e, name))?;
            let spec = KeySpec {
                scopes: Scopes::DEFAULT,
                label: None,
                test: false,
            };
            let (secret, key) = admin
                .create_key(&Actor::cli(), name, &spec, now)
                .await
                .map_err(|e| admin_error(e, name))?;
            eprintln!(
                "created tenant {:?} ({}) and key {}",
                t.name,
                t.id,
                key_text(&key)
            );
            println!("{secret}");
            Ok(())
        }
        TenantCommand::Disable { name } | TenantCommand::Enable { name } => {
            let disabled = matches!(command, TenantCommand::Disable { .. });
            let patch = TenantPatch {
                disabled: Some(disabled),
                ..TenantPatch::default()
            };
            update(store.as_ref(), name, &patch).await?;
            println!(
                "tenant {name:?}: {}",
                if disabled {
                    "disabled (its keys are refused)"
                } else {
                    "enabled"
                }
            );
            Ok(())
        }
        TenantCommand::AllowCountries { name, countries } => {
            let codes: Vec<String> = countries
                .iter()
                .flat_map(|c| c.split(','))
                .map(|c| c.trim().to_ascii_uppercase())
                .filter(|c| !c.is_empty())
                .collect();
            if let Some(bad) = codes.iter().find(|c| !is_country_code(c)) {
                bail!("{bad:?} is not an ISO 3166-1 alpha-2 country code");
            }
            let countries = (!codes.is_empty()).then_some(codes.as_slice());
            let patch = TenantPatch {
                allowed_countries: Some(countries.map(<[String]>::to_vec)),
                ..TenantPatch::default()
            };
            update(store.as_ref(), name, &patch).await?;
            println!(
                "tenant {name:?}: allowed countries {}",
                countries_text(countries)
            );
            Ok(())
        }
        TenantCommand::QuietHours { name, window } => {
            let window = if window.trim().eq_ignore_ascii_case("off") {
                None
            } else {
                Some(
                    crate::domain::quiet::QuietHours::parse(window).ok_or_else(|| {
                        anyhow!("{window:?} is not a window like 21:00-08:00 (or off)")
                    })?,
                )
            };
            let patch = TenantPatch {
                quiet_hours: Some(window),
                ..TenantPatch::default()
            };
            update(store.as_ref(), name, &patch).await?;
            println!("tenant {name:?}: quiet hours {}", quiet_text(window));
            Ok(())
        }
        TenantCommand::HomeCountry { name, country } => {
            let code = country.trim().to_ascii_uppercase();
            let country = match code.as_str() {
                "OFF" => None,
                c if is_country_code(c) => Some(code.clone()),
                _ => bail!("{country:?} is not an ISO 3166-1 alpha-2 country code (or off)"),
            };
            let patch = TenantPatch {
                home_country: Some(country.clone()),
                ..TenantPatch::default()
            };
            update(store.as_ref(), name, &patch).await?;
            println!(
                "tenant {name:?}: home country {}",
                country
                    .as_deref()
                    .unwrap_or("off (only E.164 numbers are read)")
            );
            Ok(())
        }
        TenantCommand::SpendCaps {
            name,
            daily,
            monthly,
            international_daily_messages,
        } => {
            let patch = crate::spend::caps_patch(
                daily.as_deref(),
                monthly.as_deref(),
                international_daily_messages.as_deref(),
            )
            .map_err(|e| anyhow!(e))?;
            let Some(before) = store.spend_caps(name).await.context("reading spend caps")? else {
                bail!("no tenant named {name:?}")
            };
            let after = if patch == crate::spend::SpendCapsPatch::default() {
                before
            } else {
                let patch = TenantPatch {
                    spend_caps: Some(patch),
                    ..TenantPatch::default()
                };
                Admin {
                    store: store.as_ref(),
                }
                .update_tenant(&Actor::cli(), name, &patch, Clock::system().now())
                .await
                .map_err(|e| admin_error(e, name))?
                .spend_caps
            };
            for line in crate::spend::caps_changes(&before, &after) {
                println!("tenant {name:?}: {line}");
            }
            Ok(())
        }
        TenantCommand::Show { name } => {
            let tenants = store.tenant_settings().await.context("reading tenants")?;
            let Some(t) = tenants.iter().find(|t| &t.name == name) else {
                bail!("no tenant named {name:?}")
            };
            println!("name: {}", t.name);
            println!("id: {}", t.id);
            println!("created: {}", rfc3339(t.created_at));
            println!("quiet hours: {}", quiet_text(t.quiet_hours));
            println!("senders: {}", senders_text(t.allowed_senders.as_deref()));
            println!(
                "allowed countries: {}",
                countries_text(t.allowed_countries.as_deref())
            );
            println!(
                "home country: {}",
                t.home_country.as_deref().unwrap_or("none")
            );
            println!("disabled: {}", if t.disabled { "yes" } else { "no" });
            for line in crate::spend::caps_changes(&t.spend_caps, &t.spend_caps) {
                println!("{}", line.trim_end_matches(" (unchanged)"));
            }
            Ok(())
        }
        TenantCommand::Senders { name, command } => senders(store.as_ref(), name, command).await,
        TenantCommand::List => {
            for t in store.tenant_settings().await.context("listing tenants")? {
                println!(
                    "{}\t{}\t{}\tquiet hours {}\tsenders {}\tcountries {}\thome {}",
                    t.id,
                    t.name,
                    rfc3339(t.created_at),
                    quiet_text(t.quiet_hours),
                    senders_text(t.allowed_senders.as_deref()),
                    countries_text(t.allowed_countries.as_deref()),
                    t.home_country.as_deref().unwrap_or("none"),
                );
            }
            Ok(())
        }
    }
}

pub use crate::admin::valid_tenant_name;

/// An admin change refused, as the CLI says it.
fn admin_error(e: AdminError, name: &str) -> CommandError {
    match e {
        AdminError::Invalid(errors) => anyhow!(
            "{}",
            errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        AdminError::NotFound(what) => anyhow!("no {what} named {name:?}"),
        AdminError::Conflict(what) => anyhow!("{what}"),
        AdminError::Scope(s) => anyhow!("needs the {s} scope"),
        AdminError::Store(e) => anyhow!(e).context(format!("changing {name:?}")),
    }
}

/// Applies a settings change as the admin API does (audited, acknowledged).
async fn update(store: &dyn Store, name: &str, patch: &TenantPatch) -> Result<(), CommandError> {
    Admin { store }
        .update_tenant(&Actor::cli(), name, patch, Clock::system().now())
        .await
        .map(|_| ())
        .map_err(|e| admin_error(e, name))
}

fn key_text(k: &crate::store::ApiKeyInfo) -> String {
    format!(
        "{} ({}…, {}scopes {}{})",
        k.id,
        k.prefix,
        if k.test { "test mode, " } else { "" },
        k.scopes.to_stored(),
        k.label
            .as_deref()
            .map(|l| format!(", label {l:?}"))
            .unwrap_or_default()
    )
}

fn is_country_code(c: &str) -> bool {
    c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase())
}

fn quiet_text(window: Option<crate::domain::quiet::QuietHours>) -> String {
    window.map_or_else(
        || "off".to_string(),
        |w| format!("{w} (recipient's local time)"),
    )
}

fn senders_text(senders: Option<&[String]>) -> String {
    match senders {
        None => "(no list)".into(),
        Some([]) => "(empty list: the provider's default sender only)".into(),
        Some(list) => list.join(", "),
    }
}

fn countries_text(countries: Option<&[String]>) -> String {
    match countries {
        None | Some([]) => "any".into(),
        Some(list) => list.join(", "),
    }
}

async fn senders(
    store: &dyn Store,
    name: &str,
    command: &SendersCommand,
) -> Result<(), CommandError> {
    let edit = |sender: &str| {
        parse_sender(sender.trim()).ok_or_else(|| {
            anyhow!(
                "{sender:?} is not a sender: an E.164 number (+14155550100) or 1 to 11 \
                 letters, digits and spaces with at least one letter"
            )
        })
    };
    let (sender, add) = match command {
        SendersCommand::List => {
            match store
                .allowed_senders(name)
                .await
                .context("reading allowed senders")?
            {
                None => bail!("no tenant named {name:?}"),
                Some(None) => println!("(no list)"),
                Some(Some(list)) => {
                    for s in list {
                        println!("{s}");
                    }
                }
            }
            return Ok(());
        }
        SendersCommand::Add { sender } => (edit(sender)?, true),
        SendersCommand::Remove { sender } => (edit(sender)?, false),
    };
    match store
        .edit_senders(name, &sender, add)
        .await
        .context("changing allowed senders")?
    {
        None => bail!("no tenant named {name:?}"),
        Some(changed) => {
            if changed {
                println!(
                    "tenant {name:?}: {} sender {sender:?}",
                    if add { "added" } else { "removed" }
                );
            } else {
                eprintln!(
                    "{sender:?} was {} the list: nothing changed",
                    if add { "already on" } else { "not on" }
                );
            }
            Ok(())
        }
    }
}

pub async fn key(settings: &Settings, command: &KeyCommand) -> Result<(), CommandError> {
    let store = migrated_store(settings).await?;
    match command {
        KeyCommand::Create {
            tenant,
            scopes,
            label,
            test,
        } => {
            let mut named = Vec::new();
            for s in scopes {
                named.push(Scope::parse(s.trim()).ok_or_else(|| {
                    anyhow!("{s:?} is not a scope (send, read, opt-outs, webhooks, admin)")
                })?);
            }
            if label
                .as_deref()
                .is_some_and(|l| !crate::admin::valid_label(l))
            {
                bail!("a label is 1 to 100 characters without control characters");
            }
            let spec = KeySpec {
                scopes: if named.is_empty() {
                    Scopes::DEFAULT
                } else {
                    Scopes::of(&named)
                },
                label: label.clone(),
                test: *test,
            };
            let (secret, key) = Admin {
                store: store.as_ref(),
            }
            .create_key(&Actor::cli(), tenant, &spec, Clock::system().now())
            .await
            .map_err(|e| admin_error(e, tenant))?;
            eprintln!("created key {} for tenant {tenant:?}", key_text(&key));
            println!("{secret}");
            Ok(())
        }
        KeyCommand::Revoke { key_id } => {
            Admin {
                store: store.as_ref(),
            }
            .revoke_key(&Actor::cli(), *key_id, Clock::system().now())
            .await
            .map_err(|e| admin_error(e, &key_id.to_string()))?;
            println!("revoked key {key_id}: refused on every instance from now on");
            Ok(())
        }
        KeyCommand::List => {
            for k in store.list_keys().await.context("listing API keys")? {
                let state = if k.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!(
                    "{}\t{}\t{}…\t{}\t{}\t{}\t{}\tlast used {}",
                    k.id,
                    k.tenant_name,
                    k.prefix,
                    if k.test { "test" } else { "live" },
                    state,
                    k.scopes.to_stored(),
                    k.label.as_deref().unwrap_or("-"),
                    k.last_used_at.map_or_else(|| "never".to_string(), rfc3339),
                );
            }
            Ok(())
        }
    }
}

pub async fn receipts(settings: &Settings, command: &ReceiptsCommand) -> Result<(), CommandError> {
    let store = migrated_store(settings).await?;
    match command {
        ReceiptsCommand::Unmatched { limit } => {
            let receipts = store
                .unmatched_receipts(*limit)
                .await
                .context("listing unmatched receipts")?;
            if receipts.is_empty() {
                println!("no unmatched receipts");
            }
            for r in receipts {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    rfc3339(r.received_at),
                    r.provider,
                    r.provider_message_id,
                    r.provider_status,
                    r.event_id
                );
            }
            Ok(())
        }
    }
}

/// `sendonce outbox`: what the simulated provider was handed, bodies opened
/// with the verify secret as delivery opens them; with `follow`, what it is
/// handed from then on too (read every second until interrupted).
pub async fn outbox(
    settings: &Settings,
    tenant: Option<&str>,
    limit: u32,
    follow: bool,
) -> Result<(), CommandError> {
    let names: Vec<&str> = settings.provider.all().iter().map(|p| p.name()).collect();
    if let Some(why) = crate::outbox::refusal(&names) {
        bail!(why);
    }
    let store = migrated_store(settings).await?;
    let tenant_id = match tenant {
        None => None,
        Some(name) => {
            let tenants = store.tenant_settings().await.context("reading tenants")?;
            let Some(t) = tenants.iter().find(|t| t.name == name) else {
                bail!("no tenant named {name:?}")
            };
            Some(t.id)
        }
    };
    let secret = crate::verify::SecretSource::new(
        settings.verify.secret.as_ref().map(|s| s.0.clone()),
        Arc::clone(&store),
    );
    let mut after = None;
    let mut said_empty = false;
    loop {
        let entries = store
            .outbox(
                crate::outbox::OUTBOX_PROVIDER,
                tenant_id,
                after,
                limit.max(1),
            )
            .await
            .context("reading the outbox")?;
        if entries.is_empty() && after.is_none() && !said_empty {
            println!("the outbox is empty: nothing was sent through the simulated provider yet");
            said_empty = true;
        }
        for e in crate::outbox::opened(entries, &secret).await {
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                rfc3339(e.sent_at),
                e.tenant,
                e.to,
                e.message_id,
                e.idempotency_key,
                e.provider_message_id.as_deref().unwrap_or("-"),
                e.body
                    .replace('\\', "\\\\")
                    .replace('\n', "\\n")
                    .replace('\t', "\\t")
            );
            after = Some(e.cursor());
        }
        if !follow {
            return Ok(());
        }
        if after.is_none() {
            // Nothing yet: from now on, everything is new.
            after = Some((
                time::OffsetDateTime::UNIX_EPOCH,
                crate::domain::MessageId(uuid::Uuid::nil()),
                0,
            ));
        }
        tokio::select! {
            () = shutdown::signal() => return Ok(()),
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// A time as the CLI prints it: RFC 3339, as the API answers it.
fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for (name, ok) in [
            ("mobile-backend", true),
            ("ERP_2", true),
            ("a", true),
            ("acme.eu", true),
            (&"x".repeat(64), true),
            (&"x".repeat(65), false),
            ("", false),
            ("Mobile Backend!", false),
            ("-leading", false),
            (".hidden", false),
            ("tab\there", false),
            ("café", false),
            ("a/b", false),
        ] {
            assert_eq!(valid_tenant_name(name), ok, "{name:?}");
        }
    }

    #[test]
    fn settings_read_as_words() {
        assert_eq!(senders_text(None), "(no list)");
        assert!(senders_text(Some(&[])).contains("default sender only"));
        assert_eq!(
            senders_text(Some(&["ACME".into(), "+14155550100".into()])),
            "ACME, +14155550100"
        );
        assert_eq!(countries_text(None), "any");
        assert_eq!(countries_text(Some(&["US".into(), "CA".into()])), "US, CA");
        assert_eq!(quiet_text(None), "off");
    }
}

#[cfg(test)]
mod one_line_tests {
    #[derive(Debug, thiserror::Error)]
    #[error("database error: {0}")]
    struct Outer(#[source] Middle);
    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: {0}")]
    struct Middle(#[source] Leaf);
    #[derive(Debug, thiserror::Error)]
    #[error("database \"x\"\ndoes not exist")]
    struct Leaf;

    #[test]
    fn causes_said_already_are_left_out() {
        let e = anyhow::Error::new(Outer(Middle(Leaf))).context("migration failed");
        assert_eq!(
            super::one_line(&e),
            "migration failed: database error: error returned from database: database \"x\" does not exist"
        );
        let e = anyhow::anyhow!("a").context("b");
        assert_eq!(super::one_line(&e), "b: a");
    }
}
