//! The SSRF guard (admin spec §3.6, `WebhookSecurityConfig`): which URLs a subscription may
//! name, and which addresses a delivery may connect to.
//!
//! A URL is checked when it is stored (create, update) and again on every delivery, and the
//! blocked ranges are checked on the addresses the name resolves to *at connect time*: the
//! outbound client resolves through [`GuardedResolver`], which never hands it a blocked
//! address, so a name that resolved to a public address when the subscription was stored
//! and to a private one later (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use ipnet::IpNet;
use ledger::WebhookSecurity;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// The security configuration in force, shared by the URL checks and the resolver.
#[derive(Clone, Default)]
pub struct Policy(Arc<RwLock<WebhookSecurity>>);

impl Policy {
    pub fn set(&self, config: WebhookSecurity) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = config;
    }

    pub fn get(&self) -> WebhookSecurity {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Whether `ip` lies in one of `ranges` (an IPv4-mapped IPv6 address counts as its IPv4).
/// An unspecified address (`0.0.0.0`, `::`) counts as loopback: a connection to it reaches
/// this host, so it is refused wherever loopback is.
pub fn blocked(ip: IpAddr, ranges: &[String]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let ip = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    ranges
        .iter()
        .filter_map(|r| r.parse::<IpNet>().ok())
        .any(|net| net.contains(&ip))
}

/// Checks `url` against `config` in the reference's order: it parses, is https (or http
/// when allowed), has a host, resolves only to addresses outside the blocked ranges, and
/// matches an allowed pattern when there are any. The error is the reason, for
/// `Webhook URL invalid: <url> (<reason>)`.
pub async fn check_url(url: &str, config: &WebhookSecurity) -> Result<Url, String> {
    let parsed = Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if config.allow_http => {}
        "http" => {
            return Err(
                "HTTPS is required: allow_http is off in /v1/admin/config/webhook-security".into(),
            )
        }
        other => return Err(format!("scheme {other} is not http or https")),
    }
    let host = parsed.host_str().ok_or("no host")?.to_string();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addresses: Vec<IpAddr> = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .map(|a| a.ip())
            .collect(),
    };
    if addresses.is_empty() {
        return Err(format!("{host} resolves to no address"));
    }
    if let Some(ip) = addresses
        .iter()
        .find(|ip| blocked(**ip, &config.blocked_cidr_ranges))
    {
        return Err(format!("{host} resolves to {ip}, in a blocked range"));
    }
    if !config.allowed_url_patterns.is_empty()
        && !config
            .allowed_url_patterns
            .iter()
            .any(|p| matches_pattern(p, &parsed))
    {
        return Err("matches none of allowed_url_patterns".into());
    }
    Ok(parsed)
}

/// Whether `url` matches the glob `pattern` (`https://*.example.com/*`), part by part: the
/// scheme, then the host with its port, where a `*` cannot reach past the host, then the
/// path with the query, where it spans segments. Matched as one string, a `*` in the host
/// would let `http://127.0.0.1/x.example.com/` pass for `http://*.example.com/*`.
fn matches_pattern(pattern: &str, url: &Url) -> bool {
    let Some((scheme, rest)) = pattern.split_once("://") else {
        return false;
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return false,
    };
    let target_path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let glob = |pattern: &str, text: &str| {
        glob::Pattern::new(&pattern.to_ascii_lowercase())
            .is_ok_and(|p| p.matches(&text.to_ascii_lowercase()))
    };
    glob(scheme, url.scheme())
        && glob(authority, &host)
        && glob(if path.is_empty() { "/" } else { path }, &target_path)
}

/// The outbound client's resolver: the system's, with every blocked address removed.
pub struct GuardedResolver {
    pub policy: Policy,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let ranges = policy.get().blocked_cidr_ranges;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| !blocked(a.ip(), &ranges))
                .collect();
            if allowed.is_empty() {
                return Err(format!("{host} resolves only to blocked addresses").into());
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WebhookSecurity {
        WebhookSecurity::default()
    }

    #[test]
    fn the_default_ranges_block_private_and_loopback() {
        let ranges = config().blocked_cidr_ranges;
        for ip in [
            "10.1.2.3",
            "127.0.0.1",
            "192.168.0.1",
            "169.254.169.254",
            "::1",
            "fd00::1",
        ] {
            assert!(blocked(ip.parse().unwrap(), &ranges), "{ip}");
        }
        assert!(
            blocked("::ffff:127.0.0.1".parse().unwrap(), &ranges),
            "mapped IPv4"
        );
        assert!(!blocked("93.184.216.34".parse().unwrap(), &ranges));
        for unspecified in ["0.0.0.0", "::", "::ffff:0.0.0.0"] {
            assert!(
                blocked(unspecified.parse().unwrap(), &ranges),
                "{unspecified}"
            );
        }
        assert!(
            !blocked("0.0.0.0".parse().unwrap(), &[]),
            "loopback allowed"
        );
    }

    #[test]
    fn a_pattern_matches_scheme_host_and_path_apart() {
        let m = |pattern: &str, url: &str| matches_pattern(pattern, &Url::parse(url).unwrap());
        let hooks = "https://*.example.com/*";
        assert!(m(hooks, "https://hooks.example.com/a/b?c=d"));
        assert!(m(hooks, "https://HOOKS.Example.com/x"));
        assert!(!m(hooks, "https://127.0.0.1/hooks.example.com/x"));
        assert!(!m(hooks, "https://a.example.com@evil.test/x"));
        assert!(!m(hooks, "https://evil.test/#.example.com/x"));
        assert!(!m(hooks, "https://a.example.com:8443/x"), "a port is named");
        assert!(!m(hooks, "http://a.example.com/x"));
        assert!(m(
            "https://*.example.com:*/*",
            "https://a.example.com:8443/x"
        ));
        assert!(m("https://hooks.example.com", "https://hooks.example.com/"));
        assert!(!m(
            "https://hooks.example.com",
            "https://hooks.example.com/x"
        ));
        assert!(!m("hooks.example.com/*", "https://hooks.example.com/x"));
    }

    #[tokio::test]
    async fn urls_are_checked_in_order() {
        let c = config();
        assert!(check_url("ftp://example.com/", &c)
            .await
            .unwrap_err()
            .contains("scheme"));
        assert!(check_url("http://93.184.216.34/", &c)
            .await
            .unwrap_err()
            .contains("HTTPS"));
        assert!(check_url("https://127.0.0.1/hook", &c)
            .await
            .unwrap_err()
            .contains("blocked"));
        assert!(check_url("https://[::1]:8443/", &c)
            .await
            .unwrap_err()
            .contains("blocked"));
        let open = WebhookSecurity {
            blocked_cidr_ranges: Vec::new(),
            allowed_url_patterns: vec!["https://*.example.com/*".into()],
            allow_http: true,
        };
        assert!(check_url("https://127.0.0.1/x", &open)
            .await
            .unwrap_err()
            .contains("allowed"));
        assert!(
            check_url("https://127.0.0.1:9000/bypass.example.com/x", &open)
                .await
                .unwrap_err()
                .contains("allowed")
        );
        assert!(check_url("https://0.0.0.0:9000/", &c)
            .await
            .unwrap_err()
            .contains("blocked"));
        assert!(check_url("https://[::]:8443/", &c)
            .await
            .unwrap_err()
            .contains("blocked"));
        let loopback = WebhookSecurity {
            allowed_url_patterns: vec!["http://127.0.0.1:*/*".into()],
            ..open
        };
        assert!(check_url("http://127.0.0.1:9000/hook", &loopback)
            .await
            .is_ok());
    }
}
