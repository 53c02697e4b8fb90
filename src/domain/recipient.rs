//! Who a message goes to, on which channel: the one address type every layer
//! above a channel carries (the send layer, delivery, the provider call, the
//! message record).
//!
//! Two kinds of address: a [`Phone`] (SMS), and a chat on a channel of its
//! own (`<channel>:<chat id>`, e.g. the Telegram bot's `telegram:42`; issue
//! 28), for the channels whose adapter declares that address form
//! (`registry::Address::Chat`, issue 40: the domain names no such channel;
//! the list is handed in). What only
//! SMS has (segments and their encoding, the numbering plan and the
//! destination's country, limits per number prefix, quiet hours by the
//! number's zone) is reached through the [`Recipient::Sms`] variant
//! ([`Recipient::phone`]), not spread across layers. An adapter asks
//! [`Recipient::phone`] (or [`Recipient::chat`]) and refuses what it cannot
//! carry; [`Recipient::channel`] is the adapter's channel
//! (`src/provider/registry.rs`).
//!
//! The address is stored, shown and fingerprinted as one string
//! ([`Recipient::as_str`]): an SMS recipient is its E.164 number, exactly as
//! before this type existed, so stored rows, replays and fingerprints are
//! unchanged; a chat is `<channel>:<chat_id>`, so that opt-outs, limits per
//! address and everything else keyed on the stored address work for it
//! unchanged. [`Recipient::from_stored`] is the one conversion back from a
//! row's `to_number` column.

use super::channels::Channel;
use super::phone::{self, Phone};
use super::segments::{self, SegmentCount};

/// A message's destination.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Recipient {
    /// A phone number, reached by SMS.
    Sms(Phone),
    /// A chat on a channel of its own (the Telegram bot's).
    Chat(Chat),
}

/// A chat id (a user's, a group's `-100…`) on a channel of its own, with
/// its stored form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Chat {
    channel: &'static str,
    id: i64,
    /// `<channel>:<id>`, the id in its canonical decimal form.
    stored: String,
}

impl Chat {
    pub fn new(channel: Channel, id: i64) -> Self {
        Self {
            channel: channel.as_str(),
            id,
            stored: format!("{channel}:{id}"),
        }
    }

    /// The chat id the channel's API takes (the Bot API's `chat_id`).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Its channel.
    pub fn channel(&self) -> Channel {
        Channel::named(self.channel)
    }

    /// `<channel>:<id>`.
    pub fn as_str(&self) -> &str {
        &self.stored
    }
}

/// A chat id in its canonical form (an optional `-`, digits, no leading
/// zero), within `i64`, not zero.
fn chat_id(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    s.parse::<i64>().ok().filter(|id| *id != 0)
}

/// The chat channel `s` is an address of (`<channel>:...`), among `chats`,
/// and the rest after its `:`.
fn chat_of<'a>(s: &'a str, chats: &[Channel]) -> Option<(Channel, &'a str)> {
    let (name, rest) = s.split_once(':')?;
    chats
        .iter()
        .find(|c| c.as_str() == name)
        .map(|c| (*c, rest))
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRecipient(pub std::borrow::Cow<'static, str>);

impl Recipient {
    /// How many parts `body` goes out as on this recipient's channel: for
    /// SMS, its GSM-7 or UCS-2 segments (what `SENDONCE_MAX_SEGMENTS`
    /// bounds and the provider bills); for a chat, one message in UTF-8 (a
    /// body is at most 1600 characters; a chat channel's adapter takes that
    /// much in one message: the bot's 4096).
    pub fn segments(&self, body: &str) -> SegmentCount {
        match self {
            Recipient::Sms(_) => segments::count(body),
            Recipient::Chat(_) => SegmentCount {
                encoding: segments::Encoding::Utf8,
                segments: 1,
            },
        }
    }

    /// Parses a request's `to`: a phone number in international form,
    /// checked against its numbering plan, or `<channel>:<chat_id>` for one
    /// of `chats` (the channels whose adapter declares chat addresses).
    pub fn parse(input: &str, chats: &[Channel]) -> Result<ParsedRecipient, InvalidRecipient> {
        Self::parse_in(input, None, chats)
    }

    /// [`Recipient::parse`], a number without `+` read in `home` (the
    /// tenant's `home_country`) as [`phone::parse_in`] reads it.
    pub fn parse_in(
        input: &str,
        home: Option<&str>,
        chats: &[Channel],
    ) -> Result<ParsedRecipient, InvalidRecipient> {
        if let Some((channel, id)) = chat_of(input.trim(), chats) {
            return match chat_id(id) {
                Some(id) => Ok(ParsedRecipient {
                    recipient: Recipient::Chat(Chat::new(channel, id)),
                    country: None,
                }),
                None => Err(InvalidRecipient(
                    format!(
                        "a {channel} address is {channel}:<chat_id>, the chat id a number, e.g. {channel}:123456789"
                    )
                    .into(),
                )),
            };
        }
        match phone::parse_in(input, home) {
            Ok(p) => {
                let (phone, country) = p.into_parts();
                Ok(ParsedRecipient {
                    recipient: Recipient::Sms(phone),
                    country,
                })
            }
            Err(message) => Err(InvalidRecipient(message.into())),
        }
    }

    /// The address as a stored row holds it ([`Recipient::as_str`]): its
    /// shape is checked, not the numbering plan (that was done on the way in).
    pub fn from_stored(s: &str, chats: &[Channel]) -> Option<Self> {
        if let Some((channel, id)) = chat_of(s, chats) {
            return chat_id(id).map(|id| Recipient::Chat(Chat::new(channel, id)));
        }
        Phone::from_e164(s).map(Recipient::Sms)
    }

    /// The address as stored, shown, logged (masked) and fingerprinted.
    pub fn as_str(&self) -> &str {
        match self {
            Recipient::Sms(p) => p.as_str(),
            Recipient::Chat(c) => c.as_str(),
        }
    }

    /// The channel's name, as a label and as the adapter's channel
    /// (`registry::Channel`): `sms`, or the chat's channel.
    pub fn channel(&self) -> &'static str {
        match self {
            Recipient::Sms(_) => Channel::SMS.as_str(),
            Recipient::Chat(c) => c.channel,
        }
    }

    /// The phone number, if this recipient is reached by SMS: what an SMS
    /// adapter sends to and what the SMS-only checks read.
    pub fn phone(&self) -> Option<&Phone> {
        match self {
            Recipient::Sms(p) => Some(p),
            Recipient::Chat(_) => None,
        }
    }

    /// The chat, if this recipient is one.
    pub fn chat(&self) -> Option<&Chat> {
        match self {
            Recipient::Chat(c) => Some(c),
            Recipient::Sms(_) => None,
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

    /// The chat channels a registry with the Telegram bot declares.
    const CHATS: [Channel; 1] = [Channel::named("telegram")];

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
            ("", None),
            ("+", None),
        ];
        for (input, want) in cases {
            let got = Recipient::parse(input, &CHATS);
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
                    matches!(&got, Err(InvalidRecipient(m)) if m.contains("phone number")),
                    "{input}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn telegram_addresses_parse_as_a_table() {
        // (input, Some(stored) or None: refused as a Telegram address)
        let cases: &[(&str, Option<&str>)] = &[
            ("telegram:123456789", Some("telegram:123456789")),
            (" telegram:42 ", Some("telegram:42")),
            ("telegram:-1001234567890", Some("telegram:-1001234567890")),
            (
                "telegram:9223372036854775807",
                Some("telegram:9223372036854775807"),
            ),
            ("telegram:9223372036854775808", None),
            ("telegram:", None),
            ("telegram:0", None),
            ("telegram:007", None),
            ("telegram:+42", None),
            ("telegram:-", None),
            ("telegram:12a", None),
            ("telegram:@channel", None),
            ("telegram: 42", None),
        ];
        for (input, want) in cases {
            let got = Recipient::parse(input, &CHATS);
            match want {
                Some(stored) => {
                    let p = got.unwrap_or_else(|e| panic!("{input}: {e:?}"));
                    assert_eq!(p.recipient.as_str(), *stored, "{input}");
                    assert_eq!(p.recipient.channel(), "telegram", "{input}");
                    assert_eq!(p.country, None, "{input}");
                    assert_eq!(p.recipient.phone(), None, "{input}");
                    assert_eq!(p.recipient.prefix(), None, "{input}: no number range");
                    assert_eq!(
                        Recipient::from_stored(stored, &CHATS),
                        Some(p.recipient.clone()),
                        "{input}"
                    );
                }
                None => assert!(
                    matches!(&got, Err(InvalidRecipient(m)) if m.contains("telegram:<chat_id>")),
                    "{input}: {got:?}"
                ),
            }
        }
        let chat = Recipient::parse("telegram:42", &CHATS).map(|p| p.recipient);
        let chat = chat.expect("a chat");
        assert_eq!(chat.chat().map(Chat::id), Some(42));
        // A channel not among those declared is no chat address.
        assert!(Recipient::parse("telegram:42", &[]).is_err());
        // One message, UTF-8, whatever SMS would make of the text.
        let one = chat.segments(&"я".repeat(300));
        assert_eq!((one.encoding, one.segments), (segments::Encoding::Utf8, 1));
    }

    #[test]
    fn stored_addresses_round_trip_as_a_table() {
        let cases: &[(&str, bool)] = &[
            ("+14155550100", true),
            ("+442079460958", true),
            ("14155550100", false),
            ("+0123", false),
            ("+1234567890123456", false),
            ("telegram:12345", true),
            ("telegram:-100123", true),
            ("telegram:012", false),
            ("telegram:x", false),
            ("", false),
        ];
        for (stored, ok) in cases {
            let got = Recipient::from_stored(stored, &CHATS);
            assert_eq!(got.is_some(), *ok, "{stored}");
            if let Some(r) = got {
                assert_eq!(r.as_str(), *stored);
                assert_eq!(r.to_string(), *stored);
                assert_eq!(Recipient::from_stored(r.as_str(), &CHATS), Some(r.clone()));
            }
        }
    }

    #[test]
    fn sms_only_checks_are_reached_through_the_sms_variant() {
        let r = Recipient::parse("+14155552671", &CHATS)
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
