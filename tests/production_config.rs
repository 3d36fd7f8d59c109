//! `redis.conf.example` is safe by default: its `warden.max-lease`,
//! `warden.grace` and `min-replicas-max-lag` satisfy the rule of the README's
//! "Failover and restarts", and a server started on it refuses new holders
//! in the window after its start and leases above the cap.

mod common;

use common::*;

fn example_lines() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/redis.conf.example");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap_or((l, ""));
            (name.to_string(), value.trim().to_string())
        })
        .collect()
}

/// A setting the example sets (not in a comment), in ms or s as written.
fn setting(name: &str) -> Option<i64> {
    example_lines()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.parse().unwrap())
}

#[test]
fn the_example_config_satisfies_the_safety_rule() {
    let max_lease = setting("warden.max-lease").expect("warden.max-lease is set");
    let grace = setting("warden.grace").expect("warden.grace is set");
    // Redis' default when the file leaves it out.
    let lag_s = setting("min-replicas-max-lag").unwrap_or(10);
    assert!(max_lease > 0, "a lease cap: {max_lease}");
    assert!(
        grace >= max_lease + lag_s * 1000,
        "grace {grace} < max-lease {max_lease} + min-replicas-max-lag {lag_s} s"
    );
}

#[test]
fn a_server_on_the_example_config_opens_a_window_and_caps_leases() {
    // The file's settings as the server reads them, but the harness's own
    // port, address and directory.
    let mut args = Vec::new();
    for (name, value) in example_lines() {
        if !["port", "bind", "dir", "protected-mode", "loadmodule"].contains(&name.as_str()) {
            args.push(format!("--{name}"));
            args.push(value);
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start(&args);
    let mut c = s.conn();
    for name in ["warden.max-lease", "warden.grace", "min-replicas-max-lag"] {
        let got: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(&mut c)
            .unwrap();
        assert_eq!(got[1], setting(name).unwrap().to_string(), "{name}");
    }
    assert!(
        warden_stat(&mut c, "grace_remaining_ms") > 0,
        "a window opened at the start"
    );
    assert!(
        is_nil(&mut c, &["LOCK.ACQUIRE", "k", "a", "10000"]),
        "no new holder inside the window"
    );
    assert!(
        err(&mut c, &["LOCK.ACQUIRE", "k", "a", "30001"])
            .starts_with("ERR ttl exceeds warden.max-lease"),
        "a lease above the cap is refused"
    );
    // Everything else is served as usual.
    run(&mut c, &["SET", "plain", "1"]).unwrap();
    assert_eq!(int(&mut c, &["BF.ADD", "f", "x"]), 1);
}
