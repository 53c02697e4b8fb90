//! The `whatsapp` adapter's variables and settings.

use std::any::Any;
use std::sync::Arc;

use super::super::receipts::ReceiptRoute;
use super::super::registry::{
    Adapter, Address, Channel, Configured, Context, Inbound, InboundRoute, Receipts, Var, VarError, Vars,
    VerifyChannel, http_url,
};
use super::super::{Provider, ProviderError};
use super::inbound::WhatsAppInbound;
use super::webhook::WhatsAppWebhook;
use super::{WEBHOOK_PATH, WhatsAppProvider, WhatsAppSettings};

/// The `whatsapp` adapter in the registry: a channel of its own (codes as
/// WhatsApp authentication templates to a phone number), on when its access
/// token is set. No route or `SENDONCE_PROVIDER` names it: a verification
/// whose `channels` name `whatsapp` sends its code alone through it. Its
/// webhook takes `GET` (Meta's subscription handshake) and `POST`
/// (statuses, and what users write: its inbound route shares the path).
pub const ADAPTER: Adapter = Adapter {
    name: super::NAME,
    vars: &VARS,
    configure,
    receipts: Some(Receipts {
        path: WEBHOOK_PATH,
        configure: configure_webhook,
        get: true,
    }),
    channel: Channel::Own {
        name: super::NAME,
        enabled_by: ACCESS_TOKEN,
        address: Address::Phone,
    },
    verify: Some(VerifyChannel {
        name: super::NAME,
        code_digits: super::CODE_DIGITS,
        code_only: true,
        priced_when_listed: true,
    }),
    inbound: Some(Inbound {
        path: WEBHOOK_PATH,
        configure: configure_inbound,
        keep: super::inbound::KEEP,
        max_bytes: super::inbound::MAX_BYTES,
    }),
};

pub const ACCESS_TOKEN: &str = "WHATSAPP_ACCESS_TOKEN";
pub const PHONE_NUMBER_ID: &str = "WHATSAPP_PHONE_NUMBER_ID";
pub const APP_SECRET: &str = "WHATSAPP_APP_SECRET";
pub const VERIFY_TOKEN: &str = "WHATSAPP_VERIFY_TOKEN";
pub const TEMPLATE_NAME: &str = "WHATSAPP_TEMPLATE_NAME";
pub const TEMPLATE_LANGUAGE: &str = "WHATSAPP_TEMPLATE_LANGUAGE";
pub const BASE_URL: &str = "WHATSAPP_BASE_URL";
pub const TENANT: &str = "WHATSAPP_TENANT";

/// Meta's Graph API, at the version the adapter was written against
/// (v21.0, released 2 October 2024; Meta's own sample of an authentication
/// template send uses it).
pub const DEFAULT_BASE_URL: &str = "https://graph.facebook.com/v21.0";

pub const DEFAULT_TEMPLATE_LANGUAGE: &str = "en_US";

const VARS: [Var; 8] = [
    Var {
        env: ACCESS_TOKEN,
        flag: "whatsapp-access-token",
        help: "WhatsApp Cloud API access token: turns on \"channels\": [\"whatsapp\", ...] for verifications",
        secret: true,
    },
    Var {
        env: PHONE_NUMBER_ID,
        flag: "whatsapp-phone-number-id",
        help: "WhatsApp business phone number id the codes are sent from",
        secret: false,
    },
    Var {
        env: APP_SECRET,
        flag: "whatsapp-app-secret",
        help: "Meta app secret: the webhook's statuses and users' messages are checked against its X-Hub-Signature-256 (none: every one is refused)",
        secret: true,
    },
    Var {
        env: VERIFY_TOKEN,
        flag: "whatsapp-verify-token",
        help: "the Verify Token given to Meta for the webhook's subscription handshake",
        secret: true,
    },
    Var {
        env: TEMPLATE_NAME,
        flag: "whatsapp-template-name",
        help: "the approved WhatsApp authentication template the codes are sent with",
        secret: false,
    },
    Var {
        env: TEMPLATE_LANGUAGE,
        flag: "whatsapp-template-language",
        help: "the template's language code (default en_US)",
        secret: false,
    },
    Var {
        env: BASE_URL,
        flag: "whatsapp-base-url",
        help: "Graph API base with its version (default https://graph.facebook.com/v21.0; tests point it at a stand-in)",
        secret: false,
    },
    Var {
        env: TENANT,
        flag: "whatsapp-tenant",
        help: "the tenant that gets message.received events for what WhatsApp users write (default `default`; a STOP opts the number out of WhatsApp for every tenant)",
        secret: false,
    },
];

const NEEDED_BY: &str = "the whatsapp verification channel";

fn configure(vars: &Vars, ctx: &Context) -> Result<Arc<dyn Configured>, VarError> {
    let token = vars.get(ACCESS_TOKEN).ok_or(VarError::Missing {
        var: ACCESS_TOKEN,
        needed_by: NEEDED_BY,
    })?;
    let phone_number_id = vars
        .get(PHONE_NUMBER_ID)
        .ok_or(VarError::Missing {
            var: PHONE_NUMBER_ID,
            needed_by: NEEDED_BY,
        })?
        .trim();
    if phone_number_id.len() > 32 || !phone_number_id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VarError::invalid(
            PHONE_NUMBER_ID,
            "must be the phone number's id (digits), as WhatsApp Manager shows it",
        ));
    }
    let template_name = vars
        .get(TEMPLATE_NAME)
        .ok_or(VarError::Missing {
            var: TEMPLATE_NAME,
            needed_by: NEEDED_BY,
        })?
        .trim();
    // Meta's template names: lower-case letters, digits and `_`, at most
    // 512 characters.
    if template_name.len() > 512
        || !template_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(VarError::invalid(
            TEMPLATE_NAME,
            "must be a template name: lower-case letters, digits and _",
        ));
    }
    let language = vars
        .get(TEMPLATE_LANGUAGE)
        .unwrap_or(DEFAULT_TEMPLATE_LANGUAGE)
        .trim();
    if language.len() > 16
        || !language
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(VarError::invalid(
            TEMPLATE_LANGUAGE,
            "must be a language code such as en_US",
        ));
    }
    let base_url = vars.get(BASE_URL).unwrap_or(DEFAULT_BASE_URL).trim();
    http_url(BASE_URL, base_url, true)?;
    Ok(Arc::new(WhatsAppSettings {
        base_url: base_url.to_string(),
        access_token: token.trim().to_string(),
        phone_number_id: phone_number_id.to_string(),
        template_name: template_name.to_string(),
        template_language: language.to_string(),
        app_secret_set: vars.get(APP_SECRET).is_some(),
        verify_token_set: vars.get(VERIFY_TOKEN).is_some(),
        timeout: ctx.timeout,
        connect_timeout: ctx.connect_timeout,
    }))
}

/// What users write, taken when the app secret (which authenticates it)
/// and the phone number id (which says which messages are to us) are set.
fn configure_inbound(vars: &Vars) -> Result<Option<Arc<dyn InboundRoute>>, VarError> {
    let (Some(secret), Some(id)) = (vars.get(APP_SECRET), vars.get(PHONE_NUMBER_ID)) else {
        return Ok(None);
    };
    let tenant = vars
        .get(TENANT)
        .unwrap_or(super::inbound::DEFAULT_TENANT)
        .trim();
    Ok(Some(Arc::new(WhatsAppInbound::new(id.trim(), tenant, secret))))
}

/// The webhook, keyed with the app secret and the verify token (set up
/// whether or not WhatsApp sends: statuses of messages it sent arrive
/// after it was turned off).
fn configure_webhook(vars: &Vars, _ctx: &Context) -> Result<Arc<dyn ReceiptRoute>, VarError> {
    Ok(Arc::new(WhatsAppWebhook::new(
        vars.get(APP_SECRET),
        vars.get(VERIFY_TOKEN),
    )))
}

impl Configured for WhatsAppSettings {
    fn name(&self) -> &'static str {
        ADAPTER.name
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(WhatsAppProvider::new(self.clone())?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.app_secret_set {
            out.push(format!(
                "{APP_SECRET} is not set: every WhatsApp status webhook is refused, so no \
                 delivery is ever reported and a verification moves on from WhatsApp only \
                 after its delay"
            ));
        }
        if !self.verify_token_set {
            out.push(format!(
                "{VERIFY_TOKEN} is not set: Meta's subscription handshake on {WEBHOOK_PATH} \
                 is refused, so the webhook cannot be subscribed"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(pairs: &[(&str, &str)]) -> Result<Arc<dyn Configured>, VarError> {
        configure(&Vars::from_pairs(pairs.iter().copied()), &Context::default())
    }

    const BASE: [(&str, &str); 3] = [
        (ACCESS_TOKEN, "EAAJB-token"),
        (PHONE_NUMBER_ID, "106540352242922"),
        (TEMPLATE_NAME, "verification_code"),
    ];

    #[test]
    fn defaults_and_refusals() {
        let c = configured(&BASE).expect("configured");
        let s = c.as_any().downcast_ref::<WhatsAppSettings>().expect("settings");
        assert_eq!(s.base_url, DEFAULT_BASE_URL);
        assert_eq!(s.template_language, "en_US");
        // No app secret, no verify token: both said at start.
        assert_eq!(c.warnings().len(), 2, "{:?}", c.warnings());
        let mut all = BASE.to_vec();
        all.extend([(APP_SECRET, "app-secret-1"), (VERIFY_TOKEN, "verify-1")]);
        assert!(configured(&all).expect("ok").warnings().is_empty());

        let rows: &[(&[(&str, &str)], &str)] = &[
            (&BASE[..1], PHONE_NUMBER_ID),
            (&BASE[..2], TEMPLATE_NAME),
            (&[BASE[0], (PHONE_NUMBER_ID, "+1555"), BASE[2]], PHONE_NUMBER_ID),
            (&[BASE[0], BASE[1], (TEMPLATE_NAME, "Bad Name")], TEMPLATE_NAME),
            (
                &[BASE[0], BASE[1], BASE[2], (TEMPLATE_LANGUAGE, "en US")],
                TEMPLATE_LANGUAGE,
            ),
            (&[BASE[0], BASE[1], BASE[2], (BASE_URL, "ftp://x")], BASE_URL),
        ];
        for (pairs, var) in rows {
            let e = configured(pairs).expect_err("refused");
            assert!(e.to_string().contains(var), "{pairs:?}: {e}");
        }
    }
}
