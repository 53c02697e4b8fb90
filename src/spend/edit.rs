//! The CLI's edits of a tenant's caps (`sendonce tenant spend-caps`): pure,
//! checked as the admin API checks caps ([`SpendCaps::validate`]).

use super::{SpendCaps, format_amount};

/// The caps after the CLI's edits (`off` clears one; `None`: unchanged),
/// checked as the admin API checks them.
pub fn edited_caps(
    current: SpendCaps,
    daily: Option<&str>,
    monthly: Option<&str>,
    international: Option<&str>,
) -> Result<SpendCaps, String> {
    let mut input = current.to_input();
    let set = |v: Option<&str>, slot: &mut Option<String>| match v.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("off") => *slot = None,
        Some(v) => *slot = Some(v.to_string()),
        None => {}
    };
    set(daily, &mut input.daily);
    set(monthly, &mut input.monthly);
    match international.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("off") => input.international_daily_messages = None,
        Some(v) => {
            input.international_daily_messages = Some(v.parse().map_err(|_| {
                format!("--international-daily-messages {v:?} is not a whole number (or off)")
            })?)
        }
        None => {}
    }
    SpendCaps::validate(&input).map_err(|errors| {
        errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ")
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
    fn editing_spend_caps() {
        let none = SpendCaps::default();
        let set = edited_caps(none, Some("5.00"), Some("100"), Some("100")).unwrap();
        assert_eq!(
            set,
            SpendCaps {
                daily: Some(5_000_000),
                monthly: Some(100_000_000),
                international_daily_messages: Some(100),
            }
        );
        // Not given: unchanged; `off`: cleared.
        let edited = edited_caps(set, Some("off"), None, None).unwrap();
        assert_eq!(edited.daily, None);
        assert_eq!(edited.monthly, Some(100_000_000));
        for (d, m, i, want) in [
            (Some("five"), None, None, "spend_caps.daily"),
            (None, Some("-1"), None, "spend_caps.monthly"),
            (None, None, Some("many"), "not a whole number"),
            (None, None, Some("-2"), "must be 0 or more"),
        ] {
            let e = edited_caps(none, d, m, i).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
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
