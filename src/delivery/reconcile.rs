//! Asking a provider whether it sent a message whose outcome we did not see.

use time::OffsetDateTime;

use super::Deliverer;
use crate::provider::{OutgoingSms, Provider, Reconciled};

impl Deliverer {
    /// Asks `provider` (called `name`) whether it sent `sms` since `since`:
    /// the one reconcile path, for an attempt a previous owner left open and
    /// for an ambiguous answer. `None` when shutdown stopped it. A provider
    /// no longer configured cannot be asked.
    ///
    /// A provider message id that another message already holds is never
    /// ours: the provider's single candidate was someone else's SMS, so
    /// nothing of ours was listed.
    pub(super) async fn reconcile(
        &self,
        provider: Option<&dyn Provider>,
        name: &str,
        sms: &OutgoingSms,
        since: OffsetDateTime,
    ) -> Option<Reconciled> {
        let Some(provider) = provider else {
            return Some(Reconciled::Unknown(format!(
                "the {name} provider is no longer configured and cannot be asked"
            )));
        };
        let answer = tokio::select! {
            r = provider.reconcile(sms, since) => r,
            () = self.stop.cancelled() => return None,
        };
        let Reconciled::Sent {
            provider_message_id,
        } = &answer
        else {
            return Some(answer);
        };
        let owner = self
            .store
            .provider_message_owner(provider.name(), provider_message_id)
            .await;
        Some(match owner {
            Ok(Some(owner)) if owner != sms.message_id => {
                tracing::warn!(
                    %owner,
                    "the provider's only candidate belongs to another message: not ours"
                );
                Reconciled::NotSent
            }
            Ok(_) => answer,
            Err(e) => Reconciled::Unknown(format!(
                "could not check who holds provider message {provider_message_id}: {e}"
            )),
        })
    }
}
