//! The documents of the variables checked against their declarations:
//! every variable shown, with its default, and none that is not declared.
//! A document is read into [`Shown`] lines by a reader of its format
//! ([`env_example`]; [`markdown_table`] for a table of variables, defaults
//! and descriptions) and checked by [`disagreements`].

use std::collections::BTreeMap;

use super::setting::Unset;
use super::variables::ALL;

/// What a document shows of one variable.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Shown {
    pub var: String,
    /// The value written; `None`: none, or words instead of a value.
    pub value: Option<String>,
    /// Whether the value stands as the default (a line that sets the
    /// variable, a table's default column) rather than perhaps an example
    /// (a line commented out).
    pub as_default: bool,
}

/// Whether `name` is in pglimit's namespace of variables.
fn is_ours(name: &str) -> bool {
    let shaped = !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
    shaped && (name.starts_with("PGLIMIT_") || name.starts_with("DATABASE_URL"))
}

/// The lines of an environment file that set a variable of ours, or would
/// once uncommented (`# PGLIMIT_X=value`).
pub(super) fn env_example(text: &str) -> Vec<Shown> {
    let shown = text.lines().filter_map(|line| {
        let uncommented = line.trim_start_matches(['#', ' ']);
        let (name, value) = uncommented.split_once('=')?;
        is_ours(name).then(|| Shown {
            var: name.to_owned(),
            value: Some(value.to_owned()).filter(|v| !v.is_empty()),
            as_default: uncommented.len() == line.len(),
        })
    });
    shown.collect()
}

/// The rows of a markdown table whose first cell names variables of ours
/// (`` `PGLIMIT_X` ``, several to a row if they share it) and whose second
/// is the default: a value in backticks alone, or else words.
pub(super) fn markdown_table(text: &str) -> Vec<Shown> {
    let rows = text.lines().filter_map(|line| line.trim().strip_prefix('|')?.split_once('|'));
    let shown = rows.flat_map(|(names, rest)| {
        let default = rest.split('|').next().unwrap_or_default().trim();
        let inner = default.strip_prefix('`').and_then(|d| d.strip_suffix('`'));
        let value = inner.filter(|v| !v.contains('`')).map(String::from);
        let names = names.split('`').skip(1).step_by(2).filter(|name| is_ours(name));
        let shown: Vec<Shown> = names
            .map(|name| Shown { var: name.to_owned(), value: value.clone(), as_default: true })
            .collect();
        shown
    });
    shown.collect()
}

/// Where `shown` departs from the declarations, one sentence each.
pub(super) fn disagreements(shown: &[Shown]) -> Vec<String> {
    let declared: BTreeMap<&str, _> = ALL.iter().map(|v| (v.erased().var, v.erased())).collect();
    let mut found = Vec::new();
    let mut seen = BTreeMap::new();
    for line in shown {
        if seen.insert(line.var.as_str(), ()).is_some() {
            found.push(format!("{} is shown twice", line.var));
        }
        let Some(setting) = declared.get(line.var.as_str()) else {
            found.push(format!("{} is not a declared variable", line.var));
            continue;
        };
        let value = line.value.as_deref();
        match setting.unset {
            Unset::Is(default) if value != Some(default) => {
                found.push(format!("{} shows {value:?}, not its default {default:?}", line.var));
            }
            Unset::Is(_) => {}
            Unset::Means(means) if line.as_default && value.is_some() => {
                found.push(format!("{} shows {value:?} as its default, which is {means:?}", line.var));
            }
            Unset::Means(_) => {
                if let Err(why) = value.map_or(Ok(()), |v| setting.values.check(v)) {
                    found.push(format!("{} shows an example that is refused: {why}", line.var));
                }
            }
        }
    }
    let missing = declared.keys().filter(|var| !seen.contains_key(*var));
    found.extend(missing.map(|var| format!("{var} is not shown")));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_example_shows_every_variable_in_order_with_its_default_and_no_other() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".env.example");
        let text = std::fs::read_to_string(path).expect(".env.example");
        let shown = env_example(&text);
        assert_eq!(disagreements(&shown), Vec::<String>::new());
        let order: Vec<&str> = shown.iter().map(|line| line.var.as_str()).collect();
        let declared: Vec<&str> = ALL.iter().map(|v| v.erased().var).collect();
        assert_eq!(order, declared, "in the declared order, as `serve --help` lists them");
    }

    #[test]
    fn the_configuration_page_gives_every_variable_its_declared_default() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
        let text = std::fs::read_to_string(path).expect("docs/configuration.md");
        assert_eq!(disagreements(&markdown_table(&text)), Vec::<String>::new());
    }

    #[test]
    fn a_wrong_default_a_set_example_an_unknown_variable_and_a_missing_one_are_each_named() {
        let text = "PGLIMIT_DB_TIMEOUT_MS=300\nPGLIMIT_WORKER_THREADS=1\n# PGLIMIT_SLOW_CHECKS=0\n\
                    # PGLIMIT_GRPC_BIND=8081\n# PGLIMIT_COLOUR=red\n# RUST_LOG=info\n";
        let found = disagreements(&env_example(text));
        let expected = [
            "PGLIMIT_DB_TIMEOUT_MS shows Some(\"300\"), not its default \"250\"",
            "PGLIMIT_WORKER_THREADS shows Some(\"1\") as its default, which is \"one per CPU\"",
            "PGLIMIT_SLOW_CHECKS shows Some(\"0\"), not its default \"128\"",
            "PGLIMIT_GRPC_BIND shows an example that is refused: \"8081\" is not an address like 127.0.0.1:8081",
            "PGLIMIT_COLOUR is not a declared variable",
        ];
        assert_eq!(found[..expected.len()], expected);
        assert!(found.contains(&"PGLIMIT_BIND is not shown".to_owned()), "{found:?}");
        assert!(!found.iter().any(|f| f.contains("RUST_LOG")), "{found:?}");
    }

    #[test]
    fn a_markdown_table_gives_each_named_variable_the_default_of_its_row() {
        let text = "| Variable | Default | What |\n|---|---|---|\n\
                    | `PGLIMIT_BIND` | `127.0.0.1:8080` | listen on `PGLIMIT_API_TOKENS` |\n\
                    | `DATABASE_URL_FILE`, `PGLIMIT_KEY_SECRET_FILE` | unset | a file |\n\
                    | `PGLIMIT_REQUEST_TIMEOUT_MS` | `30000`, or longer | a 503 |\n";
        let shown = |var: &str, value: Option<&str>| Shown {
            var: var.to_owned(),
            value: value.map(String::from),
            as_default: true,
        };
        let expected = [
            shown("PGLIMIT_BIND", Some("127.0.0.1:8080")),
            shown("DATABASE_URL_FILE", None),
            shown("PGLIMIT_KEY_SECRET_FILE", None),
            shown("PGLIMIT_REQUEST_TIMEOUT_MS", None),
        ];
        let rows = markdown_table(text);
        assert_eq!(rows, expected);
        let found = disagreements(&rows);
        assert!(!found.iter().any(|f| f.starts_with("PGLIMIT_BIND ")), "{found:?}");
        assert!(found.contains(&"PGLIMIT_DATA_DIR is not shown".to_owned()), "{found:?}");
    }
}
