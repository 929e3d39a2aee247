//! TLS to PostgreSQL, against a real server that takes TLS connections
//! only (`hostnossl ... reject`, as managed services require), with a
//! certificate authority this test makes: the URL parameters users write
//! (`sslmode`, `sslrootcert`) decide, and every failure stops start-up
//! with a message that names the problem. `sslmode=prefer`, which needs a
//! server that also takes connections without TLS, has one of its own.

mod common;
#[path = "tls/prefer.rs"]
mod prefer;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::http::StatusCode;
use pglimit::pg_cluster::{Cluster, StopMode};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use serde_json::json;

/// A certificate authority: its certificate (PEM) and what signs with it.
struct Authority {
    pem: String,
    params: CertificateParams,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        let pem = params.clone().self_signed(&key).expect("CA certificate").pem();
        Self { pem, params, key }
    }

    /// A server certificate for `names` and its key, both PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.sign(CertificateParams::new(names).expect("server parameters"))
    }

    /// A client certificate for the role `user` (its common name) and its key.
    fn issue_client(&self, user: &str) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        params.distinguished_name.push(DnType::CommonName, user);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> (String, String) {
        let key = KeyPair::generate().expect("server key");
        let issuer = self.params.clone().self_signed(&self.key).expect("issuer");
        (params.signed_by(&key, &issuer, &self.key).expect("server certificate").pem(), key.serialize_pem())
    }
}

/// The server, its CA's certificate file, and another CA's (which signed nothing it shows).
struct TlsServer {
    cluster: Cluster,
    ca: PathBuf,
    stranger: PathBuf,
    /// A certificate and key for the role `CERT_USER`.
    client: (PathBuf, PathBuf),
    _certs: common::process::TempDir,
}

/// One TLS-only server for every test here, its certificate naming
/// `localhost` only, so that `127.0.0.1` is a name mismatch.
fn server() -> &'static TlsServer {
    static SERVER: OnceLock<TlsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let cluster = Cluster::throwaway().expect("a test PostgreSQL");
        let dir = cluster.data_dir().to_owned();
        let authority = Authority::new("pglimit test CA");
        let (cert, key) = authority.issue(&["localhost"]);
        let owner = std::fs::metadata(&dir).expect("the data directory");
        for (name, text) in [("server.crt", &cert), ("server.key", &key)] {
            write_private(&dir.join(name), text, &owner);
        }
        write_private(&dir.join("root.crt"), &authority.pem, &owner);
        let conf =
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n";
        append(&dir.join("postgresql.conf"), conf);
        let hba = std::fs::read_to_string(dir.join("pg_hba.conf")).expect("pg_hba.conf");
        let first = format!("hostnossl all all all reject\nhostssl all {CERT_USER} all cert\n");
        std::fs::write(dir.join("pg_hba.conf"), format!("{first}{hba}")).expect("pg_hba");
        cluster.stop(StopMode::Fast).expect("stop");
        cluster.restart().expect("restart with TLS");
        let certs = common::process::temp_dir("tls-certs");
        let (ca, stranger) = (certs.join("ca.crt"), certs.join("stranger.crt"));
        std::fs::write(&ca, &authority.pem).expect("ca.crt");
        std::fs::write(&stranger, Authority::new("someone else's CA").pem).expect("stranger.crt");
        let (cert, key) = authority.issue_client(CERT_USER);
        let client = (certs.join("client.crt"), certs.join("client.key"));
        std::fs::write(&client.0, cert).expect("client.crt");
        std::fs::write(&client.1, key).expect("client.key");
        // A client key others may read is refused, as libpq refuses it.
        chmod(&client.1, 0o600);
        TlsServer { cluster, ca, stranger, client, _certs: certs }
    })
}

/// A role that logs in with a client certificate and no password.
const CERT_USER: &str = "pglimit_cert";

/// PostgreSQL reads its key only if the server's account owns it, 0600.
fn write_private(path: &Path, text: &str, owner: &std::fs::Metadata) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid())).expect("chown");
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).expect("open");
    file.write_all(text.as_bytes()).expect("append");
}

/// The server's URL with `host` and these query parameters.
fn url(host: &str, query: &str) -> String {
    let url = server().cluster.url().replace("@127.0.0.1:", &format!("@{host}:"));
    format!("{url}?{query}")
}

async fn start(url: &str) -> Result<pglimit::AppState, String> {
    common::try_instance(url, &[]).await
}

fn ca_query(mode: &str, ca: &Path) -> String {
    format!("sslmode={mode}&sslrootcert={}", ca.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_ca_serves_checks_over_tls_on_every_connection() {
    let url = url("localhost", &ca_query("verify-full", &server().ca));
    let service = start(&url).await.expect("starts over verified TLS");
    let reply = common::check(&service, json!({ "key": "tls", "limit": 2, "window": "1m" })).await;
    assert_eq!(
        (reply.status, reply.body["store"].as_str()),
        (StatusCode::OK, Some("postgres")),
        "{}",
        reply.body
    );
    let pool = sqlx::PgPool::connect(&url).await.expect("an admin connection over TLS");
    // Sessions that logged in: from PostgreSQL 18 on, a connection still
    // being refused (another test's sslmode=disable) is listed too, with no role yet.
    let (plain, tls): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.backend_type = 'client backend' AND a.usename IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .expect("pg_stat_ssl");
    assert_eq!(plain, 0, "no connection without TLS");
    assert!(tls >= 3, "the pool, the kept connections and this one: {tls}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_encrypts_without_verifying_as_libpq_does() {
    let service = start(&url("127.0.0.1", "sslmode=require")).await.expect("starts encrypted");
    let reply = common::check(&service, json!({ "key": "tls-require", "limit": 2, "window": "1m" })).await;
    assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
}

#[tokio::test]
async fn verify_ca_is_refused_at_start_up_pointing_at_verify_full() {
    let error = start(&url("127.0.0.1", &ca_query("verify-ca", &server().ca))).await.err().expect("refused");
    assert!(error.contains("use verify-full"), "{error}");
}

#[tokio::test]
async fn a_certificate_from_another_authority_stops_start_up_naming_it() {
    let error = start(&url("localhost", &ca_query("verify-full", &server().stranger))).await.err();
    let error = error.expect("refused");
    assert!(error.contains("TLS") && error.contains("UnknownIssuer"), "{error}");
    assert!(error.contains("sslrootcert"), "says what to check: {error}");
}

#[tokio::test]
async fn a_name_the_certificate_does_not_carry_stops_start_up_naming_it() {
    let error =
        start(&url("127.0.0.1", &ca_query("verify-full", &server().ca))).await.err().expect("refused");
    assert!(error.contains("TLS") && error.contains("not valid for name \"127.0.0.1\""), "{error}");
}

#[tokio::test]
async fn a_server_that_takes_only_tls_refuses_sslmode_disable_and_says_so() {
    let error = start(&url("localhost", "sslmode=disable")).await.err().expect("refused");
    assert!(error.contains("no encryption"), "{error}");
}

#[tokio::test]
async fn a_wrong_sslmode_or_a_missing_certificate_file_stops_start_up_naming_it() {
    let error = start(&url("localhost", "sslmode=sometimes")).await.err().expect("refused");
    assert!(error.contains("DATABASE_URL") && error.contains("sslmode"), "{error}");
    let missing = Path::new("/nonexistent/ca.crt");
    let error = start(&url("localhost", &ca_query("verify-full", missing))).await.err().expect("refused");
    assert!(error.contains("sslrootcert: cannot read /nonexistent/ca.crt"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_logs_in_a_role_without_a_password() {
    let admin = sqlx::PgPool::connect(&url("localhost", "sslmode=require")).await.expect("admin");
    sqlx::query(&format!("CREATE ROLE {CERT_USER} LOGIN")).execute(&admin).await.expect("role");
    sqlx::query(&format!("CREATE DATABASE certs OWNER {CERT_USER}")).execute(&admin).await.expect("database");
    let (cert, key) = &server().client;
    let port = server().cluster.port();
    let url = format!(
        "postgres://{CERT_USER}@localhost:{port}/certs?{}&sslcert={}&sslkey={}",
        ca_query("verify-full", &server().ca),
        cert.display(),
        key.display()
    );
    let service = start(&url).await.expect("starts with a client certificate");
    let reply = common::check(&service, json!({ "key": "tls-cert", "limit": 2, "window": "1m" })).await;
    assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
    let without = url.split("&sslcert").next().expect("the URL").to_owned();
    let error = start(&without).await.err().expect("no certificate, no login");
    assert!(error.contains("certificate"), "{error}");
}

#[tokio::test]
async fn require_with_an_sslrootcert_of_another_authority_stops_start_up_naming_sslrootcert() {
    let error = start(&url("localhost", &ca_query("require", &server().stranger))).await.err();
    let error = error.expect("refused, as libpq checks the CA under require once it has one");
    assert!(error.contains("UnknownIssuer") && error.contains("sslrootcert"), "{error}");
    start(&url("localhost", &ca_query("require", &server().ca))).await.expect("the server's own CA passes");
}

#[tokio::test]
async fn require_with_sslrootcert_and_a_name_the_certificate_lacks_is_refused_as_stricter_than_libpq() {
    let error = start(&url("127.0.0.1", &ca_query("require", &server().ca))).await.err().expect("refused");
    assert!(error.contains("not valid for name \"127.0.0.1\""), "{error}");
    let said = "sslmode=require with sslrootcert is checked here as verify-full, stricter than libpq";
    assert!(error.contains(said), "{error}");
}

#[tokio::test]
async fn require_with_sslrootcert_system_is_refused_naming_sslmode_and_sslrootcert() {
    let error = start(&url("localhost", "sslmode=require&sslrootcert=system")).await.err().expect("refused");
    assert!(
        error.contains("DATABASE_URL's sslrootcert is system, which needs sslmode=verify-full"),
        "{error}"
    );
    assert!(error.contains("DATABASE_URL's sslmode is require"), "{error}");
}

#[tokio::test]
async fn an_sslkey_that_group_or_others_may_read_stops_start_up_naming_the_file() {
    let (cert, key) = &server().client;
    // 0640 passes only when root owns the key: give it to the server's (non-root) account.
    let user = std::fs::metadata(server().cluster.data_dir()).expect("the data directory").uid();
    for (mode, owner) in [(0o644, None), (0o640, Some(user))] {
        let exposed = key.with_extension(format!("{mode:o}.key"));
        std::fs::copy(key, &exposed).expect("a copy of the key");
        chmod(&exposed, mode);
        std::os::unix::fs::chown(&exposed, owner, None).expect("chown");
        let query = format!(
            "{}&sslcert={}&sslkey={}",
            ca_query("verify-full", &server().ca),
            cert.display(),
            exposed.display()
        );
        let error = start(&url("localhost", &query)).await.err().expect("refused");
        let named = format!(
            "DATABASE_URL's sslkey: {} has group or others access (mode 0{mode:o})",
            exposed.display()
        );
        assert!(error.contains(&named), "{error}");
    }
}
