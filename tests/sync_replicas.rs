//! Grants the replicas acknowledged (`warden.sync-replicas`): a grant, hand-off,
//! new reader, semaphore hold or extend is answered only once a replica has
//! it; past `warden.sync-timeout` it is taken back and answered busy. Each
//! test stops the replica (SIGSTOP) to hold acknowledgements back.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// A master with `warden.sync-replicas 1` (and `sync-timeout` ms) and one
/// streaming replica.
fn pair(timeout_ms: i64) -> (Server, Server) {
    pair_with(timeout_ms, &[])
}

/// [`pair`], the master started with `master_args`.
fn pair_with(timeout_ms: i64, master_args: &[&str]) -> (Server, Server) {
    let master = Server::start_tcp(master_args);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    // A write the replica must acknowledge: it streams, not just loads.
    run(&mut m, &["SET", "streaming", "1"]).unwrap();
    sync_replicas(&mut m, 1);
    run(&mut m, &["CONFIG", "SET", "warden.sync-replicas", "1"]).unwrap();
    let timeout = timeout_ms.to_string();
    run(&mut m, &["CONFIG", "SET", "warden.sync-timeout", &timeout]).unwrap();
    (master, replica)
}

/// Waits until `n` grants wait for acknowledgements.
fn wait_held(c: &mut Connection, n: i64) {
    wait_for(
        &format!("{n} grants waiting for the replica"),
        Duration::from_secs(20),
        || warden_stat(c, "sync_waiting") == n,
    );
}

/// `(name, setup, command, info command)`.
type GrantCase = (
    &'static str,
    Vec<Vec<&'static str>>,
    Vec<&'static str>,
    &'static str,
);

/// Every way a command grants or extends, as `(setup, command, info)`: the
/// setup runs first, the command is the one that waits, `info` shows the key.
fn grant_cases() -> Vec<GrantCase> {
    vec![
        (
            "lock",
            vec![],
            vec!["LOCK.ACQUIRE", "k", "a", "60000"],
            "LOCK.INFO",
        ),
        (
            "lock re-entry",
            vec![vec!["LOCK.ACQUIRE", "k", "a", "60000"]],
            vec!["LOCK.ACQUIRE", "k", "a", "60000"],
            "LOCK.INFO",
        ),
        (
            "read lock",
            vec![],
            vec!["RWLOCK.READ", "k", "a", "60000"],
            "RWLOCK.INFO",
        ),
        (
            "second reader",
            vec![vec!["RWLOCK.READ", "k", "b", "60000"]],
            vec!["RWLOCK.READ", "k", "a", "60000"],
            "RWLOCK.INFO",
        ),
        (
            "write lock",
            vec![],
            vec!["RWLOCK.WRITE", "k", "a", "60000"],
            "RWLOCK.INFO",
        ),
        (
            "semaphore",
            vec![],
            vec!["SEM.ACQUIRE", "k", "a", "60000", "LIMIT", "2"],
            "SEM.INFO",
        ),
    ]
}

/// The state a key shows on `c` but its lease's ms left and its latest
/// token, which a take-back leaves ("nil": no key).
fn shown(c: &mut Connection, info: &str) -> String {
    match maybe_map(c, &[info, "k"]) {
        None => "nil".into(),
        Some(fields) => fields
            .iter()
            .filter(|(name, _)| name != "ttl" && name != "fence")
            .map(|(name, v)| format!("{name}={v:?}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[test]
fn an_acknowledgement_timeout_answers_busy_and_leaves_no_hold() {
    for (name, setup, command, info) in grant_cases() {
        let (master, replica) = pair(100);
        let mut m = master.conn();
        for words in &setup {
            run(&mut m, words).unwrap();
        }
        sync_replicas(&mut m, 1);
        let before = shown(&mut m, info);
        replica.signal("STOP");
        let reply = run(&mut m, &command).unwrap();
        assert_eq!(reply, Value::Nil, "{name}: busy, never granted");
        assert_eq!(
            shown(&mut m, info),
            before,
            "{name}: the hold was taken back"
        );
        assert_eq!(warden_stat(&mut m, "sync_timeouts"), 1, "{name}");
        replica.signal("CONT");
        sync_replicas(&mut m, 1);
        let mut r = replica.conn();
        assert_eq!(
            shown(&mut r, info),
            before,
            "{name}: the replica has no hold either"
        );
    }
}

#[test]
fn an_acknowledged_grant_is_on_the_replica_when_it_is_answered() {
    for (name, setup, command, info) in grant_cases() {
        let (master, replica) = pair(10_000);
        let mut m = master.conn();
        for words in &setup {
            run(&mut m, words).unwrap();
        }
        // Held back until the replica runs again: the answer waits for it.
        let acked = warden_stat(&mut m, "sync_acked");
        replica.signal("STOP");
        let (_, pending) = spawn_command(&master, &command);
        wait_held(&mut m, 1);
        replica.signal("CONT");
        assert!(granted(pending) > 0);
        let on_master = shown(&mut m, info);
        assert_ne!(on_master, "nil");
        let mut r = replica.conn();
        assert_eq!(
            shown(&mut r, info),
            on_master,
            "{name}: the replica has the grant when its client is told"
        );
        assert_eq!(warden_stat(&mut m, "sync_acked"), acked + 1, "{name}");
    }
}

/// The master reads acknowledgements from `ROLE`, or from `INFO
/// replication` where `ROLE` is renamed or removed: either way a grant is
/// answered only once the replica has it.
#[test]
fn grants_wait_for_the_replica_whether_role_is_renamed_or_not() {
    let cases: [(&str, &[&str]); 3] = [
        ("ROLE", &[]),
        ("ROLE renamed", &["--rename-command", "ROLE", "ROLE-7f3a"]),
        ("ROLE removed", &["--rename-command", "ROLE", ""]),
    ];
    for (name, args) in cases {
        let (master, replica) = pair_with(10_000, args);
        let mut m = master.conn();
        let acked = warden_stat(&mut m, "sync_acked");
        replica.signal("STOP");
        let (_, pending) = spawn_command(&master, &["LOCK.ACQUIRE", "k", "a", "60000"]);
        wait_held(&mut m, 1);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            warden_stat(&mut m, "sync_waiting"),
            1,
            "{name}: still waiting"
        );
        replica.signal("CONT");
        assert!(granted(pending) > 0, "{name}");
        let on_master = shown(&mut m, "LOCK.INFO");
        assert_ne!(on_master, "nil", "{name}");
        let mut r = replica.conn();
        assert_eq!(
            shown(&mut r, "LOCK.INFO"),
            on_master,
            "{name}: on the replica"
        );
        assert_eq!(warden_stat(&mut m, "sync_acked"), acked + 1, "{name}");
    }
}

#[test]
fn extends_wait_for_the_replica_and_answer_zero_without_it() {
    let cases: [(&str, Vec<&str>, Vec<&str>); 3] = [
        (
            "lock",
            vec!["LOCK.ACQUIRE", "k", "a", "60000"],
            vec!["LOCK.EXTEND", "k", "a", "90000"],
        ),
        (
            "read-write lock",
            vec!["RWLOCK.WRITE", "k", "a", "60000"],
            vec!["RWLOCK.EXTEND", "k", "a", "90000"],
        ),
        (
            "semaphore",
            vec!["SEM.ACQUIRE", "k", "a", "60000", "LIMIT", "1"],
            vec!["SEM.EXTEND", "k", "a", "90000"],
        ),
    ];
    for (name, hold, extend) in cases {
        let (master, replica) = pair(100);
        let mut m = master.conn();
        let got = run(&mut m, &hold);
        assert!(matches!(got, Ok(Value::Int(_))), "{name}: {got:?}");
        assert_eq!(int(&mut m, &extend), 1, "{name}: acknowledged");
        replica.signal("STOP");
        assert_eq!(int(&mut m, &extend), 0, "{name}: not acknowledged in time");
        replica.signal("CONT");
    }
}

#[test]
fn a_grant_waiting_for_acknowledgement_is_not_granted_twice_nor_handed_on() {
    let (master, replica) = pair(10_000);
    let mut m = master.conn();
    replica.signal("STOP");
    let (_, first) = spawn_command(&master, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    wait_held(&mut m, 1);
    // The key holds the unacknowledged grant: busy for everybody else.
    assert!(is_nil(&mut m, &["LOCK.ACQUIRE", "k", "b", "60000"]));
    let (_, second) = spawn_command(&master, &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"]);
    wait_queued(&mut m, "LOCK.INFO", "k", 1);
    replica.signal("CONT");
    let fence = granted(first);
    let info = map(&mut m, &["LOCK.INFO", "k"]);
    assert_eq!(field_str(&info, "owner"), "a");
    assert_eq!(field_int(&info, "waiters"), 1, "b still waits");
    assert_eq!(int(&mut m, &["LOCK.RELEASE", "k", "a"]), 1);
    assert!(granted(second) > fence, "b is granted after a let go");
}

#[test]
fn a_handoff_waits_for_the_acknowledgement_and_its_waiters_deadline() {
    // (sync-timeout, the waiter's WAIT): whichever ends first answers nil.
    for (timeout_ms, wait_ms) in [(200, 0), (20_000, 300)] {
        let (master, replica) = pair(timeout_ms);
        let mut m = master.conn();
        assert!(matches!(
            run(&mut m, &["LOCK.ACQUIRE", "k", "a", "60000"]).unwrap(),
            Value::Int(_)
        ));
        let wait = wait_ms.to_string();
        let (_, waiter) =
            spawn_command(&master, &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", &wait]);
        wait_queued(&mut m, "LOCK.INFO", "k", 1);
        replica.signal("STOP");
        assert_eq!(int(&mut m, &["LOCK.RELEASE", "k", "a"]), 1);
        assert_eq!(
            waiter.join().unwrap().unwrap(),
            Value::Nil,
            "sync-timeout {timeout_ms}, WAIT {wait_ms}: the hand-off was not acknowledged"
        );
        assert!(
            is_nil(&mut m, &["LOCK.INFO", "k"]),
            "the hand-off was taken back"
        );
        replica.signal("CONT");
    }
}

#[test]
fn a_killed_or_unblocked_waiting_client_gives_the_hold_back() {
    let unblock = {
        let probe = Server::start(&[]);
        unblock_ends_wait(&mut probe.conn())
    };
    let mut ways = vec![vec!["CLIENT", "KILL", "ID"]];
    if unblock {
        ways.push(vec!["CLIENT", "UNBLOCK"]);
    }
    for way in ways {
        for (name, _, command, info) in grant_cases().into_iter().filter(|c| c.1.is_empty()) {
            let (master, replica) = pair(20_000);
            let mut m = master.conn();
            replica.signal("STOP");
            let (id, pending) = spawn_command(&master, &command);
            wait_held(&mut m, 1);
            let id = id.to_string();
            let words: Vec<&str> = way.iter().copied().chain([id.as_str()]).collect();
            assert_eq!(int(&mut m, &words), 1, "{way:?} {name}");
            let reply = pending.join().unwrap();
            assert!(
                !matches!(reply, Ok(Value::Int(_))),
                "{way:?} {name}: never granted: {reply:?}"
            );
            assert_eq!(warden_stat(&mut m, "sync_waiting"), 0);
            assert_eq!(shown(&mut m, info), "nil", "{way:?} {name}: given back");
            replica.signal("CONT");
            sync_replicas(&mut m, 1);
            assert_eq!(shown(&mut replica.conn(), info), "nil", "{way:?} {name}");
        }
    }
}

#[test]
fn grants_inside_multi_or_a_script_are_refused_and_change_nothing() {
    let (master, _replica) = pair(100);
    let mut m = master.conn();
    run(&mut m, &["LOCK.ACQUIRE", "held", "a", "60000"]).unwrap();
    let commands: [&[&str]; 5] = [
        &["LOCK.ACQUIRE", "k", "a", "60000"],
        &["LOCK.EXTEND", "held", "a", "60000"],
        &["RWLOCK.READ", "k", "a", "60000"],
        &["SEM.ACQUIRE", "k", "a", "60000", "LIMIT", "1"],
        &["SEM.EXTEND", "k", "a", "60000"],
    ];
    for words in commands {
        run(&mut m, &["MULTI"]).unwrap();
        run(&mut m, words).unwrap();
        let text = match run(&mut m, &["EXEC"]) {
            Ok(v) => format!("{v:?}"),
            Err(e) => error_text(&e),
        };
        assert!(text.contains("sync-replicas"), "{words:?} in MULTI: {text}");
        let mut script = vec!["EVAL", "return redis.call(unpack(ARGV))", "0"];
        script.extend_from_slice(words);
        let e = err(&mut m, &script);
        assert!(e.contains("sync-replicas"), "{words:?} in a script: {e}");
    }
    assert!(is_nil(&mut m, &["LOCK.INFO", "k"]));
    assert!(is_nil(&mut m, &["RWLOCK.INFO", "k"]));
    assert!(is_nil(&mut m, &["SEM.INFO", "k"]));
    // Releases still run inside MULTI: they grant nobody here.
    run(&mut m, &["MULTI"]).unwrap();
    run(&mut m, &["LOCK.RELEASE", "held", "a"]).unwrap();
    let exec = run(&mut m, &["EXEC"]).unwrap();
    assert_eq!(exec, Value::Array(vec![Value::Int(1)]));
}

#[test]
fn a_timeout_while_writes_are_paused_takes_the_grant_back_when_they_resume() {
    let (master, replica) = pair(200);
    let mut m = master.conn();
    replica.signal("STOP");
    let (_, pending) = spawn_command(&master, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    wait_held(&mut m, 1);
    run(&mut m, &["CLIENT", "PAUSE", "5000", "WRITE"]).unwrap();
    assert_eq!(pending.join().unwrap().unwrap(), Value::Nil);
    // Paused: the take-back waits (writing now would crash the server).
    run(&mut m, &["CLIENT", "UNPAUSE"]).unwrap();
    wait_for("the grant taken back", Duration::from_secs(10), || {
        is_nil(&mut m, &["LOCK.INFO", "k"])
    });
    replica.signal("CONT");
    sync_replicas(&mut m, 1);
    assert!(is_nil(&mut replica.conn(), &["LOCK.INFO", "k"]));
}

#[test]
fn a_master_that_becomes_a_replica_answers_its_waiting_grants_with_an_error() {
    let (master, replica) = pair(20_000);
    let other = Server::start_tcp(&[]);
    let mut m = master.conn();
    replica.signal("STOP");
    let (_, pending) = spawn_command(&master, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    wait_held(&mut m, 1);
    let port = other.port.unwrap().to_string();
    run(&mut m, &["REPLICAOF", "127.0.0.1", &port]).unwrap();
    let reply = pending.join().unwrap();
    assert!(reply.is_err(), "not a grant: {reply:?}");
    assert_eq!(warden_stat(&mut m, "sync_waiting"), 0);
    replica.signal("CONT");
}

#[test]
fn grants_of_one_turn_share_one_acknowledgement() {
    let (master, _replica) = pair(5_000);
    let clients: Vec<_> = (0..40)
        .map(|i| {
            let mut c = master.conn();
            std::thread::spawn(move || {
                for j in 0..25 {
                    let key = format!("k{i}-{j}");
                    let fence = int(&mut c, &["LOCK.ACQUIRE", &key, "a", "60000"]);
                    assert!(fence > 0);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let mut m = master.conn();
    let acked = warden_stat(&mut m, "sync_acked");
    let asked = warden_stat(&mut m, "sync_getacks");
    assert_eq!(acked, 1000);
    assert!(
        asked < acked,
        "{asked} GETACKs for {acked} grants: grants of one turn share one"
    );
}

#[test]
fn sync_settings_refuse_bad_values_and_grace_auto_needs_max_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (name, value) in [
        ("warden.sync-replicas", "-1"),
        ("warden.sync-replicas", "1025"),
        ("warden.sync-timeout", "0"),
        ("warden.sync-timeout", "soon"),
        ("warden.grace", "automatic"),
        ("warden.grace", "auto"),
    ] {
        let e = err(&mut c, &["CONFIG", "SET", name, value]);
        assert!(e.starts_with("ERR"), "{name} {value}: {e}");
    }
    run(&mut c, &["CONFIG", "SET", "warden.max-lease", "30000"]).unwrap();
    run(&mut c, &["CONFIG", "SET", "warden.grace", "auto"]).unwrap();
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.grace")
        .query(&mut c)
        .unwrap();
    assert_eq!(got, vec!["warden.grace", "auto"]);
    let e = err(&mut c, &["CONFIG", "SET", "warden.max-lease", "0"]);
    assert!(e.contains("max-lease"), "{e}");
    run(&mut c, &["CONFIG", "SET", "warden.grace", "41000"]).unwrap();
    run(&mut c, &["CONFIG", "SET", "warden.max-lease", "0"]).unwrap();

    let mut bad = Plain::start(&[module(module_path(), &["grace", "auto"])]);
    assert!(
        !bad.runs(),
        "grace auto without max-lease must refuse the load"
    );
    assert!(
        bad.log().contains("needs warden.max-lease"),
        "{}",
        bad.log()
    );
    let mut ok = Plain::start(&[module(
        module_path(),
        &["max-lease", "9000", "grace", "auto", "sync-replicas", "1"],
    )]);
    assert!(ok.runs(), "{}", ok.log());
}

/// `warden.grace auto` with short leases: a window is `max-lease` (1 s) +
/// `min-replicas-max-lag` (1 s) + 1 s.
const AUTO: [&str; 8] = [
    "--warden.max-lease",
    "1000",
    "--warden.grace",
    "auto",
    "--warden.sync-replicas",
    "1",
    "--min-replicas-max-lag",
    "1",
];

/// A server with `grace auto`, `sync-replicas` `n` and `extra` arguments.
/// One that stays a master waits out its start-up window
/// ([`auto_master`]); one that becomes a replica drops its window at once.
fn auto_server(n: &str, extra: &[&str]) -> Server {
    let mut args: Vec<&str> = AUTO.to_vec();
    args[5] = n;
    args.extend_from_slice(extra);
    Server::start_tcp(&args)
}

/// A master that grants at once: `grace` 0 (its markers do not depend on
/// its own grace).
fn auto_master(n: &str, extra: &[&str]) -> Server {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--warden.grace", "0"]);
    auto_server(n, &args)
}

/// A server with `grace auto` that stays a master, once its start-up window passed.
fn auto_restartable(extra: &[&str]) -> Server {
    let s = auto_server("0", extra);
    wait_for("the start-up window", Duration::from_secs(30), || {
        warden_stat(&mut s.conn(), "grace_remaining_ms") == 0
    });
    s
}

fn grace_left(c: &mut Connection) -> i64 {
    warden_stat(c, "grace_remaining_ms")
}

/// A grant on `master`, acknowledged by its replicas.
fn grant_on(master: &Server, key: &str) {
    let mut m = master.conn();
    run(&mut m, &["SET", "streaming", key]).unwrap();
    let n = info_int(&mut m, "replication", "connected_slaves");
    sync_replicas(&mut m, n);
    let fence = int(&mut m, &["LOCK.ACQUIRE", key, "a", "1000"]);
    assert!(fence > 0, "granted");
}

#[test]
fn grace_auto_opens_no_window_on_a_promotion_that_lost_nothing() {
    let master = auto_master("1", &[]);
    let replica = auto_server("1", &[]);
    replicate(&master, &replica);
    grant_on(&master, "k");
    let mut r = replica.conn();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert_eq!(grace_left(&mut r), 0, "{}", replica.log());
    assert!(replica.log().contains("grace auto: no window"));
    // The grant it acknowledged is here: still held.
    assert_eq!(field_str(&map(&mut r, &["LOCK.INFO", "k"]), "owner"), "a");
}

#[test]
fn grace_auto_keeps_the_window_where_a_grant_may_have_been_lost() {
    // One replica acknowledges for both: the other may miss a grant.
    let master = auto_master("1", &[]);
    let (a, b) = (auto_server("1", &[]), auto_server("1", &[]));
    replicate(&master, &a);
    replicate(&master, &b);
    grant_on(&master, "k");
    for replica in [&a, &b] {
        let mut r = replica.conn();
        run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
        assert!(grace_left(&mut r) > 0, "N = 1 of 2 replicas: a window");
    }

    // Grants not waiting for replicas at all (sync-replicas 0).
    let master = auto_master("0", &[]);
    let replica = auto_server("0", &[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    assert!(int(&mut m, &["LOCK.ACQUIRE", "k", "a", "1000"]) > 0);
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert!(grace_left(&mut r) > 0, "sync-replicas 0: a window");

    // A replica of a replica never acknowledged anything itself.
    let master = auto_master("1", &[]);
    let (mid, leaf) = (auto_server("1", &[]), auto_server("1", &[]));
    replicate(&master, &mid);
    replicate(&mid, &leaf);
    grant_on(&master, "k");
    let mut l = leaf.conn();
    wait_for("the leaf has the grant", Duration::from_secs(20), || {
        maybe_map(&mut l, &["LOCK.INFO", "k"]).is_some()
    });
    run(&mut l, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert!(grace_left(&mut l) > 0, "a chained replica: a window");
}

#[test]
fn a_new_replica_cannot_end_the_guarantee_behind_a_members_back() {
    // {a} acknowledges everything; b joins while a is stopped: with N = 1
    // of {a, b}, grants would no longer reach a, so none is answered until
    // a has the marker saying so.
    let master = auto_master("1", &[]);
    let (a, b) = (auto_server("1", &[]), auto_server("1", &[]));
    replicate(&master, &a);
    grant_on(&master, "k1");
    let mut m = master.conn();
    run(&mut m, &["CONFIG", "SET", "warden.sync-timeout", "300"]).unwrap();
    a.signal("STOP");
    replicate(&master, &b);
    run(&mut m, &["SET", "streaming", "b"]).unwrap();
    wait_for("b streams", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut m).unwrap();
        info.lines()
            .any(|l| l.contains(&format!("port={}", b.port.unwrap())) && !l.contains("offset=0,"))
    });
    assert!(
        is_nil(&mut m, &["LOCK.ACQUIRE", "k2", "a", "1000"]),
        "b alone must not acknowledge a grant a never heard of"
    );
    a.signal("CONT");
    wait_for("a has the marker", Duration::from_secs(20), || {
        matches!(
            run(&mut m, &["LOCK.ACQUIRE", "k3", "a", "1000"]),
            Ok(Value::Int(_))
        )
    });
    // And a promoted a knows it may have missed grants now.
    let mut ra = a.conn();
    run(&mut ra, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert!(grace_left(&mut ra) > 0);
}

#[test]
fn grace_auto_restarts_without_a_window_only_from_an_always_fsynced_aof() {
    // (appendfsync, rewrite the AOF before the crash, a window after it)
    let cases = [
        ("always", false, false),
        ("always", true, false),
        ("everysec", false, true),
    ];
    for (fsync, rewrite, window) in cases {
        let mut s = auto_restartable(&["--appendonly", "yes", "--appendfsync", fsync]);
        let mut c = s.conn();
        assert!(int(&mut c, &["LOCK.ACQUIRE", "k", "a", "1000"]) > 0);
        if rewrite {
            rewrite_aof(&mut c);
        }
        s.restart(false);
        let mut c = s.conn();
        assert_eq!(
            grace_left(&mut c) > 0,
            window,
            "appendfsync {fsync}, rewrite {rewrite}:\n{}",
            s.log()
        );
    }
}

#[test]
fn a_promotion_window_ends_once_a_resync_shows_nothing_was_lost() {
    // (how the others follow the promoted replica): every other
    // acknowledging replica, or the old master itself (a FAILOVER).
    for way in ["the other replica follows", "FAILOVER"] {
        let master = auto_master("1", &[]);
        let (a, b) = (auto_server("1", &[]), auto_server("1", &[]));
        replicate(&master, &a);
        replicate(&master, &b);
        grant_on(&master, "k");
        let mut ra = a.conn();
        if way == "FAILOVER" {
            let port = a.port.unwrap().to_string();
            let mut m = master.conn();
            run(&mut m, &["FAILOVER", "TO", "127.0.0.1", &port]).unwrap();
            wait_for("a promoted", Duration::from_secs(20), || is_master(&a));
        } else {
            run(&mut ra, &["REPLICAOF", "NO", "ONE"]).unwrap();
            assert!(grace_left(&mut ra) > 0, "{way}: a window at first");
            replicate(&a, &b);
        }
        wait_for("the window ends", Duration::from_secs(20), || {
            grace_left(&mut ra) == 0
        });
        assert!(
            a.log().contains("without a full sync"),
            "{way}: {}",
            a.log()
        );
    }
}

#[test]
fn grace_auto_keeps_the_window_where_config_is_renamed() {
    let hidden = ["--rename-command", "CONFIG", ""];
    let master = auto_master("1", &hidden);
    let replica = auto_server("1", &hidden);
    replicate(&master, &replica);
    grant_on(&master, "k");
    let mut r = replica.conn();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert!(
        grace_left(&mut r) > 0,
        "without CONFIG it cannot name itself: a window"
    );
}

#[test]
fn a_requests_own_wait_bounds_its_wait_for_the_replica_when_the_key_was_free() {
    // Free keys, granted at once: the request's WAIT (300 ms) ends the wait
    // for the acknowledgement long before sync-timeout (60 s) would.
    let cases: [(&str, Vec<&str>); 4] = [
        (
            "LOCK.INFO",
            vec!["LOCK.ACQUIRE", "k", "a", "60000", "WAIT", "300"],
        ),
        (
            "RWLOCK.INFO",
            vec!["RWLOCK.READ", "k", "a", "60000", "WAIT", "300"],
        ),
        (
            "RWLOCK.INFO",
            vec!["RWLOCK.WRITE", "k", "a", "60000", "WAIT", "300"],
        ),
        (
            "SEM.INFO",
            vec![
                "SEM.ACQUIRE",
                "k",
                "a",
                "60000",
                "LIMIT",
                "2",
                "WAIT",
                "300",
            ],
        ),
    ];
    for (info, command) in cases {
        let (master, replica) = pair(60_000);
        let mut m = master.conn();
        replica.signal("STOP");
        let mut c = master.conn();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reply = run(&mut c, &command);
        assert!(
            matches!(reply, Ok(Value::Nil)),
            "{command:?}: nil at its WAIT deadline, not at sync-timeout: {reply:?}"
        );
        assert_eq!(shown(&mut m, info), "nil", "{command:?}: taken back");
        assert_eq!(warden_stat(&mut m, "sync_timeouts"), 1, "{command:?}");
        replica.signal("CONT");
    }
}

#[test]
fn lowering_sync_replicas_to_zero_answers_no_grant_a_promised_replica_may_lack() {
    // The replica holds a marker saying every grant reaches it. It leaves
    // (here: it follows a master that is not there); N drops to 0; a grant
    // answered now would be missing there, and `grace auto` would open no
    // window on its promotion.
    let master = auto_master("1", &[]);
    let replica = auto_server("1", &[]);
    replicate(&master, &replica);
    grant_on(&master, "k1");
    let mut m = master.conn();
    run(&mut m, &["CONFIG", "SET", "warden.sync-timeout", "300"]).unwrap();
    run(&mut m, &["CONFIG", "SET", "warden.sync-replicas", "0"]).unwrap();
    let mut r = replica.conn();
    let nowhere = free_port().to_string();
    run(&mut r, &["REPLICAOF", "127.0.0.1", &nowhere]).unwrap();
    wait_for("the replica gone", Duration::from_secs(20), || {
        info_int(&mut m, "replication", "connected_slaves") == 0
    });
    let grant = run(&mut m, &["LOCK.ACQUIRE", "k2", "a", "1000"]).unwrap();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    if matches!(grant, Value::Int(_)) {
        assert!(
            grace_left(&mut r) > 0 || maybe_map(&mut r, &["LOCK.INFO", "k2"]).is_some(),
            "a grant answered under sync-replicas 0 is missing, and no window opened:\n{}",
            replica.log()
        );
    }
    assert_eq!(
        grant,
        Value::Nil,
        "busy until the replica has the withdrawal"
    );

    // Once every replica it named has the withdrawal, grants go at once.
    let master = auto_master("1", &[]);
    let replica = auto_server("1", &[]);
    replicate(&master, &replica);
    grant_on(&master, "k1");
    let mut m = master.conn();
    run(&mut m, &["CONFIG", "SET", "warden.sync-replicas", "0"]).unwrap();
    assert!(int(&mut m, &["LOCK.ACQUIRE", "k2", "a", "1000"]) > 0);
    replica.signal("STOP");
    assert!(int(&mut m, &["LOCK.ACQUIRE", "k3", "a", "1000"]) > 0);
    assert!(int(&mut m, &["LOCK.ACQUIRE", "k4", "a", "1000"]) > 0);
    replica.signal("CONT");
}

/// The local address of `replica`'s link to its master: the address its
/// master's `CLIENT LIST` shows for it.
fn link_address(replica: &Server) -> String {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("master")
        .query(&mut replica.conn())
        .unwrap();
    list.split_whitespace()
        .find_map(|f| f.strip_prefix("laddr="))
        .expect("a link to the master")
        .to_string()
}

/// Stops `replica` and cuts its link on `master`: what the master writes
/// next never reaches it (the bytes are not left waiting in its socket).
fn stop_and_cut(master: &Server, replica: &Server) {
    let addr = link_address(replica);
    replica.signal("STOP");
    let killed = int(&mut master.conn(), &["CLIENT", "KILL", "ADDR", &addr]);
    assert_eq!(killed, 1, "the replica's link");
}

/// Writes past the master's backlog (16 kB in these tests): a replica that
/// was away must sync in full.
fn overflow_backlog(m: &mut redis::Connection) {
    let value = "x".repeat(64 << 10);
    for i in 0..8 {
        run(m, &["SET", &format!("filler{i}"), &value]).unwrap();
    }
}

/// Whether `replica`'s link is up and it loaded nothing in a while.
fn link_up(replica: &Server) -> bool {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut replica.conn())
        .unwrap();
    info.contains("master_link_status:up")
}

/// A connection to `replica` opened while it runs: a command written on it
/// while the replica is stopped is read as soon as it runs again, before
/// any timer (its cron would reconnect it to its master).
fn stopped_promotion(replica: &Server) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    let mut sock = std::os::unix::net::UnixStream::connect(replica.socket()).unwrap();
    sock.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = [0u8; 7];
    sock.read_exact(&mut reply).unwrap();
    sock
}

/// Sends `REPLICAOF NO ONE` on `sock` to the stopped `replica`, lets it run
/// and waits for the answer.
fn promote_stopped(replica: &Server, mut sock: std::os::unix::net::UnixStream) {
    use std::io::{Read, Write};
    sock.write_all(b"*3\r\n$9\r\nREPLICAOF\r\n$2\r\nNO\r\n$3\r\nONE\r\n")
        .unwrap();
    replica.signal("CONT");
    let mut reply = [0u8; 5];
    sock.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
}

#[test]
fn a_replica_back_through_a_full_sync_holds_no_marker_from_before_it() {
    // r holds a marker naming it alone (N = 1 of {r}); s joins while r is
    // away (N = 1 of {r, s}: grants may now reach s alone); r comes back
    // through a full sync, whose RDB holds no marker. A grant s alone
    // acknowledged is answered, and r is promoted without it: r must open a
    // window, or the lock has two holders. (the master's grace — a rollout
    // that reached the replicas first —, writes paused while the sync's
    // fork ends)
    let backlog = ["--repl-backlog-size", "16384"];
    let mut two_holders = Vec::new();
    for (grace, paused) in [("0", false), ("0", true), ("auto", false), ("auto", true)] {
        let case = format!("master on grace {grace}, paused {paused}");
        let master = if grace == "auto" {
            let m = auto_server("1", &backlog);
            wait_for("the start-up window", Duration::from_secs(30), || {
                grace_left(&mut m.conn()) == 0
            });
            m
        } else {
            auto_master("1", &backlog)
        };
        let (r, s) = (auto_server("1", &[]), auto_server("1", &[]));
        replicate(&master, &r);
        grant_on(&master, "k1");
        let mut m = master.conn();
        run(&mut m, &["CONFIG", "SET", "warden.sync-timeout", "200"]).unwrap();
        stop_and_cut(&master, &r);
        replicate(&master, &s);
        // The roster grows to {r, s}; nothing is granted until r has that.
        assert!(
            is_nil(&mut m, &["LOCK.ACQUIRE", "k2", "a", "1000"]),
            "{case}"
        );
        let cut_at = info_int(&mut m, "replication", "master_repl_offset");
        overflow_backlog(&mut m);
        // Redis 7 trims a shared backlog a little at a time: r's offset must
        // be gone from it, or r resyncs in part.
        wait_for("the backlog past r", Duration::from_secs(20), || {
            info_int(&mut m, "replication", "repl_backlog_first_byte_offset") > cut_at + 1
        });
        let full_syncs = info_int(&mut m, "stats", "sync_full");
        if paused {
            run(&mut m, &["CLIENT", "PAUSE", "20000", "WRITE"]).unwrap();
        }
        r.signal("CONT");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !(info_int(&mut m, "stats", "sync_full") > full_syncs && link_up(&r)) {
            assert!(
                std::time::Instant::now() < deadline,
                "r synced in full ({case}):\n{}\n---\n{}",
                master.log(),
                r.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_for("the sync's fork ended", Duration::from_secs(20), || {
            info_int(&mut m, "persistence", "rdb_bgsave_in_progress") == 0
        });
        if paused {
            run(&mut m, &["CLIENT", "UNPAUSE"]).unwrap();
        }
        // Both acknowledge a grant (r's full sync reached the marker's offset).
        grant_on(&master, "k2");
        // r away again; s alone acknowledges a grant.
        let promotion = stopped_promotion(&r);
        stop_and_cut(&master, &r);
        grant_on(&master, "k3");
        promote_stopped(&r, promotion);
        let mut rc = r.conn();
        assert!(
            maybe_map(&mut rc, &["LOCK.INFO", "k3"]).is_none(),
            "{case}: r was promoted without the grant s alone acknowledged"
        );
        // The window alone decides: r, a master with no replica now, does
        // not wait for acknowledgements.
        run(&mut rc, &["CONFIG", "SET", "warden.sync-replicas", "0"]).unwrap();
        let second = run(&mut rc, &["LOCK.ACQUIRE", "k3", "b", "1000"]);
        if matches!(second, Ok(Value::Int(_))) {
            two_holders.push(case);
        }
    }
    assert!(
        two_holders.is_empty(),
        "a holds k3 on the old master and b was granted it on r: {two_holders:?}"
    );
}

#[test]
fn replicas_announcing_one_address_get_no_promotion_without_a_window() {
    // Two replicas announce the same address (a copied
    // replica-announce-port): one member to the roster, two acknowledgements
    // to the master. Neither may be promoted without a window.
    let master = auto_master("1", &[]);
    let a = auto_server("1", &[]);
    let port = a.port.unwrap().to_string();
    let b = auto_server("1", &["--replica-announce-port", &port]);
    replicate(&master, &a);
    replicate(&master, &b);
    grant_on(&master, "k");
    for replica in [&a, &b] {
        let mut r = replica.conn();
        run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
        assert!(grace_left(&mut r) > 0, "{}", replica.log());
    }
    assert!(
        master
            .log()
            .contains("two replicas announce the same address"),
        "the operator is told why: {}",
        master.log()
    );
}

#[test]
fn a_durability_change_while_writes_are_paused_is_marked_before_the_next_grant() {
    // CONFIG SET appendfsync while writes are paused: the AOF's last marker
    // must stop saying `always` before any grant made after it.
    let s = auto_restartable(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = s.conn();
    assert!(int(&mut c, &["LOCK.ACQUIRE", "k0", "a", "1000"]) > 0);
    run(&mut c, &["CLIENT", "PAUSE", "20000", "WRITE"]).unwrap();
    run(&mut c, &["CONFIG", "SET", "appendfsync", "no"]).unwrap();
    run(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
    assert!(int(&mut c, &["LOCK.ACQUIRE", "k1", "a", "1000"]) > 0);
    let aof = aof_text(&s);
    let last_marker = aof.rfind("WARDEN.SYNCSTATE").expect("a marker");
    let grant = aof.rfind("k1").expect("the grant");
    assert!(last_marker < grant, "the marker goes before the grant");
    let fields: Vec<&str> = aof[last_marker..]
        .split("\r\n")
        .filter(|l| !l.starts_with('$') && !l.starts_with('*'))
        .take(3)
        .collect();
    assert_eq!(fields[..3], ["WARDEN.SYNCSTATE", "0", "0"], "{fields:?}");
}

/// Every AOF file of `s` (a multi-part AOF's base and increments), as text.
fn aof_text(s: &Server) -> String {
    let mut files: Vec<_> = walk(s.dir.path());
    files.sort();
    files
        .iter()
        .filter(|p| {
            p.to_string_lossy().contains(".aof") && !p.to_string_lossy().ends_with(".manifest")
        })
        .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned())
        .collect()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
