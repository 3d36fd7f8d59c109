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
