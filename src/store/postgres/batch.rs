//! Coalesced writes on Postgres: concurrent claims (`insert_message`) go to
//! the database together as one multi-row statement, and so do concurrent
//! final writes (`finish`); each caller waits for its own row's result.
//!
//! A lane is a queue and a small task. The task takes everything waiting
//! when a slot frees (at most [`IN_FLIGHT`] statements of a kind run at
//! once), so batches form on demand: nothing ever waits on a timer, and a
//! request that finds the lane idle goes out at once, alone, through the
//! same single-row statement as before batching. The statement runs in its
//! own task, never in a request's future: a caller that goes away cannot
//! cancel its batch-mates' write.
//!
//! Errors stay per message. One statement is one transaction: when it fails
//! with a database error (a constraint one row broke, a deadlock) nothing of
//! it was committed, so every row of that batch is tried again alone and
//! gets its own answer. When the database is unreachable the commit's fate
//! may be unknown; then every caller gets `Unavailable`, as a single-row
//! write would, and a row that did commit is resumed from its lease like any
//! other unanswered one.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use super::lanes::Lane;
use super::webhooks::EVENT_FROM_M;
use super::{PgStore, to_i32};
use crate::domain::{MessageId, Status};
use crate::metrics::BatchKind;
use crate::store::row::stored_response;
use crate::store::time::{DbTime, micros};
use crate::store::{Claim, Finish, KeyState, Lease, MessageRecord, NewMessage, StoreError};

/// The lanes of one store: claims and final writes, and the look for
/// receipts that overtook a final write (a read, coalesced the same way).
pub(super) struct Lanes {
    pub(super) claim: Lane<(NewMessage, Lease), Claim>,
    pub(super) finish: Lane<Finish, bool>,
    pub(super) look: Lane<(String, String), bool>,
}

impl Lanes {
    /// The lanes' tasks hold a copy of the store without lanes (they only
    /// run single-row statements on it), so the store and its tasks do not
    /// keep each other alive.
    pub(super) fn start(store: &PgStore) -> Self {
        let bare = PgStore {
            pool: store.pool.clone(),
            sizes: Arc::clone(&store.sizes),
            lanes: Arc::default(),
            hosts: store.hosts.clone(),
            direct: store.direct.clone(),
        };
        let s = bare.clone();
        let claim = Lane::start(BatchKind::Claim, Arc::clone(&store.sizes), move |items| {
            let s = s.clone();
            async move { claim_batch(&s, items).await }
        });
        let s = bare.clone();
        let finish = Lane::start(BatchKind::Finish, Arc::clone(&store.sizes), move |items| {
            let s = s.clone();
            async move { finish_batch(&s, items).await }
        });
        let s = bare;
        let look = Lane::start(BatchKind::Look, Arc::clone(&store.sizes), move |items| {
            let s = s.clone();
            async move { look_batch(&s, items).await }
        });
        Self {
            claim,
            finish,
            look,
        }
    }
}

/// Whether a failed batch may be retried row by row: a database error means
/// the statement, and so its transaction, was rolled back. Anything else
/// (the connection lost mid-commit) leaves its fate unknown.
fn rolled_back(e: &StoreError) -> bool {
    matches!(e, StoreError::Other(_) | StoreError::Conflict { .. })
}

/// The same failure for every caller of a batch that could not be written.
fn unavailable_for_all(e: &StoreError) -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::other(format!(
        "a coalesced write failed: {e}"
    ))))
}

// ---------------------------------------------------------------- claims

/// Claims a batch. Requests for a key already in the batch are answered from
/// the first one's result (as the unique constraint would answer them).
async fn claim_batch(
    store: &PgStore,
    items: Vec<(NewMessage, Lease)>,
) -> Vec<Result<Claim, StoreError>> {
    if let [(m, lease)] = items.as_slice() {
        return vec![store.insert_one(m, lease).await];
    }
    // First request per (tenant, key), in key order: concurrent batches then
    // take a key's index entries in one order and cannot deadlock each other.
    let mut first: HashMap<(Uuid, &str), usize> = HashMap::new();
    let mut leaders: Vec<usize> = Vec::new();
    let mut follows: Vec<Option<usize>> = Vec::with_capacity(items.len());
    for (i, (m, _)) in items.iter().enumerate() {
        match first.get(&(m.tenant_id, m.idempotency_key.as_str())) {
            Some(&l) => follows.push(Some(l)),
            None => {
                first.insert((m.tenant_id, m.idempotency_key.as_str()), i);
                leaders.push(i);
                follows.push(None);
            }
        }
    }
    leaders.sort_by(|a, b| {
        let (ma, mb) = (&items[*a].0, &items[*b].0);
        (ma.tenant_id, ma.idempotency_key.as_str())
            .cmp(&(mb.tenant_id, mb.idempotency_key.as_str()))
    });
    let rows: Vec<&(NewMessage, Lease)> = leaders.iter().map(|i| &items[*i]).collect();
    let mut results: Vec<Option<Result<Claim, StoreError>>> =
        (0..items.len()).map(|_| None).collect();
    match claim_statement(&store.pool, &rows).await {
        Ok(answers) => {
            for (i, answer) in leaders.iter().zip(answers) {
                let (m, lease) = &items[*i];
                results[*i] = Some(match answer {
                    ClaimAnswer::Created {
                        opted_out,
                        lease_expires_at,
                    } => Ok(Claim::Created(Box::new(MessageRecord::claimed(
                        m,
                        lease,
                        lease_expires_at,
                        opted_out,
                    )))),
                    ClaimAnswer::Existing(state) => Ok(Claim::Existing(state)),
                    // Taken by a message committed after the statement's
                    // snapshot, or released since: the single-row path
                    // reads again and retries.
                    ClaimAnswer::Unseen => store.insert_one(m, lease).await,
                });
            }
        }
        Err(e) if rolled_back(&e) => {
            tracing::warn!(error = %e, rows = rows.len(), "a coalesced claim failed; trying its rows one by one");
            for i in &leaders {
                let (m, lease) = &items[*i];
                results[*i] = Some(store.insert_one(m, lease).await);
            }
        }
        Err(e) => {
            for i in &leaders {
                results[*i] = Some(Err(unavailable_for_all(&e)));
            }
        }
    }
    // Duplicates within the batch: what the first request's claim makes of
    // the key (a created message is `processing`, without a response yet).
    for (i, leader) in follows.iter().enumerate() {
        let Some(l) = leader else { continue };
        let answer = match &results[*l] {
            Some(Ok(Claim::Created(record))) => Ok(Claim::Existing(KeyState {
                id: record.id,
                fingerprint: record.fingerprint.clone(),
                status: Status::Processing,
                response: None,
            })),
            Some(Ok(Claim::Existing(state))) => Ok(Claim::Existing(state.clone())),
            // The first one failed on its own: this one is tried alone.
            Some(Err(_)) | None => {
                let (m, lease) = &items[i];
                store.insert_one(m, lease).await
            }
        };
        results[i] = Some(answer);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(StoreError::Invariant("a claim without an answer"))))
        .collect()
}

enum ClaimAnswer {
    Created {
        opted_out: bool,
        lease_expires_at: OffsetDateTime,
    },
    Existing(KeyState),
    Unseen,
}

/// One multi-row claiming insert, with the attempt rows, the opt-out check
/// and, for a taken key, the holder's state: the single-row statement of
/// `messages.rs` over arrays. Answers in the order of `rows`. A taken key's
/// holder is read per row through its unique index (`LATERAL … LIMIT 1`,
/// which the planner cannot turn into a join over the whole table, as it
/// did, scanning `messages`, while its statistics lagged a growing table).
async fn claim_statement(
    pool: &PgPool,
    rows: &[&(NewMessage, Lease)],
) -> Result<Vec<ClaimAnswer>, StoreError> {
    let n = rows.len();
    let mut id = Vec::with_capacity(n);
    let mut tenant = Vec::with_capacity(n);
    let mut key = Vec::with_capacity(n);
    let mut fingerprint = Vec::with_capacity(n);
    let mut to = Vec::with_capacity(n);
    let mut from = Vec::with_capacity(n);
    let mut body = Vec::with_capacity(n);
    let mut segments = Vec::with_capacity(n);
    let mut encoding = Vec::with_capacity(n);
    let mut metadata = Vec::with_capacity(n);
    let mut validity = Vec::with_capacity(n);
    let mut provider = Vec::with_capacity(n);
    let mut token = Vec::with_capacity(n);
    let mut owner = Vec::with_capacity(n);
    let mut lease_ttl = Vec::with_capacity(n);
    let mut created = Vec::with_capacity(n);
    let mut expires = Vec::with_capacity(n);
    let mut deadline = Vec::with_capacity(n);
    let mut sender = Vec::with_capacity(n);
    let mut route = Vec::with_capacity(n);
    let mut cost = Vec::with_capacity(n);
    let mut currency = Vec::with_capacity(n);
    let mut route_order = Vec::with_capacity(n);
    for (m, lease) in rows {
        id.push(m.id.0);
        tenant.push(m.tenant_id);
        key.push(m.idempotency_key.as_str());
        fingerprint.push(m.fingerprint.as_slice());
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
        token.push(lease.token);
        owner.push(lease.owner.as_str());
        lease_ttl.push(micros(lease.ttl));
        created.push(m.created_at);
        expires.push(m.expires_at);
        deadline.push(m.deadline_at);
        sender.push(m.sender.as_deref());
        route.push(m.route.as_deref());
        let (c, cur) = m.cost_columns();
        cost.push(c);
        currency.push(cur);
        route_order.push(m.route_order.as_deref());
    }
    let answers: Vec<PgRow> = sqlx::query(
        "WITH input AS ( \
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::text[], \
                $6::text[], $7::text[], $8::int4[], $9::text[], $10::text[], $11::int4[], \
                $12::text[], $13::uuid[], $14::text[], $15::int8[], $16::timestamptz[], \
                $17::timestamptz[], $18::timestamptz[], $19::text[], $20::text[], $21::int8[], \
                $22::text[], $23::text[]) \
            WITH ORDINALITY \
            AS t(id, tenant_id, idempotency_key, fingerprint, to_number, from_sender, body, \
                segments, encoding, metadata, validity_seconds, provider, lease_token, \
                lease_owner, lease_ttl, created_at, expires_at, deadline_at, sender, route, \
                cost_micros, cost_currency, route_order, ord)), \
         ins AS ( \
            INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, \
                to_number, from_sender, body, segments, encoding, metadata, \
                validity_seconds, provider, attempts, lease_token, lease_owner, \
                lease_expires_at, created_at, updated_at, expires_at, deadline_at, route, \
                cost_micros, cost_currency, route_order) \
            SELECT id, tenant_id, idempotency_key, fingerprint, 'processing', to_number, \
                from_sender, body, segments, encoding, metadata::jsonb, validity_seconds, \
                provider, 1, lease_token, lease_owner, \
                now() + lease_ttl * interval '1 microsecond', created_at, \
                created_at, expires_at, deadline_at, route, cost_micros, cost_currency, \
                route_order \
            FROM input ORDER BY ord \
            ON CONFLICT (tenant_id, idempotency_key) DO NOTHING \
            RETURNING id, lease_owner, created_at, lease_expires_at), \
         att AS ( \
            INSERT INTO attempts (message_id, number, lease_owner, started_at, sender) \
            SELECT ins.id, 1, ins.lease_owner, ins.created_at, i.sender \
            FROM ins JOIN input i ON i.id = ins.id) \
         SELECT ins.id IS NOT NULL AS created, m.id AS existing_id, m.fingerprint, m.status, \
            m.response_code, m.response_body, \
            ins.id IS NOT NULL AND EXISTS (SELECT 1 FROM opt_outs o \
                WHERE o.tenant_id = i.tenant_id AND o.number = i.to_number) AS opted_out, \
            ins.lease_expires_at \
         FROM input i \
         LEFT JOIN ins ON ins.id = i.id \
         LEFT JOIN LATERAL ( \
            SELECT id, fingerprint, status, response_code, response_body FROM messages \
            WHERE ins.id IS NULL AND tenant_id = i.tenant_id \
                AND idempotency_key = i.idempotency_key LIMIT 1) m ON true \
         ORDER BY i.ord",
    )
    .bind(&id)
    .bind(&tenant)
    .bind(&key)
    .bind(&fingerprint)
    .bind(&to)
    .bind(&from)
    .bind(&body)
    .bind(&segments)
    .bind(&encoding)
    .bind(&metadata)
    .bind(&validity)
    .bind(&provider)
    .bind(&token)
    .bind(&owner)
    .bind(&lease_ttl)
    .bind(&created)
    .bind(&expires)
    .bind(&deadline)
    .bind(&sender)
    .bind(&route)
    .bind(&cost)
    .bind(&currency)
    .bind(&route_order)
    .fetch_all(pool)
    .await?;
    if answers.len() != n {
        return Err(StoreError::Invariant(
            "a coalesced claim answered another row count",
        ));
    }
    answers.iter().map(claim_answer).collect()
}

/// What one row of the coalesced claim says about its request.
fn claim_answer(row: &PgRow) -> Result<ClaimAnswer, StoreError> {
    if row.try_get::<bool, _>("created")? {
        let Some(expires) = row.try_get::<Option<DbTime>, _>("lease_expires_at")? else {
            return Err(StoreError::Invariant("a new message without its lease"));
        };
        return Ok(ClaimAnswer::Created {
            opted_out: row.try_get("opted_out")?,
            lease_expires_at: expires.0,
        });
    }
    let Some(existing) = row.try_get::<Option<Uuid>, _>("existing_id")? else {
        return Ok(ClaimAnswer::Unseen);
    };
    let (Some(fingerprint), Some(status)) = (
        row.try_get::<Option<Vec<u8>>, _>("fingerprint")?,
        row.try_get::<Option<Status>, _>("status")?,
    ) else {
        return Err(StoreError::Invariant("a taken key's row without its state"));
    };
    Ok(ClaimAnswer::Existing(KeyState {
        id: MessageId(existing),
        fingerprint,
        status,
        response: stored_response(row.try_get("response_code")?, row.try_get("response_body")?),
    }))
}

// ---------------------------------------------------------------- finishes

/// Finishes a batch: one fenced `UPDATE … FROM unnest(…)` for messages with
/// distinct ids (a second write for an id in the batch goes alone, after).
async fn finish_batch(store: &PgStore, items: Vec<Finish>) -> Vec<Result<bool, StoreError>> {
    if let [f] = items.as_slice() {
        return vec![store.finish_one(f).await];
    }
    let mut seen = std::collections::HashSet::new();
    let (mut batch, mut alone): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (i, f) in items.iter().enumerate() {
        // One that also opts its address out goes alone (`finish_one`
        // writes both in one statement).
        if f.opt_out.is_none() && seen.insert(f.id.0) {
            batch.push(i);
        } else {
            alone.push(i);
        }
    }
    // Row locks in id order: two batches never wait on each other in a cycle.
    batch.sort_by_key(|i| items[*i].id.0);
    let rows: Vec<&Finish> = batch.iter().map(|i| &items[*i]).collect();
    let mut results: Vec<Option<Result<bool, StoreError>>> =
        (0..items.len()).map(|_| None).collect();
    match finish_statement(&store.pool, &rows).await {
        Ok(done) => {
            for i in &batch {
                results[*i] = Some(Ok(done.contains(&items[*i].id.0)));
            }
        }
        Err(e) if rolled_back(&e) => {
            tracing::warn!(error = %e, rows = rows.len(), "a coalesced final write failed; trying its rows one by one");
            alone.extend_from_slice(&batch);
        }
        Err(e) => {
            for i in &batch {
                results[*i] = Some(Err(unavailable_for_all(&e)));
            }
        }
    }
    for i in alone {
        results[i] = Some(store.finish_one(&items[i]).await);
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or(Err(StoreError::Invariant(
                "a final write without an answer",
            )))
        })
        .collect()
}

/// One fenced multi-row final write, closing each message's attempt: the
/// single-row statement of `messages.rs` over arrays. Rows are found by
/// primary key (`id = ANY($1)`); the status test is written as an
/// expression (`status || ''`) so that the planner can never answer it
/// from a partial index on `status = 'processing'`: such an index holds an
/// entry for every message that was processing since the last vacuum, and
/// the planner, which counts only live rows, took it for the cheapest way
/// and read it whole (BENCHMARKS.md, "Plans"). Returns the ids it
/// made final (the others' leases were no longer theirs).
async fn finish_statement(
    pool: &PgPool,
    rows: &[&Finish],
) -> Result<std::collections::HashSet<Uuid>, StoreError> {
    let n = rows.len();
    let mut id = Vec::with_capacity(n);
    let mut token = Vec::with_capacity(n);
    let mut status = Vec::with_capacity(n);
    let mut pmid = Vec::with_capacity(n);
    let mut error = Vec::with_capacity(n);
    let mut sent_at: Vec<Option<OffsetDateTime>> = Vec::with_capacity(n);
    let mut updated_at = Vec::with_capacity(n);
    let mut code = Vec::with_capacity(n);
    let mut body = Vec::with_capacity(n);
    let mut number = Vec::with_capacity(n);
    let mut finished_at: Vec<Option<OffsetDateTime>> = Vec::with_capacity(n);
    let mut outcome = Vec::with_capacity(n);
    let mut http_status = Vec::with_capacity(n);
    let mut provider_code = Vec::with_capacity(n);
    let mut attempt_error = Vec::with_capacity(n);
    let mut attempt_pmid = Vec::with_capacity(n);
    for f in rows {
        let a = f.attempt.as_ref();
        id.push(f.id.0);
        token.push(f.lease_token);
        status.push(f.status.as_str());
        pmid.push(f.provider_message_id.as_deref());
        error.push(
            f.error
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|_| StoreError::Invariant("an error that is not JSON"))?,
        );
        sent_at.push(f.sent_at);
        updated_at.push(f.updated_at);
        code.push(i16::try_from(f.response.status_code).unwrap_or(500));
        body.push(f.response.body.as_slice());
        number.push(a.map(|a| to_i32(a.number)).unwrap_or(-1));
        finished_at.push(a.map(|a| a.finished_at));
        outcome.push(a.map(|a| a.outcome.as_str()));
        http_status.push(a.and_then(|a| a.http_status.map(i32::from)));
        provider_code.push(a.and_then(|a| a.provider_code.as_deref()));
        attempt_error.push(a.and_then(|a| a.error.as_deref()));
        attempt_pmid.push(a.and_then(|a| a.provider_message_id.as_deref()));
    }
    // The outbox rows are written by this same statement (`EVENT_FROM_M`).
    let done: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH input AS ( \
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], \
                $6::timestamptz[], $7::timestamptz[], $8::int2[], $9::bytea[], $10::int4[], \
                $11::timestamptz[], $12::text[], $13::int4[], $14::text[], $15::text[], \
                $16::text[]) \
            AS t(id, lease_token, status, provider_message_id, error, sent_at, updated_at, \
                response_code, response_body, number, finished_at, outcome, http_status, \
                provider_code, attempt_error, attempt_pmid)), \
         m AS ( \
            UPDATE messages SET status = i.status, provider_message_id = i.provider_message_id, \
                error = i.error::jsonb, sent_at = i.sent_at, updated_at = i.updated_at, \
                finalized_at = i.updated_at, response_code = i.response_code, \
                response_body = i.response_body, lease_token = NULL, lease_owner = NULL, \
                lease_expires_at = NULL, next_attempt_at = NULL \
            FROM input i \
            WHERE messages.id = i.id AND messages.id = ANY($1) \
                AND messages.lease_token = i.lease_token \
                AND messages.status || '' = 'processing' \
            RETURNING messages.id, messages.tenant_id, messages.status, \
                messages.response_body, messages.updated_at), \
         a AS ( \
            UPDATE attempts SET finished_at = i.finished_at, outcome = i.outcome, \
                http_status = i.http_status, provider_code = i.provider_code, \
                error = i.attempt_error, provider_message_id = i.attempt_pmid \
            FROM input i JOIN m ON m.id = i.id \
            WHERE attempts.message_id = i.id AND attempts.number = i.number \
                AND attempts.finished_at IS NULL), \
         {EVENT_FROM_M} \
         SELECT id FROM m",
    )))
    .bind(&id)
    .bind(&token)
    .bind(&status)
    .bind(&pmid)
    .bind(&error)
    .bind(&sent_at)
    .bind(&updated_at)
    .bind(&code)
    .bind(&body)
    .bind(&number)
    .bind(&finished_at)
    .bind(&outcome)
    .bind(&http_status)
    .bind(&provider_code)
    .bind(&attempt_error)
    .bind(&attempt_pmid)
    .fetch_all(pool)
    .await?;
    Ok(done.into_iter().collect())
}

// ---------------------------------------------------------------- receipts

/// Whether unlinked receipts wait for each (provider, provider message id):
/// one read for the batch. It runs after the final writes it follows have
/// committed (each caller queues only after its own commit), which is what
/// keeps it from missing a receipt that committed in between
/// (`delivery/apply.rs`). A failed read is tried again row by row.
async fn look_batch(
    store: &PgStore,
    items: Vec<(String, String)>,
) -> Vec<Result<bool, StoreError>> {
    if let [(provider, id)] = items.as_slice() {
        return vec![store.has_unmatched_one(provider, id).await];
    }
    let providers: Vec<&str> = items.iter().map(|(p, _)| p.as_str()).collect();
    let ids: Vec<&str> = items.iter().map(|(_, i)| i.as_str()).collect();
    let found = sqlx::query_as::<_, (String, String)>(
        "SELECT DISTINCT r.provider, r.provider_message_id \
         FROM unnest($1::text[], $2::text[]) AS q(provider, provider_message_id) \
         JOIN receipts r ON r.provider = q.provider \
          AND r.provider_message_id = q.provider_message_id \
         WHERE r.message_id IS NULL",
    )
    .bind(&providers)
    .bind(&ids)
    .fetch_all(&store.pool)
    .await;
    match found {
        Ok(found) => {
            let found: std::collections::HashSet<(String, String)> = found.into_iter().collect();
            items.iter().map(|k| Ok(found.contains(k))).collect()
        }
        Err(e) => {
            tracing::warn!(error = %e, rows = items.len(), "a coalesced receipts look failed; trying its rows one by one");
            let mut out = Vec::with_capacity(items.len());
            for (provider, id) in &items {
                out.push(store.has_unmatched_one(provider, id).await);
            }
            out
        }
    }
}
