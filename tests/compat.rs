//! Existing client libraries work unchanged: redis-py's `r.bf()` Bloom API.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

#[test]
fn redis_py_bloom_api_works_unchanged() {
    let s = Server::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/compat/redis_py_bloom.py");
    let out = Command::new(python())
        .arg(script)
        .arg(s.socket())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "redis-py script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
