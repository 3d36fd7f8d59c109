//! CACHE.*: the SPEC's "Cache leases" semantics, one behaviour per test.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// `[value, lease]` of a cache read.
fn get(c: &mut Connection, words: &[&str]) -> (Option<String>, Option<i64>) {
    match run(c, words).unwrap() {
        Value::Array(v) if v.len() == 2 => (text(&v[0]), lease(&v[1])),
        other => panic!("{words:?}: {other:?}"),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        other => panic!("value: {other:?}"),
    }
}

fn lease(v: &Value) -> Option<i64> {
    match v {
        Value::Nil => None,
        Value::Int(n) => Some(*n),
        other => panic!("lease: {other:?}"),
    }
}

/// A lease on a missing key.
fn take_lease(c: &mut Connection, key: &str) -> i64 {
    let (value, lease) = get(c, &["CACHE.GET", key, "60000"]);
    assert_eq!(value, None);
    lease.expect("a lease on a miss")
}

fn fill(c: &mut Connection, key: &str, lease: i64, value: &str) -> i64 {
    int(c, &["CACHE.FILL", key, &lease.to_string(), value])
}

fn cache_info(c: &mut Connection, key: &str) -> Vec<(String, Value)> {
    map(c, &["CACHE.INFO", key])
}

fn waiters(c: &mut Connection, key: &str) -> i64 {
    field_int(&cache_info(c, key), "waiters")
}

/// A blocked `CACHE.GET ... WAIT` on its own connection, which stays open
/// after the answer (a lease ends when its holder's connection closes).
type Waiting = std::thread::JoinHandle<(Value, Connection)>;

fn waiter(s: &Server, key: &str, timeout: &str) -> (i64, Waiting) {
    spawn_waiter(s, &["CACHE.GET", key, "60000", "WAIT", timeout])
}

fn spawn_waiter(s: &Server, words: &[&str]) -> (i64, Waiting) {
    let mut c = s.conn();
    let id = int(&mut c, &["CLIENT", "ID"]);
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    let handle = std::thread::spawn(move || {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        (run(&mut c, &words).unwrap(), c)
    });
    (id, handle)
}

/// The waiter's `[value, lease]` and its still open connection.
fn answer_keeping(p: Waiting) -> ((Option<String>, Option<i64>), Connection) {
    match p.join().unwrap() {
        (Value::Array(v), c) if v.len() == 2 => ((text(&v[0]), lease(&v[1])), c),
        (other, _) => panic!("{other:?}"),
    }
}

fn answer(p: Waiting) -> (Option<String>, Option<i64>) {
    answer_keeping(p).0
}

fn wait_waiters(c: &mut Connection, key: &str, n: i64) {
    wait_for(
        &format!("{n} cache waiters"),
        Duration::from_secs(10),
        || waiters(c, key) == n,
    );
}

// 1. Hit

#[test]
fn a_hit_is_the_value_and_no_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v"]).unwrap();
    assert_eq!(
        get(&mut c, &["CACHE.GET", "k", "1000"]),
        (Some("v".into()), None)
    );
    assert_eq!(warden_stat(&mut c, "cache_hits"), 1);
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
}

#[test]
fn refresh_ahead_hands_one_reader_a_lease_before_expiry() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "old", "PX", "20000"]).unwrap();
    let far = ["CACHE.GET", "k", "1000", "REFRESH", "5000"];
    assert_eq!(
        get(&mut c, &far),
        (Some("old".into()), None),
        "ttl above the window"
    );
    let near = ["CACHE.GET", "k", "1000", "REFRESH", "30000"];
    let (value, token) = get(&mut c, &near);
    assert_eq!(value.as_deref(), Some("old"));
    let token = token.expect("the refresher's lease");
    // Everyone else keeps getting the value, without a lease.
    assert_eq!(get(&mut c, &near), (Some("old".into()), None));
    assert_eq!(
        int(
            &mut c,
            &["CACHE.FILL", "k", &token.to_string(), "new", "PX", "60000"]
        ),
        1
    );
    assert_eq!(get(&mut c, &near), (Some("new".into()), None));
    assert!(int(&mut c, &["PTTL", "k"]) > 50000);
    assert_eq!(warden_stat(&mut c, "cache_refreshes"), 1);
    // A value without expiry never needs refreshing.
    run(&mut c, &["SET", "forever", "v"]).unwrap();
    let (_, none) = get(
        &mut c,
        &["CACHE.GET", "forever", "1000", "REFRESH", "30000"],
    );
    assert_eq!(none, None);
}

// 2. Miss, no lease

#[test]
fn a_miss_leases_to_the_first_reader_only() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = take_lease(&mut c, "k");
    assert_eq!(get(&mut c, &["CACHE.GET", "k", "1000"]), (None, None));
    let mut other = s.conn();
    assert_eq!(get(&mut other, &["CACHE.GET", "k", "1000"]), (None, None));
    let f = cache_info(&mut c, "k");
    assert_eq!(field_str(&f, "value"), "miss");
    assert_eq!(field_int(&f, "ttl"), -2);
    assert_eq!(field_int(&f, "lease"), token);
    assert!(field_int(&f, "lease_ttl") > 50000);
}

// 3. Miss, lease held: waiting

#[test]
fn a_fill_answers_every_waiter_with_the_value() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = take_lease(&mut c, "k");
    let pending: Vec<Waiting> = (0..5).map(|_| waiter(&s, "k", "0").1).collect();
    wait_waiters(&mut c, "k", 5);
    assert_eq!(fill(&mut c, "k", token, "v"), 1);
    for p in pending {
        assert_eq!(answer(p), (Some("v".into()), None));
    }
    assert_eq!(waiters(&mut c, "k"), 0);
    assert_eq!(warden_stat(&mut c, "cache_waiters_woken"), 5);
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
}

#[test]
fn an_unfilled_lease_passes_to_the_oldest_waiter_alone() {
    // How the lease ends, given the key, its token and the holder's connection.
    type End = fn(&Server, &mut Connection, i64, Connection);
    let ends: &[(&str, End)] = &[
        ("lapse", |_, _, _, _| {}),
        ("abandon", |_, c, token, _| {
            assert_eq!(int(c, &["CACHE.ABANDON", "k", &token.to_string()]), 1)
        }),
        ("invalidate", |_, c, _, _| {
            assert_eq!(int(c, &["CACHE.INVALIDATE", "k"]), 0)
        }),
        ("holder disconnects", |_, _, _, holder| drop(holder)),
        ("holder killed", |_, c, _, mut holder| {
            let id = int(&mut holder, &["CLIENT", "ID"]);
            run(c, &["CLIENT", "KILL", "ID", &id.to_string()]).unwrap();
        }),
    ];
    for (how, end) in ends {
        let s = Server::start(&[]);
        let mut c = s.conn();
        let mut holder = s.conn();
        let lease_ms = if *how == "lapse" { "300" } else { "60000" };
        let (_, token) = get(&mut holder, &["CACHE.GET", "k", lease_ms]);
        let token = token.unwrap();
        let (_, first) = waiter(&s, "k", "0");
        wait_waiters(&mut c, "k", 1);
        let (_, second) = waiter(&s, "k", "0");
        wait_waiters(&mut c, "k", 2);
        end(&s, &mut c, token, holder);
        let ((value, next), _holder) = answer_keeping(first);
        assert_eq!(value, None, "{how}");
        let next = next.unwrap_or_else(|| panic!("{how}: the oldest waiter gets a lease"));
        assert!(next > token, "{how}: tokens increase");
        // The other keeps waiting: at most one load in flight.
        assert_eq!(waiters(&mut c, "k"), 1, "{how}");
        assert_eq!(fill(&mut c, "k", next, "v"), 1, "{how}");
        assert_eq!(answer(second), (Some("v".into()), None), "{how}");
    }
}

#[test]
fn a_value_written_by_anything_else_answers_the_waiters() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = take_lease(&mut c, "k");
    let (_, w) = waiter(&s, "k", "0");
    wait_waiters(&mut c, "k", 1);
    run(&mut c, &["SET", "k", "direct"]).unwrap();
    assert_eq!(answer(w), (Some("direct".into()), None));
    // ...and the lease it revoked can no longer fill.
    assert_eq!(fill(&mut c, "k", token, "late"), 0);
    assert_eq!(
        get(&mut c, &["CACHE.GET", "k", "1000"]),
        (Some("direct".into()), None)
    );
}

#[test]
fn a_waiter_past_its_timeout_gets_nil_nil() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take_lease(&mut c, "k");
    let (_, w) = waiter(&s, "k", "50");
    assert_eq!(answer(w), (None, None));
    let (id, w) = waiter(&s, "k", "0");
    wait_waiters(&mut c, "k", 1);
    if !unblock_ends_wait(&mut c) {
        // Before Redis 7.4: `CLIENT UNBLOCK` answers 0 and the wait goes on.
        assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]), 0);
        assert_eq!(waiters(&mut c, "k"), 1);
        assert_eq!(int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]), 1);
        drop(w);
        wait_waiters(&mut c, "k", 0);
        assert_eq!(warden_stat(&mut c, "cache_wait_timeouts"), 1);
        return;
    }
    assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]), 1);
    assert_eq!(answer(w), (None, None));
    assert_eq!(waiters(&mut c, "k"), 0);
    assert_eq!(warden_stat(&mut c, "cache_wait_timeouts"), 2);
}

// 4. Fill

#[test]
fn a_fill_is_refused_unless_its_lease_is_current() {
    type Spoil = fn(&mut Connection, i64);
    let cases: &[(&str, Spoil)] = &[
        ("already filled", |c, t| {
            assert_eq!(fill(c, "k", t, "first"), 1)
        }),
        ("abandoned", |c, t| {
            assert_eq!(int(c, &["CACHE.ABANDON", "k", &t.to_string()]), 1)
        }),
        ("invalidated", |c, _| {
            int(c, &["CACHE.INVALIDATE", "k"]);
        }),
        ("superseded", |c, _| {
            int(c, &["CACHE.INVALIDATE", "k"]);
            take_lease(c, "k");
        }),
        ("revoked by SET", |c, _| {
            run(c, &["SET", "k", "other"]).unwrap();
        }),
        ("lapsed", |_, _| {}),
    ];
    for (how, spoil) in cases {
        let s = Server::start(&[]);
        let mut c = s.conn();
        let lease_ms = if *how == "lapsed" { "100" } else { "60000" };
        let (_, token) = get(&mut c, &["CACHE.GET", "k", lease_ms]);
        let token = token.unwrap();
        spoil(&mut c, token);
        if *how == "lapsed" {
            wait_for("the lease to lapse", Duration::from_secs(10), || {
                cache_info(&mut c, "k")
                    .iter()
                    .any(|(f, v)| f == "lease" && *v == Value::Nil)
            });
        }
        let before: Option<String> = redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(fill(&mut c, "k", token, "stale"), 0, "{how}");
        let after: Option<String> = redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(before, after, "{how}: a refused fill changes nothing");
        assert_eq!(
            fill(&mut c, "k", token + 1_000_000, "x"),
            0,
            "{how}: unknown token"
        );
    }
}

#[test]
fn a_fill_is_a_plain_string_with_a_jittered_ttl() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut ttls = Vec::new();
    for i in 0..20 {
        let key = format!("k{i}");
        let token = take_lease(&mut c, &key);
        let words = [
            "CACHE.FILL",
            &key,
            &token.to_string(),
            "v",
            "PX",
            "10000",
            "JITTER",
            "5000",
        ];
        assert_eq!(int(&mut c, &words), 1);
        let value: String = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
        assert_eq!(value, "v");
        let ttl = int(&mut c, &["PTTL", &key]);
        assert!((9000..=15000).contains(&ttl), "{ttl}");
        ttls.push(ttl);
    }
    ttls.sort();
    assert!(ttls[19] - ttls[0] > 100, "expiries are spread: {ttls:?}");
    // No PX: no expiry. An empty value is a negative entry.
    let token = take_lease(&mut c, "none");
    assert_eq!(fill(&mut c, "none", token, ""), 1);
    assert_eq!(int(&mut c, &["PTTL", "none"]), -1);
    assert_eq!(
        get(&mut c, &["CACHE.GET", "none", "1000"]),
        (Some(String::new()), None)
    );
}

#[test]
fn a_fill_reaches_replicas_and_the_aof_as_set_with_an_absolute_expiry() {
    // The AOF is read while the master runs: `always`, so that a reply
    // means the file has it (`everysec` may postpone the write).
    let master = Server::start_tcp(&["--appendonly", "yes", "--appendfsync", "always"]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    let token = take_lease(&mut m, "k");
    let words = [
        "CACHE.FILL",
        "k",
        &token.to_string(),
        "v",
        "PX",
        "60000",
        "JITTER",
        "1000",
    ];
    assert_eq!(int(&mut m, &words), 1);
    sync_replicas(&mut m, 1);
    let value: String = redis::cmd("GET").arg("k").query(&mut r).unwrap();
    assert_eq!(value, "v");
    assert_eq!(
        int(&mut m, &["PEXPIRETIME", "k"]),
        int(&mut r, &["PEXPIRETIME", "k"])
    );
    let aof = std::fs::read_dir(master.dir.path().join("appendonlydir"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .fold(Vec::new(), |mut all, f| {
            all.extend(f);
            all
        });
    let aof = String::from_utf8_lossy(&aof);
    assert!(aof.contains("PXAT"), "{aof}");
    assert!(!aof.to_ascii_uppercase().contains("CACHE."), "{aof}");
}

// 5. Invalidate

#[test]
fn invalidate_revokes_the_lease_of_a_missing_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = take_lease(&mut c, "k");
    assert_eq!(int(&mut c, &["CACHE.INVALIDATE", "k"]), 0);
    assert_eq!(fill(&mut c, "k", token, "loaded before the write"), 0);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    run(&mut c, &["SET", "k", "v"]).unwrap();
    assert_eq!(int(&mut c, &["CACHE.INVALIDATE", "k"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn a_stale_value_is_served_while_one_reader_refreshes_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "old"]).unwrap();
    assert_eq!(int(&mut c, &["CACHE.INVALIDATE", "k", "STALE", "30000"]), 1);
    assert!((1..=30000).contains(&int(&mut c, &["PTTL", "k"])));
    let (value, token) = get(&mut c, &["CACHE.GET", "k", "60000"]);
    assert_eq!(value.as_deref(), Some("old"));
    let token = token.expect("the first reader refreshes");
    assert_eq!(
        get(&mut c, &["CACHE.GET", "k", "60000"]),
        (Some("old".into()), None)
    );
    // FRESH: a stale value counts as a miss (the lease is out: nil, nil).
    assert_eq!(
        get(&mut c, &["CACHE.GET", "k", "60000", "FRESH"]),
        (None, None)
    );
    let plain: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(plain, "old");
    assert_eq!(field_str(&cache_info(&mut c, "k"), "value"), "stale");
    assert_eq!(fill(&mut c, "k", token, "new"), 1);
    assert_eq!(field_str(&cache_info(&mut c, "k"), "value"), "hit");
    assert_eq!(
        get(&mut c, &["CACHE.GET", "k", "60000", "FRESH"]),
        (Some("new".into()), None)
    );
    assert_eq!(warden_stat(&mut c, "cache_stale_served"), 2);
    // A missing key has nothing to keep stale.
    assert_eq!(
        int(&mut c, &["CACHE.INVALIDATE", "gone", "STALE", "1000"]),
        0
    );
}

#[test]
fn a_fresh_reader_waits_for_the_refresh_of_a_stale_value() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "old"]).unwrap();
    int(&mut c, &["CACHE.INVALIDATE", "k", "STALE", "30000"]);
    let (_, token) = get(&mut c, &["CACHE.GET", "k", "60000"]);
    let (_, w) = spawn_waiter(&s, &["CACHE.GET", "k", "60000", "WAIT", "0", "FRESH"]);
    wait_waiters(&mut c, "k", 1);
    assert_eq!(fill(&mut c, "k", token.unwrap(), "new"), 1);
    assert_eq!(answer(w), (Some("new".into()), None));
}

// 6. Other writes

#[test]
fn any_other_write_revokes_the_lease() {
    // (setup after the lease on "k" was taken, with "k" holding "v" or missing)
    let writes: &[(&str, bool, &[&[&str]])] = &[
        ("SET", false, &[&["SET", "k", "x"]]),
        ("DEL", true, &[&["DEL", "k"]]),
        ("UNLINK", true, &[&["UNLINK", "k"]]),
        ("APPEND", true, &[&["APPEND", "k", "x"]]),
        ("EXPIRE", true, &[&["PEXPIRE", "k", "100000"]]),
        ("RENAME away", true, &[&["RENAME", "k", "other"]]),
        (
            "RENAME onto",
            false,
            &[&["SET", "src", "x"], &["RENAME", "src", "k"]],
        ),
        ("MOVE", true, &[&["MOVE", "k", "1"]]),
        ("FLUSHDB", true, &[&["FLUSHDB"]]),
        ("FLUSHALL", false, &[&["FLUSHALL"]]),
        ("SWAPDB", false, &[&["SWAPDB", "0", "1"]]),
    ];
    for (name, with_value, commands) in writes {
        let s = Server::start(&[]);
        let mut c = s.conn();
        let token = if *with_value {
            run(&mut c, &["SET", "k", "v", "PX", "100000"]).unwrap();
            let (_, t) = get(&mut c, &["CACHE.GET", "k", "60000", "REFRESH", "200000"]);
            t.unwrap()
        } else {
            take_lease(&mut c, "k")
        };
        for words in commands.iter() {
            run(&mut c, words).unwrap();
        }
        assert_eq!(fill(&mut c, "k", token, "late"), 0, "{name}");
        assert_eq!(warden_stat(&mut c, "cache_entries"), 0, "{name}");
    }
}

/// Writes that find the key missing, which Redis announces with no keyspace
/// event (or only with `expired`), still revoke its lease.
#[test]
fn a_write_that_finds_no_key_revokes_its_lease() {
    // (name, commands run after a lease on the missing "k" was taken)
    let writes: &[(&str, &[&[&str]])] = &[
        ("DEL", &[&["DEL", "k"]]),
        ("DEL of several", &[&["DEL", "a", "k", "b"]]),
        ("UNLINK", &[&["UNLINK", "k"]]),
        ("GETDEL", &[&["GETDEL", "k"]]),
        ("lower-case del", &[&["del", "k"]]),
        ("DEL inside MULTI", &[&["MULTI"], &["DEL", "k"], &["EXEC"]]),
        (
            "DEL inside a script",
            &[&["EVAL", "return redis.call('DEL', KEYS[1])", "1", "k"]],
        ),
        ("SUNIONSTORE of nothing", &[&["SUNIONSTORE", "k", "none"]]),
        (
            "ZUNIONSTORE of nothing",
            &[&["ZUNIONSTORE", "k", "1", "none"]],
        ),
        (
            "SORT ... STORE of nothing",
            &[&["SORT", "none", "STORE", "k"]],
        ),
        ("BITOP of nothing", &[&["BITOP", "OR", "k", "none"]]),
        ("FLUSHALL of an empty server", &[&["FLUSHALL"]]),
        ("FLUSHDB of an empty db", &[&["FLUSHDB"]]),
        ("SWAPDB of empty dbs", &[&["SWAPDB", "0", "1"]]),
        (
            "MOVE onto it",
            &[
                &["SELECT", "1"],
                &["SET", "k", "x"],
                &["MOVE", "k", "0"],
                &["SELECT", "0"],
            ],
        ),
        (
            "COPY onto it",
            &[&["SET", "src", "x"], &["COPY", "src", "k"]],
        ),
        (
            "RENAME onto it",
            &[&["SET", "src", "x"], &["RENAME", "src", "k"]],
        ),
    ];
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (name, commands) in writes {
        run(&mut c, &["FLUSHALL"]).unwrap();
        let token = take_lease(&mut c, "k");
        for words in commands.iter() {
            run(&mut c, words).unwrap();
        }
        assert_eq!(fill(&mut c, "k", token, "late"), 0, "{name}");
        assert_eq!(warden_stat(&mut c, "cache_entries"), 0, "{name}");
    }
    // RESTORE ... REPLACE onto it.
    run(&mut c, &["FLUSHALL"]).unwrap();
    run(&mut c, &["SET", "src", "x"]).unwrap();
    let dump = match run(&mut c, &["DUMP", "src"]).unwrap() {
        Value::BulkString(b) => b,
        other => panic!("{other:?}"),
    };
    let token = take_lease(&mut c, "k");
    let _: () = redis::cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .query(&mut c)
        .unwrap();
    assert_eq!(fill(&mut c, "k", token, "late"), 0, "RESTORE REPLACE");
}

#[test]
fn a_del_of_an_expired_value_revokes_its_refresh_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v", "PX", "100"]).unwrap();
    let (_, token) = get(&mut c, &["CACHE.GET", "k", "60000", "REFRESH", "1000"]);
    wait_for("the value to expire", Duration::from_secs(10), || {
        int(&mut c, &["EXISTS", "k"]) == 0
    });
    assert_eq!(int(&mut c, &["DEL", "k"]), 0);
    assert_eq!(fill(&mut c, "k", token.unwrap(), "late"), 0);
}

#[test]
fn a_del_of_a_missing_key_passes_the_lease_to_the_oldest_waiter() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = take_lease(&mut c, "k");
    let (_, first) = waiter(&s, "k", "20000");
    wait_waiters(&mut c, "k", 1);
    assert_eq!(int(&mut c, &["DEL", "k"]), 0);
    let (value, next) = answer(first);
    assert_eq!(value, None);
    assert!(next.unwrap() > token);
    assert_eq!(fill(&mut c, "k", token, "late"), 0);
}

#[test]
fn an_expired_value_keeps_its_refresh_lease_and_readers_wait_for_its_fill() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v", "PX", "100"]).unwrap();
    let (_, token) = get(&mut c, &["CACHE.GET", "k", "60000", "REFRESH", "1000"]);
    let token = token.unwrap();
    wait_for("the value to expire", Duration::from_secs(10), || {
        int(&mut c, &["EXISTS", "k"]) == 0
    });
    let mut other = s.conn();
    // No second load: the refresh lease is the key's one lease.
    assert_eq!(get(&mut other, &["CACHE.GET", "k", "60000"]), (None, None));
    let (_, pending) = waiter(&s, "k", "0");
    wait_waiters(&mut c, "k", 1);
    assert_eq!(fill(&mut c, "k", token, "v2"), 1);
    assert_eq!(answer(pending), (Some("v2".into()), None));
    assert_eq!(warden_stat(&mut c, "cache_leases"), 1);
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
}

// 7. Tokens, replicas, failover

#[test]
fn lease_tokens_come_from_the_fencing_counter_and_die_with_a_restart() {
    let mut s = Server::start(&["--appendonly", "yes"]);
    let mut c = s.conn();
    let lock = int(&mut c, &["LOCK.ACQUIRE", "l", "me", "60000"]);
    let a = take_lease(&mut c, "a");
    let b = take_lease(&mut c, "b");
    assert!(lock < a && a < b);
    s.restart(true);
    let mut c = s.conn();
    assert_eq!(fill(&mut c, "a", a, "v"), 0, "leases are not persisted");
    assert!(take_lease(&mut c, "a") > b, "never reused across restarts");
}

#[test]
fn replicas_answer_readonly_to_every_cache_command() {
    for writable in ["yes", "no"] {
        let master = Server::start_tcp(&[]);
        let replica = Server::start_tcp(&["--replica-read-only", writable]);
        replicate(&master, &replica);
        let mut r = replica.conn();
        for words in [
            &["CACHE.GET", "k", "1000"][..],
            &["CACHE.GET", "k", "1000", "WAIT", "0"],
            &["CACHE.FILL", "k", "1", "v"],
            &["CACHE.ABANDON", "k", "1"],
            &["CACHE.INVALIDATE", "k"],
        ] {
            assert!(
                err(&mut r, words).starts_with("READONLY"),
                "{writable}: {words:?}"
            );
        }
    }
}

/// `CACHE.INFO` is no write: a replica answers it from its keys, with no
/// lease and no waiters (leases live in the master's memory only).
#[test]
fn a_replica_answers_cache_info_from_its_keys() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    run(&mut m, &["SET", "hit", "v", "PX", "600000"]).unwrap();
    run(&mut m, &["SET", "forever", "v"]).unwrap();
    take_lease(&mut m, "miss");
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    // (key, value, ttl: -1 none, -2 missing, 0 some)
    let cases = [
        ("hit", "hit", 0),
        ("forever", "hit", -1),
        ("miss", "miss", -2),
    ];
    for (key, value, ttl) in cases {
        let info = cache_info(&mut r, key);
        assert_eq!(field_str(&info, "value"), value, "{key}");
        match ttl {
            0 => assert!(field_int(&info, "ttl") > 0, "{key}: {info:?}"),
            t => assert_eq!(field_int(&info, "ttl"), t, "{key}"),
        }
        let lease = info.iter().find(|(k, _)| k == "lease").map(|(_, v)| v);
        assert_eq!(lease, Some(&Value::Nil), "{key}: no lease on a replica");
        assert_eq!(field_int(&info, "lease_ttl"), -2, "{key}");
        assert_eq!(field_int(&info, "waiters"), 0, "{key}");
    }
    let master_view = cache_info(&mut m, "miss");
    assert!(
        field_int(&master_view, "lease_ttl") > 0,
        "the master has it"
    );
}

/// Over `maxmemory` a miss that would grant a lease or queue a waiter gets
/// the server's own OOM and allocates nothing; hits are served (a due
/// refresh without its lease), and a miss that would allocate nothing too.
#[test]
fn over_maxmemory_a_miss_answers_oom_and_a_hit_is_served() {
    const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
    const LIMIT: i64 = 8 << 20;
    let s = Server::start(&["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]);
    let mut c = s.conn();
    run(&mut c, &["SET", "hit", "v"]).unwrap();
    run(&mut c, &["SET", "hot", "h", "PX", "600000"]).unwrap();
    take_lease(&mut c, "held");
    // One connection takes leases on long names until the server says OOM.
    let pad = "k".repeat(1000);
    let mut refused = None;
    for i in 0..20_000 {
        if let Err(e) = run(&mut c, &["CACHE.GET", &format!("{pad}{i}"), "600000"]) {
            refused = Some((i, error_text(&e)));
            break;
        }
    }
    let (leases, text) = refused.expect("20,000 leases of 1 KB granted under maxmemory 8mb");
    assert_eq!(text, OOM, "after {leases} leases");
    let used = used_memory(&mut c);
    assert!(
        used < LIMIT + (1 << 20),
        "used_memory {used} past maxmemory"
    );
    // Well over the limit now (at the limit itself used memory goes up and
    // down by a few bytes between commands): every miss is refused.
    let lower = (used - (1 << 20)).to_string();
    run(&mut c, &["CONFIG", "SET", "maxmemory", &lower]).unwrap();
    for i in 0..200 {
        let e = err(&mut c, &["CACHE.GET", &format!("more{i}"), "600000"]);
        assert_eq!(e, OOM);
    }
    assert!(
        used_memory(&mut c) < used + (64 << 10),
        "refused misses allocated"
    );
    // (command, expected reply: Ok((value, leased)) or Err(error text))
    type Expected<'a> = Result<(Option<&'a str>, bool), &'a str>;
    let cases: [(&[&str], Expected); 5] = [
        (&["CACHE.GET", "hit", "1000"], Ok((Some("v"), false))),
        (
            &["CACHE.GET", "hot", "1000", "REFRESH", "3600000"],
            Ok((Some("h"), false)),
        ),
        (&["CACHE.GET", "held", "1000"], Ok((None, false))),
        (&["CACHE.GET", "held", "1000", "WAIT", "100"], Err(OOM)),
        (&["CACHE.GET", "new", "1000"], Err(OOM)),
    ];
    for (words, expected) in cases {
        match expected {
            Ok((value, leased)) => {
                let (v, lease) = get(&mut c, words);
                assert_eq!(
                    (v.as_deref(), lease.is_some()),
                    (value, leased),
                    "{words:?}"
                );
            }
            Err(text) => assert_eq!(err(&mut c, words), text, "{words:?}"),
        }
    }
    assert_eq!(waiters(&mut c, "held"), 0, "nobody queued");
}

#[test]
fn a_promoted_replica_refuses_the_old_masters_leases() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let token = take_lease(&mut m, "k");
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert_eq!(fill(&mut r, "k", token, "v"), 0);
    let next = take_lease(&mut r, "k");
    assert!(next > token, "{next} after {token}");
}

// 8. MULTI, scripts, memory, types, arguments

#[test]
fn wait_never_blocks_inside_multi_or_scripts() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut holder = s.conn();
    take_lease(&mut holder, "k");
    let mut p = redis::pipe();
    p.atomic()
        .cmd("CACHE.GET")
        .arg("k")
        .arg(1000)
        .arg("WAIT")
        .arg(0);
    let (reply,): (Vec<Value>,) = p.query(&mut c).unwrap();
    assert_eq!(reply, vec![Value::Nil, Value::Nil]);
    let script = "return redis.call('CACHE.GET', KEYS[1], 1000, 'WAIT', 0)";
    let reply: Vec<Value> = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("k")
        .query(&mut c)
        .unwrap();
    assert_eq!(reply, vec![Value::Nil, Value::Nil]);
    assert_eq!(waiters(&mut c, "k"), 0);
}

#[test]
fn scripts_and_functions_get_values_but_no_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let library = "#!lua name=cachelib\n\
        redis.register_function('cget', function(keys, args) \
        return redis.call('CACHE.GET', keys[1], args[1], 'REFRESH', 100000) end)";
    run(&mut c, &["FUNCTION", "LOAD", library]).unwrap();
    let eval: &[&str] = &[
        "EVAL",
        "return redis.call('CACHE.GET', KEYS[1], ARGV[1], 'REFRESH', 100000)",
        "1",
    ];
    for (how, call) in [("EVAL", eval), ("FCALL", &["FCALL", "cget", "1"][..])] {
        let words = |key: &'static str| [call, &[key, "60000"]].concat();
        // A miss would need a lease that outlives the caller: refused.
        let e = err(&mut c, &words("miss"));
        assert!(
            e.starts_with("ERR CACHE.GET grants no lease inside a script"),
            "{how}: {e}"
        );
        assert_eq!(warden_stat(&mut c, "cache_entries"), 0, "{how}");
        // A hit due for refresh is served without the refresh lease...
        run(&mut c, &["SET", "hit", "v", "PX", "50000"]).unwrap();
        match run(&mut c, &words("hit")).unwrap() {
            Value::Array(v) => assert_eq!(v, vec![Value::BulkString(b"v".to_vec()), Value::Nil]),
            other => panic!("{how}: {other:?}"),
        }
        // ... which a reader outside any script then gets.
        let (value, token) = get(&mut c, &["CACHE.GET", "hit", "60000", "REFRESH", "100000"]);
        assert_eq!(value.as_deref(), Some("v"), "{how}");
        let token = token.unwrap_or_else(|| panic!("{how}: the refresh lease"));
        assert_eq!(
            int(&mut c, &["CACHE.ABANDON", "hit", &token.to_string()]),
            1
        );
    }
    // MULTI keeps the caller's connection: its leases are granted.
    let mut p = redis::pipe();
    p.atomic().cmd("CACHE.GET").arg("m").arg(60000);
    let (reply,): (Vec<Value>,) = p.query(&mut c).unwrap();
    assert!(
        matches!(reply[..], [Value::Nil, Value::Int(_)]),
        "{reply:?}"
    );
}

#[test]
fn a_stale_mark_is_never_left_behind_by_a_key_that_expires_at_once() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    const KEYS: usize = 2_000;
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("SET").arg(format!("k{i}")).arg("v").ignore();
        p.cmd("CACHE.INVALIDATE")
            .arg(format!("k{i}"))
            .arg("STALE")
            .arg(1)
            .ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    wait_for(
        "the stale values to expire",
        Duration::from_secs(20),
        || {
            let mut p = redis::pipe();
            for i in 0..KEYS {
                p.cmd("EXISTS").arg(format!("k{i}"));
            }
            let left: Vec<i64> = p.query(&mut c).unwrap();
            left.iter().sum::<i64>() == 0
        },
    );
    // Each stale mark ends by itself, a bounded batch per turn.
    wait_for("the stale marks to end", Duration::from_secs(20), || {
        warden_stat(&mut c, "cache_entries") == 0
    });
    assert_eq!(warden_stat(&mut c, "cache_listening"), 0);
}

/// However many leases one client holds, they end a bounded batch at a time
/// (other clients are served between batches), whichever way they end.
#[test]
fn many_leases_end_in_bounded_batches() {
    const LEASES: usize = 20_000;
    const BATCH: i64 = 256;
    for how in ["lapse", "disconnect", "flushall", "del"] {
        let s = Server::start(&[]);
        let mut c = s.conn();
        let mut holder = s.conn();
        let lease_ms = if how == "lapse" { 2_000 } else { 600_000 };
        let mut p = redis::pipe();
        for i in 0..LEASES {
            p.cmd("CACHE.GET")
                .arg(format!("k{i}"))
                .arg(lease_ms)
                .ignore();
        }
        let _: () = p.query(&mut holder).unwrap();
        // One of the keys has a waiter: it gets the lease when it ends.
        let (_, pending) = waiter(&s, "k7", "0");
        wait_waiters(&mut c, "k7", 1);
        match how {
            "disconnect" => drop(holder),
            "flushall" => run(&mut c, &["FLUSHALL"]).map(drop).unwrap(),
            "del" => {
                let mut p = redis::pipe();
                for i in 0..LEASES {
                    p.cmd("DEL").arg(format!("k{i}")).ignore();
                }
                let _: () = p.query(&mut c).unwrap();
            }
            _ => {}
        }
        let (_, next) = answer(pending);
        assert!(next.is_some(), "{how}: the waiter's lease");
        wait_for("the leases to end", Duration::from_secs(30), || {
            warden_stat(&mut c, "cache_entries") <= 1
        });
        let largest = warden_stat(&mut c, "cache_max_batch");
        assert!(
            (1..=BATCH).contains(&largest),
            "{how}: {largest} steps in one callback"
        );
    }
}

#[test]
fn lease_entries_go_when_their_leases_end() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let baseline = used_memory(&mut c);
    const KEYS: usize = 20_000;
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("CACHE.GET").arg(format!("k{i}")).arg(60_000);
    }
    let leases: Vec<(Value, i64)> = p.query(&mut c).unwrap();
    assert_eq!(warden_stat(&mut c, "cache_entries"), KEYS as i64);
    let mut p = redis::pipe();
    for (i, (_, token)) in leases.iter().enumerate() {
        match i % 3 {
            0 => p
                .cmd("CACHE.FILL")
                .arg(format!("k{i}"))
                .arg(*token)
                .arg("v"),
            1 => p.cmd("CACHE.ABANDON").arg(format!("k{i}")).arg(*token),
            _ => p
                .cmd("CACHE.INVALIDATE")
                .arg(format!("k{i}"))
                .arg("STALE")
                .arg(1),
        }
        .ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    run(&mut c, &["FLUSHALL"]).unwrap();
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
    let after = used_memory(&mut c);
    assert!(
        after < baseline + (2 << 20),
        "{} bytes above baseline",
        after - baseline
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["LPUSH", "list", "x"]).unwrap();
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    const SYNTAX: &str = "ERR syntax error";
    const LEASE_MS: &str =
        "ERR invalid lease_ms: expected an integer from 1 to 70368744177664 (ms)";
    const TIMEOUT: &str = "ERR invalid timeout: expected an integer from 0 to 70368744177664 (ms)";
    const REFRESH: &str = "ERR invalid REFRESH: expected an integer from 1 to 70368744177664 (ms)";
    const LEASE: &str = "ERR invalid lease: expected an integer from 1 to 9223372036854775807";
    const PX: &str = "ERR invalid PX: expected an integer from 1 to 70368744177664 (ms)";
    const JITTER: &str = "ERR invalid JITTER: expected an integer from 0 to 70368744177664 (ms)";
    const STALE: &str = "ERR invalid STALE: expected an integer from 1 to 70368744177664 (ms)";
    let cases: &[(&[&str], &str)] = &[
        (&["CACHE.GET", "list", "1000"], WRONGTYPE),
        (
            &["CACHE.GET", "k"],
            "ERR wrong number of arguments for 'cache.get' command",
        ),
        (&["CACHE.GET", "k", "0"], LEASE_MS),
        (&["CACHE.GET", "k", "x"], LEASE_MS),
        (&["CACHE.GET", "k", "70368744177665"], LEASE_MS),
        (&["CACHE.GET", "k", "10", "WAIT", "-1"], TIMEOUT),
        (&["CACHE.GET", "k", "10", "WAIT", "-0"], TIMEOUT),
        (&["CACHE.GET", "k", "10", "WAIT"], SYNTAX),
        (&["CACHE.GET", "k", "10", "REFRESH", "0"], REFRESH),
        (&["CACHE.GET", "k", "10", "REFRESH"], SYNTAX),
        (&["CACHE.GET", "k", "10", "FRESH", "FRESH"], SYNTAX),
        (&["CACHE.GET", "k", "10", "WAIT", "1", "WAIT", "1"], SYNTAX),
        (&["CACHE.GET", "k", "10", "STALE", "1"], SYNTAX),
        (
            &["CACHE.FILL", "k", "1"],
            "ERR wrong number of arguments for 'cache.fill' command",
        ),
        (&["CACHE.FILL", "k", "0", "v"], LEASE),
        (&["CACHE.FILL", "k", "9223372036854775808", "v"], LEASE),
        (&["CACHE.FILL", "k", "1", "v", "PX", "0"], PX),
        (&["CACHE.FILL", "k", "1", "v", "PX"], SYNTAX),
        (
            &["CACHE.FILL", "k", "1", "v", "JITTER", "5"],
            "ERR JITTER needs PX",
        ),
        (
            &["CACHE.FILL", "k", "1", "v", "PX", "5", "JITTER", "-1"],
            JITTER,
        ),
        (&["CACHE.FILL", "k", "1", "v", "PX", "5", "JITTER"], SYNTAX),
        (&["CACHE.FILL", "k", "1", "v", "PX", "5", "PX", "5"], SYNTAX),
        (&["CACHE.FILL", "k", "1", "v", "EX", "5"], SYNTAX),
        (&["CACHE.ABANDON", "k", "-3"], LEASE),
        (
            &["CACHE.ABANDON", "k"],
            "ERR wrong number of arguments for 'cache.abandon' command",
        ),
        (&["CACHE.INVALIDATE", "k", "STALE"], SYNTAX),
        (&["CACHE.INVALIDATE", "k", "STALE", "0"], STALE),
        (
            &["CACHE.INVALIDATE", "k", "STALE", "1", "STALE", "1"],
            SYNTAX,
        ),
        (&["CACHE.INVALIDATE", "k", "KEEP", "1"], SYNTAX),
        (&["CACHE.INVALIDATE", "list"], WRONGTYPE),
        (&["CACHE.INFO", "list"], WRONGTYPE),
    ];
    for (words, expected) in cases {
        assert_eq!(&err(&mut c, words), expected, "{words:?}");
    }
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    assert_eq!(int(&mut c, &["LLEN", "list"]), 1);
}

#[test]
fn fills_and_invalidations_are_keyspace_events_and_commands_are_documented() {
    let s = Server::start(&["--notify-keyspace-events", "KEA"]);
    let mut c = s.conn();
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:k").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let token = take_lease(&mut c, "k");
    fill(&mut c, "k", token, "v");
    int(&mut c, &["CACHE.INVALIDATE", "k"]);
    let events: Vec<String> = (0..4)
        .map(|_| {
            pubsub
                .get_message()
                .unwrap()
                .get_payload::<String>()
                .unwrap()
        })
        .collect();
    assert_eq!(events, ["set", "cache.fill", "del", "cache.invalidate"]);
    drop(pubsub);
    let docs = format!(
        "{:?}",
        run(&mut c, &["COMMAND", "DOCS", "cache.get"]).unwrap()
    );
    assert!(docs.contains("REFRESH") && docs.contains("FRESH"), "{docs}");
}
