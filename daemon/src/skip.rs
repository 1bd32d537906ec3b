//! A unit test that cannot check what it claims on this host says so where
//! the run's summary sees it: on stderr, and in the file `NSM_SKIP_LOG`
//! names (test-local.sh lists that file's lines at its end).

/// Records that `test` skipped, and why.
pub(crate) fn skip(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("SKIP {test}: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(path) = std::env::var_os("NSM_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path)
    {
        let _ = writeln!(f, "cargo unit: {line}");
    }
}
