//! Taking a channel's inbound update once: once for both backends.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::per_backend;
use crate::domain::inbound::Effect;
use crate::store::time::db;
use crate::store::{ChannelStore, StoreError, TakeUpdate, Taken};

const TENANT: &str = "SELECT id FROM tenants WHERE name = $1";

/// Inserts the row, or takes over one older than `$4` (a restarted id);
/// a row back means the update is new. On Postgres a concurrent insert of
/// the same key waits for the first transaction and then finds it.
const TAKE: &str = "INSERT INTO inbound_updates (channel, source, event_id, received_at) \
     VALUES ($5, $1, $2, $3) ON CONFLICT (channel, source, event_id) DO UPDATE \
     SET received_at = excluded.received_at WHERE inbound_updates.received_at < $4 \
     RETURNING event_id";

/// A channel's account (a bot) is the installation's, so a chat's `/stop`
/// opts it out for
/// every tenant (each keeps its own row, listed and removable as its own);
/// a tenant made later inherits it (`opt_outs::INHERIT_CHAT_OPT_OUTS`).
/// `WHERE true`: SQLite reads `tenants ON CONFLICT` as a join otherwise.
const OPT_OUT: &str = "INSERT INTO opt_outs (tenant_id, number, source, created_at) \
     SELECT id, $1, 'inbound', $2 FROM tenants WHERE true ON CONFLICT (tenant_id, number) DO NOTHING";

/// `/start` undoes what the chat and the bot did, for every tenant: the
/// rows from `/stop` (`inbound`) and from a "blocked" answer (`provider`;
/// to write `/start` the user unblocked the bot). A tenant's own entry
/// (`api`, `console`) stays: that was the tenant's decision.
const OPT_IN: &str = "DELETE FROM opt_outs WHERE number = $1 AND source IN ('inbound', 'provider')";

const PURGE: &str = "DELETE FROM inbound_updates WHERE channel = $3 \
     AND (source, event_id) IN ( \
     SELECT source, event_id FROM inbound_updates WHERE channel = $3 AND received_at < $1 \
     ORDER BY received_at LIMIT $2)";

per_backend! {
    #[async_trait]
    impl ChannelStore for Driver {
        async fn take_update(&self, u: &TakeUpdate) -> Result<Taken, StoreError> {
            let u = u.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    let tenant: Option<Uuid> = sqlx::query_scalar(TENANT)
                        .bind(&u.tenant)
                        .fetch_optional(&mut *c)
                        .await?;
                    let Some(tenant) = tenant else {
                        return Ok(Taken::NoTenant);
                    };
                    let taken: Option<i64> = sqlx::query_scalar(TAKE)
                        .bind(u.source)
                        .bind(u.event_id)
                        .bind(db(u.received_at))
                        .bind(db(u.restarted_before))
                        .bind(u.channel)
                        .fetch_optional(&mut *c)
                        .await?;
                    if taken.is_none() {
                        return Ok(Taken::Repeat);
                    }
                    if let Effect::Received { address, event, opt_out } = &u.effect {
                        Driver::enqueue_event(c, tenant, "message.received", None, event, u.received_at)
                            .await?;
                        match opt_out {
                            Some(true) => {
                                sqlx::query(OPT_OUT)
                                    .bind(address)
                                    .bind(db(u.received_at))
                                    .execute(&mut *c)
                                    .await?;
                            }
                            Some(false) => {
                                sqlx::query(OPT_IN)
                                    .bind(address)
                                    .execute(&mut *c)
                                    .await?;
                            }
                            None => {}
                        }
                    }
                    Ok(Taken::New)
                })
            })
            .await
        }

        async fn purge_updates(
            &self,
            channel: &str,
            cutoff: OffsetDateTime,
            batch: u32,
        ) -> Result<u64, StoreError> {
            let channel = channel.to_string();
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(PURGE)
                        .bind(db(cutoff))
                        .bind(i64::from(batch))
                        .bind(&channel)
                        .execute(&mut *c)
                        .await?;
                    Ok(done.rows_affected())
                })
            })
            .await
        }
    }
}
