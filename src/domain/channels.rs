//! The channels a verification's code goes through, in order (issue 28):
//! `["sms"]` (the default), `["telegram"]`, or `["telegram", "sms"]`
//! (Telegram first, SMS when it did not deliver). Telegram can only come
//! first: it is the channel that reports delivery to wait on, and SMS the
//! one that reaches every number. In `domain`: the store, delivery and
//! verify all read them, and none of those is below the others.

/// One channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Through the Telegram Gateway, to the number's Telegram account.
    Telegram,
    Sms,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Telegram => "telegram",
            Channel::Sms => "sms",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "telegram" => Some(Channel::Telegram),
            "sms" => Some(Channel::Sms),
            _ => None,
        }
    }
}

/// A verification's channels, in order: never empty, none twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels(Vec<Channel>);

impl Default for Channels {
    fn default() -> Self {
        Channels(vec![Channel::Sms])
    }
}

/// Why a `channels` field was refused.
pub const INVALID: &str =
    r#"must be ["sms"], ["telegram"] or ["telegram", "sms"] (telegram can only come first)"#;

impl Channels {
    /// The field as given in a request.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, &'static str> {
        let list = v.as_array().ok_or(INVALID)?;
        let mut out = Vec::new();
        for item in list {
            let c = item.as_str().and_then(Channel::parse).ok_or(INVALID)?;
            if out.contains(&c) {
                return Err(INVALID);
            }
            out.push(c);
        }
        Self::checked(out).ok_or(INVALID)
    }

    fn checked(list: Vec<Channel>) -> Option<Self> {
        let ok = !list.is_empty() && !list[1..].contains(&Channel::Telegram);
        ok.then_some(Channels(list))
    }

    /// As stored: the names joined by `,`.
    pub fn stored(&self) -> String {
        self.0
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// From [`Channels::stored`]; `None` for anything else.
    pub fn parse_stored(s: &str) -> Option<Self> {
        let list = s
            .split(',')
            .map(Channel::parse)
            .collect::<Option<Vec<_>>>()?;
        Self::checked(list)
    }

    pub fn first(&self) -> Channel {
        self.0.first().copied().unwrap_or(Channel::Sms)
    }

    pub fn contains(&self, c: Channel) -> bool {
        self.0.contains(&c)
    }

    /// The channel after `c`, if any.
    pub fn after(&self, c: Channel) -> Option<Channel> {
        let i = self.0.iter().position(|x| *x == c)?;
        self.0.get(i + 1).copied()
    }

    /// The names, for answers.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|c| c.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_lists_as_a_table() {
        let rows: &[(&str, Option<&str>)] = &[
            (r#"["sms"]"#, Some("sms")),
            (r#"["telegram"]"#, Some("telegram")),
            (r#"["telegram", "sms"]"#, Some("telegram,sms")),
            (r#"["sms", "telegram"]"#, None),
            (r#"["telegram", "telegram"]"#, None),
            (r#"[]"#, None),
            (r#"["email"]"#, None),
            (r#""sms""#, None),
            (r#"[1]"#, None),
        ];
        for (json, want) in rows {
            let v: serde_json::Value = serde_json::from_str(json).expect("json");
            let got = Channels::from_json(&v).ok().map(|c| c.stored());
            assert_eq!(got.as_deref(), *want, "{json}");
            if let Some(stored) = want {
                assert_eq!(
                    Channels::parse_stored(stored)
                        .map(|c| c.stored())
                        .as_deref(),
                    Some(*stored)
                );
            }
        }
        let both = Channels::parse_stored("telegram,sms").expect("channels");
        assert_eq!(both.after(Channel::Telegram), Some(Channel::Sms));
        assert_eq!(both.after(Channel::Sms), None);
        assert_eq!(Channels::parse_stored("sms,telegram"), None);
        assert_eq!(Channels::parse_stored(""), None);
    }
}
