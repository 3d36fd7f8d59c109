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

/// One kind's commands: acquire (with its trailing arguments), release, info.
struct Kind {
    acquire: &'static [&'static str],
    release: &'static str,
    info: &'static str,
}

const KINDS: &[(&str, Kind)] = &[
    (
        "lock",
        Kind {
            acquire: &["LOCK.ACQUIRE"],
            release: "LOCK.RELEASE",
            info: "LOCK.INFO",
        },
    ),
    (
        "semaphore",
        Kind {
            acquire: &["SEM.ACQUIRE"],
            release: "SEM.RELEASE",
            info: "SEM.INFO",
        },
    ),
    (
        "rwlock",
        Kind {
            acquire: &["RWLOCK.WRITE"],
            release: "RWLOCK.UNLOCK",
            info: "RWLOCK.INFO",
        },
    ),
];

fn acquire_words<'a>(kind: &'a Kind, owner: &'a str, wait: bool) -> Vec<&'a str> {
    let mut w = vec![kind.acquire[0], "k", owner, "60000"];
    if kind.acquire[0] == "SEM.ACQUIRE" {
        w.extend(["LIMIT", "1"]);
    }
    if wait {
        w.extend(["WAIT", "0"]);
    }
    w
}

fn resp(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend(format!("${}\r\n{w}\r\n", w.len()).into_bytes());
    }
    out
}

fn offset(c: &mut redis::Connection, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("replication").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .map_or(0, |v| v.trim().parse().unwrap_or(0))
}

/// `A` holds `k`, `B` waits; one packet releases `k` (the grant to `B` is
/// then on its way) and sends `REPLICAOF <replica>`, which cuts it off. The
/// replica, promoted, must not keep `B`'s hold: `B` was only told
/// `-UNBLOCKED`, and a new client is granted `k` at once, with a higher token.
#[test]
fn a_grant_cut_off_by_replicaof_is_taken_back_on_the_next_master() {
    for (name, kind) in KINDS {
        cut_off_by_follow(name, kind, &[], "REPLICAOF");
    }
}

/// The same under `rename-command`: the take-back follows the command the
/// server runs, whatever name it is sent by; a disabled `REPLICAOF` leaves
/// `SLAVEOF` to watch.
#[test]
fn a_grant_cut_off_by_a_renamed_replicaof_is_taken_back_on_the_next_master() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--rename-command", "REPLICAOF", "follow-master"],
            "Follow-Master",
        ),
        (&["--rename-command", "SLAVEOF", "tail"], "tail"),
        (&["--rename-command", "REPLICAOF", ""], "SLAVEOF"),
        (
            &[
                "--rename-command",
                "SLAVEOF",
                "old-follow",
                "--rename-command",
                "REPLICAOF",
                "slaveof",
            ],
            "slaveof",
        ),
    ];
    let (name, kind) = &KINDS[0];
    for (config, follow) in cases {
        println!("{config:?}: {follow}");
        cut_off_by_follow(name, kind, config, follow);
    }
}

/// `A` holds `k`, `B` waits on a master started with `config`; `follow host
/// port` cuts the grant to `B` off (see above).
fn cut_off_by_follow(name: &str, kind: &Kind, config: &[&str], follow: &str) {
    use std::io::{Read, Write};
    {
        let master = Server::start_tcp(config);
        let replica = Server::start_tcp(&[]);
        replicate(&master, &replica);
        let mut a = master.tcp();
        let first = match run(&mut a, &acquire_words(kind, "A", false)).unwrap() {
            Value::Int(t) => t,
            other => panic!("{name}: A was not granted: {other:?}"),
        };
        let port = master.port.unwrap();
        let mut b = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        b.write_all(&resp(&acquire_words(kind, "B", true))).unwrap();
        wait_queued(&mut a, kind.info, "k", 1);
        let mut admin = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        admin
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let replica_port = replica.port.unwrap().to_string();
        let mut packet = resp(&[kind.release, "k", "A"]);
        packet.extend(resp(&[follow, "127.0.0.1", &replica_port]));
        admin.write_all(&packet).unwrap();
        let mut admin_read = Vec::new();
        while !admin_read.ends_with(b"+OK\r\n") {
            let mut buf = [0u8; 256];
            let n = admin.read(&mut buf).unwrap();
            assert!(n > 0, "{name}: the admin connection closed");
            admin_read.extend(&buf[..n]);
        }
        assert_eq!(admin_read, b":1\r\n+OK\r\n", "{name}");
        // B's connection is closed after its one reply.
        let mut b_read = Vec::new();
        b.read_to_end(&mut b_read).unwrap();
        let b_read = String::from_utf8_lossy(&b_read).to_string();
        assert!(
            b_read.starts_with("-UNBLOCKED") && b_read.matches("\r\n").count() == 1,
            "{name}: B must read exactly one reply, -UNBLOCKED: {b_read:?}"
        );
        // The replica applies everything its master sent as a master.
        let sent = offset(&mut master.tcp(), "master_repl_offset:");
        let mut r = replica.tcp();
        // (7.0 may count its offset differently once the two follow each
        // other: then it is given a few seconds.)
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while offset(&mut r, "master_repl_offset:") < sent && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        run(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
        let held = maybe_map(&mut r, &[kind.info, "k"]);
        match held {
            None => {}
            Some(f) if kind.info == "SEM.INFO" => {
                assert_eq!(
                    field_int(&f, "used"),
                    0,
                    "{name}: B's permit survived: {f:?}"
                )
            }
            Some(f) => panic!("{name}: the cut-off grant survived on the new master: {f:?}"),
        }
        let next = match run(&mut r, &acquire_words(kind, "Z", false)).unwrap() {
            Value::Int(t) => t,
            other => panic!("{name}: the new master refused a free key: {other:?}"),
        };
        assert!(
            next > first,
            "{name}: tokens keep rising ({first} then {next})"
        );
        println!("{name}: B read {b_read:?}; the new master granted {next}");
    }
}
