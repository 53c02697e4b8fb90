//! Route quality, once for both backends: one aggregate over the window's
//! messages (off the send path: the evaluator's beat, `GET /routes`), and
//! the route orders, written with their audit row.

use async_trait::async_trait;

use super::per_backend;
use crate::admin::AuditEntry;
use crate::domain::quality::{BUCKETS, Measured};
use crate::store::StoreError;
use crate::store::quality::{QualityStore, QualityWindow, RouteOrder};
use crate::store::time::{DbTime, db};

const ROUTE_ORDERS: &str = "SELECT prefix, providers, pinned, reason, changed_at, version FROM route_orders ORDER BY prefix";

/// A compare-and-set on the version: the row as read (version `$6 - 1`)
/// takes the new one.
const UPDATE_ROUTE_ORDER: &str = "UPDATE route_orders SET providers = $2, pinned = $3, \
        reason = $4, changed_at = $5, version = $6 \
     WHERE prefix = $1 AND version = $6 - 1";

/// No row is version 0: only version 1 inserts, and only where no row is
/// (a writer that read a row an unpin has since deleted writes nothing).
const INSERT_ROUTE_ORDER: &str = "INSERT INTO route_orders \
        (prefix, providers, pinned, reason, changed_at, version) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (prefix) DO NOTHING";

/// An unpin: the route goes back to its configured order and quality's
/// choice; only the pinned row read (its version) goes.
const DELETE_ROUTE_ORDER: &str =
    "DELETE FROM route_orders WHERE prefix = $1 AND version = $2 AND pinned";

#[derive(sqlx::FromRow)]
struct QualityRow {
    route: String,
    provider: String,
    messages: i64,
    sent: i64,
    delivered: i64,
    undelivered: i64,
    failed: i64,
    unknown: i64,
    judged: i64,
    slow: i64,
    w0: i64,
    w1: i64,
    w2: i64,
    w3: i64,
    w4: i64,
    w5: i64,
    w6: i64,
    w7: i64,
    w8: i64,
    w9: i64,
    w10: i64,
    codes: i64,
    approved: i64,
    cost_micros: i64,
    currency: Option<String>,
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

impl From<QualityRow> for Measured {
    fn from(r: QualityRow) -> Self {
        Measured {
            route: r.route,
            provider: r.provider,
            messages: count(r.messages),
            sent: count(r.sent),
            delivered: count(r.delivered),
            undelivered: count(r.undelivered),
            failed: count(r.failed),
            unknown: count(r.unknown),
            judged: count(r.judged),
            slow: count(r.slow),
            within: [
                r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7, r.w8, r.w9, r.w10,
            ]
            .map(count),
            codes: count(r.codes),
            approved: count(r.approved),
            cost_micros: r.cost_micros,
            currency: r.currency,
        }
    }
}

type OrderRow = (String, String, bool, String, DbTime, i64);

per_backend! {
    macro_rules! within {
        ($n:literal, $p:literal) => {
            concat!(
                "CAST(COALESCE(SUM(CASE WHEN m.status = 'delivered' \
                    AND m.delivery_status_at <= m.sent_at + $", $p, us!(),
                " THEN 1 ELSE 0 END), 0) AS BIGINT) AS w", $n, ", "
            )
        };
    }

    /// One row per (route, provider): `$1` the window's start, `$2` the
    /// latest send old enough to judge, `$3` SLOW_AFTER in microseconds,
    /// `$4`..`$14` the buckets' edges in microseconds, `$15` test mode's
    /// provider (never measured). A code is approved for the message that
    /// was its verification's last one sent.
    const QUALITY: &str = concat!(
        "SELECT COALESCE(m.route, '') AS route, m.provider, \
            CAST(COUNT(*) AS BIGINT) AS messages, \
            CAST(COALESCE(SUM(CASE WHEN m.sent_at IS NOT NULL THEN 1 ELSE 0 END), 0) AS BIGINT) AS sent, \
            CAST(COALESCE(SUM(CASE WHEN m.status = 'delivered' THEN 1 ELSE 0 END), 0) AS BIGINT) AS delivered, \
            CAST(COALESCE(SUM(CASE WHEN m.status = 'undelivered' THEN 1 ELSE 0 END), 0) AS BIGINT) AS undelivered, \
            CAST(COALESCE(SUM(CASE WHEN m.status = 'failed' THEN 1 ELSE 0 END), 0) AS BIGINT) AS failed, \
            CAST(COALESCE(SUM(CASE WHEN m.status = 'unknown' THEN 1 ELSE 0 END), 0) AS BIGINT) AS unknown, \
            CAST(COALESCE(SUM(CASE WHEN m.sent_at IS NOT NULL AND m.sent_at <= $2 \
                THEN 1 ELSE 0 END), 0) AS BIGINT) AS judged, \
            CAST(COALESCE(SUM(CASE WHEN m.sent_at IS NOT NULL AND m.sent_at <= $2 \
                AND (m.delivery_status_at IS NULL OR m.delivery_status_at > m.sent_at + $3",
        us!(),
        ") THEN 1 ELSE 0 END), 0) AS BIGINT) AS slow, ",
        within!("0", "4"),
        within!("1", "5"),
        within!("2", "6"),
        within!("3", "7"),
        within!("4", "8"),
        within!("5", "9"),
        within!("6", "10"),
        within!("7", "11"),
        within!("8", "12"),
        within!("9", "13"),
        within!("10", "14"),
        "CAST(COALESCE(SUM(CASE WHEN m.verification_id IS NOT NULL AND m.sent_at IS NOT NULL \
                THEN 1 ELSE 0 END), 0) AS BIGINT) AS codes, \
            CAST(COALESCE(SUM(CASE WHEN v.status = 'approved' AND m.sent_at IS NOT NULL \
                AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.verification_id = m.verification_id \
                    AND l.sent_at > m.sent_at) \
                THEN 1 ELSE 0 END), 0) AS BIGINT) AS approved, \
            CAST(COALESCE(SUM(CASE WHEN m.sent_at IS NOT NULL THEN COALESCE(m.cost_micros, 0) \
                ELSE 0 END), 0) AS BIGINT) AS cost_micros, \
            MAX(m.cost_currency) AS currency \
         FROM messages m LEFT JOIN verifications v ON v.id = m.verification_id \
         WHERE m.created_at >= $1 AND (m.route IS NOT NULL OR m.verification_id IS NOT NULL) \
            AND m.provider <> $15 \
         GROUP BY COALESCE(m.route, ''), m.provider \
         ORDER BY 1, 2"
    );

    #[async_trait]
    impl QualityStore for Driver {
        async fn route_quality(&self, w: QualityWindow) -> Result<Vec<Measured>, StoreError> {
            let mut q = sqlx::query_as::<_, QualityRow>(QUALITY)
                .bind(db(w.since))
                .bind(db(w.judged_before))
                .bind(w.slow_after_micros);
            for edge in BUCKETS {
                q = q.bind(i64::from(edge) * 1_000_000);
            }
            let rows = q
                .bind(crate::provider::testmode::NAME)
                .fetch_all(self.pool())
                .await?;
            Ok(rows.into_iter().map(Measured::from).collect())
        }

        async fn route_orders(&self) -> Result<Vec<RouteOrder>, StoreError> {
            let rows: Vec<OrderRow> = sqlx::query_as(ROUTE_ORDERS).fetch_all(self.pool()).await?;
            Ok(rows
                .into_iter()
                .map(|(prefix, providers, pinned, reason, changed_at, version)| RouteOrder {
                    prefix,
                    providers: providers
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                    pinned,
                    reason,
                    changed_at: changed_at.0,
                    version,
                })
                .collect())
        }

        async fn put_route_order(
            &self,
            order: &RouteOrder,
            audit: &AuditEntry,
        ) -> Result<bool, StoreError> {
            let order = order.clone();
            let audit = audit.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    let sql = if order.version == 1 {
                        INSERT_ROUTE_ORDER
                    } else {
                        UPDATE_ROUTE_ORDER
                    };
                    let done = sqlx::query(sql)
                        .bind(&order.prefix)
                        .bind(order.providers.join(","))
                        .bind(order.pinned)
                        .bind(&order.reason)
                        .bind(db(order.changed_at))
                        .bind(order.version)
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() == 0 {
                        return Ok(false);
                    }
                    Driver::write_audit(c, &audit).await?;
                    Ok(true)
                })
            })
            .await
        }

        async fn delete_route_order(
            &self,
            prefix: &str,
            version: i64,
            audit: &AuditEntry,
        ) -> Result<bool, StoreError> {
            let prefix = prefix.to_string();
            let audit = audit.clone();
            self.write_tx(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(DELETE_ROUTE_ORDER)
                        .bind(&prefix)
                        .bind(version)
                        .execute(&mut *c)
                        .await?;
                    if done.rows_affected() == 0 {
                        return Ok(false);
                    }
                    Driver::write_audit(c, &audit).await?;
                    Ok(true)
                })
            })
            .await
        }
    }
}
