//! Lock and read-write lock guards, the watchdog, waiting and Redlock,
//! against real redis-servers with the module.

mod support;

use std::time::Duration;

use support::*;
use tokio::time::{timeout, Instant};
use warden_client::{Error, Redlock, Release};

const LONG: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_lock_the_guard_held() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w.lock("k").acquire().await.unwrap().expect("free lock");
    assert!(guard.token() > 0);
    let (owner, holds, fence) = lock_state(&mut c, "k").expect("held");
    assert_eq!(
        (owner.as_str(), holds, fence),
        (guard.owner(), 1, guard.token())
    );
    assert_eq!(guard.owner().len(), 36, "a fresh UUID per acquire");
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert!(lock_state(&mut c, "k").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_in_the_background() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w.lock("k").acquire().await.unwrap().expect("free lock");
    drop(guard);
    eventually("release after drop", LONG, || {
        lock_state(&mut c, "k").is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_explicit_owner_reenters() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let first = w.lock("k").acquire().await.unwrap().unwrap();
    assert!(
        w.lock("k").acquire().await.unwrap().is_none(),
        "the same task acquiring again is another owner"
    );
    first.release().await.unwrap();
    let owner = warden_client::Warden::new_owner();
    let first = w
        .lock("k")
        .reentrant(&owner)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let second = w
        .lock("k")
        .reentrant(&owner)
        .acquire()
        .await
        .unwrap()
        .expect("re-entrant");
    assert_eq!(first.token(), second.token());
    assert_eq!(second.release().await.unwrap(), Release::HoldsRemain);
    assert_eq!(first.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_owners_are_refused_or_wait_for_the_hand_off() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let holder = w.lock("k").acquire().await.unwrap().unwrap();
    let other = w.clone();
    let busy = tokio::spawn(async move { other.lock("k").acquire().await.unwrap() })
        .await
        .unwrap();
    assert!(busy.is_none(), "another task is another owner");
    let other = w.clone();
    let waiter = tokio::spawn(async move { other.lock("k").wait(LONG).acquire().await.unwrap() });
    let mut c = s.conn();
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    let first = holder.token();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed off");
    assert!(next.token() > first);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_does_not_block_other_commands() {
    let s = Server::start(&[]);
    let holder = warden(&s);
    let w = warden(&s);
    let held = holder.lock("k").acquire().await.unwrap().unwrap();
    // Two waits in flight on the same client...
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let w = w.clone();
            // Each waiter releases as soon as it is granted: the server's
            // queue, not the order of these tasks, decides who goes first.
            tokio::spawn(async move {
                let g = w.lock("k").wait(LONG).acquire().await.unwrap();
                let g = g.expect("granted in turn");
                let token = g.token();
                g.release().await.unwrap();
                token
            })
        })
        .collect();
    let mut c = s.conn();
    wait_queued(&mut c, "LOCK.INFO", "k", 2);
    // ...and the same client's other commands still answer at once.
    for i in 0..20 {
        let g = timeout(
            Duration::from_secs(2),
            w.lock(format!("other:{i}")).acquire(),
        )
        .await
        .expect("not stuck behind a WAIT")
        .unwrap()
        .unwrap();
        g.release().await.unwrap();
    }
    held.release().await.unwrap();
    for waiter in waiters {
        assert!(waiter.await.unwrap() > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let held = w.lock("k").acquire().await.unwrap().unwrap();
    let other = w.clone();
    let waiter = tokio::spawn(async move { other.lock("k").wait(LONG).acquire().await });
    let mut c = s.conn();
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    waiter.abort();
    wait_queued(&mut c, "LOCK.INFO", "k", 0);
    held.release().await.unwrap();
    assert!(lock_state(&mut c, "k").is_none(), "nobody was granted");
}

/// The acquire future is dropped after the server granted it and before its
/// reply was read: the grant is given back, not held for its whole lease.
async fn a_cancelled_acquire_gives_back_a_grant_that_crossed_it(kind: &str) {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let (acquire_cmd, release_cmd, info_cmd) = match kind {
        "lock" => ("LOCK.ACQUIRE", "LOCK.RELEASE", "LOCK.INFO"),
        _ => ("RWLOCK.WRITE", "RWLOCK.UNLOCK", "RWLOCK.INFO"),
    };
    run(&mut c, &[acquire_cmd, "k", "holder", "60000"]).unwrap();
    let request = match kind {
        "lock" => w.lock("k"),
        _ => w.write_lock("k"),
    };
    let mut acquire = Box::pin(request.ttl(Duration::from_secs(60)).wait(LONG).acquire());
    tokio::select! {
        r = &mut acquire => panic!("granted while held: {r:?}"),
        () = eventually("queued", LONG, || waiters_of(&mut c, info_cmd, "k") == 1) => {}
    }
    // Nobody polls the acquire any more: the grant below is never read.
    assert_eq!(int(&mut c, &[release_cmd, "k", "holder"]), 1);
    let holder = |c: &mut redis::Connection| -> Option<String> {
        let fields = maybe_map(c, &[info_cmd, "k"])?;
        let name = if info_cmd == "LOCK.INFO" {
            "owner"
        } else {
            "writer"
        };
        Some(field_str(&fields, name))
    };
    let granted = holder(&mut c).expect("granted to the waiter");
    assert_ne!(granted, "holder");
    drop(acquire); // cancelled with its grant on the way
    eventually("the grant given back", LONG, || holder(&mut c).is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_gives_back_a_lock_granted_on_the_way() {
    a_cancelled_acquire_gives_back_a_grant_that_crossed_it("lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_gives_back_a_write_lock_granted_on_the_way() {
    a_cancelled_acquire_gives_back_a_grant_that_crossed_it("write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_leaves_no_hold_behind() {
    // tokio::time::timeout cancels the acquire about when the holder lets
    // go: granted and returned, or cancelled before or after its grant, the
    // key never stays held by the cancelled owner.
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    for round in 0..12u64 {
        run(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]).unwrap();
        let request = w.lock("k").ttl(Duration::from_secs(60)).wait(LONG);
        let mut acquire = Box::pin(timeout(
            Duration::from_millis(5 * round + 1),
            request.acquire(),
        ));
        let early = tokio::select! {
            r = &mut acquire => Some(r),
            () = eventually("queued", LONG, || waiters_of(&mut c, "LOCK.INFO", "k") == 1) => None,
        };
        let _ = run(&mut c, &["LOCK.RELEASE", "k", "holder"]);
        let got = match early {
            Some(r) => {
                drop(acquire); // a timed-out future is cancelled once dropped
                r
            }
            None => acquire.await,
        };
        if let Ok(guard) = got {
            guard.unwrap().expect("granted").release().await.unwrap();
        }
        eventually("no hold left behind", LONG, || {
            lock_state(&mut c, "k").is_none()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_lock_past_several_leases_and_stops_at_release() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    // 1 s: a shorter lease is lost whenever a busy machine stalls the renewal.
    let ttl = Duration::from_secs(1);
    let started = Instant::now();
    let guard = w
        .lock("k")
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    // Renewals every ttl/3: wait for enough of them to span four leases.
    eventually("twelve renewals", Duration::from_secs(30), || {
        calls(&mut c, "lock.extend") >= 12
    })
    .await;
    assert!(started.elapsed() > ttl * 3);
    let (owner, _, fence) = lock_state(&mut c, "k").expect("still held");
    assert_eq!((owner.as_str(), fence), (guard.owner(), guard.token()));
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let after_release = calls(&mut c, "lock.extend");
    // Two more renewal periods without a single LOCK.EXTEND.
    tokio::time::sleep(ttl).await;
    assert_eq!(calls(&mut c, "lock.extend"), after_release);
    assert!(lock_state(&mut c, "k").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_watched_guard_stops_renewing() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let ttl = Duration::from_millis(300);
    let guard = w
        .lock("k")
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    eventually("a renewal", LONG, || calls(&mut c, "lock.extend") >= 1).await;
    drop(guard);
    eventually("release after drop", LONG, || {
        lock_state(&mut c, "k").is_none()
    })
    .await;
    let after_release = calls(&mut c, "lock.extend");
    tokio::time::sleep(ttl).await;
    assert_eq!(calls(&mut c, "lock.extend"), after_release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_a_lock_taken_away() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let guard = w
        .lock("k")
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
async fn a_paused_server_makes_the_guard_report_loss_within_the_lease() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let ttl = Duration::from_millis(500);
    let guard = w
        .lock("k")
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let mut c = s.conn();
    eventually("a renewal", LONG, || calls(&mut c, "lock.extend") >= 1).await;
    // The server stops answering for 5 s, ten leases.
    let sleeper = std::thread::spawn(move || run(&mut c, &["DEBUG", "SLEEP", "5"]));
    timeout(LONG, guard.lost()).await.expect("loss reported");
    assert!(
        !sleeper.is_finished(),
        "the loss is reported while the server is still paused"
    );
    assert!(
        Instant::now() >= guard.deadline(),
        "not before the lease's safety margin began"
    );
    sleeper.join().unwrap().unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_makes_the_guard_report_loss() {
    let mut s = Server::start(&[]);
    let w = warden(&s);
    let ttl = Duration::from_millis(500);
    let guard = w
        .lock("k")
        .ttl(ttl)
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    s.stop(false);
    timeout(LONG, guard.lost()).await.expect("loss reported");
    assert!(guard.release().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_after_a_restart() {
    let mut s = Server::start(&[]);
    let w = warden(&s);
    w.lock("k")
        .acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    s.restart(false);
    let mut ok = false;
    for _ in 0..3 {
        if let Ok(Some(g)) = w.lock("k").acquire().await {
            g.release().await.unwrap();
            ok = true;
            break;
        }
    }
    assert!(ok, "a broken shared connection is replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_writer_waits_for_them() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let w = w.clone();
            tokio::spawn(async move { w.read_lock("rw").acquire().await.unwrap().unwrap() })
        })
        .collect();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap());
    }
    let other = w.clone();
    let writer =
        tokio::spawn(async move { other.write_lock("rw").wait(LONG).acquire().await.unwrap() });
    let mut c = s.conn();
    wait_queued(&mut c, "RWLOCK.INFO", "rw", 1);
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Release::Released);
    }
    let writer = writer.await.unwrap().expect("granted after the readers");
    let f = map(&mut c, &["RWLOCK.INFO", "rw"]);
    assert_eq!(field_str(&f, "mode"), "write");
    assert_eq!(field_str(&f, "writer"), writer.owner());
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_refused_and_a_read_lease_is_watched() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    let owner = warden_client::Warden::new_owner();
    let read = w
        .read_lock("rw")
        .reentrant(&owner)
        .ttl(Duration::from_millis(300))
        .watchdog(true)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    match w.write_lock("rw").reentrant(&owner).acquire().await {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, "ERR");
            assert!(message.contains("upgrade"), "{message}");
        }
        other => panic!("expected the upgrade error, got {other:?}"),
    }
    eventually("read renewals", LONG, || {
        calls(&mut c, "rwlock.extend") >= 6
    })
    .await;
    assert!(maybe_map(&mut c, &["RWLOCK.INFO", "rw"]).is_some());
    read.release().await.unwrap();
    assert!(maybe_map(&mut c, &["RWLOCK.INFO", "rw"]).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_needs_a_majority_and_survives_two_servers_down() {
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start(&[])).collect();
    let clients = || {
        servers
            .iter()
            .map(|s| redis::Client::open(url(s)).unwrap())
            .collect::<Vec<_>>()
    };
    let ttl = Duration::from_secs(5);
    let a = Redlock::new(clients()).server_timeout(Duration::from_millis(200));
    let b = Redlock::new(clients()).server_timeout(Duration::from_millis(200));
    let held = a.acquire("k", ttl).await.unwrap().expect("all five grant");
    assert_eq!(held.granted(), 5);
    assert!(held.validity() > Duration::ZERO && held.validity() < ttl);
    let tokens: Vec<Option<i64>> = servers
        .iter()
        .map(|s| lock_state(&mut s.conn(), "k").map(|(_, _, fence)| fence))
        .collect();
    assert_eq!(held.tokens(), tokens.as_slice(), "each server's own token");
    assert!(b.acquire("k", ttl).await.unwrap().is_none(), "exclusive");
    assert_eq!(held.release().await, 5);

    servers[0].stop(false);
    servers[1].stop(false);
    let mut held = b.acquire("k", ttl).await.unwrap().expect("three of five");
    assert_eq!(held.granted(), 3);
    assert_eq!(held.tokens()[..2], [None, None]);
    let before = held.valid_until();
    // A longer lease than the first: the new validity lies beyond the old
    // one whatever the two servers down cost in time-outs.
    assert!(held.extend(ttl * 3).await.unwrap(), "a majority extends");
    assert!(held.valid_until() > before);
    assert!(a.acquire("k", ttl).await.unwrap().is_none());
    drop(held);
    for s in &servers[2..] {
        let mut c = s.conn();
        eventually("released everywhere", LONG, || {
            lock_state(&mut c, "k").is_none()
        })
        .await;
    }

    servers[2].stop(false);
    assert!(a.acquire("k", ttl).await.unwrap().is_none(), "two of five");
    for s in &servers[3..] {
        assert!(
            lock_state(&mut s.conn(), "k").is_none(),
            "a failed attempt releases what it got"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_retries_until_the_holder_lets_go() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
    let clients = || {
        servers
            .iter()
            .map(|s| redis::Client::open(url(s)).unwrap())
            .collect::<Vec<_>>()
    };
    let ttl = Duration::from_secs(10);
    let holder = Redlock::new(clients()).server_timeout(Duration::from_millis(500));
    let held = holder.acquire("k", ttl).await.unwrap().unwrap();
    let patient = Redlock::new(clients())
        .server_timeout(Duration::from_millis(500))
        .retries(1_000)
        .retry_delay(Duration::from_millis(20));
    let mut c = servers[0].conn();
    let attempts_before = calls(&mut c, "lock.acquire");
    let waiter = tokio::spawn(async move { patient.acquire("k", ttl).await.unwrap() });
    eventually("two refused attempts", LONG, || {
        calls(&mut c, "lock.acquire") >= attempts_before + 2
    })
    .await;
    assert_eq!(held.release().await, 3);
    let got = timeout(LONG, waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("a retry wins");
    // A quorum: a retry sent while the release was on its way may find one
    // server still held (a busy machine), and wins on the other two.
    assert!(got.granted() >= 2, "granted on {}", got.granted());
    got.release().await;
}

/// Acquire+release pairs per second through the client against raw commands
/// on one connection, in alternating rounds (medians, so that other load on
/// the machine hits all three alike); run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_pairs_per_second() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let client = redis::Client::open(url(&s)).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let n = 2_000;
    let mut rates: [Vec<f64>; 3] = Default::default();
    for _ in 0..9 {
        let started = Instant::now();
        for _ in 0..n {
            let _: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                .arg("raw")
                .arg("raw:1")
                .arg(30_000)
                .query_async(&mut raw)
                .await
                .unwrap();
            let _: i64 = redis::cmd("LOCK.RELEASE")
                .arg("raw")
                .arg("raw:1")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        rates[0].push(n as f64 / started.elapsed().as_secs_f64());
        for (watchdog, rate) in [(false, 1), (true, 2)] {
            let started = Instant::now();
            for _ in 0..n {
                let g = w
                    .lock("client")
                    .watchdog(watchdog)
                    .acquire()
                    .await
                    .unwrap()
                    .unwrap();
                g.release().await.unwrap();
            }
            rates[rate].push(n as f64 / started.elapsed().as_secs_f64());
        }
    }
    let [raw, plain, watched] = rates.map(|mut r| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    });
    println!(
        "pairs/s (median of 9 rounds): raw {raw:.0}, client {plain:.0} ({:.2}x), client with watchdog {watched:.0} ({:.2}x)",
        plain / raw,
        watched / raw
    );
}

/// A release whose connection breaks before the server ran it (writes
/// paused, then `CLIENT KILL`) fails, and is sent once more on a new
/// connection: the key is free, not held by nobody until its lease ends. On
/// warden's own shared connection and on an application's
/// `ConnectionManager`; a lock, a write lock and a semaphore released, and a
/// lock guard dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_off_before_it_runs_is_sent_again() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let ids = |admin: &mut redis::Connection| -> Vec<(String, String)> {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines()
            .filter_map(|l| {
                let id = l.strip_prefix("id=")?.split(' ').next()?.to_string();
                let cmd = l.split(" cmd=").nth(1)?.split(' ').next()?.to_string();
                Some((id, cmd))
            })
            .collect()
    };
    for backend in ["open", "manager"] {
        for kind in ["lock", "write", "semaphore", "dropped lock"] {
            let case = format!("{kind} on {backend}");
            let key = format!("cut:{backend}:{kind}");
            let others: Vec<String> = ids(&mut admin).into_iter().map(|(id, _)| id).collect();
            let w = if backend == "open" {
                warden(&s)
            } else {
                let client = redis::Client::open(url(&s)).unwrap();
                let manager = redis::aio::ConnectionManager::new(client.clone())
                    .await
                    .unwrap();
                warden_client::Warden::with_manager(manager, client)
            };
            let ttl = Duration::from_secs(30);
            // Not started until spawned, after the pause.
            let release: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match kind
            {
                "lock" | "dropped lock" => {
                    let guard = w.lock(&key).ttl(ttl).acquire().await.unwrap().unwrap();
                    if kind == "lock" {
                        Box::pin(async move { guard.release().await.map(|_| ()) })
                    } else {
                        Box::pin(async move {
                            drop(guard);
                            Err(Error::Timeout) // the drop reports nothing
                        })
                    }
                }
                "write" => {
                    let guard = w
                        .write_lock(&key)
                        .ttl(ttl)
                        .acquire()
                        .await
                        .unwrap()
                        .unwrap();
                    Box::pin(async move { guard.release().await.map(|_| ()) })
                }
                _ => {
                    let guard = w
                        .semaphore(&key, 2)
                        .ttl(ttl)
                        .acquire()
                        .await
                        .unwrap()
                        .unwrap();
                    Box::pin(async move { guard.release().await.map(|_| ()) })
                }
            };
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(20_000)
                .arg("WRITE")
                .query(&mut admin)
                .unwrap();
            let release = tokio::spawn(release);
            // This Warden's connections whose last command is warden's, once
            // one of them shows the release, postponed by the pause (CLIENT
            // KILL is no write).
            let deadline = Instant::now() + LONG;
            let (releasing, mine) = loop {
                let listed: Vec<(String, String)> = ids(&mut admin)
                    .into_iter()
                    .filter(|(id, cmd)| {
                        !others.contains(id)
                            && ["lock.", "rwlock.", "sem."]
                                .iter()
                                .any(|p| cmd.starts_with(p))
                    })
                    .collect();
                let releasing = listed.iter().any(|(_, cmd)| {
                    ["lock.release", "rwlock.unlock", "sem.release"].contains(&cmd.as_str())
                });
                if releasing || Instant::now() > deadline {
                    let ids: Vec<String> = listed.into_iter().map(|(id, _)| id).collect();
                    break (releasing, ids);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert!(releasing, "{case}: no release postponed by the pause");
            for id in &mine {
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(id)
                    .query(&mut admin)
                    .unwrap();
            }
            let outcome = timeout(LONG, release).await.expect(&case).unwrap();
            assert!(
                outcome.is_err(),
                "{case}: the release did not fail: {outcome:?} killed {mine:?}"
            );
            let held: i64 = redis::cmd("EXISTS").arg(&key).query(&mut admin).unwrap();
            let _: () = redis::cmd("CLIENT")
                .arg("UNPAUSE")
                .query(&mut admin)
                .unwrap();
            assert_eq!(held, 1, "{case}: the first release ran");
            eventually(&format!("{case}: the release sent again"), LONG, || {
                redis::cmd("EXISTS")
                    .arg(&key)
                    .query::<i64>(&mut admin)
                    .unwrap()
                    == 0
            })
            .await;
        }
    }
}

/// A release sent again never ends a hold it did not take: once another
/// acquire has named a fresh owner (`reentrant(guard.owner())`: a re-entry,
/// a read under its own write), that owner's release is not sent again. The
/// release times out client-side behind a write pause and runs once the
/// pause ends (its reply lost to the caller); a second release would end the
/// other hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_not_sent_again_for_an_owner_another_acquire_named() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let w = warden(&s).with_config(
        warden_client::Config::builder()
            .command_timeout(Duration::from_millis(300))
            .build(),
    );
    let ttl = Duration::from_secs(30);
    for (kind, dropped) in [
        ("lock", false),
        ("lock", true),
        ("write", false),
        ("write", true),
    ] {
        let case = format!("{kind}, dropped: {dropped}");
        let key = format!("lent:{kind}:{dropped}");
        let (first, second) = if kind == "lock" {
            let first = w.lock(&key).ttl(ttl).acquire().await.unwrap().unwrap();
            let second = w.lock(&key).ttl(ttl).reentrant(first.owner());
            (first, second.acquire().await.unwrap().expect(&case))
        } else {
            let first = w
                .write_lock(&key)
                .ttl(ttl)
                .acquire()
                .await
                .unwrap()
                .unwrap();
            let second = w.read_lock(&key).ttl(ttl).reentrant(first.owner());
            (first, second.acquire().await.unwrap().expect(&case))
        };
        let before = calls(&mut admin, "lock.release") + calls(&mut admin, "rwlock.unlock");
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1_500)
            .arg("WRITE")
            .query(&mut admin)
            .unwrap();
        if dropped {
            drop(first);
        } else {
            let outcome = first.release().await;
            assert!(
                matches!(outcome, Err(Error::Timeout)),
                "{case}: {outcome:?}"
            );
        }
        // The pause ends: the first release runs; any second one would too.
        eventually(&format!("{case}: the release ran"), LONG, || {
            calls(&mut admin, "lock.release") + calls(&mut admin, "rwlock.unlock") > before
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1_500)).await; // a re-send's backoff and more
        let released = calls(&mut admin, "lock.release") + calls(&mut admin, "rwlock.unlock");
        assert_eq!(released - before, 1, "{case}: the release was sent again");
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut admin).unwrap();
        assert_eq!(exists, 1, "{case}: the other hold was ended");
        second.release().await.unwrap();
    }
}
