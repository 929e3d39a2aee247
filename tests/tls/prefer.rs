//! `sslmode=prefer` decides for each connection: against a server whose
//! TLS a reload breaks and mends, pglimit's connections go without TLS
//! while handshakes fail and with it again once they work.

use pglimit::pg_cluster::Cluster;
use serde_json::json;

use super::{start, write_private, Authority};

/// The TLS settings that make every handshake with rustls fail: TLS 1.2 at
/// most, and only a CBC suite, which rustls does not offer.
const UNSHAKABLE: [(&str, &str); 2] =
    [("ssl_max_protocol_version", "TLSv1.2"), ("ssl_ciphers", "ECDHE-ECDSA-AES128-SHA")];

/// A server that takes connections with or without TLS, its TLS set by
/// `ALTER SYSTEM` so that a reload changes it between two connections;
/// and an admin connection to it, without TLS.
async fn fickle_server() -> (Cluster, sqlx::PgConnection) {
    use sqlx::Connection;
    let cluster = Cluster::throwaway().expect("a test PostgreSQL");
    let dir = cluster.data_dir().to_owned();
    let owner = std::fs::metadata(&dir).expect("the data directory");
    let (cert, key) = Authority::new("pglimit fickle CA").issue(&["localhost"]);
    write_private(&dir.join("server.crt"), &cert, &owner);
    write_private(&dir.join("server.key"), &key, &owner);
    let url = format!("{}?sslmode=disable", cluster.url());
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("an admin connection");
    for (name, value) in [("ssl", "on"), ("ssl_cert_file", "server.crt"), ("ssl_key_file", "server.key")] {
        alter(&mut admin, &format!("SET {name} = '{value}'")).await;
    }
    (cluster, admin)
}

/// `ALTER SYSTEM` one setting (it cannot share a transaction) and reload.
async fn alter(admin: &mut sqlx::PgConnection, change: &str) {
    use sqlx::Executor;
    admin.execute(&*format!("ALTER SYSTEM {change}")).await.expect("ALTER SYSTEM");
    admin.execute("SELECT pg_reload_conf()").await.expect("reload");
}

/// Waits until a new connection's handshake with rustls succeeds or fails, as `works` says.
async fn until_handshake(cluster: &Cluster, works: bool) {
    use sqlx::Connection;
    let url = format!("{}?sslmode=require", cluster.url());
    for _ in 0..100 {
        if sqlx::PgConnection::connect(&url).await.is_ok() == works {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the reload did not make handshakes {}", if works { "work" } else { "fail" });
}

/// pglimit's sessions, its listener's included, without TLS and with.
async fn sessions(admin: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.backend_type = 'client backend' AND a.usename IS NOT NULL
           AND a.pid <> pg_backend_pid()",
    )
    .fetch_one(admin)
    .await
    .expect("pg_stat_ssl")
}

/// Waits until the listener is back (it retries every second after a
/// loss), so that `sessions` counts it.
async fn until_listening(admin: &mut sqlx::PgConnection) {
    for _ in 0..100 {
        let listening: (i64,) =
            sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'listen%'")
                .fetch_one(&mut *admin)
                .await
                .expect("pg_stat_activity");
        if listening.0 >= 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the actions listener did not come back within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_does_not_stay_plaintext_after_one_failed_handshake() {
    let (cluster, mut admin) = fickle_server().await;
    for (name, value) in UNSHAKABLE {
        alter(&mut admin, &format!("SET {name} = '{value}'")).await;
    }
    until_handshake(&cluster, false).await;
    let service = start(&format!("{}?sslmode=prefer", cluster.url())).await.expect("starts without TLS");
    let body = json!({ "key": "tls-prefer", "limit": 1000, "window": "1h" });
    assert_eq!(crate::common::check(&service, body.clone()).await.body["store"], "postgres");
    until_listening(&mut admin).await;
    let (plain, tls) = sessions(&mut admin).await;
    assert!(plain >= 2 && tls == 0, "every handshake failed, the listener's too: {plain} plain, {tls} TLS");
    for (name, _) in UNSHAKABLE {
        alter(&mut admin, &format!("RESET {name}")).await;
    }
    until_handshake(&cluster, true).await;
    let ended: (i64,) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut admin)
    .await
    .expect("terminate");
    assert!(ended.0 >= 1, "pglimit's connections were ended");
    for n in 0..20 {
        assert_eq!(crate::common::check(&service, body.clone()).await.body["store"], "postgres", "check {n}");
    }
    until_listening(&mut admin).await;
    let (plain, tls) = sessions(&mut admin).await;
    assert!(
        plain == 0 && tls >= 2,
        "new connections, the listener's too, try TLS again: {plain} plain, {tls} TLS"
    );
}
