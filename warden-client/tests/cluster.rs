//! Through a cluster client, on a local Redis Cluster.

mod support;

use std::time::Duration;

use support::*;
use warden_client::{Release, Warden};

const LONG: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_cache_read_through_the_cluster_client() {
    let cluster = Cluster::start(3, 0);
    let w = Warden::cluster(cluster.client());
    // Keys on different masters: each command is routed to its key's.
    for key in ["order:1", "order:2", "order:3", "{user:7}:lock"] {
        let guard = w.lock(key).watchdog(true).acquire().await.unwrap().unwrap();
        let mut c = cluster.master_of(key).conn();
        assert_eq!(lock_state(&mut c, key).unwrap().0, guard.owner());
        // A waiter on its own connection, granted at the release.
        let waiter = tokio::spawn({
            let w = w.clone();
            let key = key.to_string();
            async move { w.lock(key).wait(LONG).acquire().await.unwrap() }
        });
        wait_queued(&mut c, "LOCK.INFO", key, 1);
        let first = guard.token();
        assert_eq!(guard.release().await.unwrap(), Release::Released);
        let next = waiter.await.unwrap().expect("handed off");
        assert!(next.token() > first);
        assert_eq!(next.release().await.unwrap(), Release::Released);
        assert!(lock_state(&mut c, key).is_none());
    }
    let cache = w.cache().ttl(Duration::from_secs(60));
    for key in ["user:1:name", "user:2:name", "user:3:name"] {
        let v: String = cache
            .get_or_load(key, Duration::from_secs(5), || async {
                Ok::<_, std::io::Error>("Ada".to_string())
            })
            .await
            .unwrap();
        assert_eq!(v, "Ada");
        let mut c = cluster.master_of(key).conn();
        let stored: String = redis::cmd("GET").arg(key).query(&mut c).unwrap();
        assert_eq!(stored, "Ada");
        // A hit now: the loader is not called.
        let hit: String = cache
            .get_or_load(key, Duration::from_secs(5), || async {
                Err::<String, _>(std::io::Error::other("not called on a hit"))
            })
            .await
            .unwrap();
        assert_eq!(hit, "Ada");
    }
}
