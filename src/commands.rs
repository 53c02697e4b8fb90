//! What the binary's subcommands do.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::app::App;
use crate::clock::Clock;
use crate::config::{Backend, Config, KeyCommand, ProviderConfig, TenantCommand, redact_url};
use crate::provider::{HttpProvider, Provider, SimulatedProvider};
use crate::store::postgres::PoolSettings;
use crate::store::{PgStore, SqliteStore, Store, StoreError};
use crate::{apikey, shutdown};

/// A failure to report as one line.
pub type CommandError = String;

/// The store `DATABASE_URL` names.
pub fn store(config: &Config) -> Result<Arc<dyn Store>, CommandError> {
    Ok(match Backend::of(&config.database_url) {
        Some(Backend::Postgres) => Arc::new(
            PgStore::connect_lazy(
                &config.database_url,
                &PoolSettings {
                    max_connections: config.db_max_connections,
                    acquire_timeout: config.db_acquire_timeout,
                },
            )
            .map_err(|e| e.to_string())?,
        ),
        Some(Backend::Sqlite) => Arc::new(
            SqliteStore::connect_lazy(
                &config.database_url,
                config.db_max_connections,
                config.db_acquire_timeout,
            )
            .map_err(|e| e.to_string())?,
        ),
        None => return Err("DATABASE_URL must be a postgres:// or sqlite:// URL".into()),
    })
}

async fn migrated_store(config: &Config) -> Result<Arc<dyn Store>, CommandError> {
    let store = store(config)?;
    store.migrate().await.map_err(|e| match e {
        StoreError::Unavailable(m) => format!(
            "cannot reach the database at {}: {m}",
            redact_url(&config.database_url)
        ),
        other => format!("migration failed: {other}"),
    })?;
    Ok(store)
}

pub fn provider(
    config: &ProviderConfig,
    log_bodies: bool,
) -> Result<Arc<dyn Provider>, CommandError> {
    Ok(match config {
        ProviderConfig::Simulated => Arc::new(SimulatedProvider { log_bodies }),
        ProviderConfig::Http {
            url,
            token,
            timeout,
            connect_timeout,
        } => Arc::new(HttpProvider::new(
            url,
            token.clone(),
            *timeout,
            *connect_timeout,
        )?),
        ProviderConfig::Twilio(settings) => {
            Arc::new(crate::provider::TwilioProvider::new(settings.clone())?)
        }
    })
}

pub async fn migrate(config: &Config) -> Result<(), CommandError> {
    migrated_store(config).await?;
    tracing::info!("migrations applied");
    Ok(())
}

pub async fn serve(config: Config) -> Result<(), CommandError> {
    let provider = provider(&config.provider, config.settings.log_bodies)?;
    let store = migrated_store(&config).await?;
    bootstrap(&config, store.as_ref()).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let app = App::build(
        config.settings.clone(),
        store,
        provider.clone(),
        Clock::system(),
        listener,
    )
    .map_err(|e| e.to_string())?;
    let addr = app.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(
        listen = %addr,
        database = %redact_url(&config.database_url),
        provider = provider.name(),
        "sendonce listening"
    );
    app.run(shutdown::signal())
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

/// Makes sure a first run can be used at once: with a bootstrap key, tenant
/// `default` accepts it; with none and no tenant at all, tenant `default` is
/// created and its key printed once.
async fn bootstrap(config: &Config, store: &dyn Store) -> Result<(), CommandError> {
    if let Some(key) = &config.bootstrap_api_key {
        return store
            .ensure_tenant_key("default", &apikey::stored_form(key))
            .await
            .map_err(|e| format!("bootstrapping tenant default: {e}"));
    }
    if store.tenant_count().await.map_err(|e| e.to_string())? > 0 {
        return Ok(());
    }
    let key = apikey::generate();
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
        Err(e) => Err(format!("creating tenant default: {e}")),
    }
}

pub async fn tenant(config: &Config, command: &TenantCommand) -> Result<(), CommandError> {
    let store = migrated_store(config).await?;
    match command {
        TenantCommand::Create { name } => {
            let name = name.trim();
            if name.is_empty() || name.len() > 100 {
                return Err("a tenant name is 1 to 100 characters".into());
            }
            let key = apikey::generate();
            match store.create_tenant(name, &key.stored).await {
                Ok(_) => {
                    println!("{}", key.secret);
                    Ok(())
                }
                Err(StoreError::Conflict { .. }) => Err(format!("tenant {name:?} already exists")),
                Err(e) => Err(e.to_string()),
            }
        }
        TenantCommand::AllowCountries { name, countries } => {
            let codes: Vec<String> = countries
                .iter()
                .flat_map(|c| c.split(','))
                .map(|c| c.trim().to_ascii_uppercase())
                .filter(|c| !c.is_empty())
                .collect();
            if let Some(bad) = codes
                .iter()
                .find(|c| c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase()))
            {
                return Err(format!("{bad:?} is not an ISO 3166-1 alpha-2 country code"));
            }
            let countries = (!codes.is_empty()).then_some(codes.as_slice());
            if store
                .set_allowed_countries(name, countries)
                .await
                .map_err(|e| e.to_string())?
            {
                Ok(())
            } else {
                Err(format!("no tenant named {name:?}"))
            }
        }
        TenantCommand::List => {
            for (id, name, created) in store.list_tenants().await.map_err(|e| e.to_string())? {
                println!("{id}\t{name}\t{created}");
            }
            Ok(())
        }
    }
}

pub async fn key(config: &Config, command: &KeyCommand) -> Result<(), CommandError> {
    let store = migrated_store(config).await?;
    match command {
        KeyCommand::Create { tenant } => {
            let key = apikey::generate();
            match store
                .add_key(tenant, &key.stored)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(_) => {
                    println!("{}", key.secret);
                    Ok(())
                }
                None => Err(format!("no tenant named {tenant:?}")),
            }
        }
        KeyCommand::Revoke { key_id } => {
            let now = Clock::system().now();
            if store
                .revoke_key(*key_id, now)
                .await
                .map_err(|e| e.to_string())?
            {
                Ok(())
            } else {
                Err(format!("no API key with id {key_id}"))
            }
        }
        KeyCommand::List => {
            for k in store.list_keys().await.map_err(|e| e.to_string())? {
                let state = if k.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!("{}\t{}\t{}…\t{}", k.id, k.tenant_name, k.prefix, state);
            }
            Ok(())
        }
    }
}

pub async fn receipts(
    config: &Config,
    command: &crate::config::ReceiptsCommand,
) -> Result<(), CommandError> {
    let store = migrated_store(config).await?;
    match command {
        crate::config::ReceiptsCommand::Unmatched { limit } => {
            for r in store
                .unmatched_receipts(*limit)
                .await
                .map_err(|e| e.to_string())?
            {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    r.received_at, r.provider, r.provider_message_id, r.provider_status, r.event_id
                );
            }
            Ok(())
        }
    }
}
