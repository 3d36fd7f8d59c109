//! The README's redis-rs example (a lock taken with plain redis-rs, without
//! warden-client), verbatim between the markers: the tests check that it
//! still matches, and run it against a real server at `REDIS_URL`.

use std::time::Duration;

#[rustfmt::skip]
fn readme(url: &str) -> redis::RedisResult<()> {
    // README begin
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection()?;                   // this waiter's own connection
    con.set_read_timeout(Some(Duration::from_secs(10)))?;     // above the WAIT
    let owner = uuid::Uuid::new_v4().to_string();             // a fresh owner per acquisition
    let fence: Option<i64> = redis::cmd("LOCK.ACQUIRE").arg("batch:42").arg(&owner).arg(30_000)
        .arg("WAIT").arg(5_000).query(&mut con)?;             // sent once: redis-rs never re-sends
    if let Some(fence) = fence {
        println!("writing batch 42 with fence {fence}");      // the store rejects lower fences
        let _: i64 = redis::cmd("LOCK.RELEASE").arg("batch:42").arg(&owner).query(&mut con)?;
    }
    // README end
    Ok(())
}

fn main() -> redis::RedisResult<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://localhost:6379".into());
    readme(&url)
}
