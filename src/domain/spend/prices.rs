//! The price table (`SENDONCE_PRICES`): parsed once at start, looked up per
//! message. Pure: the file's text in, a table or the reason out.

use std::collections::HashMap;

use super::Micros;

/// The table used when `SENDONCE_PRICES` is unset: one row for every
/// destination and provider. USD 0.10 a segment is at the upper end of what
/// providers charge for most destinations, so an estimate (and a cap set
/// against it) errs towards refusing early rather than overspending.
pub const DEFAULT_PRICES: &str = "country,provider,price_per_segment,currency\n*,*,0.10,USD\n";

/// The header every prices file starts with.
pub const HEADER: &str = "country,provider,price_per_segment,currency";

/// A price table: one currency, prices per segment in micro-units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prices {
    currency: String,
    /// (country or `*`, provider or `*`) → price per segment.
    rows: HashMap<(String, String), Micros>,
}

impl Default for Prices {
    fn default() -> Self {
        // The default text is a constant this module's tests parse.
        Prices::parse(DEFAULT_PRICES).unwrap_or(Prices {
            currency: "USD".into(),
            rows: HashMap::from([(("*".into(), "*".into()), 100_000)]),
        })
    }
}

/// Parses an amount with at most six decimals (`0.0075`, `5`, `100.00`)
/// into micro-units, exactly. `None`: not such an amount.
pub fn parse_amount(s: &str) -> Option<Micros> {
    let s = s.trim();
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) || frac.len() > 6 || (s.contains('.') && frac.is_empty()) {
        return None;
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut f: i64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..6 {
        f *= 10;
    }
    whole.checked_mul(1_000_000)?.checked_add(f)
}

/// Micro-units as a decimal string with the currency's usual two decimals
/// at least (`0.10`, `0.0075`, `12.50`).
pub fn format_amount(m: Micros) -> String {
    let sign = if m < 0 { "-" } else { "" };
    let m = m.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    let mut f = format!("{frac:06}");
    while f.len() > 2 && f.ends_with('0') {
        f.pop();
    }
    format!("{sign}{whole}.{f}")
}

impl Prices {
    /// Parses a prices file. The reason names the line when a row is wrong.
    pub fn parse(text: &str) -> Result<Prices, String> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        match lines.next() {
            Some((_, h)) if h.replace(' ', "").eq_ignore_ascii_case(HEADER) => {}
            _ => return Err(format!("the first line must be the header `{HEADER}`")),
        }
        let mut currency: Option<String> = None;
        let mut rows = HashMap::new();
        for (n, line) in lines {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let [country, provider, price, cur] = cells.as_slice() else {
                return Err(format!("line {n}: expected 4 comma-separated cells"));
            };
            let country = if *country == "*" {
                "*".to_string()
            } else if country.len() == 2 && country.bytes().all(|b| b.is_ascii_alphabetic()) {
                country.to_ascii_uppercase()
            } else {
                return Err(format!(
                    "line {n}: {country:?} is not an ISO 3166-1 alpha-2 country or `*`"
                ));
            };
            if provider.is_empty() {
                return Err(format!("line {n}: the provider is empty (use `*` for any)"));
            }
            let provider = provider.to_ascii_lowercase();
            let price = parse_amount(price).ok_or_else(|| {
                format!("line {n}: {price:?} is not a price (digits, at most 6 decimals)")
            })?;
            if cur.len() != 3 || !cur.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err(format!(
                    "line {n}: {cur:?} is not an ISO 4217 currency code"
                ));
            }
            let cur = cur.to_ascii_uppercase();
            match &currency {
                None => currency = Some(cur),
                Some(c) if *c != cur => {
                    return Err(format!(
                        "line {n}: currency {cur} differs from {c}: one currency per file"
                    ));
                }
                Some(_) => {}
            }
            if rows
                .insert((country.clone(), provider.clone()), price)
                .is_some()
            {
                return Err(format!("line {n}: a second row for {country},{provider}"));
            }
        }
        let Some(currency) = currency else {
            return Err("no price rows after the header".into());
        };
        Ok(Prices { currency, rows })
    }

    pub fn currency(&self) -> &str {
        &self.currency
    }

    /// The price of one segment to `country` through `provider`: the most
    /// specific row wins (country+provider, country+`*`, `*`+provider,
    /// `*`+`*`). `None`: no row covers it (a file without `*,*`).
    pub fn per_segment(&self, country: Option<&str>, provider: &str) -> Option<Micros> {
        let c = country.map(str::to_ascii_uppercase);
        let p = provider.to_ascii_lowercase();
        let get = |c: &str, p: &str| self.rows.get(&(c.to_string(), p.to_string())).copied();
        c.as_deref()
            .and_then(|c| get(c, &p).or_else(|| get(c, "*")))
            .or_else(|| get("*", &p))
            .or_else(|| get("*", "*"))
    }

    /// The price of one segment to `country` through `provider` from a row
    /// naming `provider` itself (country+provider, `*`+provider): for a
    /// channel charged only when it has a price of its own.
    pub fn listed(&self, country: Option<&str>, provider: &str) -> Option<Micros> {
        let c = country.map(str::to_ascii_uppercase);
        let p = provider.to_ascii_lowercase();
        let get = |c: &str| self.rows.get(&(c.to_string(), p.clone())).copied();
        c.as_deref().and_then(get).or_else(|| get("*"))
    }

    /// A message's estimated cost: segments × the price; zero when no row
    /// covers it.
    pub fn cost(&self, country: Option<&str>, provider: &str, segments: u32) -> Micros {
        self.per_segment(country, provider)
            .unwrap_or(0)
            .saturating_mul(i64::from(segments))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<Micros>)] = &[
            ("0.10", Some(100_000)), ("5", Some(5_000_000)), ("0.0075", Some(7_500)),
            ("100.00", Some(100_000_000)), (".5", Some(500_000)), ("0.000001", Some(1)),
            ("0.0000001", None), ("-1", None), ("1.", None), ("", None), ("1e3", None),
            ("abc", None), ("1.2.3", None), ("99999999999999999", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_amount(s), *want, "{s}");
        }
        for (m, want) in [
            (100_000, "0.10"),
            (7_500, "0.0075"),
            (12_500_000, "12.50"),
            (0, "0.00"),
            (1, "0.000001"),
        ] {
            assert_eq!(format_amount(m), want);
        }
    }

    #[test]
    fn the_most_specific_row_wins() {
        let p = Prices::parse(
            "country,provider,price_per_segment,currency\n\
             *,*,0.10,USD\nGB,*,0.04,USD\nGB,twilio,0.035,USD\n*,vonage,0.08,USD\nde,Vonage,0.07,usd\n",
        )
        .unwrap();
        assert_eq!(p.currency(), "USD");
        #[rustfmt::skip]
        let cases: &[(Option<&str>, &str, Option<Micros>)] = &[
            (Some("GB"), "twilio", Some(35_000)),   // country+provider
            (Some("gb"), "infobip", Some(40_000)),  // country+*
            (Some("FR"), "vonage", Some(80_000)),   // *+provider
            (Some("DE"), "vonage", Some(70_000)),   // case-insensitive cells
            (Some("FR"), "twilio", Some(100_000)),  // *+*
            (None, "twilio", Some(100_000)),
            (None, "vonage", Some(80_000)),
        ];
        for (c, prov, want) in cases {
            assert_eq!(p.per_segment(*c, prov), *want, "{c:?} {prov}");
        }
        assert_eq!(p.cost(Some("GB"), "twilio", 3), 105_000);
        // `listed`: only rows naming the provider (a Gateway message is
        // charged only at a price of its own).
        assert_eq!(p.listed(Some("GB"), "twilio"), Some(35_000));
        assert_eq!(p.listed(Some("FR"), "vonage"), Some(80_000));
        assert_eq!(p.listed(Some("GB"), "infobip"), None);
        assert_eq!(p.listed(None, "telegram_gateway"), None);
        let no_default = Prices::parse(&format!("{HEADER}\nGB,*,0.04,GBP\n")).unwrap();
        assert_eq!(no_default.per_segment(Some("FR"), "x"), None);
        assert_eq!(no_default.cost(Some("FR"), "x", 2), 0);
    }

    #[test]
    fn bad_files_say_why() {
        #[rustfmt::skip]
        let cases: &[(&str, &str)] = &[
            ("", "header"),
            ("country,price\n*,1", "header"),
            ("country,provider,price_per_segment,currency\n", "no price rows"),
            ("country,provider,price_per_segment,currency\n*,*,0.1,USD\nGB,*,0.1,EUR", "line 3: currency EUR differs from USD"),
            ("country,provider,price_per_segment,currency\n*,*,0.1", "line 2: expected 4"),
            ("country,provider,price_per_segment,currency\nGBR,*,0.1,USD", "line 2: \"GBR\" is not"),
            ("country,provider,price_per_segment,currency\n*,*,free,USD", "line 2: \"free\" is not a price"),
            ("country,provider,price_per_segment,currency\n*,*,-0.1,USD", "is not a price"),
            ("country,provider,price_per_segment,currency\n*,*,0.1,US", "not an ISO 4217"),
            ("country,provider,price_per_segment,currency\n*,,0.1,USD", "provider is empty"),
            ("country,provider,price_per_segment,currency\n*,*,0.1,USD\n*,*,0.2,USD", "line 3: a second row"),
        ];
        for (text, want) in cases {
            let e = Prices::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_default_table_parses() {
        let d = Prices::default();
        assert_eq!(Prices::parse(DEFAULT_PRICES).unwrap(), d);
        assert_eq!(d.per_segment(Some("US"), "simulated"), Some(100_000));
        assert_eq!(d.currency(), "USD");
    }
}
