//! CACHE.* under faults: every way a fill lease ends (fill, abandon, lapse,
//! its holder killed) × server states (normal, writes paused, all clients
//! paused, a DEBUG RELOAD in between) × client behaviours (commands pipelined
//! behind each waiter, a waiter killed as it is handed the lease, a waiter's
//! deadline at the moment of the fill, CLIENT UNBLOCK pipelined with the fill).
//! After each case: the server is alive, every request got exactly one reply,
//! at most one load per key was ever in flight, and the lease table is empty.

mod common;

use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use redis::{Connection, ConnectionLike, Value};

#[derive(Clone, Copy, Debug)]
enum End {
    Fill,
    Abandon,
    Lapse,
    HolderKilled,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Normal,
    WritesPaused,
    AllPaused,
    Reloaded,
}

#[derive(Clone, Copy, Debug)]
enum Behaviour {
    Pipelined,
    KilledAtHandOff,
    DeadlineAtFill,
    UnblockWithFill,
}

const ENDS: [End; 4] = [End::Fill, End::Abandon, End::Lapse, End::HolderKilled];
const STATES: [State; 4] = [
    State::Normal,
    State::WritesPaused,
    State::AllPaused,
    State::Reloaded,
];
const BEHAVIOURS: [Behaviour; 4] = [
    Behaviour::Pipelined,
    Behaviour::KilledAtHandOff,
    Behaviour::DeadlineAtFill,
    Behaviour::UnblockWithFill,
];

/// A waiter: `CACHE.GET k 60000 WAIT t` then `ECHO marker`, pipelined on its
/// own connection; its two replies and its connection come back.
struct Waiter {
    id: i64,
    handle: JoinHandle<(Result<Vec<Value>, String>, Connection)>,
}

fn waiter(s: &Server, timeout_ms: i64) -> Waiter {
    let mut c = s.conn();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let id = int(&mut c, &["CLIENT", "ID"]);
    let handle = std::thread::spawn(move || {
        let mut p = redis::pipe();
        p.cmd("CACHE.GET")
            .arg("k")
            .arg(60_000)
            .arg("WAIT")
            .arg(timeout_ms);
        p.cmd("ECHO").arg("marker");
        let replies = c
            .req_packed_commands(&p.get_packed_pipeline(), 0, 2)
            .map_err(|e| e.to_string());
        (replies, c)
    });
    Waiter { id, handle }
}

/// What a waiter was answered: the value, a lease, or nothing (timed out,
/// unblocked, killed). Checks the marker came right after: one reply each.
enum Got {
    Value(String),
    Lease(i64, Connection),
    Nothing,
}

fn got(w: Waiter, case: &str) -> Got {
    let (replies, c) = w.handle.join().unwrap();
    let replies = match replies {
        Ok(r) => r,
        // A killed waiter's connection is gone: no reply is the right outcome.
        Err(_) => return Got::Nothing,
    };
    assert_eq!(
        replies[1],
        Value::BulkString(b"marker".to_vec()),
        "{case}: one reply per request, got {replies:?}"
    );
    match &replies[0] {
        Value::Array(v) => match (&v[0], &v[1]) {
            (Value::BulkString(b), Value::Nil) => Got::Value(String::from_utf8_lossy(b).into()),
            (Value::Nil, Value::Int(t)) => Got::Lease(*t, c),
            (Value::Nil, Value::Nil) => Got::Nothing,
            other => panic!("{case}: {other:?}"),
        },
        other => panic!("{case}: {other:?}"),
    }
}

fn waiting(c: &mut Connection) -> i64 {
    warden_stat(c, "waiting_clients")
}

fn run_case(end: End, state: State, behaviour: Behaviour) {
    let case = format!("{end:?} × {state:?} × {behaviour:?}");
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut holder = s.conn();
    let lease_ms = if matches!(end, End::Lapse) {
        300
    } else {
        60_000
    };
    let token = match run(&mut holder, &["CACHE.GET", "k", &lease_ms.to_string()]).unwrap() {
        Value::Array(v) => match v[1] {
            Value::Int(t) => t,
            _ => panic!("{case}: no lease"),
        },
        other => panic!("{case}: {other:?}"),
    };
    let first_timeout = if matches!(behaviour, Behaviour::DeadlineAtFill) {
        200
    } else {
        20_000
    };
    let first = waiter(&s, first_timeout);
    wait_for("the first waiter", Duration::from_secs(10), || {
        waiting(&mut c) == 1
    });
    let second = waiter(&s, 20_000);
    wait_for("the second waiter", Duration::from_secs(10), || {
        waiting(&mut c) == 2
    });
    if matches!(state, State::Reloaded) {
        // A reload flushes: the holder's lease ends, the oldest waiter gets one.
        run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    }
    match state {
        State::WritesPaused => run(&mut c, &["CLIENT", "PAUSE", "400", "WRITE"]).unwrap(),
        State::AllPaused => run(&mut c, &["CLIENT", "PAUSE", "400", "ALL"]).unwrap(),
        _ => Value::Nil,
    };
    if matches!(behaviour, Behaviour::DeadlineAtFill) {
        std::thread::sleep(Duration::from_millis(195));
    }
    // How the holder's lease ends, with the behaviour's extra command in the same packet.
    let t = token.to_string();
    let mut p = redis::pipe();
    match end {
        End::Fill => {
            p.cmd("CACHE.FILL").arg("k").arg(&t).arg("v");
        }
        End::Abandon => {
            p.cmd("CACHE.ABANDON").arg("k").arg(&t);
        }
        End::Lapse => {
            p.cmd("PING");
        }
        End::HolderKilled => {
            let id = int(&mut holder, &["CLIENT", "ID"]);
            p.cmd("CLIENT").arg("KILL").arg("ID").arg(id);
        }
    }
    match behaviour {
        Behaviour::KilledAtHandOff => {
            p.cmd("CLIENT").arg("KILL").arg("ID").arg(first.id);
        }
        Behaviour::UnblockWithFill => {
            p.cmd("CLIENT").arg("UNBLOCK").arg(first.id);
        }
        _ => {}
    }
    let count = 1 + usize::from(matches!(
        behaviour,
        Behaviour::KilledAtHandOff | Behaviour::UnblockWithFill
    ));
    let _ = c.req_packed_commands(&p.get_packed_pipeline(), 0, count);
    // Each waiter: the value, or a lease it fills at once (at most one load).
    let mut loads = 0;
    let mut outcomes = Vec::new();
    for w in [first, second] {
        match got(w, &case) {
            Got::Lease(lease, mut own) => {
                // A waiter killed right at the hand-off may still have read
                // its lease; its connection is gone, and the lease with it.
                match run(&mut own, &["CACHE.FILL", "k", &lease.to_string(), "v"]) {
                    Ok(filled) => {
                        loads += 1;
                        assert_eq!(filled, Value::Int(1), "{case}: a lease handed on can fill");
                        outcomes.push("lease");
                    }
                    Err(e) if e.is_io_error() => outcomes.push("died holding a lease"),
                    Err(e) => panic!("{case}: {e}"),
                }
            }
            Got::Value(v) => {
                assert_eq!(v, "v", "{case}");
                outcomes.push("value");
            }
            Got::Nothing => outcomes.push("nothing"),
        }
    }
    assert!(loads <= 1, "{case}: {loads} loads in flight: {outcomes:?}");
    if matches!(end, End::Fill) && matches!(state, State::Normal) {
        assert!(
            !outcomes.contains(&"lease"),
            "{case}: a fill answers everyone"
        );
    }
    wait_for("no waiter left", Duration::from_secs(10), || {
        waiting(&mut c) == 0
    });
    drop(holder);
    wait_for("an empty lease table", Duration::from_secs(10), || {
        warden_stat(&mut c, "cache_entries") == 0
    });
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG", "{case}");
    let log = s.log();
    assert!(
        !log.contains("ASSERTION") && !log.contains("panic"),
        "{case}: {log}"
    );
}

#[test]
fn cache_leases_survive_the_fault_matrix() {
    let cases: Vec<(End, State, Behaviour)> = ENDS
        .iter()
        .flat_map(|&e| {
            STATES
                .iter()
                .flat_map(move |&s| BEHAVIOURS.iter().map(move |&b| (e, s, b)))
        })
        .collect();
    // Two threads: the cases are independent servers.
    let (left, right) = cases.split_at(cases.len() / 2);
    let (left, right) = (left.to_vec(), right.to_vec());
    let a = std::thread::spawn(move || left.into_iter().for_each(|(e, s, b)| run_case(e, s, b)));
    right.into_iter().for_each(|(e, s, b)| run_case(e, s, b));
    a.join().unwrap();
    println!("cache fault matrix: {} cases", cases.len());
}
