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

/// The file's settings as the server reads them, but the harness's own
/// port, address and directory.
fn example_args() -> Vec<String> {
    let mut args = Vec::new();
    for (name, value) in example_lines() {
        if !["port", "bind", "dir", "protected-mode", "loadmodule"].contains(&name.as_str()) {
            args.push(format!("--{name}"));
            args.push(value);
        }
    }
    args
}

/// The lines the file comments out under "A single server, no replicas".
fn single_server_lines() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/redis.conf.example");
    let text = std::fs::read_to_string(path).unwrap();
    let block = text
        .split("# A single server, no replicas")
        .nth(1)
        .expect("the single-server block");
    // The comment's text, then the settings themselves: `# name value`.
    block
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["#", name, value] => Some((name.to_string(), value.to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_server_on_the_example_single_server_lines_restarts_without_a_window() {
    let lines = single_server_lines();
    assert_eq!(
        lines,
        [
            ("appendfsync".to_string(), "always".to_string()),
            ("warden.grace".to_string(), "auto".to_string())
        ]
    );
    let mut args = example_args();
    for (name, value) in &lines {
        args.push(format!("--{name}"));
        args.push(value.clone());
    }
    // A short cap, so that the first start's window (cap + lag + 1 s) is short.
    args.extend(["--warden.max-lease", "5000", "--min-replicas-max-lag", "1"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = Server::start(&args);
    wait_for(
        "the first start's window",
        std::time::Duration::from_secs(30),
        || warden_stat(&mut s.conn(), "grace_remaining_ms") == 0,
    );
    assert!(int(&mut s.conn(), &["LOCK.ACQUIRE", "held", "a", "5000"]) > 0);
    s.restart(false);
    let mut c = s.conn();
    assert!(
        int(&mut c, &["LOCK.ACQUIRE", "free", "b", "5000"]) > 0,
        "the next holder at once: {}",
        s.log()
    );
    assert_eq!(
        lock_state(&mut c, "held").map(|(owner, ..)| owner),
        Some("a".into())
    );
}

#[test]
fn a_server_on_the_example_config_opens_a_window_and_caps_leases() {
    let args = example_args();
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
