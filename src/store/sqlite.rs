//! The SQLite store: the embedded default, for one instance.
//!
//! Same semantics as Postgres, different means. SQLite has one writer at a
//! time, so multi-row changes are `BEGIN IMMEDIATE` transactions (they take
//! the write lock up front and never fail half-way on a lock upgrade), and
//! claiming due rows needs no `SKIP LOCKED`: the write lock already hands
//! each row to one claimer. WAL mode lets readers (replays, GETs) run beside
//! the writer; a busy timeout makes writers queue instead of failing. Times
//! are stored as integer microseconds since the epoch so that comparisons
//! are numeric.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::ErrorKind;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    ApiKeyInfo, AttemptResult, AttemptRow, Claim, Finish, KeyState, Lease, MessageRecord,
    NewApiKey, NewMessage, NewReceipt, OptOut, ReceiptOutcome, ReceiptRow, Reschedule, Store,
    StoreError, StoredResponse, TenantAuth,
};
use crate::domain::{Encoding, MessageError, MessageId, Status};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`).
    pub fn connect_lazy(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Other(format!("invalid DATABASE_URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL: a commit survives a process crash; only an OS
            // crash or power loss can lose the last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)
    }
}

fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if db.kind() == ErrorKind::UniqueViolation {
                StoreError::Conflict(db.message().to_string())
            } else if matches!(code.as_ref(), "5" | "6" | "261" | "262" | "517") {
                // SQLITE_BUSY / SQLITE_LOCKED and their extended codes.
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Other(e.to_string())
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
}

/// Microseconds since the epoch.
fn us(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX)
}

fn us_opt(t: Option<OffsetDateTime>) -> Option<i64> {
    t.map(us)
}

fn from_us(v: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(v) * 1_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn get<'r, T>(row: &'r SqliteRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(name)
        .map_err(|e| StoreError::Other(format!("reading column {name}: {e}")))
}

fn time(row: &SqliteRow, name: &str) -> Result<OffsetDateTime, StoreError> {
    get::<i64>(row, name).map(from_us)
}

fn time_opt(row: &SqliteRow, name: &str) -> Result<Option<OffsetDateTime>, StoreError> {
    get::<Option<i64>>(row, name).map(|v| v.map(from_us))
}

macro_rules! message_columns {
    () => {
        "m.id, m.tenant_id, m.idempotency_key, m.fingerprint, m.status, \
        m.to_number, m.from_sender, m.body, m.segments, m.encoding, m.metadata, m.validity_seconds, \
        m.provider, m.provider_message_id, m.attempts, m.maybe_sent, m.error, m.response_code, \
        m.response_body, m.lease_token, m.lease_owner, m.lease_expires_at, m.next_attempt_at, \
        m.created_at, m.updated_at, m.sent_at, m.delivery_status_at, m.expires_at, m.deadline_at, \
        (SELECT a.started_at FROM attempts a WHERE a.message_id = m.id AND a.number = m.attempts) \
            AS last_attempt_started_at, \
        COALESCE((SELECT a.finished_at IS NULL FROM attempts a \
            WHERE a.message_id = m.id AND a.number = m.attempts), 0) AS last_attempt_open, \
        EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = m.tenant_id \
            AND o.number = m.to_number) AS recipient_opted_out"
    };
}

fn record_from_row(row: &SqliteRow) -> Result<MessageRecord, StoreError> {
    let status: String = get(row, "status")?;
    let encoding: String = get(row, "encoding")?;
    let metadata: String = get(row, "metadata")?;
    let error: Option<String> = get(row, "error")?;
    let token: Option<Uuid> = get(row, "lease_token")?;
    let owner: Option<String> = get(row, "lease_owner")?;
    let lease_expires_at = time_opt(row, "lease_expires_at")?;
    let segments: i64 = get(row, "segments")?;
    let attempts: i64 = get(row, "attempts")?;
    Ok(MessageRecord {
        id: MessageId(get(row, "id")?),
        tenant_id: get(row, "tenant_id")?,
        idempotency_key: get(row, "idempotency_key")?,
        fingerprint: get(row, "fingerprint")?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Other(format!("unknown status {status:?}")))?,
        to: get(row, "to_number")?,
        from: get(row, "from_sender")?,
        body: get(row, "body")?,
        segments: u32::try_from(segments).unwrap_or(0),
        encoding: Encoding::parse(&encoding)
            .ok_or_else(|| StoreError::Other(format!("unknown encoding {encoding:?}")))?,
        metadata: serde_json::from_str::<BTreeMap<String, String>>(&metadata)
            .map_err(|e| StoreError::Other(format!("reading metadata: {e}")))?,
        validity_seconds: get(row, "validity_seconds")?,
        provider: get(row, "provider")?,
        provider_message_id: get(row, "provider_message_id")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        maybe_sent: get(row, "maybe_sent")?,
        error: error
            .map(|e| serde_json::from_str::<MessageError>(&e))
            .transpose()
            .map_err(|e| StoreError::Other(format!("reading error: {e}")))?,
        response: response(get(row, "response_code")?, get(row, "response_body")?),
        lease: match (token, owner, lease_expires_at) {
            (Some(token), Some(owner), Some(expires_at)) => Some(Lease {
                token,
                owner,
                expires_at,
            }),
            _ => None,
        },
        next_attempt_at: time_opt(row, "next_attempt_at")?,
        created_at: time(row, "created_at")?,
        updated_at: time(row, "updated_at")?,
        sent_at: time_opt(row, "sent_at")?,
        delivery_status_at: time_opt(row, "delivery_status_at")?,
        expires_at: time_opt(row, "expires_at")?,
        deadline_at: time(row, "deadline_at")?,
        last_attempt_open: get(row, "last_attempt_open")?,
        recipient_opted_out: get(row, "recipient_opted_out")?,
        last_attempt_started_at: time_opt(row, "last_attempt_started_at")?,
    })
}

fn response(code: Option<i64>, body: Option<Vec<u8>>) -> Option<StoredResponse> {
    match (code, body) {
        (Some(code), Some(body)) => Some(StoredResponse {
            status_code: u16::try_from(code).unwrap_or(500),
            body,
        }),
        _ => None,
    }
}

fn key_state_from_row(row: &SqliteRow) -> Result<KeyState, StoreError> {
    let status: String = get(row, "status")?;
    Ok(KeyState {
        id: MessageId(get(row, "id")?),
        fingerprint: get(row, "fingerprint")?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Other(format!("unknown status {status:?}")))?,
        response: response(get(row, "response_code")?, get(row, "response_body")?),
    })
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Closes an open attempt with its result (inside the caller's transaction).
async fn close_attempt(
    tx: &mut sqlx::SqliteConnection,
    id: MessageId,
    a: &AttemptResult,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE attempts SET finished_at = ?, outcome = ?, http_status = ?, provider_code = ?, \
         error = ?, provider_message_id = ? \
         WHERE message_id = ? AND number = ? AND finished_at IS NULL",
    )
    .bind(us(a.finished_at))
    .bind(a.outcome.as_str())
    .bind(a.http_status.map(i64::from))
    .bind(&a.provider_code)
    .bind(&a.error)
    .bind(&a.provider_message_id)
    .bind(id.0)
    .bind(i64::from(a.number))
    .execute(tx)
    .await
    .map_err(map_err)?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
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
        let mut tx = self.begin().await?;
        let id = Uuid::now_v7();
        sqlx::query("INSERT INTO tenants (id, name) VALUES (?, ?)")
            .bind(id)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) VALUES (?, ?, ?, ?)",
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
        let mut tx = self.begin().await?;
        sqlx::query("INSERT INTO tenants (id, name) VALUES (?, ?) ON CONFLICT (name) DO NOTHING")
            .bind(Uuid::now_v7())
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT ?, t.id, ?, ? FROM tenants t WHERE t.name = ? \
             ON CONFLICT (key_hash) DO NOTHING",
        )
        .bind(key.id)
        .bind(&key.hash)
        .bind(&key.prefix)
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)
    }

    #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
        let row: Option<(Uuid, Option<String>)> = sqlx::query_as(
            "SELECT k.tenant_id, t.allowed_countries FROM api_keys k \
             JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_hash = ? AND k.revoked_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(row.map(|(id, countries)| TenantAuth {
            id,
            allowed_countries: countries.map(|c| {
                c.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            }),
        }))
    }

    async fn list_tenants(&self) -> Result<Vec<(Uuid, String, OffsetDateTime)>, StoreError> {
        let rows = sqlx::query("SELECT id, name, created_at FROM tenants ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
        rows.iter()
            .map(|r| Ok((get(r, "id")?, get(r, "name")?, time(r, "created_at")?)))
            .collect()
    }

    async fn add_key(
        &self,
        tenant_name: &str,
        key: &NewApiKey,
    ) -> Result<Option<Uuid>, StoreError> {
        let done = sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT ?, t.id, ?, ? FROM tenants t WHERE t.name = ?",
        )
        .bind(key.id)
        .bind(&key.hash)
        .bind(&key.prefix)
        .bind(tenant_name)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok((done.rows_affected() == 1).then_some(key.id))
    }

    async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?")
                .bind(us(at))
                .bind(key_id)
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
                    id: get(r, "id")?,
                    tenant_name: get(r, "name")?,
                    prefix: get(r, "key_prefix")?,
                    created_at: time(r, "created_at")?,
                    revoked_at: time_opt(r, "revoked_at")?,
                })
            })
            .collect()
    }

    #[tracing::instrument(name = "store.insert_message", level = "debug", skip_all, fields(message_id = %m.id))]
    async fn insert_message(&self, m: &NewMessage, lease: &Lease) -> Result<Claim, StoreError> {
        for _ in 0..3 {
            let mut tx = self.begin().await?;
            let inserted: Option<Uuid> = sqlx::query_scalar(
                "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                    to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
                    provider, attempts, lease_token, lease_owner, lease_expires_at, created_at, \
                    updated_at, expires_at, deadline_at) \
                 VALUES (?, ?, ?, ?, 'processing', ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id",
            )
            .bind(m.id.0)
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .bind(&m.fingerprint)
            .bind(&m.to)
            .bind(&m.from)
            .bind(&m.body)
            .bind(i64::from(m.segments))
            .bind(m.encoding.as_str())
            .bind(json(&m.metadata))
            .bind(m.validity_seconds)
            .bind(&m.provider)
            .bind(lease.token)
            .bind(&lease.owner)
            .bind(us(lease.expires_at))
            .bind(us(m.created_at))
            .bind(us(m.created_at))
            .bind(us_opt(m.expires_at))
            .bind(us(m.deadline_at))
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            if inserted.is_some() {
                sqlx::query(
                    "INSERT INTO attempts (message_id, number, lease_owner, started_at) \
                     VALUES (?, 1, ?, ?)",
                )
                .bind(m.id.0)
                .bind(&lease.owner)
                .bind(us(m.created_at))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
                let opted_out: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM opt_outs WHERE tenant_id = ? AND number = ?)",
                )
                .bind(m.tenant_id)
                .bind(&m.to)
                .fetch_one(&mut *tx)
                .await
                .map_err(map_err)?;
                tx.commit().await.map_err(map_err)?;
                return Ok(Claim::Created(Box::new(MessageRecord::claimed(
                    m, lease, opted_out,
                ))));
            }
            // Under the write lock the taken key's row is there to read.
            let row = sqlx::query(
                "SELECT id, fingerprint, status, response_code, response_body FROM messages \
                 WHERE tenant_id = ? AND idempotency_key = ?",
            )
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            tx.rollback().await.map_err(map_err)?;
            if let Some(row) = row {
                return Ok(Claim::Existing(key_state_from_row(&row)?));
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
             WHERE tenant_id = ? AND idempotency_key = ?",
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
            "SELECT id, fingerprint, status, response_code, response_body FROM messages WHERE id = ?",
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
            " FROM messages m WHERE m.tenant_id = ? AND m.idempotency_key = ?"
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
            " FROM messages m WHERE m.id = ?"
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
             WHERE message_id = ? ORDER BY number",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                let number: i64 = get(r, "number")?;
                let http_status: Option<i64> = get(r, "http_status")?;
                Ok(AttemptRow {
                    number: u32::try_from(number).unwrap_or(0),
                    lease_owner: get(r, "lease_owner")?,
                    started_at: time(r, "started_at")?,
                    finished_at: time_opt(r, "finished_at")?,
                    outcome: get(r, "outcome")?,
                    http_status: http_status.and_then(|s| u16::try_from(s).ok()),
                    provider_code: get(r, "provider_code")?,
                    error: get(r, "error")?,
                    provider_message_id: get(r, "provider_message_id")?,
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
        let mut tx = self.begin().await?;
        let number: Option<i64> = sqlx::query_scalar(
            "UPDATE messages SET attempts = attempts + 1, lease_expires_at = ?, \
                next_attempt_at = NULL, updated_at = ?, \
                maybe_sent = maybe_sent OR EXISTS (SELECT 1 FROM attempts o \
                    WHERE o.message_id = messages.id AND o.finished_at IS NULL) \
             WHERE id = ? AND lease_token = ? AND status = 'processing' RETURNING attempts",
        )
        .bind(us(lease.expires_at))
        .bind(us(now))
        .bind(id.0)
        .bind(lease.token)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(number) = number else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(None);
        };
        sqlx::query(
            "UPDATE attempts SET finished_at = ?, outcome = 'lost', \
                error = 'the instance making this attempt stopped before recording an answer' \
             WHERE message_id = ? AND finished_at IS NULL",
        )
        .bind(us(now))
        .bind(id.0)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        sqlx::query("INSERT INTO attempts (message_id, number, lease_owner, started_at) VALUES (?, ?, ?, ?)")
            .bind(id.0)
            .bind(number)
            .bind(&lease.owner)
            .bind(us(now))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(Some(u32::try_from(number).unwrap_or(0)))
    }

    #[tracing::instrument(name = "store.renew_lease", level = "debug", skip_all, fields(message_id = %id))]
    async fn renew_lease(&self, id: MessageId, lease: &Lease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET lease_expires_at = ? \
             WHERE id = ? AND lease_token = ? AND status = 'processing'",
        )
        .bind(us(lease.expires_at))
        .bind(id.0)
        .bind(lease.token)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    #[tracing::instrument(name = "store.finish", level = "debug", skip_all, fields(message_id = %f.id, status = f.status.as_str()))]
    async fn finish(&self, f: &Finish) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE messages SET status = ?, provider_message_id = ?, error = ?, sent_at = ?, \
                updated_at = ?, finalized_at = ?, response_code = ?, response_body = ?, \
                lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                next_attempt_at = NULL \
             WHERE id = ? AND lease_token = ? AND status = 'processing'",
        )
        .bind(f.status.as_str())
        .bind(&f.provider_message_id)
        .bind(f.error.as_ref().map(json))
        .bind(us_opt(f.sent_at))
        .bind(us(f.updated_at))
        .bind(us(f.updated_at))
        .bind(i64::from(f.response.status_code))
        .bind(&f.response.body)
        .bind(f.id.0)
        .bind(f.lease_token)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if done.rows_affected() != 1 {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        if let Some(a) = &f.attempt {
            close_attempt(&mut tx, f.id, a).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    #[tracing::instrument(name = "store.reschedule", level = "debug", skip_all, fields(message_id = %r.id))]
    async fn reschedule(&self, r: &Reschedule) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE messages SET next_attempt_at = ?, updated_at = ?, error = ?, \
                lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                maybe_sent = maybe_sent OR ? \
             WHERE id = ? AND lease_token = ? AND status = 'processing'",
        )
        .bind(us(r.next_attempt_at))
        .bind(us(r.updated_at))
        .bind(r.error.as_ref().map(json))
        .bind(r.attempt.outcome.maybe_sent())
        .bind(r.id.0)
        .bind(r.lease_token)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if done.rows_affected() != 1 {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        close_attempt(&mut tx, r.id, &r.attempt).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    #[tracing::instrument(name = "store.claim_due", level = "debug", skip_all, fields(limit = limit))]
    async fn claim_due(
        &self,
        owner: &str,
        now: OffsetDateTime,
        lease_expires_at: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<(MessageRecord, Lease)>, StoreError> {
        // The write lock taken by BEGIN IMMEDIATE makes this claim exclusive.
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM messages \
             WHERE status = 'processing' \
               AND ((lease_token IS NULL AND next_attempt_at <= ?) OR lease_expires_at <= ?) \
             ORDER BY COALESCE(next_attempt_at, lease_expires_at) LIMIT ?",
        )
        .bind(us(now))
        .bind(us(now))
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let mut claimed = Vec::with_capacity(ids.len());
        for id in ids {
            let lease = Lease {
                token: Uuid::new_v4(),
                owner: owner.to_string(),
                expires_at: lease_expires_at,
            };
            sqlx::query(
                "UPDATE messages SET lease_token = ?, lease_owner = ?, lease_expires_at = ? WHERE id = ?",
            )
            .bind(lease.token)
            .bind(&lease.owner)
            .bind(us(lease.expires_at))
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            let row = sqlx::query(concat!(
                "SELECT ",
                message_columns!(),
                " FROM messages m WHERE m.id = ?"
            ))
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
            claimed.push((record_from_row(&row)?, lease));
        }
        tx.commit().await.map_err(map_err)?;
        Ok(claimed)
    }

    #[tracing::instrument(name = "store.release_leases", level = "debug", skip_all)]
    async fn release_leases(&self, owner: &str, now: OffsetDateTime) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                next_attempt_at = ? \
             WHERE lease_owner = ? AND status = 'processing'",
        )
        .bind(us(now))
        .bind(owner)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    #[tracing::instrument(name = "store.purge", level = "debug", skip_all)]
    async fn purge(&self, cutoff: OffsetDateTime, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM messages WHERE id IN ( \
                SELECT id FROM messages WHERE created_at < ? AND status <> 'processing' \
                ORDER BY created_at LIMIT ?)",
        )
        .bind(us(cutoff))
        .bind(i64::from(batch))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn oldest_processing(&self) -> Result<Option<OffsetDateTime>, StoreError> {
        let v: Option<i64> =
            sqlx::query_scalar("SELECT min(created_at) FROM messages WHERE status = 'processing'")
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)?;
        Ok(v.map(from_us))
    }

    // Receipts and events.
    async fn record_receipt(&self, r: &NewReceipt) -> Result<ReceiptOutcome, StoreError> {
        // BEGIN IMMEDIATE: the write lock serialises this with every other
        // receipt and with the delivery task's attach_receipts.
        let mut tx = self.begin().await?;
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO receipts (provider, event_id, provider_message_id, provider_status, \
                status, error_code, received_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (provider, event_id) DO NOTHING RETURNING seq",
        )
        .bind(&r.provider)
        .bind(&r.event_id)
        .bind(&r.provider_message_id)
        .bind(&r.provider_status)
        .bind(r.status.map(Status::as_str))
        .bind(&r.error_code)
        .bind(us(r.received_at))
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if inserted.is_none() {
            let earlier: Option<Option<Uuid>> = sqlx::query_scalar(
                "SELECT message_id FROM receipts WHERE provider = ? AND event_id = ?",
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
             WHERE provider = ? AND provider_message_id = ? AND message_id IS NULL)",
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
        let mut tx = self.begin().await?;
        let (_, applied) =
            link_and_apply_receipts(&mut tx, provider, provider_message_id, now).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(applied)
    }

    async fn receipts(&self, id: MessageId) -> Result<Vec<ReceiptRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT provider, event_id, provider_message_id, message_id, provider_status, \
                status, error_code, applied, received_at \
             FROM receipts WHERE message_id = ? ORDER BY seq",
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
             FROM receipts WHERE message_id IS NULL ORDER BY seq DESC LIMIT ?",
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
                SELECT seq FROM receipts WHERE message_id IS NULL AND received_at < ? \
                ORDER BY received_at LIMIT ?)",
        )
        .bind(us(cutoff))
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
        let done = sqlx::query("UPDATE tenants SET allowed_countries = ? WHERE name = ?")
            .bind(countries.map(|c| c.join(",")))
            .bind(tenant_name)
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
            "INSERT INTO opt_outs (tenant_id, number, source, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (tenant_id, number) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(number)
        .bind(source)
        .bind(us(at))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn remove_opt_out(&self, tenant_id: Uuid, number: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM opt_outs WHERE tenant_id = ? AND number = ?")
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
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT number, source, created_at FROM opt_outs \
             WHERE tenant_id = ? AND (? IS NULL OR number > ?) \
             ORDER BY number LIMIT ?",
        )
        .bind(tenant_id)
        .bind(after)
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
                created_at: from_us(created_at),
            })
            .collect())
    }
}

// Receipts and events: helpers.

fn receipt_from_row(row: &SqliteRow) -> Result<ReceiptRow, StoreError> {
    let status: Option<String> = get(row, "status")?;
    let message_id: Option<Uuid> = get(row, "message_id")?;
    Ok(ReceiptRow {
        provider: get(row, "provider")?,
        event_id: get(row, "event_id")?,
        provider_message_id: get(row, "provider_message_id")?,
        message_id: message_id.map(|id| MessageId(id).to_string()),
        provider_status: get(row, "provider_status")?,
        status: status.as_deref().and_then(Status::parse),
        error_code: get(row, "error_code")?,
        applied: get(row, "applied")?,
        received_at: time(row, "received_at")?,
    })
}

/// Links the unlinked receipts of a provider message id to its message and
/// moves a `sent` message to the first final delivery status reported.
/// Returns the message (if any) and whether its status moved.
async fn link_and_apply_receipts(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    provider: &str,
    provider_message_id: &str,
    now: OffsetDateTime,
) -> Result<(Option<MessageId>, bool), StoreError> {
    let message: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, status FROM messages WHERE provider = ? AND provider_message_id = ? \
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
        "UPDATE receipts SET message_id = ? \
         WHERE provider = ? AND provider_message_id = ? AND message_id IS NULL",
    )
    .bind(id)
    .bind(provider)
    .bind(provider_message_id)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if status != Status::Sent.as_str() {
        return Ok((Some(MessageId(id)), false));
    }
    let first: Option<(i64, String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT seq, status, provider_status, error_code, received_at FROM receipts \
         WHERE message_id = ? AND status IN ('delivered', 'undelivered') \
         ORDER BY seq LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some((seq, new_status, provider_status, error_code, received_at)) = first else {
        return Ok((Some(MessageId(id)), false));
    };
    let error = (new_status == Status::Undelivered.as_str()).then(|| {
        json(&super::delivery_error(
            &provider_status,
            error_code.as_deref(),
        ))
    });
    let done = sqlx::query(
        "UPDATE messages SET status = ?, delivery_status_at = ?, \
            updated_at = max(updated_at, ?), error = COALESCE(?, error) \
         WHERE id = ? AND status = 'sent'",
    )
    .bind(&new_status)
    .bind(received_at)
    .bind(us(now))
    .bind(error)
    .bind(id)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if done.rows_affected() == 1 {
        sqlx::query("UPDATE receipts SET applied = 1 WHERE seq = ?")
            .bind(seq)
            .execute(&mut **tx)
            .await
            .map_err(map_err)?;
    }
    Ok((Some(MessageId(id)), done.rows_affected() == 1))
}
