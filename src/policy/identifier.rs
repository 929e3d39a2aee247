//! Identifier kinds and their normalisation.
//!
//! Normalising before hashing is what makes `Alice+promo@Example.com` and
//! `alice@example.com` one mailbox, and 2001:db8::1 and 2001:db8::2 one
//! IPv6 /64 (one customer's allocation), so a limit cannot be dodged by
//! rewriting the same identity.

use std::net::{IpAddr, Ipv6Addr};

/// Longest identifier value accepted, in bytes (an email address is at most 254).
pub const MAX_VALUE_LEN: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentifierKind {
    /// Trimmed, lowercased, `+tag` dropped from the local part.
    Email,
    /// Parsed; IPv4-mapped IPv6 folded to IPv4; IPv6 grouped by its /64.
    Ip,
    /// Trimmed.
    Text,
}

impl IdentifierKind {
    /// The canonical form of `raw`, or a sentence saying what is wrong with it.
    pub fn normalise(self, raw: &str) -> Result<String, String> {
        if raw.len() > MAX_VALUE_LEN {
            return Err(format!("is longer than {MAX_VALUE_LEN} bytes"));
        }
        let value = raw.trim();
        if value.is_empty() {
            return Err("is empty".into());
        }
        match self {
            Self::Email => normalise_email(value),
            Self::Ip => normalise_ip(value),
            Self::Text => Ok(value.to_owned()),
        }
    }
}

fn normalise_email(value: &str) -> Result<String, String> {
    let malformed = || Err("is not an email address (expected local@domain)".to_string());
    let Some((local, domain)) = value.rsplit_once('@') else {
        return malformed();
    };
    let local = local.split('+').next().unwrap_or_default();
    let bad_char = |c: char| c.is_whitespace() || c.is_control() || c == '@';
    if local.is_empty() || domain.is_empty() || local.contains(bad_char) || domain.contains(bad_char) {
        return malformed();
    }
    if domain.starts_with('.') || domain.ends_with('.') || domain.contains("..") {
        return malformed();
    }
    Ok(format!("{}@{}", local.to_lowercase(), domain.to_lowercase()))
}

fn normalise_ip(value: &str) -> Result<String, String> {
    let ip: IpAddr = value.parse().map_err(|_| "is not an IPv4 or IPv6 address".to_string())?;
    Ok(match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                format!("{}/64", Ipv6Addr::from(prefix))
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::IdentifierKind::*;

    #[test]
    fn differently_written_addresses_of_one_mailbox_normalise_alike() {
        for raw in
            ["alice@example.com", " Alice@Example.COM ", "alice+news@example.com", "ALICE+a+b@EXAMPLE.com"]
        {
            assert_eq!(Email.normalise(raw).as_deref(), Ok("alice@example.com"), "{raw}");
        }
    }

    #[test]
    fn malformed_email_addresses_are_refused() {
        for raw in [
            "",
            "   ",
            "alice",
            "@example.com",
            "alice@",
            "+tag@example.com",
            "a b@example.com",
            "a@exa mple.com",
            "a@.com",
            "a@b..c",
        ] {
            assert!(Email.normalise(raw).is_err(), "{raw:?} should be refused");
        }
    }

    #[test]
    fn ipv4_mapped_ipv6_folds_to_ipv4() {
        assert_eq!(Ip.normalise("::ffff:203.0.113.7").as_deref(), Ok("203.0.113.7"));
        assert_eq!(Ip.normalise(" 203.0.113.7 ").as_deref(), Ok("203.0.113.7"));
    }

    #[test]
    fn ipv6_addresses_group_by_their_64_bit_prefix() {
        let a = Ip.normalise("2001:db8:1:2:aaaa::1");
        let b = Ip.normalise("2001:DB8:1:2:ffff:ffff:ffff:ffff");
        assert_eq!(a, b);
        assert_eq!(a.as_deref(), Ok("2001:db8:1:2::/64"));
        assert_ne!(a, Ip.normalise("2001:db8:1:3::1"));
    }

    #[test]
    fn invalid_ip_addresses_are_refused() {
        for raw in ["", "1.2.3", "256.1.1.1", "example.com", "1.2.3.4/24", "::g"] {
            assert!(Ip.normalise(raw).is_err(), "{raw:?} should be refused");
        }
    }

    #[test]
    fn text_is_trimmed_and_must_not_be_empty_or_huge() {
        assert_eq!(Text.normalise("  acct_42 ").as_deref(), Ok("acct_42"));
        assert!(Text.normalise(" ").is_err());
        assert!(Text.normalise(&"x".repeat(super::MAX_VALUE_LEN + 1)).is_err());
    }
}
