//! `pglimit healthcheck`: `GET /healthz` on the service's own address, so
//! that a container's `HEALTHCHECK` needs neither a shell nor curl in the
//! image (the runtime image has neither).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest answer head read: `/healthz` answers a few dozen bytes.
const MAX_ANSWER: u64 = 4096;

/// Whether the service bound to `bind` answers `/healthz` with 200 within
/// `within`; the error says what went wrong instead.
pub async fn healthz(bind: SocketAddr, within: Duration) -> Result<(), String> {
    let addr = reachable(bind);
    match tokio::time::timeout(within, ask(addr)).await {
        Ok(Ok(status)) if status == "200" => Ok(()),
        Ok(Ok(status)) => Err(format!("http://{addr}/healthz answered {status}")),
        Ok(Err(e)) => Err(format!("http://{addr}/healthz: {e}")),
        Err(_) => Err(format!("http://{addr}/healthz did not answer within {within:?}")),
    }
}

/// A wildcard bind (0.0.0.0, ::) is reached on the loopback address of its family.
fn reachable(bind: SocketAddr) -> SocketAddr {
    match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), bind.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), bind.port()),
        _ => bind,
    }
}

/// The status code of the answer to `GET /healthz`.
async fn ask(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER).read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or("nothing").to_owned();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_bind_is_probed_on_loopback() {
        assert_eq!(reachable("0.0.0.0:8080".parse().unwrap()).to_string(), "127.0.0.1:8080");
        assert_eq!(reachable("[::]:8080".parse().unwrap()).to_string(), "[::1]:8080");
        assert_eq!(reachable("10.0.0.5:80".parse().unwrap()).to_string(), "10.0.0.5:80");
    }

    #[tokio::test]
    async fn nothing_listening_is_an_error_naming_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = healthz(addr, Duration::from_secs(5)).await.unwrap_err();
        assert!(error.contains(&addr.to_string()), "{error}");
    }
}
