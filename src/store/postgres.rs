//! The Postgres store.
//!
//! Plain `sqlx::query` with bound parameters (no compile-time checked macros,
//! so building needs no database). Multi-row changes that must happen
//! together are single statements with data-modifying CTEs: one round trip,
//! one commit, atomic.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    ApiKeyInfo, AttemptRow, Claim, Finish, KeyState, Lease, MessageRecord, NewApiKey, NewMessage,
    NewReceipt, OptOut, ReceiptOutcome, ReceiptRow, Reschedule, Store, StoreError, StoredResponse,
    TenantAuth,
};
use crate::domain::{Encoding, MessageError, MessageId, Status};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection before the database is
    /// called unavailable (503): short, so an outage fails fast.
    pub acquire_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Builds a lazily connecting pool: the service starts (and answers 503)
    /// even while the database is down, and recovers when it returns.
    pub fn connect_lazy(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| StoreError::Other(format!("invalid DATABASE_URL: {e}")))?;
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .min_connections(0)
            .acquire_timeout(settings.acquire_timeout)
            // Checking each connection before use costs a round trip per
            // query; a broken connection is discarded on its first error instead.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Maps a driver error to what the service can do about it.
fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        // A connection cut mid-conversation surfaces as a protocol error.
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if code == "23505" {
                StoreError::Conflict(db.message().to_string())
            } else if code.starts_with("08") || code.starts_with("57P") || code == "53300" {
                // connection exceptions, admin shutdown / crash / starting up,
                // too many connections
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Other(e.to_string())
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
}

/// The columns of a message row (`m`), plus its latest attempt's state.
macro_rules! message_columns {
    () => {
        "m.id, m.tenant_id, m.idempotency_key, m.fingerprint, m.status, \
    m.to_number, m.from_sender, m.body, m.segments, m.encoding, m.metadata, m.validity_seconds, \
    m.provider, m.provider_message_id, m.attempts, m.maybe_sent, m.error, m.response_code, m.response_body, \
    m.lease_token, m.lease_owner, m.lease_expires_at, m.next_attempt_at, m.created_at, \
    m.updated_at, m.sent_at, m.delivery_status_at, m.expires_at, m.deadline_at, \
    (SELECT a.started_at FROM attempts a WHERE a.message_id = m.id AND a.number = m.attempts) \
        AS last_attempt_started_at, \
    COALESCE((SELECT a.finished_at IS NULL FROM attempts a \
        WHERE a.message_id = m.id AND a.number = m.attempts), false) AS last_attempt_open, \
    EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = m.tenant_id AND o.number = m.to_number) \
        AS recipient_opted_out"
    };
}

fn record_from_row(row: &sqlx::postgres::PgRow) -> Result<MessageRecord, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::Other(format!("reading a message row: {e}"));
    let status: String = row.try_get("status").map_err(get_err)?;
    let encoding: String = row.try_get("encoding").map_err(get_err)?;
    let metadata: Json<BTreeMap<String, String>> = row.try_get("metadata").map_err(get_err)?;
    let error: Option<Json<MessageError>> = row.try_get("error").map_err(get_err)?;
    let code: Option<i16> = row.try_get("response_code").map_err(get_err)?;
    let body: Option<Vec<u8>> = row.try_get("response_body").map_err(get_err)?;
    let token: Option<Uuid> = row.try_get("lease_token").map_err(get_err)?;
    let owner: Option<String> = row.try_get("lease_owner").map_err(get_err)?;
    let lease_expires_at: Option<OffsetDateTime> =
        row.try_get("lease_expires_at").map_err(get_err)?;
    let segments: i32 = row.try_get("segments").map_err(get_err)?;
    let attempts: i32 = row.try_get("attempts").map_err(get_err)?;
    Ok(MessageRecord {
        id: MessageId(row.try_get("id").map_err(get_err)?),
        tenant_id: row.try_get("tenant_id").map_err(get_err)?,
        idempotency_key: row.try_get("idempotency_key").map_err(get_err)?,
        fingerprint: row.try_get("fingerprint").map_err(get_err)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Other(format!("unknown status {status:?}")))?,
        to: row.try_get("to_number").map_err(get_err)?,
        from: row.try_get("from_sender").map_err(get_err)?,
        body: row.try_get("body").map_err(get_err)?,
        segments: u32::try_from(segments).unwrap_or(0),
        encoding: Encoding::parse(&encoding)
            .ok_or_else(|| StoreError::Other(format!("unknown encoding {encoding:?}")))?,
        metadata: metadata.0,
        validity_seconds: row.try_get("validity_seconds").map_err(get_err)?,
        provider: row.try_get("provider").map_err(get_err)?,
        provider_message_id: row.try_get("provider_message_id").map_err(get_err)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        maybe_sent: row.try_get("maybe_sent").map_err(get_err)?,
        error: error.map(|e| e.0),
        response: response(code, body),
        lease: match (token, owner, lease_expires_at) {
            (Some(token), Some(owner), Some(expires_at)) => Some(Lease {
                token,
                owner,
                expires_at,
            }),
            _ => None,
        },
        next_attempt_at: row.try_get("next_attempt_at").map_err(get_err)?,
        created_at: row.try_get("created_at").map_err(get_err)?,
        updated_at: row.try_get("updated_at").map_err(get_err)?,
        sent_at: row.try_get("sent_at").map_err(get_err)?,
        delivery_status_at: row.try_get("delivery_status_at").map_err(get_err)?,
        expires_at: row.try_get("expires_at").map_err(get_err)?,
        deadline_at: row.try_get("deadline_at").map_err(get_err)?,
        last_attempt_open: row.try_get("last_attempt_open").map_err(get_err)?,
        last_attempt_started_at: row.try_get("last_attempt_started_at").map_err(get_err)?,
        recipient_opted_out: row.try_get("recipient_opted_out").map_err(get_err)?,
    })
}

fn response(code: Option<i16>, body: Option<Vec<u8>>) -> Option<StoredResponse> {
    match (code, body) {
        (Some(code), Some(body)) => Some(StoredResponse {
            status_code: u16::try_from(code).unwrap_or(500),
            body,
        }),
        _ => None,
    }
}

fn key_state_from_row(row: &sqlx::postgres::PgRow) -> Result<KeyState, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::Other(format!("reading a key row: {e}"));
    let status: String = row.try_get("status").map_err(get_err)?;
    Ok(KeyState {
        id: MessageId(row.try_get("id").map_err(get_err)?),
        fingerprint: row.try_get("fingerprint").map_err(get_err)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Other(format!("unknown status {status:?}")))?,
        response: response(
            row.try_get("response_code").map_err(get_err)?,
            row.try_get("response_body").map_err(get_err)?,
        ),
    })
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[async_trait]
impl Store for PgStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(inner) => map_err(inner),
            other => StoreError::Other(other.to_string()),
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(map_err)
    }

    async fn tenant_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT count(*) FROM tenants")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn create_tenant(&self, name: &str, key: &NewApiKey) -> Result<Uuid, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let id = Uuid::now_v7();
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2)")
            .bind(id)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) VALUES ($1, $2, $3, $4)",
        )
        .bind(key.id)
        .bind(id)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(id)
    }

    async fn ensure_tenant_key(&self, name: &str, key: &NewApiKey) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(Uuid::now_v7())
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT $1, t.id, $3, $4 FROM tenants t WHERE t.name = $2 \
             ON CONFLICT (key_hash) DO NOTHING",
        )
        .bind(key.id)
        .bind(name)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)
    }

    #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
        let row: Option<(Uuid, Option<Vec<String>>)> = sqlx::query_as(
            "SELECT k.tenant_id, t.allowed_countries FROM api_keys k \
             JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(row.map(|(id, allowed_countries)| TenantAuth {
            id,
            allowed_countries,
        }))
    }

    async fn list_tenants(&self) -> Result<Vec<(Uuid, String, OffsetDateTime)>, StoreError> {
        let rows = sqlx::query("SELECT id, name, created_at FROM tenants ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("id").map_err(map_err)?,
                    r.try_get("name").map_err(map_err)?,
                    r.try_get("created_at").map_err(map_err)?,
                ))
            })
            .collect()
    }

    async fn add_key(
        &self,
        tenant_name: &str,
        key: &NewApiKey,
    ) -> Result<Option<Uuid>, StoreError> {
        let done = sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT $1, t.id, $3, $4 FROM tenants t WHERE t.name = $2",
        )
        .bind(key.id)
        .bind(tenant_name)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok((done.rows_affected() == 1).then_some(key.id))
    }

    async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
                .bind(key_id)
                .bind(at)
                .execute(&self.pool)
                .await
                .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT k.id, t.name, k.key_prefix, k.created_at, k.revoked_at \
             FROM api_keys k JOIN tenants t ON t.id = k.tenant_id ORDER BY t.name, k.created_at",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                Ok(ApiKeyInfo {
                    id: r.try_get("id").map_err(map_err)?,
                    tenant_name: r.try_get("name").map_err(map_err)?,
                    prefix: r.try_get("key_prefix").map_err(map_err)?,
                    created_at: r.try_get("created_at").map_err(map_err)?,
                    revoked_at: r.try_get("revoked_at").map_err(map_err)?,
                })
            })
            .collect()
    }

    #[tracing::instrument(name = "store.insert_message", level = "debug", skip_all, fields(message_id = %m.id))]
    async fn insert_message(&self, m: &NewMessage, lease: &Lease) -> Result<Claim, StoreError> {
        // A key can be purged between our insert's conflict and our read;
        // then the insert is simply tried again.
        for _ in 0..3 {
            // A new key: the inserted id and whether the recipient opted
            // out. A taken key: that message's state, from the same
            // statement, unless it was committed after this statement's
            // snapshot (then the follow-up read below sees it).
            let row = sqlx::query(
                "WITH ins AS ( \
                    INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                        to_number, from_sender, body, segments, encoding, metadata, \
                        validity_seconds, provider, attempts, lease_token, lease_owner, \
                        lease_expires_at, created_at, updated_at, expires_at, deadline_at) \
                    VALUES ($1, $2, $3, $4, 'processing', $5, $6, $7, $8, $9, $10, $11, $12, 1, \
                        $13, $14, $15, $16, $16, $17, $18) \
                    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
                    RETURNING id), \
                 att AS ( \
                    INSERT INTO attempts (message_id, number, lease_owner, started_at) \
                    SELECT id, 1, $14, $16 FROM ins) \
                 SELECT true AS created, ins.id, NULL::bytea AS fingerprint, \
                    NULL::text AS status, NULL::smallint AS response_code, \
                    NULL::bytea AS response_body, \
                    EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = $2 AND o.number = $5) \
                        AS opted_out \
                 FROM ins \
                 UNION ALL \
                 SELECT false, m.id, m.fingerprint, m.status, m.response_code, m.response_body, \
                    false \
                 FROM messages m \
                 WHERE m.tenant_id = $2 AND m.idempotency_key = $3 \
                    AND NOT EXISTS (SELECT 1 FROM ins)",
            )
            .bind(m.id.0)
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .bind(&m.fingerprint)
            .bind(&m.to)
            .bind(&m.from)
            .bind(&m.body)
            .bind(to_i32(m.segments))
            .bind(m.encoding.as_str())
            .bind(Json(&m.metadata))
            .bind(m.validity_seconds)
            .bind(&m.provider)
            .bind(lease.token)
            .bind(&lease.owner)
            .bind(lease.expires_at)
            .bind(m.created_at)
            .bind(m.expires_at)
            .bind(m.deadline_at)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
            if let Some(row) = row {
                let created: bool = row.try_get("created").map_err(map_err)?;
                if created {
                    let opted_out: bool = row.try_get("opted_out").map_err(map_err)?;
                    return Ok(Claim::Created(Box::new(MessageRecord::claimed(
                        m, lease, opted_out,
                    ))));
                }
                return Ok(Claim::Existing(key_state_from_row(&row)?));
            }
            if let Some(state) = self.key_state(m.tenant_id, &m.idempotency_key).await? {
                return Ok(Claim::Existing(state));
            }
        }
        Err(StoreError::Other(
            "the key was taken and released three times in a row".into(),
        ))
    }

    #[tracing::instrument(name = "store.key_state", level = "debug", skip_all)]
    async fn key_state(&self, tenant_id: Uuid, key: &str) -> Result<Option<KeyState>, StoreError> {
        let row = sqlx::query(
            "SELECT id, fingerprint, status, response_code, response_body FROM messages \
             WHERE tenant_id = $1 AND idempotency_key = $2",
        )
        .bind(tenant_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(key_state_from_row).transpose()
    }

    #[tracing::instrument(name = "store.state_by_id", level = "debug", skip_all, fields(message_id = %id))]
    async fn state_by_id(&self, id: MessageId) -> Result<Option<KeyState>, StoreError> {
        let row = sqlx::query(
            "SELECT id, fingerprint, status, response_code, response_body FROM messages \
             WHERE id = $1",
        )
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(key_state_from_row).transpose()
    }

    #[tracing::instrument(name = "store.message", level = "debug", skip_all)]
    async fn message(
        &self,
        tenant_id: Uuid,
        key: &str,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            message_columns!(),
            " FROM messages m WHERE m.tenant_id = $1 AND m.idempotency_key = $2"
        ))
        .bind(tenant_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(record_from_row).transpose()
    }

    #[tracing::instrument(name = "store.message_by_id", level = "debug", skip_all, fields(message_id = %id))]
    async fn message_by_id(&self, id: MessageId) -> Result<Option<MessageRecord>, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            message_columns!(),
            " FROM messages m WHERE m.id = $1"
        ))
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(record_from_row).transpose()
    }

    async fn attempts(&self, id: MessageId) -> Result<Vec<AttemptRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT number, lease_owner, started_at, finished_at, outcome, http_status, \
             provider_code, error, provider_message_id FROM attempts \
             WHERE message_id = $1 ORDER BY number",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                let number: i32 = r.try_get("number").map_err(map_err)?;
                let http_status: Option<i32> = r.try_get("http_status").map_err(map_err)?;
                Ok(AttemptRow {
                    number: u32::try_from(number).unwrap_or(0),
                    lease_owner: r.try_get("lease_owner").map_err(map_err)?,
                    started_at: r.try_get("started_at").map_err(map_err)?,
                    finished_at: r.try_get("finished_at").map_err(map_err)?,
                    outcome: r.try_get("outcome").map_err(map_err)?,
                    http_status: http_status.and_then(|s| u16::try_from(s).ok()),
                    provider_code: r.try_get("provider_code").map_err(map_err)?,
                    error: r.try_get("error").map_err(map_err)?,
                    provider_message_id: r.try_get("provider_message_id").map_err(map_err)?,
                })
            })
            .collect()
    }

    #[tracing::instrument(name = "store.start_attempt", level = "debug", skip_all, fields(message_id = %id))]
    async fn start_attempt(
        &self,
        id: MessageId,
        lease: &Lease,
        now: OffsetDateTime,
    ) -> Result<Option<u32>, StoreError> {
        let number: Option<i32> = sqlx::query_scalar(
            "WITH m AS ( \
                UPDATE messages SET attempts = attempts + 1, lease_expires_at = $3, \
                    next_attempt_at = NULL, updated_at = $4, \
                    maybe_sent = maybe_sent OR EXISTS (SELECT 1 FROM attempts o \
                        WHERE o.message_id = $1 AND o.finished_at IS NULL) \
                WHERE id = $1 AND lease_token = $2 AND status = 'processing' \
                RETURNING id, attempts), \
             closed AS ( \
                UPDATE attempts SET finished_at = $4, outcome = 'lost', \
                    error = 'the instance making this attempt stopped before recording an answer' \
                WHERE message_id = (SELECT id FROM m) AND finished_at IS NULL), \
             a AS ( \
                INSERT INTO attempts (message_id, number, lease_owner, started_at) \
                SELECT id, attempts, $5, $4 FROM m) \
             SELECT attempts FROM m",
        )
        .bind(id.0)
        .bind(lease.token)
        .bind(lease.expires_at)
        .bind(now)
        .bind(&lease.owner)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(number.map(|n| u32::try_from(n).unwrap_or(0)))
    }

    #[tracing::instrument(name = "store.renew_lease", level = "debug", skip_all, fields(message_id = %id))]
    async fn renew_lease(&self, id: MessageId, lease: &Lease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET lease_expires_at = $3 \
             WHERE id = $1 AND lease_token = $2 AND status = 'processing'",
        )
        .bind(id.0)
        .bind(lease.token)
        .bind(lease.expires_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    #[tracing::instrument(name = "store.finish", level = "debug", skip_all, fields(message_id = %f.id, status = f.status.as_str()))]
    async fn finish(&self, f: &Finish) -> Result<bool, StoreError> {
        let a = f.attempt.as_ref();
        let n: i64 = sqlx::query_scalar(
            "WITH m AS ( \
                UPDATE messages SET status = $3, provider_message_id = $4, error = $5, \
                    sent_at = $6, updated_at = $7, finalized_at = $7, response_code = $8, \
                    response_body = $9, lease_token = NULL, lease_owner = NULL, \
                    lease_expires_at = NULL, next_attempt_at = NULL \
                WHERE id = $1 AND lease_token = $2 AND status = 'processing' \
                RETURNING id), \
             a AS ( \
                UPDATE attempts SET finished_at = $11, outcome = $12, http_status = $13, \
                    provider_code = $14, error = $15, provider_message_id = $16 \
                WHERE message_id = (SELECT id FROM m) AND number = $10 AND finished_at IS NULL) \
             SELECT count(*) FROM m",
        )
        .bind(f.id.0)
        .bind(f.lease_token)
        .bind(f.status.as_str())
        .bind(&f.provider_message_id)
        .bind(f.error.as_ref().map(Json))
        .bind(f.sent_at)
        .bind(f.updated_at)
        .bind(i16::try_from(f.response.status_code).unwrap_or(500))
        .bind(&f.response.body)
        .bind(a.map(|a| to_i32(a.number)).unwrap_or(-1))
        .bind(a.map(|a| a.finished_at))
        .bind(a.map(|a| a.outcome.as_str()))
        .bind(a.and_then(|a| a.http_status.map(i32::from)))
        .bind(a.and_then(|a| a.provider_code.clone()))
        .bind(a.and_then(|a| a.error.clone()))
        .bind(a.and_then(|a| a.provider_message_id.clone()))
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(n == 1)
    }

    #[tracing::instrument(name = "store.reschedule", level = "debug", skip_all, fields(message_id = %r.id))]
    async fn reschedule(&self, r: &Reschedule) -> Result<bool, StoreError> {
        let a = &r.attempt;
        let n: i64 = sqlx::query_scalar(
            "WITH m AS ( \
                UPDATE messages SET next_attempt_at = $3, updated_at = $4, error = $5, \
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                    maybe_sent = maybe_sent OR $8 = 'ambiguous' \
                WHERE id = $1 AND lease_token = $2 AND status = 'processing' \
                RETURNING id), \
             a AS ( \
                UPDATE attempts SET finished_at = $7, outcome = $8, http_status = $9, \
                    provider_code = $10, error = $11, provider_message_id = $12 \
                WHERE message_id = (SELECT id FROM m) AND number = $6 AND finished_at IS NULL) \
             SELECT count(*) FROM m",
        )
        .bind(r.id.0)
        .bind(r.lease_token)
        .bind(r.next_attempt_at)
        .bind(r.updated_at)
        .bind(r.error.as_ref().map(Json))
        .bind(to_i32(a.number))
        .bind(a.finished_at)
        .bind(a.outcome.as_str())
        .bind(a.http_status.map(i32::from))
        .bind(&a.provider_code)
        .bind(&a.error)
        .bind(&a.provider_message_id)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(n == 1)
    }

    #[tracing::instrument(name = "store.claim_due", level = "debug", skip_all, fields(limit = limit))]
    async fn claim_due(
        &self,
        owner: &str,
        now: OffsetDateTime,
        lease_expires_at: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<(MessageRecord, Lease)>, StoreError> {
        // SKIP LOCKED: two claimers scanning at once never wait for, nor get,
        // the same row; the lock is held only for this statement.
        let rows = sqlx::query(concat!(
            "UPDATE messages m SET lease_token = gen_random_uuid(), lease_owner = $1, \
                lease_expires_at = $3 \
             WHERE m.id IN ( \
                SELECT id FROM messages \
                WHERE status = 'processing' \
                  AND ((lease_token IS NULL AND next_attempt_at <= $2) \
                       OR lease_expires_at <= $2) \
                ORDER BY COALESCE(next_attempt_at, lease_expires_at) \
                LIMIT $4 FOR UPDATE SKIP LOCKED) \
             RETURNING ",
            message_columns!()
        ))
        .bind(owner)
        .bind(now)
        .bind(lease_expires_at)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let record = record_from_row(row)?;
                let lease = record
                    .lease
                    .clone()
                    .ok_or_else(|| StoreError::Other("claimed row without a lease".into()))?;
                Ok((record, lease))
            })
            .collect()
    }

    #[tracing::instrument(name = "store.release_leases", level = "debug", skip_all)]
    async fn release_leases(&self, owner: &str, now: OffsetDateTime) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                next_attempt_at = $2 \
             WHERE lease_owner = $1 AND status = 'processing'",
        )
        .bind(owner)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(name = "store.purge", level = "debug", skip_all)]
    async fn purge(&self, cutoff: OffsetDateTime, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM messages WHERE id IN ( \
                SELECT id FROM messages WHERE created_at < $1 AND status <> 'processing' \
                ORDER BY created_at LIMIT $2)",
        )
        .bind(cutoff)
        .bind(i64::from(batch))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn oldest_processing(&self) -> Result<Option<OffsetDateTime>, StoreError> {
        sqlx::query_scalar("SELECT min(created_at) FROM messages WHERE status = 'processing'")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    // Receipts and events.
    async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        lock_receipts(&mut tx, &r.provider, &r.provider_message_id).await?;
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO receipts (provider, event_id, provider_message_id, provider_status, \
                status, error_code, received_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (provider, event_id) DO NOTHING RETURNING seq",
        )
        .bind(&r.provider)
        .bind(&r.event_id)
        .bind(&r.provider_message_id)
        .bind(&r.provider_status)
        .bind(r.status.map(Status::as_str))
        .bind(&r.error_code)
        .bind(r.received_at)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if inserted.is_none() {
            let earlier: Option<Option<Uuid>> = sqlx::query_scalar(
                "SELECT message_id FROM receipts WHERE provider = $1 AND event_id = $2",
            )
            .bind(&r.provider)
            .bind(&r.event_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            tx.commit().await.map_err(map_err)?;
            return Ok(ReceiptOutcome {
                duplicate: true,
                message_id: earlier.flatten().map(MessageId),
                applied: false,
            });
        }
        let (message_id, applied) =
            link_and_apply_receipts(&mut tx, &r.provider, &r.provider_message_id, r.received_at)
                .await?;
        tx.commit().await.map_err(map_err)?;
        Ok(ReceiptOutcome {
            duplicate: false,
            message_id,
            applied,
        })
    }

    async fn has_unmatched_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM receipts \
             WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL)",
        )
        .bind(provider)
        .bind(provider_message_id)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)
    }

    async fn attach_receipts(
        &self,
        provider: &str,
        provider_message_id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        lock_receipts(&mut tx, provider, provider_message_id).await?;
        let (_, applied) =
            link_and_apply_receipts(&mut tx, provider, provider_message_id, now).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(applied)
    }

    async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT provider, event_id, provider_message_id, message_id, provider_status, \
                status, error_code, applied, received_at \
             FROM receipts WHERE message_id = $1 ORDER BY seq",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(receipt_from_row).collect()
    }

    async fn unmatched_receipts(&self, limit: u32) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT provider, event_id, provider_message_id, message_id, provider_status, \
                status, error_code, applied, received_at \
             FROM receipts WHERE message_id IS NULL ORDER BY seq DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(receipt_from_row).collect()
    }

    async fn purge_unmatched_receipts(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM receipts WHERE seq IN ( \
                SELECT seq FROM receipts WHERE message_id IS NULL AND received_at < $1 \
                ORDER BY received_at LIMIT $2)",
        )
        .bind(cutoff)
        .bind(i64::from(batch))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    // Tenant settings and opt-outs.
    async fn set_allowed_countries(
        &self,
        tenant_name: &str,
        countries: Option<&[String]>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE tenants SET allowed_countries = $2 WHERE name = $1")
            .bind(tenant_name)
            .bind(countries)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn add_opt_out(
        &self,
        tenant_id: Uuid,
        number: &str,
        source: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO opt_outs (tenant_id, number, source, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, number) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(number)
        .bind(source)
        .bind(at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn remove_opt_out(&self, tenant_id: Uuid, number: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM opt_outs WHERE tenant_id = $1 AND number = $2")
            .bind(tenant_id)
            .bind(number)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_opt_outs(
        &self,
        tenant_id: Uuid,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OptOut>, StoreError> {
        let rows: Vec<(String, String, OffsetDateTime)> = sqlx::query_as(
            "SELECT number, source, created_at FROM opt_outs \
             WHERE tenant_id = $1 AND ($2::text IS NULL OR number > $2) \
             ORDER BY number LIMIT $3",
        )
        .bind(tenant_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(rows
            .into_iter()
            .map(|(number, source, created_at)| OptOut {
                number,
                source,
                created_at,
            })
            .collect())
    }
}

// Receipts and events: helpers.

fn receipt_from_row(row: &sqlx::postgres::PgRow) -> Result<ReceiptRow, StoreError> {
    let status: Option<String> = row.try_get("status").map_err(map_err)?;
    let message_id: Option<Uuid> = row.try_get("message_id").map_err(map_err)?;
    Ok(ReceiptRow {
        provider: row.try_get("provider").map_err(map_err)?,
        event_id: row.try_get("event_id").map_err(map_err)?,
        provider_message_id: row.try_get("provider_message_id").map_err(map_err)?,
        message_id: message_id.map(|id| MessageId(id).to_string()),
        provider_status: row.try_get("provider_status").map_err(map_err)?,
        status: status.as_deref().and_then(Status::parse),
        error_code: row.try_get("error_code").map_err(map_err)?,
        applied: row.try_get("applied").map_err(map_err)?,
        received_at: row.try_get("received_at").map_err(map_err)?,
    })
}

/// Serialises everything that links or applies receipts of one provider
/// message id, until the transaction ends: a receipt and the delivery task's
/// write of that id can then never miss each other.
async fn lock_receipts(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    provider: &str,
    provider_message_id: &str,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!(
            "sendonce.receipts:{provider}:{provider_message_id}"
        ))
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Links the unlinked receipts of a provider message id to its message and
/// moves a `sent` message to the first final delivery status reported.
/// Returns the message (if any) and whether its status moved.
async fn link_and_apply_receipts(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    provider: &str,
    provider_message_id: &str,
    now: OffsetDateTime,
) -> Result<(Option<MessageId>, bool), StoreError> {
    let message: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, status FROM messages WHERE provider = $1 AND provider_message_id = $2 \
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(provider)
    .bind(provider_message_id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some((id, status)) = message else {
        return Ok((None, false));
    };
    sqlx::query(
        "UPDATE receipts SET message_id = $3 \
         WHERE provider = $1 AND provider_message_id = $2 AND message_id IS NULL",
    )
    .bind(provider)
    .bind(provider_message_id)
    .bind(id)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if status != Status::Sent.as_str() {
        return Ok((Some(MessageId(id)), false));
    }
    let first: Option<(i64, String, String, Option<String>, OffsetDateTime)> = sqlx::query_as(
        "SELECT seq, status, provider_status, error_code, received_at FROM receipts \
         WHERE message_id = $1 AND status IN ('delivered', 'undelivered') \
         ORDER BY seq LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some((seq, new_status, provider_status, error_code, received_at)) = first else {
        return Ok((Some(MessageId(id)), false));
    };
    let error = (new_status == Status::Undelivered.as_str())
        .then(|| super::delivery_error(&provider_status, error_code.as_deref()));
    let done = sqlx::query(
        "UPDATE messages SET status = $2, delivery_status_at = $3, \
            updated_at = GREATEST(updated_at, $4), error = COALESCE($5, error) \
         WHERE id = $1 AND status = 'sent'",
    )
    .bind(id)
    .bind(&new_status)
    .bind(received_at)
    .bind(now)
    .bind(error.map(Json))
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if done.rows_affected() == 1 {
        sqlx::query("UPDATE receipts SET applied = true WHERE seq = $1")
            .bind(seq)
            .execute(&mut **tx)
            .await
            .map_err(map_err)?;
    }
    Ok((Some(MessageId(id)), done.rows_affected() == 1))
}
