//! Tenants, API keys and tenant settings: once for both backends. On
//! Postgres a change other instances cache (a revoked key, a tenant's
//! settings) returns once each has dropped it (`Driver::start_acks`); on
//! SQLite there are no other instances to wait for.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::domain::quiet::QuietHours;
use crate::store::row::ApiKeyRow;
use crate::store::row::tenants::{StringList, TenantAuthRow, TenantSettingsRow};
use crate::store::time::{DbTime, db};
use crate::store::{
    ApiKeyInfo, BootstrapOutcome, NewApiKey, SqlxResultExt, StoreError, TenantAuth, TenantSettings,
    TenantStore,
};

/// The sender list to write after adding or removing `sender`, or `None`
/// when nothing changes. Removing the last sender leaves an empty list (the
/// provider's default sender only), not "no list"; removing from a tenant
/// with no list changes nothing.
pub(crate) fn edited_senders(
    list: Option<Vec<String>>,
    sender: &str,
    add: bool,
) -> Option<Vec<String>> {
    let present = list.as_ref().is_some_and(|l| l.iter().any(|s| s == sender));
    match (add, present) {
        (true, false) => {
            let mut list = list.unwrap_or_default();
            list.push(sender.to_string());
            Some(list)
        }
        (false, true) => {
            let mut list = list.unwrap_or_default();
            list.retain(|s| s != sender);
            Some(list)
        }
        _ => None,
    }
}

/// An audit row of the operator's (the CLI, or the bootstrap key's
/// environment variable) for a change made outside the admin API.
fn cli_audit(
    at: OffsetDateTime,
    action: &'static str,
    target: String,
    detail: serde_json::Value,
) -> crate::admin::AuditEntry {
    crate::admin::AuditEntry {
        id: Uuid::now_v7(),
        at,
        actor: crate::admin::Actor::cli(),
        action,
        target,
        detail,
    }
}

const COUNT: &str = "SELECT count(*) FROM tenants";

const INSERT_TENANT: &str = "INSERT INTO tenants (id, name) VALUES ($1, $2)";

const INSERT_KEY: &str = "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, \
        scopes, label) VALUES ($1, $2, $3, $4, $5, $6)";

const ENSURE_TENANT: &str =
    "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";

/// A key already there (a restart with the same value, or the first start
/// after the upgrade that added the flag) becomes the bootstrap key, if it
/// is this tenant's. Whether it is revoked; no row: another tenant's.
const ENSURE_BOOTSTRAP_KEY: &str = "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, \
        bootstrap, scopes, label) \
     SELECT $1, t.id, $3, $4, true, $5, 'bootstrap' FROM tenants t WHERE t.name = $2 \
     ON CONFLICT (key_hash) DO UPDATE SET bootstrap = true, scopes = excluded.scopes \
     WHERE api_keys.tenant_id = excluded.tenant_id \
     RETURNING revoked_at IS NOT NULL";

const REVOKE_OTHER_BOOTSTRAP_KEYS: &str = "UPDATE api_keys SET revoked_at = $2 \
     WHERE bootstrap AND revoked_at IS NULL AND key_hash <> $1 \
     RETURNING id, key_prefix";

/// A key's tenant (`t`: its own row, a test namespace's shadow for a test
/// key) and the settings it sends under (`l`: the live tenant's row, the
/// same row for a live key): a test key sends as its live tenant would,
/// refused when either row is disabled, never capped (a shadow has no caps).
const FOR_KEY: &str = "SELECT k.tenant_id, l.allowed_countries, l.allowed_senders, \
        l.name = 'default' AS bootstrap_tenant, l.quiet_hours, k.id AS key_id, k.label, \
        k.scopes, (t.disabled OR l.disabled) AS disabled, l.home_country, l.verify_channels, \
        t.spend_cap_daily_micros, t.spend_cap_monthly_micros, \
        t.spend_cap_international_daily, t.live_tenant_id \
     FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
     JOIN tenants l ON l.id = COALESCE(t.live_tenant_id, t.id) \
     WHERE k.key_hash = $1 AND k.revoked_at IS NULL";

/// Tenants by name: test namespaces (shadows) are their live tenant's.
const LIST_TENANTS: &str =
    "SELECT id, name, created_at FROM tenants WHERE live_tenant_id IS NULL ORDER BY name";

const TENANT_SETTINGS: &str = "SELECT id, name, created_at, allowed_countries, \
        allowed_senders, quiet_hours, home_country, disabled, verify_channels, \
        spend_cap_daily_micros, \
        spend_cap_monthly_micros, spend_cap_international_daily FROM tenants \
     WHERE live_tenant_id IS NULL ORDER BY name";

const SET_HOME_COUNTRY: &str =
    "UPDATE tenants SET home_country = $2 WHERE name = $1 AND live_tenant_id IS NULL";

const ADD_KEY: &str = "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, scopes, label) \
     SELECT $1, t.id, $3, $4, $5, $6 FROM tenants t \
     WHERE t.name = $2 AND t.live_tenant_id IS NULL";

const REVOKE_KEY: &str = "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1";

/// Keys under their live tenant's name, a test key flagged `test`.
const LIST_KEYS: &str = "SELECT k.id, l.name, k.key_prefix, k.created_at, \
        k.revoked_at, k.scopes, k.label, k.last_used_at, \
        t.live_tenant_id IS NOT NULL AS test \
     FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
     JOIN tenants l ON l.id = COALESCE(t.live_tenant_id, t.id) \
     ORDER BY l.name, k.created_at";

const SET_COUNTRIES: &str =
    "UPDATE tenants SET allowed_countries = $2 WHERE name = $1 AND live_tenant_id IS NULL";

const SET_QUIET_HOURS: &str =
    "UPDATE tenants SET quiet_hours = $2 WHERE name = $1 AND live_tenant_id IS NULL";

const SENDERS: &str =
    "SELECT allowed_senders FROM tenants WHERE name = $1 AND live_tenant_id IS NULL";

const SET_SENDERS: &str =
    "UPDATE tenants SET allowed_senders = $2 WHERE name = $1 AND live_tenant_id IS NULL";

per_backend! {
    /// The list to edit, locked until the transaction ends (on SQLite the
    /// single writer's transaction is the lock).
    const SENDERS_FOR_UPDATE: &str = concat!(
        "SELECT allowed_senders FROM tenants WHERE name = $1 AND live_tenant_id IS NULL",
        for_update!()
    );

    #[async_trait]
    impl TenantStore for Driver {
        async fn tenant_count(&self) -> Result<i64, StoreError> {
            sqlx::query_scalar(COUNT).fetch_one(self.pool()).await.store_err()
        }

        async fn create_tenant(&self, name: &str, key: &NewApiKey) -> Result<Uuid, StoreError> {
            let (name, key) = (name.to_string(), key.clone());
            self.write_tx(move |c| {
                Box::pin(async move {
                    let id = Uuid::now_v7();
                    sqlx::query(INSERT_TENANT)
                        .bind(id)
                        .bind(&name)
                        .execute(&mut *c)
                        .await?;
                    sqlx::query(crate::store::shared::opt_outs::INHERIT_CHAT_OPT_OUTS)
                        .bind(id)
                        .execute(&mut *c)
                        .await?;
                    sqlx::query(INSERT_KEY)
                        .bind(key.id)
                        .bind(id)
                        .bind(&key.hash)
                        .bind(&key.prefix)
                        .bind(key.scopes.to_stored())
                        .bind(&key.label)
                        .execute(&mut *c)
                        .await?;
                    Ok(id)
                })
            })
            .await
        }

        async fn ensure_bootstrap_key(
            &self,
            name: &str,
            key: &NewApiKey,
            at: OffsetDateTime,
        ) -> Result<BootstrapOutcome, StoreError> {
            // A revoked previous bootstrap key is refused at once: wait, as
            // `revoke_key` does, until every instance dropped it from its cache.
            let acks = self.start_acks().await;
            let (name, key) = (name.to_string(), key.clone());
            let outcome = self
                .write_tx(move |c| {
                    Box::pin(async move {
                        let id = Uuid::now_v7();
                        let made = sqlx::query(ENSURE_TENANT)
                            .bind(id)
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                        if made.rows_affected() == 1 {
                            sqlx::query(crate::store::shared::opt_outs::INHERIT_CHAT_OPT_OUTS)
                                .bind(id)
                                .execute(&mut *c)
                                .await?;
                        }
                        let configured: Option<(bool,)> = sqlx::query_as(ENSURE_BOOTSTRAP_KEY)
                            .bind(key.id)
                            .bind(&name)
                            .bind(&key.hash)
                            .bind(&key.prefix)
                            .bind(crate::scopes::Scopes::ALL.to_stored())
                            .fetch_optional(&mut *c)
                            .await?;
                        let mut outcome = BootstrapOutcome::default();
                        match configured {
                            Some((false,)) => {
                                outcome.revoked = sqlx::query_as(REVOKE_OTHER_BOOTSTRAP_KEYS)
                                    .bind(&key.hash)
                                    .bind(db(at))
                                    .fetch_all(&mut *c)
                                    .await?;
                                // Each revoke audited as the operator's
                                // (issue 41, finding 7).
                                for (id, prefix) in &outcome.revoked {
                                    let audit = cli_audit(
                                        at,
                                        "key.revoke",
                                        id.to_string(),
                                        serde_json::json!({
                                            "prefix": prefix,
                                            "why": "SENDONCE_BOOTSTRAP_API_KEY changed",
                                        }),
                                    );
                                    Driver::write_audit(c, &audit).await?;
                                }
                            }
                            // Revoked earlier, or (never in practice) another tenant's key.
                            _ => outcome.configured_key_revoked = true,
                        }
                        Ok(outcome)
                    })
                })
                .await?;
            if let Some(acks) = acks
                && !outcome.revoked.is_empty()
            {
                acks.wait().await;
            }
            Ok(outcome)
        }

        #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
        async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
            let row: Option<TenantAuthRow> = sqlx::query_as(FOR_KEY)
                .bind(key_hash)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(TenantAuth::from))
        }

        async fn list_tenants(&self) -> Result<Vec<(Uuid, String, OffsetDateTime)>, StoreError> {
            let rows: Vec<(Uuid, String, DbTime)> =
                sqlx::query_as(LIST_TENANTS).fetch_all(self.pool()).await?;
            Ok(rows
                .into_iter()
                .map(|(id, name, at)| (id, name, at.0))
                .collect())
        }

        async fn add_key(
            &self,
            tenant_name: &str,
            key: &NewApiKey,
        ) -> Result<Option<Uuid>, StoreError> {
            if key.test {
                return Err(StoreError::Invariant(
                    "a test key is added with its test namespace (admin_add_key)",
                ));
            }
            let (tenant_name, key) = (tenant_name.to_string(), key.clone());
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(ADD_KEY)
                        .bind(key.id)
                        .bind(&tenant_name)
                        .bind(&key.hash)
                        .bind(&key.prefix)
                        .bind(key.scopes.to_stored())
                        .bind(&key.label)
                        .execute(&mut *c)
                        .await?;
                    Ok((done.rows_affected() == 1).then_some(key.id))
                })
            })
            .await
        }

        async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError> {
            // Returns once every instance has dropped the key from its cache.
            let acks = self.start_acks().await;
            let changed = self
                .write(move |c| {
                    Box::pin(async move {
                        let done = sqlx::query(REVOKE_KEY)
                            .bind(key_id)
                            .bind(db(at))
                            .execute(&mut *c)
                            .await?;
                        Ok(done.rows_affected())
                    })
                })
                .await?;
            if let Some(acks) = acks
                && changed > 0
            {
                acks.wait().await;
            }
            Ok(changed == 1)
        }

        async fn list_keys(&self) -> Result<Vec<ApiKeyInfo>, StoreError> {
            let rows: Vec<ApiKeyRow> = sqlx::query_as(LIST_KEYS).fetch_all(self.pool()).await?;
            Ok(rows.into_iter().map(ApiKeyInfo::from).collect())
        }

        async fn set_allowed_countries(
            &self,
            tenant_name: &str,
            countries: Option<&[String]>,
        ) -> Result<bool, StoreError> {
            let list = countries.map(|c| StringList(c.to_vec()));
            self.set_tenant_column(SET_COUNTRIES, tenant_name, list).await
        }

        async fn tenant_settings(&self) -> Result<Vec<TenantSettings>, StoreError> {
            let rows: Vec<TenantSettingsRow> =
                sqlx::query_as(TENANT_SETTINGS).fetch_all(self.pool()).await?;
            Ok(rows.into_iter().map(TenantSettings::from).collect())
        }

        async fn set_home_country(
            &self,
            tenant_name: &str,
            country: Option<String>,
        ) -> Result<bool, StoreError> {
            self.set_tenant_column(SET_HOME_COUNTRY, tenant_name, country).await
        }

        async fn set_quiet_hours(
            &self,
            tenant_name: &str,
            window: Option<QuietHours>,
        ) -> Result<bool, StoreError> {
            let window = window.map(|w| w.to_string());
            self.set_tenant_column(SET_QUIET_HOURS, tenant_name, window).await
        }

        async fn allowed_senders(
            &self,
            tenant_name: &str,
        ) -> Result<Option<Option<Vec<String>>>, StoreError> {
            let row: Option<(Option<StringList>,)> = sqlx::query_as(SENDERS)
                .bind(tenant_name)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(|(s,)| s.map(|l| l.0)))
        }

        async fn edit_senders(
            &self,
            tenant_name: &str,
            sender: &str,
            add: bool,
        ) -> Result<Option<bool>, StoreError> {
            // Returns once every instance dropped its cached view of the
            // tenant (as a revocation does), so the new list holds at once
            // everywhere.
            let acks = self.start_acks().await;
            let (tenant_name, sender) = (tenant_name.to_string(), sender.to_string());
            let edited = self
                .write_tx(move |c| {
                    Box::pin(async move {
                        let row: Option<(Option<StringList>,)> =
                            sqlx::query_as(SENDERS_FOR_UPDATE)
                                .bind(&tenant_name)
                                .fetch_optional(&mut *c)
                                .await?;
                        let Some((list,)) = row else {
                            return Ok(None);
                        };
                        let Some(list) = edited_senders(list.map(|l| l.0), &sender, add) else {
                            return Ok(Some(false));
                        };
                        sqlx::query(SET_SENDERS)
                            .bind(&tenant_name)
                            .bind(StringList(list))
                            .execute(&mut *c)
                            .await?;
                        let action = if add {
                            "tenant.senders.add"
                        } else {
                            "tenant.senders.remove"
                        };
                        let audit = cli_audit(
                            OffsetDateTime::now_utc(),
                            action,
                            tenant_name.clone(),
                            serde_json::json!({ "sender": sender }),
                        );
                        Driver::write_audit(c, &audit).await?;
                        Ok(Some(true))
                    })
                })
                .await?;
            if let (Some(acks), Some(true)) = (acks, edited) {
                acks.wait().await;
            }
            Ok(edited)
        }
    }

    impl Driver {
        /// Sets one column of tenant `tenant_name` with `sql` (`$1` the
        /// name, `$2` the value), waiting for the instances' caches.
        async fn set_tenant_column<T>(
            &self,
            sql: &'static str,
            tenant_name: &str,
            value: T,
        ) -> Result<bool, StoreError>
        where
            T: for<'q> sqlx::Encode<'q, Db> + sqlx::Type<Db> + Send + Sync + 'static,
        {
            let acks = self.start_acks().await;
            let tenant_name = tenant_name.to_string();
            let changed = self
                .write(move |c| {
                    Box::pin(async move {
                        let done = sqlx::query(sql)
                            .bind(&tenant_name)
                            .bind(&value)
                            .execute(&mut *c)
                            .await?;
                        Ok(done.rows_affected())
                    })
                })
                .await?;
            if let Some(acks) = acks
                && changed > 0
            {
                acks.wait().await;
            }
            Ok(changed == 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &[&str]) -> Option<Vec<String>> {
        Some(s.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn editing_sender_lists() {
        // (list, sender, add, written)
        type Case<'a> = (Option<Vec<String>>, &'a str, bool, Option<Vec<String>>);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (None, "ACME", true, list(&["ACME"])),
            (None, "ACME", false, None),
            (list(&["ACME"]), "ACME", true, None),
            (list(&["ACME"]), "ACME", false, list(&[])),
            (list(&["ACME", "B"]), "B", false, list(&["ACME"])),
            (list(&[]), "B", false, None),
            (list(&["ACME"]), "B", true, list(&["ACME", "B"])),
        ];
        for (before, sender, add, want) in cases {
            assert_eq!(
                edited_senders(before.clone(), sender, add),
                want,
                "{before:?} {sender} {add}"
            );
        }
    }
}
