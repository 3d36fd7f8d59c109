//! Rate limiters: replies read as decisions, waits in the server's FIFO
//! queue, a deadline that cannot be met answered at once, cancellation that
//! takes nothing, refunds, rate changes and the server's refusals, against
//! real servers with the module.

mod support;

use std::time::{Duration, Instant};

use support::*;
use warden_client::Error;

const SECOND: Duration = Duration::from_secs(1);

/// `RATE.INFO key` field `name`, or None when the limiter does not exist.
fn rate_field(c: &mut redis::Connection, key: &str, name: &str) -> Option<i64> {
    maybe_map(c, &["RATE.INFO", key]).map(|f| field_int(&f, name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_then_limited_with_the_servers_figures() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let api = w.rate_limiter("api", 10, SECOND).burst(2);
    let first = api.try_acquire(1).await.unwrap();
    assert!(first.allowed);
    assert_eq!(
        (first.burst, first.remaining, first.retry_after),
        (2, 1, None)
    );
    assert!(first.reset_after <= Duration::from_millis(100));
    let second = api.acquire(1).await.unwrap(); // no wait set: the same as a try
    assert!(second.allowed);
    assert_eq!(second.remaining, 0);
    let third = api.try_acquire(1).await.unwrap();
    assert!(!third.allowed);
    let retry = third.retry_after.expect("a limited request says when");
    assert!(retry > Duration::ZERO && retry <= Duration::from_millis(100));
    assert!(third.reset_after > retry && third.reset_after <= Duration::from_millis(200));
    let info = api.info().await.unwrap().expect("exists");
    assert_eq!((info.count, info.period, info.burst), (10, SECOND, 2));
    assert_eq!(info.waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_the_order_they_queued() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    // A token every 10 s: the waiters stay queued (however slow this machine
    // is to notice them; the third conforms in 30 s, within its wait), and
    // each refund below serves the head of the queue.
    let lim = w
        .rate_limiter("fifo", 1, Duration::from_secs(10))
        .burst(1)
        .wait(Duration::from_secs(60));
    assert!(lim.try_acquire(1).await.unwrap().allowed);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for n in 0..3 {
        let (lim, tx) = (lim.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let d = lim.acquire(1).await.unwrap();
            tx.send((n, d.allowed)).unwrap();
        }));
        // The next one asks only once this one waits on the server.
        eventually("queued", Duration::from_secs(10), || {
            rate_field(&mut c, "fifo", "waiters") == Some(n + 1)
        })
        .await;
    }
    for want in 0..3 {
        assert!(lim.refund(1).await.unwrap());
        assert_eq!(rx.recv().await.unwrap(), (want, true));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_cannot_conform_in_time_is_answered_at_once() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    // One token per minute: the next conforms in about 60 s, past 20 s.
    let lim = w
        .rate_limiter("slow", 1, Duration::from_secs(60))
        .wait(Duration::from_secs(20));
    assert!(lim.acquire(1).await.unwrap().allowed);
    let started = Instant::now();
    let d = lim.acquire(1).await.unwrap();
    assert!(!d.allowed);
    assert!(d.retry_after.expect("says when") > Duration::from_secs(20));
    // Answered, not held to its 20 s deadline (generous for a busy box).
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(rate_field(&mut c, "slow", "waiters"), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_takes_nothing() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let lim = w
        .rate_limiter("cancel", 1, Duration::from_secs(10))
        .wait(Duration::from_secs(30));
    assert!(lim.acquire(1).await.unwrap().allowed);
    let reset_before = rate_field(&mut c, "cancel", "reset_after").unwrap();
    let waiting = tokio::spawn({
        let lim = lim.clone();
        async move { lim.acquire(1).await }
    });
    eventually("queued", Duration::from_secs(10), || {
        rate_field(&mut c, "cancel", "waiters") == Some(1)
    })
    .await;
    waiting.abort();
    eventually("the waiter left", Duration::from_secs(10), || {
        rate_field(&mut c, "cancel", "waiters") == Some(0)
    })
    .await;
    // Nothing taken: the bucket is full no later than before (one token
    // taken by the waiter would have pushed it 10 s further).
    let reset_after = rate_field(&mut c, "cancel", "reset_after").unwrap();
    assert!(
        reset_after <= reset_before,
        "{reset_after} > {reset_before}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_at_once() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let lim = w
        .rate_limiter("shed", 1, Duration::from_secs(10))
        .wait(Duration::from_secs(30));
    assert!(lim.acquire(1).await.unwrap().allowed);
    let waiting = tokio::spawn({
        let lim = lim.clone();
        async move { lim.acquire(1).await }
    });
    eventually("queued", Duration::from_secs(10), || {
        rate_field(&mut c, "shed", "waiters") == Some(1)
    })
    .await;
    let started = Instant::now();
    let d = lim.clone().max_queue(1).acquire(1).await.unwrap();
    assert!(!d.allowed);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(rate_field(&mut c, "shed", "waiters"), Some(1));
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_rate_changes() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut lim = w.rate_limiter("jobs", 10, SECOND).burst(2);
    assert!(lim.try_acquire(2).await.unwrap().allowed);
    assert!(!lim.try_acquire(1).await.unwrap().allowed);
    assert!(lim.refund(2).await.unwrap());
    // A full bucket is no limiter: nothing left to refund.
    assert_eq!(lim.info().await.unwrap(), None);
    assert!(!lim.refund(1).await.unwrap());

    assert!(lim.try_acquire(1).await.unwrap().allowed);
    let old = lim.clone();
    assert!(lim.set_rate(5, SECOND, Some(5)).await.unwrap());
    let info = lim.info().await.unwrap().expect("exists");
    assert_eq!((info.count, info.burst), (5, 5));
    assert!(lim.try_acquire(1).await.unwrap().allowed);
    // A handle stating the old rate is refused with the server's words.
    match old.try_acquire(1).await {
        Err(Error::Server { message, .. }) => {
            assert!(
                message.contains("limiter rate is 5 per 1000 ms burst 5"),
                "{message}"
            )
        }
        other => panic!("expected the rate mismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_change_nothing() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let lim = w.rate_limiter("bad", 10, SECOND).burst(2);
    for cost in [0, 3] {
        match lim.try_acquire(cost).await {
            Err(Error::Server { message, .. }) => {
                assert!(message.contains("invalid COST"), "{message}")
            }
            other => panic!("cost {cost}: expected invalid COST, got {other:?}"),
        }
    }
    for (count, period) in [(0, SECOND), (10, Duration::ZERO)] {
        let r = w.rate_limiter("bad", count, period).try_acquire(1).await;
        assert!(matches!(r, Err(Error::Server { .. })), "{r:?}");
    }
    assert_eq!(rate_field(&mut c, "bad", "count"), None);
}

/// Cancelled waits never touch a connection another request owns: callers
/// give up at random instants on one limiter while others wait on another,
/// through the same pool; no request that was not cancelled fails (a
/// cancel's `CLIENT UNBLOCK`/`KILL` used to name a link recycled meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_never_reach_a_recycled_connection() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let run_for = Duration::from_secs(5);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..6u64 {
        let lim = w
            .rate_limiter("cancelled", 10, SECOND)
            .burst(1)
            .wait(SECOND);
        tasks.push(tokio::spawn(async move {
            let mut i = n;
            while started.elapsed() < run_for {
                i += 7;
                let give_up = Duration::from_millis(1 + i % 60);
                let _ = tokio::time::timeout(give_up, lim.acquire(1)).await;
            }
            Ok::<u64, Error>(0)
        }));
    }
    for _ in 0..3 {
        let lim = w
            .rate_limiter("victim", 200, SECOND)
            .burst(1)
            .wait(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            while started.elapsed() < run_for {
                if lim.acquire(1).await?.allowed {
                    granted += 1;
                }
            }
            Ok(granted)
        }));
    }
    let mut victims = 0;
    for t in tasks {
        victims += t.await.unwrap().expect("a request nobody cancelled failed");
    }
    assert!(victims > 0);
}
