//! Redlock across five independent masters, with warden's commands.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Clock drift allowance: 1% of the ttl plus 2 ms, as the Redlock description suggests.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Opens a connection with short timeouts; `None` if the server is down.
fn connect(socket: &std::path::Path) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis+unix://{}", socket.display())).ok()?;
    let con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    Some(con)
}

/// The Redlock algorithm: the same owner on every master, a majority quorum,
/// validity = ttl - elapsed - drift, and a release on all masters on failure.
/// Returns the validity left if the lock is held.
fn redlock(
    sockets: &[std::path::PathBuf],
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let granted = sockets
        .iter()
        .filter(|s| {
            connect(s).is_some_and(|mut c| {
                redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg(owner)
                    .arg(ttl.as_millis() as u64)
                    .query::<Option<i64>>(&mut c)
                    .ok()
                    .flatten()
                    .is_some()
            })
        })
        .count();
    let elapsed = start.elapsed();
    let quorum = sockets.len() / 2 + 1;
    match ttl.checked_sub(elapsed + drift(ttl)) {
        Some(validity) if granted >= quorum && !validity.is_zero() => Some(validity),
        _ => {
            unlock(sockets, key, owner);
            None
        }
    }
}

fn unlock(sockets: &[std::path::PathBuf], key: &str, owner: &str) {
    for s in sockets {
        if let Some(mut c) = connect(s) {
            let _ = redis::cmd("LOCK.RELEASE")
                .arg(key)
                .arg(owner)
                .query::<i64>(&mut c);
        }
    }
}

#[test]
fn redlock_excludes_competitors_progresses_with_two_down_and_never_grants_without_a_majority() {
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start(&[])).collect();
    let sockets: Vec<_> = servers.iter().map(Server::socket).collect();

    // Mutual exclusion among competing clients.
    let inside = Arc::new(AtomicBool::new(false));
    let wins = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (sockets, inside, wins) = (sockets.clone(), inside.clone(), wins.clone());
            thread::spawn(move || {
                let owner = format!("client-{w}");
                for _ in 0..40 {
                    // Work only within the validity: here 2 ms, far below it.
                    if redlock(&sockets, "resource", &owner, Duration::from_millis(2000)).is_some()
                    {
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        thread::sleep(Duration::from_millis(2));
                        inside.store(false, Ordering::SeqCst);
                        wins.fetch_add(1, Ordering::SeqCst);
                        unlock(&sockets, "resource", &owner);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert!(wins.load(Ordering::SeqCst) > 0);

    // Two of five masters down: the majority still grants.
    servers[0].stop(false);
    servers[1].stop(false);
    assert!(redlock(&sockets, "resource", "survivor", Duration::from_secs(10)).is_some());
    // A competitor cannot get it meanwhile.
    assert!(redlock(&sockets, "resource", "rival", Duration::from_secs(10)).is_none());
    unlock(&sockets, "resource", "survivor");

    // Three down: no majority, no grant — and nothing is left held behind.
    servers[2].stop(false);
    assert!(redlock(&sockets, "resource", "lonely", Duration::from_secs(2)).is_none());
    for s in &servers[3..] {
        let mut c = s.conn();
        assert_eq!(int(&mut c, &["EXISTS", "resource"]), 0);
    }
}
