//! Who a message goes to, on which channel: the one address type every layer
//! above a channel carries (the send layer, delivery, the provider call, the
//! message record).
//!
//! Today there is one channel, SMS, and its address is a [`Phone`]. What only
//! SMS has (segments and their encoding, the numbering plan and the
//! destination's country, limits per number prefix, opt-outs by number) is
//! reached through the [`Recipient::Sms`] variant ([`Recipient::phone`]), not
//! spread across layers. A new channel (Telegram's chat ids, issue 28) adds a
//! variant, its parsing in [`Recipient::parse`] and [`Recipient::from_stored`],
//! and an adapter that speaks it; an adapter asks [`Recipient::phone`] (or its
//! own accessor) and refuses what it cannot carry.
//!
//! The address is stored, shown and fingerprinted as one string
//! ([`Recipient::as_str`]): an SMS recipient is its E.164 number, exactly as
//! before this type existed, so stored rows, replays and fingerprints are
//! unchanged. [`Recipient::from_stored`] is the one conversion back from a
//! row's `to_number` column.

use super::phone::{self, Phone};
use super::segments::{self, SegmentCount};

/// A message's destination.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Recipient {
    /// A phone number, reached by SMS.
    Sms(Phone),
}

/// A recipient parsed from a request, with what the request's checks need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedRecipient {
    pub recipient: Recipient,
    /// The destination's ISO 3166-1 region, when the channel has one (SMS:
    /// the number's country, for per-tenant allow-lists).
    pub country: Option<String>,
}

/// Why a `to` was refused: the message a 422 shows for the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidRecipient(pub &'static str);

impl Recipient {
    /// How many parts `body` goes out as on this recipient's channel: for
    /// SMS, its GSM-7 or UCS-2 segments (what `SENDONCE_MAX_SEGMENTS`
    /// bounds and the provider bills).
    pub fn segments(&self, body: &str) -> SegmentCount {
        match self {
            Recipient::Sms(_) => segments::count(body),
        }
    }

    /// Parses a request's `to`. Today every address is a phone number in
    /// international form, checked against its numbering plan.
    pub fn parse(input: &str) -> Result<ParsedRecipient, InvalidRecipient> {
        match phone::parse(input) {
            Some(p) => {
                let (phone, country) = p.into_parts();
                Ok(ParsedRecipient {
                    recipient: Recipient::Sms(phone),
                    country,
                })
            }
            None => Err(InvalidRecipient(
                "must be a valid phone number in international form, e.g. +14155550100",
            )),
        }
    }

    /// The address as a stored row holds it ([`Recipient::as_str`]): its
    /// shape is checked, not the numbering plan (that was done on the way in).
    pub fn from_stored(s: &str) -> Option<Self> {
        Phone::from_e164(s).map(Recipient::Sms)
    }

    /// The address as stored, shown, logged (masked) and fingerprinted.
    pub fn as_str(&self) -> &str {
        match self {
            Recipient::Sms(p) => p.as_str(),
        }
    }

    /// The channel's name, as a label: `sms`.
    pub fn channel(&self) -> &'static str {
        match self {
            Recipient::Sms(_) => "sms",
        }
    }

    /// The phone number, if this recipient is reached by SMS: what an SMS
    /// adapter sends to and what the SMS-only checks read.
    pub fn phone(&self) -> Option<&Phone> {
        match self {
            Recipient::Sms(p) => Some(p),
        }
    }

    /// The number range this recipient's per-prefix limit counts in: SMS
    /// only (the unit SMS-pumping fraud works in).
    pub fn prefix(&self) -> Option<String> {
        self.phone()
            .map(|p| crate::domain::phone::prefix_of(p.as_str()))
    }
}

impl From<Phone> for Recipient {
    fn from(p: Phone) -> Self {
        Recipient::Sms(p)
    }
}

impl std::fmt::Display for Recipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Recipient {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Recipient {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Serialized as its stored string (a request's fingerprint, the message
/// resource's `to`): unchanged from when the field was a bare number.
impl serde::Serialize for Recipient {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an input parses to: its stored form, its channel and country.
    type Parsed = Option<(&'static str, &'static str, Option<&'static str>)>;

    #[test]
    fn requests_parse_as_a_table() {
        // (input, Some((stored, channel, country)) or None: refused)
        let cases: &[(&str, Parsed)] = &[
            ("+14155550100", Some(("+14155550100", "sms", Some("US")))),
            (
                "+1 (415) 555-2671",
                Some(("+14155552671", "sms", Some("US"))),
            ),
            (
                "  +44 20 7946 0958 ",
                Some(("+442079460958", "sms", Some("GB"))),
            ),
            (
                "+4915123456789",
                Some(("+4915123456789", "sms", Some("DE"))),
            ),
            ("14155552671", None),
            ("+1415555", None),
            ("+999123456789", None),
            ("+1 415 555 2671a", None),
            ("telegram:12345", None),
            ("", None),
            ("+", None),
        ];
        for (input, want) in cases {
            let got = Recipient::parse(input);
            match want {
                Some((stored, channel, country)) => {
                    let p = got.unwrap_or_else(|e| panic!("{input}: {e:?}"));
                    assert_eq!(p.recipient.as_str(), *stored, "{input}");
                    assert_eq!(p.recipient.channel(), *channel, "{input}");
                    assert_eq!(p.country.as_deref(), *country, "{input}");
                    assert_eq!(
                        p.recipient.phone().map(|p| p.as_str()),
                        Some(*stored),
                        "{input}: an SMS recipient has its number"
                    );
                }
                None => assert!(
                    matches!(got, Err(InvalidRecipient(m)) if m.contains("phone number")),
                    "{input}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn stored_addresses_round_trip_as_a_table() {
        let cases: &[(&str, bool)] = &[
            ("+14155550100", true),
            ("+442079460958", true),
            ("14155550100", false),
            ("+0123", false),
            ("+1234567890123456", false),
            ("telegram:12345", false),
            ("", false),
        ];
        for (stored, ok) in cases {
            let got = Recipient::from_stored(stored);
            assert_eq!(got.is_some(), *ok, "{stored}");
            if let Some(r) = got {
                assert_eq!(r.as_str(), *stored);
                assert_eq!(r.to_string(), *stored);
                assert_eq!(Recipient::from_stored(r.as_str()), Some(r.clone()));
            }
        }
    }

    #[test]
    fn sms_only_checks_are_reached_through_the_sms_variant() {
        let r = Recipient::parse("+14155552671")
            .map(|p| p.recipient)
            .expect("a valid number");
        assert_eq!(r.prefix().as_deref(), Some("+1415555"));
        assert_eq!(
            serde_json::to_string(&r).ok().as_deref(),
            Some("\"+14155552671\""),
            "serialized (fingerprinted) exactly as the bare number was"
        );
        // (body, encoding, segments): an SMS counts GSM-7 and UCS-2 parts.
        let bodies = [
            ("hi", segments::Encoding::Gsm7, 1),
            (&*"a".repeat(161), segments::Encoding::Gsm7, 2),
            ("Grüße €", segments::Encoding::Gsm7, 1),
            ("привет", segments::Encoding::Ucs2, 1),
            (&*"я".repeat(71), segments::Encoding::Ucs2, 2),
        ];
        for (body, encoding, parts) in bodies {
            let got = r.segments(body);
            assert_eq!((got.encoding, got.segments), (encoding, parts), "{body}");
        }
    }
}
