//! A batch's new messages on Postgres: one multi-row statement
//! (`INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING RETURNING`, the
//! shape of the coalesced claim in `batch.rs`) that also reports, per row,
//! the message already holding a taken key. No leases and no attempts are
//! written: every row is due (`scheduled` for its `send_at`, or
//! `processing` due now) and any instance's scheduler starts it, at the pace
//! of its free send slots.

use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::{PgStore, to_i32};
use crate::domain::{MessageId, Status};
use crate::store::row::stored_response;
use crate::store::{Claim, KeyState, MessageReadStore, Queued, StoreError};

impl PgStore {
    #[tracing::instrument(name = "store.insert_batch", level = "debug", skip_all, fields(rows = items.len()))]
    pub(super) async fn insert_queued(&self, items: &[Queued]) -> Result<Vec<Claim>, StoreError> {
        let mut answers: Vec<Option<Claim>> = (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        // A key taken by a row committed after the statement's snapshot is
        // read again; one purged in between is inserted again.
        for _ in 0..3 {
            if pending.is_empty() {
                break;
            }
            let rows: Vec<&Queued> = pending.iter().map(|&i| &items[i]).collect();
            let found = self.queued_statement(&rows).await?;
            let mut unseen = Vec::new();
            for (&i, answer) in pending.iter().zip(found) {
                match answer {
                    Some(claim) => answers[i] = Some(claim),
                    None => {
                        let m = &items[i].message;
                        match self
                            .key_state(m.tenant_id, m.idempotency_key.as_str())
                            .await?
                        {
                            Some(state) => answers[i] = Some(Claim::Existing(state)),
                            None => unseen.push(i),
                        }
                    }
                }
            }
            pending = unseen;
        }
        answers
            .into_iter()
            .map(|a| {
                a.ok_or(StoreError::Invariant(
                    "the key was taken and released three times in a row",
                ))
            })
            .collect()
    }

    /// One statement for `rows`; `None` for a row whose key was taken by a
    /// message this statement's snapshot does not see.
    async fn queued_statement(&self, rows: &[&Queued]) -> Result<Vec<Option<Claim>>, StoreError> {
        let n = rows.len();
        let mut id = Vec::with_capacity(n);
        let mut tenant = Vec::with_capacity(n);
        let mut key = Vec::with_capacity(n);
        let mut fingerprint = Vec::with_capacity(n);
        let mut status = Vec::with_capacity(n);
        let mut to = Vec::with_capacity(n);
        let mut from = Vec::with_capacity(n);
        let mut body = Vec::with_capacity(n);
        let mut segments = Vec::with_capacity(n);
        let mut encoding = Vec::with_capacity(n);
        let mut metadata = Vec::with_capacity(n);
        let mut validity = Vec::with_capacity(n);
        let mut provider = Vec::with_capacity(n);
        let mut due = Vec::with_capacity(n);
        let mut send_at = Vec::with_capacity(n);
        let mut created = Vec::with_capacity(n);
        let mut expires = Vec::with_capacity(n);
        let mut deadline = Vec::with_capacity(n);
        let mut route = Vec::with_capacity(n);
        let mut cost = Vec::with_capacity(n);
        let mut currency = Vec::with_capacity(n);
        let mut route_order = Vec::with_capacity(n);
        for q in rows {
            let m = &q.message;
            id.push(m.id.0);
            tenant.push(m.tenant_id);
            key.push(m.idempotency_key.as_str());
            fingerprint.push(m.fingerprint.as_slice());
            status.push(q.status().as_str());
            to.push(m.to.as_str());
            from.push(m.from.as_deref());
            body.push(m.body.as_str());
            segments.push(to_i32(m.segments));
            encoding.push(m.encoding.as_str());
            metadata.push(
                serde_json::to_string(&m.metadata)
                    .map_err(|_| StoreError::Invariant("metadata that is not JSON"))?,
            );
            validity.push(m.validity_seconds);
            provider.push(m.provider.as_str());
            due.push(q.due);
            send_at.push(q.send_at);
            created.push(m.created_at);
            expires.push(m.expires_at);
            deadline.push(m.deadline_at);
            route.push(m.route.as_deref());
            let (c, cur) = m.cost_columns();
            cost.push(c);
            currency.push(cur);
            route_order.push(m.route_order.as_deref());
        }
        let answers: Vec<PgRow> = sqlx::query(
            "WITH input AS ( \
                SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], \
                    $5::text[], $6::text[], $7::text[], $8::text[], $9::int4[], $10::text[], \
                    $11::text[], $12::int4[], $13::text[], $14::timestamptz[], \
                    $15::timestamptz[], $16::timestamptz[], $17::timestamptz[], \
                    $18::timestamptz[], $19::text[], $20::int8[], $21::text[], $22::text[]) WITH ORDINALITY \
                AS t(id, tenant_id, idempotency_key, fingerprint, status, to_number, \
                    from_sender, body, segments, encoding, metadata, validity_seconds, \
                    provider, due, send_at, created_at, expires_at, deadline_at, route, \
                    cost_micros, cost_currency, route_order, ord)), \
             ins AS ( \
                INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                    to_number, from_sender, body, segments, encoding, metadata, \
                    validity_seconds, provider, attempts, next_attempt_at, send_at, \
                    created_at, updated_at, expires_at, deadline_at, route, cost_micros, \
                    cost_currency, route_order) \
                SELECT id, tenant_id, idempotency_key, fingerprint, status, to_number, \
                    from_sender, body, segments, encoding, metadata::jsonb, validity_seconds, \
                    provider, 0, due, send_at, created_at, created_at, expires_at, deadline_at, \
                    route, cost_micros, cost_currency, route_order \
                FROM input ORDER BY idempotency_key \
                ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
                RETURNING id) \
             SELECT ins.id IS NOT NULL AS created, m.id AS existing_id, m.fingerprint, \
                m.status, m.response_code, m.response_body \
             FROM input i \
             LEFT JOIN ins ON ins.id = i.id \
             LEFT JOIN messages m ON ins.id IS NULL AND m.tenant_id = i.tenant_id \
                AND m.idempotency_key = i.idempotency_key \
             ORDER BY i.ord",
        )
        .bind(&id)
        .bind(&tenant)
        .bind(&key)
        .bind(&fingerprint)
        .bind(&status)
        .bind(&to)
        .bind(&from)
        .bind(&body)
        .bind(&segments)
        .bind(&encoding)
        .bind(&metadata)
        .bind(&validity)
        .bind(&provider)
        .bind(&due)
        .bind(&send_at)
        .bind(&created)
        .bind(&expires)
        .bind(&deadline)
        .bind(&route)
        .bind(&cost)
        .bind(&currency)
        .bind(&route_order)
        .fetch_all(&self.pool)
        .await?;
        if answers.len() != n {
            return Err(StoreError::Invariant(
                "a batch insert answered another row count",
            ));
        }
        rows.iter()
            .zip(answers)
            .map(|(q, row)| answer(q, &row))
            .collect()
    }
}

fn answer(q: &Queued, row: &PgRow) -> Result<Option<Claim>, StoreError> {
    if row.try_get::<bool, _>("created")? {
        return Ok(Some(Claim::Created(Box::new(q.record()))));
    }
    let Some(existing) = row.try_get::<Option<Uuid>, _>("existing_id")? else {
        return Ok(None);
    };
    let (Some(fingerprint), Some(status)) = (
        row.try_get::<Option<Vec<u8>>, _>("fingerprint")?,
        row.try_get::<Option<Status>, _>("status")?,
    ) else {
        return Err(StoreError::Invariant("a taken key's row without its state"));
    };
    Ok(Some(Claim::Existing(KeyState {
        id: MessageId(existing),
        fingerprint,
        status,
        response: stored_response(row.try_get("response_code")?, row.try_get("response_body")?),
    })))
}
