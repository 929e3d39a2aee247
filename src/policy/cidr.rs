//! IP networks written as CIDRs, parsed by hand with `std::net` (no new
//! dependency), and matched against normalised `ip` identifier values.
//!
//! A normalised IPv4 value is the address itself (`203.0.113.7`, IPv4-mapped
//! IPv6 folded to it); a normalised IPv6 value is its /64 group written as
//! `2001:db8:1:2::/64`. Every address of a /64 shares its top 64 bits, so a
//! network of prefix 64 or less contains either the whole group or none of
//! it, which is why longer IPv6 prefixes are refused: they cannot be decided.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest IPv6 prefix a pattern may use: values are grouped by /64.
pub const MAX_V6_PREFIX: u8 = 64;

/// An IP network: its address (host bits all zero) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cidr {
    V4 {
        network: Ipv4Addr,
        prefix: u8,
    },
    /// `prefix` is at most [`MAX_V6_PREFIX`].
    V6 {
        network: Ipv6Addr,
        prefix: u8,
    },
}

impl Cidr {
    /// Parses `a.b.c.d/n` (n ≤ 32) or `v6::/n` (n ≤ 64). Host bits must be
    /// zero: `10.1.2.3/8` is refused rather than guessed at, since it may be
    /// a typo for `/32` as easily as for `10.0.0.0/8`. The error does not
    /// quote `text`, nor an address made from it: it is logged.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) =
            text.split_once('/').ok_or("not a CIDR: expected address/prefix, e.g. 10.0.0.0/8")?;
        let address: IpAddr =
            address.parse().map_err(|_| "not a CIDR: the part before '/' is not an IPv4 or IPv6 address")?;
        let prefix = parse_prefix(prefix).ok_or("not a CIDR: the prefix after '/' must be a whole number")?;
        match address {
            IpAddr::V4(network) => Self::v4(network, prefix),
            IpAddr::V6(network) => Self::v6(network, prefix),
        }
    }

    fn v4(network: Ipv4Addr, prefix: u16) -> Result<Self, String> {
        if prefix > 32 {
            return Err("not a CIDR: an IPv4 prefix is at most 32".into());
        }
        let prefix = prefix as u8;
        if u32::from(network) & !mask32(prefix) != 0 {
            return Err(host_bits(prefix));
        }
        Ok(Self::V4 { network, prefix })
    }

    fn v6(network: Ipv6Addr, prefix: u16) -> Result<Self, String> {
        if prefix > 128 {
            return Err("not a CIDR: an IPv6 prefix is at most 128".into());
        }
        let prefix = prefix as u8;
        if prefix > MAX_V6_PREFIX {
            return Err("the CIDR is longer than /64: IPv6 values are grouped by their /64 before \
                        matching, so a longer prefix cannot be decided; use /64 or less"
                .into());
        }
        if u128::from(network) & !mask128(prefix) != 0 {
            return Err(host_bits(prefix));
        }
        Ok(Self::V6 { network, prefix })
    }

    /// Whether the normalised `ip` value `value` lies in this network. An
    /// IPv4 network never matches an IPv6 group, nor the reverse.
    pub fn contains(&self, value: &str) -> bool {
        match *self {
            Self::V4 { network, prefix } => {
                value.parse::<Ipv4Addr>().is_ok_and(|ip| u32::from(ip) & mask32(prefix) == u32::from(network))
            }
            Self::V6 { network, prefix } => value
                .strip_suffix("/64")
                .and_then(|group| group.parse::<Ipv6Addr>().ok())
                .is_some_and(|ip| u128::from(ip) & mask128(prefix) == u128::from(network)),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4 { network, prefix } => write!(f, "{network}/{prefix}"),
            Self::V6 { network, prefix } => write!(f, "{network}/{prefix}"),
        }
    }
}

fn host_bits(prefix: u8) -> String {
    let example = "10.0.0.0/8, not 10.1.2.3/8";
    format!("the CIDR has bits set after its /{prefix}: write the network's first address ({example})")
}

/// Digits only, since `u16::from_str` would also take a leading `+`.
fn parse_prefix(text: &str) -> Option<u16> {
    let digits = !text.is_empty() && text.len() <= 3 && text.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| text.parse().ok()).flatten()
}

/// The top `prefix` bits set; `checked_shl` because a shift by 32 overflows.
fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}
