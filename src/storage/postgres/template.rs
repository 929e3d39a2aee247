//! The statements whose text differs by layout, written once with named
//! slots: the tables they name, the route a Citus shard adds to every key,
//! and, in a worker's joined statement, the turn a segment waits for. A
//! single node fills the slots with its plain tables and nothing else; a
//! Citus shard fills them with its own tables and route
//! ([`super::citus`]). A slot is `{{name}}` or `{{name alias}}`, and a
//! slot no placement knows is an error that names it, found at start-up
//! ([`check`]) and by the tests, never by the database.

use std::sync::LazyLock;

/// One-bucket fixed-window checks (`upsert.rs` says when each upsert serves).
pub(super) const ONE_BUCKET_UPSERT: &str = include_str!("upsert.sql");
/// One-bucket fixed-window checks, a key's alike checks as one row.
pub(super) const HOT_UPSERT: &str = include_str!("hot_upsert.sql");
/// Checks of several fixed-window buckets, with one-bucket checks.
pub(super) const POLICY_UPSERT: &str = include_str!("policy_upsert.sql");

/// A row past `expires_at` is equivalent to no row for every algorithm,
/// so deleting it changes no answer. Rows locked by a check in progress are
/// skipped, never waited for. A Citus shard deletes by `(route, key)`.
pub(super) const DELETE_EXPIRED: &str = "DELETE FROM {{buckets}} WHERE ({{key}}) IN (
    SELECT {{key}} FROM {{buckets}} WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Blocks past their end, likewise: an ended block is no block.
pub(super) const DELETE_ENDED_BLOCKS: &str = "DELETE FROM {{blocks}} WHERE ({{key}}) IN (
    SELECT {{key}} FROM {{blocks}} WHERE until <= now()
    ORDER BY until LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Every template: its name, for errors, and its text.
pub(super) const TEMPLATES: [(&str, &str); 5] = [
    ("upsert.sql", ONE_BUCKET_UPSERT),
    ("hot_upsert.sql", HOT_UPSERT),
    ("policy_upsert.sql", POLICY_UPSERT),
    ("DELETE_EXPIRED", DELETE_EXPIRED),
    ("DELETE_ENDED_BLOCKS", DELETE_ENDED_BLOCKS),
];

/// Where a statement runs: the tables it names and, on a Citus shard, the
/// route of every key it touches and what a joined segment waits for.
#[derive(Debug, Clone)]
pub(super) struct Placement<'a> {
    pub buckets: &'a str,
    pub blocks: &'a str,
    /// A Citus shard's route; `None` on a single node.
    pub route: Option<i32>,
    /// Before a segment of a worker's joined statement writes: what it waits for.
    pub in_turn: &'a str,
    /// Where a check of several buckets learns whether all of them fit.
    pub multi: &'a str,
}

/// The single node's placement: plain tables, no route.
pub(super) const SINGLE: Placement<'static> = Placement {
    buckets: "pglimit_buckets",
    blocks: "pglimit_blocks",
    route: None,
    in_turn: "",
    multi: "multi",
};

impl Placement<'_> {
    /// What slot `name` (with `alias`, the table alias it qualifies) says here.
    fn slot(&self, name: &str, alias: Option<&str>) -> Option<String> {
        Some(match (name, alias, self.route) {
            ("buckets", None, _) => self.buckets.to_owned(),
            ("blocks", None, _) => self.blocks.to_owned(),
            ("key", None, None) => "key".to_owned(),
            ("key", None, Some(_)) => "route, key".to_owned(),
            ("route_value", None, route) => route.map_or(String::new(), |r| format!("{r}, ")),
            ("route", Some(alias), route) => {
                route.map_or(String::new(), |r| format!("{alias}.route = {r} AND "))
            }
            ("in_turn", None, _) => self.in_turn.to_owned(),
            ("multi", None, _) => self.multi.to_owned(),
            _ => return None,
        })
    }
}

/// `template` with every slot filled for `placement`; an error names the
/// template (`name`) and a slot that is unknown or left open.
pub(super) fn fill(name: &str, template: &str, placement: &Placement) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let open = &rest[start + 2..];
        let end = open.find("}}").ok_or_else(|| format!("{name}: a slot is not closed"))?;
        let mut words = open[..end].split_whitespace();
        let (slot, alias) = (words.next().unwrap_or_default(), words.next());
        let value = placement
            .slot(slot, alias)
            .ok_or_else(|| format!("{name}: no slot `{{{{{}}}}}`", &open[..end]))?;
        out.push_str(&value);
        rest = &open[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The single node's text of each template, filled once.
static SINGLE_TEXTS: LazyLock<Vec<Result<String, String>>> =
    LazyLock::new(|| TEMPLATES.iter().map(|(name, text)| fill(name, text, &SINGLE)).collect());

/// The single node's text of the template named `name` (one of
/// [`TEMPLATES`]: `upsert.sql`, `DELETE_EXPIRED`, ...).
pub(super) fn single(name: &str) -> Result<&'static str, sqlx::Error> {
    let filled = TEMPLATES.iter().position(|(n, _)| *n == name).map(|i| &SINGLE_TEXTS[i]);
    match filled {
        Some(Ok(sql)) => Ok(sql),
        Some(Err(e)) => Err(sqlx::Error::Protocol(e.clone())),
        None => Err(sqlx::Error::Protocol(format!("no statement template {name:?}"))),
    }
}

/// Whether every template fills on a single node: at start-up, so that a
/// slot mistyped in a `.sql` file stops the service with its name.
pub(super) fn check() -> Result<(), String> {
    SINGLE_TEXTS.iter().try_for_each(|filled| filled.as_ref().map(|_| ()).map_err(Clone::clone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_fills_on_a_single_node_with_no_slot_left() {
        check().expect("every slot known");
        for (name, text) in TEMPLATES {
            let sql = fill(name, text, &SINGLE).expect("filled");
            assert!(!sql.contains("{{") && !sql.contains("}}") && !sql.contains("route"), "{name}: {sql}");
        }
    }

    #[test]
    fn an_unknown_or_open_slot_is_an_error_naming_it() {
        let unknown = fill("t.sql", "SELECT {{tables}}", &SINGLE);
        assert_eq!(unknown, Err("t.sql: no slot `{{tables}}`".to_owned()));
        assert_eq!(fill("t.sql", "SELECT {{key", &SINGLE), Err("t.sql: a slot is not closed".to_owned()));
    }

    #[test]
    fn a_shard_routes_every_key_and_names_its_own_tables() {
        let shard =
            Placement { buckets: "b_1", blocks: "k_1", route: Some(7), in_turn: "T AND ", multi: "m" };
        let sql = fill(
            "t",
            "INSERT INTO {{buckets}} ({{key}}) SELECT {{route_value}}x WHERE {{in_turn}}{{route s}}s.key",
            &shard,
        );
        assert_eq!(
            sql.as_deref(),
            Ok("INSERT INTO b_1 (route, key) SELECT 7, x WHERE T AND s.route = 7 AND s.key")
        );
    }
}
