//! The way back (`docs/migrating.md`), run as the page writes it: a server
//! with one key of every warden type (in two databases), a cache value and
//! plain keys; the page's steps, each block marked `<!-- way-back: NAME -->`
//! run by bash with `redis-cli` pointed at the server; then the same server
//! binary without warden (or with RedisBloom alone) starts on the saved
//! files and keeps every key that is not warden's.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PAGE: &str = "docs/migrating.md";

/// The keys the page's listing shows, as `db type key`, in its order.
const WARDEN_KEYS: [&str; 6] = [
    "0 warden-lk order:42",
    "0 warden-rw catalog",
    "0 warden-sm jobs:slots",
    "0 warden-bf users:new",
    "0 MBbloom-- users",
    "1 warden-lk invoice:9",
];

/// Plain keys and a filled cache value: what must survive the way back.
const KEPT: [(&str, &str); 3] = [
    ("greeting", "hello"),
    ("product:1", "cached value"),
    ("counter", "7"),
];

/// A step of the way back: the `sh` block under `<!-- way-back: NAME -->`,
/// and the `text` block under `<!-- output -->` after it, if any.
struct Step {
    code: String,
    output: Option<String>,
}

fn page() -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(PAGE)).unwrap()
}

/// The body of the fenced block opening at `lines[i]` (indentation of the
/// fence removed), and the index after its closing fence.
fn fenced(lines: &[&str], i: usize) -> (String, usize) {
    let indent = lines[i].len() - lines[i].trim_start().len();
    assert!(
        lines[i].trim_start().starts_with("```"),
        "{PAGE} line {}: a fence",
        i + 1
    );
    let mut body = String::new();
    for (j, line) in lines.iter().enumerate().skip(i + 1) {
        if line.trim() == "```" {
            return (body, j + 1);
        }
        let cut = (line.len() - line.trim_start().len()).min(indent);
        body.push_str(&line[cut..]);
        body.push('\n');
    }
    panic!("{PAGE} line {}: a fence that never closes", i + 1);
}

fn step(name: &str) -> Step {
    let text = page();
    let lines: Vec<&str> = text.lines().collect();
    let marker = format!("<!-- way-back: {name} -->");
    let at = lines
        .iter()
        .position(|l| l.trim() == marker)
        .unwrap_or_else(|| panic!("{PAGE}: no step marked {marker}"));
    let (code, after) = fenced(&lines, at + 1);
    let next = (after..lines.len()).find(|&i| !lines[i].trim().is_empty());
    let output = next
        .filter(|&i| lines[i].trim() == "<!-- output -->")
        .map(|i| fenced(&lines, i + 1).0);
    Step { code, output }
}

/// Runs a step in `dir` (where it may write files) with `redis-cli` talking
/// to `socket`; fails when it fails or runs longer than `limit`.
fn run_step(step: &Step, socket: &Path, dir: &Path, limit: Duration) -> String {
    let mut child = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(format!(
            "redis-cli() {{ command redis-cli -s '{}' \"$@\"; }}\n{}",
            socket.display(),
            step.code
        ))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out: Output = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && started.elapsed() <= limit,
        "{}\nexited {} after {:?}:\n{}{}",
        step.code,
        out.status,
        started.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// A server with warden (and AOF when asked), with one key of every warden
/// type as the page's listing shows it, the kept keys, and a cache lease
/// left unfilled (which lives in module memory only).
fn one_of_each(aof: bool) -> Server {
    // The files are copied while this server runs: with the default
    // `everysec`, a server whose last fsync is still running answers writes
    // before it writes them to the file.
    let extra: &[&str] = if aof {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &[]
    };
    let s = Server::start(extra);
    let mut c = s.conn();
    run(&mut c, &["LOCK.ACQUIRE", "order:42", "me", "30000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "catalog", "me", "30000"]).unwrap();
    run(
        &mut c,
        &["SEM.ACQUIRE", "jobs:slots", "me", "30000", "LIMIT", "3"],
    )
    .unwrap();
    run(&mut c, &["BF.ADD", "users:new", "alice"]).unwrap();
    // A filter RedisBloom made, brought over with DUMP/RESTORE.
    let mut rb = Plain::start(&[module(redisbloom(), &[])]);
    let mut r = rb.conn();
    run(&mut r, &["BF.ADD", "users", "alice"]).unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("users").query(&mut r).unwrap();
    redis::cmd("RESTORE")
        .arg("users")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(
        reply_text(&run(&mut c, &["TYPE", "users"]).unwrap()),
        "MBbloom--"
    );

    for (key, value) in KEPT {
        if key.starts_with("product:") {
            // A cache value: a miss's lease, then its fill.
            let Ok(redis::Value::Array(reply)) = run(&mut c, &["CACHE.GET", key, "5000"]) else {
                panic!("CACHE.GET");
            };
            let lease = reply_text(&reply[1]);
            run(&mut c, &["CACHE.FILL", key, &lease, value, "PX", "600000"]).unwrap();
            assert_eq!(reply_text(&run(&mut c, &["TYPE", key]).unwrap()), "string");
        } else {
            run(&mut c, &["SET", key, value]).unwrap();
        }
    }
    // Leases live in module memory: one left unfilled changes nothing saved.
    run(&mut c, &["CACHE.GET", "product:2", "30000"]).unwrap();

    run(&mut c, &["SELECT", "1"]).unwrap();
    run(&mut c, &["LOCK.ACQUIRE", "invoice:9", "me", "30000"]).unwrap();
    s
}

/// Runs the token counter about two seconds ahead of the clock (as tokens
/// taken over from a server whose clock was ahead do): a lock `RESTORE`d
/// with such a token, which the checklist deletes with the others.
fn counter_ahead(s: &Server) {
    let mut c = s.conn();
    let fence = int(&mut c, &["LOCK.ACQUIRE", "ahead", "me", "30000"]) as u64;
    let dump: Vec<u8> = redis::cmd("DUMP").arg("ahead").query(&mut c).unwrap();
    run(&mut c, &["DEL", "ahead"]).unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = (now_ms + 2000) << 10;
    redis::cmd("RESTORE")
        .arg("ahead")
        .arg(0)
        .arg(dump_with_fence(&dump, fence, ahead))
        .query::<()>(&mut c)
        .unwrap();
    assert!(warden_stat(&mut c, "last_fence") as u64 >= ahead);
}

/// Copies the server's data files (RDB, AOF directory) into a fresh directory.
fn copy_data(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        let path = entry.path();
        if name == "dump.rdb" {
            std::fs::copy(&path, to.path().join(&name)).unwrap();
        } else if name == "appendonlydir" {
            std::fs::create_dir(to.path().join(&name)).unwrap();
            for file in std::fs::read_dir(&path).unwrap().flatten() {
                std::fs::copy(file.path(), to.path().join(&name).join(file.file_name())).unwrap();
            }
        }
    }
    to
}

/// The same server binary, without warden, on a copy of the saved files.
fn without_warden(data: &Path, aof: bool, modules: &[Vec<String>]) -> (Plain, tempfile::TempDir) {
    let copy = copy_data(data);
    let dir = copy.path().display().to_string();
    let appendonly = if aof { "yes" } else { "no" };
    let server = Plain::start_with(&["--dir", &dir, "--appendonly", appendonly], modules);
    (server, copy)
}

/// The way back to a server without modules (or to RedisBloom): refused
/// before the steps, loaded after them with every key that is not warden's.
fn way_back(aof: bool, to_redisbloom: bool) {
    let s = one_of_each(aof);
    let mut c = s.conn();
    counter_ahead(&s);
    let modules = if to_redisbloom {
        vec![module(redisbloom(), &[])]
    } else {
        vec![]
    };
    let data = s.dir.path();

    // Before: the server without warden refuses the files.
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    if aof {
        rewrite_aof(&mut c);
    }
    let (mut refused, _copy) = without_warden(data, aof, &modules);
    assert!(!refused.runs(), "loaded warden's keys without warden");
    // The token counter ahead: where the server saves aux data, that is
    // refused first.
    let log = refused.log();
    assert!(
        log.contains("no matching module type '")
            || log.contains("AUX module data I can't load: no matching module 'warden-lk'"),
        "{log}"
    );

    let work = tempfile::tempdir().unwrap();
    let socket = s.socket();
    let mut list = step("list");
    let types_line = "warden-lk warden-rw warden-sm warden-bf MBbloom--";
    assert!(list.code.contains(types_line), "{PAGE}: {}", list.code);
    let mut expected: Vec<String> = WARDEN_KEYS.iter().map(|k| k.to_string()).collect();
    expected.insert(1, "0 warden-lk ahead".to_string());
    if to_redisbloom {
        // As the page says: going back to RedisBloom, leave `MBbloom--` out.
        list.code = list
            .code
            .replace(types_line, "warden-lk warden-rw warden-sm warden-bf");
        expected.retain(|k| !k.contains("MBbloom--"));
    } else {
        let shown = list.output.as_deref().expect("the listing's output");
        assert_eq!(lines(shown), WARDEN_KEYS, "{PAGE}: the listing shown");
    }
    // SCAN's order within a type is the hash table's: compared as sets.
    let mut listed = lines(&run_step(
        &list,
        &socket,
        work.path(),
        Duration::from_secs(60),
    ));
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);

    run_step(
        &step("delete"),
        &socket,
        work.path(),
        Duration::from_secs(60),
    );
    let again = run_step(&list, &socket, work.path(), Duration::from_secs(60));
    assert!(again.trim().is_empty(), "still listed:\n{again}");

    // The counter is still ahead: where the server has `aux_save2`, saving
    // now would tie the RDB to warden (step 4 is needed).
    let aux2 = is_valkey() || server_version(&mut c) >= (7, 2);
    if aux2 && !aof {
        redis::cmd("SAVE").query::<()>(&mut c).unwrap();
        let (mut tied, _copy) = without_warden(data, aof, &modules);
        assert!(!tied.runs(), "the RDB carried no aux data");
        assert!(
            tied.log()
                .contains("AUX module data I can't load: no matching module 'warden-lk'"),
            "{}",
            tied.log()
        );
    }

    let waited = run_step(&step("wait"), &socket, work.path(), Duration::from_secs(60));
    assert_eq!(lines(&waited), ["nothing of warden's left to save"]);
    run_step(&step("save"), &socket, work.path(), Duration::from_secs(60));

    let (mut back, _copy) = without_warden(data, aof, &modules);
    assert!(back.runs(), "{}", back.log());
    let mut b = back.conn();
    for (key, value) in KEPT {
        let got: String = redis::cmd("GET").arg(key).query(&mut b).unwrap();
        assert_eq!(got, value, "{key}");
    }
    let kept = KEPT.len() as i64 + i64::from(to_redisbloom);
    assert_eq!(int(&mut b, &["DBSIZE"]), kept);
    if to_redisbloom {
        assert_eq!(int(&mut b, &["BF.EXISTS", "users", "alice"]), 1);
    }
    run(&mut b, &["SELECT", "1"]).unwrap();
    assert_eq!(int(&mut b, &["DBSIZE"]), 0);
}

#[test]
fn the_way_back_to_a_server_without_modules_loads_the_rdb() {
    way_back(false, false);
}

#[test]
fn the_way_back_to_a_server_without_modules_loads_the_aof() {
    way_back(true, false);
}

#[test]
fn the_way_back_to_redisbloom_keeps_its_filters() {
    way_back(false, true);
}
