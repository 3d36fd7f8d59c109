//! Deadlines and overload: `QUEUE n` sheds a request at the door instead of
//! queueing it, and nothing reaches a waiter after its `WAIT` deadline —
//! for every kind that waits (exclusive locks, read-write locks, semaphores,
//! cache reads).

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// A kind of request that waits, as a client sees it.
struct Case {
    name: &'static str,
    /// Makes `key` busy (its holder is `holder`).
    hold: fn(&mut Connection, &str),
    /// A request by `owner` that finds `key` busy (without `WAIT`/`QUEUE`).
    want: fn(&str, &str) -> Vec<String>,
    /// The command that frees `key` again (looked up now, sent later).
    free: fn(&mut Connection, &str) -> Vec<String>,
    info: &'static str,
    /// What a request answered at once while the key is busy gets.
    busy: fn() -> Value,
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

fn nil_pair() -> Value {
    Value::Array(vec![Value::Nil, Value::Nil])
}

const CASES: &[Case] = &[
    Case {
        name: "lock",
        hold: |c, k| assert!(int(c, &["LOCK.ACQUIRE", k, "holder", "60000"]) > 0),
        want: |k, o| words(&["LOCK.ACQUIRE", k, o, "60000"]),
        free: |_, k| words(&["LOCK.RELEASE", k, "holder"]),
        info: "LOCK.INFO",
        busy: || Value::Nil,
    },
    Case {
        name: "rwlock write",
        hold: |c, k| assert!(int(c, &["RWLOCK.WRITE", k, "holder", "60000"]) > 0),
        want: |k, o| words(&["RWLOCK.WRITE", k, o, "60000"]),
        free: |_, k| words(&["RWLOCK.UNLOCK", k, "holder"]),
        info: "RWLOCK.INFO",
        busy: || Value::Nil,
    },
    Case {
        name: "rwlock read",
        hold: |c, k| assert!(int(c, &["RWLOCK.WRITE", k, "holder", "60000"]) > 0),
        want: |k, o| words(&["RWLOCK.READ", k, o, "60000"]),
        free: |_, k| words(&["RWLOCK.UNLOCK", k, "holder"]),
        info: "RWLOCK.INFO",
        busy: || Value::Nil,
    },
    Case {
        name: "semaphore",
        hold: |c, k| assert!(int(c, &["SEM.ACQUIRE", k, "holder", "60000", "LIMIT", "1"]) > 0),
        want: |k, o| words(&["SEM.ACQUIRE", k, o, "60000", "LIMIT", "1"]),
        free: |_, k| words(&["SEM.RELEASE", k, "holder"]),
        info: "SEM.INFO",
        busy: || Value::Nil,
    },
    Case {
        name: "cache",
        hold: |c, k| {
            let got = run(c, &["CACHE.GET", k, "60000"]).unwrap();
            assert!(
                matches!(&got, Value::Array(p) if p[1] != Value::Nil),
                "{got:?}"
            );
        },
        want: |k, _| words(&["CACHE.GET", k, "60000"]),
        free: |c, k| {
            let lease = field_int(&map(c, &["CACHE.INFO", k]), "lease").to_string();
            words(&["CACHE.FILL", k, &lease, "v"])
        },
        info: "CACHE.INFO",
        busy: nil_pair,
    },
];

fn with(base: Vec<String>, extra: &[&str]) -> Vec<String> {
    base.into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
}

fn send(c: &mut Connection, w: &[String]) -> redis::RedisResult<Value> {
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    run(c, &w)
}

fn spawn(s: &Server, w: &[String]) -> (i64, Pending) {
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    spawn_command(s, &w)
}

/// A connection whose reads give up (instead of hanging the test) if a
/// request that must be answered at once blocks.
fn door(s: &Server) -> Connection {
    let c = s.conn();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

#[test]
fn queue_n_sheds_at_the_door_once_n_wait_and_changes_nothing() {
    let s = Server::start(&[]);
    for case in CASES {
        let key = format!("shed:{}", case.name);
        let k = key.as_str();
        let mut c = door(&s);
        (case.hold)(&mut c, k);
        // QUEUE 0: never queues.
        let shed_before = warden_stat(&mut c, "shed");
        let zero = with((case.want)(k, "w0"), &["WAIT", "0", "QUEUE", "0"]);
        assert_eq!(send(&mut c, &zero).unwrap(), (case.busy)(), "{}", case.name);
        assert_eq!(
            warden_stat(&mut c, "shed"),
            shed_before + 1,
            "{}",
            case.name
        );
        // QUEUE 2: the first two queue, the third is answered at once.
        let mut pending = Vec::new();
        for (i, owner) in ["w1", "w2"].iter().enumerate() {
            let w = with((case.want)(k, owner), &["QUEUE", "2", "WAIT", "0"]);
            pending.push(spawn(&s, &w));
            wait_queued(&mut c, case.info, k, i as i64 + 1);
        }
        let info_before = map(&mut c, &[case.info, k]);
        let third = with((case.want)(k, "w3"), &["WAIT", "0", "QUEUE", "2"]);
        assert_eq!(
            send(&mut c, &third).unwrap(),
            (case.busy)(),
            "{}",
            case.name
        );
        assert_eq!(
            warden_stat(&mut c, "shed"),
            shed_before + 2,
            "{}",
            case.name
        );
        // A shed request changed nothing: same holder, token, waiters.
        let info_after = map(&mut c, &[case.info, k]);
        let stable = |f: &[(String, Value)]| {
            f.iter()
                .filter(|(n, _)| n != "ttl" && n != "lease_ttl")
                .map(|(n, v)| format!("{n}={v:?}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(stable(&info_before), stable(&info_after), "{}", case.name);
        // A larger QUEUE still queues; without WAIT, QUEUE changes nothing.
        let fourth = with((case.want)(k, "w4"), &["WAIT", "0", "QUEUE", "3"]);
        pending.push(spawn(&s, &fourth));
        wait_queued(&mut c, case.info, k, 3);
        let now = with((case.want)(k, "w5"), &["QUEUE", "1"]);
        assert_eq!(send(&mut c, &now).unwrap(), (case.busy)(), "{}", case.name);
        assert_eq!(
            warden_stat(&mut c, "shed"),
            shed_before + 2,
            "{}",
            case.name
        );
        // The queue is served as before, oldest first.
        let free = (case.free)(&mut c, k);
        assert_eq!(send(&mut c, &free).unwrap(), Value::Int(1), "{}", case.name);
        let first = pending.remove(0).1.join().unwrap().unwrap();
        assert_ne!(
            first,
            (case.busy)(),
            "{}: the oldest waiter is served",
            case.name
        );
        for (id, p) in pending {
            // The rest wait on; they leave with their connections.
            run(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]).unwrap();
            let _ = p.join().unwrap();
        }
    }
}

#[test]
fn bad_queue_values_are_refused_and_change_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for case in CASES {
        let key = format!("bad:{}", case.name);
        for (extra, error) in [
            (&["QUEUE", "-1"][..], "ERR invalid QUEUE"),
            (&["QUEUE", "x"], "ERR invalid QUEUE"),
            (&["QUEUE", "70368744177665"], "ERR invalid QUEUE"),
            (&["QUEUE", "1.5"], "ERR invalid QUEUE"),
            (&["QUEUE"], "ERR syntax error"),
            (&["WAIT", "10", "QUEUE"], "ERR syntax error"),
            (&["QUEUE", "1", "QUEUE", "2"], "ERR syntax error"),
        ] {
            let w = with((case.want)(&key, "o"), extra);
            let got = send(&mut c, &w).unwrap_err();
            assert!(
                error_text(&got).starts_with(error),
                "{} {extra:?}: {got:?}",
                case.name
            );
            assert_eq!(int(&mut c, &["EXISTS", &key]), 0, "{} {extra:?}", case.name);
        }
        // The largest queue length is accepted; a free key is granted at once.
        let w = with(
            (case.want)(&key, "o"),
            &["QUEUE", "70368744177664", "WAIT", "1"],
        );
        assert_ne!(send(&mut c, &w).unwrap(), (case.busy)(), "{}", case.name);
        assert_eq!(warden_stat(&mut c, "shed"), 0);
    }
}

#[test]
fn nothing_reaches_a_waiter_after_its_deadline_even_when_the_server_was_busy() {
    let s = Server::start(&[]);
    for case in CASES {
        let key = format!("late:{}", case.name);
        let k = key.as_str();
        let mut c = door(&s);
        (case.hold)(&mut c, k);
        let timeouts = warden_stat(&mut c, "wait_timeouts");
        // A patient waiter first, then one with a deadline: for readers and
        // cache reads, one free key answers both at once.
        let (_, patient) = spawn(&s, &with((case.want)(k, "patient"), &["WAIT", "0"]));
        wait_queued(&mut c, case.info, k, 1);
        let (_, late) = spawn(&s, &with((case.want)(k, "late"), &["WAIT", "100"]));
        wait_queued(&mut c, case.info, k, 2);
        // The server sleeps past the second waiter's deadline, and the key is
        // freed by the next command of the same pipeline: read in the same
        // pass, before the deadline timer had a chance to run.
        let free = (case.free)(&mut c, k);
        let mut p = redis::pipe();
        p.cmd("DEBUG").arg("SLEEP").arg("0.3").ignore();
        let mut cmd = redis::cmd(&free[0]);
        for a in &free[1..] {
            cmd.arg(a);
        }
        p.add_command(cmd);
        let (freed,): (i64,) = p.query(&mut c).unwrap();
        assert_eq!(freed, 1, "{}", case.name);
        assert_ne!(
            patient.join().unwrap().unwrap(),
            (case.busy)(),
            "{}",
            case.name
        );
        assert_eq!(
            late.join().unwrap().unwrap(),
            (case.busy)(),
            "{}: a waiter past its deadline is answered nil",
            case.name
        );
        assert_eq!(
            warden_stat(&mut c, "wait_timeouts"),
            timeouts + 1,
            "{}",
            case.name
        );
        assert_eq!(waiters_of(&mut c, case.info, k), 0, "{}", case.name);
    }
}
