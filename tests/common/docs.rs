//! Blocks of the repository's documents, so that a test runs exactly what
//! a reader copies from them.

use std::path::Path;

/// The body of the first fenced block of `language` in `document` (a path
/// from the repository's root) that contains `marker`.
pub fn fenced_block(document: &str, language: &str, marker: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(document);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{document}: {e}"));
    let opening = format!("```{language}\n");
    let blocks = text.split(opening.as_str()).skip(1).filter_map(|rest| rest.split_once("\n```"));
    let found = blocks.map(|(body, _)| body).find(|body| body.contains(marker));
    let body = found.unwrap_or_else(|| panic!("{document} has no ```{language} block with {marker:?}"));
    format!("{body}\n")
}

/// `text` with `from` replaced by `to`; `from` must be there, so that a
/// document rewritten under a test cannot make it run something else.
pub fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in:\n{text}");
    text.replacen(from, to, 1)
}
