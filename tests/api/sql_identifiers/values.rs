//! The inputs of `sql_identifiers`: the unit tests' values, and generated
//! text, addresses, emails and networks built to reach every branch.

use std::net::{Ipv4Addr, Ipv6Addr};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// Every value of the unit tests of `policy/identifier.rs`, of the
/// override patterns' tests (`policy/overrides/tests.rs`) and of the brief's
/// questions (leading zeros, zones, masks, lone zero groups).
#[rustfmt::skip]
pub const UNIT_TEST_VALUES: &[&str] = &[
    "alice@example.com", " Alice@Example.COM ", "alice+news@example.com",
    "ALICE+a+b@EXAMPLE.com", "victor@example.com", "vic\u{200B}tor@example.com",
    "\u{FF56}ictor@example.com", "vic\u{00AD}tor@example.com", "victor@EXAMPLE.COM",
    "v\u{00EF}ctor@example.com", "vi\u{0308}ctor@example.com", "\u{FF36}ICTOR\u{FF0B}x\u{FF20}example.com",
    "victor@ex\u{00E4}mple.com", "victor@xn--exmple-cua.com", "\u{0130}REM@example.com",
    "strasse@example.com", "Stra\u{00DF}e@example.com", "STRA\u{1E9E}E@example.com",
    "a@\u{4F8B}\u{5B50}.\u{4E2D}\u{56FD}", "A@XN--FSQU00A.xn--fiqs8s",
    "a@\u{4F8B}\u{5B50}\u{3002}\u{4E2D}\u{56FD}", "", "   ", "alice", "@example.com", "alice@",
    "+tag@example.com", "a b@example.com", "a@exa mple.com", "a@.com", "a@b..c", "\u{200B}@example.com",
    "alice@\u{00AD}", "alice@\u{FF0E}com", "alice@XN--zz-.com", "a@xN--a0-0-.AA", "::ffff:203.0.113.7",
    " 203.0.113.7 ", "2001:db8:1:2:aaaa::1", "2001:DB8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:3::1", "1.2.3",
    "256.1.1.1", "example.com", "1.2.3.4/24", "::g", "  acct_42 ", " ", "Jos\u{00E9}\u{200B}", " jose ",
    "JOS\u{00C9}", "\u{FF2A}os\u{00E9}\u{200B}", "\u{00AD}Jose\u{0301}", "Stra\u{00DF}e",
    "\u{200B}\u{00AD} \u{2060}", "10.255.1.2", "11.0.0.1", "2001:db8:1:2:ffff::9", "2001:db8:1:ffff:1::",
    "2001:db8:2::1", "2001:db8::1", "203.0.113.66", "::ffff:10.1.2.3", "::ffff:11.1.2.3",
    "Bob+x@PARTNER.example", "bob@notpartner.example", "bob@sub.partner.example", "not-an-address",
    "01.2.3.4", "1.2.3.04", "0.0.0.0", "::", "::1", "1::", "::ffff:01.2.3.4", "fe80::1%eth0",
    "2001:db8::/64", "1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7", "1:2:3:4:5:6:1.2.3.4",
    "1:2:3:4:5::1.2.3.4", "1:2:3:4:5:6::1.2.3.4", "1.2.3.4::", "00000::", "0001:0:0:1::",
    "2001:0:1:0:0:1::", "1:0:0:2::", ":::1", "1:::2", "1::2::3", "[::1]", "::FFFF:1.2.3.4", "::ffff:0:0",
    "x@ex\u{3000}", "\u{3000}alice@example.com\u{2029}", "\u{85}\u{a0}1.2.3.4\u{1680}\u{180e}",
];

/// Pieces that random text is made of: what each normaliser looks for,
/// every White_Space character and some that are not, non-ASCII letters
/// and fullwidth forms.
#[rustfmt::skip]
const FRAGMENTS: &[&str] = &[
    "a", "Z", "x", "I", "@", "@", "+", ".", "..", "xn--", "XN--", "-", "::", ":", ":", "ffff",
    "FFFF", "0", "00", "01", "1", "9", "25", "255", "256", "db8", "2001", "1.2.3.4", "%eth0", "/64", "/",
    "*", "\"", "\\", "\t", "\n", "\u{b}", "\u{c}", "\r", " ", "\u{85}", "\u{a0}", "\u{1680}", "\u{2000}",
    "\u{2005}", "\u{200a}", "\u{2028}", "\u{2029}", "\u{202f}", "\u{205f}", "\u{3000}", "\u{180e}",
    "\u{200b}", "\u{1c}", "\u{1}", "\u{7f}", "\u{e9}", "\u{df}", "\u{130}", "\u{ff21}", "\u{ff20}",
    "\u{ff0b}", "\u{ff0e}", "\u{4f8b}", "\u{301}", "\u{1f600}",
];

/// Text of random fragments, or random printable ASCII.
pub fn any_text(rng: &mut StdRng) -> String {
    if rng.gen_bool(0.3) {
        return (0..rng.gen_range(0..16)).map(|_| rng.gen_range(' '..='~')).collect();
    }
    let mut text: String =
        (0..rng.gen_range(0..9)).map(|_| *FRAGMENTS.choose(rng).expect("fragments")).collect();
    if rng.gen_bool(0.02) {
        let pad = if rng.gen_bool(0.5) { " " } else { "\u{e9}" };
        text = pad.repeat(rng.gen_range(250..=260)) + &text;
    }
    text
}

/// An address with some zero groups, so that `::` lands everywhere.
fn random_v6(rng: &mut StdRng) -> Ipv6Addr {
    let groups: [u16; 8] = std::array::from_fn(|_| if rng.gen_bool(0.5) { 0 } else { rng.gen() });
    match rng.gen_range(0..8) {
        0 => Ipv4Addr::from(rng.gen::<u32>()).to_ipv6_mapped(),
        1 => Ipv4Addr::from(rng.gen::<u32>()).to_ipv6_compatible(),
        _ => Ipv6Addr::from(groups),
    }
}

/// `v6` written one of the ways people write it.
fn written_v6(rng: &mut StdRng, v6: Ipv6Addr) -> String {
    let groups = v6.segments();
    let text = match rng.gen_range(0..5) {
        0 => v6.to_string(),
        1 => groups.map(|g| format!("{g:x}")).join(":"),
        2 => groups.map(|g| format!("{g:04X}")).join(":"),
        3 => format!(
            "{}:{}",
            groups[..6].iter().map(|g| format!("{g:x}")).collect::<Vec<_>>().join(":"),
            Ipv4Addr::from(u128::from(v6) as u32)
        ),
        _ => {
            let (from, to) = (rng.gen_range(0..8), rng.gen_range(0..=8));
            let part = |gs: &[u16]| gs.iter().map(|g| format!("{g:x}")).collect::<Vec<_>>().join(":");
            format!("{}::{}", part(&groups[..from]), part(&groups[to.max(from + 1).min(8)..]))
        }
    };
    let pad = [" ", "\u{3000}", "\t", ""].choose(rng).expect("pads");
    format!("{pad}{text}{pad}")
}

/// IPv4 and IPv6 addresses, most valid, some with a leading zero, a zone,
/// a mask or a stray character.
pub fn addresses(rng: &mut StdRng, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let text = if rng.gen_bool(0.3) {
                let octets: [u8; 4] = rng.gen();
                let zero = if rng.gen_bool(0.1) { "0" } else { "" };
                format!("{zero}{}.{}.{}.{}", octets[0], octets[1], octets[2], octets[3])
            } else {
                let v6 = random_v6(rng);
                written_v6(rng, v6)
            };
            match rng.gen_range(0..12) {
                0 => text + *["%eth0", "/64", ":", ".1", "g", "::"].choose(rng).expect("tails"),
                1 => text.replacen(':', ":0", 1),
                _ => text,
            }
        })
        .collect()
}

/// Email addresses, some with tags, punycode labels, odd dots or spaces.
pub fn emails(rng: &mut StdRng, n: usize) -> Vec<String> {
    let locals = ["alice", "Bob", "c.d", "e+tag", "+x", "", "a b", "f\u{e9}", "G\"h", "i@j", "k\u{7f}"];
    let domains = [
        "example.com",
        "EXAMPLE.org",
        "a.b.c",
        "xn--fiqs8s",
        "a.XN--zz-.com",
        ".com",
        "b..c",
        "x.",
        "",
        "\u{ff0e}e",
    ];
    (0..n)
        .map(|_| {
            let local = locals.choose(rng).expect("locals");
            let domain = domains.choose(rng).expect("domains");
            let text = format!("{local}@{domain}");
            if rng.gen_bool(0.2) {
                format!(" {}\u{2003}", text.to_uppercase())
            } else {
                text
            }
        })
        .collect()
}

/// Networks, most valid, some refused: a long prefix, host bits, a sign.
pub fn networks(rng: &mut StdRng, n: usize) -> Vec<String> {
    let fixed =
        ["10.0.0.0/8", "0.0.0.0/0", "2001:DB8:0:0:0:0:0:0/32", "2001:db8::/80", "10.0.0.0/33", "10.0.0/8"];
    let fixed =
        fixed.iter().chain(&["10.0.0.0/+8", "10.1.2.3/8", "10.0.0.0", "::/129", "::/0", "1.2.3.4/008"]);
    let mut nets: Vec<String> = fixed.map(|s| s.to_string()).collect();
    while nets.len() < n {
        let net = if rng.gen_bool(0.4) {
            let prefix = rng.gen_range(0..=34u32);
            let bits = rng.gen::<u32>() & u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
            let stray = if rng.gen_bool(0.1) { 1 } else { 0 };
            format!("{}/{prefix}", Ipv4Addr::from(bits | stray))
        } else {
            let prefix = rng.gen_range(0..=66u32);
            let bits = u128::from(random_v6(rng)) & u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            let stray = if rng.gen_bool(0.1) { 1 << 64 } else { 0 };
            format!("{}/{prefix}", written_v6(rng, Ipv6Addr::from(bits | stray)).trim())
        };
        nets.push(net);
    }
    nets
}
