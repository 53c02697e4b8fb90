//! Phone numbers: parsed and validated against the real numbering plans
//! (libphonenumber's metadata, through the `phonenumber` crate), stored and
//! returned in E.164.
//!
//! The crate builds its metadata database on first use, which takes a
//! noticeable fraction of a second: [`warm`] does that at start so no
//! request pays for it.

/// A valid international phone number, as [`parse`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedPhone {
    /// E.164, e.g. `+14155552671`.
    pub e164: String,
    /// ISO 3166-1 alpha-2 region, e.g. `US`, when the number names one.
    pub country: Option<String>,
}

impl ParsedPhone {
    /// The number as a type, and its country.
    pub fn into_parts(self) -> (Phone, Option<String>) {
        (Phone(self.e164), self.country)
    }
}

/// A phone number in E.164 (`+` and 1 to 15 digits), as stored and sent.
/// Made by [`parse`] from input, or by [`Phone::from_e164`] from a stored
/// value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct Phone(String);

impl Phone {
    /// Accepts a number already in E.164 form (a stored one): the shape is
    /// checked, the numbering plan is not (that was done when it was parsed).
    pub fn from_e164(s: &str) -> Option<Self> {
        let digits = s.strip_prefix('+')?;
        let ok = (1..=15).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
            && !digits.starts_with('0');
        ok.then(|| Self(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

impl std::ops::Deref for Phone {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Phone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Phone {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Phone {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Parses an international number (`+` and country code, spaces, dashes,
/// dots and parentheses allowed) and checks it is a valid number of its
/// country's numbering plan.
pub fn parse(input: &str) -> Option<ParsedPhone> {
    let trimmed = input.trim();
    if !trimmed.starts_with('+') || trimmed.len() > 32 {
        return None;
    }
    if !trimmed[1..]
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, ' ' | '-' | '.' | '(' | ')'))
    {
        return None;
    }
    let number = phonenumber::parse(None, trimmed).ok()?;
    if !phonenumber::is_valid(&number) {
        return None;
    }
    let e164 = number.format().mode(phonenumber::Mode::E164).to_string();
    let country = number.country().id().map(|id| id.as_ref().to_string());
    Some(ParsedPhone { e164, country })
}

/// What a refused number's field says when it was written in international
/// form (or in no form a number takes).
pub const INVALID_INTERNATIONAL: &str =
    "must be a valid phone number in international form, e.g. +14155550100";

/// Parses a number as a request gives it: in international form (`+` and
/// the country code), or, read as libphonenumber reads it in `home` (the
/// tenant's `home_country`, ISO 3166 alpha-2), in that country's national
/// form (`0501234567` in SA), after its international prefix
/// (`00966501234567`) or with the country code and no `+`
/// (`966501234567`). The error is the field's message: without a home
/// country it says what to add.
pub fn parse_in(input: &str, home: Option<&str>) -> Result<ParsedPhone, String> {
    let trimmed = input.trim();
    if trimmed.starts_with('+') {
        return parse(trimmed).ok_or_else(|| INVALID_INTERNATIONAL.to_string());
    }
    if trimmed.len() > 32 || !is_national(trimmed) {
        return Err(INVALID_INTERNATIONAL.to_string());
    }
    let Some(home) = home else {
        return Err(without_home(trimmed));
    };
    let read = home
        .parse::<phonenumber::country::Id>()
        .ok()
        .and_then(|id| phonenumber::parse(Some(id), trimmed).ok())
        .filter(phonenumber::is_valid);
    match read {
        Some(number) => Ok(ParsedPhone {
            e164: number.format().mode(phonenumber::Mode::E164).to_string(),
            country: number.country().id().map(|id| id.as_ref().to_string()),
        }),
        None => Err(format!(
            "must be a valid phone number, in international form (e.g. +14155550100) or in the national form of {home} (the tenant's home_country)"
        )),
    }
}

/// The refusal of a number without `+` when the tenant has no home country:
/// the number with `+` if that is one, else how to give the country.
fn without_home(digits_and_marks: &str) -> String {
    let digits: String = digits_and_marks
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let international = digits.strip_prefix("00").unwrap_or(&digits);
    if let Some(p) = parse(&format!("+{international}")) {
        return format!(
            "must be a phone number in international form, + before its country code: if it is {}, write it so (the tenant has no home_country to read numbers without + in)",
            p.e164
        );
    }
    "must be a phone number in international form: add + and its country code (e.g. +966 501234567 for Saudi Arabia's 0501234567), or set the tenant's home_country (sendonce tenant home-country NAME SA, or PATCH /admin/tenants/{name}) so national numbers are read as that country's".to_string()
}

/// A number in national format (`4155550100`, `(415) 555-0100`) read in
/// `country` (ISO 3166 alpha-2), as E.164, if it is a valid number there.
pub fn national_number(q: &str, country: &str) -> Option<String> {
    let q = q.trim();
    if !is_national(q) {
        return None;
    }
    let id: phonenumber::country::Id = country.parse().ok()?;
    let number = phonenumber::parse(Some(id), q).ok()?;
    phonenumber::is_valid(&number)
        .then(|| number.format().mode(phonenumber::Mode::E164).to_string())
}

/// Digits alone (at least six; spaces, dashes, dots and parentheses
/// allowed) with no `+`: what a number in national format looks like.
pub fn is_national(q: &str) -> bool {
    q.bytes().filter(u8::is_ascii_digit).count() >= 6
        && q.bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b' ' | b'-' | b'.' | b'(' | b')'))
}

/// The number without its last four digits: numbers sharing it are usually
/// one range, the unit SMS-pumping fraud works in.
pub fn prefix_of(e164: &str) -> String {
    let keep = e164.len().saturating_sub(4);
    e164[..keep].to_string()
}

/// Loads the numbering-plan database now rather than on the first request.
pub fn warm() {
    let _ = parse("+14155552671");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_numbers_come_back_in_e164_with_their_country() {
        let p = parse("+1 (415) 555-2671").unwrap();
        assert_eq!(p.e164, "+14155552671");
        assert_eq!(p.country.as_deref(), Some("US"));
        let p = parse("+44 20 7946 0958").unwrap();
        assert_eq!(p.e164, "+442079460958");
        assert_eq!(p.country.as_deref(), Some("GB"));
        assert_eq!(
            parse("+4915123456789").unwrap().country.as_deref(),
            Some("DE")
        );
        assert!(parse("+14155550100").is_some(), "555-01xx");
        assert!(parse("+14155550199").is_some(), "555-01xx");
        assert!(parse("+4764").is_none());
    }

    #[test]
    fn stored_numbers_are_checked_for_shape() {
        let p = Phone::from_e164("+14155552671").unwrap();
        assert_eq!(p.as_str(), "+14155552671");
        assert_eq!(p, "+14155552671");
        let parsed = parse("+1 (415) 555-2671").unwrap().into_parts().0;
        assert_eq!(parsed, p);
        for bad in [
            "14155552671",
            "+",
            "+0123",
            "+1234567890123456",
            "+1 415",
            "",
        ] {
            assert_eq!(Phone::from_e164(bad), None, "{bad}");
        }
    }

    #[test]
    fn invalid_numbers_are_refused() {
        for bad in [
            "14155552671",      // no country code
            "+1415555",         // too short for the plan
            "+999123456789",    // no such country code
            "+1 415 555 2671a", // letters
            "+",
            "",
            "+12345678901234567890",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn numbers_are_read_in_the_home_country() {
        for written in [
            "0501234567",
            "050 123 4567",
            "966501234567",
            "00966501234567",
            "+966501234567",
        ] {
            let p = parse_in(written, Some("SA")).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(p.e164, "+966501234567", "{written}");
            assert_eq!(p.country.as_deref(), Some("SA"), "{written}");
        }
        let p = parse_in("(415) 555-2671", Some("US")).unwrap();
        assert_eq!(p.e164, "+14155552671");
        let e = parse_in("0501234567", None).unwrap_err();
        assert!(
            e.contains("home_country") && e.contains("country code"),
            "{e}"
        );
        let e = parse_in("966501234567", None).unwrap_err();
        assert!(e.contains("+966501234567"), "{e}");
        let e = parse_in("00966501234567", None).unwrap_err();
        assert!(e.contains("+966501234567"), "{e}");
        let e = parse_in("0501234", Some("SA")).unwrap_err();
        assert!(e.contains("SA"), "{e}");
        assert_eq!(
            parse_in("+4764", Some("SA")).unwrap_err(),
            INVALID_INTERNATIONAL
        );
        assert_eq!(
            parse_in("hello", Some("SA")).unwrap_err(),
            INVALID_INTERNATIONAL
        );
    }
}
