//! The guarantees a guard gives when futures share a task, replies come
//! late, renewals stop getting through, or a connection breaks mid-request —
//! with a proxy between the client and the server.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::time::timeout;
use warden_client::{Error, Release, Warden};

const LONG: Duration = Duration::from_secs(10);

fn through(proxy: &Proxy) -> Warden {
    Warden::open(&proxy.url()).unwrap()
}

/// The server's lease end of `key` (Unix ms), or a negative `PEXPIRETIME` answer.
fn pexpiretime(c: &mut redis::Connection, key: &str) -> i64 {
    int(c, &["PEXPIRETIME", key])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_joined_in_one_task_take_turns() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let one = || async {
        let guard = w
            .lock("inventory")
            .wait(LONG)
            .acquire()
            .await
            .unwrap()
            .expect("granted in turn");
        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        // Let the other futures run while this one is inside.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        inside.fetch_sub(1, Ordering::SeqCst);
        let token = guard.token();
        assert_eq!(guard.release().await.unwrap(), Release::Released);
        token
    };
    let (a, b, c) = tokio::join!(one(), one(), one());
    assert_eq!(most.load(Ordering::SeqCst), 1, "one inside at a time");
    let mut tokens = [a, b, c];
    tokens.sort();
    assert!(tokens[0] < tokens[1] && tokens[1] < tokens[2], "{tokens:?}");
}

/// A grant whose reply is held up in the network: the guard's lease is
/// dated from the send, so it counts as lost before the server's lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_is_lost_before_the_servers_lease_ends() {
    let s = Server::start(&[]);
    let proxy = Proxy::start(&s);
    let w = through(&proxy);
    let mut c = s.conn();
    run(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]).unwrap();
    let ttl = Duration::from_millis(1_500);
    let waiter = tokio::spawn({
        let w = w.clone();
        async move { w.lock("k").ttl(ttl).wait(LONG).acquire().await }
    });
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    let delay = Duration::from_millis(600);
    proxy.delay_replies(delay);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "holder"]), 1);
    let server_end = pexpiretime(&mut c, "k");
    let guard = timeout(LONG, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lock_state(&mut c, "k").unwrap().0, guard.owner());
    assert!(
        !guard.is_lost(),
        "{delay:?} of a {ttl:?} lease are gone, not all"
    );
    timeout(LONG, guard.lost()).await.unwrap();
    let lost_at = unix_ms();
    assert!(guard.is_lost());
    assert!(
        lost_at < server_end,
        "lost at {lost_at}, the server's lease ends at {server_end}"
    );
    let (owner, _, _) = lock_state(&mut c, "k").expect("the server still holds it for us");
    assert_eq!(owner, guard.owner());
    println!(
        "reply delayed {delay:?}: guard lost {} ms before the server's lease end",
        server_end - lost_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_delayed_past_its_lease_arrives_lost() {
    let s = Server::start(&[]);
    let proxy = Proxy::start(&s);
    let w = through(&proxy);
    let mut c = s.conn();
    run(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]).unwrap();
    let ttl = Duration::from_millis(300);
    let waiter = tokio::spawn({
        let w = w.clone();
        async move { w.lock("k").ttl(ttl).wait(LONG).acquire().await }
    });
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    proxy.delay_replies(ttl * 3);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "holder"]), 1);
    let guard = timeout(LONG, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(guard.is_lost(), "the lease ended before the reply came");
    timeout(Duration::from_millis(1), guard.lost())
        .await
        .expect("lost() resolves at once");
}

/// Renewals stop getting through (the proxy holds them): the watchdog must
/// flag the loss before the server's lease ends, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_flags_a_loss_before_the_servers_lease_ends() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let ttl = Duration::from_millis(500);
    let mut ahead = Vec::new();
    for trial in 0..20 {
        let key = format!("k{trial}");
        let proxy = Proxy::start(&s);
        let w = through(&proxy);
        let renewals = calls(&mut c, "lock.extend");
        let guard = w
            .lock(key.as_str())
            .ttl(ttl)
            .watchdog(true)
            .acquire()
            .await
            .unwrap()
            .unwrap();
        eventually("a renewal", LONG, || {
            calls(&mut c, "lock.extend") > renewals
        })
        .await;
        proxy.pause();
        timeout(LONG, guard.lost()).await.expect("loss flagged");
        let lost_at = unix_ms();
        // Nothing reaches the server any more: this is the lease's last end.
        let server_end = pexpiretime(&mut c, &key);
        assert!(
            lost_at < server_end,
            "trial {trial}: lost at {lost_at}, the server's lease ended at {server_end} \
             (-2: already gone)"
        );
        ahead.push(server_end - lost_at);
        drop(guard);
    }
    ahead.sort();
    println!(
        "20 trials, ttl {ttl:?}: loss flagged {}..{} ms (median {}) before the server's lease end",
        ahead[0], ahead[19], ahead[10]
    );
}

/// An idle pooled connection breaks after the server ran the acquire it
/// carried: the caller gets an error, the acquire is never sent twice, and
/// the grant nobody read is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_waiting_acquire_is_not_sent_again() {
    let s = Server::start(&[]);
    let proxy = Proxy::start(&s);
    let w = through(&proxy);
    let mut c = s.conn();
    // The shared connection is open (a free lock is granted on it).
    let g = w.lock("warm").wait(LONG).acquire().await.unwrap().unwrap();
    g.release().await.unwrap();
    let sent_before = calls(&mut c, "lock.acquire");
    proxy.cut_after(b"LOCK.ACQUIRE");
    let r = w
        .lock("k")
        .ttl(Duration::from_secs(60))
        .wait(LONG)
        .acquire()
        .await;
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");
    // The caller may see the cut before the server has read the request
    // the proxy passed on: wait for it to run, then it must have run once.
    eventually("the acquire to reach the server", LONG, || {
        calls(&mut c, "lock.acquire") > sent_before
    })
    .await;
    assert_eq!(
        calls(&mut c, "lock.acquire"),
        sent_before + 1,
        "sent exactly once"
    );
    eventually("the unread grant given back", LONG, || {
        lock_state(&mut c, "k").is_none()
    })
    .await;
    assert_eq!(
        calls(&mut c, "lock.acquire"),
        sent_before + 1,
        "never sent again"
    );
    // The client itself carries on.
    let next = w.lock("other").wait(LONG).acquire().await.unwrap().unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_through_a_proxy_leaves_the_queue() {
    let s = Server::start(&[]);
    let proxy = Proxy::start(&s);
    let w = through(&proxy);
    let mut c = s.conn();
    run(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let waiter = tokio::spawn({
        let w = w.clone();
        let inside = inside.clone();
        async move {
            let g = w.lock("k").wait(LONG).acquire().await;
            inside.fetch_add(1, Ordering::SeqCst);
            g
        }
    });
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    waiter.abort();
    wait_queued(&mut c, "LOCK.INFO", "k", 0);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "holder"]), 1);
    assert!(lock_state(&mut c, "k").is_none(), "nobody was granted");
    assert_eq!(inside.load(Ordering::SeqCst), 0);
}
