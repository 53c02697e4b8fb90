//! Routes by destination (`SENDONCE_ROUTES`): which providers, in which
//! order, a message to a number takes. Pure: the table is parsed once at
//! start and looked up per message.
//!
//! ```text
//! SENDONCE_ROUTES='+966=infobip,twilio; +1=twilio,http; *=http'
//! ```
//!
//! Entries are separated by `;`, each `prefix=provider,provider,...`. A prefix
//! is `+` and 1 to 15 digits (E.164's country code and as much of the
//! national number as the route needs), or `*`, the default. The longest
//! prefix a number starts with wins; a number no prefix covers, with no
//! default, has no route (the send is refused, nothing stored). Along its
//! route a message fails over exactly as along `SENDONCE_PROVIDER`'s list
//! ([`route`](super::route)).

use std::fmt;

/// One entry: the numbers it covers and their providers, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// `+` and digits, or `*`.
    pub prefix: String,
    /// Never empty, no name twice.
    pub providers: Vec<&'static str>,
}

/// The parsed table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routes {
    /// Longest prefix first, the default (`*`) last, so the first entry a
    /// number starts with is the one it takes.
    entries: Vec<Route>,
}

/// Why `SENDONCE_ROUTES` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutesError(pub String);

impl fmt::Display for RoutesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(reason: impl Into<String>) -> RoutesError {
    RoutesError(reason.into())
}

/// The longest E.164 number: a prefix longer than this covers nothing.
const MAX_DIGITS: usize = 15;

fn valid_prefix(p: &str) -> bool {
    if p == "*" {
        return true;
    }
    let Some(digits) = p.strip_prefix('+') else {
        return false;
    };
    (1..=MAX_DIGITS).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

impl Routes {
    /// Parses the variable's value. `known` turns a provider's name into
    /// the adapter's own (`None`: no such provider).
    pub fn parse(
        value: &str,
        known: impl Fn(&str) -> Option<&'static str>,
    ) -> Result<Self, RoutesError> {
        let mut entries: Vec<Route> = Vec::new();
        for (i, entry) in value.split(';').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let n = i + 1;
            let Some((prefix, list)) = entry.split_once('=') else {
                return Err(err(format!(
                    "entry {n} ({entry:?}) is not prefix=provider,provider"
                )));
            };
            let prefix = prefix.trim();
            if !valid_prefix(prefix) {
                return Err(err(format!(
                    "entry {n}: {prefix:?} is not a prefix: use + and 1 to 15 digits (e.g. +966), or * for the default"
                )));
            }
            if entries.iter().any(|r| r.prefix == prefix) {
                return Err(err(format!("the prefix {prefix} has two routes")));
            }
            let mut providers: Vec<&'static str> = Vec::new();
            for name in list.split(',').map(str::trim) {
                if name.is_empty() {
                    return Err(err(format!("the route {prefix} names an empty provider")));
                }
                let Some(name) = known(name) else {
                    return Err(err(format!(
                        "the route {prefix} names no provider {name:?}"
                    )));
                };
                if providers.contains(&name) {
                    return Err(err(format!("the route {prefix} names {name} twice")));
                }
                providers.push(name);
            }
            entries.push(Route {
                prefix: prefix.to_string(),
                providers,
            });
        }
        if entries.is_empty() {
            return Err(err("names no route"));
        }
        // `*` sorts last: it is the shortest match of all.
        entries
            .sort_by_key(|r| std::cmp::Reverse(if r.prefix == "*" { 0 } else { r.prefix.len() }));
        Ok(Self { entries })
    }

    /// The route a number (E.164, `+` and digits) takes, if any.
    pub fn lookup(&self, number: &str) -> Option<&Route> {
        self.entries
            .iter()
            .find(|r| r.prefix == "*" || number.starts_with(&r.prefix))
    }

    /// Every route, longest prefix first, the default last.
    pub fn entries(&self) -> &[Route] {
        &self.entries
    }

    /// The route with exactly this prefix (a message's stored route).
    pub fn get(&self, prefix: &str) -> Option<&Route> {
        self.entries.iter().find(|r| r.prefix == prefix)
    }

    /// Every provider the table names, each once, in the order they first
    /// appear (longest prefix first): the providers to configure.
    pub fn providers(&self) -> Vec<&'static str> {
        let mut all: Vec<&'static str> = Vec::new();
        for p in self.entries.iter().flat_map(|r| &r.providers) {
            if !all.contains(p) {
                all.push(p);
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(name: &str) -> Option<&'static str> {
        ["twilio", "http", "simulated", "infobip"]
            .into_iter()
            .find(|k| *k == name)
    }

    fn parse(v: &str) -> Result<Routes, RoutesError> {
        Routes::parse(v, known)
    }

    #[test]
    fn the_longest_prefix_wins_and_the_default_takes_the_rest() {
        let r = parse("+966=infobip,twilio; +1=twilio,http; +1415=http; *=simulated").unwrap();
        let table: [(&str, &str, &[&str]); 5] = [
            ("+966501234567", "+966", &["infobip", "twilio"]),
            ("+14155550100", "+1415", &["http"]),
            ("+12125550100", "+1", &["twilio", "http"]),
            ("+447700900123", "*", &["simulated"]),
            // A prefix is digits of the number, not a country: +96 is not +966.
            ("+96171234567", "*", &["simulated"]),
        ];
        for (number, prefix, providers) in table {
            let route = r.lookup(number).unwrap();
            assert_eq!(route.prefix, prefix, "{number}");
            assert_eq!(route.providers, providers, "{number}");
        }
        assert_eq!(r.providers(), ["http", "infobip", "twilio", "simulated"]);
        assert_eq!(r.get("+1").unwrap().providers, ["twilio", "http"]);
        assert!(r.get("+44").is_none());
    }

    #[test]
    fn without_a_default_an_uncovered_number_has_no_route() {
        let r = parse("+966=infobip;").unwrap();
        assert!(r.lookup("+966501234567").is_some());
        assert!(r.lookup("+14155550100").is_none());
    }

    #[test]
    fn malformed_tables_are_refused_with_the_reason() {
        let table = [
            ("", "names no route"),
            (" ; ", "names no route"),
            ("+966", "entry 1 (\"+966\") is not prefix=provider,provider"),
            ("966=twilio", "entry 1: \"966\" is not a prefix"),
            ("+=twilio", "entry 1: \"+\" is not a prefix"),
            ("+9a6=twilio", "entry 1: \"+9a6\" is not a prefix"),
            ("+1234567890123456=twilio", "is not a prefix"),
            ("*=twilio; +1=", "the route +1 names an empty provider"),
            ("+1=twilio,,http", "the route +1 names an empty provider"),
            ("+1=twillio", "the route +1 names no provider \"twillio\""),
            ("+1=twilio,twilio", "the route +1 names twilio twice"),
            ("+1=twilio; +1=http", "the prefix +1 has two routes"),
            ("*=twilio; * = http", "the prefix * has two routes"),
        ];
        for (value, reason) in table {
            let e = parse(value).expect_err(value);
            assert!(e.0.contains(reason), "{value:?}: {e}");
        }
    }

    #[test]
    fn spaces_around_names_and_prefixes_are_allowed() {
        let r = parse("  +44 = twilio , http ;*=simulated ").unwrap();
        assert_eq!(
            r.lookup("+447700900123").unwrap().providers,
            ["twilio", "http"]
        );
    }
}
