//! How Infobip's answers to a send are classified (the classes are in the
//! module's own documentation): transport errors, a 2xx answer's message
//! status (and a log entry's, [`classify_rejection`]), and the other HTTP
//! statuses with Infobip's error body.

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

/// The group of `status` (upper case): its `groupName`, else the group its
/// name starts with (`REJECTED_DESTINATION`), else empty.
pub(super) fn group_of(status: &Status) -> String {
    let group = status
        .group_name
        .as_deref()
        .map(str::trim)
        .unwrap_or_default()
        .to_ascii_uppercase();
    if !group.is_empty() {
        return group;
    }
    let name = status.name.as_deref().unwrap_or_default();
    if name.starts_with("REJECTED") {
        "REJECTED".into()
    } else {
        String::new()
    }
}

/// Whether `status` is the refusal of a repeated `messageId`: about the
/// repeat alone, never about the message first sent under the id.
pub(super) fn is_duplicate(status: &Status) -> bool {
    status.name.as_deref() == Some(DUPLICATE_MESSAGE_ID)
}

/// The class of a `REJECTED` status (group 5, "rejected by Infobip or the
/// operator before it could be sent"): the account refused, Infobip's own
/// error retried, anything else a refusal of the message. `None` when the
/// status is not of that group, or is the refusal of a repeated id.
pub(super) fn classify_rejection(http_status: Option<u16>, status: &Status) -> Option<SendOutcome> {
    if group_of(status) != "REJECTED" || is_duplicate(status) {
        return None;
    }
    let name = status.name.clone().unwrap_or_default();
    let message = cut_error_text(&match status.description.as_deref() {
        Some(d) if !d.is_empty() => format!("{name}: {d}"),
        _ => format!("Infobip answered {name}"),
    });
    let provider_code = (!name.is_empty()).then(|| name.clone());
    Some(if ACCOUNT_REJECTIONS.contains(&name.as_str()) {
        SendOutcome::Refused {
            http_status,
            provider_code,
            message,
        }
    } else if RETRY_REJECTIONS.contains(&name.as_str()) {
        SendOutcome::Retryable {
            http_status,
            provider_code,
            retry_after: None,
            message,
        }
    } else {
        SendOutcome::Rejected {
            http_status,
            provider_code,
            message,
        }
    })
}

/// What a duplicate-id refusal of a send means: with idempotency declared
/// (the operator says Infobip enabled it, within the grace period), that
/// Infobip accepted a message with our id already, so it is accepted under
/// it; without, only that some message with our id reached Infobip, which
/// says nothing of whether it was accepted: ambiguous, looked up.
pub(super) fn duplicate(http_status: Option<u16>, ours: &str, idempotent: bool) -> SendOutcome {
    if idempotent {
        SendOutcome::Accepted {
            provider_message_id: ours.to_string(),
            http_status,
        }
    } else {
        SendOutcome::Ambiguous {
            http_status,
            retry_after: None,
            message: format!(
                "Infobip refused a repeat of our id {ours} ({DUPLICATE_MESSAGE_ID}): looked up, \
                 never resent"
            ),
        }
    }
}

/// Classifies a 2xx answer's message: its id and status; `idempotent`:
/// the operator declared Infobip's idempotency enabled.
pub(super) fn classify_accepted(
    http_status: u16,
    message_id: Option<String>,
    status: Option<&Status>,
    ours: &str,
    idempotent: bool,
) -> SendOutcome {
    let http_status = Some(http_status);
    if status.is_some_and(is_duplicate) {
        return duplicate(http_status, ours, idempotent);
    }
    if let Some(rejected) = status.and_then(|s| classify_rejection(http_status, s)) {
        return rejected;
    }
    let group = status.map(group_of).unwrap_or_default();
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
    ours: &str,
    idempotent: bool,
) -> SendOutcome {
    let http_status = Some(status.as_u16());
    let (code, text) = error.map(|e| e.parts()).unwrap_or_default();
    // Should Infobip ever put the duplicate refusal in an error answer
    // (its status table lists it as a message status): the same refusal.
    let says_duplicate = |s: &Option<String>| s.as_deref().is_some_and(|s| s.contains(DUPLICATE_MESSAGE_ID));
    if says_duplicate(&code) || says_duplicate(&text) {
        return match duplicate(http_status, ours, idempotent) {
            SendOutcome::Ambiguous { message, .. } => SendOutcome::Ambiguous {
                http_status,
                retry_after,
                message,
            },
            accepted => accepted,
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

