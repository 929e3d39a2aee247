//! `docs/design.md` held to the tree as it is when the test runs: it names
//! every source file and every table, and every path it names exists.
//!
//! The document names a source file by its path from `src/` (`lib.rs`,
//! `storage/postgres/lane/mod.rs`) or from the repository's root
//! (`src/lib.rs`), in backticks or in a code block; a table, by its name
//! anywhere. Everything is read from disk at run time, so a file moved or
//! added since the last build is seen.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const DESIGN: &str = "docs/design.md";

/// Endings that make a word a file's name.
const FILE_ENDINGS: &[&str] =
    &["rs", "sql", "md", "toml", "sh", "py", "ts", "json", "yaml", "yml", "lua", "jq", "proto", "conf"];

/// Directories no document points into, and too large to walk.
const NOT_WALKED: &[&str] = &["target", "node_modules", ".git", ".hypothesis", ".schemathesis", ".venv"];

#[test]
fn the_design_names_every_source_file_and_table_and_no_path_that_does_not_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join(DESIGN)).unwrap_or_else(|e| panic!("{DESIGN}: {e}"));
    let words = words(&text);
    let named: BTreeSet<&str> = words.iter().map(|w| w.text.trim_end_matches('/')).collect();
    let mut problems = Vec::new();

    for file in files(&root.join("src"), &|p| ends_in(p, &["rs", "sql"])) {
        let path = relative(&file, &root.join("src"));
        if !named.contains(path.as_str()) && !named.contains(format!("src/{path}").as_str()) {
            problems.push(format!("src/{path} is not named (write `{path}` in the module layout)"));
        }
    }

    let identifiers: BTreeSet<&str> =
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
    let schema = files(&root.join("migrations"), &|p| ends_in(p, &["sql"]));
    let functions = files(&root.join("src"), &|p| ends_in(p, &["sql"]));
    for file in schema.iter().chain(&functions) {
        let sql = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for table in created_tables(&sql) {
            if !identifiers.contains(table.as_str()) {
                problems
                    .push(format!("the table {table} is not named (created in {})", relative(file, root)));
            }
        }
    }

    let names: BTreeSet<String> = files(root, &|_| true)
        .iter()
        .filter_map(|f| f.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .collect();
    for word in &words {
        if let Some(fault) = fault(root, &names, word) {
            problems.push(format!("line {}: {fault}", word.line));
        }
    }

    assert!(
        problems.is_empty(),
        "{DESIGN} does not match the tree ({} problems):\n  - {}\n",
        problems.len(),
        problems.join("\n  - ")
    );
}

/// A word of the document that may be a path: a piece of a backtick span
/// or of a code block, or a link's target.
struct Word<'a> {
    line: usize,
    text: &'a str,
    link: bool,
}

fn words(text: &str) -> Vec<Word<'_>> {
    let mut words = Vec::new();
    let mut fenced = false;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let spans: Vec<&str> = if fenced { vec![line] } else { line.split('`').skip(1).step_by(2).collect() };
        for span in spans {
            let pieces = span.split(|c: char| c.is_whitespace() || "[](),;\"'<>=|".contains(c));
            for piece in pieces {
                let piece = piece.trim_start_matches("./").trim_end_matches(['.', ':', ',']);
                if !piece.is_empty() {
                    words.push(Word { line: number, text: piece, link: false });
                }
            }
        }
        if !fenced {
            for rest in line.split("](").skip(1) {
                let target = rest.split(')').next().unwrap_or_default();
                let target = target.split('#').next().unwrap_or_default();
                if !target.is_empty() && !target.contains(':') {
                    words.push(Word { line: number, text: target, link: true });
                }
            }
        }
    }
    words
}

/// What is wrong with a word that names a path which does not exist.
fn fault(root: &Path, names: &BTreeSet<String>, word: &Word) -> Option<String> {
    let text = word.text;
    if word.link {
        let exists = root.join("docs").join(text).exists();
        return (!exists).then(|| format!("the link to {text} leads nowhere"));
    }
    if text.starts_with('/') || text.contains("::") || text.contains(['{', '}', '$', '@', '…']) {
        return None;
    }
    let first = text.split('/').next().unwrap_or_default();
    let under_root = text.contains('/') && root.join(first).exists();
    let under_src = text.contains('/') && root.join("src").join(first).exists();
    let is_file = ends_in(Path::new(text), FILE_ENDINGS);
    if under_root || under_src || (text.contains('/') && is_file) {
        let exists = [root, &root.join("src")].iter().any(|base| matches_something(base, text));
        return (!exists).then(|| format!("`{text}` does not exist (from the root or from src/)"));
    }
    let bare = is_file && text.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    (bare && !names.contains(text)).then(|| format!("no file is named `{text}`"))
}

/// Whether `path` under `base` exists; a `*` in its last part matches any
/// run of characters.
fn matches_something(base: &Path, path: &str) -> bool {
    if !path.contains('*') {
        return base.join(path).exists();
    }
    let (dir, pattern) = path.rsplit_once('/').unwrap_or(("", path));
    let Ok(entries) = fs::read_dir(base.join(dir)) else { return false };
    entries.flatten().any(|e| e.file_name().to_str().is_some_and(|name| wildcard(pattern, name)))
}

fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|skip| {
                    name.is_char_boundary(head.len() + skip) && wildcard(tail, &name[head.len() + skip..])
                })
        }
    }
}

/// The tables `sql` creates, by name (without a schema).
fn created_tables(sql: &str) -> Vec<String> {
    let words: Vec<&str> = sql.split_whitespace().collect();
    let mut tables = Vec::new();
    for (i, pair) in words.windows(2).enumerate() {
        if pair[0].eq_ignore_ascii_case("create") && pair[1].eq_ignore_ascii_case("table") {
            let mut rest = words[i + 2..].iter().copied();
            let mut name = rest.next().unwrap_or_default();
            if name.eq_ignore_ascii_case("if") {
                name = rest.nth(2).unwrap_or_default();
            }
            let name = name.split('(').next().unwrap_or_default().trim_matches('"');
            let name = name.rsplit('.').next().unwrap_or_default();
            if !name.is_empty() {
                tables.push(name.to_owned());
            }
        }
    }
    tables
}

/// Every file under `dir` that `keep` keeps, sorted.
fn files(dir: &Path, keep: &dyn Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if !NOT_WALKED.iter().any(|skip| name == *skip) {
                found.extend(files(&path, keep));
            }
        } else if keep(&path) {
            found.push(path);
        }
    }
    found.sort();
    found
}

fn ends_in(path: &Path, endings: &[&str]) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| endings.contains(&e))
}

/// `path` from `base`, with `/` between its parts.
fn relative(path: &Path, base: &Path) -> String {
    let within = path.strip_prefix(base).unwrap_or(path);
    within.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}
