//! How Infobip's answers to a send are classified (the classes are in the
//! module's own documentation): transport errors, a 2xx answer's message
//! status, and the other HTTP statuses with Infobip's error body.

use std::time::Duration;

use reqwest::StatusCode;

use super::{DUPLICATE_MESSAGE_ID, ErrorBody, Status};
use crate::provider::{SendOutcome, cut_error_text};

/// Classifies a transport error of the send.
pub(super) fn classify_error(e: &reqwest::Error) -> SendOutcome {
    if e.is_connect() || e.is_builder() {
        // Never connected (or never built): Infobip cannot have seen it.
        SendOutcome::Retryable {
            http_status: None,
            provider_code: None,
            retry_after: None,
            message: "could not connect to Infobip".into(),
        }
    } else if e.is_timeout() {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "Infobip did not answer in time".into(),
        }
    } else {
        SendOutcome::Ambiguous {
            http_status: None,
            retry_after: None,
            message: "the connection failed before Infobip answered".into(),
        }
    }
}

/// `REJECTED` statuses that refuse the account rather than the message:
/// another provider may send it.
const ACCOUNT_REJECTIONS: [&str; 2] = [
    "REJECTED_NOT_ENOUGH_CREDITS",
    "REJECTED_PREPAID_PACKAGE_EXPIRED",
];

/// `REJECTED` statuses Infobip asks to submit again: it did not act.
const RETRY_REJECTIONS: [&str; 1] = ["REJECTED_SYSTEM_ERROR"];

/// Classifies a 2xx answer's message: its id and status.
pub(super) fn classify_accepted(
    http_status: u16,
    message_id: Option<String>,
    status: Option<&Status>,
    ours: &str,
) -> SendOutcome {
    let http_status = Some(http_status);
    let name = status.and_then(|s| s.name.clone()).unwrap_or_default();
    let group = status
        .and_then(|s| s.group_name.clone())
        .unwrap_or_default()
        .to_ascii_uppercase();
    let text = || {
        let description = status.and_then(|s| s.description.clone());
        cut_error_text(&match description {
            Some(d) if !d.is_empty() => format!("{name}: {d}"),
            _ => format!("Infobip answered {name}"),
        })
    };
    if name == DUPLICATE_MESSAGE_ID {
        return SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: format!(
                "Infobip already has a message with our id {ours} ({DUPLICATE_MESSAGE_ID}): \
                 looked up, never resent"
            ),
        };
    }
    let rejected = group == "REJECTED" || (group.is_empty() && name.starts_with("REJECTED"));
    if rejected {
        let code = (!name.is_empty()).then(|| name.clone());
        return if ACCOUNT_REJECTIONS.contains(&name.as_str()) {
            SendOutcome::Refused {
                http_status,
                provider_code: code,
                message: text(),
            }
        } else if RETRY_REJECTIONS.contains(&name.as_str()) {
            SendOutcome::Retryable {
                http_status,
                provider_code: code,
                retry_after: None,
                message: text(),
            }
        } else {
            SendOutcome::Rejected {
                http_status,
                provider_code: code,
                message: text(),
            }
        };
    }
    // The send answer is an acceptance (`PENDING`); any other group still
    // says Infobip has the message.
    let known = matches!(
        group.as_str(),
        "PENDING" | "ACCEPTED" | "DELIVERED" | "UNDELIVERABLE" | "EXPIRED"
    );
    match message_id.filter(|id| !id.is_empty()) {
        Some(id) if known => SendOutcome::Accepted {
            provider_message_id: id,
            http_status,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: format!(
                "Infobip answered 2xx without a message id and a status it documents ({})",
                if group.is_empty() { "none" } else { &group }
            ),
        },
    }
}

/// Classifies a non-2xx answer with Infobip's error body, if it had one.
pub(super) fn classify_status(
    status: StatusCode,
    error: Option<ErrorBody>,
    retry_after: Option<Duration>,
) -> SendOutcome {
    let http_status = Some(status.as_u16());
    let (code, text) = error.map(|e| e.parts()).unwrap_or_default();
    // Should Infobip ever put the duplicate refusal in an error answer
    // (its documentation shows it only as a message status): it has the
    // message all the same.
    let says_duplicate = |s: &Option<String>| s.as_deref().is_some_and(|s| s.contains(DUPLICATE_MESSAGE_ID));
    if says_duplicate(&code) || says_duplicate(&text) {
        return SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message: format!(
                "Infobip answered {status}: it already has a message with our id \
                 ({DUPLICATE_MESSAGE_ID}): looked up, never resent"
            ),
        };
    }
    let message = cut_error_text(&match (&code, text) {
        (_, Some(t)) => t,
        (Some(c), None) => format!("Infobip answered {status} {c}"),
        (None, None) => format!("Infobip answered {status}"),
    });
    match status.as_u16() {
        429 => SendOutcome::Retryable {
            http_status,
            provider_code: code,
            retry_after,
            message,
        },
        401 | 403 => SendOutcome::Refused {
            http_status,
            provider_code: code,
            message,
        },
        // A refusal of this request (BAD_REQUEST, ...), or a redirect:
        // Infobip did not create a message.
        300..=499 => SendOutcome::Rejected {
            http_status,
            provider_code: code,
            message,
        },
        _ => SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message: match code {
                Some(c) => format!("{message} (Infobip error {c})"),
                None => message,
            },
        },
    }
}

