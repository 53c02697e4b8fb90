//! Phone numbers: parsed and validated against the real numbering plans
//! (libphonenumber's metadata, through the `phonenumber` crate), stored and
//! returned in E.164.
//!
//! The crate builds its metadata database on first use, which takes a
//! noticeable fraction of a second: [`warm`] does that at start so no
//! request pays for it.

/// A valid international phone number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phone {
    /// E.164, e.g. `+14155552671`.
    pub e164: String,
    /// ISO 3166-1 alpha-2 region, e.g. `US`, when the number names one.
    pub country: Option<String>,
}

/// Parses an international number (`+` and country code, spaces, dashes,
/// dots and parentheses allowed) and checks it is a valid number of its
/// country's numbering plan.
pub fn parse(input: &str) -> Option<Phone> {
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
    Some(Phone { e164, country })
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
}
