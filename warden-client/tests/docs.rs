//! The README's and the examples' code is compiled and run by the tests
//! (doc comments' examples are doc-tests).

mod support;

use std::path::Path;
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
        .env("WARDEN_URL", url(s))
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

/// Lines without indentation and blank lines, for comparing code blocks.
fn lines(code: &str) -> Vec<String> {
    code.lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_readme_example_is_the_one_compiled_and_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).unwrap();
    let section = readme
        .split("\n## Rust client\n")
        .nth(1)
        .expect("a Rust client section")
        .split("\n## ")
        .next()
        .unwrap();
    let blocks: Vec<&str> = section
        .split("```rust\n")
        .skip(1)
        .map(|b| b.split("\n```").next().unwrap())
        .collect();
    assert!(!blocks.is_empty(), "the section shows code");
    let example = std::fs::read_to_string(root.join("examples/readme.rs")).unwrap();
    let compiled = example
        .split("// README begin\n")
        .nth(1)
        .unwrap()
        .split("// README end")
        .next()
        .unwrap();
    assert_eq!(
        lines(blocks[0]),
        lines(compiled),
        "README and examples/readme.rs differ"
    );
    for block in &blocks[1..] {
        let compiled = lines(&example);
        for line in lines(block) {
            assert!(
                compiled.contains(&line),
                "not in examples/readme.rs: {line}"
            );
        }
    }

    let s = Server::start(&[]);
    let stdout = run_example("readme", &s);
    assert!(stdout.contains("user:42:name = Ada #42"), "{stdout}");
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
