//! Phone numbers: parsed and validated against the real numbering plans
//! (libphonenumber's metadata, through the `phonenumber` crate), stored and
//! returned in E.164.
//!
//! The crate builds its metadata database on first use, which takes a
//! noticeable fraction of a second: [`warm`] does that at start so no
//! request pays for it.
//!
//! Checking a parsed number ([`checked`]) reads the crate's metadata
//! directly instead of calling `is_valid`, `country().id()` and the E.164
//! formatter one after another: each of those finds the number's region
//! again (for +1, matching it against the region's whole plan) and the
//! formatter matches the number against every national format before it
//! writes `+` and the digits. That was about 38 % of the instructions of a
//! whole send (BENCHMARKS.md, "Instructions per send"). The answers are the
//! crate's: a test compares them on every region's example numbers and
//! their neighbours.

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
    checked(&number)
}

/// A parsed number as [`ParsedPhone`] if it is valid: what
/// `phonenumber::is_valid`, `number.country().id()` and the E.164 formatter
/// answer, finding its region once.
fn checked(number: &phonenumber::PhoneNumber) -> Option<ParsedPhone> {
    let db = &*phonenumber::metadata::DATABASE;
    let code = number.code().value();
    let national = number.national().to_string();
    let (meta, valid) = region_of(db, code, &national)?;
    if !valid && !is_valid_type(meta, &national) {
        return None;
    }
    // The crate finds the country from the national number without its
    // leading zeros (Italy's fixed lines keep one): the same region unless
    // there are some.
    let country_meta = if national.starts_with('0') {
        region_of(db, code, &number.national().value().to_string()).map(|(m, _)| m)
    } else {
        Some(meta)
    };
    let country = country_meta
        .and_then(|m| m.id().parse::<phonenumber::country::Id>().ok())
        .map(|id| id.as_ref().to_string());
    Some(ParsedPhone {
        e164: format!("+{code}{national}"),
        country,
    })
}

/// The metadata a number with country code `code` is read in (the crate's
/// `source_for`: the code's one region, else the first of its regions whose
/// leading digits the number starts with or whose plan it fits), and
/// whether that choice already showed it fits the plan.
fn region_of<'d>(
    db: &'d phonenumber::metadata::Database,
    code: u16,
    national: &str,
) -> Option<(&'d phonenumber::Metadata, bool)> {
    let regions = db.region(&code)?;
    if let [only] = regions.as_slice() {
        let meta = if *only == "001" {
            db.by_code(&code)?.into_iter().next()?
        } else {
            only.parse::<phonenumber::country::Id>().ok()?;
            db.by_id(*only)?
        };
        return Some((meta, false));
    }
    for region in regions {
        let meta = db.by_id(region)?;
        match meta.leading_digits() {
            Some(pattern) if pattern.find(national).is_some_and(|m| m.start() == 0) => {
                region.parse::<phonenumber::country::Id>().ok()?;
                return Some((meta, false));
            }
            // Leading digits that do not fit: not this region.
            Some(_) => {}
            None if is_valid_type(meta, national) => {
                region.parse::<phonenumber::country::Id>().ok()?;
                return Some((meta, true));
            }
            None => {}
        }
    }
    None
}

/// Whether `national` is a number of some type in `meta`'s plan (the
/// crate's `number_type(..) != Unknown`).
fn is_valid_type(meta: &phonenumber::Metadata, national: &str) -> bool {
    let d = meta.descriptors();
    d.general().is_match(national)
        && [
            d.premium_rate(),
            d.toll_free(),
            d.shared_cost(),
            d.voip(),
            d.personal_number(),
            d.pager(),
            d.uan(),
            d.voicemail(),
            d.fixed_line(),
            d.mobile(),
        ]
        .into_iter()
        .flatten()
        .any(|t| t.is_match(national))
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
        .and_then(|number| checked(&number));
    match read {
        Some(parsed) => Ok(parsed),
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
    checked(&number).map(|p| p.e164)
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

    /// What the crate's own calls answer (the code before `checked`).
    fn reference(number: &phonenumber::PhoneNumber) -> Option<ParsedPhone> {
        phonenumber::is_valid(number).then(|| ParsedPhone {
            e164: number.format().mode(phonenumber::Mode::E164).to_string(),
            country: number.country().id().map(|id| id.as_ref().to_string()),
        })
    }

    #[test]
    fn checking_a_number_answers_what_the_crate_answers() {
        let db = &*phonenumber::metadata::DATABASE;
        let mut inputs: Vec<String> = Vec::new();
        for meta in db.iter() {
            let d = meta.descriptors();
            let examples = [
                Some(d.general()),
                d.fixed_line(),
                d.mobile(),
                d.toll_free(),
                d.premium_rate(),
                d.shared_cost(),
                d.personal_number(),
                d.voip(),
                d.pager(),
                d.uan(),
                d.voicemail(),
            ];
            for example in examples.into_iter().flatten().filter_map(|x| x.example()) {
                let full = format!("+{}{example}", meta.country_code());
                // The number, one digit longer and shorter, and its last
                // digit changed: valid and invalid neighbours.
                inputs.push(full.clone());
                inputs.push(format!("{full}7"));
                inputs.push(full[..full.len() - 1].to_string());
                inputs.push(format!("{}9", &full[..full.len() - 1]));
                if let Ok(id) = meta.id().parse::<phonenumber::country::Id>() {
                    inputs.push(format!("{id:?}:{example}"));
                    inputs.push(format!("{id:?}:0{example}"));
                }
            }
        }
        inputs.extend(
            [
                "+39 06 6982 1234",
                "+39 333 123 4567",
                "+1 684 733 1234",
                "+1 809 234 5678",
                "+1 415 555 2671",
                "+7 701 123 4567",
                "+44 7400 123456",
                "+800 1234 5678",
                "+882 1234 5678",
                "+979 123456789",
            ]
            .map(String::from),
        );
        let (mut checked_valid, mut checked_invalid) = (0, 0);
        for input in &inputs {
            let number = match input.split_once(':') {
                Some((id, national)) => {
                    let Ok(id) = id.parse::<phonenumber::country::Id>() else {
                        continue;
                    };
                    phonenumber::parse(Some(id), national)
                }
                None => phonenumber::parse(None, input),
            };
            let Ok(number) = number else { continue };
            let want = reference(&number);
            assert_eq!(checked(&number), want, "{input}");
            if want.is_some() {
                checked_valid += 1;
            } else {
                checked_invalid += 1;
            }
        }
        assert!(
            checked_valid > 1000 && checked_invalid > 1000,
            "{checked_valid} valid and {checked_invalid} invalid numbers compared"
        );
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
