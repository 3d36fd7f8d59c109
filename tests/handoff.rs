//! The hand-off path on its worst day: exactly one reply per blocked request
//! whatever races it (a renamed CLIENT command, CLIENT UNBLOCK pipelined
//! behind the grant, a role change), memory that goes back to where it was,
//! many readers at once, and big cache hits without copies.

mod common;

use std::time::Duration;

use common::wire::{cmd, Cmd, Reply, Wire};
use common::*;
use redis::Connection;

/// A connection on `s`'s socket.
fn wire(s: &Server) -> Wire {
    Wire::open(&s.socket()).unwrap()
}

fn send(w: &mut Wire, commands: &[&[&str]]) {
    let commands: Vec<Cmd> = commands.iter().map(|c| cmd(c)).collect();
    w.send(&commands).unwrap();
}

fn read(w: &mut Wire) -> Reply {
    w.read().unwrap()
}

fn call(w: &mut Wire, words: &[&str]) -> Reply {
    w.call(words).unwrap()
}

fn client_id(w: &mut Wire) -> i64 {
    w.int(&["CLIENT", "ID"]).unwrap()
}

fn waiting(c: &mut Connection) -> i64 {
    warden_stat(c, "waiting_clients")
}

fn wait_waiting(c: &mut Connection, n: i64) {
    wait_for(
        &format!("{n} waiting clients"),
        Duration::from_secs(20),
        || waiting(c) == n,
    );
}

/// A waiter blocked on `request`, with an `ECHO <marker>` pipelined behind it:
/// any missing or extra reply shows as a misplaced marker.
fn blocked(
    s: &Server,
    c: &mut Connection,
    id_of: impl Fn(&mut Wire) -> i64,
    request: &[&str],
) -> (Wire, i64) {
    let mut w = wire(s);
    let id = id_of(&mut w);
    let before = waiting(c);
    send(&mut w, &[request, &["ECHO", "marker"]]);
    wait_waiting(c, before + 1);
    (w, id)
}

/// The grant and a user's `CLIENT UNBLOCK` of the same waiter arrive in one
/// write, under a renamed CLIENT command: the waiter gets exactly one reply,
/// and holds the lock exactly when that reply is its token.
#[test]
fn unblock_pipelined_behind_a_grant_gives_one_reply() {
    let cases: &[(&str, &[&str])] = &[
        ("CLIENT", &[]),
        ("CLIENT", &["ERROR"]),
        ("CLIENTX", &[]),
        ("CLIENTX", &["ERROR"]),
        ("CLIENTX", &["TIMEOUT"]),
    ];
    for &(client, reason) in cases {
        let rename: Vec<&str> = if client == "CLIENT" {
            vec![]
        } else {
            vec!["--rename-command", "CLIENT", client]
        };
        let s = Server::start(&rename);
        let mut c = s.conn();
        for kind in ["lock", "rwlock", "cache"] {
            let case = format!("{client} UNBLOCK {reason:?}, {kind}");
            let key = format!("k-{kind}");
            let (hold, free, request): (Vec<&str>, Vec<&str>, Vec<&str>) = match kind {
                "lock" => (
                    vec!["LOCK.ACQUIRE", &key, "a", "60000"],
                    vec!["LOCK.RELEASE", &key, "a"],
                    vec!["LOCK.ACQUIRE", &key, "w", "60000", "WAIT", "0"],
                ),
                "rwlock" => (
                    vec!["RWLOCK.WRITE", &key, "a", "60000"],
                    vec!["RWLOCK.UNLOCK", &key, "a"],
                    vec!["RWLOCK.READ", &key, "w", "60000", "WAIT", "0"],
                ),
                _ => (
                    vec!["CACHE.GET", &key, "60000"],
                    vec!["CACHE.ABANDON", &key, "LEASE"],
                    vec!["CACHE.GET", &key, "60000", "WAIT", "0"],
                ),
            };
            let mut holder = wire(&s);
            let lease = match call(&mut holder, &hold) {
                Reply::Int(t) => t,
                Reply::Array(pair) => match pair[1] {
                    Reply::Int(t) => t,
                    _ => panic!("{case}: no lease"),
                },
                r => panic!("{case}: {r:?}"),
            };
            let lease = lease.to_string();
            let free: Vec<&str> = free
                .iter()
                .map(|w| if *w == "LEASE" { lease.as_str() } else { w })
                .collect();
            let id_cmd = [client, "ID"];
            let (mut w, id) = blocked(
                &s,
                &mut c,
                |w| match call(w, &id_cmd) {
                    Reply::Int(id) => id,
                    r => panic!("{r:?}"),
                },
                &request,
            );
            let id = id.to_string();
            let mut unblock = vec![client, "UNBLOCK", id.as_str()];
            unblock.extend_from_slice(reason);
            send(&mut holder, &[&free, &unblock]);
            let freed = read(&mut holder);
            assert!(!matches!(freed, Reply::Error(_)), "{case}: {freed:?}");
            let unblocked = read(&mut holder);
            let first = read(&mut w);
            assert_eq!(
                read(&mut w),
                Reply::Bulk(b"marker".to_vec()),
                "{case}: after {first:?}"
            );
            // It holds exactly when it was told so.
            let granted = match &first {
                Reply::Int(_) => true,
                Reply::Array(pair) => matches!(pair[1], Reply::Int(_)),
                Reply::Error(e) if e.starts_with("UNBLOCKED") => false,
                Reply::Nil => false,
                r => panic!("{case}: waiter got {r:?}"),
            };
            assert!(
                granted || unblocked != Reply::Int(0),
                "{case}: not granted, yet CLIENT UNBLOCK did nothing"
            );
            let holds = |c: &mut Connection| match kind {
                "lock" => maybe_map(c, &["LOCK.INFO", &key])
                    .is_some_and(|f| field_str(&f, "owner") == "w"),
                "rwlock" => maybe_map(c, &["RWLOCK.INFO", &key])
                    .is_some_and(|f| field_int(&f, "readers") == 1),
                _ => maybe_map(c, &["CACHE.INFO", &key]).is_some_and(|f| {
                    !matches!(
                        f.iter().find(|(n, _)| n == "lease"),
                        Some((_, redis::Value::Nil)) | None
                    )
                }),
            };
            wait_for(&case, Duration::from_secs(10), || holds(&mut c) == granted);
            int(&mut c, &["DEL", &key]);
            wait_waiting(&mut c, 0);
        }
    }
}

/// A server that stops being a master answers every waiter at once, whether
/// the client can follow redirects or not, on Redis and Valkey alike.
#[test]
fn a_role_change_answers_every_waiter() {
    for how in ["REPLICAOF", "FAILOVER"] {
        for redirect in [false, true] {
            let case = format!("{how}, redirect capable: {redirect}");
            let master = Server::start_tcp(&[]);
            let other = Server::start_tcp(&[]);
            let mut c = master.conn();
            if how == "FAILOVER" {
                replicate(&master, &other);
            }
            int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
            let mut waiters = Vec::new();
            for request in [
                vec!["LOCK.ACQUIRE", "k", "w", "60000", "WAIT", "0"],
                vec!["RWLOCK.WRITE", "r", "w", "60000", "WAIT", "0"],
                vec!["CACHE.GET", "v", "60000", "WAIT", "0"],
            ] {
                if request[0] == "RWLOCK.WRITE" {
                    int(&mut c, &["RWLOCK.READ", "r", "a", "60000"]);
                }
                if request[0] == "CACHE.GET" {
                    run(&mut c, &["CACHE.GET", "v", "60000"]).unwrap();
                }
                let (w, _) = blocked(
                    &master,
                    &mut c,
                    |w| {
                        if redirect {
                            // Valkey's redirect capability; an error elsewhere.
                            w.call(&["CLIENT", "CAPA", "redirect"]).unwrap();
                        }
                        client_id(w)
                    },
                    &request,
                );
                waiters.push(w);
            }
            let port = other.port.unwrap().to_string();
            match how {
                "REPLICAOF" => {
                    run(&mut c, &["REPLICAOF", "127.0.0.1", &port]).unwrap();
                }
                _ => {
                    run(&mut c, &["FAILOVER", "TIMEOUT", "10000"]).unwrap();
                }
            }
            for mut w in waiters {
                match read(&mut w) {
                    Reply::Error(e) => assert!(
                        ["UNBLOCKED", "READONLY", "REDIRECT"]
                            .iter()
                            .any(|p| e.starts_with(p)),
                        "{case}: {e}"
                    ),
                    r => panic!("{case}: a waiter got {r:?}"),
                }
            }
            let mut c = master.conn();
            assert_eq!(waiting(&mut c), 0, "{case}");
        }
    }
}

/// What a waiter costs the module itself, and that it all goes back: the
/// module's own bytes (counted by its allocator), not the server's clients.
#[test]
fn waiters_cost_little_and_leave_nothing_behind() {
    let s = Server::start(&["--maxclients", "4000"]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "holder", "600000"]);
    int(&mut c, &["RWLOCK.WRITE", "r", "holder", "600000"]);
    run(&mut c, &["CACHE.GET", "v", "600000"]).unwrap();
    let base = warden_stat(&mut c, "module_memory");
    const N: usize = 1000;
    let mut wires = Vec::new();
    for i in 0..N {
        let owner = format!("owner-{i}");
        let request: Vec<&str> = match i % 3 {
            0 => vec!["LOCK.ACQUIRE", "k", &owner, "600000", "WAIT", "0"],
            1 => vec!["RWLOCK.READ", "r", &owner, "600000", "WAIT", "600000"],
            _ => vec!["CACHE.GET", "v", "600000", "WAIT", "600000"],
        };
        let mut w = wire(&s);
        send(&mut w, &[&request]);
        wires.push(w);
    }
    wait_waiting(&mut c, N as i64);
    let per_waiter = (warden_stat(&mut c, "module_memory") - base) / N as i64;
    eprintln!("module memory per waiter: {per_waiter} bytes");
    assert!(
        per_waiter <= 512,
        "{per_waiter} bytes of module memory per waiter"
    );
    drop(wires);
    wait_waiting(&mut c, 0);
    // What the departures leave to timers (the cache's reaper, its watch
    // of departed clients) is given back on their next turns.
    let mut left = 0;
    wait_for(
        "module memory back near its baseline",
        Duration::from_secs(60),
        || {
            left = warden_stat(&mut c, "module_memory") - base;
            left <= 16 * 1024
        },
    );
    eprintln!("module memory after every waiter left: {left:+} bytes");
}

/// Ten thousand readers behind a writer are granted by its one unlock, all of
/// them, in one pass that is linear in their number.
#[test]
fn ten_thousand_readers_are_granted_at_once() {
    const N: usize = 10_000;
    let s = Server::start(&["--maxclients", "12000"]);
    let mut c = s.conn();
    int(&mut c, &["RWLOCK.WRITE", "r", "writer", "600000"]);
    let mut wires = Vec::new();
    for i in 0..N {
        let owner = format!("reader-{i}");
        let mut w = wire(&s);
        send(
            &mut w,
            &[&["RWLOCK.READ", "r", &owner, "600000", "WAIT", "0"]],
        );
        wires.push(w);
    }
    wait_waiting(&mut c, N as i64);
    run(&mut c, &["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "r", "writer"]), 1);
    let mut tokens: Vec<i64> = wires
        .iter_mut()
        .map(|w| match read(w) {
            Reply::Int(t) => t,
            r => panic!("a reader got {r:?}"),
        })
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), N, "every reader has its own token");
    let f = map(&mut c, &["RWLOCK.INFO", "r"]);
    assert_eq!(field_int(&f, "readers"), N as i64);
    assert_eq!(field_int(&f, "waiters"), 0);
    // A stall bound, far above what a linear pass takes on a busy machine
    // (the quadratic one took 372 ms).
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    let usec: i64 = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_rwlock.unlock:"))
        .and_then(|l| l.split("usec=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .expect("commandstats of RWLOCK.UNLOCK");
    eprintln!("one RWLOCK.UNLOCK granted {N} readers in {usec} µs");
    assert!(
        usec < 250_000,
        "one unlock granting {N} readers took {usec} µs"
    );
}

/// A cache hit replies from the stored string: the module copies none of it.
#[test]
fn a_big_cache_hit_is_not_copied() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let value = "x".repeat(32 << 20);
    redis::cmd("SET")
        .arg("big")
        .arg(&value)
        .query::<()>(&mut c)
        .unwrap();
    for request in [
        vec!["CACHE.GET", "big", "1000"],
        vec!["CACHE.GET", "big", "1000", "REFRESH", "10"],
        vec!["CACHE.GET", "big", "1000", "FRESH"],
    ] {
        let before = warden_stat(&mut c, "module_allocated_total");
        let reply: Vec<redis::Value> = redis::cmd(request[0])
            .arg(&request[1..])
            .query(&mut c)
            .unwrap();
        assert!(matches!(&reply[0], redis::Value::BulkString(b) if b.len() == value.len()));
        let copied = warden_stat(&mut c, "module_allocated_total") - before;
        assert!(
            copied < 64 * 1024,
            "{request:?}: the module allocated {copied} bytes"
        );
    }
}

/// A fill answers every waiter with one shared copy of the value, however
/// many wait.
#[test]
fn a_fill_answers_its_waiters_from_one_copy() {
    const WAITERS: usize = 20;
    let s = Server::start(&[]);
    let mut c = s.conn();
    let token = match redis::cmd("CACHE.GET")
        .arg("big")
        .arg(60000)
        .query::<Vec<redis::Value>>(&mut c)
        .unwrap()[1]
    {
        redis::Value::Int(t) => t,
        ref other => panic!("{other:?}"),
    };
    let waiting: Vec<_> = (0..WAITERS)
        .map(|_| spawn_command(&s, &["CACHE.GET", "big", "60000", "WAIT", "30000"]).1)
        .collect();
    wait_for("the waiters", std::time::Duration::from_secs(10), || {
        field_int(&map(&mut c, &["CACHE.INFO", "big"]), "waiters") == WAITERS as i64
    });
    let value = "x".repeat(4 << 20);
    let before = warden_stat(&mut c, "module_allocated_total");
    let filled: i64 = redis::cmd("CACHE.FILL")
        .arg("big")
        .arg(token)
        .arg(&value)
        .query(&mut c)
        .unwrap();
    assert_eq!(filled, 1);
    for w in waiting {
        match w.join().unwrap().unwrap() {
            redis::Value::Array(v) => {
                assert!(matches!(&v[0], redis::Value::BulkString(b) if b.len() == value.len()))
            }
            other => panic!("{other:?}"),
        }
    }
    let copied = warden_stat(&mut c, "module_allocated_total") - before;
    assert!(
        copied < 2 * value.len() as i64,
        "{WAITERS} waiters: the module allocated {copied} bytes for a {} byte value",
        value.len()
    );
}
