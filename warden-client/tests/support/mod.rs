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
