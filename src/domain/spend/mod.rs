//! Spend: what a message is estimated to cost and the caps a tenant's sends
//! are held to. The decisions are pure and here (the prices file, a cost,
//! the periods a send counts in, whether a cap's 80 % was just crossed, how
//! long a refusal lasts); the counting is the store's (`store::spend`),
//! which decides in the same transaction as the message's insert.
//!
//! Amounts are integer micro-units of the prices file's currency
//! (1 USD = 1 000 000), never floats.

mod caps;
mod edit;
mod prices;

pub use caps::{Cap, Period, SpendCaps, crossed_warning, retry_after};
pub use edit::{SpendCapsPatch, caps_changes, caps_patch};
pub use prices::{DEFAULT_PRICES, HEADER, Prices, format_amount, parse_amount};

/// An amount in micro-units of a currency.
pub type Micros = i64;

/// An estimated cost as the message resource shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cost {
    /// A decimal string (`"0.20"`): exact, unlike a JSON number.
    pub amount: String,
    pub currency: String,
}

impl Cost {
    pub fn new(micros: Micros, currency: &str) -> Self {
        Cost {
            amount: format_amount(micros),
            currency: currency.to_string(),
        }
    }
}

/// A message's cost as stored with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    pub micros: Micros,
    pub currency: String,
    /// To a country other than the tenant's home country (or one unknown).
    pub international: bool,
}

/// Whether a message to `country` is international for a tenant whose home
/// country is `home`: without a home country, or to a number whose country
/// is unknown, every message counts as international (the cap guards
/// against pumping, so doubt counts).
pub fn is_international(home: Option<&str>, country: Option<&str>) -> bool {
    match (home, country) {
        (Some(h), Some(c)) => !h.eq_ignore_ascii_case(c),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn international_is_away_from_home() {
        #[rustfmt::skip]
        let cases = [
            (Some("GB"), Some("GB"), false), (Some("gb"), Some("GB"), false),
            (Some("GB"), Some("FR"), true), (None, Some("GB"), true), (Some("GB"), None, true),
        ];
        for (home, to, want) in cases {
            assert_eq!(is_international(home, to), want, "{home:?} {to:?}");
        }
    }
}
