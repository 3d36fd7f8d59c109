//! Semaphore guards: the bound, FIFO with mixed weights, leases, the
//! watchdog, cancellation and the server's refusals, against real
//! redis-servers with the module.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::time::timeout;
use warden_client::{Error, Release, SemaphoreInfo};

const LONG: Duration = Duration::from_secs(10);

/// `SEM.INFO key` as (limit, used, holders, waiters), or None.
fn sem_state(c: &mut redis::Connection, key: &str) -> Option<(i64, i64, i64, i64)> {
    let f = maybe_map(c, &["SEM.INFO", key])?;
    Some((
        field_int(&f, "limit"),
        field_int(&f, "used"),
        field_int(&f, "holders"),
        field_int(&f, "waiters"),
    ))
}

/// The permits `owner` holds on `key` (0: none).
fn permits_of(c: &mut redis::Connection, key: &str, owner: &str) -> i64 {
    maybe_map(c, &["SEM.INFO", key, owner]).map_or(0, |f| field_int(&f, "permits"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_holds_its_permits_until_released() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let sem = w.semaphore("k", 5).permits(2);
    let guard = sem.acquire().await.unwrap().expect("free permits");
    assert!(guard.token() > 0);
    assert_eq!(guard.permits(), 2);
    assert_eq!(guard.owner().len(), 36, "a fresh UUID per acquire");
    assert_eq!(permits_of(&mut c, "k", guard.owner()), 2);
    let info: SemaphoreInfo = sem.info().await.unwrap().expect("exists");
    assert_eq!(
        (info.limit, info.used, info.holders, info.waiters),
        (5, 2, 1, 0)
    );
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert!(sem_state(&mut c, "k").is_none());
    assert_eq!(sem.info().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_is_never_exceeded_by_many_tasks() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let limit = 4;
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..16u32)
        .map(|i| {
            let sem = w.semaphore("pool", limit).permits(1 + i % 2).wait(LONG);
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..3 {
                    let guard = sem.acquire().await.unwrap().expect("granted in turn");
                    let now = inside.fetch_add(guard.permits(), Ordering::SeqCst) + guard.permits();
                    most.fetch_max(now, Ordering::SeqCst);
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                    inside.fetch_sub(guard.permits(), Ordering::SeqCst);
                    tokens.push(guard.token());
                    assert_eq!(guard.release().await.unwrap(), Release::Released);
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.extend(timeout(LONG * 3, t).await.unwrap().unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= limit, "{most} permits held at once, limit {limit}");
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 48, "every hold its own fencing token");
    let mut c = s.conn();
    assert!(sem_state(&mut c, "pool").is_none(), "nothing left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_is_not_overtaken_by_later_small_ones() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let sem = w.semaphore("k", 3).wait(LONG);
    let first = sem.acquire().await.unwrap().unwrap();
    let big = tokio::spawn({
        let sem = sem.clone().permits(3);
        async move { sem.acquire().await.unwrap().expect("granted") }
    });
    wait_queued(&mut c, "SEM.INFO", "k", 1);
    let small = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.unwrap().expect("granted") }
    });
    wait_queued(&mut c, "SEM.INFO", "k", 2);
    // Two permits are free, yet the request for 1 waits behind the one for 3.
    assert_eq!(sem_state(&mut c, "k"), Some((3, 1, 1, 2)));
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "nor is it overtaken"
    );
    first.release().await.unwrap();
    let big = timeout(LONG, big).await.unwrap().unwrap();
    assert_eq!(sem_state(&mut c, "k"), Some((3, 3, 1, 1)));
    assert!(!small.is_finished());
    let big_token = big.token();
    big.release().await.unwrap();
    let small = timeout(LONG, small).await.unwrap().unwrap();
    assert!(small.token() > big_token);
    small.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_gives_back_its_permits() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w
        .semaphore("k", 2)
        .permits(2)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let sem = w.semaphore("k", 2).wait(LONG);
        async move {
            sem.acquire()
                .await
                .unwrap()
                .expect("granted after the drop")
        }
    });
    wait_queued(&mut c, "SEM.INFO", "k", 1);
    drop(guard);
    let next = timeout(LONG, waiter).await.unwrap().unwrap();
    drop(next);
    eventually("release after drop", LONG, || {
        sem_state(&mut c, "k").is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_and_a_wait_that_runs_out_answer_none() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let sem = w.semaphore("k", 1);
    let held = sem.try_acquire().await.unwrap().expect("free");
    assert!(sem.try_acquire().await.unwrap().is_none());
    let short = sem.clone().wait(Duration::from_millis(20));
    assert!(short.acquire().await.unwrap().is_none());
    assert_eq!(sem_state(&mut c, "k"), Some((1, 1, 1, 0)));
    held.release().await.unwrap();
}

/// The acquire future is dropped after the server granted it and before its
/// reply was read: the permits are given back, not held for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_gives_back_permits_granted_on_the_way() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    run(
        &mut c,
        &[
            "SEM.ACQUIRE",
            "k",
            "holder",
            "60000",
            "LIMIT",
            "2",
            "PERMITS",
            "2",
        ],
    )
    .unwrap();
    let sem = w
        .semaphore("k", 2)
        .permits(2)
        .ttl(Duration::from_secs(60))
        .wait(LONG);
    let mut acquire = Box::pin(sem.acquire());
    tokio::select! {
        r = &mut acquire => panic!("granted while full: {r:?}"),
        () = eventually("queued", LONG, || waiters_of(&mut c, "SEM.INFO", "k") == 1) => {}
    }
    // Nobody polls the acquire any more: the grant below is never read.
    assert_eq!(int(&mut c, &["SEM.RELEASE", "k", "holder"]), 1);
    assert_eq!(
        sem_state(&mut c, "k"),
        Some((2, 2, 1, 0)),
        "granted to the waiter"
    );
    drop(acquire); // cancelled with its grant on the way
    eventually("the grant given back", LONG, || {
        sem_state(&mut c, "k").is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_leaves_no_permits_behind() {
    // tokio::time::timeout cancels the acquire about when the holder lets
    // go: granted and returned, or cancelled before or after its grant, no
    // permit stays held by the cancelled owner.
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let sem = w
        .semaphore("k", 3)
        .permits(2)
        .ttl(Duration::from_secs(60))
        .wait(LONG);
    for round in 0..12u64 {
        run(
            &mut c,
            &[
                "SEM.ACQUIRE",
                "k",
                "holder",
                "60000",
                "LIMIT",
                "3",
                "PERMITS",
                "3",
            ],
        )
        .unwrap();
        let mut acquire = Box::pin(timeout(Duration::from_millis(5 * round + 1), sem.acquire()));
        let early = tokio::select! {
            r = &mut acquire => Some(r),
            () = eventually("queued", LONG, || waiters_of(&mut c, "SEM.INFO", "k") == 1) => None,
        };
        let _ = run(&mut c, &["SEM.RELEASE", "k", "holder"]);
        let got = match early {
            Some(r) => {
                drop(acquire); // a timed-out future is cancelled once dropped
                r
            }
            None => acquire.await,
        };
        if let Ok(guard) = got {
            let guard = guard.unwrap().expect("granted");
            guard.release().await.unwrap();
        }
        eventually("no permit left behind", LONG, || {
            sem_state(&mut c, "k").is_none()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let held = w.semaphore("k", 1).acquire().await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let sem = w.semaphore("k", 1).wait(LONG);
        async move { sem.acquire().await }
    });
    wait_queued(&mut c, "SEM.INFO", "k", 1);
    waiter.abort();
    wait_queued(&mut c, "SEM.INFO", "k", 0);
    held.release().await.unwrap();
    assert!(sem_state(&mut c, "k").is_none(), "nobody was granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_limit_is_refused_until_set_limit_changes_it() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let held = w.semaphore("k", 2).acquire().await.unwrap().unwrap();
    let mut other = w.semaphore("k", 3);
    match other.try_acquire().await {
        Err(Error::LimitMismatch { limit, requested }) => assert_eq!((limit, requested), (2, 3)),
        r => panic!("expected LimitMismatch, got {r:?}"),
    }
    let e = other.acquire().await.unwrap_err();
    assert_eq!(e.to_string(), "ERR semaphore limit is 2, not 3");
    assert_eq!(
        sem_state(&mut c, "k"),
        Some((2, 1, 1, 0)),
        "nothing changed"
    );
    assert!(other.set_limit(3).await.unwrap());
    assert_eq!(other.limit(), 3);
    let more = other.clone().permits(2).try_acquire().await.unwrap();
    let more = more.expect("room for 2 more under the new limit");
    assert_eq!(sem_state(&mut c, "k"), Some((3, 3, 2, 0)));
    held.release().await.unwrap();
    more.release().await.unwrap();
    assert!(!other.set_limit(5).await.unwrap(), "no semaphore left");
    assert_eq!(other.limit(), 5, "the next acquire states the new limit");
    let g = other.try_acquire().await.unwrap().unwrap();
    assert_eq!(sem_state(&mut c, "k"), Some((5, 1, 1, 0)));
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_fails_waiters_asking_for_more() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let mut sem = w.semaphore("k", 4).wait(LONG);
    let held = sem.acquire().await.unwrap().unwrap();
    let big = tokio::spawn({
        let sem = sem.clone().permits(4);
        async move { sem.acquire().await }
    });
    wait_queued(&mut c, "SEM.INFO", "k", 1);
    assert!(sem.set_limit(2).await.unwrap());
    match timeout(LONG, big).await.unwrap().unwrap() {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, "ERR");
            assert!(message.contains("limit was lowered"), "{message}");
        }
        r => panic!("expected the server's refusal, got {r:?}"),
    }
    // The refused waiter left nothing behind, and its connection serves on.
    assert_eq!(sem_state(&mut c, "k"), Some((2, 1, 1, 0)));
    let next = sem.acquire().await.unwrap().unwrap();
    held.release().await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_holds_once() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let sem = w.semaphore("k", 5).owner("worker-1");
    let held = sem.acquire().await.unwrap().unwrap();
    assert_eq!(held.owner(), "worker-1");
    match sem.try_acquire().await {
        Err(Error::Server { code, message }) => {
            assert_eq!(
                (code.as_str(), message.as_str()),
                ("ERR", "owner already holds this semaphore")
            )
        }
        r => panic!("expected the server's refusal, got {r:?}"),
    }
    assert_eq!(permits_of(&mut c, "k", "worker-1"), 1, "still its one hold");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_permits_past_several_leases() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let ttl = Duration::from_millis(300);
    let guard = w
        .semaphore("k", 2)
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    eventually("twelve renewals", LONG, || {
        calls(&mut c, "sem.extend") >= 12
    })
    .await;
    assert_eq!(permits_of(&mut c, "k", guard.owner()), 1, "still held");
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let after_release = calls(&mut c, "sem.extend");
    tokio::time::sleep(ttl).await;
    assert_eq!(calls(&mut c, "sem.extend"), after_release);
    assert!(sem_state(&mut c, "k").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_permits_taken_away() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w
        .semaphore("k", 2)
        .ttl(Duration::from_millis(300))
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let mut lost = guard.lost_watch();
    run(&mut c, &["DEL", "k"]).unwrap();
    timeout(LONG, guard.lost()).await.expect("loss reported");
    assert!(guard.is_lost() && *lost.borrow_and_update());
    assert_eq!(guard.release().await.unwrap(), Release::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_resets_the_lease_and_a_lease_end_returns_the_permits() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w
        .semaphore("k", 1)
        .ttl(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(guard.extend(Duration::from_secs(60)).await.unwrap());
    assert!(int(&mut c, &["PTTL", "k"]) > 30_000);
    assert!(!guard.is_lost());
    assert!(guard.extend(Duration::from_millis(50)).await.unwrap());
    timeout(LONG, guard.lost()).await.expect("the lease ends");
    eventually("the permits returned", LONG, || {
        sem_state(&mut c, "k").is_none()
    })
    .await;
    assert!(!guard.extend(Duration::from_secs(1)).await.unwrap());
    assert_eq!(guard.release().await.unwrap(), Release::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reads_the_same_over_resp3() {
    let s = Server::start(&[]);
    let w = warden_client::Warden::open(&format!("{}?protocol=resp3", url(&s))).unwrap();
    let sem = w.semaphore("k", 3).permits(2);
    let guard = sem.acquire().await.unwrap().unwrap();
    let info = sem.info().await.unwrap().expect("exists");
    assert_eq!(
        (info.limit, info.used, info.holders, info.waiters),
        (3, 2, 1, 0)
    );
    guard.release().await.unwrap();
    assert_eq!(sem.info().await.unwrap(), None);
}
