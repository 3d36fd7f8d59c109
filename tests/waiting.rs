//! LOCK.ACQUIRE ... WAIT: server-side FIFO queues and hand-off.

mod common;

use std::thread;

use common::*;
use redis::{Connection, Value};

/// Starts a blocking acquire on its own connection; returns its client id and the pending reply.
fn waiter(s: &Server, key: &str, owner: &str, ttl: &str, timeout: &str) -> (i64, Pending) {
    spawn_command(s, &["LOCK.ACQUIRE", key, owner, ttl, "WAIT", timeout])
}

fn waiters(c: &mut Connection, key: &str) -> i64 {
    waiters_of(c, "LOCK.INFO", key)
}

fn wait_queued(c: &mut Connection, key: &str, n: i64) {
    common::wait_queued(c, "LOCK.INFO", key, n);
}

fn owner(c: &mut Connection, key: &str) -> Option<String> {
    maybe_map(c, &["LOCK.INFO", key]).map(|f| field_str(&f, "owner"))
}

#[test]
fn release_hands_off_to_the_oldest_waiter() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let first = int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
    let fence = granted(b);
    assert!(fence > first);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("b"));
    let pttl = int(&mut c, &["PTTL", "k"]);
    assert!(
        pttl > 50000,
        "the waiter's own ttl counts from the grant: {pttl}"
    );
    let f = map(&mut c, &["LOCK.INFO", "k"]);
    assert_eq!(field_int(&f, "fence"), fence);
    assert_eq!(field_int(&f, "waiters"), 0);
}

#[test]
fn waiters_are_granted_in_fifo_order() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let mut handles = Vec::new();
    for i in 0..4 {
        let (_, h) = waiter(&s, "k", &format!("w{i}"), "60000", "0");
        wait_queued(&mut c, "k", i + 1);
        handles.push(h);
    }
    let mut last = 0;
    let mut current = "holder".to_string();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", &current]), 1);
        let fence = granted(h);
        assert!(fence > last);
        last = fence;
        current = format!("w{i}");
        assert_eq!(owner(&mut c, "k").as_deref(), Some(current.as_str()));
    }
}

#[test]
fn lease_end_hands_off_without_anyone_touching_the_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let first = int(&mut c, &["LOCK.ACQUIRE", "k", "a", "200"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    assert!(granted(b) > first);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("b"));
}

#[test]
fn no_request_overtakes_a_queued_waiter_after_a_lease_end() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "150"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    // Keep asking without waiting, straight through the lease end: never granted.
    let mut answers = 0;
    while owner(&mut c, "k").as_deref() != Some("b") {
        let reply = run(&mut c, &["LOCK.ACQUIRE", "k", "c", "60000"]).unwrap();
        assert_eq!(reply, Value::Nil, "a new request overtook the waiter");
        answers += 1;
    }
    assert!(answers > 0);
    granted(b);
}

#[test]
fn del_and_flushall_hand_off() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    int(&mut c, &["DEL", "k"]);
    granted(b);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("b"));

    let (_, d) = waiter(&s, "k", "d", "60000", "0");
    wait_queued(&mut c, "k", 1);
    run(&mut c, &["FLUSHALL"]).unwrap();
    granted(d);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("d"));

    let (_, e) = waiter(&s, "k", "e", "60000", "0");
    wait_queued(&mut c, "k", 1);
    run(&mut c, &["UNLINK", "k"]).unwrap();
    granted(e);
}

#[test]
fn overwrite_by_another_lock_keeps_waiters_queued_until_it_is_freed() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    int(&mut c, &["LOCK.ACQUIRE", "src", "z", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    assert_eq!(int(&mut c, &["COPY", "src", "k", "REPLACE"]), 1);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("z"));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "z"]), 1);
    granted(b);
}

#[test]
fn overwrite_by_set_answers_waiters_wrongtype() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    run(&mut c, &["SET", "k", "plain"]).unwrap();
    let e = b.join().unwrap().unwrap_err();
    assert_eq!(
        error_text(&e),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    let v: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(v, "plain");
}

#[test]
fn a_waiter_that_times_out_gets_nil_and_leaves_the_queue() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "100");
    assert_eq!(b.join().unwrap().unwrap(), Value::Nil);
    assert_eq!(waiters(&mut c, "k"), 0);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    let info: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(info.contains("wait_timeouts:1"), "{info}");
}

#[test]
fn killed_and_unblocked_waiters_are_never_granted() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (killed_id, killed) = waiter(&s, "k", "killed", "60000", "0");
    wait_queued(&mut c, "k", 1);
    let (unblocked_id, unblocked) = waiter(&s, "k", "unblocked", "60000", "0");
    wait_queued(&mut c, "k", 2);
    let (_, last) = waiter(&s, "k", "last", "60000", "0");
    wait_queued(&mut c, "k", 3);

    assert_eq!(
        int(&mut c, &["CLIENT", "KILL", "ID", &killed_id.to_string()]),
        1
    );
    assert!(killed.join().unwrap().is_err());
    if !unblock_ends_wait(&mut c) {
        // Before Redis 7.4 `CLIENT UNBLOCK` cannot end a module wait safely:
        // it answers 0, and the waiter keeps its place.
        assert_eq!(
            int(&mut c, &["CLIENT", "UNBLOCK", &unblocked_id.to_string()]),
            0
        );
        assert_eq!(waiters(&mut c, "k"), 2);
        assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
        granted(unblocked);
        assert_eq!(owner(&mut c, "k").as_deref(), Some("unblocked"));
        assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "unblocked"]), 1);
        granted(last);
        assert_eq!(owner(&mut c, "k").as_deref(), Some("last"));
        return;
    }
    assert_eq!(
        int(&mut c, &["CLIENT", "UNBLOCK", &unblocked_id.to_string()]),
        1
    );
    assert_eq!(unblocked.join().unwrap().unwrap(), Value::Nil);
    assert_eq!(waiters(&mut c, "k"), 1);

    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
    granted(last);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("last"));
}

#[test]
fn a_killed_last_waiter_leaves_the_lock_free() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (id, h) = waiter(&s, "k", "gone", "60000", "0");
    wait_queued(&mut c, "k", 1);
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert!(h.join().unwrap().is_err());
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn wait_inside_multi_and_scripts_answers_at_once() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("b")
        .arg(1000)
        .arg("WAIT")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(replies, vec![Value::Nil]);
    let v = run(
        &mut c,
        &[
            "EVAL",
            "return redis.call('LOCK.ACQUIRE', KEYS[1], 'b', 1000, 'WAIT', 0)",
            "1",
            "k",
        ],
    )
    .unwrap();
    assert_eq!(v, Value::Nil);
    assert_eq!(waiters(&mut c, "k"), 0);
    // granted at once inside MULTI when free
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("free")
        .arg("b")
        .arg(1000)
        .arg("WAIT")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert!(matches!(replies[0], Value::Int(f) if f > 0));
}

#[test]
fn debug_reload_keeps_the_queue() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&s, "k", "b", "60000", "0");
    wait_queued(&mut c, "k", 1);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(waiters(&mut c, "k"), 1);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("a"));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 1);
    granted(b);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("b"));
}

#[test]
fn the_replica_sees_hand_off_grants() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, b) = waiter(&master, "k", "b", "60000", "0");
    wait_queued(&mut m, "k", 1);
    int(&mut m, &["LOCK.RELEASE", "k", "a"]);
    let fence = granted(b);
    let (_, d) = waiter(&master, "k2", "d", "60000", "0");
    granted(d);
    int(&mut m, &["LOCK.ACQUIRE", "k3", "x", "100"]);
    let (_, e) = waiter(&master, "k3", "e", "60000", "0");
    granted(e);
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    let f = map(&mut r, &["LOCK.INFO", "k"]);
    assert_eq!(field_str(&f, "owner"), "b");
    assert_eq!(field_int(&f, "fence"), fence);
    assert_eq!(field_int(&f, "waiters"), 0);
    assert_eq!(
        int(&mut r, &["PEXPIRETIME", "k"]),
        int(&mut m, &["PEXPIRETIME", "k"])
    );
    assert_eq!(owner(&mut r, "k3").as_deref(), Some("e"));
    assert_eq!(
        int(&mut r, &["PEXPIRETIME", "k3"]),
        int(&mut m, &["PEXPIRETIME", "k3"])
    );
}

#[test]
fn mutual_exclusion_under_contention_is_exact() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "counter", "0"]).unwrap();
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let mut con = s.conn();
            thread::spawn(move || {
                let owner = format!("worker-{w}");
                for _ in 0..100 {
                    let fence = int(
                        &mut con,
                        &["LOCK.ACQUIRE", "mutex", &owner, "30000", "WAIT", "30000"],
                    );
                    assert!(fence > 0);
                    let n: i64 = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
                    run(&mut con, &["SET", "counter", &(n + 1).to_string()]).unwrap();
                    assert_eq!(int(&mut con, &["LOCK.RELEASE", "mutex", &owner]), 1);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let n: i64 = redis::cmd("GET").arg("counter").query(&mut c).unwrap();
    assert_eq!(n, 3200);
    let info: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(info.contains("wait_timeouts:0"), "{info}");
    assert!(info.contains("waiting_clients:0"), "{info}");
}

/// One kind's commands for the `WARDEN.WITHDRAW` table (`KEY` and `OWNER`
/// filled in per case): how the holder takes the key, how a waiter asks, and
/// how the holder lets go.
struct Withdrawn {
    kind: &'static str,
    hold: &'static [&'static str],
    ask: &'static [&'static str],
    free: &'static [&'static str],
    info: &'static str,
}

const WITHDRAWN: &[Withdrawn] = &[
    Withdrawn {
        kind: "lock",
        hold: &["LOCK.ACQUIRE", "KEY", "holder", "60000"],
        ask: &["LOCK.ACQUIRE", "KEY", "OWNER", "60000", "WAIT", "0"],
        free: &["LOCK.RELEASE", "KEY", "holder"],
        info: "LOCK.INFO",
    },
    Withdrawn {
        kind: "rwlock writer",
        hold: &["RWLOCK.READ", "KEY", "holder", "60000"],
        ask: &["RWLOCK.WRITE", "KEY", "OWNER", "60000", "WAIT", "0"],
        free: &["RWLOCK.UNLOCK", "KEY", "holder"],
        info: "RWLOCK.INFO",
    },
    Withdrawn {
        kind: "rwlock reader",
        hold: &["RWLOCK.WRITE", "KEY", "holder", "60000"],
        ask: &["RWLOCK.READ", "KEY", "OWNER", "60000", "WAIT", "0"],
        free: &["RWLOCK.UNLOCK", "KEY", "holder"],
        info: "RWLOCK.INFO",
    },
    Withdrawn {
        kind: "semaphore",
        hold: &["SEM.ACQUIRE", "KEY", "holder", "60000", "LIMIT", "1"],
        ask: &[
            "SEM.ACQUIRE",
            "KEY",
            "OWNER",
            "60000",
            "LIMIT",
            "1",
            "WAIT",
            "0",
        ],
        free: &["SEM.RELEASE", "KEY", "holder"],
        info: "SEM.INFO",
    },
];

/// `words` with `KEY` and `OWNER` filled in.
fn fill<'a>(words: &[&'a str], key: &'a str, owner: &'a str) -> Vec<&'a str> {
    words
        .iter()
        .map(|w| match *w {
            "KEY" => key,
            "OWNER" => owner,
            w => w,
        })
        .collect()
}

/// Sends `words` on a connection of its own and, once answered, a `PING` on
/// the same connection: (the reply, the `PING`'s).
fn wait_then_ping(s: &Server, words: &[&str]) -> thread::JoinHandle<(Value, Value)> {
    let mut c = s.conn();
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    thread::spawn(move || {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let reply = run(&mut c, &words).unwrap();
        (reply, run(&mut c, &["PING"]).unwrap())
    })
}

/// `WARDEN.WITHDRAW key owner` answers that owner's queued request nil on
/// its own connection, which stays usable; the one behind it moves up and
/// is granted when the key is freed; nothing else is taken out.
#[test]
fn withdraw_answers_the_owners_waiter_nil_and_the_queue_moves_up() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (i, case) in WITHDRAWN.iter().enumerate() {
        let key = format!("k{i}");
        let held = run(&mut c, &fill(case.hold, &key, "")).unwrap();
        assert!(!matches!(held, Value::Nil), "{}", case.kind);
        let a = wait_then_ping(&s, &fill(case.ask, &key, "a"));
        common::wait_queued(&mut c, case.info, &key, 1);
        let (_, b) = spawn_command(&s, &fill(case.ask, &key, "b"));
        common::wait_queued(&mut c, case.info, &key, 2);

        // Nobody else's request, nor another key's, nor one that is not queued.
        for (k, owner) in [
            (key.as_str(), "nobody"),
            ("elsewhere", "a"),
            (key.as_str(), "holder"),
        ] {
            assert_eq!(
                int(&mut c, &["WARDEN.WITHDRAW", k, owner]),
                0,
                "{}: {k} {owner}",
                case.kind
            );
        }
        assert_eq!(
            int(&mut c, &["WARDEN.WITHDRAW", &key, "a"]),
            1,
            "{}",
            case.kind
        );
        let (reply, ping) = a.join().unwrap();
        assert_eq!(reply, Value::Nil, "{}", case.kind);
        assert_eq!(reply_text(&ping), "PONG", "{}", case.kind);
        assert_eq!(waiters_of(&mut c, case.info, &key), 1, "{}", case.kind);
        assert_eq!(
            int(&mut c, &["WARDEN.WITHDRAW", &key, "a"]),
            0,
            "{}: twice",
            case.kind
        );

        run(&mut c, &fill(case.free, &key, "")).unwrap();
        assert!(granted(b) > 0, "{}: the next in line is granted", case.kind);
    }
}

/// A request the key can grant at once never queues, so there is nothing to
/// withdraw; a granted request is the owner's to release.
#[test]
fn withdraw_leaves_a_grant_alone() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000", "WAIT", "0"]);
    assert_eq!(int(&mut c, &["WARDEN.WITHDRAW", "k", "a"]), 0);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("a"));
}

#[test]
fn withdraw_refuses_bad_arguments() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let long = "x".repeat(1025);
    for (words, error) in [
        (&["WARDEN.WITHDRAW", "k"][..], "wrong number of arguments"),
        (
            &["WARDEN.WITHDRAW", "k", "a", "b"][..],
            "wrong number of arguments",
        ),
        (&["WARDEN.WITHDRAW", "k", ""][..], "invalid owner"),
        (
            &["WARDEN.WITHDRAW", "k", long.as_str()][..],
            "invalid owner",
        ),
    ] {
        let e = err(&mut c, words);
        assert!(e.contains(error), "{words:?}: {e}");
    }
}

/// A replica queues nobody: it answers 0 (not READONLY), whatever waits on
/// its master, which keeps its waiter.
#[test]
fn withdraw_on_a_replica_answers_0() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let (_, w) = waiter(&master, "k", "w", "60000", "0");
    wait_queued(&mut m, "k", 1);
    assert_eq!(int(&mut replica.conn(), &["WARDEN.WITHDRAW", "k", "w"]), 0);
    assert_eq!(waiters(&mut m, "k"), 1);
    assert_eq!(int(&mut m, &["LOCK.RELEASE", "k", "holder"]), 1);
    assert!(granted(w) > 0);
}
