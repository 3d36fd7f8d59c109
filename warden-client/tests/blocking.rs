//! The blocking facade, from plain threads.

mod support;

use std::time::Duration;

use support::*;
use warden_client::blocking::Warden;
use warden_client::Release;

#[test]
fn locks_and_cache_reads_without_a_runtime() {
    let s = Server::start(&[]);
    let w = Warden::open(&url(&s)).unwrap();
    let mut c = s.conn();
    let ttl = Duration::from_millis(300);
    let guard = w
        .lock("k")
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .unwrap()
        .unwrap();
    // The watchdog renews on the facade's own runtime while this thread sleeps.
    let renewals = calls(&mut c, "lock.extend");
    wait_for("renewals", Duration::from_secs(10), || {
        calls(&mut c, "lock.extend") >= renewals + 4
    });
    assert!(!guard.is_lost());
    let other = w.clone();
    let waiter = std::thread::spawn(move || {
        other
            .lock("k")
            .wait(Duration::from_secs(10))
            .acquire()
            .unwrap()
            .expect("handed off")
    });
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    let first = guard.token();
    assert_eq!(guard.release().unwrap(), Release::Released);
    let next = waiter.join().unwrap();
    assert!(next.token() > first);
    drop(next); // released in the background
    wait_for("release after drop", Duration::from_secs(10), || {
        lock_state(&mut c, "k").is_none()
    });

    let cache = w.cache().ttl(Duration::from_secs(60));
    let v: String = cache
        .get_or_load("user", Duration::from_secs(5), || {
            Ok::<_, std::io::Error>("Ada".to_string())
        })
        .unwrap();
    assert_eq!(v, "Ada");
    let stored: String = redis::cmd("GET").arg("user").query(&mut c).unwrap();
    assert_eq!(stored, "Ada");
}
