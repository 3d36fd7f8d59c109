//! Shared by the client's test files: servers come from the module's harness.
#![allow(dead_code)]

#[path = "../../../tests/common/mod.rs"]
pub mod common;

use std::time::Duration;

use tokio::time::Instant;
use warden_client::Warden;

pub use common::*;

pub fn url(s: &Server) -> String {
    format!("redis+unix://{}", s.socket().display())
}

pub fn warden(s: &Server) -> Warden {
    Warden::open(&url(s)).expect("client")
}

/// Waits (without blocking the runtime) until `cond` holds, up to `limit`.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Calls of a command so far, from `INFO commandstats` (`lock.extend`, ...).
pub fn calls(c: &mut redis::Connection, command: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Milliseconds since the Unix epoch on this machine's clock (the servers'
/// clock too: they run here), to compare with `PEXPIRETIME`.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A proxy on a unix socket in front of a server's socket, that can pause
/// both directions, delay the server's replies, or cut a connection right
/// after forwarding a request that contains given bytes.
pub struct Proxy {
    dir: tempfile::TempDir,
    state: std::sync::Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    paused: tokio::sync::watch::Sender<bool>,
    reply_delay: std::sync::Mutex<Duration>,
    cut_after: std::sync::Mutex<Option<Vec<u8>>>,
    pumps: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Proxy {
    /// Must be called inside a tokio runtime.
    pub fn start(upstream: &Server) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::UnixListener::bind(dir.path().join("proxy.sock")).unwrap();
        let state = std::sync::Arc::new(ProxyState::default());
        let target = upstream.socket();
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
                let up = tokio::spawn(pump(st.clone(), cr, sw, true, cut_tx, cut_rx.clone()));
                let (dummy, _) = tokio::sync::watch::channel(false);
                let down = tokio::spawn(pump(st.clone(), sr, cw, false, dummy, cut_rx));
                st.pumps.lock().unwrap().extend([up, down]);
            }
        });
        Proxy { dir, state, accept }
    }

    pub fn url(&self) -> String {
        format!(
            "redis+unix://{}",
            self.dir.path().join("proxy.sock").display()
        )
    }

    pub fn pause(&self) {
        self.state.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.state.paused.send_replace(false);
    }

    /// Every chunk from the server waits `delay` before it is passed on.
    pub fn delay_replies(&self, delay: Duration) {
        *self.state.reply_delay.lock().unwrap() = delay;
    }

    /// The next request containing `needle` reaches the server, then its
    /// connection is closed on both sides before any reply gets back.
    pub fn cut_after(&self, needle: &[u8]) {
        *self.state.cut_after.lock().unwrap() = Some(needle.to_vec());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for p in self.state.pumps.lock().unwrap().drain(..) {
            p.abort();
        }
    }
}

async fn pump(
    state: std::sync::Arc<ProxyState>,
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    upstream: bool,
    cut: tokio::sync::watch::Sender<bool>,
    mut cut_seen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            _ = cut_seen.wait_for(|c| *c) => return,
        };
        let mut paused = state.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
        if !upstream {
            let delay = *state.reply_delay.lock().unwrap();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        // The cut is decided before the request goes out, so no reply to it
        // can slip through on the other side.
        let hit = upstream && {
            let mut needle = state.cut_after.lock().unwrap();
            let hit = needle
                .as_ref()
                .is_some_and(|nd| buf[..n].windows(nd.len()).any(|w| w == nd.as_slice()));
            if hit {
                *needle = None;
                cut.send_replace(true);
            }
            hit
        };
        if !upstream && *cut_seen.borrow() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() || hit {
            // A graceful close (FIN after the data): the server reads and runs
            // the request before it sees the end. Dropping the socket instead
            // can reset it first, and the server may then never run it.
            let _ = to.shutdown().await;
            return;
        }
    }
}
