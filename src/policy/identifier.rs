//! Identifier kinds and their normalisation.
//!
//! Normalising before hashing is what makes `Alice+promo@Example.com` and
//! `alice@example.com` one mailbox, and 2001:db8::1 and 2001:db8::2 one
//! IPv6 /64 (one customer's allocation), so a limit cannot be dodged by
//! rewriting the same identity. Emails (and `text_folded`) are folded the
//! way a case- and accent-insensitive account lookup compares them (MySQL's
//! default collation, for one), so that every spelling such a lookup takes
//! for one account counts in that account's bucket.

use std::net::{IpAddr, Ipv6Addr};

use icu_casemap::CaseMapper;
use icu_normalizer::{ComposingNormalizerBorrowed, DecomposingNormalizerBorrowed};
use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory};
use icu_properties::{CodePointMapData, CodePointSetData};
use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

/// Longest identifier value accepted, in bytes (an email address is at most 254).
pub const MAX_VALUE_LEN: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentifierKind {
    /// Trimmed and [folded](fold); `+tag` dropped from the local part; the
    /// domain in ASCII (IDNA), punycode or not.
    Email,
    /// Parsed; IPv4-mapped IPv6 folded to IPv4; IPv6 grouped by its /64.
    Ip,
    /// Trimmed.
    Text,
    /// Trimmed and [folded](fold), for names that an application looks up
    /// case- and accent-insensitively (user names, say).
    TextFolded,
}

impl IdentifierKind {
    /// As a policy file writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Email => "email",
            Self::Ip => "ip",
            Self::Text => "text",
            Self::TextFolded => "text_folded",
        }
    }

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
            Self::TextFolded => Some(fold(value).trim().to_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| "is empty once invisible characters are removed".to_string()),
        }
    }
}

/// Unicode's compatibility caseless form (the Standard's section 3.13, D146:
/// NFKD(fold(NFKD(fold(NFD(x))))) with full case folding, so that `ß`, `ẞ`
/// and `ss` agree), less what an accent-insensitive comparison ignores:
/// default-ignorable code points (zero-width spaces, soft hyphens, joiners)
/// and non-spacing and enclosing marks (accents, İ's dot); then NFKC.
/// Dropping every non-spacing mark merges some words of scripts that write
/// vowels with them, which makes a limit stricter, never looser.
fn fold(text: &str) -> String {
    if text.is_ascii() {
        return text.to_ascii_lowercase(); // the same result, without the tables
    }
    let (nfd, nfkd) = (DecomposingNormalizerBorrowed::new_nfd(), DecomposingNormalizerBorrowed::new_nfkd());
    let case = CaseMapper::new();
    let once = nfkd.normalize(&case.fold_string(&nfd.normalize(text))).into_owned();
    let caseless = nfkd.normalize(&case.fold_string(&once)).into_owned();
    let ignorable = CodePointSetData::new::<DefaultIgnorableCodePoint>();
    let category = CodePointMapData::<GeneralCategory>::new();
    let is_mark =
        |c| matches!(category.get(c), GeneralCategory::NonspacingMark | GeneralCategory::EnclosingMark);
    let kept: String = caseless.chars().filter(|&c| !ignorable.contains(c) && !is_mark(c)).collect();
    ComposingNormalizerBorrowed::new_nfkc().normalize(&kept).into_owned()
}

fn normalise_email(value: &str) -> Result<String, String> {
    let malformed = || "is not an email address (expected local@domain)".to_string();
    // Folded whole, so that a fullwidth `＠` or `＋` acts as `@` or `+`.
    let folded = fold(value);
    let (local, domain) = folded.rsplit_once('@').ok_or_else(malformed)?;
    let local = local.split('+').next().unwrap_or_default();
    let domain = ascii_domain(domain).ok_or_else(malformed)?;
    let bad_char = |c: char| c.is_whitespace() || c.is_control() || c == '@';
    if local.is_empty() || domain.is_empty() || local.contains(bad_char) || domain.contains(bad_char) {
        return Err(malformed());
    }
    if domain.starts_with('.') || domain.ends_with('.') || domain.contains("..") {
        return Err(malformed());
    }
    Ok(format!("{local}@{domain}"))
}

/// The domain in ASCII, punycode decoded and folded first so that
/// `xn--exmple-cua.com` and `exämple.com` are folded alike; `None` if IDNA
/// (UTS #46, nontransitional) refuses a Unicode domain. An ASCII one it
/// refuses (`xn--zz-.com`, not valid punycode) stays as it is: it spells
/// no other domain, and every ASCII domain has always been accepted.
fn ascii_domain(domain: &str) -> Option<String> {
    if domain.is_ascii() && !domain.split('.').any(|label| label.starts_with("xn--")) {
        return Some(domain.to_owned()); // what UTS #46 makes of it, without its tables
    }
    let uts46 = Uts46::new();
    let (unicode, valid) = uts46.to_unicode(domain.as_bytes(), AsciiDenyList::EMPTY, Hyphens::Allow);
    if valid.is_err() {
        return domain.is_ascii().then(|| domain.to_owned());
    }
    let folded = fold(&unicode);
    let ascii = uts46.to_ascii(folded.as_bytes(), AsciiDenyList::EMPTY, Hyphens::Allow, DnsLength::Ignore);
    ascii.ok().map(|a| a.into_owned())
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

    /// The spellings of finding 5 of issue 26: each made a bucket of its own.
    #[test]
    fn spellings_an_insensitive_lookup_takes_for_one_account_normalise_alike() {
        for raw in [
            "victor@example.com",
            "vic\u{200B}tor@example.com", // zero-width space
            "\u{FF56}ictor@example.com",  // fullwidth v
            "vic\u{00AD}tor@example.com", // soft hyphen
            "victor@EXAMPLE.COM",
            "v\u{00EF}ctor@example.com",                 // ï, precomposed
            "vi\u{0308}ctor@example.com",                // i and a combining diaeresis
            "\u{FF36}ICTOR\u{FF0B}x\u{FF20}example.com", // fullwidth V, + and @
            "victor@ex\u{00E4}mple.com",                 // an accented domain
            "victor@xn--exmple-cua.com",                 // the same domain in punycode
        ] {
            assert_eq!(Email.normalise(raw).as_deref(), Ok("victor@example.com"), "{raw:?}");
        }
    }

    #[test]
    fn dotted_capital_i_and_sharp_s_fold_as_a_case_insensitive_collation_does() {
        assert_eq!(Email.normalise("\u{0130}REM@example.com").as_deref(), Ok("irem@example.com"));
        for raw in ["strasse@example.com", "Stra\u{00DF}e@example.com", "STRA\u{1E9E}E@example.com"] {
            assert_eq!(Email.normalise(raw).as_deref(), Ok("strasse@example.com"), "{raw:?}");
        }
    }

    #[test]
    fn a_unicode_domain_and_its_punycode_normalise_to_the_same_ascii() {
        let unicode = Email.normalise("a@\u{4F8B}\u{5B50}.\u{4E2D}\u{56FD}");
        assert_eq!(unicode.as_deref(), Ok("a@xn--fsqu00a.xn--fiqs8s"));
        assert_eq!(Email.normalise("A@XN--FSQU00A.xn--fiqs8s"), unicode);
        assert_eq!(
            Email.normalise("a@\u{4F8B}\u{5B50}\u{3002}\u{4E2D}\u{56FD}"),
            unicode,
            "ideographic full stop"
        );
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
            "\u{200B}@example.com",
            "alice@\u{00AD}",
            "alice@\u{FF0E}com",
        ] {
            assert!(Email.normalise(raw).is_err(), "{raw:?} should be refused");
        }
    }

    #[test]
    fn an_ascii_domain_that_is_not_valid_punycode_is_kept_as_it_is() {
        assert_eq!(Email.normalise("alice@XN--zz-.com").as_deref(), Ok("alice@xn--zz-.com"));
        assert_eq!(Email.normalise("a@xN--a0-0-.AA").as_deref(), Ok("a@xn--a0-0-.aa"), "proptest's find");
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

    #[test]
    fn text_keeps_its_case_and_accents_and_text_folded_folds_them() {
        assert_eq!(Text.normalise("Jos\u{00E9}\u{200B}").as_deref(), Ok("Jos\u{00E9}\u{200B}"));
        for raw in [" jose ", "JOS\u{00C9}", "\u{FF2A}os\u{00E9}\u{200B}", "\u{00AD}Jose\u{0301}"] {
            assert_eq!(TextFolded.normalise(raw).as_deref(), Ok("jose"), "{raw:?}");
        }
        assert_eq!(TextFolded.normalise("Stra\u{00DF}e").as_deref(), Ok("strasse"));
    }

    #[test]
    fn a_policy_file_names_the_folded_text_kind_text_folded() {
        let kinds: std::collections::BTreeMap<String, super::IdentifierKind> =
            toml::from_str(r#"user = "text_folded""#).expect("a known kind");
        assert_eq!(kinds["user"], TextFolded);
    }

    #[test]
    fn text_folded_refuses_a_value_of_invisible_characters_only() {
        assert!(TextFolded.normalise("\u{200B}\u{00AD} \u{2060}").is_err());
        assert!(TextFolded.normalise(&"x".repeat(super::MAX_VALUE_LEN + 1)).is_err());
    }
}
