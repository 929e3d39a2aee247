//! TLS to PostgreSQL, configured by the settings libpq users already write
//! (`sslmode`, `sslrootcert`, `sslcert`, `sslkey` in the URL, else the
//! `PGSSLMODE`-style variables sqlx also reads), with rustls and the
//! system's root certificates (so a managed service's public CA needs no
//! file). Every connection pglimit opens is made from these options.
//!
//! They mean what they mean to libpq, or are refused at start naming them:
//! `require` with a CA file checks the server's certificate against it;
//! `sslrootcert=system` takes `verify-full` only; a client key that group
//! or others may read is refused (`tls_files.rs`), as is a certificate file
//! sqlx would fail to read only at the handshake. Where sqlx 0.8 cannot do
//! what libpq does, pglimit is stricter and says so: it cannot check a CA
//! without the host name (its `verify-ca` refuses every name with current
//! rustls, launchbadge/sqlx#3793), so `verify-ca` is refused and
//! `require` with a CA file is checked as `verify-full`.

use sqlx::postgres::{PgConnectOptions, PgSslMode};

#[path = "tls_files.rs"]
mod files;

/// How every connection is opened, and what start-up decided on the way.
pub(super) struct Target {
    options: PgConnectOptions,
    /// `sslmode=require` with a CA file, checked as `verify-full`.
    raised: bool,
}

impl Target {
    pub(super) fn options(&self) -> &PgConnectOptions {
        &self.options
    }
}

/// One TLS setting as sqlx applies it, and where it was written.
struct Setting {
    /// As a message names it: `DATABASE_URL's sslkey`, or `PGSSLKEY`.
    named: String,
    value: String,
    /// Whether sqlx reads `value` as a path (a variable may hold the PEM itself).
    file: bool,
}

/// The TLS settings sqlx applies: the URL's last value under any of its
/// spellings, else libpq's environment variable.
#[derive(Default)]
struct Settings {
    mode: Option<Setting>,
    root: Option<Setting>,
    cert: Option<Setting>,
    key: Option<Setting>,
}

impl Settings {
    fn of(url: &str) -> Self {
        let url = url::Url::parse(url).ok();
        let find = |names: &[&str], var: &str| find(url.as_ref(), names, var);
        Self {
            mode: find(&["sslmode", "ssl-mode"], "PGSSLMODE"),
            root: find(&["sslrootcert", "ssl-root-cert", "ssl-ca"], "PGSSLROOTCERT"),
            cert: find(&["sslcert", "ssl-cert"], "PGSSLCERT"),
            key: find(&["sslkey", "ssl-key"], "PGSSLKEY"),
        }
    }

    /// `sslrootcert=system`: libpq 16's way to ask for the system's roots.
    fn system_roots(&self) -> Option<&Setting> {
        self.root.as_ref().filter(|root| root.value == "system")
    }

    /// The files sqlx will read, checked now, so that a mistake stops
    /// start-up naming the setting rather than failing each handshake.
    fn check_files(&self) -> Result<(), sqlx::Error> {
        let root = self.root.as_ref().filter(|_| self.system_roots().is_none());
        for setting in [root, self.cert.as_ref(), self.key.as_ref()].into_iter().flatten() {
            if setting.file {
                files::readable(&setting.named, &setting.value)?;
            }
        }
        match &self.key {
            Some(key) if key.file => files::private(&key.named, &key.value),
            _ => Ok(()),
        }
    }
}

fn find(url: Option<&url::Url>, names: &[&str], var: &str) -> Option<Setting> {
    let written = url.and_then(|url| url.query_pairs().filter(|(k, _)| names.contains(&&**k)).last());
    if let Some((name, value)) = written {
        return Some(Setting {
            named: format!("DATABASE_URL's {name}"),
            value: value.into_owned(),
            file: true,
        });
    }
    let value = std::env::var(var).ok()?;
    // sqlx's test for a PEM given in place of a path.
    let pem = value.trim().starts_with("-----BEGIN") && value.trim().ends_with("-----");
    Some(Setting { named: var.to_owned(), value, file: !pem })
}

/// The URL's connect options, its TLS settings checked and given libpq's meaning.
pub(super) fn connect_options(url: &str) -> Result<Target, sqlx::Error> {
    let settings = Settings::of(url);
    if let Some(mode) = &settings.mode {
        // sqlx would take an unknown PGSSLMODE as `prefer`, a silent downgrade.
        mode.value.parse::<PgSslMode>().map_err(|_| {
            let known = "disable, allow, prefer, require, verify-full";
            configuration(&format!("{}: unknown value {:?} (one of {known})", mode.named, mode.value))
        })?;
    }
    settings.check_files()?;
    let options: PgConnectOptions = url.parse().map_err(with_setting)?;
    let options = system_roots(options, &settings)?;
    match options.get_ssl_mode() {
        PgSslMode::VerifyCa => Err(configuration(
            "sslmode=verify-ca is not supported (sqlx 0.8 with current rustls refuses every name, \
             launchbadge/sqlx#3793): use verify-full, with a host name the server's certificate carries",
        )),
        // libpq checks the CA under `require` once it has one.
        PgSslMode::Require if settings.root.is_some() => {
            Ok(Target { options: options.ssl_mode(PgSslMode::VerifyFull), raised: true })
        }
        _ => Ok(Target { options, raised: false }),
    }
}

/// `sslrootcert=system` trusts the system's roots alone (sqlx adds a file
/// to them, so none is named); like libpq, it implies `verify-full` when
/// no `sslmode` is given and refuses any other mode.
fn system_roots(options: PgConnectOptions, settings: &Settings) -> Result<PgConnectOptions, sqlx::Error> {
    let Some(root) = settings.system_roots() else {
        return Ok(options);
    };
    let options = options.ssl_root_cert_from_pem(Vec::new());
    match &settings.mode {
        None => Ok(options.ssl_mode(PgSslMode::VerifyFull)),
        Some(_) if matches!(options.get_ssl_mode(), PgSslMode::VerifyFull) => Ok(options),
        Some(mode) => Err(configuration(&format!(
            "{} is system, which needs sslmode=verify-full, as libpq requires: the system's roots \
             sign certificates for anyone's names, so only the name check makes them vouch for the server; \
             {} is {}",
            root.named, mode.named, mode.value
        ))),
    }
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
pub(super) fn explain(error: sqlx::Error, target: &Target) -> sqlx::Error {
    let verified = matches!(target.options.get_ssl_mode(), PgSslMode::VerifyFull | PgSslMode::VerifyCa);
    let raised = if target.raised {
        " (sslmode=require with sslrootcert is checked here as verify-full, stricter than libpq, which \
         checks the CA only: sqlx 0.8 cannot check a CA without the name, launchbadge/sqlx#3793)"
    } else {
        ""
    };
    match error {
        sqlx::Error::Io(e) if verified && e.kind() == std::io::ErrorKind::InvalidData => sqlx::Error::Tls(
            format!(
                "{e}: check DATABASE_URL's sslrootcert (the server's CA; the system's roots when absent) \
                 and that its host is a name the server's certificate carries{raised}"
            )
            .into(),
        ),
        other => other,
    }
}

/// Whether a failed connection may be tried again without TLS: the URL
/// only prefers TLS (or allows it) and the handshake is what failed.
fn may_fall_back(options: &PgConnectOptions, error: &sqlx::Error) -> bool {
    let preferred = matches!(options.get_ssl_mode(), PgSslMode::Prefer | PgSslMode::Allow);
    let handshake = match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    };
    preferred && handshake
}

/// Opens a connection with `open` as `sslmode` asks; under `prefer`, as
/// libpq does, one without TLS when the handshake fails (a certificate
/// rustls cannot read, such as the X.509 v1 one Citus makes), logged, for
/// this connection only: the next one tries TLS again. The one rule for
/// every connection pglimit opens, the session's and the listener's;
/// answers whether this one went without TLS.
pub(super) async fn open_preferring<T, F>(
    options: &PgConnectOptions,
    open: impl Fn(PgConnectOptions) -> F,
) -> Result<(T, bool), sqlx::Error>
where
    F: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let error = match open(options.clone()).await {
        Err(e) if may_fall_back(options, &e) => e,
        result => return result.map(|conn| (conn, false)),
    };
    let conn = open(options.clone().ssl_mode(PgSslMode::Disable)).await?;
    tracing::warn!(error = %error, host = options.get_host(), "TLS to PostgreSQL failed under sslmode=prefer, \
        so this connection goes without it, as libpq does (the next one tries TLS again); set \
        sslmode=verify-full (or require) to insist, disable to skip the attempt");
    Ok((conn, true))
}

fn configuration(message: &str) -> sqlx::Error {
    sqlx::Error::Configuration(message.to_owned().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(url: &str) -> PgSslMode {
        connect_options(url).expect("accepted").options.get_ssl_mode()
    }

    fn refusal(url: &str) -> String {
        connect_options(url).err().expect("refused").to_string()
    }

    #[test]
    fn sslrootcert_system_asks_for_the_system_roots_and_verify_full() {
        let url = "postgres://u@db.example/app?sslrootcert=system&application_name=x";
        let target = connect_options(url).expect("accepted");
        assert!(matches!(target.options.get_ssl_mode(), PgSslMode::VerifyFull));
        let roots = format!("{:?}", target.options);
        assert!(roots.contains("ssl_root_cert: Some(Inline([]))"), "no file named system: {roots}");
        assert!(matches!(mode(&format!("{url}&sslmode=verify-full")), PgSslMode::VerifyFull));
    }

    #[test]
    fn sslrootcert_system_with_any_other_sslmode_is_refused_naming_both() {
        for weaker in ["disable", "allow", "prefer", "require", "verify-ca"] {
            let error = refusal(&format!("postgres://u@h/d?sslmode={weaker}&sslrootcert=system"));
            assert!(error.contains("DATABASE_URL's sslrootcert is system"), "{error}");
            assert!(error.contains(&format!("DATABASE_URL's sslmode is {weaker}")), "{error}");
        }
    }

    #[test]
    fn require_with_a_ca_file_is_checked_as_verify_full_and_says_so() {
        let ca = std::env::temp_dir().join(format!("pglimit-tls-unit-{}.crt", std::process::id()));
        std::fs::write(&ca, "").expect("a CA file");
        let url = format!("postgres://u@h/d?sslmode=require&sslrootcert={}", ca.display());
        let target = connect_options(&url).expect("accepted");
        let _ = std::fs::remove_file(&ca);
        assert!(target.raised && matches!(target.options.get_ssl_mode(), PgSslMode::VerifyFull));
        let failed = sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "bad name"));
        let error = explain(failed, &target).to_string();
        assert!(error.contains("sslmode=require with sslrootcert is checked here as verify-full"), "{error}");
        assert!(matches!(mode("postgres://u@h/d?sslmode=require"), PgSslMode::Require));
    }

    #[test]
    fn a_missing_certificate_file_is_refused_naming_the_parameter_and_path() {
        let error = refusal("postgres://u@h/d?sslmode=verify-full&sslcert=/nonexistent/c.crt");
        assert!(error.contains("sslcert: cannot read /nonexistent/c.crt"), "{error}");
        let error = refusal("postgres://u@h/d?sslmode=verify-full&ssl-key=/nonexistent/c.key");
        assert!(error.contains("DATABASE_URL's ssl-key: cannot read /nonexistent/c.key"), "{error}");
    }

    #[test]
    fn verify_ca_is_refused_pointing_at_verify_full() {
        assert!(refusal("postgres://u@h/d?sslmode=verify-ca").contains("use verify-full"));
    }
}
