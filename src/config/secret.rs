//! Secrets read from files: `DATABASE_URL_FILE` for `DATABASE_URL`, and so
//! on, the convention of container secrets (mounted under `/run/secrets`),
//! so that a secret is in neither the environment nor the process list.

use std::io::Read;

use super::ConfigError;

/// Most a secret file may hold: a URL or a few tokens, not a stray log.
const MAX_SECRET_FILE: u64 = 64 * 1024;

/// A secret setting: `var`, or else the contents of the file that `var`_FILE
/// names, its trailing newline dropped. Both set is an error naming both; so
/// is a file that cannot be read, is empty or is not text. No error quotes
/// the contents.
pub fn secret(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<String>, ConfigError> {
    let file_var = format!("{var}_FILE");
    match (get(var), get(&file_var)) {
        (value, None) => Ok(value),
        (Some(_), Some(_)) => {
            Err(ConfigError::new(var, format!("{file_var} is set too: set only one of them")))
        }
        (None, Some(path)) => read(&path).map(Some).map_err(|reason| ConfigError::new(file_var, reason)),
    }
}

fn read(path: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(format!("{path} is longer than {MAX_SECRET_FILE} bytes"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text"))?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(format!("{path} is empty"));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    /// A file holding `contents`, removed when dropped.
    pub(in crate::config) struct SecretFile(PathBuf);

    impl SecretFile {
        pub(in crate::config) fn new(name: &str, contents: &[u8]) -> Self {
            let path = std::env::temp_dir().join(format!("pglimit-secret-{name}-{}", std::process::id()));
            std::fs::write(&path, contents).expect("write the secret file");
            Self(path)
        }

        pub(in crate::config) fn path(&self) -> String {
            self.0.to_str().expect("a UTF-8 path").to_owned()
        }
    }

    impl Drop for SecretFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn token(vars: &[(&str, &str)]) -> Result<Option<String>, ConfigError> {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        secret(&|name| map.get(name).map(|v| v.to_string()), "PGLIMIT_METRICS_TOKEN")
    }

    #[test]
    fn a_secret_is_its_variable_or_else_its_files_contents_without_the_trailing_newline() {
        assert_eq!(token(&[]).expect("unset"), None);
        assert_eq!(token(&[("PGLIMIT_METRICS_TOKEN", "t0")]).expect("set").as_deref(), Some("t0"));
        for (name, contents) in [("lf", "t1 two\n"), ("crlf", "t1 two\r\n"), ("bare", "t1 two")] {
            let file = SecretFile::new(name, contents.as_bytes());
            let value = token(&[("PGLIMIT_METRICS_TOKEN_FILE", &file.path())]).expect("read");
            assert_eq!(value.as_deref(), Some("t1 two"), "{name}");
        }
    }

    #[test]
    fn a_secret_given_both_ways_is_refused_naming_both() {
        let file = SecretFile::new("both", b"t1");
        let err = token(&[("PGLIMIT_METRICS_TOKEN", "t0"), ("PGLIMIT_METRICS_TOKEN_FILE", &file.path())])
            .expect_err("both set");
        assert_eq!(
            err.to_string(),
            "PGLIMIT_METRICS_TOKEN: PGLIMIT_METRICS_TOKEN_FILE is set too: set only one of them"
        );
    }

    #[test]
    fn a_file_that_cannot_serve_is_refused_naming_its_variable_and_path_never_its_contents() {
        let missing = std::env::temp_dir().join("pglimit-secret-that-does-not-exist");
        let missing = missing.to_str().expect("a UTF-8 path").to_owned();
        let empty = SecretFile::new("empty", b"\n");
        let binary = SecretFile::new("binary", b"hunter2\xff\xfe");
        let huge = SecretFile::new("huge", &b"hunter2".repeat(10_000));
        for (path, why) in [
            (missing, "cannot read"),
            (empty.path(), "is empty"),
            (binary.path(), "is not UTF-8 text"),
            (huge.path(), "is longer than 65536 bytes"),
        ] {
            let err = token(&[("PGLIMIT_METRICS_TOKEN_FILE", &path)]).expect_err("refused");
            assert_eq!(err.var, "PGLIMIT_METRICS_TOKEN_FILE");
            assert!(err.reason.contains(&path) && err.reason.contains(why), "{err}");
            assert!(!err.to_string().contains("hunter2") && !err.to_string().contains('\n'), "{err}");
        }
    }
}
