//! The `whatsapp` adapter: verification codes as WhatsApp authentication
//! templates through the WhatsApp Business Cloud API (issue 40).
//!
//! The code stays ours (made, MAC'd and sealed as for SMS; the message's
//! body is the code alone, as for the Telegram Gateway). A send is one call,
//! `POST {WHATSAPP_BASE_URL}/{WHATSAPP_PHONE_NUMBER_ID}/messages`, carrying
//! the operator's approved authentication template (`WHATSAPP_TEMPLATE_NAME`
//! in `WHATSAPP_TEMPLATE_LANGUAGE`) with the code twice, as Meta asks: the
//! body's parameter and the copy-code/one-tap button's (`sub_type` `url`,
//! index 0). `biz_opaque_callback_data` carries our message id, which Meta
//! echoes in every status webhook of the message. The token goes as
//! `Authorization: Bearer`, never logged.
//!
//! Meta documents no idempotency key on `/messages` and no lookup of a
//! message by anything of ours, so [`Provider::dedupes_by_key`] is false
//! and `reconcile` keeps its default (`Unknown`): a send that may have gone
//! out (no answer after the request was written, a 5xx, a connection cut)
//! ends `unknown` and is never made again; the verification moves on after
//! the step's delay as for silence. What each answer means is
//! [`classify`]; statuses come to [`WEBHOOK_PATH`] ([`webhook`]). A sent
//! template message cannot be withdrawn (Meta documents no such call), so
//! `revoke` keeps its default; nor can its status be asked for
//! (`delivery_status`: none).
//!
//! How long WhatsApp keeps trying to deliver is the template's own
//! `message_send_ttl_seconds`, set when the operator creates it (30 to 900
//! s for authentication templates; docs/whatsapp.md): no longer than the
//! codes' life, so that no code arrives once it is useless.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::{OutgoingSms, Provider, ProviderError, SendOutcome, parse_retry_after};

pub mod classify;
pub mod inbound;
mod settings;
pub mod webhook;

pub use settings::{
    ACCESS_TOKEN, ADAPTER, APP_SECRET, BASE_URL, DEFAULT_BASE_URL, DEFAULT_TEMPLATE_LANGUAGE,
    PHONE_NUMBER_ID, TEMPLATE_LANGUAGE, TEMPLATE_NAME, TENANT, VERIFY_TOKEN,
};

/// The adapter's name, stored with its messages, and its channel's.
pub const NAME: &str = "whatsapp";

/// Where Meta calls: `GET` for the subscription handshake, `POST` for
/// notifications (statuses, and messages users write: [`inbound`]).
pub const WEBHOOK_PATH: &str = "/channels/whatsapp/webhook";

/// The longest code an authentication template carries ("Maximum 15
/// characters").
pub const MAX_CODE_CHARS: usize = 15;

/// The digits a verification's code sent through WhatsApp may have: up to
/// the template's 15 characters (Meta documents no minimum; the service's
/// own `code_length` bounds apply as well).
pub const CODE_DIGITS: std::ops::RangeInclusive<u32> = 1..=15;

/// What the adapter needs to know.
#[derive(Clone)]
pub struct WhatsAppSettings {
    /// Meta's Graph API base with its version, or a stand-in in tests.
    pub base_url: String,
    pub access_token: String,
    /// The business phone number's id (the path of `/messages`).
    pub phone_number_id: String,
    /// The approved authentication template.
    pub template_name: String,
    pub template_language: String,
    /// Whether `WHATSAPP_APP_SECRET` and `WHATSAPP_VERIFY_TOKEN` are set
    /// (what the start-up warnings say).
    pub app_secret_set: bool,
    pub verify_token_set: bool,
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

/// Never the token.
impl std::fmt::Debug for WhatsAppSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppSettings")
            .field("base_url", &self.base_url)
            .field("access_token", &"***")
            .field("phone_number_id", &self.phone_number_id)
            .field("template_name", &self.template_name)
            .field("template_language", &self.template_language)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[derive(Clone)]
pub struct WhatsAppProvider {
    client: reqwest::Client,
    messages_url: reqwest::Url,
    bearer: String,
    template_name: String,
    template_language: String,
}

/// Never the token.
impl std::fmt::Debug for WhatsAppProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppProvider")
            .field("messages_url", &self.messages_url.as_str())
            .field("template_name", &self.template_name)
            .finish()
    }
}

impl WhatsAppProvider {
    pub fn new(settings: WhatsAppSettings) -> Result<Self, ProviderError> {
        let what = "WhatsApp Cloud API";
        let base = super::base_url(what, &settings.base_url)?;
        Ok(Self {
            client: super::http_client(settings.timeout, settings.connect_timeout)?,
            messages_url: super::endpoint(what, &base, &[&settings.phone_number_id, "messages"])?,
            bearer: format!("Bearer {}", settings.access_token),
            template_name: settings.template_name,
            template_language: settings.template_language,
        })
    }

    /// The request body of one send: the template with `code` as its body
    /// parameter and its button's, and our message id as
    /// `biz_opaque_callback_data`.
    pub fn request_body(&self, to: &str, code: &str, message_id: &str) -> serde_json::Value {
        template_message(
            to,
            &self.template_name,
            &self.template_language,
            code,
            message_id,
        )
    }
}

/// An authentication template message as Meta documents it.
pub fn template_message(
    to: &str,
    template: &str,
    language: &str,
    code: &str,
    message_id: &str,
) -> serde_json::Value {
    serde_json::json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "template",
        "template": {
            "name": template,
            "language": { "code": language },
            "components": [
                { "type": "body", "parameters": [{ "type": "text", "text": code }] },
                {
                    "type": "button",
                    "sub_type": "url",
                    "index": "0",
                    "parameters": [{ "type": "text", "text": code }]
                }
            ]
        },
        "biz_opaque_callback_data": message_id,
    })
}

#[async_trait]
impl Provider for WhatsAppProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn channel(&self) -> &'static str {
        NAME
    }

    fn dedupes_by_key(&self) -> bool {
        // Meta documents no idempotency key on `/messages`: a repeat is a
        // second message. `biz_opaque_callback_data` is echoed, never
        // de-duplicated on.
        false
    }

    async fn send(&self, sms: &OutgoingSms) -> SendOutcome {
        let phone = match sms.phone() {
            Ok(p) => p.as_str().to_string(),
            Err(refused) => return refused,
        };
        if let Some(refused) = classify::code_refusal(&sms.body) {
            return refused;
        }
        let body = self.request_body(&phone, sms.body.trim(), &sms.message_id.to_string());
        let sent = self
            .client
            .post(self.messages_url.clone())
            .header(AUTHORIZATION, &self.bearer)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(body.to_string())
            .send()
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => return classify::transport(e.is_connect() || e.is_builder(), e.is_timeout()),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let reply = super::read_body(resp, super::MAX_ANSWER_BYTES)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<classify::Reply>(&b).ok());
        classify::send(status, reply.as_ref(), retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(base_url: &str) -> WhatsAppSettings {
        WhatsAppSettings {
            base_url: base_url.into(),
            access_token: "very-secret-token".into(),
            phone_number_id: "106540352242922".into(),
            template_name: "verification_code".into(),
            template_language: "en_US".into(),
            app_secret_set: true,
            verify_token_set: true,
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn settings_and_client_never_show_the_token() {
        let s = settings(DEFAULT_BASE_URL);
        assert!(!format!("{s:?}").contains("very-secret-token"));
        let p = WhatsAppProvider::new(s).expect("provider");
        assert!(!format!("{p:?}").contains("very-secret-token"), "{p:?}");
        assert_eq!(
            p.messages_url.as_str(),
            "https://graph.facebook.com/v21.0/106540352242922/messages"
        );
        let trailing = WhatsAppProvider::new(settings("http://127.0.0.1:9/v21.0/")).expect("p");
        assert_eq!(trailing.messages_url.path(), "/v21.0/106540352242922/messages");
    }

    #[test]
    fn the_code_goes_as_the_body_and_the_button_parameter() {
        let p = WhatsAppProvider::new(settings(DEFAULT_BASE_URL)).expect("provider");
        let body = p.request_body("+14155550123", "482913", "msg_0123");
        assert_eq!(
            body,
            serde_json::json!({
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": "+14155550123",
                "type": "template",
                "template": {
                    "name": "verification_code",
                    "language": {"code": "en_US"},
                    "components": [
                        {"type": "body", "parameters": [{"type": "text", "text": "482913"}]},
                        {"type": "button", "sub_type": "url", "index": "0",
                         "parameters": [{"type": "text", "text": "482913"}]}
                    ]
                },
                "biz_opaque_callback_data": "msg_0123",
            })
        );
    }
}
