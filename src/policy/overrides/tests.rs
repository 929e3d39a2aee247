//! Overrides: how they parse, where their mistakes are
//! placed, and which identifier values each pattern matches.

use std::collections::BTreeMap;

use crate::policy::*;

/// Policy `p` on lines 1 to 14: identifiers email, ip and account (text),
/// buckets `email_ip` (limit 5) and `ip` (limit 20). Overrides follow it.
const HEAD: [&str; 14] = [
    "[policies.p]",
    r#"identifiers = { email = "email", ip = "ip", account = "text" }"#,
    "",
    "[[policies.p.buckets]]",
    r#"name = "email_ip""#,
    r#"on = ["email", "ip"]"#,
    "limit = 5",
    r#"window = "1m""#,
    "",
    "[[policies.p.buckets]]",
    r#"name = "ip""#,
    r#"on = ["ip"]"#,
    "limit = 20",
    r#"window = "1m""#,
];

/// `HEAD` then one `[[policies.p.overrides]]` entry per element of
/// `entries`, each a header line followed by its fields, one a line: the
/// first entry's header is line 15 and its fields start on line 16.
fn file_with(entries: &[&[&str]]) -> String {
    let mut lines: Vec<&str> = HEAD.to_vec();
    for fields in entries {
        lines.push("[[policies.p.overrides]]");
        lines.extend_from_slice(fields);
    }
    lines.join("\n")
}

fn policy_with(entries: &[&[&str]]) -> Policy {
    let policies = Policies::parse(&file_with(entries)).expect("the file is valid");
    Policy::clone(policies.get("p").expect("policy p"))
}

fn error_with(entries: &[&[&str]]) -> String {
    Policies::parse(&file_with(entries)).expect_err("the file has a mistake").to_string()
}

/// The normalised values the limiter would build from these raw ones.
fn values(policy: &Policy, raw: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
    raw.iter()
        .map(|&(name, value)| (name, policy.identifiers[name].normalise(value).expect("a valid value")))
        .collect()
}

/// The index of the override `raw` values meet, if any.
fn matched(policy: &Policy, raw: &[(&'static str, &str)]) -> Option<usize> {
    policy.override_for(&values(policy, raw)).map(|o| o.index)
}

fn bucket<'p>(policy: &'p Policy, name: &str) -> &'p BucketDef {
    policy.buckets.iter().find(|b| &*b.name == name).expect("the bucket exists")
}

#[test]
fn a_limits_override_replaces_the_limits_it_names_and_leaves_the_others() {
    let policy = policy_with(&[&[r#"when = { email = "*@partner.example" }"#, "limits = { email_ip = 50 }"]]);
    let over = &policy.overrides[0];
    assert_eq!(over.when, [("email".to_string(), Pattern::EmailDomain("partner.example".into()))]);
    assert_eq!(over.action, OverrideAction::Limits(BTreeMap::from([("email_ip".into(), 50)])));
    assert_eq!(policy.limit_for(bucket(&policy, "email_ip"), Some(&over.action)), 50);
    assert_eq!(policy.limit_for(bucket(&policy, "ip"), Some(&over.action)), 20);
    assert_eq!(policy.limit_for(bucket(&policy, "email_ip"), None), 5);
}

#[test]
fn unlimited_and_deny_entries_parse_in_file_order_with_their_index() {
    let policy = policy_with(&[
        &[r#"when = { ip = "10.0.0.0/8" }"#, "unlimited = true"],
        &[r#"when = { ip = "203.0.113.66" }"#, "deny = true"],
    ]);
    let actions: Vec<_> = policy.overrides.iter().map(|o| (o.name(), o.action.clone())).collect();
    assert_eq!(
        actions,
        [
            ("overrides[0]".to_string(), OverrideAction::Unlimited),
            ("overrides[1]".into(), OverrideAction::Deny)
        ]
    );
    assert_eq!(policy.limit_for(bucket(&policy, "ip"), Some(&policy.overrides[1].action)), 20);
}

#[test]
fn patterns_are_held_in_normalised_form() {
    let policy = policy_with(&[&[
        r#"when = { email = " Alice+x@Example.COM ", ip = "2001:DB8:0:0:0:0:0:0/32", account = " a1 " }"#,
        "deny = true",
    ]]);
    let shown: Vec<_> = policy.overrides[0].when.iter().map(|(n, p)| format!("{n}={p}")).collect();
    assert_eq!(shown, ["account=a1", "email=alice@example.com", "ip=2001:db8::/32"]);
}

#[test]
fn an_unknown_identifier_in_when_names_its_line() {
    let err = error_with(&[&["deny = true", r#"when = { ip = "10.0.0.1", mail = "a@b.c" }"#]]);
    assert_eq!(
        err,
        r#"policies.p: overrides[0]: when (line 17, column 27): "mail" is not one of this policy's identifiers"#
    );
}

#[test]
fn an_empty_when_names_its_line() {
    let err = error_with(&[&["when = {}", "deny = true"]]);
    assert!(
        err.starts_with("policies.p: overrides[0]: when (line 16, column 8): list at least one"),
        "{err}"
    );
}

#[test]
fn an_unknown_bucket_in_limits_names_its_line() {
    let err = error_with(&[&[r#"when = { ip = "10.0.0.1" }"#, "limits = { ip = 1, email = 9 }"]]);
    assert_eq!(
        err,
        r#"policies.p: overrides[0]: limits (line 17, column 20): "email" is not one of this policy's buckets"#
    );
}

#[test]
fn a_limit_of_zero_in_limits_names_its_line() {
    let err = error_with(&[
        &[r#"when = { ip = "10.0.0.1" }"#, "deny = true"],
        &[r#"when = { ip = "10.0.0.2" }"#, "limits = { email_ip = 0 }"],
    ]);
    assert_eq!(
        err,
        "policies.p: overrides[1]: limits.email_ip (line 20, column 23): must be between 1 and 1000000000"
    );
}

#[test]
fn an_entry_with_two_actions_names_the_entrys_line() {
    let err = error_with(&[&[r#"when = { ip = "10.0.0.1" }"#, "unlimited = true", "deny = true"]]);
    assert!(err.starts_with("policies.p: overrides[0] (line 15, column 1): has unlimited and deny"), "{err}");
}

#[test]
fn an_entry_without_an_action_names_the_entrys_line() {
    let err =
        error_with(&[&[r#"when = { ip = "10.0.0.1" }"#, "deny = true"], &[r#"when = { ip = "10.0.0.2" }"#]]);
    assert!(err.starts_with("policies.p: overrides[1] (line 18, column 1): give it one action"), "{err}");
}

#[test]
fn an_action_set_to_false_names_its_line() {
    let err = error_with(&[&[r#"when = { ip = "10.0.0.1" }"#, "unlimited = false", "deny = true"]]);
    assert_eq!(
        err,
        "policies.p: overrides[0]: unlimited (line 17, column 13): write `unlimited = true`, or leave it out"
    );
}

#[test]
fn a_malformed_cidr_names_its_line() {
    for (cidr, reason) in [
        ("10.0.0.0/33", "an IPv4 prefix is at most 32"),
        ("10.0.0/8", "is not an IPv4 or IPv6 address"),
        ("10.0.0.0/+8", "must be a whole number"),
        ("10.1.2.3/8", "has bits set after its /8: write the network's first address"),
    ] {
        let err = error_with(&[&["deny = true", &format!(r#"when = {{ ip = "{cidr}" }}"#)]]);
        let place = "policies.p: overrides[0]: when.ip (line 17, column 15): ";
        assert!(err.starts_with(place) && err.contains(reason), "{cidr}: {err}");
    }
}

#[test]
fn an_ipv6_prefix_longer_than_64_is_refused_at_its_line() {
    let err = error_with(&[&[r#"when = { ip = "2001:db8::/80" }"#, "deny = true"]]);
    assert!(
        err.starts_with(
            "policies.p: overrides[0]: when.ip (line 16, column 15): the CIDR is longer than /64"
        ),
        "{err}"
    );
    assert!(err.contains("grouped by their /64"), "{err}");
}

#[test]
fn an_email_pattern_on_an_ip_identifier_names_its_line() {
    let err = error_with(&[&[r#"when = { ip = "*@partner.example" }"#, "deny = true"]]);
    assert_eq!(
        err,
        "policies.p: overrides[0]: when.ip (line 16, column 15): \
         a *@domain pattern is for an email identifier only"
    );
}

#[test]
fn an_exact_value_that_does_not_normalise_names_its_line() {
    let err = error_with(&[&[r#"when = { email = "not-an-address" }"#, "deny = true"]]);
    assert!(err.starts_with(
        "policies.p: overrides[0]: when.email (line 16, column 18): the pattern is not an email"
    ));
}

#[test]
fn wildcards_other_than_a_whole_local_part_are_refused() {
    for pattern in ["*@*.partner.example", "bob*@partner.example", "*@", "*@partner..example"] {
        let err = error_with(&[&[&format!(r#"when = {{ email = "{pattern}" }}"#), "deny = true"]]);
        assert!(err.contains("the only wildcard is a whole local part"), "{pattern}: {err}");
    }
}

#[test]
fn an_exact_email_matches_every_spelling_of_its_mailbox() {
    let policy = policy_with(&[&[r#"when = { email = "Alice+x@Example.com" }"#, "deny = true"]]);
    for email in ["alice@example.com", "ALICE+other@EXAMPLE.COM", " alice@Example.com "] {
        assert_eq!(matched(&policy, &[("email", email)]), Some(0), "{email}");
    }
    assert_eq!(matched(&policy, &[("email", "alicia@example.com")]), None);
}

#[test]
fn a_domain_pattern_matches_that_domain_only_not_its_subdomains_or_lookalikes() {
    let policy = policy_with(&[&[r#"when = { email = "*@Partner.Example" }"#, "unlimited = true"]]);
    assert_eq!(matched(&policy, &[("email", "bob@partner.example")]), Some(0));
    assert_eq!(matched(&policy, &[("email", "Bob+x@PARTNER.example")]), Some(0));
    assert_eq!(matched(&policy, &[("email", "bob@sub.partner.example")]), None);
    assert_eq!(matched(&policy, &[("email", "bob@partner.example.com")]), None);
    assert_eq!(matched(&policy, &[("email", "bob@notpartner.example")]), None);
}

#[test]
fn ipv4_cidrs_match_the_addresses_inside_them() {
    let policy = policy_with(&[
        &[r#"when = { ip = "203.0.113.66/32" }"#, "deny = true"],
        &[r#"when = { ip = "10.0.0.0/8" }"#, "unlimited = true"],
        &[r#"when = { ip = "0.0.0.0/0" }"#, "limits = { ip = 2 }"],
    ]);
    assert_eq!(matched(&policy, &[("ip", "203.0.113.66")]), Some(0));
    assert_eq!(matched(&policy, &[("ip", "203.0.113.67")]), Some(2));
    assert_eq!(matched(&policy, &[("ip", "10.255.1.2")]), Some(1));
    assert_eq!(matched(&policy, &[("ip", "11.0.0.1")]), Some(2));
    assert_eq!(matched(&policy, &[("ip", "2001:db8::1")]), None, "an IPv4 network holds no IPv6 group");
}

#[test]
fn an_ipv4_cidr_matches_an_ipv4_mapped_ipv6_address() {
    let policy = policy_with(&[&[r#"when = { ip = "10.0.0.0/8" }"#, "unlimited = true"]]);
    assert_eq!(matched(&policy, &[("ip", "::ffff:10.1.2.3")]), Some(0));
    assert_eq!(matched(&policy, &[("ip", "::ffff:11.1.2.3")]), None);
}

#[test]
fn ipv6_cidrs_of_48_and_64_bits_match_normalised_groups() {
    let policy = policy_with(&[
        &[r#"when = { ip = "2001:db8:1:2::/64" }"#, "deny = true"],
        &[r#"when = { ip = "2001:db8:1::/48" }"#, "unlimited = true"],
    ]);
    assert_eq!(matched(&policy, &[("ip", "2001:db8:1:2:ffff::9")]), Some(0));
    assert_eq!(matched(&policy, &[("ip", "2001:db8:1:3::1")]), Some(1));
    assert_eq!(matched(&policy, &[("ip", "2001:db8:1:ffff:1::")]), Some(1));
    assert_eq!(matched(&policy, &[("ip", "2001:db8:2::1")]), None);
    assert_eq!(
        matched(&policy, &[("ip", "::ffff:10.1.2.3")]),
        None,
        "a mapped address is IPv4 once normalised"
    );
}

#[test]
fn an_exact_ipv6_address_matches_its_whole_64_group() {
    let policy = policy_with(&[&[r#"when = { ip = "2001:db8::1" }"#, "deny = true"]]);
    assert_eq!(policy.overrides[0].when[0].1, Pattern::Exact("2001:db8::/64".into()));
    assert_eq!(matched(&policy, &[("ip", "2001:db8::ffff")]), Some(0));
}

#[test]
fn the_first_matching_entry_wins() {
    let policy = policy_with(&[
        &[r#"when = { ip = "10.0.0.7" }"#, "deny = true"],
        &[r#"when = { ip = "10.0.0.0/8" }"#, "unlimited = true"],
        &[r#"when = { ip = "10.0.0.7" }"#, "limits = { ip = 1 }"],
    ]);
    assert_eq!(matched(&policy, &[("ip", "10.0.0.7")]), Some(0));
    assert_eq!(matched(&policy, &[("ip", "10.0.0.8")]), Some(1));
}

#[test]
fn an_entry_listing_two_identifiers_needs_both_to_match() {
    let policy = policy_with(&[&[
        r#"when = { email = "*@partner.example", ip = "192.0.2.0/24" }"#,
        "limits = { ip = 100 }",
    ]]);
    assert_eq!(matched(&policy, &[("email", "bob@partner.example"), ("ip", "192.0.2.9")]), Some(0));
    assert_eq!(matched(&policy, &[("email", "bob@partner.example"), ("ip", "192.0.3.9")]), None);
    assert_eq!(matched(&policy, &[("email", "bob@other.example"), ("ip", "192.0.2.9")]), None);
    assert_eq!(matched(&policy, &[("ip", "192.0.2.9")]), None, "a missing value matches nothing");
}
