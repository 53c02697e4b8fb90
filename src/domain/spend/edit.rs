//! Edits of a tenant's caps, by the admin API's `PATCH` (`spend_caps`) and
//! the CLI (`sendonce tenant spend-caps`): cap by cap, pure, checked alike.

use serde_json::{Map, Value, json};

use super::{Micros, SpendCaps, format_amount, parse_amount};
use crate::domain::FieldError;

/// The most `international_daily_messages` a cap may say.
pub const MAX_MESSAGES: i64 = 1_000_000_000;

/// An amount as the admin API takes it, exactly its documented pattern
/// `^[0-9]{1,12}(\.[0-9]{1,6})?$` (the CLI's reading is laxer: it trims).
fn is_amount_text(s: &str) -> bool {
    let (whole, frac) = s.split_once('.').unwrap_or((s, "0"));
    let digits = |p: &str, most: usize| {
        (1..=most).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit())
    };
    digits(whole, 12) && digits(frac, 6)
}

/// What a PATCH sets of the spend caps, cap by cap (`spend_caps: null`
/// clears all three). `Some(None)` clears a cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpendCapsPatch {
    pub daily: Option<Option<Micros>>,
    pub monthly: Option<Option<Micros>>,
    pub international_daily_messages: Option<Option<i64>>,
}

impl SpendCapsPatch {
    /// Clears every cap.
    pub const CLEAR: SpendCapsPatch = SpendCapsPatch {
        daily: Some(None),
        monthly: Some(None),
        international_daily_messages: Some(None),
    };

    /// Reads `spend_caps`: `null`, or an object of `daily`, `monthly`
    /// (decimal strings like `"5.00"`, at most six decimals) and
    /// `international_daily_messages` (a whole number), each `null` to clear.
    pub fn from_json(v: &Value, errors: &mut Vec<FieldError>) -> Option<SpendCapsPatch> {
        let obj = match v {
            Value::Null => return Some(SpendCapsPatch::CLEAR),
            Value::Object(o) => o,
            _ => {
                errors.push(FieldError::new("spend_caps", "must be an object or null"));
                return None;
            }
        };
        let before = errors.len();
        let mut p = SpendCapsPatch::default();
        let amount = |field: &str, v: &Value, errors: &mut Vec<FieldError>| match v {
            Value::Null => Some(None),
            Value::String(s) if is_amount_text(s) => Some(parse_amount(s)),
            _ => {
                errors.push(FieldError::new(
                    format!("spend_caps.{field}"),
                    "must be an amount (a decimal string like \"5.00\", at most 6 decimals, \
                     not negative) or null",
                ));
                None
            }
        };
        for (field, v) in obj {
            match field.as_str() {
                "daily" => p.daily = amount(field, v, errors),
                "monthly" => p.monthly = amount(field, v, errors),
                "international_daily_messages" => match v {
                    Value::Null => p.international_daily_messages = Some(None),
                    Value::Number(n)
                        if n.as_i64().is_some_and(|n| (0..=MAX_MESSAGES).contains(&n)) =>
                    {
                        p.international_daily_messages = Some(n.as_i64())
                    }
                    _ => errors.push(FieldError::new(
                        "spend_caps.international_daily_messages",
                        "must be a whole number from 0 to 1000000000, or null",
                    )),
                },
                other => errors.push(FieldError::new(
                    format!("spend_caps.{other}"),
                    "is not a spend cap (one of daily, monthly, international_daily_messages)",
                )),
            }
        }
        if errors.len() == before && p == SpendCapsPatch::default() {
            errors.push(FieldError::new(
                "spend_caps",
                "names no cap (one of daily, monthly, international_daily_messages)",
            ));
        }
        (errors.len() == before).then_some(p)
    }

    /// What it sets, for the audit log.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(d) = self.daily {
            m.insert("daily".into(), json!(d.map(format_amount)));
        }
        if let Some(d) = self.monthly {
            m.insert("monthly".into(), json!(d.map(format_amount)));
        }
        if let Some(n) = self.international_daily_messages {
            m.insert("international_daily_messages".into(), json!(n));
        }
        Value::Object(m)
    }
}

/// The CLI's flags as a patch: `off` clears a cap, a flag not given leaves
/// it; values are checked as the admin API checks them.
pub fn caps_patch(
    daily: Option<&str>,
    monthly: Option<&str>,
    international: Option<&str>,
) -> Result<SpendCapsPatch, String> {
    let off = |v: &str| v.eq_ignore_ascii_case("off");
    let amount = |flag: &str, v: Option<&str>| {
        match v.map(str::trim) {
        None => Ok(None),
        Some(v) if off(v) => Ok(Some(None)),
        Some(v) => parse_amount(v).map(|m| Some(Some(m))).ok_or_else(|| {
            format!("--{flag} {v:?} is not an amount (like 5.00, at most 6 decimals, not negative) or off")
        }),
    }
    };
    let international_daily_messages = match international.map(str::trim) {
        None => None,
        Some(v) if off(v) => Some(None),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if (0..=MAX_MESSAGES).contains(&n) => Some(Some(n)),
            _ => {
                return Err(format!(
                    "--international-daily-messages {v:?} is not a whole number from 0 to 1000000000 (or off)"
                ));
            }
        },
    };
    Ok(SpendCapsPatch {
        daily: amount("daily", daily)?,
        monthly: amount("monthly", monthly)?,
        international_daily_messages,
    })
}

/// What the CLI prints for an edit of caps: every cap, said changed or not.
pub fn caps_changes(before: &SpendCaps, after: &SpendCaps) -> Vec<String> {
    let money = |v: Option<i64>| v.map_or("off".to_string(), format_amount);
    let count = |v: Option<i64>| v.map_or("off".to_string(), |n| n.to_string());
    [
        ("daily spend cap", money(before.daily), money(after.daily)),
        (
            "monthly spend cap",
            money(before.monthly),
            money(after.monthly),
        ),
        (
            "international messages per day",
            count(before.international_daily_messages),
            count(after.international_daily_messages),
        ),
    ]
    .into_iter()
    .map(|(what, b, a)| {
        if a == b {
            format!("{what} {a} (unchanged)")
        } else {
            format!("{what} {b} -> {a}")
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clis_flags_as_a_patch() {
        assert_eq!(
            caps_patch(Some("5.00"), Some("off"), None).unwrap(),
            SpendCapsPatch {
                daily: Some(Some(5_000_000)),
                monthly: Some(None),
                international_daily_messages: None,
            }
        );
        assert_eq!(
            caps_patch(None, None, Some("100")).unwrap(),
            SpendCapsPatch {
                international_daily_messages: Some(Some(100)),
                ..SpendCapsPatch::default()
            }
        );
        for (d, m, i, want) in [
            (Some("five"), None, None, "--daily"),
            (None, Some("-1"), None, "--monthly"),
            (None, None, Some("many"), "not a whole number"),
            (None, None, Some("-2"), "from 0 to"),
        ] {
            let e = caps_patch(d, m, i).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn the_cli_says_each_cap_before_and_after() {
        let set = SpendCaps {
            daily: Some(5_000_000),
            monthly: Some(100_000_000),
            international_daily_messages: Some(100),
        };
        let edited = SpendCaps { daily: None, ..set };
        assert_eq!(
            caps_changes(&set, &edited),
            [
                "daily spend cap 5.00 -> off",
                "monthly spend cap 100.00 (unchanged)",
                "international messages per day 100 (unchanged)",
            ]
        );
    }
}
