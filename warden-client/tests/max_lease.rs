//! Leases and the server's cap (`warden.max-lease`): a lease asked for above
//! it is capped and renewed until it ends; the watchdog's lease is the cap
//! when that is lower. Against servers started with `--warden.max-lease
//! 1000`; the timings leave wide margins (held at 2 s, gone by 5 s).

mod support;

use std::time::Duration;

use support::*;
use warden_client::Release;

const CAP: &[&str] = &["--warden.max-lease", "1000"];

fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

fn exists(c: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

fn extends(c: &mut redis::Connection) -> i64 {
    calls(c, "lock.extend") + calls(c, "rwlock.extend") + calls(c, "sem.extend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_over_the_cap_is_held_until_it_ends() {
    let s = Server::start(CAP);
    let w = warden(&s);
    let mut c = s.conn();
    let ttl = Duration::from_millis(3000);
    let lock = w
        .lock("job")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    let write = w
        .write_lock("rw")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    let permit = w
        .semaphore("sem", 1)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    let left = pttl(&mut c, "job");
    assert!(
        left > 0 && left <= 1000,
        "the server holds at most the cap: {left}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!lock.is_lost() && !write.is_lost() && !permit.is_lost());
    assert!(exists(&mut c, "job") && exists(&mut c, "rw") && exists(&mut c, "sem"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lock.is_lost() && write.is_lost() && permit.is_lost());
    assert!(!exists(&mut c, "job") && !exists(&mut c, "rw") && !exists(&mut c, "sem"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_at_the_cap_and_follows_a_lowered_one() {
    let s = Server::start(CAP);
    let w = warden(&s);
    let mut c = s.conn();
    // The watchdog's 30 s lease, capped to 1 s.
    let lock = w
        .lock("job")
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    let left = pttl(&mut c, "job");
    assert!(
        left > 0 && left <= 1000,
        "the watchdog's lease is the cap: {left}"
    );
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("warden.max-lease")
        .arg("600")
        .query::<()>(&mut c)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!lock.is_lost());
    let left = pttl(&mut c, "job");
    assert!(
        left > 0 && left <= 600,
        "renewed at the lowered cap: {left}"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let before = extends(&mut c);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(extends(&mut c), before, "no renewal after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stops_the_renewal_of_a_capped_lease() {
    let s = Server::start(CAP);
    let w = warden(&s);
    let mut c = s.conn();
    let ttl = Duration::from_secs(30);
    let lock = w
        .lock("job")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let before = extends(&mut c);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(extends(&mut c), before, "no renewal after the release");
    assert!(!exists(&mut c, "job"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_over_the_cap_is_capped_and_renewed() {
    let s = Server::start(CAP);
    let w = warden(&s);
    let mut c = s.conn();
    let lock = w
        .lock("job")
        .ttl(Duration::from_millis(500))
        .acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(lock.extend(Duration::from_millis(3000)).await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!lock.is_lost() && exists(&mut c, "job"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lock.is_lost() && !exists(&mut c, "job"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_stops_renewal_and_the_loss_shows() {
    let s = Server::start(CAP);
    let w = warden(&s);
    let mut c = s.conn();
    let ttl = Duration::from_secs(60);
    let lock = w
        .lock("job")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    redis::cmd("DEL").arg("job").query::<()>(&mut c).unwrap();
    tokio::time::timeout(Duration::from_secs(3), lock.lost())
        .await
        .expect("the loss shows within 3 s");
    assert!(lock.is_lost());
    let before = extends(&mut c);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(extends(&mut c), before, "no renewal after the loss");
    assert_eq!(lock.release().await.unwrap(), Release::NotHeld);
}
