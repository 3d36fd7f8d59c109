//! A soak: many clients waiting, timing out, disconnecting and being killed,
//! for WARDEN_SOAK_SECONDS (300 by default). Waiter queues, timers and blocked
//! client handles must not leak: at the end nobody waits and memory is back
//! near where it started.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn waiting_timing_out_disconnecting_and_killed_clients_leak_nothing() {
    let seconds: u64 = std::env::var("WARDEN_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let s = Server::start(&[]);
    let mut c = s.conn();
    // warm up allocator pools and the keyspace before the baseline
    for i in 0..8 {
        int(&mut c, &["LOCK.ACQUIRE", &format!("warm{i}"), "w", "10"]);
    }
    thread::sleep(Duration::from_millis(50));
    let baseline = used_memory(&mut c);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let socket = s.socket();
    let mut workers = Vec::new();
    for w in 0..24u64 {
        let (stop, rounds, socket) = (stop.clone(), rounds.clone(), socket.clone());
        workers.push(thread::spawn(move || {
            let client = redis::Client::open(format!("redis+unix://{}", socket.display())).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("k{}", n % 4);
                let owner = format!("w{w}-{n}");
                // Clients are killed at random: every error here is expected.
                let Ok(mut con) = client.get_connection() else {
                    continue;
                };
                match (w + n) % 4 {
                    // hold briefly and release
                    0 => {
                        let got: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                            .arg(&key)
                            .arg(&owner)
                            .arg(200)
                            .arg("WAIT")
                            .arg(100)
                            .query(&mut con)
                            .ok()
                            .flatten();
                        if got.is_some() {
                            let _ = redis::cmd("LOCK.RELEASE")
                                .arg(&key)
                                .arg(&owner)
                                .query::<i64>(&mut con);
                        }
                    }
                    // wait with a short timeout and let the lease run out
                    1 => {
                        let _ = redis::cmd("LOCK.ACQUIRE")
                            .arg(&key)
                            .arg(&owner)
                            .arg(30)
                            .arg("WAIT")
                            .arg(20)
                            .query::<Option<i64>>(&mut con);
                    }
                    // read-write lock, released or left to expire
                    2 => {
                        let cmd = if n.is_multiple_of(3) {
                            "RWLOCK.WRITE"
                        } else {
                            "RWLOCK.READ"
                        };
                        let got: Option<i64> = redis::cmd(cmd)
                            .arg(format!("rw{}", n % 3))
                            .arg(&owner)
                            .arg(50)
                            .arg("WAIT")
                            .arg(30)
                            .query(&mut con)
                            .ok()
                            .flatten();
                        if got.is_some() && n.is_multiple_of(2) {
                            let _ = redis::cmd("RWLOCK.UNLOCK")
                                .arg(format!("rw{}", n % 3))
                                .arg(&owner)
                                .query::<i64>(&mut con);
                        }
                    }
                    // block and disconnect while waiting
                    _ => {
                        let _ = con.set_read_timeout(Some(Duration::from_millis(15)));
                        let _ = redis::cmd("LOCK.ACQUIRE")
                            .arg(&key)
                            .arg(&owner)
                            .arg(100)
                            .arg("WAIT")
                            .arg(0)
                            .query::<Option<i64>>(&mut con);
                    }
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // A killer: CLIENT KILL every blocked client now and then.
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(250));
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        assert!(warden_stat(&mut c, "waiting_clients") <= 100);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    assert!(rounds.load(Ordering::Relaxed) > 1000, "the soak did work");
    wait_for("queues drained", Duration::from_secs(10), || {
        warden_stat(&mut c, "waiting_clients") == 0
    });
    // let every lease end, then compare memory with the baseline
    wait_for("leases ended", Duration::from_secs(10), || {
        let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        keys == 0
    });
    let after = used_memory(&mut c);
    assert!(
        after < baseline + (2 << 20),
        "used_memory {baseline} -> {after}"
    );
    assert_eq!(warden_stat(&mut c, "lock_keys"), 0);
    assert_eq!(warden_stat(&mut c, "rwlock_keys"), 0);
}
