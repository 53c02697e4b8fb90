//! What an API key may do (issue 27): its scopes, and the one table that
//! says which scope each authenticated route needs.
//!
//! `send` (messages, batches, verifications, cancel), `read` (GETs of
//! messages, verifications, events, opt-out lists; the console), `opt-outs`
//! (add/remove), `webhooks` (endpoints), `admin` (the operator's admin API,
//! across tenants). A route that authenticates but is missing from
//! [`ROUTES`] is refused to every key (fail closed): a new route cannot be
//! used, nor pass its own tests, before it is given a scope here, and a test
//! compares this table with openapi.yaml's operations.

use std::fmt;

use axum::http::Method;

/// One thing a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Send,
    Read,
    OptOuts,
    Webhooks,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Send,
        Scope::Read,
        Scope::OptOuts,
        Scope::Webhooks,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Send => "send",
            Scope::Read => "read",
            Scope::OptOuts => "opt-outs",
            Scope::Webhooks => "webhooks",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|c| c.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// What every key issued before scopes existed keeps, and what a key
    /// gets when none are named: everything but `admin`.
    pub const DEFAULT: Scopes = Scopes(0b0_1111);
    /// The bootstrap key's.
    pub const ALL: Scopes = Scopes(0b1_1111);

    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |acc, s| acc | s.bit()))
    }

    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// The stored form: names joined by commas.
    pub fn to_stored(self) -> String {
        self.iter().map(Scope::as_str).collect::<Vec<_>>().join(",")
    }

    /// Reads the stored form; unknown names are dropped (a newer version's
    /// scope means nothing here).
    pub fn from_stored(s: &str) -> Scopes {
        Scopes::of(
            &s.split(',')
                .filter_map(|n| Scope::parse(n.trim()))
                .collect::<Vec<_>>(),
        )
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scopes({})", self.to_stored())
    }
}

/// Every route that takes an API key, with the scope it needs: (method,
/// path as routed, scope).
pub const ROUTES: &[(&str, &str, Scope)] = &[
    ("POST", "/messages", Scope::Send),
    ("GET", "/messages/{key}", Scope::Read),
    ("GET", "/messages/{key}/attempts", Scope::Read),
    ("GET", "/messages/{key}/events", Scope::Read),
    ("POST", "/messages/{key}/cancel", Scope::Send),
    ("POST", "/messages/batch", Scope::Send),
    ("GET", "/messages/batch", Scope::Read),
    ("POST", "/verifications", Scope::Send),
    ("GET", "/verifications/{id}", Scope::Read),
    ("POST", "/verifications/{id}/check", Scope::Send),
    ("POST", "/verifications/{id}/resend", Scope::Send),
    ("POST", "/verifications/{id}/cancel", Scope::Send),
    ("GET", "/opt-outs", Scope::Read),
    ("POST", "/opt-outs", Scope::OptOuts),
    ("DELETE", "/opt-outs/{number}", Scope::OptOuts),
    ("POST", "/inbound", Scope::OptOuts),
    ("GET", "/events", Scope::Read),
    ("GET", "/webhook-endpoints", Scope::Webhooks),
    ("POST", "/webhook-endpoints", Scope::Webhooks),
    ("GET", "/webhook-endpoints/{id}", Scope::Webhooks),
    ("DELETE", "/webhook-endpoints/{id}", Scope::Webhooks),
    (
        "POST",
        "/webhook-endpoints/{id}/rotate-secret",
        Scope::Webhooks,
    ),
    ("GET", "/webhook-endpoints/{id}/attempts", Scope::Webhooks),
    ("POST", "/admin/tenants", Scope::Admin),
    ("GET", "/admin/tenants", Scope::Admin),
    ("GET", "/admin/tenants/{name}", Scope::Admin),
    ("PATCH", "/admin/tenants/{name}", Scope::Admin),
    ("POST", "/admin/tenants/{name}/keys", Scope::Admin),
    ("GET", "/admin/tenants/{name}/keys", Scope::Admin),
    ("DELETE", "/admin/keys/{id}", Scope::Admin),
    ("GET", "/admin/audit", Scope::Admin),
    ("GET", "/routes", Scope::Admin),
    ("PUT", "/routes/{prefix}/pin", Scope::Admin),
    ("DELETE", "/routes/{prefix}/pin", Scope::Admin),
];

/// The scope a request to `path` (the matched route) with `method` needs;
/// `None`: the route is not in [`ROUTES`] (refused to every key). `HEAD`
/// is a `GET`.
pub fn required(method: &Method, path: &str) -> Option<Scope> {
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    ROUTES
        .iter()
        .find(|(m, p, _)| *m == method && *p == path)
        .map(|(_, _, s)| *s)
}

/// Whether a key with `held` may grant `wanted` to a new key: only an
/// `admin` key grants `admin`.
pub fn may_grant(held: Scopes, wanted: Scopes) -> bool {
    !wanted.contains(Scope::Admin) || held.contains(Scope::Admin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_form_round_trips() {
        assert_eq!(Scopes::DEFAULT.to_stored(), "send,read,opt-outs,webhooks");
        assert_eq!(Scopes::ALL.to_stored(), "send,read,opt-outs,webhooks,admin");
        for s in Scope::ALL {
            let one = Scopes::of(&[s]);
            assert_eq!(Scopes::from_stored(&one.to_stored()), one);
            assert!(Scopes::ALL.contains(s));
            assert_eq!(Scopes::DEFAULT.contains(s), s != Scope::Admin);
        }
        assert_eq!(
            Scopes::from_stored("read, future,send"),
            Scopes::of(&[Scope::Read, Scope::Send])
        );
        assert!(Scopes::from_stored("").is_empty());
    }

    #[test]
    fn only_admin_grants_admin() {
        let admin = Scopes::of(&[Scope::Admin]);
        let send = Scopes::of(&[Scope::Send]);
        assert!(may_grant(admin, Scopes::ALL));
        assert!(may_grant(send, Scopes::DEFAULT));
        assert!(!may_grant(Scopes::DEFAULT, admin));
    }

    #[test]
    fn routes_are_looked_up_by_method_and_template() {
        assert_eq!(required(&Method::POST, "/messages"), Some(Scope::Send));
        assert_eq!(
            required(&Method::HEAD, "/messages/{key}"),
            Some(Scope::Read)
        );
        assert_eq!(required(&Method::GET, "/messages"), None);
        assert_eq!(required(&Method::GET, "/nowhere"), None);
    }

    /// The operations openapi.yaml describes as taking a key: (method, path).
    fn documented() -> Vec<(String, String)> {
        let spec = include_str!("../openapi.yaml");
        let mut ops = Vec::new();
        let mut path: Option<String> = None;
        let mut op: Option<(String, String)> = None;
        let mut public = false;
        let mut in_paths = false;
        let mut flush = |op: &mut Option<(String, String)>, public: bool| {
            if let Some(o) = op.take()
                && !public
            {
                ops.push(o);
            }
        };
        for line in spec.lines() {
            if line == "paths:" {
                in_paths = true;
                continue;
            }
            if !in_paths {
                continue;
            }
            if !line.starts_with(' ') && !line.is_empty() {
                flush(&mut op, public);
                break;
            }
            if let Some(p) = line.strip_prefix("  /") {
                flush(&mut op, public);
                path = Some(format!("/{}", p.trim_end_matches(':')));
                continue;
            }
            let trimmed = line.trim_end();
            for m in ["get", "post", "put", "patch", "delete"] {
                if trimmed == format!("    {m}:") {
                    flush(&mut op, public);
                    public = false;
                    op = path.clone().map(|p| (m.to_ascii_uppercase(), p));
                }
            }
            // An operation's own `security` replaces the key with
            // something else (a provider's signature, or nothing), unless it
            // names the key.
            if trimmed == "      security: []" || trimmed == "      security:" {
                public = true;
            }
            if trimmed == "        - apiKey: []" {
                public = false;
            }
        }
        ops
    }

    #[test]
    fn every_documented_operation_with_a_key_has_a_scope_and_no_other() {
        let mut documented = documented();
        documented.sort();
        let mut table: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        table.sort();
        assert_eq!(table, documented);
    }
}
