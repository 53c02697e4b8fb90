//! The channels a verification's code goes through, in order (issues 28,
//! 40): any of the channels the adapter registry declares
//! (`provider::registry`, `Adapter::verify`), in any order, none twice:
//! `["sms"]` (the default), `["telegram", "sms"]`,
//! `["whatsapp", "telegram", "sms"]`. One step at a time: the next
//! channel's message goes only when the step before it failed, or did not
//! report delivery within its `fallback_after_seconds` (and was revoked
//! where its channel can revoke).
//!
//! In `domain`: the store, delivery and verify all read them, and none of
//! those is below the others. Nothing here names a channel but SMS, the
//! one every phone number has and the default; which other names exist is
//! the registry's to say, and a name is turned into a [`Channel`] only
//! through it.

/// One channel: its name as the API, the store and the metrics say it.
/// A value, compared by name, `Copy`; made by [`Channel::named`] from a
/// name the registry declares (so that the type holds only known names).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Channel(&'static str);

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Channel {
    /// Phone numbers through the SMS adapters and their routes.
    pub const SMS: Channel = Channel("sms");

    /// The channel a registry entry declares (its name: lower-case letters,
    /// digits and `_`, starting with a letter).
    pub const fn named(name: &'static str) -> Self {
        Channel(name)
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }
}

/// A verification's channels, in order: never empty, none twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels(Vec<Channel>);

impl Default for Channels {
    fn default() -> Self {
        Channels(vec![Channel::SMS])
    }
}

/// Why a `channels` field was refused, with the channels there are.
pub fn invalid(known: &[Channel]) -> String {
    let names: Vec<String> = known.iter().map(|c| format!("\"{c}\"")).collect();
    format!(
        "must be a list of channels, each at most once, in the order to try them (the channels: {})",
        names.join(", ")
    )
}

impl Channels {
    /// The field as given in a request; `known` are the channels there are
    /// (the registry's). `Err`: why not.
    pub fn from_json(v: &serde_json::Value, known: &[Channel]) -> Result<Self, String> {
        let list = v.as_array().ok_or_else(|| invalid(known))?;
        let mut out = Vec::new();
        for item in list {
            let c = item
                .as_str()
                .and_then(|s| lookup(s, known))
                .ok_or_else(|| invalid(known))?;
            if out.contains(&c) {
                return Err(invalid(known));
            }
            out.push(c);
        }
        if out.is_empty() {
            return Err(invalid(known));
        }
        Ok(Channels(out))
    }

    /// As stored: the names joined by `,`.
    pub fn stored(&self) -> String {
        self.names().join(",")
    }

    /// From [`Channels::stored`], with the channels there are; `None` for
    /// anything else.
    pub fn parse_stored(s: &str, known: &[Channel]) -> Option<Self> {
        let list = s
            .split(',')
            .map(|n| lookup(n, known))
            .collect::<Option<Vec<_>>>()?;
        let mut seen = Vec::new();
        for c in &list {
            if seen.contains(c) {
                return None;
            }
            seen.push(*c);
        }
        (!list.is_empty()).then_some(Channels(list))
    }

    /// The first channel: the one a start or a resend sends on.
    pub fn first(&self) -> Channel {
        self.0.first().copied().unwrap_or(Channel::SMS)
    }

    /// The channel of step `step` (0: the first), if there is one.
    pub fn at(&self, step: u32) -> Option<Channel> {
        self.0.get(usize::try_from(step).ok()?).copied()
    }

    /// How many steps there are.
    pub fn len(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether these are the default (`["sms"]` alone): a verification
    /// with one SMS step has nothing to move on to and nothing to revoke.
    pub fn is_default(&self) -> bool {
        *self == Channels::default()
    }

    pub fn contains(&self, c: Channel) -> bool {
        self.0.contains(&c)
    }

    pub fn iter(&self) -> impl Iterator<Item = Channel> + '_ {
        self.0.iter().copied()
    }

    /// The names, for answers.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|c| c.as_str()).collect()
    }
}

fn lookup(name: &str, known: &[Channel]) -> Option<Channel> {
    known.iter().copied().find(|c| c.as_str() == name)
}

/// How long each step of a verification has to report delivery before the
/// next one goes: one number for every step, or one per step after the
/// first (`fallback_after_seconds`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FallbackAfter {
    Every(u32),
    /// `[n]` is how long step `n` waits before step `n + 1`.
    Each(Vec<u32>),
}

impl Default for FallbackAfter {
    fn default() -> Self {
        FallbackAfter::Every(0)
    }
}

impl FallbackAfter {
    /// How long step `step` waits for a report before the next step goes.
    pub fn for_step(&self, step: u32) -> u32 {
        match self {
            FallbackAfter::Every(n) => *n,
            FallbackAfter::Each(list) => usize::try_from(step)
                .ok()
                .and_then(|i| list.get(i))
                .or(list.last())
                .copied()
                .unwrap_or(0),
        }
    }

    /// As stored: the list joined by `,`, `None` for one number (kept in
    /// its own column).
    pub fn stored_list(&self) -> Option<String> {
        match self {
            FallbackAfter::Every(_) => None,
            FallbackAfter::Each(list) => Some(
                list.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        }
    }

    /// From the stored number and list.
    pub fn from_stored(every: u32, list: Option<&str>) -> Option<Self> {
        match list {
            None => Some(FallbackAfter::Every(every)),
            Some(s) => s
                .split(',')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
                .map(FallbackAfter::Each),
        }
    }

    /// The first step's (what the single-number column keeps).
    pub fn first(&self) -> u32 {
        self.for_step(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TELEGRAM: Channel = Channel::named("telegram");
    const WHATSAPP: Channel = Channel::named("whatsapp");
    const KNOWN: &[Channel] = &[Channel::SMS, TELEGRAM, WHATSAPP];

    #[test]
    fn channel_lists_as_a_table() {
        let rows: &[(&str, Option<&str>)] = &[
            (r#"["sms"]"#, Some("sms")),
            (r#"["telegram"]"#, Some("telegram")),
            (r#"["telegram", "sms"]"#, Some("telegram,sms")),
            // Any order (issue 40).
            (r#"["sms", "telegram"]"#, Some("sms,telegram")),
            (
                r#"["whatsapp", "telegram", "sms"]"#,
                Some("whatsapp,telegram,sms"),
            ),
            (r#"["sms", "whatsapp"]"#, Some("sms,whatsapp")),
            (r#"["telegram", "telegram"]"#, None),
            (r#"["sms", "telegram", "sms"]"#, None),
            (r#"[]"#, None),
            (r#"["email"]"#, None),
            (r#"["SMS"]"#, None),
            (r#""sms""#, None),
            (r#"[1]"#, None),
        ];
        for (json, want) in rows {
            let v: serde_json::Value = serde_json::from_str(json).expect("json");
            let got = Channels::from_json(&v, KNOWN).ok().map(|c| c.stored());
            assert_eq!(got.as_deref(), *want, "{json}");
            if let Some(stored) = want {
                assert_eq!(
                    Channels::parse_stored(stored, KNOWN)
                        .map(|c| c.stored())
                        .as_deref(),
                    Some(*stored)
                );
            }
        }
        let three = Channels::parse_stored("whatsapp,telegram,sms", KNOWN).expect("channels");
        assert_eq!(three.at(0), Some(WHATSAPP));
        assert_eq!(three.at(2), Some(Channel::SMS));
        assert_eq!(three.at(3), None);
        assert_eq!(three.len(), 3);
        assert!(!three.is_default());
        assert!(Channels::default().is_default());
        assert_eq!(Channels::parse_stored("", KNOWN), None);
        assert_eq!(Channels::parse_stored("sms,sms", KNOWN), None);
        // A channel the registry no longer has does not parse.
        assert_eq!(Channels::parse_stored("whatsapp", &[Channel::SMS]), None);
        let why = Channels::from_json(&serde_json::json!(["email"]), KNOWN).unwrap_err();
        assert!(why.contains(r#""whatsapp""#), "{why}");
    }

    #[test]
    fn each_step_waits_as_said() {
        let every = FallbackAfter::Every(30);
        assert_eq!((every.for_step(0), every.for_step(5)), (30, 30));
        assert_eq!(every.stored_list(), None);
        let each = FallbackAfter::Each(vec![20, 90]);
        assert_eq!((each.for_step(0), each.for_step(1)), (20, 90));
        assert_eq!(each.stored_list().as_deref(), Some("20,90"));
        assert_eq!(FallbackAfter::from_stored(0, Some("20,90")), Some(each));
        assert_eq!(FallbackAfter::from_stored(30, None), Some(every));
        assert_eq!(FallbackAfter::from_stored(0, Some("20,x")), None);
    }
}
