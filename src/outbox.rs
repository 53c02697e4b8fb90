//! The local outbox (issue 42): what the `simulated` provider was handed,
//! bodies opened, codes included, for trying the service on a laptop.
//! `sendonce outbox` and `/console/outbox` show it only while every
//! configured provider is `simulated`, and only the attempts that provider
//! answered: a real provider's messages (and their codes) are never shown.

use crate::store::OutboxEntry;

/// The provider whose sends the outbox shows.
pub const OUTBOX_PROVIDER: &str = crate::provider::simulated::ADAPTER.name;
use crate::verify::SecretSource;

/// Why the outbox shows nothing when a configured provider is not the
/// simulated one (`names`: the configured providers), or `None` when it may.
pub fn refusal(names: &[&str]) -> Option<String> {
    let real: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != OUTBOX_PROVIDER)
        .collect();
    if real.is_empty() {
        return None;
    }
    Some(format!(
        "the outbox is only for the simulated provider (SENDONCE_PROVIDER=simulated, the \
         default): this service is configured with {}, so nothing is shown; what a real \
         provider sends, codes included, is never shown here",
        real.join(", ")
    ))
}

/// The entries with their bodies opened as delivery opens them: a
/// verification's sealed body with the verify secret. A body that does not
/// open says why instead.
pub async fn opened(entries: Vec<OutboxEntry>, secret: &SecretSource) -> Vec<OutboxEntry> {
    let mut out = Vec::with_capacity(entries.len());
    for mut e in entries {
        if crate::verify::crypto::is_sealed(&e.body) {
            e.body = match secret.keys().await {
                Ok(keys) => keys.open_body(e.message_id.0, &e.body).unwrap_or_else(|_| {
                    "(sealed: it does not open with this verify secret; \
                     SENDONCE_VERIFY_SECRET changed since it was sent)"
                        .into()
                }),
                Err(err) => format!("(sealed: the verify secret cannot be read: {err})"),
            };
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_simulated_provider_is_shown() {
        assert_eq!(super::refusal(&["simulated"]), None);
        let said = super::refusal(&["simulated", "infobip"]).unwrap_or_default();
        assert!(said.contains("only for the simulated provider") && said.contains("infobip"));
        assert!(said.contains("configured with infobip, so"), "{said}");
    }
}
