//! `PATCH /admin/tenants/{name}` (and the CLI's setters): one struct of
//! optional fields and one pure function that reads and validates it. A new
//! setting is one field here, one arm in [`TenantPatch::from_json`] and one
//! column in the store's update.
//!
//! Each field: absent, leave it; `null`, clear it; a value, set it.

use serde_json::{Map, Value, json};

use crate::domain::FieldError;
use crate::domain::quiet::QuietHours;
use crate::domain::request::parse_sender;
use crate::spend::SpendCapsPatch;

/// What a PATCH sets. `Some(None)` clears a setting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantPatch {
    pub quiet_hours: Option<Option<QuietHours>>,
    pub senders: Option<Option<Vec<String>>>,
    pub allowed_countries: Option<Option<Vec<String>>>,
    pub home_country: Option<Option<String>>,
    pub disabled: Option<bool>,
    pub spend_caps: Option<SpendCapsPatch>,
    /// The channels of a verification that names none.
    pub verify_channels: Option<Option<crate::domain::Channels>>,
}

/// The fields a PATCH may name.
pub const FIELDS: &[&str] = &[
    "quiet_hours",
    "senders",
    "allowed_countries",
    "home_country",
    "disabled",
    "spend_caps",
    "verify_channels",
];

fn country(v: &str) -> Option<String> {
    let c = v.trim().to_ascii_uppercase();
    (c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase())).then_some(c)
}

/// `null` → clear; a list of strings each read by `read` → set.
fn list(
    v: &Value,
    field: &str,
    read: impl Fn(&str) -> Option<String>,
    what: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Option<Vec<String>>> {
    match v {
        Value::Null => Some(None),
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                match item.as_str().and_then(&read) {
                    Some(s) if !out.contains(&s) => out.push(s),
                    Some(_) => {}
                    None => {
                        errors.push(FieldError::new(field, format!("{item} is not {what}")));
                        return None;
                    }
                }
            }
            if out.len() > 1000 {
                errors.push(FieldError::new(field, "has more than 1000 entries"));
                return None;
            }
            Some(Some(out))
        }
        _ => {
            errors.push(FieldError::new(
                field,
                format!("must be a list of {what}s or null"),
            ));
            None
        }
    }
}

impl TenantPatch {
    /// Reads a PATCH body: unknown fields, wrong types and bad values are
    /// each a field error (all of them, not only the first).
    pub fn from_json(body: &Map<String, Value>) -> Result<TenantPatch, Vec<FieldError>> {
        let mut p = TenantPatch::default();
        let mut errors = Vec::new();
        for (field, v) in body {
            match field.as_str() {
                "quiet_hours" => match v {
                    Value::Null => p.quiet_hours = Some(None),
                    Value::String(s) => match QuietHours::parse(s) {
                        Some(w) => p.quiet_hours = Some(Some(w)),
                        None => errors.push(FieldError::new(
                            field,
                            "must be a window like \"21:00-08:00\" (recipient's local time) or null",
                        )),
                    },
                    _ => errors.push(FieldError::new(field, "must be a string or null")),
                },
                "senders" => {
                    p.senders = list(
                        v,
                        field,
                        |s| parse_sender(s.trim()),
                        "a sender (an E.164 number or 1 to 11 letters, digits and spaces)",
                        &mut errors,
                    );
                }
                "allowed_countries" => {
                    p.allowed_countries = list(
                        v,
                        field,
                        country,
                        "an ISO 3166-1 alpha-2 country code",
                        &mut errors,
                    )
                    .map(|l| l.filter(|l| !l.is_empty()));
                }
                "home_country" => match v {
                    Value::Null => p.home_country = Some(None),
                    Value::String(s) => match country(s) {
                        Some(c) => p.home_country = Some(Some(c)),
                        None => errors.push(FieldError::new(
                            field,
                            "must be an ISO 3166-1 alpha-2 country code or null",
                        )),
                    },
                    _ => errors.push(FieldError::new(field, "must be a string or null")),
                },
                "disabled" => match v {
                    Value::Bool(b) => p.disabled = Some(*b),
                    _ => errors.push(FieldError::new(field, "must be true or false")),
                },
                "spend_caps" => p.spend_caps = SpendCapsPatch::from_json(v, &mut errors),
                "verify_channels" => match v {
                    Value::Null => p.verify_channels = Some(None),
                    _ => match crate::domain::Channels::from_json(
                        v,
                        &crate::provider::registry::verify_channels(),
                    ) {
                        Ok(c) => p.verify_channels = Some(Some(c)),
                        Err(why) => errors.push(FieldError::new(field, why)),
                    },
                },
                other => errors.push(FieldError::new(
                    other,
                    format!("is not a tenant setting (one of {})", FIELDS.join(", ")),
                )),
            }
        }
        if errors.is_empty() && p == TenantPatch::default() {
            errors.push(FieldError::new(
                "body",
                format!("names no setting (one of {})", FIELDS.join(", ")),
            ));
        }
        if errors.is_empty() {
            Ok(p)
        } else {
            Err(errors)
        }
    }

    /// What it sets, for the audit log.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(q) = &self.quiet_hours {
            m.insert("quiet_hours".into(), json!(q.map(|w| w.to_string())));
        }
        if let Some(s) = &self.senders {
            m.insert("senders".into(), json!(s));
        }
        if let Some(c) = &self.allowed_countries {
            m.insert("allowed_countries".into(), json!(c));
        }
        if let Some(c) = &self.home_country {
            m.insert("home_country".into(), json!(c));
        }
        if let Some(d) = self.disabled {
            m.insert("disabled".into(), json!(d));
        }
        if let Some(c) = &self.verify_channels {
            m.insert(
                "verify_channels".into(),
                json!(c.as_ref().map(|c| c.names())),
            );
        }
        if let Some(c) = &self.spend_caps {
            m.insert("spend_caps".into(), c.to_json());
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(v: Value) -> Result<TenantPatch, Vec<String>> {
        TenantPatch::from_json(v.as_object().expect("object"))
            .map_err(|e| e.into_iter().map(|e| e.field).collect())
    }

    #[test]
    fn patches_read_as_set_clear_or_refused() {
        let ok = |v: Value| read(v).expect("valid");
        assert_eq!(ok(json!({"disabled": true})).disabled, Some(true));
        assert_eq!(
            ok(json!({"home_country": "gb"})).home_country,
            Some(Some("GB".into()))
        );
        assert_eq!(ok(json!({"home_country": null})).home_country, Some(None));
        assert_eq!(
            ok(json!({"allowed_countries": ["us", "CA", "US"]})).allowed_countries,
            Some(Some(vec!["US".into(), "CA".into()]))
        );
        assert_eq!(
            ok(json!({"allowed_countries": []})).allowed_countries,
            Some(None)
        );
        assert_eq!(
            ok(json!({"senders": ["ACME", "+14155550100"]})).senders,
            Some(Some(vec!["ACME".into(), "+14155550100".into()]))
        );
        assert_eq!(ok(json!({"senders": []})).senders, Some(Some(vec![])));
        assert_eq!(
            ok(json!({"spend_caps": {"daily": "5.00", "monthly": null}})).spend_caps,
            Some(SpendCapsPatch {
                daily: Some(Some(5_000_000)),
                monthly: Some(None),
                international_daily_messages: None,
            })
        );
        assert_eq!(
            ok(json!({"spend_caps": {"international_daily_messages": 100}})).spend_caps,
            Some(SpendCapsPatch {
                international_daily_messages: Some(Some(100)),
                ..SpendCapsPatch::default()
            })
        );
        assert_eq!(
            ok(json!({"spend_caps": null})).spend_caps,
            Some(SpendCapsPatch::CLEAR)
        );
        assert!(
            ok(json!({"quiet_hours": "21:00-08:00"}))
                .quiet_hours
                .is_some_and(|q| q.is_some())
        );
        // (body, the fields refused)
        for (body, fields) in [
            (json!({}), vec!["body"]),
            (json!({"spend": 1}), vec!["spend"]),
            (json!({"disabled": "yes"}), vec!["disabled"]),
            (json!({"home_country": "GBR"}), vec!["home_country"]),
            (
                json!({"allowed_countries": "US"}),
                vec!["allowed_countries"],
            ),
            (
                json!({"allowed_countries": ["U1"]}),
                vec!["allowed_countries"],
            ),
            (
                json!({"senders": ["this sender is too long"]}),
                vec!["senders"],
            ),
            (json!({"quiet_hours": "late"}), vec!["quiet_hours"]),
            (json!({"spend_caps": 5}), vec!["spend_caps"]),
            (json!({"spend_caps": {}}), vec!["spend_caps"]),
            (
                json!({"disabled": false, "spend_caps": {}}),
                vec!["spend_caps"],
            ),
            (
                json!({"spend_caps": {"daily": 5, "weekly": "1"}}),
                vec!["spend_caps.daily", "spend_caps.weekly"],
            ),
            (
                json!({"spend_caps": {"monthly": "-1", "international_daily_messages": -1}}),
                vec![
                    "spend_caps.international_daily_messages",
                    "spend_caps.monthly",
                ],
            ),
            (
                json!({"spend_caps": {"daily": "0.1234567"}}),
                vec!["spend_caps.daily"],
            ),
            (
                json!({"quiet_hours": 5, "disabled": 1}),
                vec!["disabled", "quiet_hours"],
            ),
        ] {
            let mut got = read(body.clone()).expect_err("refused");
            got.sort();
            assert_eq!(got, fields, "{body}");
        }
    }

    #[test]
    fn the_audit_detail_says_what_was_set() {
        let p = read(json!({"disabled": true, "home_country": null})).unwrap();
        assert_eq!(p.to_json(), json!({"disabled": true, "home_country": null}));
        let p = read(json!({"spend_caps": {"daily": "5", "international_daily_messages": null}}))
            .unwrap();
        assert_eq!(
            p.to_json(),
            json!({"spend_caps": {"daily": "5.00", "international_daily_messages": null}})
        );
    }
}
