//! The `simulated` provider: no network. It logs the message and answers with
//! an id `sim_<uuid>`, so the service runs anywhere without an account.

use async_trait::async_trait;
use uuid::Uuid;

use std::any::Any;
use std::sync::Arc;

use super::registry::{Channel, Adapter, Configured, Context, VarError, Vars};
use super::{OutgoingSms, Provider, ProviderError, SendOutcome};

/// The `simulated` adapter in the registry: no variables, no receipts.
pub const ADAPTER: Adapter = Adapter {
    name: "simulated",
    vars: &[],
    configure,
    receipts: None,
    channel: Channel::Sms,
    verify: None,
};

fn configure(_vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    Ok(Arc::new(SimulatedProvider {
        log_bodies: ctx.log_bodies,
    }))
}

/// Its settings are the whole provider.
impl Configured for SimulatedProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(self.clone()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Clone, Debug, Default)]
pub struct SimulatedProvider {
    /// Log the message body too (`SENDONCE_LOG_BODIES`); off by default,
    /// since a body may be a one-time code.
    pub log_bodies: bool,
}

#[async_trait]
impl Provider for SimulatedProvider {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn dedupes_by_key(&self) -> bool {
        // Nothing leaves the process, so nothing can be sent twice.
        true
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        if self.log_bodies {
            tracing::info!(message_id = %sms.message_id, to = %mask(sms.to.as_str()), body = %sms.body, "simulated send");
        } else {
            tracing::info!(message_id = %sms.message_id, to = %mask(sms.to.as_str()), "simulated send");
        }
        SendOutcome::Accepted {
            provider_message_id: format!("sim_{}", Uuid::new_v4().as_simple()),
            http_status: None,
        }
    }
}

/// A phone number with all but its last two digits hidden, for logs.
pub fn mask(number: &str) -> String {
    let keep = number.len().saturating_sub(2);
    number
        .char_indices()
        .map(|(i, c)| {
            if i < keep && c.is_ascii_digit() {
                '*'
            } else {
                c
            }
        })
        .collect()
}
