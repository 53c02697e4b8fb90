//! Messages: what both backends run alike, once. The reads (a key's state
//! for replays, a message, its attempts, the owner of a provider message id,
//! an in-flight sibling) and the cancel, one conditional write. The writes
//! on the hot path (the claim, the final write, attempts, the scheduler's
//! claim, a batch's insert) keep their tuned statements per backend
//! (Postgres' coalesced lanes and `unnest`, `SKIP LOCKED`; the SQLite
//! writer).

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{per_backend, to_i32};
use crate::domain::MessageId;
use crate::domain::schedule::cancelable_sql;
use crate::store::row::{
    AttemptDbRow, KeyStateRow, MessageRow, attempt_columns, key_state_columns, message_columns,
};
use crate::store::time::db;
use crate::store::{
    AttemptRow, KeyState, MessageReadStore, MessageRecord, StoreError, StoredResponse,
};

const KEY_STATE: &str = concat!(
    "SELECT ",
    key_state_columns!(),
    " FROM messages WHERE tenant_id = $1 AND idempotency_key = $2"
);

const STATE_BY_ID: &str = concat!(
    "SELECT ",
    key_state_columns!(),
    " FROM messages WHERE id = $1"
);

const PROVIDER_MESSAGE_OWNER: &str =
    "SELECT id FROM messages WHERE provider = $1 AND provider_message_id = $2 LIMIT 1";

const IN_FLIGHT_SIBLING: &str = "SELECT s.id FROM messages me JOIN messages s \
        ON s.to_number = me.to_number AND s.body = me.body AND s.id <> me.id \
     WHERE me.id = $1 AND s.provider = $2 AND s.provider_message_id IS NULL \
        AND ((s.status = 'processing' \
              AND (s.maybe_sent OR EXISTS (SELECT 1 FROM attempts a \
                   WHERE a.message_id = s.id AND a.finished_at IS NULL))) \
             OR (s.status = 'unknown' AND s.finalized_at >= $3)) \
     LIMIT 1";

const MESSAGE: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.tenant_id = $1 AND m.idempotency_key = $2"
);

const MESSAGE_BY_ID: &str = concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages m WHERE m.id = $1"
);

const ATTEMPTS: &str = concat!(
    "SELECT ",
    attempt_columns!(),
    " FROM attempts WHERE message_id = $1 ORDER BY number"
);

/// One conditional write: on Postgres (READ COMMITTED) a concurrent claim
/// or attempt that committed first is re-checked against this WHERE (and
/// one still running holds the row lock until it commits); on SQLite the
/// writer's transaction orders it with every claim and attempt of the
/// file. Either way the row is canceled only if it still qualifies.
const CANCEL: &str = concat!(cancel_sql!(), cancelable_sql!(), " RETURNING tenant_id");

/// A cancel's write of message `$1` with `$2` attempts as read, its frozen
/// response (`$3`, `$4`) and time (`$5`), up to the conditions the caller
/// adds: the caller's cancel here, an unsent Telegram message's in
/// `shared/fallbacks.rs`.
macro_rules! cancel_sql {
    () => {
        "UPDATE messages AS m SET status = 'canceled', response_code = $3, \
            response_body = $4, updated_at = $5, finalized_at = $5, next_attempt_at = NULL \
         WHERE m.id = $1 AND m.attempts = $2 AND "
    };
}
pub(crate) use cancel_sql;

per_backend! {
    #[async_trait]
    impl MessageReadStore for Driver {
        #[tracing::instrument(name = "store.key_state", level = "debug", skip_all)]
        async fn key_state(
            &self,
            tenant_id: Uuid,
            key: &str,
        ) -> Result<Option<KeyState>, StoreError> {
            let row: Option<KeyStateRow> = sqlx::query_as(KEY_STATE)
                .bind(tenant_id)
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(KeyState::from))
        }

        #[tracing::instrument(name = "store.state_by_id", level = "debug", skip_all, fields(message_id = %id))]
        async fn state_by_id(&self, id: MessageId) -> Result<Option<KeyState>, StoreError> {
            let row: Option<KeyStateRow> = sqlx::query_as(STATE_BY_ID)
                .bind(id.0)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(KeyState::from))
        }

        async fn provider_message_owner(
            &self,
            provider: &str,
            provider_message_id: &str,
        ) -> Result<Option<MessageId>, StoreError> {
            let row: Option<(Uuid,)> = sqlx::query_as(PROVIDER_MESSAGE_OWNER)
                .bind(provider)
                .bind(provider_message_id)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(|(id,)| MessageId(id)))
        }

        async fn in_flight_sibling(
            &self,
            id: MessageId,
            provider: &str,
            since: OffsetDateTime,
        ) -> Result<Option<MessageId>, StoreError> {
            let row: Option<(Uuid,)> = sqlx::query_as(IN_FLIGHT_SIBLING)
                .bind(id.0)
                .bind(provider)
                .bind(db(since))
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(|(id,)| MessageId(id)))
        }

        #[tracing::instrument(name = "store.message", level = "debug", skip_all)]
        async fn message(
            &self,
            tenant_id: Uuid,
            key: &str,
        ) -> Result<Option<MessageRecord>, StoreError> {
            let row: Option<MessageRow> = sqlx::query_as(MESSAGE)
                .bind(tenant_id)
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(MessageRecord::from))
        }

        #[tracing::instrument(name = "store.message_by_id", level = "debug", skip_all, fields(message_id = %id))]
        async fn message_by_id(&self, id: MessageId) -> Result<Option<MessageRecord>, StoreError> {
            let row: Option<MessageRow> = sqlx::query_as(MESSAGE_BY_ID)
                .bind(id.0)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(MessageRecord::from))
        }

        async fn attempts(&self, id: MessageId) -> Result<Vec<AttemptRow>, StoreError> {
            let rows: Vec<AttemptDbRow> = sqlx::query_as(ATTEMPTS)
                .bind(id.0)
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(AttemptRow::from).collect())
        }
    }

    impl Driver {
        /// `MessageStore::cancel_message`, the same on both backends.
        #[tracing::instrument(name = "store.cancel_message", level = "debug", skip_all, fields(message_id = %id))]
        pub(crate) async fn cancel_one(
            &self,
            id: MessageId,
            attempts: u32,
            now: OffsetDateTime,
            response: &StoredResponse,
        ) -> Result<bool, StoreError> {
            let response = response.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    let tenant: Option<Uuid> = sqlx::query_scalar(CANCEL)
                        .bind(id.0)
                        .bind(to_i32(attempts))
                        .bind(i16::try_from(response.status_code).unwrap_or(500))
                        .bind(&response.body)
                        .bind(db(now))
                        .fetch_optional(&mut *c)
                        .await?;
                    let Some(tenant) = tenant else {
                        return Ok(false);
                    };
                    // Integrators hear of it as of any other final status.
                    Driver::enqueue_event(c, tenant, "message.canceled", Some(id.0), &response.body, now)
                        .await?;
                    Ok(true)
                })
            })
            .await
        }
    }
}
