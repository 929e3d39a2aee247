//! A batch function's call written out in full, values and all, for the
//! simple query protocol: what a transaction pooler needs, since a
//! statement prepared on one server connection may be gone on the next.
//!
//! Every value is rendered from a number, bytes in hexadecimal or a clock
//! reading, never from text as given: text travels as hexadecimal too, so
//! no quoting rule (nor `standard_conforming_strings`) is relied on.

use std::fmt::Write;

use chrono::{DateTime, SecondsFormat, Utc};

use super::statements::Params;

/// `SELECT * FROM <function>(...)` after `settings` (`SET LOCAL ...;`),
/// one implicit transaction.
pub(super) fn call(settings: &str, function: &str, p: &Params) -> String {
    let mut sql = String::with_capacity(256 + p.keys.len() * 100);
    let _ = write!(
        sql,
        "{settings} SELECT * FROM {function}({}, {}, {}, {}, {}, {}, {}, {}, {})",
        numbers(&p.positions, "integer"),
        array(p.keys.iter().map(|k| Some(bytes(k))), "bytea"),
        numbers(&p.limits, "bigint"),
        numbers(&p.windows_ms, "bigint"),
        numbers(&p.algorithms, "smallint"),
        numbers(&p.costs, "bigint"),
        numbers(&p.block_for_ms, "bigint"),
        array(p.lockouts.iter().map(|name| name.map(text)), "text"),
        clock(p.now),
    );
    sql
}

fn numbers<T: std::fmt::Display>(values: &[T], of: &str) -> String {
    let listed: Vec<String> = values.iter().map(T::to_string).collect();
    format!("'{{{}}}'::{of}[]", listed.join(","))
}

fn array(values: impl Iterator<Item = Option<String>>, of: &str) -> String {
    let listed: Vec<String> = values.map(|v| v.unwrap_or_else(|| "NULL".to_owned())).collect();
    format!("ARRAY[{}]::{of}[]", listed.join(","))
}

fn bytes(value: &[u8]) -> String {
    format!("decode('{}','hex')", hex::encode(value))
}

fn text(value: &str) -> String {
    format!("convert_from({},'UTF8')", bytes(value.as_bytes()))
}

fn clock(now: Option<DateTime<Utc>>) -> String {
    now.map_or_else(
        || "NULL::timestamptz".to_owned(),
        |t| format!("'{}'::timestamptz", t.to_rfc3339_opts(SecondsFormat::Micros, true)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_travels_as_hexadecimal_so_a_quote_cannot_end_the_literal() {
        assert_eq!(
            text("a'); DROP TABLE x; --"),
            "convert_from(decode('6127293b2044524f50205441424c4520783b202d2d','hex'),'UTF8')"
        );
        assert_eq!(
            array([None, Some(text("é"))].into_iter(), "text"),
            "ARRAY[NULL,convert_from(decode('c3a9','hex'),'UTF8')]::text[]"
        );
        assert_eq!(numbers::<i64>(&[], "bigint"), "'{}'::bigint[]");
        assert_eq!(numbers(&[-1_i64, 2], "bigint"), "'{-1,2}'::bigint[]");
    }
}
