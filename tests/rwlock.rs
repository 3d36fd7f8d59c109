//! RWLOCK.* against a real redis-server.

mod common;

use std::thread;
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

fn info(c: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    maybe_map(c, &["RWLOCK.INFO", key])
}

fn read(c: &mut Connection, key: &str, owner: &str) -> Value {
    run(c, &["RWLOCK.READ", key, owner, "60000"]).unwrap()
}

fn write(c: &mut Connection, key: &str, owner: &str) -> Value {
    run(c, &["RWLOCK.WRITE", key, owner, "60000"]).unwrap()
}

fn fence(v: Value) -> i64 {
    match v {
        Value::Int(n) => n,
        other => panic!("expected a fence, got {other:?}"),
    }
}

fn queued(c: &mut Connection, key: &str, n: i64) {
    wait_queued(c, "RWLOCK.INFO", key, n);
}

#[test]
fn readers_share_and_a_writer_excludes() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let a = fence(read(&mut c, "k", "r1"));
    let b = fence(read(&mut c, "k", "r2"));
    assert!(b > a);
    assert_eq!(write(&mut c, "k", "w"), Value::Nil);
    let f = info(&mut c, "k").unwrap();
    assert_eq!(field_str(&f, "mode"), "read");
    assert_eq!(f[1].1, Value::Nil);
    assert_eq!(field_int(&f, "readers"), 2);
    assert_eq!(field_int(&f, "holds"), 2);
    assert_eq!(field_int(&f, "fence"), b);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r1"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r2"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    let w = fence(write(&mut c, "k", "w"));
    assert!(w > b);
    assert_eq!(read(&mut c, "k", "r1"), Value::Nil);
    assert_eq!(write(&mut c, "k", "w2"), Value::Nil);
    let f = info(&mut c, "k").unwrap();
    assert_eq!(field_str(&f, "mode"), "write");
    assert_eq!(field_str(&f, "writer"), "w");
    assert_eq!(field_int(&f, "readers"), 0);
    let t: String = redis::cmd("TYPE").arg("k").query(&mut c).unwrap();
    assert_eq!(t, "warden-rw");
}

#[test]
fn both_modes_are_reentrant() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = fence(write(&mut c, "w", "a"));
    assert_eq!(fence(write(&mut c, "w", "a")), w);
    assert_eq!(field_int(&info(&mut c, "w").unwrap(), "holds"), 2);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "w", "a"]), 0);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "w", "a"]), 1);
    let r = fence(read(&mut c, "r", "a"));
    assert_eq!(fence(read(&mut c, "r", "a")), r);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "r", "a"]), 0);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "r", "a"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "r", "a"]), -1);
}

#[test]
fn downgrade_then_keep_reading() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = fence(write(&mut c, "k", "a"));
    let r = fence(read(&mut c, "k", "a"));
    assert!(r > w);
    assert_eq!(field_int(&info(&mut c, "k").unwrap(), "holds"), 2);
    assert_eq!(
        int(&mut c, &["RWLOCK.UNLOCK", "k", "a"]),
        1,
        "the write hold goes first"
    );
    let f = info(&mut c, "k").unwrap();
    assert_eq!(field_str(&f, "mode"), "read");
    assert_eq!(field_int(&f, "readers"), 1);
    assert!(matches!(read(&mut c, "k", "b"), Value::Int(_)));
}

#[test]
fn upgrade_is_refused() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    read(&mut c, "k", "a");
    assert_eq!(
        err(&mut c, &["RWLOCK.WRITE", "k", "a", "1000"]),
        "ERR cannot upgrade a read lock to a write lock"
    );
    assert_eq!(field_str(&info(&mut c, "k").unwrap(), "mode"), "read");
}

#[test]
fn one_readers_lease_ends_while_anothers_continues() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["RWLOCK.READ", "k", "short", "50"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "k", "long", "60000"]).unwrap();
    assert!(
        int(&mut c, &["PTTL", "k"]) > 50000,
        "the key lives as long as the last lease"
    );
    wait_for("short lease end", Duration::from_secs(5), || {
        field_int(&info(&mut c, "k").unwrap(), "readers") == 1
    });
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "short"]), -1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "long"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn extend_resets_every_lease_of_the_owner() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["RWLOCK.WRITE", "k", "a", "1000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "k", "a", "1000"]).unwrap();
    assert_eq!(int(&mut c, &["RWLOCK.EXTEND", "k", "b", "90000"]), 0);
    assert_eq!(int(&mut c, &["RWLOCK.EXTEND", "k", "a", "90000"]), 1);
    assert!(int(&mut c, &["PTTL", "k"]) > 80000);
    assert!(field_int(&info(&mut c, "k").unwrap(), "ttl") > 80000);
    assert_eq!(int(&mut c, &["RWLOCK.EXTEND", "none", "a", "100"]), 0);
}

#[test]
fn a_waiting_writer_blocks_new_readers_but_not_reentering_ones() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    read(&mut c, "k", "r1");
    let (_, w) = spawn_command(&s, &["RWLOCK.WRITE", "k", "w", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 1);
    assert_eq!(read(&mut c, "k", "newcomer"), Value::Nil);
    assert!(matches!(read(&mut c, "k", "r1"), Value::Int(_)));
    let (_, late) = spawn_command(&s, &["RWLOCK.READ", "k", "late", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 2);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r1"]), 0);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r1"]), 1);
    let wf = granted(w);
    let f = info(&mut c, "k").unwrap();
    assert_eq!(field_str(&f, "writer"), "w");
    assert_eq!(field_int(&f, "waiters"), 1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "w"]), 1);
    assert!(granted(late) > wf);
}

#[test]
fn readers_at_the_head_are_granted_together() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    write(&mut c, "k", "w");
    let mut pending = Vec::new();
    for (i, (cmd, owner)) in [
        ("RWLOCK.READ", "r1"),
        ("RWLOCK.READ", "r2"),
        ("RWLOCK.READ", "r3"),
        ("RWLOCK.WRITE", "w2"),
        ("RWLOCK.READ", "r4"),
    ]
    .iter()
    .enumerate()
    {
        pending.push(spawn_command(&s, &[cmd, "k", owner, "60000", "WAIT", "0"]).1);
        queued(&mut c, "k", i as i64 + 1);
    }
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "w"]), 1);
    let mut pending = pending.into_iter();
    for _ in 0..3 {
        granted(pending.next().unwrap());
    }
    let f = info(&mut c, "k").unwrap();
    assert_eq!(field_int(&f, "readers"), 3);
    assert_eq!(field_int(&f, "waiters"), 2);
    for r in ["r1", "r2", "r3"] {
        int(&mut c, &["RWLOCK.UNLOCK", "k", r]);
    }
    granted(pending.next().unwrap());
    assert_eq!(field_str(&info(&mut c, "k").unwrap(), "writer"), "w2");
    int(&mut c, &["RWLOCK.UNLOCK", "k", "w2"]);
    granted(pending.next().unwrap());
}

#[test]
fn hand_off_on_lease_end_del_flush_and_overwrite() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["RWLOCK.WRITE", "k", "a", "100"]).unwrap();
    let (_, b) = spawn_command(&s, &["RWLOCK.WRITE", "k", "b", "60000", "WAIT", "0"]);
    granted(b);
    let (_, r) = spawn_command(&s, &["RWLOCK.READ", "k", "r", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 1);
    int(&mut c, &["DEL", "k"]);
    granted(r);
    let (_, w) = spawn_command(&s, &["RWLOCK.WRITE", "k", "w", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 1);
    run(&mut c, &["FLUSHALL"]).unwrap();
    granted(w);
    let (_, x) = spawn_command(&s, &["RWLOCK.READ", "k", "x", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 1);
    run(&mut c, &["SET", "k", "v"]).unwrap();
    assert!(error_text(&x.join().unwrap().unwrap_err()).starts_with("WRONGTYPE"));
}

#[test]
fn timeouts_disconnects_and_scripts_follow_the_lock_rules() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    write(&mut c, "k", "a");
    let (_, t) = spawn_command(&s, &["RWLOCK.READ", "k", "t", "60000", "WAIT", "100"]);
    assert_eq!(t.join().unwrap().unwrap(), Value::Nil);
    let (id, killed) = spawn_command(&s, &["RWLOCK.WRITE", "k", "killed", "60000", "WAIT", "0"]);
    queued(&mut c, "k", 1);
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert!(killed.join().unwrap().is_err());
    let v = run(
        &mut c,
        &[
            "EVAL",
            "return redis.call('RWLOCK.READ', KEYS[1], 'e', 1000, 'WAIT', 0)",
            "1",
            "k",
        ],
    )
    .unwrap();
    assert_eq!(v, Value::Nil);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "a"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn wrong_types_between_lock_kinds() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "lock", "a", "10000"]);
    read(&mut c, "rw", "a");
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(err(&mut c, &["RWLOCK.READ", "lock", "a", "100"]), wrongtype);
    assert_eq!(
        err(&mut c, &["RWLOCK.WRITE", "lock", "a", "100"]),
        wrongtype
    );
    assert_eq!(err(&mut c, &["RWLOCK.UNLOCK", "lock", "a"]), wrongtype);
    assert_eq!(
        err(&mut c, &["RWLOCK.EXTEND", "lock", "a", "100"]),
        wrongtype
    );
    assert_eq!(err(&mut c, &["RWLOCK.INFO", "lock"]), wrongtype);
    assert_eq!(err(&mut c, &["LOCK.ACQUIRE", "rw", "a", "100"]), wrongtype);
    assert_eq!(err(&mut c, &["LOCK.INFO", "rw"]), wrongtype);
}

#[test]
fn hostile_inputs_are_refused_and_change_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let f = fence(read(&mut c, "held", "a"));
    let long = "o".repeat(1025);
    const TTL: &str = "ERR invalid ttl: expected an integer from 1 to 70368744177664 (ms)";
    const TIMEOUT: &str = "ERR invalid timeout: expected an integer from 0 to 70368744177664 (ms)";
    const OWNER: &str = "ERR invalid owner: expected a string of 1 to 1024 bytes";
    const SYNTAX: &str = "ERR syntax error";
    let cases: &[(&[&str], &str)] = &[
        (&["RWLOCK.READ", "k", "a", "0"], TTL),
        (&["RWLOCK.WRITE", "k", "a", "-1"], TTL),
        (&["RWLOCK.READ", "k", "a", "70368744177665"], TTL),
        (&["RWLOCK.WRITE", "k", "", "10"], OWNER),
        (&["RWLOCK.READ", "k", &long, "10"], OWNER),
        (&["RWLOCK.READ", "k", "a", "10", "WAIT", "x"], TIMEOUT),
        (&["RWLOCK.WRITE", "k", "a", "10", "WAIT", "-1"], TIMEOUT),
        (&["RWLOCK.READ", "k", "a", "10", "WAIT"], SYNTAX),
        (&["RWLOCK.WRITE", "k", "a", "10", "WAIT"], SYNTAX),
        (&["RWLOCK.READ", "k", "a", "10", "FOREVER"], SYNTAX),
        (
            &["RWLOCK.WRITE", "k", "a", "10", "WAIT", "1", "WAIT", "1"],
            SYNTAX,
        ),
        (&["RWLOCK.EXTEND", "held", "a", "0"], TTL),
        (&["RWLOCK.EXTEND", "held", "", "10"], OWNER),
        (&["RWLOCK.UNLOCK", "held", ""], OWNER),
        (
            &["WARDEN.RWSET", "held", "5", "W", "a", "1", "1", "1"],
            "ERR effect commands are accepted only from the master link and the AOF",
        ),
    ];
    for (words, expected) in cases {
        assert_eq!(&err(&mut c, words), expected, "{words:?}");
    }
    for words in [
        &["RWLOCK.READ", "k", "a"][..],
        &["RWLOCK.UNLOCK", "k"],
        &["RWLOCK.EXTEND", "k", "a"],
        &["RWLOCK.INFO"],
    ] {
        assert!(
            err(&mut c, words).starts_with("ERR wrong number of arguments"),
            "{words:?}"
        );
    }
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    let i = info(&mut c, "held").unwrap();
    assert_eq!((field_int(&i, "readers"), field_int(&i, "fence")), (1, f));
}

fn state(c: &mut Connection, key: &str) -> (Vec<(String, Value)>, i64) {
    let mut f = info(c, key).unwrap();
    f.retain(|(k, _)| k != "ttl");
    (f, int(c, &["PEXPIRETIME", key]))
}

#[test]
fn persistence_keeps_holders_and_leases() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    run(&mut c, &["RWLOCK.READ", "r", "a", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "r", "a", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "r", "b", "90000"]).unwrap();
    run(&mut c, &["RWLOCK.WRITE", "w", "x", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "w", "x", "60000"]).unwrap();
    let before = (state(&mut c, "r"), state(&mut c, "w"));
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!((state(&mut c, "r"), state(&mut c, "w")), before);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("r").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("r2")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(state(&mut c, "r2").0, state(&mut c, "r").0);
    assert_eq!(int(&mut c, &["COPY", "w", "w2"]), 1);
    assert_eq!(state(&mut c, "w2").0, before.1 .0);
    assert!(int(&mut c, &["MEMORY", "USAGE", "r"]) > 0);
    s.restart(false);
    let mut c = s.conn();
    assert_eq!((state(&mut c, "r"), state(&mut c, "w")), before);
    rewrite_aof(&mut c);
    s.restart(false);
    let mut c = s.conn();
    assert_eq!((state(&mut c, "r"), state(&mut c, "w")), before);
    let next = fence(write(&mut c, "fresh", "z"));
    assert!(next > field_int(&before.0 .0, "fence"));
    // corrupt payloads are refused, never crash
    restore_every_truncation(&mut c, &dump);
}

#[test]
fn the_replica_has_the_same_holders_and_leases() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    run(&mut m, &["RWLOCK.READ", "r", "a", "60000"]).unwrap();
    run(&mut m, &["RWLOCK.READ", "r", "b", "90000"]).unwrap();
    run(&mut m, &["RWLOCK.WRITE", "w", "x", "60000"]).unwrap();
    let (_, pending) = spawn_command(&master, &["RWLOCK.READ", "w", "y", "60000", "WAIT", "0"]);
    queued(&mut m, "w", 1);
    int(&mut m, &["RWLOCK.UNLOCK", "w", "x"]);
    granted(pending);
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    for key in ["r", "w"] {
        assert_eq!(state(&mut r, key), state(&mut m, key), "{key}");
    }
    assert!(err(&mut r, &["RWLOCK.READ", "r", "c", "100"]).starts_with("READONLY"));
}

#[test]
fn writers_and_readers_under_contention_never_see_torn_values() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["MSET", "a", "0", "b", "0"]).unwrap();
    let mut workers = Vec::new();
    for w in 0..6 {
        let mut con = s.conn();
        workers.push(thread::spawn(move || {
            let owner = format!("writer-{w}");
            for _ in 0..50 {
                int(
                    &mut con,
                    &["RWLOCK.WRITE", "rw", &owner, "30000", "WAIT", "30000"],
                );
                let n: i64 = redis::cmd("GET").arg("a").query(&mut con).unwrap();
                run(&mut con, &["SET", "a", &(n + 1).to_string()]).unwrap();
                run(&mut con, &["SET", "b", &(n + 1).to_string()]).unwrap();
                assert_eq!(int(&mut con, &["RWLOCK.UNLOCK", "rw", &owner]), 1);
            }
        }));
    }
    for r in 0..6 {
        let mut con = s.conn();
        workers.push(thread::spawn(move || {
            let owner = format!("reader-{r}");
            for _ in 0..50 {
                int(
                    &mut con,
                    &["RWLOCK.READ", "rw", &owner, "30000", "WAIT", "30000"],
                );
                let a: i64 = redis::cmd("GET").arg("a").query(&mut con).unwrap();
                let b: i64 = redis::cmd("GET").arg("b").query(&mut con).unwrap();
                assert_eq!(a, b, "torn read");
                assert_eq!(int(&mut con, &["RWLOCK.UNLOCK", "rw", &owner]), 1);
            }
        }));
    }
    for w in workers {
        w.join().unwrap();
    }
    let n: i64 = redis::cmd("GET").arg("a").query(&mut c).unwrap();
    assert_eq!(n, 300);
    let info: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(
        info.contains("wait_timeouts:0") && info.contains("waiting_clients:0"),
        "{info}"
    );
}

/// Like an exclusive lock, a read-write lock whose key lost its expiry
/// (`PERSIST`, `RESTORE` without a ttl) gets its latest lease back on the
/// key at the next warden command, even one that changes nothing.
#[test]
fn a_read_write_lock_key_gets_its_lease_back_after_persist_or_restore() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for case in ["PERSIST", "RESTORE"] {
        let key = format!("rw-{case}");
        match case {
            "PERSIST" => {
                fence(read(&mut c, &key, "r"));
                assert_eq!(int(&mut c, &["PERSIST", &key]), 1);
            }
            _ => {
                fence(write(&mut c, "src", "w"));
                let payload: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
                let _: () = redis::cmd("RESTORE")
                    .arg(&key)
                    .arg(0)
                    .arg(payload)
                    .query(&mut c)
                    .unwrap();
            }
        }
        assert_eq!(
            int(&mut c, &["PTTL", &key]),
            -1,
            "{case}: the key lost its expiry"
        );
        assert_eq!(write(&mut c, &key, "other"), Value::Nil, "{case}");
        let pttl = int(&mut c, &["PTTL", &key]);
        assert!((1..=60_000).contains(&pttl), "{case}: PTTL {pttl}");
        let ttl = field_int(&info(&mut c, &key).unwrap(), "ttl");
        assert!(
            (pttl - ttl).abs() < 1000,
            "{case}: PTTL {pttl}, lease {ttl}"
        );
    }
}
