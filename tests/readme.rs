//! Runs the examples of the README and of every page under `docs/` as
//! written, in page order, each page on a server of its own (each example
//! keeps to keys of its own, so a reader can try them one after the other).
//!
//! A page names the server its examples run on with `<!-- server: NAME -->`:
//! `make-run` is redis-server with `redis.conf.example` as `make run GRACE=0`
//! starts it (its settings, `warden.max-lease 30000` among them, with
//! `warden.grace 0`); a page without one runs on the module's defaults. The
//! README runs on `make-run`.
//!
//! A code block runs when an HTML comment names how, on the line above its
//! fence:
//!
//! - `<!-- test: redis-cli -->` a transcript: every `127.0.0.1:6379> ` line is
//!   sent through redis-cli and answered as the page shows (numbers of four
//!   digits or more — tokens, ttls — stand for any number, and a later
//!   command that repeats one gets the number the server gave);
//! - `<!-- test: python -->`, `<!-- test: node -->` a program, run with
//!   `REDIS_URL` naming the server (node-redis and ioredis from `target/node`,
//!   which `make node-deps` installs);
//! - `<!-- test: sh -->` a shell script, where `redis-cli` talks to the server;
//!   `<!-- test: sh server=redisbloom -->` runs it beside RedisBloom alone,
//!   with one key of each RedisBloom type;
//! - `<!-- test: rust example=PATH -->` the region of the example file PATH
//!   between `// README begin` and `// README end`, which must equal the
//!   block; the example (built by `cargo test --workspace`) is run;
//! - `<!-- test: install -->` the Install section's lines, which need the
//!   release artefacts: `make dist-test` runs them (scripts/dist-test.py).
//!
//! A block followed by `<!-- output -->` and a fenced block must print that
//! (with the same rule for numbers). Every `python`, `js` and `rust` block of
//! every page is either run or marked `<!-- not run: why -->`, and every page
//! with marked blocks is run by a test below.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// One marked block of a page.
#[derive(Debug)]
struct Example {
    /// The page (`README.md`, `docs/locks.md`), for messages.
    page: String,
    /// The line of its fence, for messages.
    line: usize,
    kind: String,
    options: HashMap<String, String>,
    code: String,
    output: Option<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    page_text("README.md")
}

fn page_text(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

/// README.md and every page under docs/, as paths from the repository's root.
fn pages() -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root()).unwrap();
                found.push(rel.to_str().unwrap().to_string());
            }
        }
    }
    let mut found = vec!["README.md".to_string()];
    walk(&root().join("docs"), &mut found);
    found.sort();
    found
}

/// The server a page's examples run on: `<!-- server: NAME -->`, if any.
fn page_server(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| marker(l, "server"))
        .map(str::to_string)
}

/// The marker comment `<!-- NAME: REST -->` on a line, if it is one.
fn marker<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix(name)?
        .strip_prefix(':')
        .map(str::trim)
}

/// The fenced block that opens at `lines[i]` (indented too, inside a list
/// item): its language, its body without the fence's indentation and the
/// index of the line after its closing fence.
fn fenced(lines: &[&str], i: usize) -> Option<(String, String, usize)> {
    let line = lines.get(i)?;
    let indent = line.len() - line.trim_start().len();
    let lang = line.trim_start().strip_prefix("```")?.trim().to_string();
    let mut body = String::new();
    for (j, line) in lines.iter().enumerate().skip(i + 1) {
        if line.trim() == "```" {
            return Some((lang, body, j + 1));
        }
        let cut = (line.len() - line.trim_start().len()).min(indent);
        body.push_str(&line[cut..]);
        body.push('\n');
    }
    panic!("line {}: a fence that never closes", i + 1);
}

/// Every marked block, in page order.
fn examples(page: &str, markdown: &str) -> Vec<Example> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(spec) = marker(lines[i], "test") else {
            i += 1;
            continue;
        };
        let mut words = spec.split_whitespace();
        let kind = words
            .next()
            .expect("a test marker names a kind")
            .to_string();
        let options = words
            .map(|w| {
                let (k, v) = w.split_once('=').expect("options are key=value");
                (k.to_string(), v.to_string())
            })
            .collect();
        let (_, code, after) = fenced(&lines, i + 1)
            .unwrap_or_else(|| panic!("{page} line {}: a marker without a block", i + 1));
        let mut output = None;
        let mut next = after;
        while lines.get(next).is_some_and(|l| l.trim().is_empty()) {
            next += 1;
        }
        if lines
            .get(next)
            .is_some_and(|l| l.trim() == "<!-- output -->")
        {
            let (_, text, end) = fenced(&lines, next + 1)
                .unwrap_or_else(|| panic!("{page} line {}: output without a block", next + 1));
            output = Some(text);
            next = end;
        } else {
            next = after;
        }
        found.push(Example {
            page: page.to_string(),
            line: i + 2,
            kind,
            options,
            code,
            output,
        });
        i = next;
    }
    found
}

/// A line's words with every number of four digits or more made `#`.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    for c in line.chars().chain(std::iter::once('\n')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            out.push_str(if digits.len() >= 4 { "#" } else { &digits });
            digits.clear();
        }
        if c != '\n' {
            out.push(c);
        }
    }
    out.trim().to_string()
}

/// The lines of `text` that are not blank, shaped, without `# ...` comments.
fn shaped_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split("  #").next().unwrap())
        .map(shape)
        .filter(|l| !l.is_empty())
        .collect()
}

fn check_output(example: &Example, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} line {}: the {} example failed ({}):\n{stdout}\n{}",
        example.page,
        example.line,
        example.kind,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(expected) = &example.output {
        assert_eq!(
            shaped_lines(&stdout),
            shaped_lines(expected),
            "{} line {}: the {} example printed\n{stdout}",
            example.page,
            example.line,
            example.kind
        );
    }
}

/// Runs `command` with a deadline: an example that hangs fails.
fn finish(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{command:?} still ran after {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn url(s: &Server) -> String {
    format!("redis://127.0.0.1:{}", s.port.expect("a TCP port"))
}

fn run_python(example: &Example, s: &Server) {
    let mut command = Command::new(python());
    command
        .arg("-c")
        .arg(&example.code)
        .env("REDIS_URL", url(s));
    check_output(example, &finish(command, Duration::from_secs(60)));
}

/// `target/node`, with node-redis and ioredis installed by `make node-deps`;
/// fails (never skips) when node or the libraries are missing.
fn node_dir() -> PathBuf {
    let version = Command::new("node").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "node is not installed: `make test` (make node-deps) installs nodejs and npm, \
         or install Node.js 18.19 or later yourself"
    );
    let dir =
        std::env::var("WARDEN_NODE_DIR").map_or_else(|_| root().join("target/node"), PathBuf::from);
    for library in ["redis", "ioredis"] {
        assert!(
            dir.join("node_modules").join(library).exists(),
            "{library} is not installed in {}: run `make node-deps`",
            dir.display()
        );
    }
    dir
}

fn run_node(example: &Example, s: &Server) {
    let dir = node_dir();
    // In the directory of node_modules, so that `import "redis"` finds it.
    let file = dir.join(format!(
        "{}-line-{}.mjs",
        example.page.replace(['/', '.'], "-"),
        example.line
    ));
    std::fs::write(&file, &example.code).unwrap();
    let mut command = Command::new("node");
    command.arg(&file).env("REDIS_URL", url(s));
    let out = finish(command, Duration::from_secs(60));
    let _ = std::fs::remove_file(&file);
    check_output(example, &out);
}

/// A shell prelude that points `redis-cli` at the server's socket.
fn shell(socket: &Path, code: &str) -> Command {
    let mut command = Command::new("bash");
    command.arg("-euo").arg("pipefail").arg("-c").arg(format!(
        "redis-cli() {{ command redis-cli -s '{}' \"$@\"; }}\n{code}",
        socket.display()
    ));
    command
}

/// RedisBloom's five types, one key each, as the migration checklist
/// (docs/migrating.md) shows them.
const REDISBLOOM_KEYS: [(&str, &[&str]); 5] = [
    ("users", &["BF.ADD", "users", "alice"]),
    ("seen:cuckoo", &["CF.ADD", "seen:cuckoo", "alice"]),
    ("clicks:cms", &["CMS.INITBYDIM", "clicks:cms", "100", "5"]),
    ("top:searches", &["TOPK.RESERVE", "top:searches", "10"]),
    ("latency:digest", &["TDIGEST.CREATE", "latency:digest"]),
];

fn redisbloom_server() -> Plain {
    let mut rb = Plain::start(&[module(redisbloom(), &[])]);
    let mut c = rb.conn();
    for (_, words) in REDISBLOOM_KEYS {
        run(&mut c, words).unwrap();
    }
    rb
}

/// The keys a checklist's first step lists (the second word of each line).
fn listed_keys(socket: &Path, step: &Example) -> Vec<String> {
    let out = finish(shell(socket, &step.code), Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect()
}

fn step_on(server: &str) -> Example {
    examples_of("sh")
        .into_iter()
        .find(|e| e.options.get("server").is_some_and(|s| s == server))
        .unwrap_or_else(|| panic!("a checklist step run with server={server}"))
}

/// A shell example: on `s`, or on the server its `server=` option names.
fn run_sh(example: &Example, s: &Server) {
    let out = match example.options.get("server").map(String::as_str) {
        None => finish(shell(&s.socket(), &example.code), Duration::from_secs(60)),
        Some("redisbloom") => {
            let rb = redisbloom_server();
            let socket = rb.dir.path().join("redis.sock");
            finish(shell(&socket, &example.code), Duration::from_secs(60))
        }
        Some(other) => panic!("{} line {}: no server {other}", example.page, example.line),
    };
    check_output(example, &out);
}

/// Replaces whole numbers of `line` by the ones the server gave for them.
fn substitute(line: &str, seen: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    for c in line.chars().chain(std::iter::once('\n')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            out.push_str(seen.get(&digits).unwrap_or(&digits));
            digits.clear();
        }
        if c != '\n' {
            out.push(c);
        }
    }
    out
}

/// The numbers of four digits or more in `line`, in order.
fn big_numbers(line: &str) -> Vec<String> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|n| n.len() >= 4)
        .map(str::to_string)
        .collect()
}

/// A redis-cli command line as redis-cli splits it: words, and double-quoted
/// strings with backslash escapes.
fn split_command(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => word.extend(chars.next()),
                    c => word.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        words.push(word);
    }
    words
}

/// A reply as redis-cli prints it (RESP2).
fn cli_lines(value: &redis::Value) -> Vec<String> {
    use redis::Value;
    match value {
        Value::Nil => vec!["(nil)".into()],
        Value::Int(n) => vec![format!("(integer) {n}")],
        Value::BulkString(b) => vec![format!("{:?}", String::from_utf8_lossy(b))],
        Value::SimpleString(s) => vec![s.clone()],
        Value::Okay => vec!["OK".into()],
        Value::Array(items) if items.is_empty() => vec!["(empty array)".into()],
        Value::Array(items) => {
            let width = items.len().to_string().len();
            let mut lines = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let prefix = format!("{:>width$}) ", i + 1);
                for (j, line) in cli_lines(item).into_iter().enumerate() {
                    let lead = if j == 0 {
                        prefix.clone()
                    } else {
                        " ".repeat(prefix.len())
                    };
                    lines.push(format!("{lead}{line}"));
                }
            }
            lines
        }
        other => panic!("a reply redis-cli would print otherwise: {other:?}"),
    }
}

/// Runs a redis-cli transcript on a connection of its own, as one redis-cli
/// session.
fn run_transcript(example: &Example, s: &Server) {
    const PROMPT: &str = "127.0.0.1:6379> ";
    let mut c = s.conn();
    // (command, the answer the page shows)
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in example.code.lines() {
        if let Some(cmd) = line.strip_prefix(PROMPT) {
            steps.push((cmd.to_string(), Vec::new()));
        } else if let Some((_, answer)) = steps.last_mut() {
            let text = line.split("  #").next().unwrap().trim_end();
            if !text.trim().is_empty() {
                answer.push(text.to_string());
            }
        }
    }
    assert!(
        !steps.is_empty(),
        "{} line {}: no commands",
        example.page,
        example.line
    );
    let mut seen = HashMap::new();
    for (cmd, expected) in steps {
        let cmd = substitute(&cmd, &seen);
        let words = split_command(&cmd);
        let actual = match redis::cmd(&words[0])
            .arg(&words[1..])
            .query::<redis::Value>(&mut c)
        {
            Ok(v) => cli_lines(&v),
            Err(e) => vec![format!("(error) {}", error_text(&e))],
        };
        assert_eq!(
            actual.iter().map(|l| shape(l)).collect::<Vec<_>>(),
            expected.iter().map(|l| shape(l)).collect::<Vec<_>>(),
            "{} line {}: `{cmd}` answered\n{}",
            example.page,
            example.line,
            actual.join("\n")
        );
        for (e, a) in expected.iter().zip(&actual) {
            for (from, to) in big_numbers(e).into_iter().zip(big_numbers(a)) {
                seen.insert(from, to);
            }
        }
    }
}

/// Lines without indentation and blank lines, for comparing code.
fn code_lines(code: &str) -> Vec<String> {
    code.lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn run_rust(example: &Example, s: &Server) {
    let path = example.options.get("example").unwrap_or_else(|| {
        panic!(
            "{} line {}: rust needs example=PATH",
            example.page, example.line
        )
    });
    let source_path = root().join(path);
    let source = std::fs::read_to_string(&source_path)
        .unwrap_or_else(|e| panic!("{}: {e}", source_path.display()));
    let region = source
        .split("// README begin\n")
        .nth(1)
        .and_then(|rest| rest.split("// README end").next())
        .unwrap_or_else(|| panic!("{path}: no // README begin ... // README end region"));
    assert_eq!(
        code_lines(&example.code),
        code_lines(region),
        "{} line {} and {path} differ",
        example.page,
        example.line
    );
    // cargo test --workspace builds the workspace's examples beside the test binaries.
    let name = Path::new(path).file_stem().unwrap().to_str().unwrap();
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is not built: run `cargo test --release --workspace --no-run` (make test does)",
                binary.display()
            )
        });
    let changed = std::fs::metadata(&source_path).unwrap().modified().unwrap();
    assert!(
        built >= changed,
        "{} is older than {path}: run `cargo test --release --workspace --no-run`",
        binary.display()
    );
    let mut command = Command::new(&binary);
    command.env("REDIS_URL", format!("{}/", url(s)));
    check_output(example, &finish(command, Duration::from_secs(60)));
}

/// The marked blocks of `kind` on every page.
fn examples_of(kind: &str) -> Vec<Example> {
    pages()
        .into_iter()
        .flat_map(|p| examples(&p, &page_text(&p)))
        .filter(|e| e.kind == kind)
        .collect()
}

/// The languages of the blocks that must be run or say why not.
const PROGRAMS: [&str; 8] = [
    "python",
    "js",
    "javascript",
    "ts",
    "typescript",
    "rust",
    "java",
    "go",
];

/// Pages whose blocks a test of their own runs (each on a fresh server, or
/// against the command table), and so carry no `test:` markers.
const RUN_ELSEWHERE: [(&str, &str); 2] = [
    ("docs/patterns.md", "tests/patterns.rs"),
    ("docs/commands.md", "tests/command_docs.rs"),
];

#[test]
fn every_program_block_is_run_or_says_why_not() {
    for page in pages() {
        if RUN_ELSEWHERE.iter().any(|(p, _)| *p == page) {
            continue;
        }
        program_blocks_are_run_or_say_why_not(&page, &page_text(&page));
    }
}

fn program_blocks_are_run_or_say_why_not(page: &str, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    let mut unmarked = Vec::new();
    while i < lines.len() {
        let Some((lang, _, after)) = fenced(&lines, i) else {
            i += 1;
            continue;
        };
        let above = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
        let marked =
            above.is_some_and(|l| marker(l, "test").is_some() || marker(l, "not run").is_some());
        if PROGRAMS.contains(&lang.as_str()) && !marked {
            unmarked.push(format!("line {}: {lang}", i + 1));
        }
        i = after;
    }
    assert!(
        unmarked.is_empty(),
        "{page} blocks neither run nor marked `not run`: {unmarked:?}"
    );
}

/// The server a page names (`<!-- server: NAME -->`; none: the module's defaults).
fn server_for(page: &str, text: &str) -> Server {
    match page_server(text).as_deref() {
        None => Server::start_tcp(&[]),
        Some("make-run") => {
            let s = Server::start_tcp(&make_run_args());
            let max_lease: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("warden.max-lease")
                .query(&mut s.conn())
                .unwrap();
            assert_eq!(max_lease[1], "30000", "{page}: make run's lease cap");
            s
        }
        Some(other) => panic!("{page}: no server {other}"),
    }
}

/// Runs a page's examples in order on the server it names; how many of
/// each kind ran.
fn run_page(page: &str) -> HashMap<String, usize> {
    let text = page_text(page);
    let s = server_for(page, &text);
    let mut ran = HashMap::new();
    for e in examples(page, &text) {
        match e.kind.as_str() {
            "redis-cli" => run_transcript(&e, &s),
            "python" => run_python(&e, &s),
            "node" => run_node(&e, &s),
            "sh" => run_sh(&e, &s),
            "rust" => run_rust(&e, &s),
            "install" => continue, // make dist-test, on the artefacts
            other => panic!("{} line {}: no way to run {other}", e.page, e.line),
        }
        *ran.entry(e.kind.clone()).or_default() += 1;
    }
    ran
}

/// Asserts that `page` ran at least these many examples of each kind.
fn ran_at_least(page: &str, expected: &[(&str, usize)]) {
    let ran = run_page(page);
    for (kind, at_least) in expected {
        assert!(
            ran.get(*kind).copied().unwrap_or(0) >= *at_least,
            "{page}: expected {at_least} {kind} examples, ran {ran:?}"
        );
    }
}

/// The README's examples, in page order, on one server started as `make run
/// GRACE=0` starts it: as a reader who tries each in turn would run them.
#[test]
fn readme_examples_run_on_make_runs_server() {
    assert_eq!(page_server(&readme()).as_deref(), Some("make-run"));
    ran_at_least(
        "README.md",
        &[("redis-cli", 2), ("python", 1), ("node", 1), ("rust", 1)],
    );
}

#[test]
fn lock_page_examples_run() {
    ran_at_least("docs/locks.md", &[("redis-cli", 1)]);
}

#[test]
fn semaphore_page_examples_run() {
    ran_at_least("docs/semaphores.md", &[("redis-cli", 1)]);
}

#[test]
fn rate_limiter_page_examples_run() {
    ran_at_least("docs/ratelimits.md", &[("redis-cli", 2)]);
}

#[test]
fn cache_page_examples_run() {
    ran_at_least("docs/cache.md", &[("redis-cli", 1)]);
}

#[test]
fn bloom_page_examples_run() {
    ran_at_least("docs/bloom.md", &[("redis-cli", 1)]);
}

#[test]
fn python_page_examples_run() {
    ran_at_least("docs/clients/python.md", &[("python", 6)]);
}

#[test]
fn node_page_examples_run() {
    ran_at_least("docs/clients/node.md", &[("node", 6)]);
}

#[test]
fn rust_page_examples_run() {
    ran_at_least("docs/clients/rust.md", &[("rust", 2)]);
}

/// `docs/migrating.md`: its examples (the rolling deploy and the RedisBloom
/// checklist among them), in page order, on one server (its way back:
/// tests/way_back.rs).
#[test]
fn migration_guide_examples_run_in_page_order_on_one_server() {
    ran_at_least("docs/migrating.md", &[("python", 2), ("sh", 1)]);
}

/// The pages the tests above run; every page with marked blocks is one.
const RUN_PAGES: [&str; 10] = [
    "README.md",
    "docs/locks.md",
    "docs/semaphores.md",
    "docs/ratelimits.md",
    "docs/cache.md",
    "docs/bloom.md",
    "docs/clients/python.md",
    "docs/clients/node.md",
    "docs/clients/rust.md",
    "docs/migrating.md",
];

#[test]
fn every_page_with_examples_is_run() {
    for page in pages() {
        let runnable = examples(&page, &page_text(&page))
            .iter()
            .any(|e| e.kind != "install");
        assert!(
            !runnable || RUN_PAGES.contains(&page.as_str()),
            "{page} has examples that no test runs: add it to RUN_PAGES and a test"
        );
    }
    for (page, test) in RUN_ELSEWHERE {
        assert!(root().join(test).exists(), "{page}: {test}");
    }
}

#[test]
fn every_marked_block_has_a_runner() {
    for e in pages().iter().flat_map(|p| examples(p, &page_text(p))) {
        assert!(
            ["redis-cli", "python", "node", "sh", "rust", "install"].contains(&e.kind.as_str()),
            "{} line {}: no way to run {}",
            e.page,
            e.line,
            e.kind
        );
    }
}

/// The checklist of "Moving from RedisBloom", end to end: the keys its
/// first step finds are the ones that stop a server with warden alone from
/// loading the RDB; without them it loads and the filter answers.
#[test]
fn the_redisbloom_checklist_finds_every_key_that_cannot_carry_over() {
    let step = step_on("redisbloom");
    let mut rb = redisbloom_server();
    let mut c = rb.conn();
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    let rdb = rb.dir.path().join("dump.rdb");
    let mut refused = Plain::start_on(&rdb, &[module(module_path(), &[])]);
    assert!(
        !refused.runs(),
        "warden alone loaded RedisBloom's other types"
    );
    assert!(
        refused.log().contains("no matching module type"),
        "{}",
        refused.log()
    );

    let keys = listed_keys(&rb.dir.path().join("redis.sock"), &step);
    assert_eq!(keys.len(), REDISBLOOM_KEYS.len() - 1, "{keys:?}");
    for key in &keys {
        assert_eq!(int(&mut c, &["DEL", key]), 1);
    }
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    let mut moved = Plain::start_on(&rdb, &[module(module_path(), &[])]);
    let mut w = moved.conn();
    assert_eq!(int(&mut w, &["BF.EXISTS", "users", "alice"]), 1);
    assert_eq!(int(&mut w, &["DBSIZE"]), 1);
}

/// docs/metrics.md: `INFO` and `INFO ALL` leave module sections out; `INFO
/// warden`, `INFO modules` and `INFO everything` have warden's.
#[test]
fn info_sections_are_where_the_readme_says() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (args, has_warden) in [
        (&[][..], false),
        (&["all"][..], false),
        (&["warden"][..], true),
        (&["modules"][..], true),
        (&["everything"][..], true),
    ] {
        let info: String = redis::cmd("INFO").arg(args).query(&mut c).unwrap();
        assert_eq!(
            info.lines().any(|l| l.starts_with("warden_lock_keys:")),
            has_warden,
            "INFO {args:?}"
        );
    }
    assert!(
        page_text("docs/metrics.md").contains("`INFO` and `INFO ALL` leave module sections out")
    );
}
