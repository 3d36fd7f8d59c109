//! The README's Rust client example, verbatim between the markers (the
//! tests check that it still matches, and run this against a real server at
//! `REDIS_URL`).

use std::time::Duration;

async fn write_order(fence: i64) -> Result<(), std::io::Error> {
    println!("ledger:42 written with fence {fence}");
    Ok(())
}

async fn load_name(id: u64) -> Result<String, std::io::Error> {
    Ok(format!("Ada #{id}"))
}

#[rustfmt::skip]
async fn readme(url: &str) -> Result<String, Box<dyn std::error::Error>> {
    // README begin
    use warden_client::Warden;

    let warden = Warden::open(url)?;               // redis://host/, rediss://host/ with a TLS feature
    if let Some(guard) = warden.lock("ledger:42").ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5)).watchdog(true).acquire().await?
    {
        tokio::select! {
            r = write_order(guard.token()) => r?,          // the store rejects lower fences
            _ = guard.lost() => return Err("lost ledger:42".into()), // lost, or about to be: stop
        }
        guard.release().await?;                        // the watchdog stops before the release is sent
    }
    let name: String = warden.cache().ttl(Duration::from_secs(60)).jitter(Duration::from_secs(6))
        .get_or_load("user:42:name", Duration::from_secs(2), || load_name(42)).await?;
    // README end
    Ok(name)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://localhost:6379".into());
    let name = readme(&url).await?;
    println!("user:42:name = {name}");
    Ok(())
}
