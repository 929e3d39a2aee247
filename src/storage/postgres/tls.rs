//! TLS to PostgreSQL, configured by the URL parameters libpq users already
//! write (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`), with rustls and
//! the system's root certificates (so a managed service's public CA needs
//! no file). Every connection pglimit opens is made from these options.
//!
//! What sqlx would report late or vaguely is refused here, naming the
//! parameter: a certificate file that cannot be read (sqlx reads it at the
//! handshake and says only "No such file or directory"), and
//! `sslmode=verify-ca`, which sqlx 0.8 with current rustls cannot honour
//! (it refuses every server whose name differs: launchbadge/sqlx#3793).

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The URL's connect options, its certificate files checked.
pub(super) fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let url = system_roots(url);
    if let Ok(parsed) = url::Url::parse(&url) {
        for (name, value) in parsed.query_pairs() {
            if matches!(&*name, "sslrootcert" | "sslcert" | "sslkey") {
                readable(&name, &value)?;
            }
        }
    }
    let options: PgConnectOptions = url.parse().map_err(with_setting)?;
    if matches!(options.get_ssl_mode(), PgSslMode::VerifyCa) {
        return Err(configuration(
            "sslmode=verify-ca is not supported (sqlx 0.8 with current rustls refuses every name, \
             launchbadge/sqlx#3793): use verify-full, with a host name the server's certificate carries",
        ));
    }
    Ok(options)
}

/// `sslrootcert=system` (libpq 16's way to ask for the system's roots)
/// means what no `sslrootcert` means here; like libpq, it implies
/// `verify-full` when no `sslmode` is given.
fn system_roots(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.to_owned();
    };
    let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
    if !pairs.iter().any(|(k, v)| k == "sslrootcert" && v == "system") {
        return url.to_owned();
    }
    let has_mode = pairs.iter().any(|(k, _)| k == "sslmode");
    let mut query = parsed.query_pairs_mut();
    query.clear();
    for (k, v) in pairs.iter().filter(|(k, v)| !(k == "sslrootcert" && v == "system")) {
        query.append_pair(k, v);
    }
    if !has_mode {
        query.append_pair("sslmode", "verify-full");
    }
    drop(query);
    parsed.into()
}

fn readable(parameter: &str, path: &str) -> Result<(), sqlx::Error> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| configuration(&format!("DATABASE_URL's {parameter}: cannot read {path}: {e}")))
}

/// sqlx names its settings in Rust (`ssl_mode`); the URL's user wrote `sslmode`.
fn with_setting(error: sqlx::Error) -> sqlx::Error {
    match error {
        sqlx::Error::Configuration(e) => {
            let text = e.to_string().replace("`ssl_mode`", "sslmode");
            configuration(&format!("DATABASE_URL: {text}"))
        }
        other => other,
    }
}

/// A failed first connection, explained when the URL asked for TLS: what
/// rustls says (an unknown CA, a name mismatch, an expired certificate),
/// and which parameters decide it.
pub(super) fn explain(error: sqlx::Error, options: &PgConnectOptions) -> sqlx::Error {
    let verified = matches!(options.get_ssl_mode(), PgSslMode::VerifyFull | PgSslMode::VerifyCa);
    match error {
        sqlx::Error::Io(e) if verified && e.kind() == std::io::ErrorKind::InvalidData => sqlx::Error::Tls(
            format!(
                "{e}: check DATABASE_URL's sslrootcert (the server's CA; the system's roots when absent) \
                 and that its host is a name the server's certificate carries"
            )
            .into(),
        ),
        other => other,
    }
}

/// Whether a failed connection may be tried again without TLS: the URL
/// only prefers TLS (or allows it) and the handshake is what failed.
pub(super) fn may_fall_back(options: &PgConnectOptions, error: &sqlx::Error) -> bool {
    let preferred = matches!(options.get_ssl_mode(), PgSslMode::Prefer | PgSslMode::Allow);
    let handshake = match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    };
    preferred && handshake
}

fn configuration(message: &str) -> sqlx::Error {
    sqlx::Error::Configuration(message.to_owned().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_system_asks_for_the_system_roots_and_verify_full() {
        let url = system_roots("postgres://u@db.example/app?sslrootcert=system&application_name=x");
        let options: PgConnectOptions = url.parse().expect("options");
        assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyFull), "{url}");
        assert!(!url.contains("sslrootcert"), "{url}");
        let url = system_roots("postgres://u@db.example/app?sslrootcert=system&sslmode=require");
        assert!(url.ends_with("?sslmode=require"), "{url}");
    }

    #[test]
    fn a_missing_certificate_file_is_refused_naming_the_parameter_and_path() {
        let error = connect_options("postgres://u@h/d?sslmode=verify-full&sslcert=/nonexistent/c.crt")
            .expect_err("refused")
            .to_string();
        assert!(error.contains("sslcert: cannot read /nonexistent/c.crt"), "{error}");
    }

    #[test]
    fn verify_ca_is_refused_pointing_at_verify_full() {
        let error = connect_options("postgres://u@h/d?sslmode=verify-ca").expect_err("refused").to_string();
        assert!(error.contains("use verify-full"), "{error}");
    }
}
