//! Deadlines and overload: free capacity granted on the shared connection,
//! the `WAIT` sent is what remains of the caller's deadline, no grant reaches
//! a caller after it, cancelled waits leave the queue and leave no grant,
//! many waiters need no pool setting, and `max_queue` sheds — against real
//! servers with the module.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use support::*;
use tokio::time::{timeout, Instant};
use warden_client::{Error, Warden};

const LONG: Duration = Duration::from_secs(10);

/// The kinds of acquire a test runs over, with the commands that hold,
/// release and inspect a key of that kind from a plain connection.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Lock,
    Write,
    Semaphore,
}

const KINDS: [Kind; 3] = [Kind::Lock, Kind::Write, Kind::Semaphore];

impl Kind {
    fn acquire_cmd(self) -> &'static str {
        match self {
            Kind::Lock => "LOCK.ACQUIRE",
            Kind::Write => "RWLOCK.WRITE",
            Kind::Semaphore => "SEM.ACQUIRE",
        }
    }

    fn info_cmd(self) -> &'static str {
        match self {
            Kind::Lock => "LOCK.INFO",
            Kind::Write => "RWLOCK.INFO",
            Kind::Semaphore => "SEM.INFO",
        }
    }

    /// Holds `key` as `holder` from a plain connection (a semaphore of limit 1).
    fn hold(self, c: &mut redis::Connection, key: &str, holder: &str) {
        let mut words = vec![self.acquire_cmd(), key, holder, "60000"];
        if let Kind::Semaphore = self {
            words.extend(["LIMIT", "1"]);
        }
        assert!(
            !matches!(run(c, &words).unwrap(), Value::Nil),
            "{self:?} held"
        );
    }

    fn release(self, c: &mut redis::Connection, key: &str, holder: &str) {
        let verb = match self {
            Kind::Lock => "LOCK.RELEASE",
            Kind::Write => "RWLOCK.UNLOCK",
            Kind::Semaphore => "SEM.RELEASE",
        };
        assert_eq!(int(c, &[verb, key, holder]), 1, "{self:?} released");
    }

    /// Whether anyone holds `key`.
    fn held(self, c: &mut redis::Connection, key: &str) -> bool {
        maybe_map(c, &[self.info_cmd(), key]).is_some_and(|f| match self {
            Kind::Semaphore => field_int(&f, "used") > 0,
            Kind::Lock => !matches!(reply_field(&f, "owner"), Value::Nil),
            Kind::Write => !matches!(reply_field(&f, "writer"), Value::Nil),
        })
    }

    fn waiters(self, c: &mut redis::Connection, key: &str) -> i64 {
        waiters_of(c, self.info_cmd(), key)
    }

    /// An acquire of `key` through `w` (a semaphore of limit 1), waiting up
    /// to `wait`, with `max_queue` if given; the token when granted.
    async fn acquire(
        self,
        w: &Warden,
        key: &str,
        wait: Duration,
        max_queue: Option<u64>,
    ) -> warden_client::Result<Option<i64>> {
        match self {
            Kind::Lock | Kind::Write => {
                let mut r = match self {
                    Kind::Lock => w.lock(key),
                    _ => w.write_lock(key),
                };
                r = r.ttl(Duration::from_secs(60)).wait(wait);
                if let Some(n) = max_queue {
                    r = r.max_queue(n);
                }
                Ok(r.acquire().await?.map(|g| {
                    let token = g.token();
                    std::mem::forget(g); // held until the test's checks
                    token
                }))
            }
            Kind::Semaphore => {
                let mut s = w.semaphore(key, 1).ttl(Duration::from_secs(60)).wait(wait);
                if let Some(n) = max_queue {
                    s = s.max_queue(n);
                }
                Ok(s.acquire().await?.map(|g| {
                    let token = g.token();
                    std::mem::forget(g);
                    token
                }))
            }
        }
    }
}

fn reply_field(fields: &[(String, Value)], name: &str) -> Value {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map_or(Value::Nil, |(_, v)| v.clone())
}

fn connected_clients(c: &mut redis::Connection) -> i64 {
    info_int(c, "clients", "connected_clients")
}

/// The `WAIT` arguments of the commands named `command` in the slow log
/// (the server logs every command: `slowlog-log-slower-than 0`).
fn waits_sent(c: &mut redis::Connection, command: &str) -> Vec<i64> {
    let Value::Array(entries) = run(c, &["SLOWLOG", "GET", "1000"]).unwrap() else {
        panic!("SLOWLOG GET answers an array");
    };
    let mut waits = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else {
            continue;
        };
        let Some(Value::Array(args)) = fields.get(3) else {
            continue;
        };
        let args: Vec<String> = args.iter().map(reply_text).collect();
        if !args[0].eq_ignore_ascii_case(command) {
            continue;
        }
        if let Some(i) = args.iter().position(|a| a.eq_ignore_ascii_case("WAIT")) {
            waits.push(args[i + 1].parse().unwrap());
        }
    }
    waits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_capacity_is_granted_without_a_waiter_connection() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    let before = connected_clients(&mut c);
    for kind in KINDS {
        // A burst at once: none of them needs a connection of its own.
        let burst = (0..8).map(|i| {
            let (w, key) = (w.clone(), format!("{kind:?}:{i}"));
            async move { kind.acquire(&w, &key, LONG, None).await }
        });
        for got in futures_util::future::join_all(burst).await {
            assert!(got.unwrap().is_some(), "{kind:?}: free, so granted");
        }
    }
    assert_eq!(
        connected_clients(&mut c),
        before + 1,
        "only the shared connection was opened"
    );
}

/// Every reply comes back through a proxy 150 ms late: by the time the
/// waiting request goes out, the try before it (and the waiter connection's
/// set-up) has used some of the deadline, and the `WAIT` sent is less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_sent_is_what_remains_of_the_deadline() {
    let s = Server::start(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "1000",
    ]);
    let mut c = s.conn();
    let proxy = Proxy::start(&s);
    let w = Warden::open(&proxy.url()).unwrap();
    let delay = Duration::from_millis(150);
    proxy.delay_replies(delay);
    let deadline = Duration::from_millis(1500);
    for kind in KINDS {
        let key = format!("{kind:?}");
        kind.hold(&mut c, &key, "holder");
        let called = Instant::now();
        let got = kind.acquire(&w, &key, deadline, None).await.unwrap();
        assert_eq!(got, None, "{kind:?}: held throughout");
        let waits = waits_sent(&mut c, kind.acquire_cmd());
        assert_eq!(waits.len(), 1, "{kind:?}: one waiting request: {waits:?}");
        let wait = waits[0];
        assert!(
            wait > 0 && wait <= (deadline - delay).as_millis() as i64,
            "{kind:?}: WAIT {wait} after at least {delay:?} of a {deadline:?} deadline"
        );
        assert!(called.elapsed() >= Duration::from_millis(wait as u64));
        assert_eq!(kind.waiters(&mut c, &key), 0);
        run(&mut c, &["SLOWLOG", "RESET"]).unwrap();
    }
    // The cache's wait for another's fill, likewise.
    let mut filler = s.conn();
    let lease = run(&mut filler, &["CACHE.GET", "page", "60000"]).unwrap();
    assert!(matches!(lease, Value::Array(ref v) if v[1] != Value::Nil));
    let got = w
        .cache()
        .wait(deadline)
        .get_or_load("page", Duration::from_secs(1), || async {
            Ok::<_, std::io::Error>("loaded".to_string())
        })
        .await;
    assert!(matches!(got, Err(Error::WaitTimedOut)), "{got:?}");
    let waits = waits_sent(&mut c, "CACHE.GET");
    assert!(
        waits
            .iter()
            .all(|&w| w > 0 && w <= (deadline - delay).as_millis() as i64)
            && !waits.is_empty(),
        "cache: WAIT {waits:?} after at least {delay:?} of a {deadline:?} wait"
    );
}

/// The grant is made within the deadline, but its reply is held up past it:
/// the caller gets `None` and the grant is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_reaches_the_caller_after_its_deadline_is_given_back() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for kind in KINDS {
        let proxy = Proxy::start(&s);
        let w = Warden::open(&proxy.url()).unwrap();
        let key = format!("{kind:?}");
        kind.hold(&mut c, &key, "holder");
        let acquire = tokio::spawn({
            let key = key.clone();
            async move {
                kind.acquire(&w, &key, Duration::from_millis(800), None)
                    .await
            }
        });
        eventually("queued", LONG, || kind.waiters(&mut c, &key) == 1).await;
        proxy.delay_replies(Duration::from_millis(1500));
        kind.release(&mut c, &key, "holder");
        assert!(kind.held(&mut c, &key), "{kind:?}: granted to the waiter");
        let got = timeout(LONG, acquire).await.unwrap().unwrap().unwrap();
        assert_eq!(got, None, "{kind:?}: the caller had given up");
        eventually("the late grant given back", LONG, || {
            !kind.held(&mut c, &key)
        })
        .await;
    }
}

/// A wait cancelled while queued leaves the queue at once and nobody is
/// granted. `WARDEN.WITHDRAW` takes it out on every server and its
/// connection stays open for the next wait; where the user may not send it
/// (an ACL, as for a module before 1.1.0) `CLIENT UNBLOCK` does on Redis
/// 7.4+ and Valkey 8+ (the connection stays), elsewhere the connection is
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue_and_no_grant() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let unblock = unblock_ends_wait(&mut c);
    let acl = "ACL SETUSER nowithdraw on >pw ~* &* +@all -warden.withdraw";
    run(&mut c, &acl.split(' ').collect::<Vec<_>>()).unwrap();
    let denied = format!("{}?user=nowithdraw&pass=pw", url(&s));
    for (case, url, withdraw) in [
        ("withdraw", url(&s), true),
        ("acl denies it", denied, false),
    ] {
        let w = Warden::open(&url).expect("client");
        // The shared connection, open before anything is counted.
        assert!(w.lock("warm").acquire().await.unwrap().is_some());
        for kind in KINDS {
            let key = format!("{kind:?}");
            kind.hold(&mut c, &key, "holder");
            let clients = connected_clients(&mut c);
            let waiter = tokio::spawn({
                let (w, key) = (w.clone(), key.clone());
                async move { kind.acquire(&w, &key, LONG, None).await }
            });
            eventually("queued", LONG, || kind.waiters(&mut c, &key) == 1).await;
            let opened = connected_clients(&mut c) - clients;
            waiter.abort();
            eventually("out of the queue", LONG, || kind.waiters(&mut c, &key) == 0).await;
            kind.release(&mut c, &key, "holder");
            assert!(
                !kind.held(&mut c, &key),
                "{case} {kind:?}: nobody was granted"
            );
            // The waiter's connection (new, or from the idle pool) stays or goes.
            let kept = if withdraw || unblock {
                opened
            } else {
                opened - 1
            };
            eventually(
                &format!("{case} {kind:?}: connection kept or closed"),
                LONG,
                || connected_clients(&mut c) == clients + kept,
            )
            .await;
            // The next wait of this client finds a connection as before.
            kind.hold(&mut c, &key, "holder");
            let again = kind
                .acquire(&w, &key, Duration::from_millis(50), None)
                .await;
            assert_eq!(again.unwrap(), None, "{case} {kind:?}");
            kind.release(&mut c, &key, "holder");
        }
        run(&mut c, &["DEL", "warm"]).unwrap();
    }
}

/// The acquire future is dropped after the server granted it and before its
/// reply was read (`CLIENT UNBLOCK` then finds nothing blocked): the grant
/// is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_raced_the_cancel_is_given_back() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    for kind in KINDS {
        let key = format!("{kind:?}");
        kind.hold(&mut c, &key, "holder");
        let mut acquire = Box::pin(kind.acquire(&w, &key, LONG, None));
        tokio::select! {
            r = &mut acquire => panic!("granted while held: {r:?}"),
            () = eventually("queued", LONG, || kind.waiters(&mut c, &key) == 1) => {}
        }
        // Nobody polls the acquire any more: the grant below is never read.
        kind.release(&mut c, &key, "holder");
        assert!(kind.held(&mut c, &key), "{kind:?}: granted to the waiter");
        drop(acquire);
        eventually("the grant given back", LONG, || !kind.held(&mut c, &key)).await;
    }
}

/// Callers arrive faster than the holders leave and give up by dropping
/// their acquire (`tokio::time::timeout` around a wait without end): every
/// cancellation races grants, and none leaves a permit held behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_under_overload_leave_nothing_held() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    let start = Instant::now();
    let tasks: Vec<_> = (0..150u32)
        .map(|i| {
            let sem = w.semaphore("k", 2).ttl(Duration::from_secs(60));
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(u64::from(i))).await;
                let got = timeout(Duration::from_millis(20), sem.acquire()).await;
                if let Ok(got) = got {
                    let guard = got.unwrap().expect("a wait without end is granted");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    eventually("nothing held, nobody waiting", LONG, || {
        !Kind::Semaphore.held(&mut c, "k") && Kind::Semaphore.waiters(&mut c, "k") == 0
    })
    .await;
}

/// 300 callers wait at once with the default settings: no connection or
/// pool error, each granted in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_waiters_need_no_pool_setting() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    Kind::Semaphore.hold(&mut c, "k", "holder");
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let sem = w.semaphore("k", 1).wait(Duration::from_secs(60));
            tokio::spawn(async move {
                let guard = sem.acquire().await?.expect("granted in turn");
                guard.release().await
            })
        })
        .collect();
    eventually("300 queued", Duration::from_secs(30), || {
        Kind::Semaphore.waiters(&mut c, "k") == 300
    })
    .await;
    Kind::Semaphore.release(&mut c, "k", "holder");
    for t in tasks {
        timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert!(!Kind::Semaphore.held(&mut c, "k"));
}

/// Callers arrive faster than the holders leave, each with a short
/// deadline: no grant ever reaches one after its deadline (a generous
/// slack for the test's own clock reading), never more than the limit
/// inside, no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_overload_no_grant_reaches_a_caller_past_its_deadline() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let deadline = Duration::from_millis(30);
    let slack = Duration::from_millis(10);
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..120u32)
        .map(|i| {
            let sem = w.semaphore("k", 2).wait(deadline);
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(u64::from(i))).await;
                let called = Instant::now();
                let Some(guard) = sem.acquire().await.unwrap() else {
                    return false;
                };
                let late = called.elapsed() > deadline + slack;
                most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
                assert!(!late, "granted {:?} after the call", called.elapsed());
                true
            })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        granted += u32::from(t.await.unwrap());
    }
    assert!(granted > 0);
    assert!(most.load(Ordering::SeqCst) <= 2);
}

/// `max_queue(n)`: with `n` requests waiting, the next answers `None` at
/// once and is counted as shed; with fewer it queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_queue_sheds_requests_past_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    for kind in KINDS {
        let key = format!("{kind:?}");
        kind.hold(&mut c, &key, "holder");
        let queued: Vec<_> = (0..2)
            .map(|_| {
                let (w, key) = (w.clone(), key.clone());
                tokio::spawn(async move { kind.acquire(&w, &key, LONG, None).await })
            })
            .collect();
        eventually("2 queued", LONG, || kind.waiters(&mut c, &key) == 2).await;
        let shed_before = warden_stat(&mut c, "shed");
        let got = kind.acquire(&w, &key, LONG, Some(2)).await.unwrap();
        assert_eq!(got, None, "{kind:?}: shed");
        assert_eq!(warden_stat(&mut c, "shed"), shed_before + 1);
        assert_eq!(kind.waiters(&mut c, &key), 2, "not queued");
        let third = tokio::spawn({
            let (w, key) = (w.clone(), key.clone());
            async move { kind.acquire(&w, &key, LONG, Some(3)).await }
        });
        eventually("3 queued", LONG, || kind.waiters(&mut c, &key) == 3).await;
        for t in queued.into_iter().chain([third]) {
            t.abort();
        }
        eventually("queue empty", LONG, || kind.waiters(&mut c, &key) == 0).await;
        kind.release(&mut c, &key, "holder");
    }
}

/// A key of another type stays a `WRONGTYPE` error, with or without a wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_stays_a_wrongtype_error() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let w = warden(&s);
    run(&mut c, &["SET", "k", "a string"]).unwrap();
    for kind in KINDS {
        for wait in [Duration::ZERO, Duration::from_millis(200)] {
            let got = kind.acquire(&w, "k", wait, None).await;
            assert!(
                matches!(&got, Err(Error::Server { code, .. }) if code == "WRONGTYPE"),
                "{kind:?} wait {wait:?}: {got:?}"
            );
        }
    }
}
