//! Overrides set through the API, held in memory for checks: compiled from
//! their stored form once per change, so that a check of a policy without
//! any costs one map lookup, and one with some keys each value it needs
//! once (as its bucket keys are) and looks the keys up, whatever their number.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::limiter::key::{bucket_key, KeyScope, KeySecret};
use crate::policy::{IdentifierKind, OverrideAction, Pattern};
use crate::storage::{Key, LoadedOverrides, StoredOverride};

/// The prefix of a keyed exact value, as stored and listed.
pub const KEYED: &str = "hmac:";

/// Every API override in force, by policy.
#[derive(Default)]
pub struct ApiOverrides {
    /// The overrides generation they were loaded at; `None`: never loaded.
    pub generation: Option<u64>,
    by_policy: HashMap<String, PolicyOverrides>,
}

#[derive(Default)]
struct PolicyOverrides {
    /// Newest first: of those that match, the first applies.
    all: Vec<ApiOverride>,
    /// The identifiers some exact pattern is on.
    keyed_on: Vec<String>,
    /// Those with an exact pattern, by the key of their first one.
    by_key: HashMap<Key, Vec<usize>>,
    /// Those with none, tried one by one.
    patterned: Vec<usize>,
}

pub struct ApiOverride {
    pub id: Arc<str>,
    when: Vec<(String, ApiPattern)>,
    pub action: OverrideAction,
    until: Option<DateTime<Utc>>,
}

enum ApiPattern {
    /// An exact value, known only by its key.
    Keyed(Key),
    /// `*@domain` or a CIDR network.
    Written(Pattern),
}

impl ApiOverrides {
    /// Compiles what was loaded; an entry that does not read is logged and left out.
    pub fn new(loaded: LoadedOverrides) -> Self {
        let mut by_policy: HashMap<String, PolicyOverrides> = HashMap::new();
        for stored in loaded.overrides {
            match compile(&stored) {
                Some(compiled) => by_policy.entry(stored.policy).or_default().add(compiled),
                None => tracing::warn!(id = %stored.id, "an API override does not read: ignored"),
            }
        }
        Self { generation: Some(loaded.generation), by_policy }
    }

    /// The override of `policy` that applies to these normalised values at
    /// `now`, if any: of those that match and have not expired, the newest
    /// deny, or else the newest.
    pub fn matching(
        &self,
        secret: &KeySecret,
        policy: &str,
        values: &BTreeMap<&str, String>,
    ) -> Option<&ApiOverride> {
        let set = self.by_policy.get(policy)?;
        let keys: Vec<(&str, Key)> = set
            .keyed_on
            .iter()
            .filter_map(|name| {
                Some((name.as_str(), value_key(secret, policy, name, values.get(name.as_str())?)))
            })
            .collect();
        let now = Utc::now();
        let keyed = keys.iter().filter_map(|(_, key)| set.by_key.get(key)).flatten();
        let matching =
            keyed.chain(&set.patterned).copied().filter(|&i| set.all[i].applies(values, &keys, now));
        let found = matching.min_by_key(|&i| (!set.all[i].action.is_deny(), i));
        found.map(|i| &set.all[i])
    }
}

/// The key an exact value of `identifier` is stored as (and compared by).
pub fn value_key(secret: &KeySecret, policy: &str, identifier: &str, value: &str) -> Key {
    bucket_key(secret, &KeyScope::OverrideValue { policy, identifier, value })
}

impl PolicyOverrides {
    fn add(&mut self, compiled: ApiOverride) {
        let index = self.all.len();
        let first_key = compiled.when.iter().find_map(|(name, pattern)| match pattern {
            ApiPattern::Keyed(key) => Some((name, *key)),
            ApiPattern::Written(_) => None,
        });
        match first_key {
            Some((name, key)) => {
                if !self.keyed_on.contains(name) {
                    self.keyed_on.push(name.clone());
                }
                self.by_key.entry(key).or_default().push(index);
            }
            None => self.patterned.push(index),
        }
        self.all.push(compiled);
    }
}

impl ApiOverride {
    fn applies(&self, values: &BTreeMap<&str, String>, keys: &[(&str, Key)], now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|until| until > now)
            && self.when.iter().all(|(name, pattern)| match pattern {
                ApiPattern::Keyed(key) => keys.iter().any(|(n, k)| n == name && k == key),
                ApiPattern::Written(p) => values.get(name.as_str()).is_some_and(|v| p.matches(v)),
            })
    }
}

fn compile(stored: &StoredOverride) -> Option<ApiOverride> {
    let when = stored
        .when
        .iter()
        .map(|(name, text)| Some((name.clone(), stored_pattern(text)?)))
        .collect::<Option<Vec<_>>>()?;
    let action = match stored.action.as_str() {
        "limits" => {
            OverrideAction::Limits(stored.limits.iter().map(|(b, l)| (Arc::from(b.as_str()), *l)).collect())
        }
        "unlimited" => OverrideAction::Unlimited,
        "deny" => OverrideAction::Deny,
        _ => return None,
    };
    Some(ApiOverride { id: Arc::from(stored.id.as_str()), when, action, until: stored.until })
}

/// A pattern as [`stored_form`] wrote it.
fn stored_pattern(text: &str) -> Option<ApiPattern> {
    if let Some(hex_key) = text.strip_prefix(KEYED) {
        let mut key = [0u8; 32];
        return hex::decode_to_slice(hex_key, &mut key).ok().map(|()| ApiPattern::Keyed(key));
    }
    let kind = if text.starts_with("*@") { IdentifierKind::Email } else { IdentifierKind::Ip };
    match Pattern::parse(kind, text).ok()? {
        Pattern::Exact(_) => None,
        written => Some(ApiPattern::Written(written)),
    }
}

/// What is stored for `pattern`, a valid pattern on `identifier` of
/// `policy`: an exact value keyed, never the value; the operator's
/// `*@domain` and CIDR patterns as they are.
pub fn stored_form(secret: &KeySecret, policy: &str, identifier: &str, pattern: &Pattern) -> String {
    match pattern {
        Pattern::Exact(value) => {
            format!("{KEYED}{}", hex::encode(value_key(secret, policy, identifier, value)))
        }
        written => written.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> KeySecret {
        KeySecret::new([7u8; 32]).expect("long enough")
    }

    fn stored(id: &str, when: &[(&str, &str)], action: &str) -> StoredOverride {
        let when = when.iter().map(|(n, p)| (n.to_string(), p.to_string())).collect();
        let limits = BTreeMap::from([("monthly".to_string(), 9)]);
        StoredOverride {
            id: id.into(),
            policy: "api".into(),
            when,
            action: action.into(),
            limits,
            until: None,
            note: None,
            created_at: Utc::now(),
        }
    }

    fn values(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
        pairs.iter().map(|(n, v)| (*n, v.to_string())).collect()
    }

    #[test]
    fn an_exact_value_is_matched_by_its_key_and_the_newest_match_applies() {
        let keyed = stored_form(&secret(), "api", "account", &Pattern::Exact("acct_42".into()));
        assert!(keyed.starts_with(KEYED) && !keyed.contains("acct_42"));
        let overrides = vec![
            stored("newer", &[("ip", "10.0.0.0/8")], "deny"),
            stored("older", &[("account", &keyed)], "limits"),
        ];
        let set = ApiOverrides::new(LoadedOverrides { generation: 1, overrides });
        let id = |v: &BTreeMap<&str, String>| set.matching(&secret(), "api", v).map(|o| o.id.to_string());
        assert_eq!(id(&values(&[("account", "acct_42"), ("ip", "192.0.2.1")])).as_deref(), Some("older"));
        assert_eq!(id(&values(&[("account", "acct_42"), ("ip", "10.1.1.1")])).as_deref(), Some("newer"));
        assert_eq!(id(&values(&[("account", "acct_43"), ("ip", "192.0.2.1")])), None);
        assert!(set.matching(&secret(), "other", &values(&[("account", "acct_42")])).is_none());
    }

    #[test]
    fn a_limit_set_before_a_reload_made_the_bucket_a_sliding_log_is_capped_at_its_largest() {
        let file = "[policies.api]\nidentifiers = { account = \"text\" }\n[[policies.api.buckets]]\n\
                    name = \"monthly\"\non = [\"account\"]\nlimit = 10\nwindow = \"1h\"\nalgorithm = \"sliding_log\"\n";
        let policies = crate::policy::Policies::parse(file).expect("valid");
        let policy = policies.get("api").expect("api");
        let action = OverrideAction::Limits([(Arc::from("monthly"), 5_000)].into_iter().collect());
        let max = crate::algorithm::Algorithm::SlidingLog.max_limit();
        assert_eq!(policy.limit_for(&policy.buckets[0], Some(&action)), max);
    }

    #[test]
    fn an_expired_override_no_longer_applies() {
        let keyed = stored_form(&secret(), "api", "account", &Pattern::Exact("acct_42".into()));
        let mut expired = stored("gone", &[("account", &keyed)], "unlimited");
        expired.until = Some(Utc::now() - chrono::Duration::seconds(1));
        let set = ApiOverrides::new(LoadedOverrides { generation: 1, overrides: vec![expired] });
        assert!(set.matching(&secret(), "api", &values(&[("account", "acct_42")])).is_none());
    }
}
