//! Where webhooks may go: `https` only, and never to an address inside the
//! service's own network (loopback, private, link-local, cloud metadata,
//! unspecified, multicast, reserved, documentation), v4 and v6, v4-mapped
//! v6 included, nor through a v4/v6 translator (NAT64 `64:ff9b::/96` and
//! `64:ff9b:1::/48`, IPv4-translated `::ffff:0:0/96`, v4-compatible `::/96`:
//! a NAT64 gateway would carry them to any v4 address, the metadata one
//! included), and only to port 443 or an unprivileged port that is not a
//! well-known internal service's ([`INTERNAL_PORTS`]).
//! Checked when an endpoint is created (an IP literal, or what the name
//! resolves to then) and again at every delivery, by a DNS resolver that
//! drops forbidden addresses, so a name re-pointed after creation (DNS
//! rebinding) reaches nothing inside. `SENDONCE_WEBHOOK_ALLOW_PRIVATE=true`
//! lifts both rules (tests, local setups).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Longest endpoint URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Unprivileged ports of services that live inside networks and speak (or
/// can be driven by) HTTP, refused as webhook ports: Docker (2375, 2376),
/// etcd (2379, 2380), MySQL (3306), Postgres (5432), CouchDB (5984), Redis
/// (6379), the Kubernetes API (6443), Consul (8500), Elasticsearch (9200,
/// 9300), the kubelet (10250, 10255), memcached (11211), MongoDB (27017).
/// Below 1024 only 443 is allowed.
pub const INTERNAL_PORTS: &[u16] = &[
    2375, 2376, 2379, 2380, 3306, 5432, 5984, 6379, 6443, 8500, 9200, 9300, 10250, 10255, 11211,
    27017,
];

/// Whether a webhook may be sent to `port` (with private targets refused).
pub fn port_allowed(port: u16) -> bool {
    port == 443 || (port >= 1024 && !INTERNAL_PORTS.contains(&port))
}

/// Whether a webhook must never be sent to `ip`.
pub fn forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || a == 0                                   // "this network"
        || ip.is_loopback()                         // 127/8
        || ip.is_private()                          // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local()                       // 169.254/16: metadata services
        || (a == 100 && (64..128).contains(&b))     // 100.64/10 carrier-grade NAT
        || (a == 192 && b == 0 && c == 0)           // 192.0.0/24 protocol assignments
        || (a == 192 && b == 0 && c == 2)           // documentation
        || (a == 192 && b == 88 && c == 99)         // 6to4 relay anycast (deprecated)
        || (a == 198 && (b == 18 || b == 19))       // 198.18/15 benchmarking
        || (a == 198 && b == 51 && c == 100)        // documentation
        || (a == 203 && b == 0 && c == 113)         // documentation
        || ip.is_multicast()                        // 224/4
        || a >= 240 // 240/4 reserved, broadcast
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        // v4-mapped: the v4 address itself.
        let o = ip.octets();
        return forbidden_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if s[0] == 0x2002 {
        // 6to4: the v4 address the tunnel ends at.
        let o = ip.octets();
        return forbidden_v4(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    s[..6] == [0, 0, 0, 0, 0, 0]                       // ::/96 v4-compatible (deprecated), ::, ::1
        || s[..6] == [0, 0, 0, 0, 0xffff, 0]           // ::ffff:0:0/96 IPv4-translated
        || s[..6] == [0x0064, 0xff9b, 0, 0, 0, 0]      // 64:ff9b::/96 NAT64
        || s[..3] == [0x0064, 0xff9b, 0x0001]          // 64:ff9b:1::/48 local NAT64
        || ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00   // fc00::/7 unique local (fd00:ec2::254 metadata)
        || (s[0] & 0xffc0) == 0xfe80   // fe80::/10 link-local
        || (s[0] & 0xffc0) == 0xfec0   // fec0::/10 site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200)  // 2001::/23 protocol assignments, Teredo
        || (s[0] == 0x3fff && s[1] < 0x1000)  // 3fff::/20 documentation
        || s[0] == 0x5f00                     // 5f00::/16 SRv6 segment ids
        || s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0 // discard-only
}

/// Why an endpoint URL is refused (shown to the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("must be an absolute URL")]
    Invalid,
    #[error("must be at most {MAX_URL_LEN} characters")]
    TooLong,
    #[error("must use https")]
    NotHttps,
    /// `http`, which `SENDONCE_WEBHOOK_ALLOW_PRIVATE` allows.
    #[error(
        "must use https (plain http is allowed when the service runs with SENDONCE_WEBHOOK_ALLOW_PRIVATE=true, for local development)"
    )]
    PlainHttp,
    #[error("must not carry a user name or password")]
    Credentials,
    #[error(
        "must not point at a loopback, private, link-local or metadata address ({0}); SENDONCE_WEBHOOK_ALLOW_PRIVATE=true allows it, for local development"
    )]
    Forbidden(IpAddr),
    /// A name that resolves to such an address: the address is not named,
    /// so the answer tells nothing of the internal DNS.
    #[error(
        "must not resolve to a loopback, private, link-local, metadata or translated address; SENDONCE_WEBHOOK_ALLOW_PRIVATE=true allows it, for local development"
    )]
    ResolvesInside,
    #[error(
        "must use port 443 or a port from 1024 up that is not a well-known internal service's (not {0}); SENDONCE_WEBHOOK_ALLOW_PRIVATE=true allows any, for local development"
    )]
    Port(u16),
}

/// The URL's form: absolute, `https` (or `http` when private targets are
/// allowed), a host, no credentials, no fragment; an IP-literal host must be
/// allowed. Does not resolve names (see [`check`]).
pub fn check_form(url: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    if url.len() > MAX_URL_LEN {
        return Err(UrlRefused::TooLong);
    }
    let parsed = Url::parse(url).map_err(|_| UrlRefused::Invalid)?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => return Err(UrlRefused::PlainHttp),
        _ => return Err(UrlRefused::NotHttps),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(UrlRefused::Credentials);
    }
    if parsed.fragment().is_some() {
        return Err(UrlRefused::Invalid);
    }
    if !allow_private
        && let Some(port) = parsed.port_or_known_default()
        && !port_allowed(port)
    {
        return Err(UrlRefused::Port(port));
    }
    match literal_ip(&parsed) {
        None if parsed.host_str().is_none_or(str::is_empty) => Err(UrlRefused::Invalid),
        Some(ip) if !allow_private && forbidden(ip) => Err(UrlRefused::Forbidden(ip)),
        _ => Ok(parsed),
    }
}

/// The host of `url` when it is an IP literal.
pub fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// [`check_form`], then, for a name, what it resolves to now: any forbidden
/// address refuses it. A name that does not resolve (yet) is accepted; the
/// delivery-time resolver checks again.
pub async fn check(url: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    let parsed = check_form(url, allow_private)?;
    if allow_private || literal_ip(&parsed).is_some() {
        return Ok(parsed);
    }
    if let Some(host) = parsed.host_str() {
        let port = parsed.port_or_known_default().unwrap_or(443);
        let lookup = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::net::lookup_host((host, port)),
        )
        .await;
        if let Ok(Ok(addrs)) = lookup {
            for addr in addrs {
                if forbidden(addr.ip()) {
                    return Err(UrlRefused::ResolvesInside);
                }
            }
        }
    }
    Ok(parsed)
}

/// The delivery client's resolver: resolves with the system resolver and
/// keeps only allowed addresses, so the connection goes to an address that
/// was checked (no second lookup an attacker could answer differently).
#[derive(Debug, Default)]
pub struct FilteringResolver;

impl Resolve for FilteringResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| !forbidden(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(
                    format!("{host} resolves to no address webhooks may be sent to").into(),
                );
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_addresses() {
        let table: &[(&str, bool)] = &[
            ("0.0.0.0", true),
            ("0.1.2.3", true),
            ("127.0.0.1", true),
            ("127.9.9.9", true),
            ("10.0.0.1", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("172.32.0.1", false),
            ("192.168.1.1", true),
            ("169.254.169.254", true),
            ("100.64.0.1", true),
            ("100.128.0.1", false),
            ("224.0.0.1", true),
            ("255.255.255.255", true),
            ("8.8.8.8", false),
            ("93.184.216.34", false),
            ("::", true),
            ("::1", true),
            ("fe80::1", true),
            ("fc00::1", true),
            ("fd00:ec2::254", true),
            ("ff02::1", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.1.2.3", true),
            ("::ffff:169.254.169.254", true),
            ("::ffff:8.8.8.8", false),
            ("64:ff9b::a9fe:a9fe", true),
            ("64:ff9b::808:808", true),
            ("64:ff9b:1::a9fe:a9fe", true),
            ("64:ff9b:1:ffff::1", true),
            ("64:ff9b:2::1", false),
            ("::ffff:0:a9fe:a9fe", true),
            ("::ffff:0:808:808", true),
            ("::808:808", true),
            ("::a9fe:a9fe", true),
            ("2002:7f00:1::", true),
            ("2002:808:808::", false),
            ("2001:db8::1", true),
            ("2001::1", true),
            ("2001:2::1", true),
            ("2001:1ff::1", true),
            ("2001:200::1", false),
            ("3fff::1", true),
            ("3fff:fff::1", true),
            ("3fff:1000::1", false),
            ("5f00::1", true),
            ("100::1", true),
            ("192.88.99.1", true),
            ("2606:4700:4700::1111", false),
        ];
        for (ip, expected) in table {
            let parsed: IpAddr = ip.parse().expect(ip);
            assert_eq!(forbidden(parsed), *expected, "{ip}");
        }
    }

    #[test]
    fn url_forms() {
        let table: &[(&str, bool, Result<(), UrlRefused>)] = &[
            ("https://example.com/hook", false, Ok(())),
            ("http://example.com/hook", false, Err(UrlRefused::PlainHttp)),
            ("http://example.com/hook", true, Ok(())),
            ("ftp://example.com/", true, Err(UrlRefused::NotHttps)),
            (
                "https://u:p@example.com/",
                false,
                Err(UrlRefused::Credentials),
            ),
            ("example.com/hook", false, Err(UrlRefused::Invalid)),
            ("https://example.com/#x", false, Err(UrlRefused::Invalid)),
            (
                "https://127.0.0.1/",
                false,
                Err(UrlRefused::Forbidden("127.0.0.1".parse().unwrap())),
            ),
            (
                "https://[::ffff:169.254.169.254]/",
                false,
                Err(UrlRefused::Forbidden(
                    "::ffff:169.254.169.254".parse().unwrap(),
                )),
            ),
            (
                "https://2130706433/",
                false,
                Err(UrlRefused::Forbidden("127.0.0.1".parse().unwrap())),
            ),
            ("http://127.0.0.1:8080/", true, Ok(())),
            ("https://8.8.8.8/", false, Ok(())),
            (
                "https://[64:ff9b:1::a9fe:a9fe]/",
                false,
                Err(UrlRefused::Forbidden(
                    "64:ff9b:1::a9fe:a9fe".parse().unwrap(),
                )),
            ),
            ("https://example.com:443/", false, Ok(())),
            ("https://example.com:8443/", false, Ok(())),
            ("https://example.com:1024/", false, Ok(())),
            ("https://example.com:22/", false, Err(UrlRefused::Port(22))),
            ("https://example.com:80/", false, Err(UrlRefused::Port(80))),
            (
                "https://example.com:1023/",
                false,
                Err(UrlRefused::Port(1023)),
            ),
            (
                "https://example.com:6379/",
                false,
                Err(UrlRefused::Port(6379)),
            ),
            (
                "https://example.com:6443/",
                false,
                Err(UrlRefused::Port(6443)),
            ),
            (
                "https://example.com:10250/",
                false,
                Err(UrlRefused::Port(10250)),
            ),
            ("http://127.0.0.1:6379/", true, Ok(())),
        ];
        for (url, allow, expected) in table {
            assert_eq!(
                check_form(url, *allow).map(|_| ()),
                *expected,
                "{url} allow_private={allow}"
            );
        }
    }

    /// Issue 42: what a local setup meets first (an http or loopback URL)
    /// names the setting that allows it; what no setting allows does not.
    #[tokio::test]
    async fn refusals_name_the_setting_that_allows_them() {
        const SETTING: &str = "SENDONCE_WEBHOOK_ALLOW_PRIVATE";
        for url in [
            "http://127.0.0.1:8080/hook",
            "http://example.com/hook",
            "https://127.0.0.1:8443/hook",
            "https://10.0.0.1/hook",
            "https://example.com:80/hook",
            "https://localhost/hook",
        ] {
            let said = check(url, false).await.expect_err(url).to_string();
            assert!(said.contains(SETTING), "{url}: {said}");
        }
        for url in ["ftp://example.com/", "https://u:p@example.com/", "nope"] {
            let said = check(url, false).await.expect_err(url).to_string();
            assert!(!said.contains(SETTING), "{url}: {said}");
        }
    }

    #[tokio::test]
    async fn names_that_resolve_inside_are_refused() {
        let refused = check("https://localhost/hook", false).await;
        assert_eq!(refused, Err(UrlRefused::ResolvesInside));
        let said = refused.unwrap_err().to_string();
        for address in ["127.0.0.1", "::1"] {
            assert!(!said.contains(address), "{said} names {address}");
        }
        assert!(check("http://localhost:9/hook", true).await.is_ok());
        let resolved = FilteringResolver
            .resolve("localhost".parse().expect("name"))
            .await;
        assert!(
            resolved.is_err(),
            "localhost must resolve to nothing allowed"
        );
    }
}
