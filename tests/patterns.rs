//! Runs every Python example of docs/patterns.md, as written, each on a
//! fresh server started as `make run GRACE=0` starts it (the page says so).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

/// The ```python blocks of a markdown file, with the heading above each.
fn python_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line) {
            (None, l) if l.starts_with("## ") => heading = l.trim_start_matches("## ").to_string(),
            (None, "```python") => current = Some(String::new()),
            (Some(code), "```") => {
                blocks.push((heading.clone(), std::mem::take(code)));
                current = None;
            }
            (Some(code), l) => {
                code.push_str(l);
                code.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn every_pattern_in_the_guide_runs_as_written() {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/patterns.md"))
            .unwrap();
    assert!(
        doc.contains("<!-- server: make-run -->"),
        "the page names its server"
    );
    let blocks = python_blocks(&doc);
    assert_eq!(blocks.len(), 7, "one runnable example per pattern");
    for (heading, code) in blocks {
        let s = Server::start_tcp(&make_run_args());
        let out = Command::new(python())
            .arg("-c")
            .arg(&code)
            .env(
                "REDIS_URL",
                format!("redis://127.0.0.1:{}", s.port.unwrap()),
            )
            .output()
            .expect("run python");
        assert!(
            out.status.success(),
            "pattern '{heading}' failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
