//! What the admin API writes (issue 27): each change with its audit row in
//! one transaction, returning once every instance dropped what the change
//! spoils (as a key revocation does).

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::admin::{AuditEntry, AuditRecord, TenantPatch};
use crate::store::{ApiKeyInfo, NewApiKey, StoreError, TenantSettings};

#[async_trait]
pub trait AdminStore: Send + Sync {
    /// Creates a tenant without keys. `Conflict` if the name is taken.
    async fn admin_create_tenant(
        &self,
        name: &str,
        audit: &AuditEntry,
    ) -> Result<TenantSettings, StoreError>;
    /// Applies `patch` to tenant `name`; `None` if there is no such tenant.
    async fn admin_update_tenant(
        &self,
        name: &str,
        patch: &TenantPatch,
        audit: &AuditEntry,
    ) -> Result<Option<TenantSettings>, StoreError>;
    /// Adds a key to tenant `name`; `None` if there is no such tenant.
    async fn admin_add_key(
        &self,
        tenant_name: &str,
        key: &NewApiKey,
        audit: &AuditEntry,
    ) -> Result<Option<ApiKeyInfo>, StoreError>;
    /// Revokes a key; false if there is no such key. A key revoked already
    /// stays as it is, and no second audit row is written.
    async fn admin_revoke_key(&self, id: Uuid, audit: &AuditEntry) -> Result<bool, StoreError>;
    /// The audit log, newest first, from before `before` (an audit id).
    async fn audit_log(
        &self,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError>;
    /// Records that key `id` was used at `at` (the key cache decides when).
    async fn touch_key(&self, id: Uuid, at: OffsetDateTime) -> Result<(), StoreError>;
}
