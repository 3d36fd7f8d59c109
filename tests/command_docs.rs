//! docs/commands.md and the running server describe the same commands:
//! the same names; per command the same summary, complexity, "since", flags
//! and syntax as `COMMAND DOCS` / `COMMAND INFO` report; every error text of
//! src/error.rs documented; and every example session, run against a fresh
//! server, answers what the page shows.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const REFERENCE: &str = include_str!("../docs/commands.md");
const ERROR_TEXTS: &str = include_str!("../src/error.rs");

// ---------------------------------------------------------------------------
// The page

/// One `### NAME` section of the page.
#[derive(Debug, Default)]
struct Section {
    name: String,
    syntax: String,
    summary: String,
    complexity: String,
    flags: BTreeSet<String>,
    tips: BTreeSet<String>,
    since: String,
    arguments: Vec<String>,
    /// Argument label → the version its line says added it ("(since X)").
    added: BTreeMap<String, String>,
    examples: Vec<Example>,
}

#[derive(Debug)]
struct Example {
    resp3: bool,
    lines: Vec<String>,
}

/// The sections, in page order. Panics (naming the section) on a section
/// that lacks a part.
fn sections() -> Vec<Section> {
    let mut out = Vec::new();
    let mut lines = REFERENCE.lines().peekable();
    let mut current: Option<Section> = None;
    let mut in_arguments = false;
    while let Some(line) = lines.next() {
        if line.starts_with("## ") || line.starts_with("### ") {
            out.extend(current.take());
            in_arguments = false;
            if let Some(name) = line.strip_prefix("### ").filter(|n| is_command_name(n)) {
                current = Some(Section {
                    name: name.trim().to_string(),
                    ..Section::default()
                });
            }
            continue;
        }
        let Some(section) = current.as_mut() else {
            continue;
        };
        if let Some(info) = line.strip_prefix("```") {
            let mut block = Vec::new();
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                block.push(l.to_string());
            }
            match info.trim() {
                "" if section.syntax.is_empty() => {
                    assert_eq!(block.len(), 1, "{}: one syntax line", section.name);
                    section.syntax = block.remove(0);
                }
                // A RESP3 session is titled as the command that starts one
                // (the site shows the title; a bare `-3` is no fence there).
                "redis-cli" | "redis-cli title=\"redis-cli -3\"" => {
                    section.examples.push(Example {
                        resp3: info.trim() != "redis-cli",
                        lines: block,
                    })
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with("**") {
            in_arguments = line.starts_with("**Arguments**");
            continue;
        }
        if !section.syntax.is_empty() && section.summary.is_empty() && !line.trim().is_empty() {
            let mut summary = vec![line.trim()];
            while let Some(next) = lines.peek().filter(|l| !l.trim().is_empty()) {
                summary.push(next.trim());
                lines.next();
            }
            section.summary = summary.join(" ");
            continue;
        }
        if line.starts_with("| Complexity | Flags | Tips | Since |") {
            lines.next();
            let row = lines.next().unwrap_or_default();
            let cells: Vec<&str> = row
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            assert_eq!(
                cells.len(),
                4,
                "{}: the row under Complexity/Flags/Tips/Since",
                section.name
            );
            // `—`: none.
            let words = |cell: &str| -> BTreeSet<String> {
                cell.split(',')
                    .map(|f| f.trim().trim_matches('`').to_string())
                    .filter(|f| !f.is_empty() && f != "—")
                    .collect()
            };
            section.complexity = cells[0].to_string();
            section.flags = words(cells[1]);
            section.tips = words(cells[2]);
            section.since = cells[3].to_string();
            continue;
        }
        if in_arguments {
            if let Some(rest) = line.strip_prefix("- `") {
                let label = rest.split('`').next().unwrap_or_default();
                section.arguments.push(label.to_string());
                if let Some((_, v)) = rest.split_once("(since ") {
                    let version = v.split(')').next().unwrap_or_default();
                    section.added.insert(label.to_string(), version.to_string());
                }
            }
        }
    }
    out.extend(current);
    for s in &out {
        for (part, empty) in [
            ("a syntax line", s.syntax.is_empty()),
            ("a summary", s.summary.is_empty()),
            ("a Complexity/Flags/Tips/Since row", s.since.is_empty()),
            ("an example", s.examples.is_empty()),
        ] {
            assert!(!empty, "docs/commands.md: {} has no {part}", s.name);
        }
    }
    out
}

/// `LOCK.ACQUIRE`, `BF.ADD`...: a heading that names a command.
fn is_command_name(heading: &str) -> bool {
    // `GCRA`, the one command of no group (the core proposal's name).
    if heading == "GCRA" {
        return true;
    }
    heading.split_once('.').is_some_and(|(group, name)| {
        [group, name].iter().all(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        })
    })
}

// ---------------------------------------------------------------------------
// What the server says

/// One argument as `COMMAND DOCS` describes it.
#[derive(Debug)]
struct Arg {
    name: String,
    kind: String,
    token: Option<String>,
    optional: bool,
    multiple: bool,
    /// The version that added it, when later than its command.
    since: Option<String>,
    sub: Vec<Arg>,
}

#[derive(Debug)]
struct Docs {
    summary: String,
    since: String,
    complexity: String,
    arguments: Vec<Arg>,
    /// `history`: (version, change) pairs.
    history: Vec<(String, String)>,
}

/// A flat RESP2 field/value array as field → value.
fn fields(reply: &Reply) -> BTreeMap<String, Reply> {
    let Reply::Array(items) = reply else {
        panic!("not a field/value array: {reply:?}");
    };
    items
        .chunks(2)
        .map(|kv| (kv[0].text(), kv[1].clone()))
        .collect()
}

fn parse_arg(reply: &Reply) -> Arg {
    let f = fields(reply);
    let flags: Vec<String> = match f.get("flags") {
        Some(Reply::Array(flags)) => flags.iter().map(Reply::text).collect(),
        _ => Vec::new(),
    };
    Arg {
        name: f["name"].text(),
        kind: f["type"].text(),
        token: f.get("token").map(Reply::text),
        optional: flags.iter().any(|f| f == "optional"),
        multiple: flags.iter().any(|f| f == "multiple"),
        since: f.get("since").map(Reply::text),
        sub: match f.get("arguments") {
            Some(Reply::Array(args)) => args.iter().map(parse_arg).collect(),
            _ => Vec::new(),
        },
    }
}

fn command_docs(c: &mut Raw, name: &str) -> Docs {
    let reply = c.call_str(&["COMMAND", "DOCS", name]);
    let Reply::Array(pair) = &reply else {
        panic!("COMMAND DOCS {name}: {reply:?}");
    };
    assert_eq!(pair.len(), 2, "COMMAND DOCS {name}: {reply:?}");
    let f = fields(&pair[1]);
    let text = |field: &str| f.get(field).map(Reply::text).unwrap_or_default();
    Docs {
        summary: text("summary"),
        since: text("since"),
        complexity: text("complexity"),
        arguments: match f.get("arguments") {
            Some(Reply::Array(args)) => args.iter().map(parse_arg).collect(),
            _ => Vec::new(),
        },
        history: match f.get("history") {
            Some(Reply::Array(entries)) => entries
                .iter()
                .map(|e| match e {
                    Reply::Array(pair) if pair.len() == 2 => (pair[0].text(), pair[1].text()),
                    other => panic!("COMMAND DOCS {name}: a history entry {other:?}"),
                })
                .collect(),
            _ => Vec::new(),
        },
    }
}

/// What `COMMAND INFO` says of one command.
struct Info {
    arity: i64,
    /// Without `module`, which every one has.
    flags: BTreeSet<String>,
    tips: BTreeSet<String>,
}

/// `COMMAND INFO`: arity, flags and tips.
fn command_info(c: &mut Raw, name: &str) -> Info {
    let reply = c.call_str(&["COMMAND", "INFO", name]);
    let Reply::Array(outer) = &reply else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let Some(Reply::Array(info)) = outer.first() else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let arity = match info[1] {
        Reply::Int(n) => n,
        _ => panic!("COMMAND INFO {name}: {reply:?}"),
    };
    let Reply::Array(flags) = &info[2] else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let flags = flags
        .iter()
        .map(Reply::text)
        .filter(|f| f != "module")
        .collect();
    // The eighth field, as Redis 7.0+ and Valkey give it.
    let Some(Reply::Array(tips)) = info.get(7) else {
        panic!("COMMAND INFO {name}: no tips field: {reply:?}");
    };
    Info {
        arity,
        flags,
        tips: tips.iter().map(Reply::text).collect(),
    }
}

/// The syntax of one argument as Redis' own documentation writes it.
fn render(arg: &Arg) -> String {
    let body = match arg.kind.as_str() {
        "pure-token" => arg.token.clone().unwrap_or_else(|| arg.name.clone()),
        "oneof" => {
            let choices: Vec<String> = arg.sub.iter().map(render).collect();
            choices.join(" | ")
        }
        "block" => {
            let parts: Vec<String> = arg.sub.iter().map(render).collect();
            parts.join(" ")
        }
        _ => arg.name.clone(),
    };
    let body = if arg.multiple {
        format!("{body} [{body} ...]")
    } else {
        body
    };
    let body = match (&arg.token, arg.kind.as_str()) {
        (Some(token), kind) if kind != "pure-token" => format!("{token} {body}"),
        _ => body,
    };
    match (arg.optional, arg.kind.as_str()) {
        (true, _) => format!("[{body}]"),
        (false, "oneof") => format!("<{body}>"),
        _ => body,
    }
}

fn syntax(name: &str, docs: &Docs) -> String {
    let mut words = vec![name.to_uppercase()];
    words.extend(docs.arguments.iter().map(render));
    words.join(" ")
}

/// The arity these arguments give: the command name, the required words,
/// negative when optional or repeated words may follow.
fn arity(args: &[Arg]) -> i64 {
    fn count(arg: &Arg) -> (i64, bool) {
        if arg.optional {
            return (0, true);
        }
        let (words, open) = match arg.kind.as_str() {
            "pure-token" => (1, false),
            "block" => arg
                .sub
                .iter()
                .map(count)
                .fold((0, false), |(n, o), (m, p)| (n + m, o || p)),
            "oneof" => (1, false),
            _ => (1 + i64::from(arg.token.is_some()), false),
        };
        (words, open || arg.multiple)
    }
    let (words, open) = args
        .iter()
        .map(count)
        .fold((1, false), |(n, o), (m, p)| (n + m, o || p));
    if open {
        -words
    } else {
        words
    }
}

/// The labels the Arguments list must name: each argument (`TOKEN name` for
/// an option with a value), the choices of a one-of together, the parts of
/// a block one by one.
/// Each argument's label as the page lists it → the version that added it
/// ("" when its command's own).
fn labels(args: &[Arg], out: &mut BTreeMap<String, String>) {
    for arg in args {
        let label = match arg.kind.as_str() {
            "block" => {
                labels(&arg.sub, out);
                continue;
            }
            "oneof" => {
                let choices: Vec<String> = arg.sub.iter().map(render).collect();
                choices.join(" | ")
            }
            "pure-token" => arg.token.clone().unwrap_or_else(|| arg.name.clone()),
            _ => match &arg.token {
                Some(token) => format!("{token} {}", arg.name),
                None => arg.name.clone(),
            },
        };
        out.insert(label, arg.since.clone().unwrap_or_default());
    }
}

fn registered(c: &mut Raw) -> BTreeSet<String> {
    match c.call_str(&["COMMAND", "LIST", "FILTERBY", "MODULE", "warden"]) {
        Reply::Array(names) => names.iter().map(|n| n.text().to_lowercase()).collect(),
        other => panic!("COMMAND LIST: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn the_page_documents_exactly_the_commands_the_server_registers() {
    let s = Server::start(&[]);
    let mut c = Raw::open(&s);
    let server = registered(&mut c);
    let page: BTreeSet<String> = sections().iter().map(|s| s.name.to_lowercase()).collect();
    let undocumented: Vec<_> = server.difference(&page).collect();
    assert!(
        undocumented.is_empty(),
        "registered but not in docs/commands.md: {undocumented:?}"
    );
    let unknown: Vec<_> = page.difference(&server).collect();
    assert!(
        unknown.is_empty(),
        "docs/commands.md documents commands the server does not register: {unknown:?}"
    );
}

#[test]
fn each_section_matches_command_docs_and_command_info() {
    let s = Server::start(&[]);
    let mut c = Raw::open(&s);
    let server = registered(&mut c);
    let mut checked = 0;
    for section in sections() {
        let name = section.name.to_lowercase();
        if !server.contains(&name) {
            continue;
        }
        let docs = command_docs(&mut c, &name);
        let what = |field: &str| format!("docs/commands.md, {}: {field}", section.name);
        assert_eq!(section.syntax, syntax(&name, &docs), "{}", what("syntax"));
        assert_eq!(section.summary, docs.summary, "{}", what("summary"));
        assert_eq!(
            section.complexity,
            docs.complexity,
            "{}",
            what("complexity")
        );
        assert_eq!(section.since, docs.since, "{}", what("since"));
        let info = command_info(&mut c, &name);
        assert_eq!(section.flags, info.flags, "{}", what("flags"));
        assert_eq!(section.tips, info.tips, "{}", what("tips"));
        assert_eq!(
            arity(&docs.arguments),
            info.arity,
            "{name}: COMMAND INFO arity against its arguments"
        );
        let mut expected = BTreeMap::new();
        labels(&docs.arguments, &mut expected);
        let listed: BTreeSet<String> = section.arguments.iter().cloned().collect();
        assert_eq!(
            listed,
            expected.keys().cloned().collect::<BTreeSet<_>>(),
            "{}",
            what("Arguments list")
        );
        // An argument added after its command says so on the page and in
        // `COMMAND DOCS` (its `since`, and a `history` line of that version).
        let added: BTreeMap<String, String> = expected
            .into_iter()
            .filter(|(_, since)| !since.is_empty())
            .collect();
        assert_eq!(section.added, added, "{}", what("an argument's (since …)"));
        for since in added.values() {
            assert!(
                docs.history.iter().any(|(v, _)| v == since),
                "{name}: COMMAND DOCS history has no {since} entry: {:?}",
                docs.history
            );
        }
        assert_eq!(
            listed.len(),
            section.arguments.len(),
            "{}",
            what("an argument listed twice")
        );
        checked += 1;
    }
    assert!(checked >= 27, "only {checked} sections checked");
}

const NONDETERMINISTIC: &[&str] = &["nondeterministic_output"];
const VARIES_DONT_CACHE: &[&str] = &["nondeterministic_output", "dont_cache"];
const DONT_CACHE: &[&str] = &["dont_cache"];
const NONE: &[&str] = &[];

/// Every command with the flags and tips `COMMAND INFO` must report
/// (docs/commands.md, "Tips", gives the rule). A `readonly` command that
/// takes a key and has neither `nondeterministic_output` nor `dont_cache`
/// is one client-side caches keep: only reads answered from the key's value
/// alone may be one.
const FLAGS_AND_TIPS: &[(&str, &[&str], &[&str])] = &[
    ("lock.acquire", &["write", "denyoom"], NONDETERMINISTIC),
    ("lock.release", &["write", "fast"], NONE),
    ("lock.extend", &["write", "fast"], NONE),
    ("lock.info", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("warden.lockset", &["write", "denyoom"], NONE),
    ("rwlock.read", &["write", "denyoom"], NONDETERMINISTIC),
    ("rwlock.write", &["write", "denyoom"], NONDETERMINISTIC),
    ("rwlock.unlock", &["write", "fast"], NONE),
    ("rwlock.extend", &["write", "fast"], NONE),
    ("rwlock.info", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("warden.rwset", &["write", "denyoom"], NONE),
    ("warden.rwhold", &["write", "denyoom"], NONE),
    ("sem.acquire", &["write", "denyoom"], NONDETERMINISTIC),
    ("sem.release", &["write", "fast"], NONE),
    ("sem.extend", &["write", "fast"], NONE),
    ("sem.setlimit", &["write", "denyoom"], NONE),
    ("sem.info", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("warden.semset", &["write", "denyoom"], NONE),
    ("rate.acquire", &["write", "denyoom"], NONDETERMINISTIC),
    ("rate.refund", &["write", "fast"], NONE),
    ("rate.config", &["write", "denyoom"], NONE),
    ("rate.info", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("warden.rateset", &["write", "denyoom"], NONE),
    ("gcra", &["write", "denyoom", "fast"], NONDETERMINISTIC),
    ("cache.get", &["write"], NONDETERMINISTIC),
    ("cache.fill", &["write", "denyoom"], NONE),
    ("cache.abandon", &["write", "fast"], NONE),
    ("cache.invalidate", &["write"], NONE),
    ("cache.info", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("cache.peek", &["readonly", "fast"], NONE),
    ("warden.syncstate", &["write"], NONE),
    ("warden.contended", &["readonly"], VARIES_DONT_CACHE),
    ("warden.withdraw", &["readonly", "fast"], VARIES_DONT_CACHE),
    ("bf.reserve", &["write", "denyoom"], NONE),
    ("bf.add", &["write", "denyoom"], NONE),
    ("bf.madd", &["write", "denyoom"], NONE),
    ("bf.insert", &["write", "denyoom"], NONE),
    ("bf.exists", &["readonly", "fast"], NONE),
    ("bf.mexists", &["readonly", "fast"], NONE),
    ("bf.info", &["readonly", "fast"], DONT_CACHE),
    ("bf.card", &["readonly", "fast"], NONE),
    ("bf.debug", &["readonly", "fast"], DONT_CACHE),
    ("bf.scandump", &["readonly"], DONT_CACHE),
    ("bf.loadchunk", &["write", "denyoom"], NONE),
];

/// The reads client-side caches may keep: answered from the key's value alone.
const CACHEABLE_READS: &[&str] = &["bf.exists", "bf.mexists", "bf.card", "cache.peek"];

fn set(words: &[&str]) -> BTreeSet<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[test]
fn each_command_reports_its_flags_and_tips() {
    let s = Server::start(&[]);
    let mut c = Raw::open(&s);
    let table: BTreeSet<String> = FLAGS_AND_TIPS.iter().map(|(n, ..)| n.to_string()).collect();
    assert_eq!(registered(&mut c), table, "the table names every command");
    for (name, flags, tips) in FLAGS_AND_TIPS {
        let info = command_info(&mut c, name);
        assert_eq!(info.flags, set(flags), "{name}: flags");
        assert_eq!(info.tips, set(tips), "{name}: tips");
        // `COMMAND DOCS` still describes it (it has no field for tips).
        let docs = command_docs(&mut c, name);
        assert!(!docs.summary.is_empty(), "{name}: COMMAND DOCS summary");
        let cached = info.flags.contains("readonly")
            && !info.tips.contains("nondeterministic_output")
            && !info.tips.contains("dont_cache");
        assert_eq!(
            cached,
            CACHEABLE_READS.contains(name),
            "{name}: client-side caches keep its replies"
        );
    }
}

#[test]
fn every_error_text_the_module_sends_is_documented() {
    let texts = error_texts();
    assert!(
        texts.len() >= 40,
        "only {} texts found in src/error.rs",
        texts.len()
    );
    let missing: Vec<&String> = texts
        .iter()
        .filter(|t| !REFERENCE.contains(&format!("`{t}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "error texts of src/error.rs not in docs/commands.md (as `text`): {missing:#?}"
    );
}

/// Every string constant of src/error.rs, and every `format!` text with its
/// `{name}` placeholders written `<name>`.
fn error_texts() -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in ERROR_TEXTS.match_indices("pub const ") {
        let rest = &ERROR_TEXTS[i..];
        let end = rest.find(';').expect("a constant ends");
        if let Some(text) = string_literal(&rest[..end]) {
            out.push(text);
        }
    }
    for (i, _) in ERROR_TEXTS.match_indices("format!(") {
        if let Some(text) = string_literal(&ERROR_TEXTS[i..]) {
            let mut shown = String::new();
            let mut chars = text.chars();
            while let Some(ch) = chars.next() {
                match ch {
                    '{' => {
                        let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                        shown.push_str(&format!("<{name}>"));
                    }
                    _ => shown.push(ch),
                }
            }
            out.push(shown);
        }
    }
    out
}

/// The first `"..."` of `code`, unescaped (`\"` and `\\` only).
fn string_literal(code: &str) -> Option<String> {
    let start = code.find('"')? + 1;
    let mut out = String::new();
    let mut chars = code[start..].chars();
    while let Some(ch) = chars.next() {
        match ch {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            _ => out.push(ch),
        }
    }
    None
}

#[test]
fn every_example_answers_as_shown() {
    let s = Server::start(&[]);
    let server = registered(&mut Raw::open(&s));
    drop(s);
    let mut run = 0;
    for section in sections() {
        if !server.contains(&section.name.to_lowercase()) {
            continue;
        }
        for (n, example) in section.examples.iter().enumerate() {
            let what = format!("docs/commands.md, {} example {}", section.name, n + 1);
            run_example(&what, example);
            run += 1;
        }
    }
    assert!(run >= 27, "only {run} examples run");
}

/// One session: `redis> ` lines run on one connection, `other> ` lines each
/// on a new one (`(blocked)` under it: the command blocks, and the session
/// goes on once the server counts it as blocked); the lines under a command
/// are its reply as redis-cli prints it. A reply line ending in `  # note`
/// varies from run to run (a token, a time left): its digits are not
/// compared, but each long number shown there (a token) stands for the
/// value the server gave: the same number shown twice must be the same
/// value, two different numbers two different values, and a later command
/// that uses the number is sent with the value.
fn run_example(what: &str, example: &Example) {
    let s = Server::start(&[]);
    let mut c = Raw::open(&s);
    if example.resp3 {
        c.call_str(&["HELLO", "3"]);
    }
    let mut others = Vec::new();
    let mut tokens: BTreeMap<String, String> = BTreeMap::new();
    let mut lines = example.lines.iter().peekable();
    while let Some(line) = lines.next() {
        let (main, command) = if let Some(command) = line.strip_prefix("redis> ") {
            (true, command)
        } else if let Some(command) = line.strip_prefix("other> ") {
            (false, command)
        } else {
            panic!("{what}: `{line}` is neither a command nor under one");
        };
        let words =
            split_args(command).unwrap_or_else(|| panic!("{what}: cannot split `{command}`"));
        let words: Vec<Vec<u8>> = words
            .into_iter()
            .map(|w| match tokens.get(String::from_utf8_lossy(&w).as_ref()) {
                Some(actual) => actual.clone().into_bytes(),
                None => w,
            })
            .collect();
        let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let mut expected = Vec::new();
        while let Some(l) =
            lines.next_if(|l| !l.starts_with("redis> ") && !l.starts_with("other> "))
        {
            expected.push(l.as_str());
        }
        let reply = if main {
            c.call(&words)
        } else {
            let mut other = Raw::open(&s);
            if example.resp3 {
                other.call_str(&["HELLO", "3"]);
            }
            if expected == ["(blocked)"] {
                let before = blocked_clients(&mut c);
                other.send(&words);
                wait_for(
                    &format!("{what}: `{command}` to block"),
                    Duration::from_secs(10),
                    || blocked_clients(&mut c) > before,
                );
                others.push(other);
                continue;
            }
            other.call(&words)
        };
        let shown = format_tty(&reply, "");
        let got: Vec<&str> = shown.lines().collect();
        assert_eq!(
            got.len(),
            expected.len(),
            "{what}: `{command}` answered\n{shown}"
        );
        for (got, expected) in got.iter().zip(&expected) {
            let Some((expected, _note)) = expected.split_once("  # ") else {
                assert_eq!(
                    got.trim_end(),
                    expected.trim_end(),
                    "{what}: `{command}` answered\n{shown}"
                );
                continue;
            };
            let expected = expected.trim_end();
            assert_eq!(
                mask_digits(got),
                mask_digits(expected),
                "{what}: `{command}` answered\n{shown}"
            );
            for (shown_number, actual) in numbers(expected).into_iter().zip(numbers(got)) {
                if shown_number.len() < 10 {
                    continue;
                }
                let known = tokens
                    .entry(shown_number.clone())
                    .or_insert_with(|| actual.clone());
                assert_eq!(
                    *known, actual,
                    "{what}: {shown_number} stands for two values"
                );
            }
            let values: BTreeSet<&String> = tokens.values().collect();
            assert_eq!(
                values.len(),
                tokens.len(),
                "{what}: two numbers stand for one value: {tokens:?}"
            );
        }
    }
    drop(others);
}

/// The runs of digits of `s`, in order.
fn numbers(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

fn blocked_clients(c: &mut Raw) -> i64 {
    let info = c.call_str(&["INFO", "clients"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("blocked_clients in INFO clients")
}

fn mask_digits(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(ch);
        }
    }
    out
}

fn push_char(word: &mut Vec<u8>, c: char) {
    word.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
}

/// A command line split into words as redis-cli does: spaces separate,
/// `"..."` takes `\"`, `\\`, `\n`, `\r`, `\t`, `\xHH` escapes, `'...'` takes `\'`.
fn split_args(line: &str) -> Option<Vec<Vec<u8>>> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else {
            return Some(words);
        };
        let mut word = Vec::new();
        match first {
            '"' => {
                chars.next();
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            'n' => word.push(b'\n'),
                            'r' => word.push(b'\r'),
                            't' => word.push(b'\t'),
                            'a' => word.push(7),
                            'b' => word.push(8),
                            'x' => {
                                let hex: String = [chars.next()?, chars.next()?].iter().collect();
                                word.push(u8::from_str_radix(&hex, 16).ok()?);
                            }
                            other => push_char(&mut word, other),
                        },
                        other => push_char(&mut word, other),
                    }
                }
            }
            '\'' => {
                chars.next();
                loop {
                    match chars.next()? {
                        '\'' => break,
                        '\\' if chars.peek() == Some(&'\'') => push_char(&mut word, chars.next()?),
                        other => push_char(&mut word, other),
                    }
                }
            }
            _ => {
                while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                    push_char(&mut word, c);
                }
            }
        }
        words.push(word);
    }
}

// ---------------------------------------------------------------------------
// A raw RESP2/RESP3 connection and redis-cli's way of printing replies

#[derive(Clone, Debug, PartialEq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Double(String),
    Bool(bool),
    Array(Vec<Reply>),
    Set(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    fn text(&self) -> String {
        match self {
            Reply::Status(s) | Reply::Error(s) | Reply::Double(s) => s.clone(),
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Int(n) => n.to_string(),
            other => format!("{other:?}"),
        }
    }
}

struct Raw {
    reader: BufReader<UnixStream>,
}

impl Raw {
    fn open(s: &Server) -> Self {
        let stream = UnixStream::connect(s.socket()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Self {
            reader: BufReader::new(stream),
        }
    }

    fn send(&mut self, words: &[&[u8]]) {
        let mut buf = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            buf.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
            buf.extend_from_slice(w);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_ref().write_all(&buf).expect("send");
    }

    fn call(&mut self, words: &[&[u8]]) -> Reply {
        self.send(words);
        self.read()
    }

    fn call_str(&mut self, words: &[&str]) -> Reply {
        let words: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        self.call(&words)
    }

    fn read(&mut self) -> Reply {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).expect("a reply");
        assert!(line.len() >= 3, "connection closed");
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let n = || body.parse::<i64>().expect("a length");
        match line[0] {
            b'+' => Reply::Status(body),
            b'-' => Reply::Error(body),
            b':' => Reply::Int(n()),
            b',' => Reply::Double(body),
            b'#' => Reply::Bool(body == "t"),
            b'_' => Reply::Nil,
            b'$' | b'=' | b'!' if n() < 0 => Reply::Nil,
            b'$' | b'=' | b'!' => {
                let mut data = vec![0; n() as usize + 2];
                self.reader.read_exact(&mut data).expect("a bulk string");
                data.truncate(data.len() - 2);
                match line[0] {
                    b'!' => Reply::Error(String::from_utf8_lossy(&data).into_owned()),
                    _ => Reply::Bulk(data),
                }
            }
            b'*' | b'~' | b'>' if n() < 0 => Reply::Nil,
            b'*' | b'>' => Reply::Array((0..n()).map(|_| self.read()).collect()),
            b'~' => Reply::Set((0..n()).map(|_| self.read()).collect()),
            b'%' => Reply::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            other => panic!("unexpected reply type {:?}", other as char),
        }
    }
}

/// A string as redis-cli quotes it (`sdscatrepr`).
fn quoted(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in bytes {
        match b {
            b'\\' | b'"' => {
                out.push('\\');
                out.push(b as char);
            }
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            7 => out.push_str("\\a"),
            8 => out.push_str("\\b"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

/// A reply as redis-cli prints it on a terminal; `prefix` is the indentation
/// of nested elements.
fn format_tty(reply: &Reply, prefix: &str) -> String {
    let (items, sep, empty): (Vec<(&Reply, Option<&Reply>)>, char, &str) = match reply {
        Reply::Status(s) => return format!("{s}\n"),
        Reply::Error(e) => return format!("(error) {e}\n"),
        Reply::Int(n) => return format!("(integer) {n}\n"),
        Reply::Double(d) => return format!("(double) {d}\n"),
        Reply::Bool(b) => return format!("({b})\n"),
        Reply::Nil => return "(nil)\n".to_string(),
        Reply::Bulk(b) => return format!("{}\n", quoted(b)),
        Reply::Array(a) => (a.iter().map(|r| (r, None)).collect(), ')', "(empty array)"),
        Reply::Set(a) => (a.iter().map(|r| (r, None)).collect(), '~', "(empty set)"),
        Reply::Map(m) => (
            m.iter().map(|(k, v)| (k, Some(v))).collect(),
            '#',
            "(empty hash)",
        ),
    };
    if items.is_empty() {
        return format!("{empty}\n");
    }
    let width = items.len().to_string().len();
    let nested = format!("{prefix}{}", " ".repeat(width + 2));
    let mut out = String::new();
    for (i, (item, value)) in items.iter().enumerate() {
        let lead = if i == 0 { "" } else { prefix };
        out.push_str(&format!("{lead}{:>width$}{sep} ", i + 1));
        out.push_str(&format_tty(item, &nested));
        if let Some(value) = value {
            out.pop();
            out.push_str(" => ");
            out.push_str(&format_tty(value, &nested));
        }
    }
    out
}
