//! The admin API's writes, once for both backends: each change and its
//! audit row in one transaction; on Postgres it returns once every instance
//! acknowledged the tenant's notification (`Driver::start_acks`).

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::admin::{AuditEntry, AuditRecord, TenantPatch};
use crate::store::row::ApiKeyRow;
use crate::store::row::tenants::{StringList, TenantSettingsRow};
use crate::store::time::{DbTime, db};
use crate::store::{AdminStore, ApiKeyInfo, NewApiKey, StoreError, TenantSettings};

const INSERT_AUDIT: &str = "INSERT INTO audit_log \
     (id, at, actor, key_id, key_label, action, target, detail) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

const INSERT_TENANT: &str = "INSERT INTO tenants (id, name) VALUES ($1, $2)";

/// One statement for every setting: `$2k` says whether to set the column,
/// `$2k+1` its value.
const UPDATE_TENANT: &str = "UPDATE tenants SET \
        quiet_hours = CASE WHEN $2 THEN $3 ELSE quiet_hours END, \
        allowed_senders = CASE WHEN $4 THEN $5 ELSE allowed_senders END, \
        allowed_countries = CASE WHEN $6 THEN $7 ELSE allowed_countries END, \
        home_country = CASE WHEN $8 THEN $9 ELSE home_country END, \
        disabled = CASE WHEN $10 THEN $11 ELSE disabled END, \
        spend_cap_daily_micros = CASE WHEN $12 THEN $13 ELSE spend_cap_daily_micros END, \
        spend_cap_monthly_micros = CASE WHEN $14 THEN $15 ELSE spend_cap_monthly_micros END, \
        spend_cap_international_daily = \
            CASE WHEN $16 THEN $17 ELSE spend_cap_international_daily END, \
        verify_channels = CASE WHEN $18 THEN $19 ELSE verify_channels END \
     WHERE name = $1 AND live_tenant_id IS NULL";

const ADD_KEY: &str = "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, scopes, label) \
     SELECT $1, t.id, $3, $4, $5, $6 FROM tenants t \
     WHERE t.name = $2 AND t.live_tenant_id IS NULL";

/// Makes tenant `$2`'s test namespace (its shadow row, `$1` its id) unless
/// it has one: the unique index on `live_tenant_id` lets only one in, even
/// when two first test keys race. The name is never a tenant name (`~` is
/// outside the pattern) and never looked up.
const ENSURE_SHADOW: &str = "INSERT INTO tenants (id, name, live_tenant_id) \
     SELECT $1, t.name || '~test', t.id FROM tenants t \
     WHERE t.name = $2 AND t.live_tenant_id IS NULL \
     ON CONFLICT DO NOTHING";

/// A test key goes to the shadow of tenant `$2`.
const ADD_TEST_KEY: &str = "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, scopes, label) \
     SELECT $1, s.id, $3, $4, $5, $6 FROM tenants s JOIN tenants t ON t.id = s.live_tenant_id \
     WHERE t.name = $2";

const KEY_BY_ID: &str = "SELECT k.id, l.name, k.key_prefix, k.created_at, \
        k.revoked_at, k.scopes, k.label, k.last_used_at, \
        t.live_tenant_id IS NOT NULL AS test \
     FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
     JOIN tenants l ON l.id = COALESCE(t.live_tenant_id, t.id) WHERE k.id = $1";

/// Revokes a key not revoked yet: revoking it again changes nothing and is
/// not audited again (issue 41, finding 7).
const REVOKE_KEY: &str = "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";

const KEY_EXISTS: &str = "SELECT count(*) FROM api_keys WHERE id = $1";

const AUDIT_PAGE: &str = "SELECT id, at, actor, key_id, key_label, action, target, detail \
     FROM audit_log ORDER BY id DESC LIMIT $1";

const AUDIT_PAGE_BEFORE: &str = "SELECT id, at, actor, key_id, key_label, action, target, detail \
     FROM audit_log WHERE id < $1 ORDER BY id DESC LIMIT $2";

const TOUCH_KEY: &str = "UPDATE api_keys SET last_used_at = $2 WHERE id = $1";

type AuditRow = (
    Uuid,
    DbTime,
    String,
    Option<Uuid>,
    Option<String>,
    String,
    String,
    String,
);

fn audit_record(r: AuditRow) -> AuditRecord {
    AuditRecord {
        id: r.0,
        at: r.1.0,
        via: r.2,
        key_id: r.3,
        key_label: r.4,
        action: r.5,
        target: r.6,
        detail: serde_json::from_str(&r.7).unwrap_or(serde_json::Value::Null),
    }
}

const TENANT_BY_NAME: &str = "SELECT id, name, created_at, allowed_countries, \
        allowed_senders, quiet_hours, home_country, disabled, verify_channels, \
        spend_cap_daily_micros, \
        spend_cap_monthly_micros, spend_cap_international_daily FROM tenants \
     WHERE name = $1 AND live_tenant_id IS NULL";

per_backend! {
    impl Driver {
        /// Writes audit row `a` in the transaction of the change it records
        /// (for changes made outside the admin API's own writes).
        pub(crate) async fn write_audit(c: &mut Conn, a: &AuditEntry) -> Result<(), sqlx::Error> {
            write_audit(c, a).await
        }
    }

    async fn write_audit(c: &mut Conn, a: &AuditEntry) -> Result<(), sqlx::Error> {
        sqlx::query(INSERT_AUDIT)
            .bind(a.id)
            .bind(db(a.at))
            .bind(a.actor.via)
            .bind(a.actor.key_id)
            .bind(&a.actor.key_label)
            .bind(a.action)
            .bind(&a.target)
            .bind(a.detail.to_string())
            .execute(&mut *c)
            .await?;
        Ok(())
    }

    async fn settings(c: &mut Conn, name: &str) -> Result<Option<TenantSettings>, sqlx::Error> {
        let row: Option<TenantSettingsRow> = sqlx::query_as(TENANT_BY_NAME)
            .bind(name)
            .fetch_optional(&mut *c)
            .await?;
        Ok(row.map(TenantSettings::from))
    }

    #[async_trait]
    impl AdminStore for Driver {
        async fn admin_create_tenant(
            &self,
            name: &str,
            audit: &AuditEntry,
        ) -> Result<TenantSettings, StoreError> {
            let (name, audit) = (name.to_string(), audit.clone());
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
                    write_audit(c, &audit).await?;
                    settings(c, &name)
                        .await?
                        .ok_or(StoreError::Invariant("the tenant just created is not there"))
                })
            })
            .await
        }

        async fn admin_update_tenant(
            &self,
            name: &str,
            patch: &TenantPatch,
            audit: &AuditEntry,
        ) -> Result<Option<TenantSettings>, StoreError> {
            let acks = self.start_acks().await;
            let (name, p, audit) = (name.to_string(), patch.clone(), audit.clone());
            let caps = p.spend_caps.unwrap_or_default();
            let updated = self
                .write_tx(move |c| {
                    Box::pin(async move {
                        let done = sqlx::query(UPDATE_TENANT)
                            .bind(&name)
                            .bind(p.quiet_hours.is_some())
                            .bind(p.quiet_hours.flatten().map(|w| w.to_string()))
                            .bind(p.senders.is_some())
                            .bind(p.senders.clone().flatten().map(StringList))
                            .bind(p.allowed_countries.is_some())
                            .bind(p.allowed_countries.clone().flatten().map(StringList))
                            .bind(p.home_country.is_some())
                            .bind(p.home_country.clone().flatten())
                            .bind(p.disabled.is_some())
                            .bind(p.disabled.unwrap_or(false))
                            .bind(caps.daily.is_some())
                            .bind(caps.daily.flatten())
                            .bind(caps.monthly.is_some())
                            .bind(caps.monthly.flatten())
                            .bind(caps.international_daily_messages.is_some())
                            .bind(caps.international_daily_messages.flatten())
                            .bind(p.verify_channels.is_some())
                            .bind(p.verify_channels.clone().flatten().map(|c| c.stored()))
                            .execute(&mut *c)
                            .await?;
                        if done.rows_affected() == 0 {
                            return Ok(None);
                        }
                        write_audit(c, &audit).await?;
                        Ok(settings(c, &name).await?)
                    })
                })
                .await?;
            if let (Some(acks), Some(_)) = (acks, &updated) {
                acks.wait().await;
            }
            Ok(updated)
        }

        async fn admin_add_key(
            &self,
            tenant_name: &str,
            key: &NewApiKey,
            audit: &AuditEntry,
        ) -> Result<Option<ApiKeyInfo>, StoreError> {
            let (tenant_name, key, audit) = (tenant_name.to_string(), key.clone(), audit.clone());
            self.write_tx(move |c| {
                Box::pin(async move {
                    if key.test {
                        let id = Uuid::now_v7();
                        let made = sqlx::query(ENSURE_SHADOW)
                            .bind(id)
                            .bind(&tenant_name)
                            .execute(&mut *c)
                            .await?;
                        if made.rows_affected() == 1 {
                            sqlx::query(crate::store::shared::opt_outs::INHERIT_CHAT_OPT_OUTS)
                                .bind(id)
                                .execute(&mut *c)
                                .await?;
                        }
                    }
                    let done = sqlx::query(if key.test { ADD_TEST_KEY } else { ADD_KEY })
                        .bind(key.id)
                        .bind(&tenant_name)
                        .bind(&key.hash)
                        .bind(&key.prefix)
                        .bind(key.scopes.to_stored())
                        .bind(&key.label)
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() == 0 {
                        return Ok(None);
                    }
                    write_audit(c, &audit).await?;
                    let row: ApiKeyRow = sqlx::query_as(KEY_BY_ID)
                        .bind(key.id)
                        .fetch_one(&mut *c)
                        .await?;
                    Ok(Some(ApiKeyInfo::from(row)))
                })
            })
            .await
        }

        async fn admin_revoke_key(&self, id: Uuid, audit: &AuditEntry) -> Result<bool, StoreError> {
            let acks = self.start_acks().await;
            let audit = audit.clone();
            // (whether the key exists, whether this revoked it)
            let (exists, changed) = self
                .write_tx(move |c| {
                    Box::pin(async move {
                        let done = sqlx::query(REVOKE_KEY)
                            .bind(id)
                            .bind(db(audit.at))
                            .execute(&mut *c)
                            .await?;
                        if done.rows_affected() == 0 {
                            let n: i64 = sqlx::query_scalar(KEY_EXISTS)
                                .bind(id)
                                .fetch_one(&mut *c)
                                .await?;
                            return Ok((n > 0, false));
                        }
                        write_audit(c, &audit).await?;
                        Ok((true, true))
                    })
                })
                .await?;
            if let Some(acks) = acks
                && changed
            {
                acks.wait().await;
            }
            Ok(exists)
        }

        async fn audit_log(
            &self,
            before: Option<Uuid>,
            limit: u32,
        ) -> Result<Vec<AuditRecord>, StoreError> {
            let limit = i64::from(limit);
            let rows: Vec<AuditRow> = match before {
                None => sqlx::query_as(AUDIT_PAGE).bind(limit).fetch_all(self.pool()).await?,
                Some(b) => {
                    sqlx::query_as(AUDIT_PAGE_BEFORE)
                        .bind(b)
                        .bind(limit)
                        .fetch_all(self.pool())
                        .await?
                }
            };
            Ok(rows.into_iter().map(audit_record).collect())
        }

        async fn touch_key(&self, id: Uuid, at: OffsetDateTime) -> Result<(), StoreError> {
            self.write(move |c| {
                Box::pin(async move {
                    sqlx::query(TOUCH_KEY)
                        .bind(id)
                        .bind(db(at))
                        .execute(&mut *c)
                        .await?;
                    Ok(())
                })
            })
            .await
        }
    }
}
