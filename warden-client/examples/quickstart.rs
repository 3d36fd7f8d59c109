//! A lock with a watchdog, a read-write lock and a cache read, against the
//! server at `REDIS_URL` (default `redis://localhost:6379`). The test suite runs it.

use std::time::Duration;

use warden_client::{Release, Warden};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://localhost:6379".into());
    let warden = Warden::open(&url)?;

    // An exclusive lock, renewed while held, waiting up to 5 s if busy.
    let guard = warden
        .lock("order:42")
        .ttl(Duration::from_millis(600))
        .wait(Duration::from_secs(5))
        .watchdog(true)
        .acquire()
        .await?
        .ok_or("order:42 stayed busy")?;
    println!("order:42 held with fence {}", guard.token());
    tokio::select! {
        _ = guard.lost() => return Err("lost order:42".into()),
        // Work longer than the lease: the watchdog keeps it.
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    assert_eq!(guard.release().await?, Release::Released);

    // Readers share a read-write lock; a writer then gets it alone.
    let read = warden.read_lock("catalog").acquire().await?.ok_or("busy")?;
    read.release().await?;
    let write = warden
        .write_lock("catalog")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    drop(write); // released in the background

    // One load per key, whoever asks; the value lives 60 s (+ up to 6 s).
    let cache = warden
        .cache()
        .ttl(Duration::from_secs(60))
        .jitter(Duration::from_secs(6));
    let name: String = cache
        .get_or_load("user:42:name", Duration::from_secs(2), || async {
            Ok::<_, std::io::Error>("Ada".to_string())
        })
        .await?;
    println!("user:42:name = {name}");
    Ok(())
}
