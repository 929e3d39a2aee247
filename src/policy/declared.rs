//! Identifiers as the policy file declares them: a kind (`ip = "ip"`), or
//! a table that may also show the identifier in the top list.

use std::collections::{BTreeMap, BTreeSet};

use super::IdentifierKind;

/// An identifier as the policy file declares it: its kind (`ip = "ip"`),
/// or a table that may also show it in the top list (`ip = { kind = "ip",
/// show = true }`): only then is its normalised value kept with its denials.
pub(super) enum RawIdentifier {
    Kind(IdentifierKind),
    Table(ShownKind),
}

/// By hand rather than `untagged`, whose error would not say what was
/// wrong (an unknown kind, an unknown key in the table).
impl<'de> serde::Deserialize<'de> for RawIdentifier {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{self, IntoDeserializer, MapAccess, Visitor};
        struct Declared;
        impl<'de> Visitor<'de> for Declared {
            type Value = RawIdentifier;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an identifier kind, or a table { kind = \"...\", show = true }")
            }
            fn visit_str<E: de::Error>(self, kind: &str) -> Result<RawIdentifier, E> {
                serde::Deserialize::deserialize(kind.into_deserializer()).map(RawIdentifier::Kind)
            }
            fn visit_map<A: MapAccess<'de>>(self, table: A) -> Result<RawIdentifier, A::Error> {
                let table = de::value::MapAccessDeserializer::new(table);
                serde::Deserialize::deserialize(table).map(RawIdentifier::Table)
            }
        }
        deserializer.deserialize_any(Declared)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShownKind {
    kind: IdentifierKind,
    #[serde(default)]
    show: bool,
}

/// The kinds of `raw`'s identifiers, and the names of those shown.
pub(super) fn kinds_and_shown(
    raw: BTreeMap<String, RawIdentifier>,
) -> (BTreeMap<String, IdentifierKind>, BTreeSet<String>) {
    let mut shown = BTreeSet::new();
    let kinds = raw.into_iter().map(|(name, declared)| match declared {
        RawIdentifier::Kind(kind) => (name, kind),
        RawIdentifier::Table(ShownKind { kind, show }) => {
            if show {
                shown.insert(name.clone());
            }
            (name, kind)
        }
    });
    (kinds.collect(), shown)
}
