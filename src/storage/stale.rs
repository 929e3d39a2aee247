//! What actions made stale: the keys whose remembered denials must go, or
//! everything. Gathered between two checks (see [`super::Store::take_stale`])
//! and kept bounded, so that neither its memory nor the time a check spends
//! forgetting grows with the actions heard.

use std::collections::HashSet;

use super::Key;

/// What an action made stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// At most [`MAX_STALE_KEYS`]; build with [`Stale::of`].
    Keys(HashSet<Key>),
    /// Everything: a notification may have been missed, or too many keys
    /// were named to be worth naming.
    All,
}

/// More stale keys than this, gathered between two checks, count as
/// everything. The bound caps the memory they hold while no check takes
/// them (resets heard during an attack) and the time the check that takes
/// them spends forgetting under the deny cache's lock (one index lookup per
/// key); forgetting everything instead costs at most one statement per
/// flooded check, once, until its denial is remembered again.
pub const MAX_STALE_KEYS: usize = 4096;

impl Stale {
    /// These keys, or everything past [`MAX_STALE_KEYS`].
    pub fn of(keys: impl IntoIterator<Item = Key>) -> Stale {
        Self::bounded(keys.into_iter().collect())
    }

    fn bounded(keys: HashSet<Key>) -> Stale {
        if keys.len() > MAX_STALE_KEYS {
            return Stale::All;
        }
        Stale::Keys(keys)
    }

    /// Both at once.
    pub fn merge(self, other: Stale) -> Stale {
        match (self, other) {
            (Stale::Keys(a), Stale::Keys(b)) => {
                let (mut more, fewer) = if a.len() >= b.len() { (a, b) } else { (b, a) };
                more.extend(fewer);
                Self::bounded(more)
            }
            _ => Stale::All,
        }
    }
}

/// Distinct keys for tests: `n` in the first bytes.
#[cfg(test)]
pub(crate) fn test_key(n: usize) -> Key {
    std::array::from_fn(|i| if i < 8 { n.to_le_bytes()[i] } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::test_key as key;
    use super::*;

    #[test]
    fn keys_merge_as_a_set_and_anything_with_all_is_all() {
        let merged = Stale::of([key(1), key(2)]).merge(Stale::of([key(2), key(3)]));
        assert_eq!(merged, Stale::of([key(1), key(2), key(3)]));
        assert_eq!(merged.clone().merge(Stale::All), Stale::All);
        assert_eq!(Stale::All.merge(merged), Stale::All);
    }

    #[test]
    fn more_keys_than_the_bound_collapse_to_all() {
        let at_bound = Stale::of((0..MAX_STALE_KEYS).map(key));
        assert!(matches!(&at_bound, Stale::Keys(keys) if keys.len() == MAX_STALE_KEYS));
        assert_eq!(at_bound.merge(Stale::of([key(MAX_STALE_KEYS)])), Stale::All);
        assert_eq!(Stale::of((0..=MAX_STALE_KEYS).map(key)), Stale::All);
    }
}
