//! The application behind a proxy: a tiny HTTP server on loopback that
//! answers every path with the protected page and keeps the headers of each
//! request it served, so that a test can see what the proxy passed on.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, Uri};

/// The body of every page the backend serves.
pub const PAGE: &str = "welcome\n";

/// A running backend; stopped when dropped.
pub struct Backend {
    pub addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<(String, HeaderMap)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a backend in the test's runtime.
pub async fn start() -> Backend {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the backend");
    let addr = listener.local_addr().expect("its address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let recorded = recorded.clone();
        async move {
            recorded.lock().expect("the backend's record").push((uri.path().to_owned(), headers));
            PAGE
        }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Backend { addr, seen, task }
}

impl Backend {
    /// `host:port`, as a proxy's configuration names an upstream.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// The headers of every request for `path` served so far, oldest first.
    pub fn requests_to(&self, path: &str) -> Vec<HeaderMap> {
        let seen = self.seen.lock().expect("the backend's record");
        seen.iter().filter(|(p, _)| p == path).map(|(_, headers)| headers.clone()).collect()
    }
}
