//! The error code no run can be made to produce from outside: `internal`,
//! for a run that ended without an exit status or a signal. Every other
//! documented code is produced by a real run in tests/mcp/test_error_codes.py,
//! which also checks that this example exists.

use std::time::Duration;

use nix_sandbox_mcp::exec::Outcome;
use nix_sandbox_mcp::limits::Limits;
use nix_sandbox_mcp::server::result::run_error;

#[test]
fn a_run_without_an_exit_status_is_an_internal_error() {
    let outcome = Outcome {
        exit_code: None,
        signal: None,
        stdout: Default::default(),
        stderr: Default::default(),
        duration: Duration::from_millis(5),
        timed_out: false,
        cancelled: false,
        limit: None,
        limits_reached: Vec::new(),
        usage: Default::default(),
        network: None,
        upper: None,
    };
    let error = run_error(&outcome, &Limits::resolve(Default::default())).unwrap();
    assert_eq!(error.code.as_str(), "internal");
    assert!(error.suggestion.contains("log"), "{}", error.suggestion);
}
