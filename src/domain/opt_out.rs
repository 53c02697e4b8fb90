//! Opt-out keywords: what an inbound message asks for by its first word.
//! Carriers' and providers' words ("STOP", "UNSUBSCRIBE", ...), read the
//! same on every channel that takes inbound text (the `/inbound` route, a
//! Telegram chat's message).

/// Keywords carriers and providers treat as "stop messaging me".
const STOP_WORDS: &[&str] = &[
    "STOP",
    "STOPALL",
    "UNSUBSCRIBE",
    "END",
    "QUIT",
    "CANCEL",
    "REVOKE",
    "OPTOUT",
];
/// Keywords that opt back in.
const START_WORDS: &[&str] = &["START", "UNSTOP", "YES"];

/// What an inbound message asks for, by its first word.
pub fn keyword(body: &str) -> Option<bool> {
    let word: String = body
        .trim()
        .split(|c: char| c.is_whitespace() || matches!(c, '.' | '!' | ','))
        .next()
        .unwrap_or("")
        .to_uppercase();
    if STOP_WORDS.contains(&word.as_str()) {
        Some(true)
    } else if START_WORDS.contains(&word.as_str()) {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::keyword;

    #[test]
    fn keywords() {
        for stop in [
            "STOP",
            "stop",
            " Stop ",
            "STOPALL",
            "unsubscribe",
            "End.",
            "quit!",
            "CANCEL",
            "revoke",
            "OPTOUT",
            "stop please",
        ] {
            assert_eq!(keyword(stop), Some(true), "{stop}");
        }
        for start in ["START", "unstop", "Yes"] {
            assert_eq!(keyword(start), Some(false), "{start}");
        }
        for other in ["", "hello", "don't stop", "STOPPED", "thanks"] {
            assert_eq!(keyword(other), None, "{other}");
        }
    }
}
