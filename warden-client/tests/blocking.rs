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
    // 1 s: a shorter lease is lost whenever a busy machine stalls the renewal.
    let ttl = Duration::from_secs(1);
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

#[test]
fn inside_an_async_runtime_calls_are_errors_not_panics() {
    let s = Server::start(&[]);
    // Opened outside, used and dropped inside a runtime.
    let w = Warden::open(&url(&s)).unwrap();
    let guard = w.lock("held").acquire().unwrap().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = url(&s);
    runtime.block_on(async move {
        let inside = |e: warden_client::Error| e.to_string().contains("inside an async runtime");
        assert!(Warden::open(&url).err().is_some_and(inside));
        assert!(w.lock("k").acquire().err().is_some_and(inside));
        assert!(guard
            .extend(Duration::from_secs(5))
            .err()
            .is_some_and(inside));
        let cache = w.cache();
        let read = cache.get_or_load("v", Duration::from_secs(1), || {
            Ok::<_, std::io::Error>("x".to_string())
        });
        assert!(read.err().is_some_and(inside));
        assert!(guard.release().err().is_some_and(inside));
        drop(cache);
        drop(w); // the last handle of the facade's runtime
    });
}
