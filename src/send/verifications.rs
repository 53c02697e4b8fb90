//! Verifications through the send layer, without HTTP. A start's and a
//! resend's message is a send like any other: it counts against the
//! destination limits (a refused one whose key was answered already goes on
//! as a replay, and a permit is refunded unless a message was created), it
//! is inserted leased in the transaction of its cause, and it is handed to
//! delivery after the commit, never run in the request's future.
//!
//! A check or a resend is decided here with `verify::decide` from the row
//! as read, and its answer rendered here; the store writes the change only
//! if the row is still as read (`Changed::Stale` otherwise), and then this
//! reads and decides again.

use time::OffsetDateTime;
use uuid::Uuid;

use super::Sends;
use crate::domain::{FieldError, Recipient, segments};
use crate::error::ApiError;
use crate::store::TenantAuth;
use crate::store::{
    Changed, MessageRecord, NewMessage, NewVerification, OpKey, OpKind, StartOutcome, StartPolicy,
    StoreError, StoredOp, StoredResponse, VerificationRecord,
};
use crate::verify::decide::{self, PausePolicy, VerificationStatus};
use crate::verify::{
    Channel, Keys, SentMessage, StartRequest, VerificationOut, Verifier, VerifySettings, crypto,
    next_send, send_message,
};

/// How many times a check or a resend reads, decides and tries its fenced
/// write before giving up (503). Each failed try means another change was
/// written first, and a pending verification takes only a few (its checks
/// and sends are counted down), so this is not reached in practice.
const CHANGE_TRIES: usize = 64;

fn kept_changing() -> ApiError {
    ApiError::Unavailable("the verification kept changing under the write".into())
}

fn not_pending(s: VerificationStatus) -> ApiError {
    ApiError::VerificationNotPending(s.as_str())
}

/// What a check came to (a check of a verification no longer pending is
/// refused with 409).
#[derive(Debug)]
pub enum Checked {
    /// The stored answer of this check under its key.
    Replay(StoredResponse),
    /// Decided and written: its answer (200).
    Answered {
        decision: decide::Check,
        response: StoredResponse,
    },
    /// Found past its expiry: written `expired`, answered 409.
    Expired,
}

/// What a resend came to (one refused by the cooldown, the limit or the
/// status is an error).
#[derive(Debug)]
pub enum Resent {
    /// The stored answer of this resend under its key.
    Replay(StoredResponse),
    /// Sent (its message handed to delivery): its answer (201).
    Sent(StoredResponse),
    /// Found past its expiry: written `expired`, answered 409.
    Expired,
}

impl Sends {
    /// The messages sent for a verification, as answered (purged ones left
    /// out).
    pub async fn sent_messages(
        &self,
        v: &VerificationRecord,
    ) -> Result<Vec<SentMessage>, ApiError> {
        let mut out = Vec::new();
        for n in 1..=v.sends {
            // Step by step: a step's message exists only if the one before
            // it does.
            for key in v.step_keys(n) {
                let Some(m) = self.store.message(v.tenant_id, &key).await? else {
                    break;
                };
                let mut sent = SentMessage::of(&m, v);
                if sent.channel != Channel::SMS.as_str() {
                    sent.delivery_report = self.last_report(&m).await?;
                }
                out.push(sent);
            }
        }
        Ok(out)
    }

    /// The provider's last word in a receipt of `m`, if any came.
    async fn last_report(&self, m: &MessageRecord) -> Result<Option<String>, ApiError> {
        let receipts = self.store.receipts_after(m.id, None, 100).await?;
        Ok(receipts.into_iter().last().map(|r| r.provider_status))
    }

    /// Where a verification's first message starts: the first of
    /// `channels` that can be sent on (test mode's provider for a test
    /// key, whatever the channels). `Err`: a channel is not configured;
    /// `Ok(None)`: no SMS route covers the number.
    fn first_channel(
        &self,
        channels: &crate::verify::Channels,
        to: &str,
        test: bool,
    ) -> Result<Option<crate::domain::Via>, FieldError> {
        if test {
            return Ok(Some(crate::delivery::Deliverer::test_route()));
        }
        // An SMS to come must have a route now, as a first one must.
        if channels.contains(Channel::SMS) && !self.deliverer.has_route(to) {
            return Ok(None);
        }
        // Every channel named must be configured now.
        for channel in channels.iter() {
            if let Some((adapter, _)) = crate::provider::registry::verify_adapter(channel)
                && self.deliverer.provider(adapter.name).is_none()
            {
                let var = match adapter.channel {
                    crate::provider::registry::Channel::Own { enabled_by, .. } => enabled_by,
                    crate::provider::registry::Channel::Sms => adapter.name,
                };
                return Err(FieldError::new(
                    "channels",
                    format!("{channel} is not configured on this service ({var} is not set)"),
                ));
            }
        }
        Ok(self.deliverer.channel_route(channels.first(), to))
    }

    /// Builds and starts the verification `request` asks for under `key`:
    /// checks it against the tenant's countries and the segment limit, makes
    /// its id and its code (generated here, kept only as a MAC and sealed,
    /// dropped before the store is called), its first message and the abuse
    /// policy, then starts it ([`Sends::start_verification`]). A replay with
    /// another request under the key is refused (`KeyReused`). Answers the
    /// outcome and the time the verification was made at.
    pub async fn begin_verification(
        &self,
        verifier: &Verifier,
        tenant: &TenantAuth,
        key: &str,
        request: &StartRequest,
    ) -> Result<(StartOutcome, OffsetDateTime), ApiError> {
        let via = self.first_channel(&request.channels, request.to.as_str(), tenant.is_test());
        let mut errors: Vec<FieldError> =
            super::country_refused(tenant, request.country.as_deref())
                .into_iter()
                .collect();
        match &via {
            Err(e) => errors.push(e.clone()),
            Ok(None) => errors.push(FieldError::new("to", super::NO_ROUTE)),
            Ok(Some(_)) => {}
        }
        let longest = "9".repeat(usize::try_from(request.code_length).unwrap_or(10));
        let sample = crate::verify::render(request.template.as_deref(), &longest);
        if segments::count(&sample).segments > self.max_segments {
            errors.push(FieldError {
                field: "template".into(),
                message: format!("takes more than {} SMS segments", self.max_segments),
            });
        }
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let via = via.ok().flatten().ok_or_else(super::no_route)?;
        let settings = &verifier.settings;
        let keys = verifier.secret.keys().await?;
        let now = self.clock.now();
        let id = Uuid::now_v7();
        let code = crypto::generate_code(request.code_length);
        let new = NewVerification {
            id,
            tenant_id: tenant.id,
            idempotency_key: key.to_string(),
            fingerprint: request.fingerprint(),
            to: request.to.to_string(),
            country: request.country.clone(),
            prefix: crate::ratelimit::prefix_of(request.to.as_str()),
            code_length: request.code_length,
            code_mac: keys.code_mac(id, &code).to_vec(),
            code_sealed: keys.seal(id.as_bytes(), code.as_bytes()),
            template: request.template.clone(),
            checks_remaining: settings.max_checks,
            created_at: now,
            expires_at: now + time::Duration::seconds(i64::from(request.ttl_seconds)),
            channels: request.channels.clone(),
            fallback_after: request.fallback_after.clone(),
        };
        let mut first = VerificationRecord::started(&new);
        first.sends = 0;
        let mut message = send_message(
            &keys,
            &first,
            1,
            &code,
            &via,
            self.deliverer.settings().retry.deadline,
            now,
        )
        .ok_or_else(|| ApiError::Internal("a parsed number is not E.164".into()))?;
        message.cost = self.deliverer.verification_cost(&message);
        drop(code);
        let policy = StartPolicy {
            refused_here: None,
            number_per_hour: verifier.number_per_hour,
            prefix_per_hour: verifier.prefix_per_hour,
            pause: PausePolicy {
                min_starts: settings.pause_min_starts,
                min_approval_percent: settings.pause_min_approval_percent,
            },
            country_pause: PausePolicy {
                min_starts: settings.pause_country_min_starts,
                min_approval_percent: settings.pause_min_approval_percent,
            },
            pause_window: settings.pause_window,
            pause_for: settings.pause_duration,
        };
        let outcome = self.start_verification(&new, &message, policy).await?;
        if let StartOutcome::Existing(v) = &outcome
            && v.fingerprint != new.fingerprint
        {
            return Err(ApiError::KeyReused);
        }
        Ok((outcome, now))
    }

    /// Starts verification `new` with its first message (`message`) under
    /// the abuse rules of `policy`, and hands a created message to delivery.
    pub async fn start_verification(
        &self,
        new: &NewVerification,
        message: &NewMessage,
        policy: StartPolicy,
    ) -> Result<StartOutcome, ApiError> {
        let lease = self.deliverer.new_lease();
        // Refused here, a new start is refused by the store and a replay
        // still answered (issue 29, finding 3).
        let permit = self.limiter.send(new.tenant_id, &message.to);
        let policy = StartPolicy {
            refused_here: permit.as_ref().err().copied(),
            ..policy
        };
        // Two starts with one key but different destinations take different
        // prefix locks; the unique (tenant, key) constraint decides, and the
        // loser, tried again, finds the winner's verification.
        let mut outcome = self
            .store
            .start_verification(new, message, &lease, &policy)
            .await;
        if matches!(outcome, Err(StoreError::Conflict { .. })) {
            outcome = self
                .store
                .start_verification(new, message, &lease, &policy)
                .await;
        }
        if !matches!(outcome, Ok(StartOutcome::Created { .. }))
            && let Ok(permit) = permit
        {
            self.limiter.refund(permit);
        }
        let outcome = outcome.map_err(|e| self.spend_refusal(e))?;
        if let StartOutcome::Created { message, .. } = &outcome {
            self.deliverer.spawn(message.as_ref().clone(), lease);
        }
        Ok(outcome)
    }

    /// Checks `code` against verification `id` of the tenant, the answer
    /// stored under `key` when there is one. In test mode (`test`) the
    /// code [`crate::verify::decide::TEST_CODE`] is right too.
    pub async fn check_verification(
        &self,
        keys: &Keys,
        settings: &VerifySettings,
        (tenant_id, id): (Uuid, Uuid),
        code: &str,
        key: Option<&str>,
        test: bool,
    ) -> Result<Checked, ApiError> {
        // The fingerprint of a check is the code's HMAC: never the code.
        let fingerprint = keys.code_mac(id, code);
        let op = key.map(|key| OpKey {
            key,
            fingerprint: &fingerprint,
        });
        for _ in 0..CHANGE_TRIES {
            let v = self.verification(tenant_id, id).await?;
            if let Some(op) = op
                && let Some(done) = self
                    .store
                    .verification_op(id, OpKind::Check, op.key)
                    .await?
            {
                return replay_check(done, &fingerprint);
            }
            let now = self.clock.now();
            let matches =
                decide::code_accepted(test, code, || keys.code_matches(id, code, &v.code_mac));
            let decision = decide::check(&v.state(), now, matches);
            let after = v.checked(decision, now);
            let valid = match decision {
                decide::Check::Approve => true,
                decide::Check::Wrong { .. } | decide::Check::LastWrong => false,
                decide::Check::Expire => {
                    match self.store.check_verification(&v, &after, None).await? {
                        Changed::Stale => continue,
                        _ => return Ok(Checked::Expired),
                    }
                }
                decide::Check::NotPending(s) => return Err(not_pending(s)),
            };
            let mut out = VerificationOut::of(&after, self.sent_messages(&v).await?, settings, now);
            out.valid = Some(valid);
            let response = StoredResponse {
                status_code: 200,
                body: out.to_json(),
            };
            match self
                .store
                .check_verification(&v, &after, op.map(|op| (op, &response)))
                .await?
            {
                Changed::Stale => continue,
                Changed::Replay(done) => return replay_check(done, &fingerprint),
                Changed::Written(_) => return Ok(Checked::Answered { decision, response }),
            }
        }
        Err(kept_changing())
    }

    /// Sends verification `v`'s code once more under `key`, and hands the
    /// message to delivery.
    /// In test mode (`test`) its message goes to test mode's provider.
    pub async fn resend_verification(
        &self,
        keys: &Keys,
        settings: &VerifySettings,
        v: VerificationRecord,
        key: &str,
        test: bool,
    ) -> Result<Resent, ApiError> {
        // A resend is a send: it counts against the destination limits like
        // a `POST /messages` (issue 29, finding 3), before anything is
        // queued. A retried resend already answered is a replay and goes on.
        let to = Recipient::from_stored(&v.to, &[]).ok_or_else(|| {
            ApiError::Internal("a verification's stored number is not E.164".into())
        })?;
        let permit = match self.limiter.send(v.tenant_id, &to) {
            Ok(permit) => Some(permit),
            Err(refused) => {
                let answered = self
                    .store
                    .verification_op(v.id, OpKind::Resend, key)
                    .await?;
                if answered.is_none() {
                    return Err(ApiError::RateLimited {
                        limit: refused.limit,
                        retry_after: refused.retry_after,
                    });
                }
                None
            }
        };
        let outcome = self.resend_once(keys, settings, v, key, test).await;
        if !matches!(outcome, Ok(Resent::Sent(_)))
            && let Some(permit) = permit
        {
            self.limiter.refund(permit);
        }
        outcome
    }

    /// Reads, decides and writes one resend, starting from `v` as read,
    /// until a write holds.
    async fn resend_once(
        &self,
        keys: &Keys,
        settings: &VerifySettings,
        mut v: VerificationRecord,
        key: &str,
        test: bool,
    ) -> Result<Resent, ApiError> {
        let op = OpKey {
            key,
            fingerprint: b"resend",
        };
        for _ in 0..CHANGE_TRIES {
            if let Some(done) = self
                .store
                .verification_op(v.id, OpKind::Resend, key)
                .await?
            {
                return Ok(Resent::Replay(done.response));
            }
            let now = self.clock.now();
            match decide::resend(
                &v.state(),
                now,
                settings.resend_cooldown,
                settings.max_sends,
            ) {
                decide::Resend::Send => {}
                decide::Resend::Expire => {
                    let after = v.expired(now);
                    match self.store.check_verification(&v, &after, None).await? {
                        Changed::Stale => {
                            v = self.verification(v.tenant_id, v.id).await?;
                            continue;
                        }
                        _ => return Ok(Resent::Expired),
                    }
                }
                decide::Resend::TooSoon(wait) => return Err(ApiError::ResendTooSoon(wait)),
                decide::Resend::MaxSends => return Err(ApiError::MaxSendsReached),
                decide::Resend::NotPending(s) => return Err(not_pending(s)),
            }
            let (after, m, response) = self.next_send(keys, settings, &v, now, test).await?;
            let lease = self.deliverer.new_lease();
            match self
                .store
                .resend_verification(&v, &after, (op, &response), &m, &lease)
                .await
                .map_err(|e| self.spend_refusal(e))?
            {
                Changed::Stale => v = self.verification(v.tenant_id, v.id).await?,
                Changed::Replay(done) => return Ok(Resent::Replay(done.response)),
                Changed::Written(Some(message)) => {
                    self.deliverer.spawn(*message, lease);
                    return Ok(Resent::Sent(response));
                }
                Changed::Written(None) => {
                    return Err(ApiError::Internal(
                        "a resend written without its message".into(),
                    ));
                }
            }
        }
        Err(kept_changing())
    }

    /// A resend's verification after it, its message and its answer.
    async fn next_send(
        &self,
        keys: &Keys,
        settings: &VerifySettings,
        v: &VerificationRecord,
        now: OffsetDateTime,
        test: bool,
    ) -> Result<(VerificationRecord, NewMessage, StoredResponse), ApiError> {
        let after = v.resent(now);
        let deadline = self.deliverer.settings().retry.deadline;
        // A resend follows the same channel order.
        let via = self
            .first_channel(&v.channels, &v.to, test)
            .map_err(|e| ApiError::Validation(vec![e]))?
            .ok_or_else(super::no_route)?;
        let mut m = next_send(keys, v, &via, deadline, now).ok_or(StoreError::Invariant(
            "a verification's code does not open with the verify secret",
        ))?;
        m.cost = self.deliverer.verification_cost(&m);
        let mut all = self.sent_messages(v).await?;
        all.push(SentMessage::queued(&m, &after));
        let response = StoredResponse {
            status_code: 201,
            body: VerificationOut::of(&after, all, settings, now).to_json(),
        };
        Ok((after, m, response))
    }

    /// A verification send over a spend cap is refused as a message is
    /// (429 `spend-cap-reached`, nothing stored); other errors as they are.
    fn spend_refusal(&self, e: StoreError) -> ApiError {
        match e {
            StoreError::SpendCap(cap) => {
                self.deliverer
                    .metrics()
                    .spend_event("refused", cap.as_str());
                ApiError::SpendCapReached {
                    cap: cap.as_str(),
                    retry_after: crate::spend::retry_after(cap, self.clock.now()),
                }
            }
            other => other.into(),
        }
    }

    async fn verification(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<VerificationRecord, ApiError> {
        self.store
            .verification(tenant_id, id)
            .await?
            .ok_or(ApiError::NotFound)
    }
}

/// The stored answer of a check under the same key, if it was this check.
fn replay_check(done: StoredOp, fingerprint: &[u8]) -> Result<Checked, ApiError> {
    if done.fingerprint != fingerprint {
        return Err(ApiError::KeyReused);
    }
    Ok(Checked::Replay(done.response))
}
