//! SEM.* against a real server: the bound, one hold per owner, strict FIFO
//! with mixed weights, leases, the limit's rules, persistence, replication.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

const TTL: &str = "60000";

fn acquire(c: &mut Connection, key: &str, owner: &str, limit: u64, permits: u64) -> Value {
    run(
        c,
        &[
            "SEM.ACQUIRE",
            key,
            owner,
            TTL,
            "LIMIT",
            &limit.to_string(),
            "PERMITS",
            &permits.to_string(),
        ],
    )
    .unwrap()
}

fn fence(v: Value) -> i64 {
    match v {
        Value::Int(n) => n,
        other => panic!("expected a fence, got {other:?}"),
    }
}

fn info(c: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    maybe_map(c, &["SEM.INFO", key])
}

/// `(limit, used, holders, waiters)`.
fn counts(c: &mut Connection, key: &str) -> (i64, i64, i64, i64) {
    let f = info(c, key).unwrap_or_else(|| panic!("no semaphore {key}"));
    (
        field_int(&f, "limit"),
        field_int(&f, "used"),
        field_int(&f, "holders"),
        field_int(&f, "waiters"),
    )
}

/// `(permits, ttl)` of one owner's hold.
fn hold_of(c: &mut Connection, key: &str, owner: &str) -> (i64, i64) {
    let f = map(c, &["SEM.INFO", key, owner]);
    (field_int(&f, "permits"), field_int(&f, "ttl"))
}

/// Blocks `owner`'s request for `permits` on its own connection.
fn wait_for_permits(s: &Server, key: &str, owner: &str, limit: u64, permits: u64) -> Pending {
    let words = [
        "SEM.ACQUIRE",
        key,
        owner,
        TTL,
        "LIMIT",
        &limit.to_string(),
        "PERMITS",
        &permits.to_string(),
        "WAIT",
        "0",
    ];
    spawn_command(s, &words).1
}

fn queued(c: &mut Connection, key: &str, n: i64) {
    wait_queued(c, "SEM.INFO", key, n);
}

#[test]
fn permits_are_granted_up_to_the_limit_with_rising_tokens() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let a = fence(acquire(&mut c, "s", "a", 3, 2));
    assert_eq!(acquire(&mut c, "s", "b", 3, 2), Value::Nil, "2 + 2 > 3");
    let b = fence(acquire(&mut c, "s", "b", 3, 1));
    assert!(b > a);
    assert_eq!(acquire(&mut c, "s", "c", 3, 1), Value::Nil);
    assert_eq!(counts(&mut c, "s"), (3, 3, 2, 0));
    assert_eq!(hold_of(&mut c, "s", "a").0, 2);
    assert_eq!(hold_of(&mut c, "s", "nobody"), (0, -2));
    let t: String = redis::cmd("TYPE").arg("s").query(&mut c).unwrap();
    assert_eq!(t, "warden-sm");
    let pttl = int(&mut c, &["PTTL", "s"]);
    assert!((1..=60_000).contains(&pttl), "{pttl}");
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "a"]), 1);
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "a"]), 0);
    let c2 = fence(acquire(&mut c, "s", "c", 3, 2));
    assert!(c2 > b);
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "b"]), 1);
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "c"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "s"]), 0, "no holders: no semaphore");
    assert!(info(&mut c, "s").is_none());
}

#[test]
fn an_acquire_stating_another_limit_or_a_second_hold_is_refused_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "a", 10, 1));
    let before = (counts(&mut c, "s"), int(&mut c, &["PEXPIRETIME", "s"]));
    let words = |owner: &'static str, limit: &'static str| -> Vec<&'static str> {
        vec![
            "SEM.ACQUIRE",
            "s",
            owner,
            "1000",
            "LIMIT",
            limit,
            "WAIT",
            "100",
        ]
    };
    assert_eq!(
        err(&mut c, &words("b", "20")),
        "ERR semaphore limit is 10, not 20"
    );
    assert_eq!(
        err(&mut c, &words("a", "10")),
        "ERR owner already holds this semaphore"
    );
    assert_eq!(
        (counts(&mut c, "s"), int(&mut c, &["PEXPIRETIME", "s"])),
        before
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let f = fence(acquire(&mut c, "held", "a", 2, 1));
    run(&mut c, &["SET", "str", "v"]).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["SEM.ACQUIRE", "k", "o", "100"],
            "ERR wrong number of arguments for 'sem.acquire' command",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "PERMITS", "1"],
            "ERR LIMIT is required: every acquire states the semaphore's limit",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "0"],
            "ERR invalid limit: expected an integer from 1 to 2147483648",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "2147483649"],
            "ERR invalid limit: expected an integer from 1 to 2147483648",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "x"],
            "ERR invalid limit: expected an integer from 1 to 2147483648",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "3", "PERMITS", "4"],
            "ERR invalid permits: expected an integer from 1 to the limit",
        ),
        (
            &[
                "SEM.ACQUIRE",
                "k",
                "o",
                "100",
                "LIMIT",
                "3",
                "PERMITS",
                "-1",
            ],
            "ERR invalid permits: expected an integer from 1 to the limit",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "0", "LIMIT", "3"],
            "ERR invalid ttl: expected an integer from 1 to 70368744177664 (ms)",
        ),
        (
            &["SEM.ACQUIRE", "k", "", "100", "LIMIT", "3"],
            "ERR invalid owner: expected a string of 1 to 1024 bytes",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "3", "WAIT", "-1"],
            "ERR invalid timeout: expected an integer from 0 to 70368744177664 (ms)",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "3", "LIMIT", "3"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "3", "PERMIT", "1"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "k", "o", "100", "LIMIT", "3", "WAIT"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "str", "o", "100", "LIMIT", "3"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["SEM.RELEASE", "str", "o"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["SEM.INFO", "str"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["SEM.EXTEND", "held", "a", "0"],
            "ERR invalid ttl: expected an integer from 1 to 70368744177664 (ms)",
        ),
        (
            &["SEM.SETLIMIT", "held", "0"],
            "ERR invalid limit: expected an integer from 1 to 2147483648",
        ),
        (
            &["SEM.INFO", "held", ""],
            "ERR invalid owner: expected a string of 1 to 1024 bytes",
        ),
        (
            &[
                "WARDEN.SEMSET",
                "held",
                "9",
                "1",
                "1",
                "SET",
                "x",
                "1",
                "1",
                "1",
            ],
            "ERR effect commands are accepted only from the master link and the AOF",
        ),
    ];
    for (words, expected) in cases {
        assert_eq!(&err(&mut c, words), expected, "{words:?}");
    }
    for words in [
        &["SEM.RELEASE", "k"][..],
        &["SEM.EXTEND", "k", "a"],
        &["SEM.SETLIMIT", "k"],
        &["SEM.INFO"],
        &["SEM.INFO", "k", "a", "b"],
    ] {
        assert!(
            err(&mut c, words).starts_with("ERR wrong number of arguments"),
            "{words:?}"
        );
    }
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    assert_eq!(counts(&mut c, "held"), (2, 1, 1, 0));
    assert_eq!(field_int(&info(&mut c, "held").unwrap(), "limit"), 2);
    assert_eq!(hold_of(&mut c, "held", "a").0, 1);
    assert!(f > 0);
}

/// A request for 3 queued first is never overtaken by later requests for 1,
/// even when a permit is free for them; each release grants every waiter at
/// the head that fits, in one pass.
#[test]
fn waiters_are_served_in_order_whatever_they_ask_for() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "h", 3, 2));
    let big = wait_for_permits(&s, "s", "big", 3, 3);
    queued(&mut c, "s", 1);
    // One permit is free, but a request for 1 may not pass the one for 3.
    assert_eq!(acquire(&mut c, "s", "eager", 3, 1), Value::Nil);
    let small: Vec<Pending> = (0..3)
        .map(|i| {
            let p = wait_for_permits(&s, "s", &format!("small-{i}"), 3, 1);
            queued(&mut c, "s", 2 + i);
            p
        })
        .collect();
    assert_eq!(counts(&mut c, "s"), (3, 2, 1, 4));
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "h"]), 1);
    let big_fence = granted(big);
    // Granted in the release's own turn: the state shows it at once.
    assert_eq!(counts(&mut c, "s"), (3, 3, 1, 3));
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "big"]), 1);
    // The three requests for 1 all fit now: one pass grants them all.
    assert_eq!(counts(&mut c, "s"), (3, 3, 3, 0));
    let fences: Vec<i64> = small.into_iter().map(granted).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(fences[0] > big_fence);
}

#[test]
fn a_holder_that_never_releases_gives_its_permits_back_at_its_lease_end() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // The holder's connection goes away: only its lease frees the permits.
    {
        let mut holder = s.conn();
        fence(
            run(
                &mut holder,
                &[
                    "SEM.ACQUIRE",
                    "s",
                    "crashed",
                    "300",
                    "LIMIT",
                    "2",
                    "PERMITS",
                    "2",
                ],
            )
            .unwrap(),
        );
    }
    let waiter = wait_for_permits(&s, "s", "next", 2, 2);
    queued(&mut c, "s", 1);
    let f = granted(waiter);
    assert!(f > 0);
    assert_eq!(hold_of(&mut c, "s", "next").0, 2);
    assert_eq!(hold_of(&mut c, "s", "crashed"), (0, -2));
    let i: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(
        i.contains("lease_expiries:") && i.contains("semaphore_keys:1"),
        "{i}"
    );
}

#[test]
fn extend_resets_only_the_owners_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SEM.ACQUIRE", "s", "a", "1000", "LIMIT", "2"]).unwrap();
    run(&mut c, &["SEM.ACQUIRE", "s", "b", "1000", "LIMIT", "2"]).unwrap();
    assert_eq!(int(&mut c, &["SEM.EXTEND", "s", "a", "50000"]), 1);
    assert_eq!(int(&mut c, &["SEM.EXTEND", "s", "z", "50000"]), 0);
    assert_eq!(int(&mut c, &["SEM.EXTEND", "missing", "a", "50000"]), 0);
    assert!(hold_of(&mut c, "s", "a").1 > 40_000);
    assert!(hold_of(&mut c, "s", "b").1 <= 1000);
    assert!(
        int(&mut c, &["PTTL", "s"]) > 40_000,
        "the key lives as long as its last lease"
    );
}

#[test]
fn setlimit_moves_the_bound_on_purpose() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        int(&mut c, &["SEM.SETLIMIT", "s", "5"]),
        0,
        "no semaphore yet"
    );
    assert_eq!(int(&mut c, &["EXISTS", "s"]), 0);
    fence(acquire(&mut c, "s", "a", 2, 2));
    let w1 = wait_for_permits(&s, "s", "w1", 2, 1);
    queued(&mut c, "s", 1);
    let w2 = wait_for_permits(&s, "s", "w2", 2, 2);
    queued(&mut c, "s", 2);
    // Raised: the waiters that now fit are granted at once.
    assert_eq!(int(&mut c, &["SEM.SETLIMIT", "s", "3"]), 1);
    granted(w1);
    assert_eq!(counts(&mut c, "s"), (3, 3, 2, 1));
    // The old limit is refused now, the new one accepted.
    assert_eq!(
        err(&mut c, &["SEM.ACQUIRE", "s", "x", "100", "LIMIT", "2"]),
        "ERR semaphore limit is 3, not 2"
    );
    // Lowered below what is held: holds stay, nothing new is granted, and a
    // waiter asking for more than the new limit is told so.
    assert_eq!(int(&mut c, &["SEM.SETLIMIT", "s", "1"]), 1);
    match w2.join().unwrap() {
        Err(e) => assert_eq!(
            error_text(&e),
            "ERR the semaphore's limit was lowered below the permits this request asks for"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(counts(&mut c, "s"), (1, 3, 2, 0));
    let w3 = wait_for_permits(&s, "s", "w3", 1, 1);
    queued(&mut c, "s", 1);
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "a"]), 1);
    assert_eq!(
        counts(&mut c, "s"),
        (1, 1, 1, 1),
        "1 held > limit - 1: w3 waits"
    );
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "w1"]), 1);
    granted(w3);
    assert_eq!(counts(&mut c, "s"), (1, 1, 1, 0));
}

#[test]
fn waits_end_with_nil_at_their_timeout_and_never_block_inside_multi() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "a", 1, 1));
    let started = std::time::Instant::now();
    assert!(is_nil(
        &mut c,
        &["SEM.ACQUIRE", "s", "b", "100", "LIMIT", "1", "WAIT", "50"]
    ));
    assert!(started.elapsed() >= Duration::from_millis(50));
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg(&["s", "b", "100", "LIMIT", "1", "WAIT", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(replies, vec![Value::Nil]);
    // A waiter that disconnects leaves the queue and is never granted.
    let mut gone = s.conn();
    let request = redis::cmd("SEM.ACQUIRE")
        .arg(&["s", "gone", "100", "LIMIT", "1", "WAIT", "0"])
        .get_packed_command();
    gone.send_packed_command(&request).unwrap();
    queued(&mut c, "s", 1);
    drop(gone);
    wait_for("the waiter gone", Duration::from_secs(10), || {
        counts(&mut c, "s").3 == 0
    });
    assert_eq!(int(&mut c, &["SEM.RELEASE", "s", "a"]), 1);
    assert_eq!(int(&mut c, &["EXISTS", "s"]), 0);
}

#[test]
fn a_deleted_semaphore_serves_its_waiters_under_their_limit() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "a", 2, 2));
    let w = wait_for_permits(&s, "s", "w", 2, 1);
    queued(&mut c, "s", 1);
    assert_eq!(int(&mut c, &["DEL", "s"]), 1);
    granted(w);
    assert_eq!(counts(&mut c, "s"), (2, 1, 1, 0));
}

#[test]
fn contended_semaphores_are_listed_with_their_kind() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "a", 1, 1));
    let w = wait_for_permits(&s, "s", "w", 1, 1);
    queued(&mut c, "s", 1);
    let rows = run(&mut c, &["WARDEN.CONTENDED"]).unwrap();
    let text = format!("{rows:?}");
    assert!(text.contains("semaphore"), "{text}");
    int(&mut c, &["SEM.RELEASE", "s", "a"]);
    granted(w);
    let i: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(
        i.contains("semaphore_wait_ms:") && i.contains("semaphore_hold_ms:"),
        "{i}"
    );
}

/// Everything SEM.INFO tells, per owner, minus the ticking ttls; and the key's expiry.
fn state(c: &mut Connection, key: &str, owners: &[&str]) -> (Vec<i64>, i64) {
    let (limit, used, holders, _) = counts(c, key);
    let mut v = vec![limit, used, holders];
    v.extend(owners.iter().map(|o| hold_of(c, key, o).0));
    (v, int(c, &["PEXPIRETIME", key]))
}

#[test]
fn persistence_keeps_the_limit_holders_and_leases() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let owners = ["a", "b", "c"];
    fence(acquire(&mut c, "s", "a", 5, 2));
    run(&mut c, &["SEM.ACQUIRE", "s", "b", "90000", "LIMIT", "5"]).unwrap();
    fence(acquire(&mut c, "s", "c", 5, 1));
    int(&mut c, &["SEM.RELEASE", "s", "c"]);
    let top = fence(acquire(&mut c, "s", "c", 5, 2));
    let before = state(&mut c, "s", &owners);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(state(&mut c, "s", &owners), before);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("s").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("s2")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(state(&mut c, "s2", &owners).0, before.0);
    assert_eq!(int(&mut c, &["COPY", "s", "s3"]), 1);
    assert_eq!(state(&mut c, "s3", &owners), before);
    assert!(int(&mut c, &["MEMORY", "USAGE", "s"]) > 0);
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(state(&mut c, "s", &owners), before);
    rewrite_aof(&mut c);
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(state(&mut c, "s", &owners), before);
    assert!(fence(acquire(&mut c, "fresh", "d", 5, 1)) > top);
    restore_every_truncation(&mut c, &dump);
}

#[test]
fn the_replica_has_the_same_holders_and_leases() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let owners = ["a", "b", "w", "x"];
    fence(acquire(&mut m, "s", "a", 3, 2));
    run(&mut m, &["SEM.ACQUIRE", "s", "b", "1", "LIMIT", "3"]).unwrap();
    let w = wait_for_permits(&master, "s", "w", 3, 2);
    queued(&mut m, "s", 1);
    // b's lease ends by itself; a's release then grants w.
    wait_for("b's lease end", Duration::from_secs(10), || {
        hold_of(&mut m, "s", "b").0 == 0
    });
    int(&mut m, &["SEM.RELEASE", "s", "a"]);
    granted(w);
    int(&mut m, &["SEM.EXTEND", "s", "w", "90000"]);
    int(&mut m, &["SEM.SETLIMIT", "s", "4"]);
    fence(acquire(&mut m, "s", "x", 4, 1));
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    assert_eq!(state(&mut r, "s", &owners), state(&mut m, "s", &owners));
    assert!(err(&mut r, &["SEM.ACQUIRE", "s", "c", "100", "LIMIT", "4"]).starts_with("READONLY"));
    // The last release deletes the key on the replica too.
    int(&mut m, &["SEM.RELEASE", "s", "w"]);
    int(&mut m, &["SEM.RELEASE", "s", "x"]);
    sync_replicas(&mut m, 1);
    assert_eq!(int(&mut r, &["EXISTS", "s"]), 0);
}

/// A release among many holders sends the replicas that one hold, not the
/// whole semaphore: the replication stream grows by a bound independent of
/// the number of holders.
#[test]
fn a_release_replicates_one_hold_whatever_the_number_of_holders() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut pipe = redis::pipe();
    for i in 0..2000 {
        pipe.cmd("SEM.ACQUIRE")
            .arg("s")
            .arg(format!("holder-{i}"))
            .arg(TTL)
            .arg("LIMIT")
            .arg(5000)
            .ignore();
    }
    pipe.query::<()>(&mut m).unwrap();
    assert_eq!(counts(&mut m, "s").2, 2000);
    let offset = |c: &mut Connection| info_int(c, "replication", "master_repl_offset");
    for words in [
        &["SEM.RELEASE", "s", "holder-7"][..],
        &["SEM.EXTEND", "s", "holder-8", "90000"],
        &["SEM.ACQUIRE", "s", "one-more", TTL, "LIMIT", "5000"],
    ] {
        let before = offset(&mut m);
        run(&mut m, words).unwrap();
        let grew = offset(&mut m) - before;
        assert!(grew < 1000, "{words:?}: {grew} bytes replicated");
    }
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    assert_eq!(counts(&mut r, "s"), counts(&mut m, "s"));
    assert_eq!(hold_of(&mut r, "s", "holder-7"), (0, -2));
}

#[test]
fn no_new_holder_inside_the_grace_window() {
    let s = Server::start(&["--warden.grace", "3000"]);
    let mut c = s.conn();
    assert!(is_nil(
        &mut c,
        &["SEM.ACQUIRE", "s", "a", "1000", "LIMIT", "2"]
    ));
    // Queued, and granted in order once the window ends.
    let w = wait_for_permits(&s, "s", "w", 2, 2);
    queued(&mut c, "s", 1);
    let f = counts(&mut c, "s");
    assert_eq!(f, (2, 0, 0, 1), "the waiters' limit while nobody holds");
    assert!(granted(w) > 0);
    assert_eq!(counts(&mut c, "s"), (2, 2, 1, 0));
}

#[test]
fn leases_are_capped_by_max_lease() {
    let s = Server::start(&["--warden.max-lease", "2000"]);
    let mut c = s.conn();
    assert!(
        err(&mut c, &["SEM.ACQUIRE", "s", "a", "3000", "LIMIT", "2"])
            .starts_with("ERR ttl exceeds warden.max-lease")
    );
    run(&mut c, &["SEM.ACQUIRE", "s", "a", "2000", "LIMIT", "2"]).unwrap();
    assert!(err(&mut c, &["SEM.EXTEND", "s", "a", "3000"])
        .starts_with("ERR ttl exceeds warden.max-lease"));
    // PEXPIRE cannot stretch the key past its lease.
    int(&mut c, &["PEXPIRE", "s", "3600000"]);
    info(&mut c, "s");
    run(&mut c, &["SEM.ACQUIRE", "s", "b", "10", "LIMIT", "2"]).unwrap();
    assert!(int(&mut c, &["PTTL", "s"]) <= 2000);
}

fn leb128(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// `DUMP` of a semaphore by a build that saved each hold as four fields
/// (encoding 1, Redis 7.0's RDB 10): `alice` with 2 of 5 permits and `bob`
/// with 1, leases of ten years from 2026.
const ENCODING_1: &str = "0781c1aadd7a7fac980102050281000688758c34240002020503626f620201028100\
0688758c3424000281000001eb8a4ec5090505616c69636502020281000688758c3420000281000001eb8a4ec50800\
0a00226602d6bf870fe8";

/// A semaphore saved in the older encoding still loads, and saved again (in
/// the current one) keeps its holders, permits, tokens and leases.
#[test]
fn a_semaphore_of_the_older_encoding_still_loads() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let payload: Vec<u8> = (0..ENCODING_1.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&ENCODING_1[i..i + 2], 16).unwrap())
        .collect();
    redis::cmd("RESTORE")
        .arg("old")
        .arg(0)
        .arg(&payload)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(counts(&mut c, "old"), (5, 3, 2, 0));
    let before = (
        hold_of(&mut c, "old", "alice").0,
        hold_of(&mut c, "old", "bob").0,
    );
    assert_eq!(before, (2, 1));
    let dump: Vec<u8> = redis::cmd("DUMP").arg("old").query(&mut c).unwrap();
    assert_ne!(dump, payload, "saved again in the current encoding");
    redis::cmd("RESTORE")
        .arg("new")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(counts(&mut c, "new"), (5, 3, 2, 0));
    for key in ["old", "new"] {
        assert_eq!(hold_of(&mut c, key, "alice").0, 2);
        assert!(
            hold_of(&mut c, key, "bob").1 > 86_400_000,
            "{key}: bob's lease"
        );
        assert_eq!(int(&mut c, &["SEM.RELEASE", key, "bob"]), 1);
        let next = fence(acquire(&mut c, key, "carol", 5, 3));
        assert!(next > 1_838_888_305_042_432, "{key}: token {next}");
    }
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(counts(&mut c, "old"), (5, 5, 2, 0));
}

/// `MEMORY USAGE` of a big semaphore is what the server's memory grew by
/// when its holders came (within 10 %, whatever the allocator), and `DUMP`/
/// `RESTORE` and `COPY` carry every holder.
#[test]
fn memory_usage_of_a_big_semaphore_is_what_it_takes() {
    const HOLDERS: usize = 20_000;
    let s = Server::start(&[]);
    let mut c = s.conn();
    let used = |c: &mut Connection| info_int(c, "memory", "used_memory");
    let owner = |i: usize| format!("worker-{i:08}-{:012x}", i * 7919);
    let before = used(&mut c);
    for start in (0..HOLDERS).step_by(1000) {
        let mut pipe = redis::pipe();
        for i in start..start + 1000 {
            pipe.cmd("SEM.ACQUIRE")
                .arg("big")
                .arg(owner(i))
                .arg(3_600_000)
                .arg("LIMIT")
                .arg(1u64 << 31)
                .ignore();
        }
        pipe.query::<()>(&mut c).unwrap();
    }
    let grew = used(&mut c) - before;
    let reported = int(&mut c, &["MEMORY", "USAGE", "big", "SAMPLES", "0"]);
    let ratio = reported as f64 / grew as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "MEMORY USAGE {reported} B for {grew} B taken ({ratio:.2}x)"
    );
    let payload: Vec<u8> = redis::cmd("DUMP").arg("big").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(&payload)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(int(&mut c, &["COPY", "big", "copied"]), 1);
    for key in ["big", "restored", "copied"] {
        assert_eq!(counts(&mut c, key).2, HOLDERS as i64, "{key}");
        for i in [0, HOLDERS / 2, HOLDERS - 1] {
            assert_eq!(hold_of(&mut c, key, &owner(i)).0, 1, "{key} {i}");
        }
    }
}

/// Packed holds cut short or with any byte changed (checksum fixed, so
/// that the module reads them) are refused or load as a valid semaphore;
/// the server never falls over.
#[test]
fn damaged_packed_holds_are_refused_or_valid() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["CONFIG", "SET", "rdbcompression", "no"]).unwrap();
    for owner in ["alice", "bob", "carol"] {
        fence(acquire(&mut c, "s", owner, 5, 1));
    }
    let dump: Vec<u8> = redis::cmd("DUMP").arg("s").query(&mut c).unwrap();
    let body = &dump[..dump.len() - 10];
    for cut in 1..body.len() {
        try_restore(&mut c, &resign(&dump, body[..cut].to_vec()));
    }
    for at in 1..body.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut damaged = body.to_vec();
            damaged[at] ^= flip;
            try_restore(&mut c, &resign(&dump, damaged));
            if let Some(f) = info(&mut c, "t") {
                assert!(field_int(&f, "used") <= 3 * 5, "{at} {flip}: {f:?}");
            }
        }
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

/// A payload whose two holds carry one token (forged: tokens are unique per
/// key) is refused: it could make one release take another's hold with it.
#[test]
fn a_restored_payload_repeating_a_token_is_refused() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let alice = fence(acquire(&mut c, "s", "alice", 3, 1));
    let bob = fence(acquire(&mut c, "s", "bob", 3, 2));
    // The holds are packed in one string, uncompressed, tokens in LEB128.
    run(&mut c, &["CONFIG", "SET", "rdbcompression", "no"]).unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("s").query(&mut c).unwrap();
    let body = &dump[..dump.len() - 10];
    let (alice, bob) = (leb128(alice as u64), leb128(bob as u64));
    assert_eq!(alice.len(), bob.len());
    let last = body
        .windows(bob.len())
        .rposition(|w| w == bob)
        .expect("bob's token in the payload");
    let mut patched = body.to_vec();
    patched[last..last + bob.len()].copy_from_slice(&alice);
    let forged = resign(&dump, patched);
    let refused = redis::cmd("RESTORE")
        .arg("forged")
        .arg(0)
        .arg(&forged)
        .query::<()>(&mut c);
    assert!(refused.is_err(), "a payload repeating a token was restored");
    assert_eq!(int(&mut c, &["EXISTS", "forged"]), 0);
}

/// An expiry put back by a command that changes nothing else (after
/// `PEXPIRE` or `PERSIST` moved it) reaches the replica too.
#[test]
fn an_expiry_put_back_reaches_the_replica() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    run(&mut m, &["SEM.ACQUIRE", "k", "a", "50000", "LIMIT", "3"]).unwrap();
    for (moved, noop) in [
        (
            &["PEXPIRE", "k", "1000000"][..],
            &["SEM.RELEASE", "k", "nobody"][..],
        ),
        (&["PERSIST", "k"], &["SEM.EXTEND", "k", "nobody", "100"]),
        (
            &["PEXPIRE", "k", "1000000"],
            &["SEM.ACQUIRE", "k", "b", "100", "LIMIT", "4"],
        ),
    ] {
        run(&mut m, moved).unwrap();
        let _ = run(&mut m, noop);
        sync_replicas(&mut m, 1);
        let on_master = int(&mut m, &["PEXPIRETIME", "k"]);
        assert!(on_master > 0, "{noop:?}: {on_master}");
        assert_eq!(int(&mut r, &["PEXPIRETIME", "k"]), on_master, "{noop:?}");
    }
}

/// A semaphore whose last lease ended is none, even while its key lives on
/// (`PERSIST`): an acquire stating another limit starts a new one.
#[test]
fn a_semaphore_whose_holds_all_ended_is_none() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SEM.ACQUIRE", "s", "a", "100", "LIMIT", "5"]).unwrap();
    assert_eq!(int(&mut c, &["PERSIST", "s"]), 1);
    wait_for("a's lease end", Duration::from_secs(10), || {
        info(&mut c, "s").is_none()
    });
    fence(run(&mut c, &["SEM.ACQUIRE", "s", "b", "60000", "LIMIT", "7"]).unwrap());
    assert_eq!(counts(&mut c, "s"), (7, 1, 1, 0));
}

/// A waiter whose key is replaced by a semaphore of another limit than the
/// one it stated is told so, never granted under a limit it did not state.
#[test]
fn a_waiter_is_never_granted_under_a_limit_it_did_not_state() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    fence(acquire(&mut c, "s", "h", 2, 2));
    let w = wait_for_permits(&s, "s", "w", 2, 1);
    queued(&mut c, "s", 1);
    fence(acquire(&mut c, "src", "x", 3, 1));
    let payload: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("s")
        .arg(0)
        .arg(&payload)
        .arg("REPLACE")
        .query::<()>(&mut c)
        .unwrap();
    match w.join().unwrap() {
        Err(e) => assert_eq!(
            error_text(&e),
            "ERR the semaphore was replaced by one of another limit while this request waited"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(counts(&mut c, "s"), (3, 1, 1, 0));
}
