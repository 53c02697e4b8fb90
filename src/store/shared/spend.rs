//! Spend caps and capped inserts, once for both backends (see
//! `store/spend.rs`). A capped send's transaction: the message's insert
//! under its key (a taken key is answered, never charged), then the period
//! counters' `UPDATE`s whose `WHERE` holds the cap (zero rows: refused, the
//! transaction rolled back, nothing stored), then a `tenant.spend_warning`
//! event per cap whose 80 % this send crossed. Counter rows are taken in
//! one order (day, then month), so concurrent sends cannot deadlock; on
//! Postgres the row lock serialises a tenant's capped sends, on SQLite the
//! single writer does.

use async_trait::async_trait;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{per_backend, to_i32};
use crate::spend::{Cap, Charge, Period, SpendCaps, crossed_warning, format_amount};
use crate::store::row::{KeyStateRow, key_state_columns};
use crate::store::spend::{Charged, SpendItem, SpendStore, SpendSummary};
use crate::store::time::{DbTime, db, micros};
use crate::store::{Claim, KeyState, MessageRecord, StoreError};

const CAPS: &str = "SELECT spend_cap_daily_micros, spend_cap_monthly_micros, \
        spend_cap_international_daily FROM tenants WHERE name = $1";

const CAPS_BY_ID: &str = "SELECT spend_cap_daily_micros, spend_cap_monthly_micros, \
        spend_cap_international_daily FROM tenants WHERE id = $1";

const KEY_STATE: &str = concat!(
    "SELECT ",
    key_state_columns!(),
    " FROM messages WHERE tenant_id = $1 AND idempotency_key = $2"
);

/// A period's counter row, seeded (the first time a capped send counts in
/// the period) with what the tenant's messages already cost in it.
const SEED: &str = "INSERT INTO tenant_spend (tenant_id, period, spent_micros, \
        international_messages) \
     SELECT $1, $2, CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT), 0 FROM messages \
     WHERE tenant_id = $1 AND created_at >= $3 AND id <> $4 \
     ON CONFLICT (tenant_id, period) DO NOTHING";

/// The charge, only within the caps (`$5`, `$6`: the caps, `i64::MAX` for
/// none): the database decides.
const CHARGE: &str = "UPDATE tenant_spend SET spent_micros = spent_micros + $3, \
        international_messages = international_messages + $4 \
     WHERE tenant_id = $1 AND period = $2 AND spent_micros + $3 <= $5 \
        AND international_messages + $4 <= $6 \
     RETURNING spent_micros, international_messages";

const COUNTER: &str = "SELECT spent_micros, international_messages FROM tenant_spend \
     WHERE tenant_id = $1 AND period = $2";

const SPENT_SINCE: &str = "SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT), MAX(cost_currency) \
     FROM messages WHERE tenant_id = $1 AND created_at >= $2";

/// Which counter a cap is held in.
struct Counter<'a> {
    period: &'a str,
    since: OffsetDateTime,
    amount_cap: Option<i64>,
    count_cap: Option<i64>,
}

per_backend! {
    const INSERT: &str = concat!(
        "INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
            to_number, from_sender, body, segments, encoding, metadata, validity_seconds, \
            provider, attempts, lease_token, lease_owner, lease_expires_at, next_attempt_at, \
            send_at, created_at, updated_at, expires_at, deadline_at, route, cost_micros, \
            cost_currency, route_order) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
            CASE WHEN $15 IS NULL THEN NULL ELSE ",
        db_now!(),
        " + $17",
        us!(),
        " END, $18, $19, $20, $20, $21, $22, $23, $24, $25, $26) \
         ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
         RETURNING lease_expires_at, EXISTS (SELECT 1 FROM opt_outs o \
            WHERE o.tenant_id = messages.tenant_id AND o.number IN (messages.to_number, \
                messages.provider || ':' || messages.to_number))"
    );

    const ATTEMPT: &str = "INSERT INTO attempts (message_id, number, lease_owner, started_at, \
            sender) VALUES ($1, 1, $2, $3, $4)";

    #[async_trait]
    impl SpendStore for Driver {
        async fn spend_caps(&self, tenant_name: &str) -> Result<Option<SpendCaps>, StoreError> {
            let row: Option<(Option<i64>, Option<i64>, Option<i64>)> = sqlx::query_as(CAPS)
                .bind(tenant_name)
                .fetch_optional(self.pool())
                .await?;
            Ok(row.map(|(daily, monthly, intl)| SpendCaps {
                daily,
                monthly,
                international_daily_messages: intl,
            }))
        }

        #[tracing::instrument(name = "store.insert_charged", level = "debug", skip_all, fields(message_id = %item.message.id))]
        async fn insert_charged(
            &self,
            item: &SpendItem,
            caps: SpendCaps,
            now: OffsetDateTime,
        ) -> Result<Charged, StoreError> {
            let item = item.clone();
            let done = self
                .write_tx(move |c| Box::pin(async move { charged(c, &item, caps, now).await }))
                .await;
            match done {
                Err(StoreError::SpendCap(cap)) => Ok(Charged::Refused(cap)),
                other => other,
            }
        }

        async fn spend_summary(
            &self,
            tenant_id: Uuid,
            now: OffsetDateTime,
        ) -> Result<SpendSummary, StoreError> {
            let p = Period::at(now);
            let (today, cur_d): (i64, Option<String>) = sqlx::query_as(SPENT_SINCE)
                .bind(tenant_id)
                .bind(db(p.day_start))
                .fetch_one(self.pool())
                .await?;
            let (month, cur_m): (i64, Option<String>) = sqlx::query_as(SPENT_SINCE)
                .bind(tenant_id)
                .bind(db(p.month_start))
                .fetch_one(self.pool())
                .await?;
            let counter: Option<(i64, i64)> = sqlx::query_as(COUNTER)
                .bind(tenant_id)
                .bind(&p.day)
                .fetch_optional(self.pool())
                .await?;
            let caps: Option<(Option<i64>, Option<i64>, Option<i64>)> =
                sqlx::query_as(CAPS_BY_ID)
                    .bind(tenant_id)
                    .fetch_optional(self.pool())
                    .await?;
            let (daily, monthly, intl) = caps.unwrap_or_default();
            Ok(SpendSummary {
                caps: SpendCaps {
                    daily,
                    monthly,
                    international_daily_messages: intl,
                },
                today_micros: today,
                month_micros: month,
                international_today: counter.map(|c| c.1).unwrap_or(0),
                currency: cur_d.or(cur_m),
            })
        }
    }

    impl Driver {
        /// Charges `charge` (message `message_id`'s, already inserted)
        /// to tenant `tenant_id`'s day and month counters under `caps`, in
        /// the caller's transaction, and writes a `tenant.spend_warning`
        /// event per cap whose 80 % it crossed (returned). Over a cap it is
        /// `Err(SpendCap)` (roll back) when `enforce`; otherwise the counter
        /// may pass the cap (a send already promised is counted, later
        /// sends are refused).
        pub(crate) async fn charge_spend(
            c: &mut Conn,
            tenant_id: Uuid,
            message_id: Uuid,
            charge: &Charge,
            caps: SpendCaps,
            enforce: bool,
            now: OffsetDateTime,
        ) -> Result<Vec<Cap>, StoreError> {
        let period = Period::at(now);
        let day = Counter {
            period: &period.day,
            since: period.day_start,
            amount_cap: caps.daily,
            count_cap: caps.international_daily_messages,
        };
        let month = Counter {
            period: &period.month,
            since: period.month_start,
            amount_cap: caps.monthly,
            count_cap: None,
        };
        let mut warned = Vec::new();
        for (counter, amount_kind) in [(day, Cap::Daily), (month, Cap::Monthly)] {
            if counter.amount_cap.is_none() && counter.count_cap.is_none() {
                continue;
            }
            let intl = i64::from(charge.international && counter.count_cap.is_some());
            sqlx::query(SEED)
                .bind(tenant_id)
                .bind(counter.period)
                .bind(db(counter.since))
                .bind(message_id)
                .execute(&mut *c)
                .await?;
            let after: Option<(i64, i64)> = sqlx::query_as(CHARGE)
                .bind(tenant_id)
                .bind(counter.period)
                .bind(charge.micros)
                .bind(intl)
                .bind(counter.amount_cap.filter(|_| enforce).unwrap_or(i64::MAX))
                .bind(counter.count_cap.filter(|_| enforce).unwrap_or(i64::MAX))
                .fetch_optional(&mut *c)
                .await?;
            let Some((spent, count)) = after else {
                // Which cap, for the answer (the decision was the UPDATE's).
                let now_at: Option<(i64, i64)> = sqlx::query_as(COUNTER)
                    .bind(tenant_id)
                    .bind(counter.period)
                    .fetch_optional(&mut *c)
                    .await?;
                let (s, _) = now_at.unwrap_or((0, 0));
                let by_amount = counter
                    .amount_cap
                    .is_some_and(|cap| s.saturating_add(charge.micros) > cap);
                return Err(StoreError::SpendCap(if by_amount {
                    amount_kind
                } else {
                    Cap::InternationalDailyMessages
                }));
            };
            let mut crossed = |cap: Cap, before: i64, after: i64, limit: i64, money: bool| {
                if crossed_warning(before, after, limit) {
                    warned.push((cap, after, limit, money));
                }
            };
            if let Some(limit) = counter.amount_cap {
                crossed(amount_kind, spent - charge.micros, spent, limit, true);
            }
            if let Some(limit) = counter.count_cap {
                crossed(Cap::InternationalDailyMessages, count - intl, count, limit, false);
            }
        }
        for (cap, after, limit, money) in &warned {
            let data = warning_data(*cap, &period, *after, *limit, *money, &charge.currency);
            Driver::enqueue_event(c, tenant_id, "tenant.spend_warning", None, &data, now)
                .await?;
        }
        Ok(warned.into_iter().map(|w| w.0).collect())
        }
    }

    /// The capped insert's transaction (see the module's docs). A refusal
    /// is `Err(SpendCap)`, so the writer rolls it back.
    async fn charged(
        c: &mut Conn,
        item: &SpendItem,
        caps: SpendCaps,
        now: OffsetDateTime,
    ) -> Result<Charged, StoreError> {
        let m = &item.message;
        let status = match &item.lease {
            Some(_) => crate::domain::Status::Processing,
            None if item.due > m.created_at => crate::domain::Status::Scheduled,
            None => crate::domain::Status::Processing,
        };
        let (cost, currency) = m.cost_columns();
        let inserted: Option<(Option<DbTime>, bool)> = sqlx::query_as(INSERT)
            .bind(m.id.0)
            .bind(m.tenant_id)
            .bind(&m.idempotency_key)
            .bind(&m.fingerprint)
            .bind(status)
            .bind(&m.to)
            .bind(&m.from)
            .bind(&m.body)
            .bind(to_i32(m.segments))
            .bind(m.encoding)
            .bind(Json(&m.metadata))
            .bind(m.validity_seconds)
            .bind(&m.provider)
            .bind(i32::from(item.lease.is_some()))
            .bind(item.lease.as_ref().map(|l| l.token))
            .bind(item.lease.as_ref().map(|l| l.owner.clone()))
            .bind(item.lease.as_ref().map(|l| micros(l.ttl)).unwrap_or(0))
            .bind(item.lease.is_none().then(|| db(item.due)))
            .bind(item.send_at.map(db))
            .bind(db(m.created_at))
            .bind(m.expires_at.map(db))
            .bind(db(m.deadline_at))
            .bind(&m.route)
            .bind(cost)
            .bind(currency)
            .bind(&m.route_order)
            .fetch_optional(&mut *c)
            .await?;
        let Some((lease_expires_at, opted_out)) = inserted else {
            // Taken (on Postgres the insert waited for the holder's commit,
            // so this read sees it): answered as it stands, not charged.
            let row: Option<KeyStateRow> = sqlx::query_as(KEY_STATE)
                .bind(m.tenant_id)
                .bind(&m.idempotency_key)
                .fetch_optional(&mut *c)
                .await?;
            return row
                .map(|r| Charged::Existing(KeyState::from(r)))
                .ok_or(StoreError::Invariant("a taken key without its row"));
        };
        if let Some(lease) = &item.lease {
            sqlx::query(ATTEMPT)
                .bind(m.id.0)
                .bind(&lease.owner)
                .bind(db(m.created_at))
                .bind(&m.sender)
                .execute(&mut *c)
                .await?;
        }
        let charge = m.cost.clone().unwrap_or(Charge {
            micros: 0,
            currency: String::new(),
            international: false,
        });
        let warned = Driver::charge_spend(c, m.tenant_id, m.id.0, &charge, caps, true, now).await?;
        let record = match &item.lease {
            Some(lease) => {
                let expires = lease_expires_at
                    .ok_or(StoreError::Invariant("a new message without its lease"))?;
                let mut r = MessageRecord::claimed(m, lease, expires.0, opted_out);
                r.recipient_opted_out = opted_out;
                r
            }
            None => MessageRecord::waiting(m, status, item.due, item.send_at),
        };
        Ok(Charged::Created {
            claim: Claim::Created(Box::new(record)),
            warned,
        })
    }
}

/// A `tenant.spend_warning` event's data: which cap, its period, the total
/// after the send that crossed 80 % and the cap (amounts as decimal
/// strings with their currency; the international cap in messages).
fn warning_data(
    cap: Cap,
    period: &Period,
    after: i64,
    limit: i64,
    money: bool,
    currency: &str,
) -> Vec<u8> {
    let period_name = match cap {
        Cap::Monthly => &period.month[1..],
        _ => &period.day[1..],
    };
    let v = if money {
        serde_json::json!({
            "cap": cap.as_str(),
            "period": period_name,
            "spent": format_amount(after),
            "limit": format_amount(limit),
            "currency": currency,
        })
    } else {
        serde_json::json!({
            "cap": cap.as_str(),
            "period": period_name,
            "messages": after,
            "limit": limit,
        })
    };
    serde_json::to_vec(&v).unwrap_or_default()
}
