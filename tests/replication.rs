//! A master with a replica: replicas receive effects, never decide.

mod common;

use common::*;
use redis::Connection;

fn abs_expiry(con: &mut Connection, key: &str) -> i64 {
    int(con, &["PEXPIRETIME", key])
}

#[test]
fn replica_has_the_same_owner_holds_fence_and_absolute_expiry() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();

    let fence = int(&mut m, &["LOCK.ACQUIRE", "k", "alice", "60000"]);
    int(&mut m, &["LOCK.ACQUIRE", "k", "alice", "50000"]);
    int(&mut m, &["LOCK.ACQUIRE", "gone", "bob", "60000"]);
    int(&mut m, &["LOCK.RELEASE", "gone", "bob"]);
    int(&mut m, &["LOCK.ACQUIRE", "short", "carol", "60000"]);
    int(&mut m, &["LOCK.EXTEND", "short", "carol", "70000"]);
    sync_replicas(&mut m, 1);

    assert_eq!(lock_state(&mut r, "k"), Some(("alice".into(), 2, fence)));
    assert_eq!(abs_expiry(&mut r, "k"), abs_expiry(&mut m, "k"));
    assert_eq!(abs_expiry(&mut r, "short"), abs_expiry(&mut m, "short"));
    assert_eq!(int(&mut r, &["EXISTS", "gone"]), 0);

    int(&mut m, &["LOCK.RELEASE", "k", "alice"]);
    sync_replicas(&mut m, 1);
    assert_eq!(lock_state(&mut r, "k"), Some(("alice".into(), 1, fence)));
}

#[test]
fn writes_on_a_replica_answer_readonly() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "alice", "60000"]);
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    for words in [
        &["LOCK.ACQUIRE", "x", "a", "100"][..],
        &["LOCK.RELEASE", "k", "alice"],
        &["LOCK.EXTEND", "k", "alice", "100"],
    ] {
        assert!(err(&mut r, words).starts_with("READONLY"), "{words:?}");
    }
    assert_eq!(lock_state(&mut r, "k").unwrap().1, 1);
}

#[test]
fn a_promoted_replica_issues_higher_fences() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut last = 0;
    for i in 0..20 {
        last = int(&mut m, &["LOCK.ACQUIRE", &format!("k{i}"), "a", "60000"]);
    }
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    let next = int(&mut r, &["LOCK.ACQUIRE", "fresh", "b", "1000"]);
    assert!(next > last, "{next} <= {last}");
    assert_eq!(lock_state(&mut r, "k3").unwrap().0, "a");
}

#[test]
fn lease_end_on_the_master_deletes_on_the_replica() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "alice", "50"]);
    wait_for(
        "expiry on master",
        std::time::Duration::from_secs(5),
        || int(&mut m, &["EXISTS", "k"]) == 0,
    );
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    assert_eq!(int(&mut r, &["EXISTS", "k"]), 0);
    let keys: i64 = redis::cmd("DBSIZE").query(&mut r).unwrap();
    assert_eq!(keys, 0);
}

fn same_lock(a: &mut Connection, b: &mut Connection, key: &str) {
    assert_eq!(lock_state(a, key), lock_state(b, key), "{key}");
    assert_eq!(abs_expiry(a, key), abs_expiry(b, key), "{key}");
}

#[test]
fn effects_reach_a_replica_that_attaches_later() {
    // No AOF, no snapshots, no replica yet: nobody listens to effects...
    let master = Server::start_tcp(&[]);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "before", "alice", "60000"]);
    int(&mut m, &["LOCK.ACQUIRE", "released", "bob", "60000"]);
    int(&mut m, &["LOCK.RELEASE", "released", "bob"]);
    run(&mut m, &["RWLOCK.READ", "rw", "r1", "60000"]).unwrap();
    run(&mut m, &["BF.ADD", "bf", "x"]).unwrap();
    // ...until a replica syncs: from then on every effect is sent.
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    int(&mut m, &["LOCK.ACQUIRE", "after", "carol", "60000"]);
    int(&mut m, &["LOCK.ACQUIRE", "before", "alice", "70000"]);
    run(&mut m, &["RWLOCK.READ", "rw", "r2", "60000"]).unwrap();
    run(&mut m, &["BF.ADD", "bf", "y"]).unwrap();
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    for key in ["before", "after", "released"] {
        same_lock(&mut m, &mut r, key);
    }
    let without_ttl = |c: &mut Connection| {
        let mut f = map(c, &["RWLOCK.INFO", "rw"]);
        f.retain(|(k, _)| k != "ttl");
        (f, int(c, &["PEXPIRETIME", "rw"]))
    };
    assert_eq!(without_ttl(&mut r), without_ttl(&mut m));
    assert_eq!(int(&mut r, &["BF.CARD", "bf"]), 2);
}

#[test]
fn a_promoted_replica_keeps_sending_effects_to_its_own_replicas() {
    let master = Server::start_tcp(&[]);
    let first = Server::start_tcp(&[]);
    let second = Server::start_tcp(&[]);
    replicate(&master, &first);
    replicate(&master, &second);
    let mut m = master.conn();
    int(&mut m, &["LOCK.ACQUIRE", "k", "alice", "60000"]);
    sync_replicas(&mut m, 2);
    let mut f = first.conn();
    run(&mut f, &["REPLICAOF", "NO", "ONE"]).unwrap();
    replicate(&first, &second);
    let fence = int(&mut f, &["LOCK.ACQUIRE", "new", "bob", "60000"]);
    int(&mut f, &["LOCK.RELEASE", "k", "alice"]);
    sync_replicas(&mut f, 1);
    let mut s = second.conn();
    assert_eq!(lock_state(&mut s, "new"), Some(("bob".into(), 1, fence)));
    assert_eq!(int(&mut s, &["EXISTS", "k"]), 0);
}

fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

/// Once the short leases of `key` lapse (`info`'s `field` is 1), runs
/// `probe` on the master ("k" stands for the key; none: the master serves
/// its waiter when each lease ends) and checks that the replica keeps what
/// the master keeps.
fn replica_drops_what_the_master_drops(
    (m, r): (&mut Connection, &mut Connection),
    key: &str,
    what: &str,
    probe: &[&str],
    (info, field): (&str, &str),
) {
    sync_replicas(m, 1);
    let full = dump(m, key).len();
    assert_eq!(dump(r, key).len(), full, "{what}");
    wait_for(
        "the short leases to end",
        std::time::Duration::from_secs(20),
        || field_int(&map(m, &[info, key]), field) == 1,
    );
    let words: Vec<&str> = probe
        .iter()
        .map(|w| if *w == "k" { key } else { *w })
        .collect();
    if words.is_empty() {
        wait_for(
            "the master to drop them",
            std::time::Duration::from_secs(20),
            || dump(m, key).len() < full / 4,
        );
    } else {
        let _ = run(m, &words);
    }
    sync_replicas(m, 1);
    let on_master = dump(m, key);
    assert!(
        on_master.len() < full / 4,
        "{what}: the master keeps {} of {full} bytes",
        on_master.len()
    );
    let on_replica = dump(r, key);
    assert!(
        on_replica == on_master,
        "{what}: the replica keeps what the master dropped ({} bytes against {})",
        on_replica.len(),
        on_master.len()
    );
}

/// Readers whose leases lapsed leave the replica when the master drops
/// them, also where the master's command changes nothing else (a busy
/// writer, a refused upgrade, a release or extend by no holder, a waiting
/// writer served when leases end): the key is the same on both.
#[test]
fn a_replica_drops_the_lapsed_readers_the_master_drops() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    let probes: &[(&str, &[&str])] = &[
        ("a busy writer", &["RWLOCK.WRITE", "k", "w", "1000"]),
        ("a refused upgrade", &["RWLOCK.WRITE", "k", "long", "1000"]),
        ("a release by no holder", &["RWLOCK.UNLOCK", "k", "nobody"]),
        (
            "an extend by no holder",
            &["RWLOCK.EXTEND", "k", "nobody", "1000"],
        ),
        ("a waiting writer", &[]),
    ];
    for (i, (what, probe)) in probes.iter().enumerate() {
        let key = format!("rw{i}");
        for n in 0..40 {
            let owner = format!("reader-{n:03}-with-a-longer-name");
            run(&mut m, &["RWLOCK.READ", &key, &owner, "200"]).unwrap();
        }
        run(&mut m, &["RWLOCK.READ", &key, "long", "60000"]).unwrap();
        let waiting = probe.is_empty().then(|| {
            let pending = spawn_command(
                &master,
                &["RWLOCK.WRITE", &key, "w", "1000", "WAIT", "3000"],
            );
            wait_queued(&mut m, "RWLOCK.INFO", &key, 1);
            pending
        });
        replica_drops_what_the_master_drops(
            (&mut m, &mut r),
            &key,
            what,
            probe,
            ("RWLOCK.INFO", "readers"),
        );
        if let Some((_, pending)) = waiting {
            run(&mut m, &["RWLOCK.UNLOCK", &key, "long"]).unwrap();
            granted(pending);
        }
    }
}

/// Semaphore holds whose leases lapsed leave the replica when the master
/// drops them, also where the master's command changes nothing else (an
/// acquire refused or busy, a release or extend by no holder, a waiter
/// served when leases end with nothing granted): the key is the same on both.
#[test]
fn a_replica_drops_the_lapsed_semaphore_holds_the_master_drops() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    // 40 short holds of 1 permit and a long one of 10 fill the limit of 50;
    // once the short ones lapse, 41 permits still do not fit.
    let probes: &[(&str, &[&str])] = &[
        (
            "a busy acquire",
            &[
                "SEM.ACQUIRE",
                "k",
                "new",
                "1000",
                "LIMIT",
                "50",
                "PERMITS",
                "41",
            ],
        ),
        (
            "a second hold",
            &["SEM.ACQUIRE", "k", "long", "1000", "LIMIT", "50"],
        ),
        (
            "another limit",
            &["SEM.ACQUIRE", "k", "new", "1000", "LIMIT", "7"],
        ),
        ("a release by no holder", &["SEM.RELEASE", "k", "nobody"]),
        (
            "an extend by no holder",
            &["SEM.EXTEND", "k", "nobody", "1000"],
        ),
        ("a new limit", &["SEM.SETLIMIT", "k", "60"]),
        ("a waiter that does not fit", &[]),
    ];
    for (i, (what, probe)) in probes.iter().enumerate() {
        let key = format!("sem{i}");
        for n in 0..40 {
            let owner = format!("holder-{n:03}-with-a-longer-name");
            run(&mut m, &["SEM.ACQUIRE", &key, &owner, "200", "LIMIT", "50"]).unwrap();
        }
        let long = [
            "SEM.ACQUIRE",
            &key,
            "long",
            "60000",
            "LIMIT",
            "50",
            "PERMITS",
            "10",
        ];
        run(&mut m, &long).unwrap();
        let waiting = probe.is_empty().then(|| {
            let pending = spawn_command(
                &master,
                &[
                    "SEM.ACQUIRE",
                    &key,
                    "w",
                    "1000",
                    "LIMIT",
                    "50",
                    "PERMITS",
                    "41",
                    "WAIT",
                    "20000",
                ],
            );
            wait_queued(&mut m, "SEM.INFO", &key, 1);
            pending
        });
        replica_drops_what_the_master_drops(
            (&mut m, &mut r),
            &key,
            what,
            probe,
            ("SEM.INFO", "holders"),
        );
        if let Some((_, pending)) = waiting {
            run(&mut m, &["SEM.RELEASE", &key, "long"]).unwrap();
            granted(pending);
        }
    }
}
