//! Production faults, one behaviour each: writes paused at a lease end, a
//! waiter at its deadline, eviction of a held lock, forged effects, state that
//! outlives its lock, writable replicas, mixed lock kinds on one name, and
//! bad module arguments. Each test failed on the waiting core before it was
//! rebuilt.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, ConnectionLike, Value};

fn waiting(c: &mut Connection) -> i64 {
    info_int(c, "warden", "warden_waiting_clients")
}

/// The server's clock, in ms.
fn server_ms(c: &mut Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    s * 1000 + us / 1000
}

/// The server is alive and its log holds no assertion and no panic.
fn assert_healthy(s: &Server) {
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG");
    let log = s.log();
    assert!(!log.contains("ASSERTION"), "{log}");
    assert!(!log.contains("panic"), "{log}");
}

/// A connection whose reads give up instead of hanging on a missing reply.
fn conn_with_timeout(s: &Server) -> Connection {
    let c = s.conn();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

// --- 1. Lease ends while writes are paused -------------------------------

#[test]
fn a_lease_ending_while_writes_are_paused_is_handed_off_after_the_pause() {
    // (request that holds, request that waits, unlock command, pause kind)
    let cases: &[(&[&str], &[&str], &str)] = &[
        (
            &["LOCK.ACQUIRE", "k", "a", "300"],
            &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"],
            "WRITE",
        ),
        (
            &["LOCK.ACQUIRE", "k", "a", "300"],
            &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"],
            "ALL",
        ),
        (
            &["RWLOCK.READ", "k", "a", "300"],
            &["RWLOCK.WRITE", "k", "b", "60000", "WAIT", "0"],
            "WRITE",
        ),
        (
            &["RWLOCK.WRITE", "k", "a", "300"],
            &["RWLOCK.READ", "k", "b", "60000", "WAIT", "0"],
            "ALL",
        ),
    ];
    for (hold, wait, pause) in cases {
        let s = Server::start(&[]);
        let mut c = s.conn();
        run(&mut c, hold).unwrap();
        let (_, pending) = spawn_command(&s, wait);
        wait_for("the waiter", Duration::from_secs(10), || {
            waiting(&mut c) == 1
        });
        if *pause == "WRITE" {
            run(&mut c, &["CLIENT", "PAUSE", "100000", "WRITE"]).unwrap();
            let paused_at = server_ms(&mut c);
            // Past the lease's deadline, still paused: nobody is granted.
            wait_for("the lease deadline", Duration::from_secs(10), || {
                server_ms(&mut c) > paused_at + 600
            });
            assert_eq!(waiting(&mut c), 1, "{wait:?} granted during PAUSE {pause}");
            assert_healthy(&s);
            run(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
        } else {
            // Every command waits during PAUSE ALL: the lease ends inside it.
            run(&mut c, &["CLIENT", "PAUSE", "1000", "ALL"]).unwrap();
        }
        let fence = granted(pending);
        assert!(fence > 0);
        assert_healthy(&s);
    }
}

// --- 2. A waiter at its deadline gets exactly one reply -------------------

/// Pipelines a blocked request and a marker; returns (first reply, second reply).
fn pipelined_wait(c: &mut Connection, words: &[&str]) -> (Value, Value) {
    let mut p = redis::pipe();
    let mut cmd = redis::cmd(words[0]);
    for w in &words[1..] {
        cmd.arg(*w);
    }
    p.add_command(cmd);
    p.cmd("ECHO").arg("marker");
    // Raw replies: an error reply stays a value, a missing one times out.
    let replies = c
        .req_packed_commands(&p.get_packed_pipeline(), 0, 2)
        .expect("both replies");
    (replies[0].clone(), replies[1].clone())
}

#[test]
fn a_waiter_freed_at_its_deadline_gets_exactly_one_reply() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Release at, just before and just after the 30 ms deadline, also
    // pipelined with CLIENT UNBLOCK (plain and ERROR) and in one MULTI.
    let ways = [
        "release",
        "unblock",
        "unblock-error",
        "multi",
        "multi-error",
    ];
    for round in 0..40u64 {
        let key = format!("k{round}");
        let way = ways[round as usize % ways.len()];
        run(&mut c, &["LOCK.ACQUIRE", &key, "a", "100000"]).unwrap();
        let mut w = conn_with_timeout(&s);
        let id = int(&mut w, &["CLIENT", "ID"]);
        let words = ["LOCK.ACQUIRE", &key, "b", "100000", "WAIT", "30"];
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let waiter = std::thread::spawn(move || {
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            pipelined_wait(&mut w, &words)
        });
        wait_for("the waiter", Duration::from_secs(10), || {
            waiting(&mut c) == 1
        });
        std::thread::sleep(Duration::from_millis(25 + round % 10));
        let id = id.to_string();
        let release = ["LOCK.RELEASE", &key, "a"];
        match way {
            "release" => {
                run(&mut c, &release).unwrap();
            }
            "unblock" | "unblock-error" | "multi" | "multi-error" => {
                let mut p = redis::pipe();
                if way.starts_with("multi") {
                    p.atomic();
                }
                p.cmd("LOCK.RELEASE").arg(&key).arg("a");
                let unblock = p.cmd("CLIENT").arg("UNBLOCK").arg(&id);
                if way.ends_with("error") {
                    unblock.arg("ERROR");
                }
                let _: Value = p.query(&mut c).unwrap();
            }
            _ => unreachable!(),
        }
        let (first, second) = waiter.join().unwrap();
        assert_eq!(
            second,
            Value::BulkString(b"marker".to_vec()),
            "{way}: {first:?}"
        );
        let holder = maybe_map(&mut c, &["LOCK.INFO", &key]).map(|f| field_str(&f, "owner"));
        match first {
            Value::Int(fence) => {
                assert_eq!(
                    holder.as_deref(),
                    Some("b"),
                    "{way}: token {fence} but not holder"
                )
            }
            Value::Nil | Value::ServerError(_) => {
                assert_ne!(holder.as_deref(), Some("b"), "{way}: {first:?} yet holder")
            }
            other => panic!("{way}: {other:?}"),
        }
        run(&mut c, &["DEL", &key]).unwrap();
    }
    assert_eq!(waiting(&mut c), 0);
    assert_healthy(&s);
}

#[test]
fn pipelined_commands_behind_a_timed_out_waiter_get_their_own_replies() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["LOCK.ACQUIRE", "k", "a", "100000"]).unwrap();
    run(&mut c, &["RWLOCK.WRITE", "rw", "a", "100000"]).unwrap();
    let mut w = conn_with_timeout(&s);
    for words in [
        &["LOCK.ACQUIRE", "k", "b", "1000", "WAIT", "5"][..],
        &["RWLOCK.READ", "rw", "b", "1000", "WAIT", "5"],
        &["RWLOCK.WRITE", "rw", "b", "1000", "WAIT", "5"],
    ] {
        let (first, second) = pipelined_wait(&mut w, words);
        assert_eq!(first, Value::Nil, "{words:?}");
        assert_eq!(second, Value::BulkString(b"marker".to_vec()));
    }
    assert_eq!(info_int(&mut c, "warden", "warden_wait_timeouts"), 3);
}

// --- 3. Eviction --------------------------------------------------------

#[test]
fn an_evicted_lock_keeps_its_key_taken_until_its_lease_ends() {
    for kind in ["LOCK", "RWLOCK"] {
        let s = Server::start(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-random"]);
        let mut c = s.conn();
        assert!(
            s.log().contains("can evict lock keys (it evicts any key)"),
            "warning at load"
        );
        let (take, info, free, extend) = match kind {
            "LOCK" => ("LOCK.ACQUIRE", "LOCK.INFO", "LOCK.RELEASE", "LOCK.EXTEND"),
            _ => (
                "RWLOCK.WRITE",
                "RWLOCK.INFO",
                "RWLOCK.UNLOCK",
                "RWLOCK.EXTEND",
            ),
        };
        let start = server_ms(&mut c);
        let lease = 4000;
        int(&mut c, &[take, "lock", "old", &lease.to_string()]);
        let (_, pending) = spawn_command(&s, &[take, "lock", "next", "60000", "WAIT", "0"]);
        wait_for("the waiter", Duration::from_secs(10), || {
            waiting(&mut c) == 1
        });
        // Fill memory until the lock key is evicted.
        let filler = "x".repeat(1000);
        let mut i = 0;
        while int(&mut c, &["EXISTS", "lock"]) == 1 {
            let _ = run(&mut c, &["SET", &format!("fill{i}"), &filler]);
            i += 1;
            assert!(i < 100_000, "the lock was never evicted");
        }
        assert_eq!(info_int(&mut c, "warden", "warden_evicted_locks"), 1);
        // Until the evicted lease ends nobody else gets the key.
        if server_ms(&mut c) < start + lease - 500 {
            assert_eq!(
                run(&mut c, &[take, "lock", "thief", "1000"]).unwrap(),
                Value::Nil
            );
            assert_eq!(
                waiting(&mut c),
                1,
                "{kind}: the waiter was granted an evicted lock"
            );
            assert_eq!(int(&mut c, &[free, "lock", "old"]), -1);
            assert_eq!(int(&mut c, &[extend, "lock", "old", "1000"]), 0);
        }
        let fence = granted(pending);
        assert!(
            server_ms(&mut c) >= start + lease,
            "granted before the lease ended"
        );
        assert!(fence > 0);
        let _ = info;
        assert_healthy(&s);
    }
}

/// Whether the server can leave aux data out of an RDB (`aux_save2`: Redis
/// 7.2 and later, Valkey): only there do evicted locks outlive a reload.
fn has_aux_save2(c: &mut Connection) -> bool {
    let info: String = redis::cmd("INFO").arg("server").query(c).unwrap();
    let has =
        is_valkey() || !info.contains("redis_version:7.0.") && !info.contains("redis_version:7.1.");
    println!(
        "version-dependent: {:?}: RDB aux data {}",
        server_version(c),
        if has {
            "through aux_save2, only when there is some (the >= 7.2 path)"
        } else {
            "through aux_save (the 7.0 path)"
        }
    );
    has
}

#[test]
fn an_evicted_lock_stays_taken_across_swapdb_and_reload_until_a_flush() {
    let mut s = Server::start(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-random"]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "lock", "old", "60000"]);
    let filler = "x".repeat(1000);
    let mut i = 0;
    while int(&mut c, &["EXISTS", "lock"]) == 1 {
        let _ = run(&mut c, &["SET", &format!("fill{i}"), &filler]);
        i += 1;
        assert!(i < 100_000, "the lock was never evicted");
    }
    run(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    let thief = ["LOCK.ACQUIRE", "lock", "thief", "1000"];
    // SWAPDB moves it with its database.
    run(&mut c, &["SWAPDB", "0", "1"]).unwrap();
    assert!(int(&mut c, &thief) > 0, "db 0 now holds the other dataset");
    run(&mut c, &["DEL", "lock"]).unwrap();
    run(&mut c, &["SELECT", "1"]).unwrap();
    assert_eq!(run(&mut c, &thief).unwrap(), Value::Nil, "moved to db 1");
    run(&mut c, &["SWAPDB", "0", "1"]).unwrap();
    run(&mut c, &["FLUSHDB"]).unwrap();
    run(&mut c, &["SELECT", "0"]).unwrap();
    assert_eq!(
        run(&mut c, &thief).unwrap(),
        Value::Nil,
        "FLUSHDB of db 1 left it"
    );
    if has_aux_save2(&mut c) {
        run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
        assert_eq!(
            run(&mut c, &thief).unwrap(),
            Value::Nil,
            "after DEBUG RELOAD"
        );
        run(&mut c, &["SAVE"]).unwrap();
        s.restart(true);
        c = s.conn();
        assert_eq!(run(&mut c, &thief).unwrap(), Value::Nil, "after a restart");
        assert_eq!(info_int(&mut c, "warden", "warden_evicted_keys_taken"), 1);
    }
    // A flush frees it, as it frees a held lock.
    run(&mut c, &["FLUSHALL"]).unwrap();
    assert_eq!(info_int(&mut c, "warden", "warden_evicted_keys_taken"), 0);
    assert!(int(&mut c, &thief) > 0, "after FLUSHALL");
    assert_healthy(&s);
}

// --- 4. Forged effects ---------------------------------------------------

#[test]
fn clients_cannot_send_effect_commands() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = int(&mut c, &["LOCK.ACQUIRE", "held", "alice", "60000"]);
    run(&mut c, &["SET", "str", "v"]).unwrap();
    let forged: &[&[&str]] = &[
        &["WARDEN.LOCKSET", "held", "mallory", "1", "5", "0"],
        &["WARDEN.LOCKSET", "str", "mallory", "1", "5", "0"],
        &[
            "WARDEN.LOCKSET",
            "new",
            "mallory",
            "1",
            "4611686018427387904",
            "0",
        ],
        &["WARDEN.RWSET", "held", "5", "W", "mallory", "1", "5", "0"],
        &[
            "WARDEN.RWHOLD",
            "held",
            "1",
            "5",
            "W",
            "mallory",
            "1",
            "5",
            "0",
        ],
    ];
    for words in forged {
        assert!(
            err(&mut c, words).starts_with("ERR effect commands"),
            "{words:?}"
        );
        let mut p = redis::pipe();
        p.atomic();
        let mut cmd = redis::cmd(words[0]);
        for w in &words[1..] {
            cmd.arg(*w);
        }
        p.add_command(cmd);
        assert!(p.query::<Value>(&mut c).is_err(), "inside MULTI: {words:?}");
    }
    assert_eq!(lock_state(&mut c, "held"), Some(("alice".into(), 1, fence)));
    let s2: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(s2, "v");
    assert_eq!(int(&mut c, &["EXISTS", "new"]), 0);
    let next = int(&mut c, &["LOCK.ACQUIRE", "other", "bob", "1000"]);
    assert!(next < 1 << 53, "the token counter was not pushed: {next}");
}

#[test]
fn tokens_near_two_pow_53_or_far_ahead_of_the_clock_are_refused_in_restore() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let fence = int(&mut c, &["LOCK.ACQUIRE", "k", "alice", "60000"]) as u64;
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    run(&mut c, &["DEL", "k"]).unwrap();
    // A token somewhat ahead (a master's clock a little ahead) is fine...
    let ahead = fence + (1 << 30);
    let ok: Value = redis::cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(dump_with_fence(&dump, fence, ahead))
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, Value::Okay);
    assert_eq!(lock_state(&mut c, "k").unwrap().2 as u64, ahead);
    run(&mut c, &["DEL", "k"]).unwrap();
    // ...one that would leave no room below 2^53 is not.
    for bad in [(1u64 << 53) - 1, 1 << 53, fence + (1 << 41)] {
        let refused = redis::cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(dump_with_fence(&dump, fence, bad))
            .query::<Value>(&mut c);
        assert!(refused.is_err(), "{bad}");
        assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    }
    let next = int(&mut c, &["LOCK.ACQUIRE", "y", "me", "1000"]) as u64;
    assert!(next > ahead && next < 1 << 53);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
}

#[test]
fn an_owner_granted_twice_from_the_queue_is_one_reader_and_the_rdb_reloads() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "unrelated", "precious"]).unwrap();
    int(&mut c, &["RWLOCK.WRITE", "k", "writer", "100000"]);
    let (_, a) = spawn_command(&s, &["RWLOCK.READ", "k", "same", "100000", "WAIT", "0"]);
    let (_, b) = spawn_command(&s, &["RWLOCK.READ", "k", "same", "100000", "WAIT", "0"]);
    wait_for("two waiters", Duration::from_secs(10), || {
        waiting(&mut c) == 2
    });
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "k", "writer"]), 1);
    assert_eq!(granted(a), granted(b), "one entry: the same token");
    let f = map(&mut c, &["RWLOCK.INFO", "k"]);
    assert_eq!((field_int(&f, "readers"), field_int(&f, "holds")), (1, 2));
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    let v: String = redis::cmd("GET").arg("unrelated").query(&mut c).unwrap();
    assert_eq!(v, "precious");
    assert_eq!(field_int(&map(&mut c, &["RWLOCK.INFO", "k"]), "holds"), 2);
}

#[test]
fn restored_read_write_locks_with_impossible_holders_are_refused() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // A writer that also reads (a downgrade): its DUMP, with the reader's owner
    // changed to someone else, would be a writer beside another reader.
    int(&mut c, &["RWLOCK.WRITE", "k", "ww", "100000"]);
    int(&mut c, &["RWLOCK.READ", "k", "ww", "100000"]);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    let body = &dump[..dump.len() - 10];
    let at = body.windows(2).rposition(|w| w == b"ww").unwrap();
    let mut other = body.to_vec();
    other[at..at + 2].copy_from_slice(b"xx");
    let refused = redis::cmd("RESTORE")
        .arg("t")
        .arg(0)
        .arg(resign(&dump, other))
        .query::<Value>(&mut c);
    assert!(refused.is_err(), "a writer beside another reader");
    assert_eq!(int(&mut c, &["EXISTS", "t"]), 0);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
}

// --- 5. State goes with its lock ------------------------------------------

#[test]
fn timers_and_queues_go_with_their_locks() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    const KEYS: usize = 32_000;
    const CONNS: usize = 8;
    let baseline = used_memory(&mut c);
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("LOCK.ACQUIRE")
            .arg(format!("k{i}"))
            .arg("holder")
            .arg(3_600_000)
            .ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    // Each key: one waiter that times out (1 ms), leaving a lease timer behind it.
    let threads: Vec<_> = (0..CONNS)
        .map(|t| {
            let mut w = conn_with_timeout(&s);
            std::thread::spawn(move || {
                let mut p = redis::pipe();
                for i in (t..KEYS).step_by(CONNS) {
                    p.cmd("LOCK.ACQUIRE")
                        .arg(format!("k{i}"))
                        .arg("w")
                        .arg(1000)
                        .arg("WAIT")
                        .arg(1);
                }
                let replies: Vec<Value> = p.query(&mut w).unwrap();
                assert!(replies.iter().all(|r| *r == Value::Nil));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("LOCK.RELEASE")
            .arg(format!("k{i}"))
            .arg("holder")
            .ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    run(&mut c, &["FLUSHALL"]).unwrap();
    assert_eq!(waiting(&mut c), 0);
    let after = used_memory(&mut c);
    assert!(
        after < baseline + (2 << 20),
        "memory stayed {} bytes above its baseline",
        after - baseline
    );
}

// --- 6. Replicas ------------------------------------------------------------

#[test]
fn replicas_never_queue_or_grant_even_when_writable() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&["--replica-read-only", "no"]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    int(&mut m, &["RWLOCK.WRITE", "rw", "a", "60000"]);
    sync_replicas(&mut m, 1);
    for words in [
        &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"][..],
        &["LOCK.ACQUIRE", "free", "b", "60000"],
        &["LOCK.RELEASE", "k", "a"],
        &["LOCK.EXTEND", "k", "a", "1000"],
        &["RWLOCK.READ", "rw", "b", "60000", "WAIT", "0"],
        &["RWLOCK.UNLOCK", "rw", "a"],
    ] {
        assert!(err(&mut r, words).starts_with("READONLY"), "{words:?}");
    }
    assert_eq!(waiting(&mut r), 0);
    assert_eq!(int(&mut m, &["LOCK.RELEASE", "k", "a"]), 1);
    sync_replicas(&mut m, 1);
    assert_eq!(maybe_map(&mut r, &["LOCK.INFO", "k"]), None);
    assert_eq!(int(&mut r, &["EXISTS", "free"]), 0);
}

// --- 7. Mixed kinds on one name -------------------------------------------

#[test]
fn a_waiter_never_strands_on_a_free_key_when_kinds_mix() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "x", "60000"]);
    let (_, lock_waiter) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "l1", "60000", "WAIT", "0"]);
    wait_for("the lock waiter", Duration::from_secs(10), || {
        waiting(&mut c) == 1
    });
    // DEL and a read-write waiter in one packet.
    let mut w = conn_with_timeout(&s);
    let rw = std::thread::spawn(move || {
        let mut p = redis::pipe();
        p.cmd("DEL").arg("k");
        p.cmd("RWLOCK.WRITE")
            .arg("k")
            .arg("w1")
            .arg("500")
            .arg("WAIT")
            .arg("0");
        w.req_packed_commands(&p.get_packed_pipeline(), 0, 2)
    });
    assert!(granted(lock_waiter) > 0);
    // The lock's holder releases: the key is free, so the read-write waiter
    // is answered — WRONGTYPE while the key held a lock, or its grant now —
    // and never left queued on a free key.
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "l1"]), 1);
    let replies = rw.join().unwrap().expect("both replies");
    match &replies[1] {
        Value::Int(_) => {}
        Value::ServerError(e) => assert_eq!(e.code(), "WRONGTYPE", "{e:?}"),
        other => panic!("{other:?}"),
    }
    wait_for("no waiter left", Duration::from_secs(10), || {
        waiting(&mut c) == 0
    });
}

// --- 8. Arguments ---------------------------------------------------------

/// Starts the server with the module and `module_args`; returns (whether it
/// runs, its log).
fn try_start(module_args: &[&str]) -> (bool, String) {
    let mut s = Plain::start(&[module(module_path(), module_args)]);
    let runs = s.runs();
    (runs, s.log())
}

#[test]
fn bad_module_arguments_refuse_the_load_and_say_why() {
    let cases: &[(&[&str], &str)] = &[
        (&["bf-expansion", "0"], "bf-expansion '0' is invalid"),
        (&["bf-max-memory", "2tb"], "bf-max-memory '2tb' is invalid"),
        (
            &["bf-eror-rate", "0.1"],
            "unknown module argument 'bf-eror-rate'",
        ),
        (&["bf-error-rate", "1e-30"], "too small"),
        (
            &["bf-initial-capacity", "10000000000"],
            "would exceed bf-max-memory",
        ),
        (&["bf-expansion"], "has no value"),
    ];
    for (args, why) in cases {
        let (runs, log) = try_start(args);
        assert!(!runs, "{args:?} loaded");
        assert!(log.contains(why), "{args:?}: {log}");
    }
    for args in [
        &["bf-max-memory", "64mb"][..],
        &["bf-max-memory", "2gb", "bf-initial-capacity", "100000000"],
    ] {
        let (runs, log) = try_start(args);
        assert!(runs, "{args:?}: {log}");
    }
}

#[test]
fn config_set_refuses_defaults_that_implicit_filters_cannot_use() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &["CONFIG", "SET", "warden.bf-initial-capacity", "100000"],
    )
    .unwrap();
    for (name, value) in [
        ("warden.bf-error-rate", "1e-30"),
        ("warden.bf-initial-capacity", "10000000000"),
        ("warden.bf-max-memory", "64kb"),
    ] {
        let e = err(&mut c, &["CONFIG", "SET", name, value]);
        assert!(
            e.contains("implicitly created filters would fail"),
            "{name}: {e}"
        );
    }
    assert_eq!(int(&mut c, &["BF.ADD", "f", "x"]), 1);
    run(&mut c, &["CONFIG", "SET", "warden.bf-max-memory", "64mb"]).unwrap();
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-max-memory")
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], (64 << 20).to_string());
}

#[test]
fn wait_minus_zero_is_an_error_and_info_has_one_warden_section() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for words in [
        &["LOCK.ACQUIRE", "k", "a", "100", "WAIT", "-0"][..],
        &["RWLOCK.READ", "k", "a", "100", "WAIT", "-0"],
        &["LOCK.ACQUIRE", "k", "a", "-0"],
    ] {
        assert!(err(&mut c, words).starts_with("ERR invalid"), "{words:?}");
    }
    let info: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(info.contains("# warden\r\n"), "{info}");
    assert!(!info.contains("warden_warden"), "{info}");
}
