//! Property tests of the input paths: whatever comes in, nothing panics, and
//! what is accepted has the properties the rest of the code relies on.
//! (No database: these are the parsers in front of it.)

use pglimit::policy::{format_window, parse_window, IdentifierKind, Policies, MAX_WINDOW, MIN_WINDOW};
use pglimit::server::parse_check_body;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 2_000, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn normalising_any_string_never_panics(raw in any::<String>()) {
        for kind in [IdentifierKind::Email, IdentifierKind::Ip, IdentifierKind::Text] {
            let _ = kind.normalise(&raw);
        }
    }

    #[test]
    fn normalised_emails_are_stable_and_canonical(local in "[A-Za-z0-9._%-]{1,20}", tag in "(\\+[A-Za-z0-9]{0,8})?", domain in "[A-Za-z0-9-]{1,15}\\.[A-Za-z]{2,6}", pad in " {0,3}") {
        let raw = format!("{pad}{local}{tag}@{domain}{pad}");
        let once = IdentifierKind::Email.normalise(&raw).expect("a well-formed address");
        let twice = IdentifierKind::Email.normalise(&once);
        prop_assert_eq!(twice, Ok(once.clone()));
        prop_assert_eq!(once.clone(), once.to_lowercase());
        prop_assert!(!once.contains('+') && !once.contains(' '));
    }

    #[test]
    fn every_ipv4_address_normalises_to_itself_and_its_mapped_form(octets in any::<[u8; 4]>()) {
        let v4 = std::net::Ipv4Addr::from(octets);
        prop_assert_eq!(IdentifierKind::Ip.normalise(&v4.to_string()), Ok(v4.to_string()));
        prop_assert_eq!(IdentifierKind::Ip.normalise(&v4.to_ipv6_mapped().to_string()), Ok(v4.to_string()));
    }

    #[test]
    fn parsing_any_window_never_panics_and_stays_in_range(text in any::<String>()) {
        if let Ok(window) = parse_window(&text) {
            prop_assert!((MIN_WINDOW..=MAX_WINDOW).contains(&window));
        }
    }

    #[test]
    fn formatted_windows_parse_back(ms in MIN_WINDOW.as_millis() as u64..=MAX_WINDOW.as_millis() as u64) {
        let window = std::time::Duration::from_millis(ms);
        prop_assert_eq!(parse_window(&format_window(window)), Ok(window));
    }

    #[test]
    fn any_policy_file_is_accepted_or_refused_without_panicking(text in any::<String>()) {
        let _ = Policies::parse(&text);
    }

    #[test]
    fn any_request_body_is_accepted_or_refused_without_panicking(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_check_body(&body);
    }

    #[test]
    fn any_json_value_is_accepted_or_refused_without_panicking(value in json_value()) {
        let _ = parse_check_body(value.to_string().as_bytes());
    }
}

/// Arbitrary JSON, biased towards the fields the API knows.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number)),
        prop_oneof![Just("1h".to_string()), Just("login".to_string()), any::<String>()]
            .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        let key = prop_oneof![
            Just("policy".to_string()),
            Just("identifiers".to_string()),
            Just("key".to_string()),
            Just("limit".to_string()),
            Just("window".to_string()),
            Just("cost".to_string()),
            Just("algorithm".to_string()),
            Just("email".to_string()),
            Just("ip".to_string()),
            "[a-z]{1,6}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}
