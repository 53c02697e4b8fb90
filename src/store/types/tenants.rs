//! Tenants, their API keys and opt-outs, as the store reads and writes them.

use time::OffsetDateTime;
use uuid::Uuid;

/// A new API key, as stored.
#[derive(Clone, Debug)]
pub struct NewApiKey {
    pub id: Uuid,
    pub hash: Vec<u8>,
    pub prefix: String,
    pub scopes: crate::scopes::Scopes,
    pub label: Option<String>,
    /// A test-mode key (`so_test_`): it goes to the tenant's test
    /// namespace (its shadow tenant, made with its first test key).
    pub test: bool,
}

/// What a request learns about its tenant from its API key: one lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantAuth {
    pub id: Uuid,
    /// ISO 3166-1 alpha-2 codes messages may go to; `None`: anywhere.
    pub allowed_countries: Option<Vec<String>>,
    /// Senders this tenant may name in `from`; `None`: no list was set.
    pub allowed_senders: Option<Vec<String>>,
    /// This is tenant `default`, which accepts any sender until a list is set
    /// (single-tenant installs keep working).
    pub bootstrap_tenant: bool,
    /// Quiet hours in the recipient's local time, if the tenant set them.
    pub quiet_hours: Option<crate::domain::quiet::QuietHours>,
    /// The key itself: its id, label and scopes.
    pub key_id: Uuid,
    pub key_label: Option<String>,
    pub scopes: crate::scopes::Scopes,
    /// The tenant was disabled by an operator: its keys are refused.
    pub disabled: bool,
    /// Its home country: messages elsewhere count as international.
    pub home_country: Option<String>,
    /// The channels of a verification that names none (`None`: `sms`).
    pub verify_channels: Option<crate::domain::Channels>,
    /// Its spend caps; with any set, its sends are counted against them
    /// in the transaction of their insert (none in test mode).
    pub spend_caps: crate::spend::SpendCaps,
    /// In test mode: the live tenant whose test namespace `id` is (every
    /// setting above but the caps is the live tenant's). `None`: live.
    pub live_id: Option<Uuid>,
}

impl TenantAuth {
    /// Whether the key is a test-mode key: its messages go to test mode's
    /// simulated provider only, and it sees test data only.
    pub fn is_test(&self) -> bool {
        self.live_id.is_some()
    }

    /// The mode, as a metric label and the docs say it.
    pub fn mode(&self) -> &'static str {
        if self.is_test() { "test" } else { "live" }
    }

    /// Whether a request naming `from` (already normalised: E.164 or an
    /// alphanumeric id) may be sent: a sender on the tenant's list; without
    /// a list only the provider's default sender (no `from`), except on
    /// tenant `default`, which takes any sender until it has a list.
    pub fn may_send_as(&self, from: Option<&str>) -> bool {
        match (from, &self.allowed_senders) {
            (None, _) => true,
            (Some(from), Some(list)) => list.iter().any(|s| s == from),
            (Some(_), None) => self.bootstrap_tenant,
        }
    }
}

/// What making sure of the bootstrap key did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootstrapOutcome {
    /// Previous bootstrap keys revoked because the configured key changed:
    /// (id, prefix).
    pub revoked: Vec<(Uuid, String)>,
    /// The configured key itself was revoked earlier (by an operator, or by
    /// an instance started with a newer value), or is another tenant's:
    /// nothing else was revoked.
    pub configured_key_revoked: bool,
}

/// A number that asked not to be messaged.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OptOut {
    pub number: String,
    /// `api`, `inbound` (a STOP message) or `console`.
    pub source: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Who added it from the console (the key prefix of the session).
    #[serde(skip)]
    pub added_by: Option<String>,
}

/// An API key as listed to operators (never the key itself).
#[derive(Clone, Debug)]
pub struct ApiKeyInfo {
    pub id: Uuid,
    pub tenant_name: String,
    pub prefix: String,
    pub created_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    pub scopes: crate::scopes::Scopes,
    pub label: Option<String>,
    pub last_used_at: Option<OffsetDateTime>,
    /// A test-mode key (of the tenant's test namespace).
    pub test: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &[&str]) -> Option<Vec<String>> {
        Some(s.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn who_may_send_as_what() {
        // (list, bootstrap tenant, from, allowed)
        type Case<'a> = (Option<Vec<String>>, bool, Option<&'a str>, bool);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (None, false, None, true),
            (None, false, Some("ACME"), false),
            (None, true, Some("ACME"), true),
            (None, true, None, true),
            (list(&[]), false, None, true),
            (list(&[]), true, Some("ACME"), false),
            (list(&["ACME"]), false, Some("ACME"), true),
            (list(&["ACME"]), true, Some("ACME"), true),
            (list(&["ACME"]), false, Some("acme"), false),
            (list(&["ACME"]), true, Some("OTHER"), false),
            (list(&["ACME", "+14155550100"]), false, Some("+14155550100"), true),
        ];
        for (allowed_senders, bootstrap_tenant, from, want) in cases {
            let t = TenantAuth {
                id: Uuid::nil(),
                key_id: Uuid::nil(),
                key_label: None,
                scopes: crate::scopes::Scopes::DEFAULT,
                disabled: false,
                allowed_countries: None,
                allowed_senders: allowed_senders.clone(),
                bootstrap_tenant,
                quiet_hours: None,
                home_country: None,
                verify_channels: None,
                spend_caps: Default::default(),
                live_id: None,
            };
            assert_eq!(
                t.may_send_as(from),
                want,
                "{allowed_senders:?} {bootstrap_tenant} {from:?}"
            );
        }
    }
}
