//! Asking a provider whether it sent a message whose outcome we did not see.

use super::Deliverer;
use crate::provider::{AttemptRef, OutgoingSms, Provider, Reconciled};

impl Deliverer {
    /// Asks `provider` (called `name`) whether `attempt` sent `sms`: the one
    /// reconcile path, for an attempt a previous owner left open and for an
    /// ambiguous answer. `None` when shutdown stopped it. A provider no
    /// longer configured cannot be asked.
    ///
    /// A provider message id is never read-then-taken (except our own
    /// message id, which only this message can have). A candidate that
    /// another message already holds is not ours: the provider's single
    /// candidate was someone else's SMS, so nothing of ours was listed,
    /// which is no answer yet on a list that may lag (asked again later,
    /// never resent). A
    /// candidate that another in-flight message to the same number with the
    /// same body could still turn out to own (its answer not written yet) is
    /// not taken either: the question is asked again later, when that
    /// message has written its id or its own doubt (issue 24, finding 3).
    /// And the final write of a taken id is refused by the unique
    /// constraint on (provider, id) if another message wrote it first.
    pub(super) async fn reconcile(
        &self,
        provider: Option<&dyn Provider>,
        name: &str,
        sms: &OutgoingSms,
        attempt: &AttemptRef,
    ) -> Option<Reconciled> {
        let Some(provider) = provider else {
            return Some(Reconciled::Unknown(format!(
                "the {name} provider is no longer configured and cannot be asked"
            )));
        };
        let answer = tokio::select! {
            r = provider.reconcile(sms, attempt) => r,
            () = self.stop.cancelled() => return None,
        };
        let Reconciled::Sent {
            provider_message_id,
        } = &answer
        else {
            return Some(answer);
        };
        // A provider asked by our own message id (Infobip's `messageId`)
        // answers with it: no other message can hold that id or have
        // created that SMS, so neither check below applies (the sibling one
        // would only hold two same-text messages back, each waiting on the
        // other until both ended `unknown`).
        if *provider_message_id == sms.message_id.to_string() {
            return Some(answer);
        }
        let owner = self
            .store
            .provider_message_owner(provider.name(), provider_message_id)
            .await;
        match owner {
            Ok(Some(owner)) if owner != sms.message_id => {
                tracing::info!(
                    %owner,
                    "the provider's only candidate belongs to another message: asking again later"
                );
                return Some(Reconciled::Pending(format!(
                    "the provider's only candidate {provider_message_id} belongs to another \
                     message; this one is not listed yet"
                )));
            }
            Ok(_) => {}
            Err(e) => {
                return Some(Reconciled::Unknown(format!(
                    "could not check who holds provider message {provider_message_id}: {e}"
                )));
            }
        }
        // An `unknown` sibling matters if it could have created a message in
        // this attempt's window (a minute of slack for the clocks involved).
        let since = attempt.started_at - time::Duration::minutes(1);
        Some(
            match self
                .store
                .in_flight_sibling(sms.message_id, provider.name(), since)
                .await
            {
                Ok(None) => answer,
                Ok(Some(sibling)) => {
                    tracing::info!(
                        %sibling,
                        "the provider's only candidate could be another message's still in flight: asking again later"
                    );
                    Reconciled::Pending(format!(
                        "provider message {provider_message_id} could belong to another message \
                         to this number with the same text, still in flight"
                    ))
                }
                Err(e) => Reconciled::Pending(format!(
                    "could not check for another message in flight that may own provider \
                     message {provider_message_id}: {e}"
                )),
            },
        )
    }
}
