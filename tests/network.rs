//! The network path to PostgreSQL cut, black-holed and slowed, by a small
//! TCP proxy between the service and a real PostgreSQL.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{check, degraded, unique, wait_for_postgres};
use pglimit::pg_cluster::Cluster;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const PASS: u8 = 0;
/// Connections stay open but no byte gets through, either way.
const BLACK_HOLE: u8 = 1;
/// Every connection is closed, new ones at once.
const CUT: u8 = 2;

#[derive(Clone)]
struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
    pumps: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = Proxy {
            addr: listener.local_addr().expect("addr"),
            mode: Arc::new(AtomicU8::new(PASS)),
            delay_ms: Arc::new(AtomicU64::new(0)),
            pumps: Arc::new(Mutex::new(Vec::new())),
        };
        let this = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if this.mode.load(Ordering::Acquire) == CUT {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(upstream).await else { continue };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let up = tokio::spawn(this.clone().pump(client_read, server_write));
                let down = tokio::spawn(this.clone().pump(server_read, client_write));
                this.pumps.lock().unwrap().extend([up, down]);
            }
        });
        proxy
    }

    async fn pump(self, mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf) {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                return;
            }
            while self.mode.load(Ordering::Acquire) == BLACK_HOLE {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let delay = self.delay_ms.load(Ordering::Acquire);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::Release);
        if mode == CUT {
            for pump in self.pumps.lock().unwrap().drain(..) {
                pump.abort(); // both sockets close
            }
        }
    }
}

/// A cluster, a database on it, and a proxy in front of it.
async fn setup() -> (Cluster, Proxy, String) {
    let cluster = tokio::task::spawn_blocking(|| Cluster::throwaway().expect("cluster")).await.unwrap();
    let direct = common::create_database(&cluster.url()).await;
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], cluster.port()))).await;
    let via_proxy = direct.replace(&format!(":{}/", cluster.port()), &format!(":{}/", proxy.addr.port()));
    (cluster, proxy, via_proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_path_is_detected_by_timeout_and_every_answer_stays_bounded() {
    let (_cluster, proxy, url) = setup().await;
    let app = common::instance(&url, &[("PGLIMIT_DB_TIMEOUT_MS", "200")]).await;
    let key = unique("held");
    let held = json!({ "key": key, "limit": 3, "window": "1h" });
    assert_eq!(check(&app, held.clone()).await.body["store"], "postgres");

    proxy.set(BLACK_HOLE);
    let started = Instant::now();
    let reply = check(&app, json!({ "key": unique("a"), "limit": 5, "window": "1m" })).await;
    let first = started.elapsed();
    reply.assert_memory_admits();
    // The timeout, then a ping on a fresh connection with the same budget.
    assert!(first < Duration::from_secs(2), "the first check took {first:?}");
    let started = Instant::now();
    for _ in 0..50 {
        check(&app, json!({ "key": unique("b"), "limit": 5, "window": "1m" })).await.assert_memory_admits();
    }
    assert!(started.elapsed() < Duration::from_secs(2), "degraded checks wait for nothing");

    proxy.set(PASS);
    wait_for_postgres(&app, Duration::from_secs(20)).await;
    // The count stored before the black hole is still in force: Postgres
    // admits the second of 3, with 1 left.
    let reply = check(&app, held.clone()).await;
    assert_eq!(
        (reply.status, reply.body["store"].as_str()),
        (StatusCode::OK, Some("postgres")),
        "{}",
        reply.body
    );
    assert_eq!(reply.body["remaining"], 1, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_path_falls_back_at_once_and_recovers() {
    let (_cluster, proxy, url) = setup().await;
    let app = common::instance(&url, &[]).await;
    assert_eq!(
        check(&app, json!({ "key": unique("w"), "limit": 5, "window": "1m" })).await.body["store"],
        "postgres"
    );

    proxy.set(CUT);
    let started = Instant::now();
    for _ in 0..20 {
        check(&app, json!({ "key": unique("c"), "limit": 5, "window": "1m" })).await.assert_memory_admits();
    }
    assert!(started.elapsed() < Duration::from_secs(2), "a refused connection is an outage at once");
    proxy.set(PASS);
    // Recovered: a check is answered by Postgres again, not only the flag cleared.
    wait_for_postgres(&app, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_path_within_the_timeout_stays_on_postgres_and_exact() {
    let (_cluster, proxy, url) = setup().await;
    let app = common::instance(&url, &[]).await;
    proxy.delay_ms.store(60, Ordering::Release);
    let key = unique("slow");
    // In sequence on one key: exactly the first 5 admitted, the 3 after denied.
    for n in 1..=8 {
        let reply = check(&app, json!({ "key": key, "limit": 5, "window": "1h" })).await;
        assert_eq!(reply.body["store"], "postgres", "{}", reply.body);
        let expected = if n <= 5 { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
        assert_eq!(reply.status, expected, "check {n}: {}", reply.body);
    }
    assert!(!degraded(&app).await);
}
