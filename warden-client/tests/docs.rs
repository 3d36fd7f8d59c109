//! The examples are compiled and run by the tests (doc comments' examples
//! are doc-tests; the README's examples, examples/readme.rs and
//! examples/redis_rs.rs among them, are checked and run by the module's
//! tests/readme.rs).

mod support;

use std::process::Command;

use support::*;

/// Runs an example binary (cargo test builds them beside the test binaries).
fn run_example(name: &str, s: &Server) -> String {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    let out = Command::new(&example)
        .env("REDIS_URL", url(s))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", example.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_quickstart_example_runs() {
    let s = Server::start(&[]);
    let stdout = run_example("quickstart", &s);
    assert!(stdout.contains("user:42:name = Ada"), "{stdout}");
    let mut c = s.conn();
    assert_eq!(
        redis::cmd("GET")
            .arg("user:42:name")
            .query::<String>(&mut c)
            .unwrap(),
        "Ada"
    );
}
