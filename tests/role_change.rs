//! A grant that a kill kept from its client is taken back before the role
//! can change: the new master never keeps it (SPEC locks rule 6).

mod common;

use std::time::Duration;

use common::*;
use redis::Value;

/// `A` holds `k`, `B` and `C` wait; one write from `A` releases, kills `B`
/// (whose grant is then on its way) and starts a `FAILOVER`. On the promoted
/// replica, `k` is free or held by a client that was told so — never by `B`.
fn displaced_grant_does_not_survive_a_failover(acquire: &str, info: &str, release: &str) {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut a = master.tcp();
    assert!(matches!(
        run(&mut a, &[acquire, "k", "A", "20000"]).unwrap(),
        Value::Int(_)
    ));
    let (b_id, b) = spawn_command(&master, &[acquire, "k", "B", "20000", "WAIT", "0"]);
    wait_queued(&mut a, info, "k", 1);
    let (_, c) = spawn_command(&master, &[acquire, "k", "C", "20000", "WAIT", "0"]);
    wait_queued(&mut a, info, "k", 2);
    let mut pipe = redis::pipe();
    pipe.cmd(release).arg("k").arg("A");
    pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(b_id);
    pipe.cmd("FAILOVER");
    let replies: Vec<Value> = pipe.query(&mut a).unwrap();
    assert_eq!(replies.len(), 3);
    assert!(b.join().unwrap().is_err(), "B was killed");
    let c_reply = c.join().unwrap();
    let mut r = replica.tcp();
    wait_for(
        "the replica to be promoted",
        Duration::from_secs(30),
        || {
            let role: String = redis::cmd("INFO").arg("replication").query(&mut r).unwrap();
            role.contains("role:master")
        },
    );
    let owner = maybe_map(&mut r, &[info, "k"]).map(|f| {
        let field = if info == "LOCK.INFO" {
            "owner"
        } else {
            "writer"
        };
        (field_str(&f, field), field_int(&f, "fence"))
    });
    match owner {
        None => println!("{acquire}: free on the new master; C got {c_reply:?}"),
        Some((who, fence)) => {
            assert_ne!(who, "B", "{acquire}: the killed client's grant survived");
            assert_eq!(who, "C", "{acquire}");
            assert!(
                matches!(c_reply, Ok(Value::Int(f)) if f == fence),
                "{acquire}: C holds the key, so C was told: {c_reply:?}"
            );
            println!("{acquire}: C holds the key on the new master with the token it was given");
        }
    }
}

#[test]
fn a_displaced_lock_grant_does_not_survive_a_failover() {
    displaced_grant_does_not_survive_a_failover("LOCK.ACQUIRE", "LOCK.INFO", "LOCK.RELEASE");
}

#[test]
fn a_displaced_rwlock_grant_does_not_survive_a_failover() {
    displaced_grant_does_not_survive_a_failover("RWLOCK.WRITE", "RWLOCK.INFO", "RWLOCK.UNLOCK");
}
