//! The operator's administration (issue 27): tenants, their settings and
//! keys, and the audit log of every change. The admin API
//! (`src/http/admin.rs`) and the CLI both call [`Admin`], so a change is
//! validated, written with its audit row in one transaction, and reaches
//! every instance (as a key revocation does: the tenant's notification,
//! acknowledged) the same way whoever makes it.

use time::OffsetDateTime;
use uuid::Uuid;

use crate::domain::FieldError;
use crate::scopes::{Scope, Scopes};
use crate::store::{ApiKeyInfo, Store, StoreError, TenantSettings};

pub mod patch;

pub use patch::TenantPatch;

/// Who makes a change, as the audit log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// `api` or `cli`.
    pub via: &'static str,
    pub key_id: Option<Uuid>,
    pub key_label: Option<String>,
    /// The scopes held (the CLI, run against the database, holds all).
    pub scopes: Scopes,
    /// The acting key's tenant (it may not disable itself).
    pub tenant_id: Option<Uuid>,
}

impl Actor {
    pub fn cli() -> Self {
        Actor {
            via: "cli",
            key_id: None,
            key_label: None,
            scopes: Scopes::ALL,
            tenant_id: None,
        }
    }
}

/// One audit row to write with its change.
#[derive(Clone, Debug)]
pub struct AuditEntry {
    pub id: Uuid,
    pub at: OffsetDateTime,
    pub actor: Actor,
    /// What: `tenant.create`, `tenant.update`, `key.create`, `key.revoke`.
    pub action: &'static str,
    /// The tenant's name or the key's id.
    pub target: String,
    /// What was set, as JSON (never a secret).
    pub detail: serde_json::Value,
}

/// An audit row as listed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AuditRecord {
    pub id: Uuid,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub via: String,
    pub key_id: Option<Uuid>,
    pub key_label: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: serde_json::Value,
}

/// A key to create.
#[derive(Clone, Debug)]
pub struct KeySpec {
    pub scopes: Scopes,
    pub label: Option<String>,
    /// A test-mode key (`so_test_`): of the tenant's test namespace, its
    /// messages never reaching a real provider.
    pub test: bool,
}

/// Why an admin change was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("invalid: {0:?}")]
    Invalid(Vec<FieldError>),
    #[error("no such {0}")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("needs scope {0}")]
    Scope(Scope),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The pattern tenant names match (documented in docs/operators.md).
pub const TENANT_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

/// Whether `name` may name a tenant: [`TENANT_NAME_PATTERN`] (it goes into
/// command lines, logs and URLs unquoted).
pub fn valid_tenant_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 64
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Longest key label.
pub const LABEL_MAX: usize = 100;

/// A key label: 1 to 100 printable characters, no control characters.
pub fn valid_label(label: &str) -> bool {
    !label.trim().is_empty()
        && label.chars().count() <= LABEL_MAX
        && !label.chars().any(char::is_control)
}

/// The administration over a store.
pub struct Admin<'a> {
    pub store: &'a dyn Store,
}

impl Admin<'_> {
    fn entry(
        actor: &Actor,
        at: OffsetDateTime,
        action: &'static str,
        target: String,
        detail: serde_json::Value,
    ) -> AuditEntry {
        AuditEntry {
            id: Uuid::now_v7(),
            at,
            actor: actor.clone(),
            action,
            target,
            detail,
        }
    }

    /// Creates a tenant (no key yet).
    pub async fn create_tenant(
        &self,
        actor: &Actor,
        name: &str,
        at: OffsetDateTime,
    ) -> Result<TenantSettings, AdminError> {
        if !valid_tenant_name(name) {
            return Err(AdminError::Invalid(vec![FieldError::new(
                "name",
                format!(
                    "is not a tenant name: 1 to 64 ASCII letters, digits, '.', '_' and '-', \
                     starting with a letter or digit ({TENANT_NAME_PATTERN}, e.g. mobile-backend)"
                ),
            )]));
        }
        let audit = Self::entry(
            actor,
            at,
            "tenant.create",
            name.into(),
            serde_json::json!({}),
        );
        match self.store.admin_create_tenant(name, &audit).await {
            Ok(t) => Ok(t),
            Err(StoreError::Conflict { .. }) => Err(AdminError::Conflict(format!(
                "a tenant named {name:?} already exists"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantSettings, AdminError> {
        self.store
            .tenant_settings()
            .await?
            .into_iter()
            .find(|t| t.name == name)
            .ok_or(AdminError::NotFound("tenant"))
    }

    /// Applies a validated patch; what it set is the audit row's detail.
    pub async fn update_tenant(
        &self,
        actor: &Actor,
        name: &str,
        patch: &TenantPatch,
        at: OffsetDateTime,
    ) -> Result<TenantSettings, AdminError> {
        if patch.disabled == Some(true) && actor.tenant_id.is_some() {
            let t = self.tenant(name).await?;
            if Some(t.id) == actor.tenant_id {
                return Err(AdminError::Conflict(
                    "a key cannot disable its own tenant (it would lock itself out)".into(),
                ));
            }
        }
        let audit = Self::entry(actor, at, "tenant.update", name.into(), patch.to_json());
        self.store
            .admin_update_tenant(name, patch, &audit)
            .await?
            .ok_or(AdminError::NotFound("tenant"))
    }

    /// Creates a key; its secret is returned once.
    pub async fn create_key(
        &self,
        actor: &Actor,
        tenant: &str,
        spec: &KeySpec,
        at: OffsetDateTime,
    ) -> Result<(String, ApiKeyInfo), AdminError> {
        if !crate::scopes::may_grant(actor.scopes, spec.scopes) {
            return Err(AdminError::Scope(Scope::Admin));
        }
        // A test key administers nothing: never one with `admin` (issue 41,
        // finding 5).
        if spec.test && spec.scopes.contains(Scope::Admin) {
            return Err(AdminError::Invalid(vec![FieldError::new(
                "scopes",
                "a test-mode key cannot have the admin scope: leave `admin` out, or make a \
                 live key (\"test\": false) to administer",
            )]));
        }
        let mut key = crate::apikey::generate_in(spec.test);
        key.stored.scopes = spec.scopes;
        key.stored.label.clone_from(&spec.label);
        let audit = Self::entry(
            actor,
            at,
            "key.create",
            tenant.into(),
            serde_json::json!({
                "key_id": key.stored.id,
                "scopes": spec.scopes.iter().map(Scope::as_str).collect::<Vec<_>>(),
                "label": spec.label,
                "test": spec.test,
            }),
        );
        let info = self
            .store
            .admin_add_key(tenant, &key.stored, &audit)
            .await?
            .ok_or(AdminError::NotFound("tenant"))?;
        Ok((key.secret, info))
    }

    pub async fn keys(&self, tenant: &str) -> Result<Vec<ApiKeyInfo>, AdminError> {
        self.tenant(tenant).await?;
        Ok(self
            .store
            .list_keys()
            .await?
            .into_iter()
            .filter(|k| k.tenant_name == tenant)
            .collect())
    }

    /// Revokes a key; it stops on every instance before this returns.
    pub async fn revoke_key(
        &self,
        actor: &Actor,
        id: Uuid,
        at: OffsetDateTime,
    ) -> Result<(), AdminError> {
        let audit = Self::entry(
            actor,
            at,
            "key.revoke",
            id.to_string(),
            serde_json::json!({}),
        );
        if self.store.admin_revoke_key(id, &audit).await? {
            Ok(())
        } else {
            Err(AdminError::NotFound("key"))
        }
    }
}
