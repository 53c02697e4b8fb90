//! Opt-out lists: once for both backends.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::store::row::OptOutRow;
use crate::store::time::db;
use crate::store::{OptOut, OptOutStore, StoreError};

const ADD: &str = "INSERT INTO opt_outs (tenant_id, number, source, created_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, number) DO NOTHING";

const REMOVE: &str = "DELETE FROM opt_outs WHERE tenant_id = $1 AND number = $2";

const LIST: &str = "SELECT number, source, created_at, added_by FROM opt_outs \
     WHERE tenant_id = $1 AND ($2 IS NULL OR number > $2) ORDER BY number LIMIT $3";

/// A tenant just made (`$1`) inherits the installation's chat opt-outs (an
/// address of a channel of its own, not a `+` number): the channel's
/// account (a bot) is the installation's, and a chat that said `/stop` or
/// blocked it did so for every tenant (see `channels.rs`).
pub(crate) const INHERIT_CHAT_OPT_OUTS: &str = "INSERT INTO opt_outs \
        (tenant_id, number, source, created_at) \
     SELECT $1, number, source, created_at FROM opt_outs \
     WHERE number NOT LIKE '+%' AND source IN ('inbound', 'provider') \
     ON CONFLICT (tenant_id, number) DO NOTHING";

per_backend! {
    #[async_trait]
    impl OptOutStore for Driver {
        async fn add_opt_out(
            &self,
            tenant_id: Uuid,
            number: &str,
            source: &str,
            at: OffsetDateTime,
        ) -> Result<bool, StoreError> {
            let (number, source) = (number.to_string(), source.to_string());
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(ADD)
                        .bind(tenant_id)
                        .bind(&number)
                        .bind(&source)
                        .bind(db(at))
                        .execute(&mut *c)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
        }

        async fn remove_opt_out(&self, tenant_id: Uuid, number: &str) -> Result<bool, StoreError> {
            let number = number.to_string();
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(REMOVE)
                        .bind(tenant_id)
                        .bind(&number)
                        .execute(&mut *c)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
        }

        async fn list_opt_outs(
            &self,
            tenant_id: Uuid,
            after: Option<&str>,
            limit: u32,
        ) -> Result<Vec<OptOut>, StoreError> {
            let rows: Vec<OptOutRow> = sqlx::query_as(LIST)
                .bind(tenant_id)
                .bind(after)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(OptOut::from).collect())
        }
    }
}
