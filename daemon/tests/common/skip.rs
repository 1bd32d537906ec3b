//! A test that cannot check what it claims on this host says so, where it
//! is seen and where it can be counted, instead of passing in silence.

use std::io::Write;

/// The variable that names a file to which every skip is appended, one
/// line each, for a summary to count.
pub const SKIP_LOG: &str = "NSM_SKIP_LOG";

/// Marks `test` as skipped because of `why`: the line
/// `SKIP <file>::<test>: <why>` on stderr and, when `NSM_SKIP_LOG` names a
/// file, appended to it. The caller returns right after. `<file>` is the
/// calling test file.
///
/// The line is written to stderr itself rather than with `eprintln!`,
/// which the test harness captures (and shows only for a failed test).
#[track_caller]
pub fn skip(test: &str, why: &str) {
    let file = std::path::Path::new(std::panic::Location::caller().file())
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let line = format!("SKIP {file}::{test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os(SKIP_LOG).filter(|l| !l.is_empty()) {
        // One write of one short line to a file opened for appending: lines
        // of tests running at once do not interleave.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            panic!(
                "{SKIP_LOG}={}: cannot record the skip: {e}",
                log.to_string_lossy()
            );
        }
    }
}
