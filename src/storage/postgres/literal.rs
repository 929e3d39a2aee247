//! A statement's parameters, bound, or written into the statement for the
//! simple query protocol: what a transaction pooler needs, since a
//! statement prepared on one server connection may be gone on the next.
//!
//! Every value is written from a number, bytes in hexadecimal or a clock
//! reading, never from text as given: text travels as hexadecimal too, so
//! no quoting rule (nor `standard_conforming_strings`) is relied on. Each
//! value carries its type, as a bound parameter does.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::QueryAs;

/// One parameter of the check statements.
pub(super) enum Arg<'a> {
    Int(i32),
    Ints(Vec<i32>),
    Smallints(Vec<i16>),
    Bigints(Vec<i64>),
    Bytes(Vec<&'a [u8]>),
    Texts(Vec<Option<&'a str>>),
    /// `None`: SQL NULL (the batch functions then read the database's clock).
    Clock(Option<DateTime<Utc>>),
}

impl<'a> Arg<'a> {
    pub fn bind_to<'q, O>(
        self,
        query: QueryAs<'q, Postgres, O, PgArguments>,
    ) -> QueryAs<'q, Postgres, O, PgArguments>
    where
        'a: 'q,
    {
        match self {
            Arg::Int(v) => query.bind(v),
            Arg::Ints(v) => query.bind(v),
            Arg::Smallints(v) => query.bind(v),
            Arg::Bigints(v) => query.bind(v),
            Arg::Bytes(v) => query.bind(v),
            Arg::Texts(v) => query.bind(v),
            Arg::Clock(v) => query.bind(v),
        }
    }

    fn written(&self) -> String {
        match self {
            Arg::Int(v) => format!("{v}::integer"),
            Arg::Ints(v) => numbers(v, "integer"),
            Arg::Smallints(v) => numbers(v, "smallint"),
            Arg::Bigints(v) => numbers(v, "bigint"),
            Arg::Bytes(v) => array(v.iter().map(|b| Some(bytes(b))), "bytea"),
            Arg::Texts(v) => array(v.iter().map(|t| t.map(text)), "text"),
            Arg::Clock(v) => clock(*v),
        }
    }
}

/// `sql` with each parameter `$N` replaced by `args[N - 1]` written out.
/// Quoted text and comments are copied as they are; the statements this
/// serves have no dollar-quoted text, which this does not recognise.
pub(super) fn written_out(sql: &str, args: &[Arg]) -> Result<String, sqlx::Error> {
    let mut out = String::with_capacity(sql.len() + args.len() * 64);
    let mut chars = sql.char_indices().peekable();
    let mut quoted = false;
    while let Some((at, c)) = chars.next() {
        match c {
            '\'' => quoted = !quoted,
            '-' if !quoted && sql[at..].starts_with("--") => {
                let end = sql[at..].find('\n').map_or(sql.len(), |n| at + n);
                out.push_str(&sql[at..end]);
                while chars.peek().is_some_and(|(i, _)| *i < end) {
                    chars.next();
                }
                continue;
            }
            '$' if !quoted && chars.peek().is_some_and(|(_, d)| d.is_ascii_digit()) => {
                let mut n = 0usize;
                while let Some((_, d)) = chars.next_if(|(_, d)| d.is_ascii_digit()) {
                    n = n * 10 + (d as usize - '0' as usize);
                }
                let arg = n.checked_sub(1).and_then(|i| args.get(i));
                let arg = arg.ok_or_else(|| sqlx::Error::Protocol(format!("no value for ${n}")))?;
                out.push_str(&arg.written());
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    Ok(out)
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
        let names = Arg::Texts(vec![None, Some("a'); DROP TABLE x; --")]);
        assert_eq!(
            names.written(),
            "ARRAY[NULL,convert_from(decode('6127293b2044524f50205441424c4520783b202d2d','hex'),'UTF8')]::text[]"
        );
        assert_eq!(Arg::Bigints(vec![]).written(), "'{}'::bigint[]");
        assert_eq!(Arg::Bigints(vec![-1, 2]).written(), "'{-1,2}'::bigint[]");
    }

    #[test]
    fn parameters_are_replaced_but_not_inside_quotes_or_comments() {
        let sql = "SELECT $1, '$1', $10 -- $2\nFROM t WHERE x = $2";
        let mut args: Vec<Arg> = (1..=10).map(|v| Arg::Ints(vec![v])).collect();
        args[1] = Arg::Clock(None);
        assert_eq!(
            written_out(sql, &args).expect("every parameter has a value"),
            "SELECT '{1}'::integer[], '$1', '{10}'::integer[] -- $2\nFROM t WHERE x = NULL::timestamptz"
        );
        let missing = written_out("SELECT $3", &args[..2]).expect_err("no third value");
        assert!(missing.to_string().contains("no value for $3"), "{missing}");
    }
}
