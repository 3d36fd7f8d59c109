//! `get_or_load` against a real redis-server with the module.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use warden_client::Error;

const LONG: Duration = Duration::from_secs(10);

fn cache_field(c: &mut redis::Connection, key: &str, name: &str) -> redis::Value {
    let f = map(c, &["CACHE.INFO", key]);
    f.into_iter().find(|(k, _)| k == name).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_misses_load_once() {
    let s = Server::start(&[]);
    let cache = warden(&s).cache().ttl(Duration::from_secs(60));
    let loads = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..40)
        .map(|_| {
            let cache = cache.clone();
            let loads = loads.clone();
            tokio::spawn(async move {
                cache
                    .get_or_load("hot", Duration::from_secs(5), move || async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>("value".to_string())
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap(), "value");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    let mut c = s.conn();
    let stored: String = redis::cmd("GET").arg("hot").query(&mut c).unwrap();
    assert_eq!(stored, "value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_hands_the_lease_to_a_waiter() {
    let s = Server::start(&[]);
    let cache = warden(&s).cache();
    let lease = Duration::from_secs(5);
    let sock = s.socket();
    let first = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load("k", lease, move || async move {
                    // Fail only once the second caller waits behind this lease.
                    let mut c = redis::Client::open(format!("redis+unix://{}", sock.display()))
                        .unwrap()
                        .get_connection()
                        .unwrap();
                    eventually("a waiter", LONG, || {
                        field_int(&map(&mut c, &["CACHE.INFO", "k"]), "waiters") == 1
                    })
                    .await;
                    Err::<String, _>(std::io::Error::other("database down"))
                })
                .await
        })
    };
    let mut c = s.conn();
    eventually("the first lease", LONG, || {
        cache_field(&mut c, "k", "lease") != redis::Value::Nil
    })
    .await;
    let second = cache
        .get_or_load("k", lease, || async {
            Ok::<_, std::io::Error>("loaded".to_string())
        })
        .await
        .unwrap();
    assert_eq!(second, "loaded");
    match first.await.unwrap() {
        Err(Error::Loader(e)) => assert_eq!(e.to_string(), "database down"),
        other => panic!("expected the loader's error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_loader_ends_its_lease() {
    let s = Server::start(&[]);
    let cache = warden(&s).cache();
    let stuck = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load("k", Duration::from_secs(600), || async {
                    std::future::pending::<Result<String, std::io::Error>>().await
                })
                .await
        })
    };
    let mut c = s.conn();
    eventually("the lease", LONG, || {
        cache_field(&mut c, "k", "lease") != redis::Value::Nil
    })
    .await;
    stuck.abort();
    let v = tokio::time::timeout(
        LONG,
        cache.get_or_load("k", Duration::from_secs(5), || async {
            Ok::<_, std::io::Error>("next".to_string())
        }),
    )
    .await
    .expect("not held for the 600 s lease")
    .unwrap();
    assert_eq!(v, "next");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fills_carry_the_ttl_and_its_jitter() {
    let s = Server::start(&[]);
    let cache = warden(&s)
        .cache()
        .ttl(Duration::from_secs(10))
        .jitter(Duration::from_secs(1));
    for i in 0..20 {
        let key = format!("k{i}");
        let v: Vec<u8> = cache
            .get_or_load(&key, Duration::from_secs(5), || async {
                Ok::<_, std::io::Error>(vec![0u8, 1, 2])
            })
            .await
            .unwrap();
        assert_eq!(v, vec![0, 1, 2]);
        let pttl = int(&mut s.conn(), &["PTTL", &key]);
        assert!((9_000..=11_000).contains(&pttl), "{pttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_ahead_serves_the_value_and_reloads_in_the_background() {
    let s = Server::start(&[]);
    let w = warden(&s);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "old", "PX", "5000"]).unwrap();
    let cache = w
        .cache()
        .ttl(Duration::from_secs(60))
        .refresh(Duration::from_secs(10));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let v = cache
        .get_or_load("k", Duration::from_secs(5), move || async move {
            let _ = rx.await; // the reload finishes only when the test says so
            Ok::<_, std::io::Error>("new".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "old", "served at once while reloading");
    tx.send(()).unwrap();
    eventually("the background fill", LONG, || {
        redis::cmd("GET").arg("k").query::<String>(&mut c).unwrap() == "new"
    })
    .await;
    assert!(int(&mut c, &["PTTL", "k"]) > 50_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_without_a_fill_is_an_error() {
    let s = Server::start(&[]);
    let cache = warden(&s).cache().wait(Duration::from_millis(50));
    let mut c = s.conn();
    // Someone else holds the lease (on a connection kept open).
    let token = match run(&mut c, &["CACHE.GET", "k", "60000"]).unwrap() {
        redis::Value::Array(v) => v[1].clone(),
        other => panic!("{other:?}"),
    };
    assert_ne!(token, redis::Value::Nil);
    let r = cache
        .get_or_load("k", Duration::from_secs(5), || async {
            Ok::<_, std::io::Error>("x".to_string())
        })
        .await;
    assert!(matches!(r, Err(Error::WaitTimedOut)), "{r:?}");
}
