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
fn a_downgraded_owner_names_the_mode_it_lets_go() {
    // Nested blocks let go of the read first: `READ` keeps the write hold
    // (the form without a mode would end it), on the master and its replica.
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut c = master.conn();
    fence(write(&mut c, "k", "a"));
    fence(read(&mut c, "k", "a"));
    let cases: &[(&[&str], i64, &str)] = &[
        (&["RWLOCK.UNLOCK", "k", "a", "READ"], 1, "write"),
        (&["RWLOCK.UNLOCK", "k", "a", "read"], -1, "write"),
        (&["RWLOCK.UNLOCK", "k", "b", "WRITE"], -1, "write"),
    ];
    for (words, reply, mode) in cases {
        assert_eq!(int(&mut c, words), *reply, "{words:?}");
        assert_eq!(
            field_str(&info(&mut c, "k").unwrap(), "mode"),
            *mode,
            "{words:?}"
        );
        assert_eq!(
            read(&mut c, "k", "b"),
            Value::Nil,
            "nobody reads beside the writer"
        );
    }
    sync_replicas(&mut c, 1);
    let mut r = replica.conn();
    assert_eq!(state(&mut r, "k"), state(&mut c, "k"));
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "a", "WRITE"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    // A reader has no write hold to let go of.
    fence(read(&mut c, "k", "r"));
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r", "WRITE"]), -1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "r", "READ"]), 1);
    sync_replicas(&mut c, 1);
    assert_eq!(int(&mut r, &["EXISTS", "k"]), 0);
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
        (&["RWLOCK.UNLOCK", "held", "a", "BOTH"], SYNTAX),
        (&["RWLOCK.UNLOCK", "held", "a", ""], SYNTAX),
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
        &["RWLOCK.UNLOCK", "held", "a", "READ", "READ"],
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
        // A RESTORE's key gets its lease back as soon as the command has
        // returned; a PERSIST's at the next warden command.
        let before = int(&mut c, &["PTTL", &key]);
        if case == "PERSIST" {
            assert_eq!(before, -1, "{case}: the key lost its expiry");
        } else {
            assert!((1..=60_000).contains(&before), "{case}: PTTL {before}");
        }
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

fn dump(c: &mut Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

fn repl_offset(c: &mut Connection) -> i64 {
    info_int(c, "replication", "master_repl_offset")
}

/// Once the replica caught up, `key` holds the same holders, hold counts,
/// tokens and leases, in the same order, with the same expiry, on both.
fn same_on_replica(m: &mut Connection, r: &mut Connection, key: &str) {
    sync_replicas(m, 1);
    assert_eq!(dump(r, key), dump(m, key), "{key}");
    let expiry = |c: &mut Connection| int(c, &["PEXPIRETIME", key]);
    assert_eq!(expiry(r), expiry(m), "{key}: expiry");
}

/// Releasing, extending or adding one reader among thousands sends replicas
/// (and the AOF) that reader, not every holder of the key.
#[test]
fn one_reader_among_thousands_replicates_alone() {
    const READERS: usize = 2000;
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    let mut m = master.conn();
    let mut grants = redis::pipe();
    for i in 0..READERS {
        let owner = format!("reader-{i:05}");
        grants
            .cmd("RWLOCK.READ")
            .arg("k")
            .arg(owner)
            .arg(60000)
            .ignore();
    }
    grants.query::<()>(&mut m).unwrap();
    // Attached after the grants: its full sync carries them.
    replicate(&master, &replica);
    let mut r = replica.conn();
    same_on_replica(&mut m, &mut r, "k");
    let steps: &[(&str, &[&str], i64)] = &[
        ("unlock", &["RWLOCK.UNLOCK", "k", "reader-00007"], 1),
        (
            "extend",
            &["RWLOCK.EXTEND", "k", "reader-00008", "90000"],
            1,
        ),
        (
            "a new reader",
            &["RWLOCK.READ", "k", "newcomer", "60000"],
            0,
        ),
        (
            "re-entry",
            &["RWLOCK.READ", "k", "reader-00009", "60000"],
            0,
        ),
        (
            "unlock of one of two holds",
            &["RWLOCK.UNLOCK", "k", "reader-00009"],
            0,
        ),
    ];
    for (what, words, reply) in steps {
        let before = repl_offset(&mut m);
        let answer = int(&mut m, words);
        let sent = repl_offset(&mut m) - before;
        println!("{what}: {sent} bytes to the replica, {READERS} readers");
        if *reply != 0 {
            assert_eq!(answer, *reply, "{what}");
        }
        assert!(
            sent < 1000,
            "{what}: {sent} bytes to the replica for one of {READERS} readers"
        );
        same_on_replica(&mut m, &mut r, "k");
    }
}

/// Every kind of change to a read-write lock — grants, re-entry, releases,
/// extends, a lease that ends, hand-offs to queued waiters — leaves the
/// replica, and the master restarted from its AOF, with exactly the
/// master's holders, hold counts, tokens, leases and key expiry.
#[test]
fn the_replica_and_the_aof_follow_every_change() {
    let mut master = Server::start_tcp(&["--appendonly", "yes"]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    let keys = ["k", "w", "h"];
    let mut check = |m: &mut Connection| {
        for key in keys {
            same_on_replica(m, &mut r, key);
        }
    };
    for owner in ["a", "b", "c", "d", "a"] {
        fence(read(&mut m, "k", owner));
    }
    check(&mut m);
    // A lease that ends on its own: the next command's effect implies it.
    fence(run(&mut m, &["RWLOCK.READ", "k", "brief", "50"]).unwrap());
    wait_for("brief's lease to end", Duration::from_secs(10), || {
        field_int(&info(&mut m, "k").unwrap(), "readers") == 4
    });
    assert_eq!(int(&mut m, &["RWLOCK.EXTEND", "k", "b", "90000"]), 1);
    check(&mut m);
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "k", "a"]), 0);
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "k", "a"]), 1);
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "k", "c"]), 1);
    check(&mut m);
    // A writer with its own read hold: extended together, released in turn.
    fence(write(&mut m, "w", "x"));
    fence(read(&mut m, "w", "x"));
    assert_eq!(int(&mut m, &["RWLOCK.EXTEND", "w", "x", "90000"]), 1);
    check(&mut m);
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "w", "x"]), 1);
    check(&mut m);
    // Readers queued behind a writer that gives up join the readers holding.
    for owner in ["r1", "r2", "r3"] {
        fence(read(&mut m, "h", owner));
    }
    let (_, writer) = spawn_command(
        &master,
        &["RWLOCK.WRITE", "h", "wr", "60000", "WAIT", "300"],
    );
    queued(&mut m, "h", 1);
    let (_, q1) = spawn_command(&master, &["RWLOCK.READ", "h", "q1", "60000", "WAIT", "0"]);
    queued(&mut m, "h", 2);
    let (_, q2) = spawn_command(&master, &["RWLOCK.READ", "h", "q2", "60000", "WAIT", "0"]);
    queued(&mut m, "h", 3);
    assert_eq!(writer.join().unwrap().unwrap(), Value::Nil);
    granted(q1);
    granted(q2);
    assert_eq!(field_int(&info(&mut m, "h").unwrap(), "readers"), 5);
    check(&mut m);
    // The last reader's release hands the key to a writer, whose release
    // hands it to the readers queued behind it.
    let (_, writer) = spawn_command(&master, &["RWLOCK.WRITE", "h", "wr", "60000", "WAIT", "0"]);
    queued(&mut m, "h", 1);
    for owner in ["r1", "q2", "r3", "q1"] {
        assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "h", owner]), 1);
        check(&mut m);
    }
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "h", "r2"]), 1);
    granted(writer);
    check(&mut m);
    let (_, s1) = spawn_command(&master, &["RWLOCK.READ", "h", "s1", "60000", "WAIT", "0"]);
    queued(&mut m, "h", 1);
    let (_, s2) = spawn_command(&master, &["RWLOCK.READ", "h", "s2", "60000", "WAIT", "0"]);
    queued(&mut m, "h", 2);
    assert_eq!(int(&mut m, &["RWLOCK.UNLOCK", "h", "wr"]), 1);
    granted(s1);
    granted(s2);
    check(&mut m);
    let state = |c: &mut Connection| -> Vec<(Option<Vec<u8>>, i64)> {
        let expiry = |c: &mut Connection, key| int(c, &["PEXPIRETIME", key]);
        keys.iter().map(|&k| (dump(c, k), expiry(c, k))).collect()
    };
    let before = state(&mut m);
    drop(m);
    master.restart(true);
    let mut m = master.conn();
    assert_eq!(state(&mut m), before, "after loading the AOF");
}

fn server_ms(c: &mut Connection) -> i64 {
    let t: Vec<String> = redis::cmd("TIME").query(c).unwrap();
    t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
}

/// `WARDEN.RWHOLD` from a client is refused; from the AOF, a delta no
/// master could send is refused too, and leaves the key as it was.
#[test]
fn a_forged_or_impossible_delta_changes_nothing() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    for owner in ["a", "b", "c"] {
        fence(read(&mut c, "k", owner));
    }
    let before = dump(&mut c, "k");
    let now = server_ms(&mut c);
    let (now_s, far) = (now.to_string(), (now + 60_000).to_string());
    let from_client: &[&[&str]] = &[
        &["WARDEN.RWHOLD", "k", &now_s, "1", "R", "a", "0", "0", "0"],
        &[
            "WARDEN.RWHOLD",
            "fresh",
            &now_s,
            "1",
            "W",
            "x",
            "1",
            "1",
            &far,
        ],
    ];
    for words in from_client {
        assert_eq!(
            err(&mut c, words),
            "ERR effect commands are accepted only from the master link and the AOF",
            "{words:?}"
        );
    }
    assert!(err(
        &mut c,
        &["WARDEN.RWHOLD", "k", &now_s, "1", "R", "a", "0", "0"]
    )
    .starts_with("ERR wrong number of arguments"));
    assert_eq!(dump(&mut c, "k"), before);
    assert_eq!(int(&mut c, &["EXISTS", "fresh"]), 0);

    // The AOF: a whole state, deltas no master sends, then one it does.
    s.stop(true);
    let at = |ms: i64| (now + ms).to_string();
    let (t1, t2) = (at(60_000), at(90_000));
    let (now_s, late, ended) = (now.to_string(), at(1), at(-1));
    let whole = aof_command(&["SELECT", "0"])
        + &aof_command(&[
            "WARDEN.RWSET",
            "k",
            "7",
            "R",
            "a",
            "1",
            "5",
            &t1,
            "R",
            "b",
            "1",
            "7",
            &t1,
        ]);
    // b re-enters with a later lease, c joins
    let sent = aof_command(&[
        "WARDEN.RWHOLD",
        "k",
        &late,
        "9",
        "R",
        "b",
        "2",
        "7",
        &t2,
        "R",
        "c",
        "1",
        "9",
        &t1,
    ]);
    let refused: &[&[&str]] = &[
        // a writer beside other owners' readers
        &["W", "w", "1", "7", &t1],
        // a reader with a token above the key's
        &["R", "d", "1", "10", &t1],
        // a hold whose lease already ended
        &["R", "d", "1", "7", &ended],
        // a hold that changes its token
        &["R", "a", "1", "6", &t1],
        // no hold left
        &[
            "R", "a", "0", "0", "0", "R", "b", "0", "0", "0", "R", "c", "0", "0", "0",
        ],
        // not a mode, not an owner, not a count
        &["X", "d", "1", "7", &t1],
        &["R", "", "1", "7", &t1],
        &["R", "d", "one", "7", &t1],
        &["R", "d", "-1", "7", &t1],
    ];
    let mut forged = String::new();
    for groups in refused {
        let mut words = vec!["WARDEN.RWHOLD", "k", &now_s, "9"];
        words.extend_from_slice(groups);
        forged += &aof_command(&words);
    }
    // the key's token going back; a key that does not exist
    forged += &aof_command(&["WARDEN.RWHOLD", "k", &now_s, "6", "R", "d", "1", "6", &t1]);
    forged += &aof_command(&[
        "WARDEN.RWHOLD",
        "nokey",
        &now_s,
        "9",
        "R",
        "d",
        "1",
        "7",
        &t1,
    ]);
    // Each refusal is logged ("sending an error to its AOF-loading-client").
    let refusals = |s: &Server| s.log().matches("ERR invalid replicated effect").count();
    let mut load = |body: String| {
        let logged = refusals(&s);
        let aof = s.dir.path().join("appendonlydir");
        std::fs::remove_dir_all(&aof).unwrap();
        std::fs::create_dir_all(&aof).unwrap();
        std::fs::write(aof.join("appendonly.aof.1.base.aof"), body).unwrap();
        std::fs::write(
            aof.join("appendonly.aof.manifest"),
            "file appendonly.aof.1.base.aof seq 1 type b\n",
        )
        .unwrap();
        s.restart(true);
        let mut c = s.conn();
        let state = (dump(&mut c, "k"), int(&mut c, &["PEXPIRETIME", "k"]));
        assert_eq!(int(&mut c, &["EXISTS", "nokey"]), 0);
        s.stop(true);
        (state, refusals(&s) - logged)
    };
    let (expected, none) = load(whole.clone() + &sent);
    let (with_forged, logged) = load(whole + &forged + &sent + &forged);
    assert_eq!(with_forged, expected, "a refused delta changed the key");
    assert_eq!(
        (none, logged),
        (0, 2 * (refused.len() + 2)),
        "refusals logged"
    );
    assert_eq!(expected.1, now + 90_000);
    s.start_again_with(&[]);
    let mut c = s.conn();
    let i = info(&mut c, "k").unwrap();
    assert_eq!(field_str(&i, "mode"), "read");
    let counts = ["readers", "holds", "fence"].map(|f| field_int(&i, f));
    assert_eq!(counts, [3, 4, 9], "{i:?}");
}

/// One command as the AOF holds it.
fn aof_command(words: &[&str]) -> String {
    let mut out = format!("*{}\r\n", words.len());
    for w in words {
        out += &format!("${}\r\n{w}\r\n", w.len());
    }
    out
}
