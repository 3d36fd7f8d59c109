//! Commands that may write keys they do not name, with no event the cache
//! hears: `DEBUG POPULATE` creates `prefix:0..n`, `DEBUG RELOAD NOFLUSH`
//! replaces keys from the saved file without a flush, `MODULE LOAD` runs a
//! module's start-up (which may write any key), and another module's command
//! flagged `write` that names no key may write any through the key API. The command filter cannot tell which keys they touch, so once such a
//! command is known to have run every lease ends, as a flush ends them (a
//! refused one — `DEBUG` disabled, `NOAUTH`, `NOPERM`, wrong arity — ends
//! none). Pure: no Redis calls.

/// What the filter must do with a command for the keys it does not name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unnamed {
    /// It writes only keys it names (or none).
    No,
    /// `DEBUG`, `MODULE`: depends on the subcommand (`subcommand_writes`).
    BySubcommand,
    /// Every call may write keys it does not name.
    Always,
}

/// `DEBUG` subcommands that write no key (on Redis 7.0, 8.2 and Valkey
/// 9.1), or whose writes are heard: `RELOAD` and `LOADAOF` empty the
/// dataset first (a flush, which ends every lease) unless told `NOFLUSH`.
/// The rest — `POPULATE`, `RELOAD … NOFLUSH`, the ones that restart or crash
/// the server, and any a later server adds — end every lease when they run.
const DEBUG_READS: &[&[u8]] = &[
    b"help",
    b"sleep",
    b"object",
    b"sdslen",
    b"digest",
    b"digest-value",
    b"protocol",
    b"log",
    b"listpack",
    b"quicklist",
    b"ziplist",
    b"stringmatch-len",
    b"mallctl",
    b"mallctl-str",
    b"replybuffer",
    b"client-eviction",
    b"set-active-expire",
    b"pause-cron",
    b"dict-resizing",
    b"quicklist-packed-threshold",
    b"change-repl-id",
    b"slotmigration",
    b"set-skip-checksum-validation",
    b"set-disable-deny-scripts",
    b"script",
    b"stringmatch_len",
    b"listpack-entries",
    b"jmap",
];

/// Subcommands that flush before they load (the flush is heard).
const DEBUG_FLUSHING: &[&[u8]] = &[b"reload", b"loadaof"];

/// Whether `<command> <sub> <options…>` (`DEBUG`, `MODULE`) may write keys
/// unseen.
pub fn subcommand_writes<'a>(
    command: &[u8],
    sub: &[u8],
    mut options: impl Iterator<Item = &'a [u8]>,
) -> bool {
    let is = |list: &[&[u8]]| list.iter().any(|r| sub.eq_ignore_ascii_case(r));
    if command.eq_ignore_ascii_case(b"module") {
        return is(&[b"load", b"loadex"]);
    }
    if is(DEBUG_READS) {
        return false;
    }
    !is(DEBUG_FLUSHING) || options.any(|o| o.eq_ignore_ascii_case(b"noflush"))
}

/// How a command from `COMMAND INFO` treats keys it does not name: `DEBUG`
/// and `MODULE` by their subcommand; another module's command flagged
/// `write` with no key position and no key spec may write anything.
pub fn classify(name: &[u8], write: bool, module: bool, first_key: i64, specs: usize) -> Unnamed {
    if name.eq_ignore_ascii_case(b"debug") || name.eq_ignore_ascii_case(b"module") {
        Unnamed::BySubcommand
    } else if module && write && first_key == 0 && specs == 0 {
        Unnamed::Always
    } else {
        Unnamed::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_populate_and_a_reload_without_flush_write_unseen() {
        let writes = |words: &[&str]| {
            subcommand_writes(
                b"debug",
                words[0].as_bytes(),
                words[1..].iter().map(|w| w.as_bytes()),
            )
        };
        for words in [
            &["POPULATE", "10"][..],
            &["reload", "MERGE", "NOFLUSH"],
            &["RELOAD", "noflush"],
            &["restart"],
            &["some-new-one"],
        ] {
            assert!(writes(words), "{words:?}");
        }
        for words in [
            &["SLEEP", "0"][..],
            &["object", "k"],
            &["Help"],
            &["RELOAD"],
            &["RELOAD", "NOSAVE"],
            &["LOADAOF"],
        ] {
            assert!(!writes(words), "{words:?}");
        }
    }

    #[test]
    fn a_module_write_that_names_no_key_may_write_any() {
        assert_eq!(
            classify(b"DEBUG", false, false, 0, 0),
            Unnamed::BySubcommand
        );
        assert!(subcommand_writes(b"MODULE", b"load", std::iter::empty()));
        assert!(subcommand_writes(b"module", b"LOADEX", std::iter::empty()));
        assert!(!subcommand_writes(b"module", b"list", std::iter::empty()));
        assert_eq!(
            classify(b"late.populate", true, true, 0, 0),
            Unnamed::Always
        );
        assert_eq!(classify(b"late.set", true, true, 1, 1), Unnamed::No);
        assert_eq!(classify(b"late.get", false, true, 0, 0), Unnamed::No);
        // The server's own keyless writes (FLUSHALL, SWAPDB) are heard as
        // server events.
        assert_eq!(classify(b"flushall", true, false, 0, 0), Unnamed::No);
    }
}
