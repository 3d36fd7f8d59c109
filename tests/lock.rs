//! LOCK.ACQUIRE / RELEASE / EXTEND / INFO against a real redis-server.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

fn acquire(con: &mut Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    int(con, &["LOCK.ACQUIRE", key, owner, ttl])
}

#[test]
fn acquire_returns_a_positive_fence_and_sets_the_lease_as_key_expiry() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "10000");
    assert!(fence > 0);
    let pttl = int(&mut c, &["PTTL", "k"]);
    assert!(pttl > 9000 && pttl <= 10000, "pttl {pttl}");
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 1, fence)));
    let t: String = redis::cmd("TYPE").arg("k").query(&mut c).unwrap();
    assert_eq!(t, "warden-lk");
}

#[test]
fn busy_lock_answers_nil_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "10000");
    assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "bob", "500"]));
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 1, fence)));
    assert!(int(&mut c, &["PTTL", "k"]) > 9000);
}

#[test]
fn reentry_counts_holds_resets_lease_and_keeps_the_fence() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "1000");
    assert_eq!(acquire(&mut c, "k", "alice", "60000"), fence);
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 2, fence)));
    assert!(int(&mut c, &["PTTL", "k"]) > 50000);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "alice"]), 0);
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 1, fence)));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "alice"]), 1);
    assert_eq!(lock_state(&mut c, "k"), None);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn release_by_another_owner_or_of_a_missing_lock_is_minus_one() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "alice"]), -1);
    let fence = acquire(&mut c, "k", "alice", "10000");
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "bob"]), -1);
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 1, fence)));
}

#[test]
fn extend_resets_the_lease_only_for_the_owner() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "k", "alice", "1000"]), 0);
    acquire(&mut c, "k", "alice", "1000");
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "k", "bob", "90000"]), 0);
    assert!(int(&mut c, &["PTTL", "k"]) <= 1000);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "k", "alice", "90000"]), 1);
    assert!(int(&mut c, &["PTTL", "k"]) > 80000);
    let f = map(&mut c, &["LOCK.INFO", "k"]);
    assert!(field_int(&f, "ttl") > 80000);
    assert_eq!(field_int(&f, "holds"), 1);
}

#[test]
fn info_reports_every_field() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert!(is_nil(&mut c, &["LOCK.INFO", "k"]));
    let fence = acquire(&mut c, "k", "alice", "5000");
    let f = map(&mut c, &["LOCK.INFO", "k"]);
    let names: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["owner", "holds", "ttl", "fence", "waiters"]);
    assert_eq!(field_str(&f, "owner"), "alice");
    assert_eq!(field_int(&f, "fence"), fence);
    assert!((1..=5000).contains(&field_int(&f, "ttl")));
    assert_eq!(field_int(&f, "waiters"), 0);
    // RESP3: a real map
    let mut c3 = s.conn3();
    match run(&mut c3, &["LOCK.INFO", "k"]).unwrap() {
        Value::Map(pairs) => assert_eq!(pairs.len(), 5),
        other => panic!("expected a map, got {other:?}"),
    }
}

#[test]
fn the_lease_ends_and_the_key_disappears() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let first = acquire(&mut c, "k", "alice", "30");
    wait_for("lease end", Duration::from_secs(5), || {
        int(&mut c, &["EXISTS", "k"]) == 0
    });
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "alice"]), -1);
    let second = acquire(&mut c, "k", "bob", "1000");
    assert!(second > first);
}

#[test]
fn fences_increase_across_release_del_and_expiry() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let a = acquire(&mut c, "k", "a", "10000");
    int(&mut c, &["LOCK.RELEASE", "k", "a"]);
    let b = acquire(&mut c, "k", "b", "10000");
    int(&mut c, &["DEL", "k"]);
    let d = acquire(&mut c, "k", "d", "20");
    wait_for("lease end", Duration::from_secs(5), || {
        int(&mut c, &["EXISTS", "k"]) == 0
    });
    let e = acquire(&mut c, "k", "e", "10000");
    assert!(a < b && b < d && d < e, "{a} {b} {d} {e}");
    // other keys draw from the same counter
    assert!(acquire(&mut c, "other", "x", "1000") > e);
}

#[test]
fn debug_reload_keeps_state_and_fences_keep_rising() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "60000");
    acquire(&mut c, "k", "alice", "60000");
    acquire(&mut c, "gone", "x", "60000");
    int(&mut c, &["DEL", "gone"]);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 2, fence)));
    assert!(int(&mut c, &["PTTL", "k"]) > 50000);
    assert!(acquire(&mut c, "new", "y", "1000") > fence + 1);
}

#[test]
fn restart_from_rdb_keeps_state_and_fences_keep_rising() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "60000");
    acquire(&mut c, "k", "alice", "60000");
    let dropped = acquire(&mut c, "gone", "x", "60000");
    int(&mut c, &["DEL", "gone"]);
    run(&mut c, &["SAVE"]).unwrap();
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 2, fence)));
    assert!(int(&mut c, &["PTTL", "k"]) > 50000);
    assert!(acquire(&mut c, "gone", "y", "1000") > dropped);
}

fn aof_round_trip(preamble: &str, rewrite: bool) {
    let mut s = Server::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        preamble,
    ]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "60000");
    acquire(&mut c, "k", "alice", "60000");
    let released = acquire(&mut c, "r", "bob", "60000");
    int(&mut c, &["LOCK.RELEASE", "r", "bob"]);
    int(&mut c, &["LOCK.EXTEND", "k", "alice", "90000"]);
    if rewrite {
        rewrite_aof(&mut c);
    }
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(lock_state(&mut c, "k"), Some(("alice".into(), 2, fence)));
    let pttl = int(&mut c, &["PTTL", "k"]);
    assert!(pttl > 80000 && pttl <= 90000, "pttl {pttl}");
    assert_eq!(int(&mut c, &["EXISTS", "r"]), 0);
    assert!(acquire(&mut c, "r", "carol", "1000") > released.max(fence));
}

#[test]
fn restart_from_aof_with_rdb_preamble() {
    aof_round_trip("yes", true);
}

#[test]
fn restart_from_aof_without_rdb_preamble() {
    aof_round_trip("no", true);
}

#[test]
fn restart_from_aof_log_without_rewrite() {
    aof_round_trip("no", false);
}

#[test]
fn dump_restore_and_copy_keep_state() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "k", "alice", "60000");
    acquire(&mut c, "k", "alice", "60000");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("k2")
        .arg(30000)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(lock_state(&mut c, "k2"), Some(("alice".into(), 2, fence)));
    let pttl = int(&mut c, &["PTTL", "k2"]);
    assert!(pttl > 20000 && pttl <= 30000);
    assert_eq!(int(&mut c, &["COPY", "k", "k3"]), 1);
    assert_eq!(lock_state(&mut c, "k3"), Some(("alice".into(), 2, fence)));
    assert!(int(&mut c, &["PTTL", "k3"]) > 50000);
    assert!(int(&mut c, &["MEMORY", "USAGE", "k"]) > 0);
    // a restored fence is never issued again, even on another server
    let other = Server::start(&[]);
    let mut o = other.conn();
    redis::cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut o)
        .unwrap();
    assert!(acquire(&mut o, "n", "x", "1000") > fence);
}

#[test]
fn corrupt_restore_payloads_are_refused_and_the_server_lives() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    acquire(&mut c, "k", "alice", "60000");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    // Every truncation and every single-byte change: an error or a valid lock, never a crash.
    for cut in 0..dump.len() {
        try_restore(&mut c, &dump[..cut]);
    }
    for i in 0..dump.len() {
        let mut bad = dump.clone();
        bad[i] ^= 0x5a;
        try_restore(&mut c, &bad);
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn wrong_type_is_the_standard_error() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "str", "v"]).unwrap();
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(err(&mut c, &["LOCK.ACQUIRE", "str", "a", "100"]), wrongtype);
    assert_eq!(err(&mut c, &["LOCK.RELEASE", "str", "a"]), wrongtype);
    assert_eq!(err(&mut c, &["LOCK.EXTEND", "str", "a", "100"]), wrongtype);
    assert_eq!(err(&mut c, &["LOCK.INFO", "str"]), wrongtype);
    acquire(&mut c, "lock", "a", "10000");
    assert_eq!(err(&mut c, &["GET", "lock"]), wrongtype);
}

#[test]
fn wrong_arity_is_the_standard_error() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for words in [
        &["LOCK.ACQUIRE", "k", "a"][..],
        &["LOCK.ACQUIRE", "k"],
        &["LOCK.RELEASE", "k"],
        &["LOCK.RELEASE", "k", "a", "b"],
        &["LOCK.EXTEND", "k", "a"],
        &["LOCK.EXTEND", "k", "a", "1", "2"],
        &["LOCK.INFO"],
        &["LOCK.INFO", "k", "x"],
    ] {
        let name = words[0].to_lowercase();
        assert_eq!(
            err(&mut c, words),
            format!("ERR wrong number of arguments for '{name}' command"),
            "{words:?}"
        );
    }
}

#[test]
fn hostile_inputs_are_refused_and_change_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = acquire(&mut c, "held", "alice", "60000");
    let long_owner = "x".repeat(2000);
    const TTL: &str = "ERR invalid ttl: expected an integer from 1 to 70368744177664 (ms)";
    const TIMEOUT: &str = "ERR invalid timeout: expected an integer from 0 to 70368744177664 (ms)";
    const OWNER: &str = "ERR invalid owner: expected a string of 1 to 1024 bytes";
    const SYNTAX: &str = "ERR syntax error";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["LOCK.ACQUIRE", "k", "a", "0"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "-1"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "abc"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "1.5"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "0100"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "+100"], TTL),
        (vec!["LOCK.ACQUIRE", "k", "a", "70368744177665"], TTL),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "99999999999999999999999"],
            TTL,
        ),
        (vec!["LOCK.ACQUIRE", "k", "", "100"], OWNER),
        (vec!["LOCK.ACQUIRE", "k", &long_owner, "100"], OWNER),
        (vec!["LOCK.ACQUIRE", "k", "a", "100", "WAIT"], SYNTAX),
        (vec!["LOCK.ACQUIRE", "k", "a", "100", "WAIT", "-5"], TIMEOUT),
        (vec!["LOCK.ACQUIRE", "k", "a", "100", "WAIT", "x"], TIMEOUT),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "100", "WAIT", "70368744177665"],
            TIMEOUT,
        ),
        (vec!["LOCK.ACQUIRE", "k", "a", "100", "NOWAIT"], SYNTAX),
        (vec!["LOCK.ACQUIRE", "k", "a", "100", "WAI", "1"], SYNTAX),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "100", "WAIT", "1", "WAIT", "2"],
            SYNTAX,
        ),
        // The first bad argument decides: owner, then ttl, then the options.
        (vec!["LOCK.ACQUIRE", "k", "", "0", "BOGUS"], OWNER),
        (vec!["LOCK.ACQUIRE", "k", "a", "0", "BOGUS"], TTL),
        (vec!["LOCK.EXTEND", "held", "alice", "0"], TTL),
        (vec!["LOCK.EXTEND", "held", "alice", "-3"], TTL),
        (vec!["LOCK.EXTEND", "held", "", "100"], OWNER),
        (vec!["LOCK.RELEASE", "held", ""], OWNER),
        (vec!["LOCK.RELEASE", "held", &long_owner], OWNER),
        (
            vec!["WARDEN.LOCKSET", "held", "x", "1", "1", "0"],
            "ERR effect commands are accepted only from the master link and the AOF",
        ),
    ];
    for (words, expected) in &cases {
        assert_eq!(&err(&mut c, words), expected, "{words:?}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    assert_eq!(lock_state(&mut c, "held"), Some(("alice".into(), 1, fence)));
    assert!(int(&mut c, &["PTTL", "held"]) > 50000);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn the_ends_of_every_range_are_accepted() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let owner = "o".repeat(1024);
    assert!(int(&mut c, &["LOCK.ACQUIRE", "a", &owner, "70368744177664"]) > 0);
    assert!(int(&mut c, &["LOCK.ACQUIRE", "b", "x", "1"]) > 0);
    assert!(int(&mut c, &["LOCK.ACQUIRE", "c", "x", "100", "wait", "0"]) > 0);
    let max_wait = ["LOCK.ACQUIRE", "d", "x", "100", "WAIT", "70368744177664"];
    assert!(int(&mut c, &max_wait) > 0);
    assert_eq!(
        int(&mut c, &["LOCK.EXTEND", "a", &owner, "70368744177664"]),
        1
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "a", &owner]), 1);
    // A 1 ms lease may lapse before the next command on a busy machine, so
    // the shortest extension is the last thing asked of its lock.
    assert!(int(&mut c, &["LOCK.ACQUIRE", "a", &owner, "60000"]) > 0);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "a", &owner, "1"]), 1);
}

#[test]
fn owners_are_binary_safe() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let owner: Vec<u8> = (0u8..=255).collect();
    let fence: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg(&owner)
        .arg(10000)
        .query(&mut c)
        .unwrap();
    let again: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg(&owner)
        .arg(10000)
        .query(&mut c)
        .unwrap();
    assert_eq!(fence, again);
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg("k")
        .arg(&owner[..255])
        .query(&mut c)
        .unwrap();
    assert_eq!(released, -1);
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg("k")
        .arg(&owner)
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 0);
}

#[test]
fn commands_are_declared_with_their_key_and_flags() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.ACQUIRE")
        .arg("{a}k")
        .arg("o")
        .arg("10")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["{a}k"]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("lock.release")
        .query(&mut c)
        .unwrap();
    let text = format!("{info:?}");
    assert!(text.contains("fast") && !text.contains("denyoom"), "{text}");
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("lock.acquire")
        .query(&mut c)
        .unwrap();
    assert!(format!("{info:?}").contains("denyoom"));
}
