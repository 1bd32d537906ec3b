//! What a run produced and what ended it: the exit status or signal as the
//! program saw it, the captured output, and which limit fired, decided from
//! what the supervisor saw and what the kernel counted.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use super::capture::Captured;
use super::supervise::{End, Supervised};
use crate::limits::{Fired, Usage};
use crate::network::NetworkReport;

/// A limit that ended (or was reached during) a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    Timeout,
    Memory,
    Processes,
    Cpu,
    Output,
    FileSize,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Timeout => "timeout",
            LimitKind::Memory => "memory",
            LimitKind::Processes => "processes",
            LimitKind::Cpu => "cpu",
            LimitKind::Output => "output",
            LimitKind::FileSize => "file_size",
        }
    }
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Exit status of the program (128 + N when it died of signal N).
    pub exit_code: Option<i32>,
    /// Signal that ended the program, when one did.
    pub signal: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub duration: Duration,
    pub timed_out: bool,
    pub cancelled: bool,
    /// The limit that ended the run.
    pub limit: Option<LimitKind>,
    /// Every limit reached during the run, including ones that did not end it.
    pub limits_reached: Vec<LimitKind>,
    /// CPU time and peak memory, as far as they were counted.
    pub usage: Usage,
    /// What the sandbox did through the proxy, when it had network.
    pub network: Option<NetworkReport>,
    /// The project's overlay upper layer as the run left it (its changes),
    /// when the project was an overlay: the descriptor keeps it readable.
    pub upper: Option<Arc<OwnedFd>>,
}

impl Outcome {
    /// A run that ended with `exit_code` or `signal` and did nothing else:
    /// no output, no limit, no time. For tests, which change what they need.
    #[cfg(test)]
    pub(crate) fn ended(exit_code: Option<i32>, signal: Option<i32>) -> Outcome {
        Outcome {
            exit_code,
            signal,
            stdout: Captured::default(),
            stderr: Captured::default(),
            duration: Duration::ZERO,
            timed_out: false,
            cancelled: false,
            limit: None,
            limits_reached: vec![],
            usage: Usage::default(),
            network: None,
            upper: None,
        }
    }

    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.limit.is_none() && !self.cancelled
    }

    /// The outcome of a call the supervisor watched to `watched`'s end, the
    /// program's exit read as `status` (exit code, signal): one run's and
    /// one session call's alike. Takes the captured output out of
    /// `watched`, whose ending the caller may still read.
    pub(crate) fn of_call<R>(
        watched: &mut Supervised<R>,
        status: (Option<i32>, Option<i32>),
        counted: Counted,
    ) -> Outcome {
        let (exit_code, signal) = status;
        let mut o = Outcome {
            exit_code,
            signal,
            stdout: std::mem::take(&mut watched.stdout),
            stderr: std::mem::take(&mut watched.stderr),
            duration: counted.duration,
            timed_out: matches!(watched.end, End::Timeout),
            cancelled: matches!(watched.end, End::Cancelled),
            limit: None,
            limits_reached: Vec::new(),
            usage: counted.usage,
            network: counted.network,
            upper: counted.upper,
        };
        attribute_limits(&mut o, watched.end.limit(), counted.fired);
        o
    }
}

/// What a call's sandbox counted and kept while the supervisor watched.
pub(crate) struct Counted {
    pub duration: Duration,
    pub usage: Usage,
    pub network: Option<NetworkReport>,
    pub upper: Option<Arc<OwnedFd>>,
    /// The limits the kernel reports reached.
    pub fired: Fired,
}

/// Decides which limit ended the run from what we saw (`ours`: the
/// supervisor's own kill) and what the kernel counted.
fn attribute_limits(o: &mut Outcome, ours: Option<LimitKind>, fired: Fired) {
    let mut reached = Vec::new();
    reached.extend(ours);
    if fired.memory {
        reached.push(LimitKind::Memory);
    }
    match o.signal {
        Some(libc::SIGXCPU) => reached.push(LimitKind::Cpu),
        Some(libc::SIGXFSZ) => reached.push(LimitKind::FileSize),
        _ => {}
    }
    if fired.pids {
        reached.push(LimitKind::Processes);
    }
    let failed = o.exit_code != Some(0);
    o.limit = ours.or_else(|| {
        if !failed {
            return None;
        }
        reached
            .iter()
            .copied()
            .find(|l| *l != LimitKind::Processes)
            .or_else(|| reached.first().copied())
    });
    o.limits_reached = reached;
}

/// Signals whose 128 + N status is read as a death by that signal: the
/// kernel's own (crashes, limits, kills). bubblewrap reports a program
/// killed by signal N as exit status 128 + N, the same as a program that
/// exits with that status, and programs do exit with 129, 130 or 143 on
/// purpose (after handling SIGHUP, SIGINT or SIGTERM), so those stay exit
/// statuses.
const DEATH_SIGNALS: &[i32] = &[
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGKILL,
    libc::SIGSEGV,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
];

/// Exit code and signal from bubblewrap's own exit status (see
/// [`DEATH_SIGNALS`]).
pub(super) fn interpret(status: Option<ExitStatus>) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    let Some(status) = status else {
        return (None, None);
    };
    match (status.code(), status.signal()) {
        (Some(c), _) if DEATH_SIGNALS.contains(&(c - 128)) => (Some(c), Some(c - 128)),
        (Some(c), _) => (Some(c), None),
        (None, Some(s)) => (None, Some(s)),
        (None, None) => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(memory: bool, pids: bool) -> Fired {
        Fired { memory, pids }
    }

    #[test]
    fn bwrap_statuses_are_signals_only_for_the_kernels_own() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            interpret(Some(ExitStatus::from_raw(137 << 8))),
            (Some(137), Some(9))
        );
        assert_eq!(
            interpret(Some(ExitStatus::from_raw(3 << 8))),
            (Some(3), None)
        );
        assert_eq!(interpret(Some(ExitStatus::from_raw(9))), (None, Some(9)));
        assert_eq!(
            interpret(Some(ExitStatus::from_raw(139 << 8))),
            (Some(139), Some(libc::SIGSEGV))
        );
        // `exit 130` after a handled SIGINT, `exit 143` after SIGTERM: statuses.
        for status in [129, 130, 141, 143, 200] {
            assert_eq!(
                interpret(Some(ExitStatus::from_raw(status << 8))),
                (Some(status), None)
            );
        }
    }

    #[test]
    fn timeout_wins_and_process_limit_is_still_reported() {
        let mut o = Outcome::ended(None, Some(9));
        attribute_limits(&mut o, Some(LimitKind::Timeout), fired(false, true));
        assert_eq!(o.limit, Some(LimitKind::Timeout));
        assert_eq!(
            o.limits_reached,
            vec![LimitKind::Timeout, LimitKind::Processes]
        );
    }

    #[test]
    fn memory_kill_is_attributed() {
        let mut o = Outcome::ended(Some(137), Some(9));
        attribute_limits(&mut o, None, fired(true, false));
        assert_eq!(o.limit, Some(LimitKind::Memory));
    }

    #[test]
    fn cpu_and_file_size_signals_are_attributed() {
        let mut o = Outcome::ended(Some(128 + libc::SIGXCPU), Some(libc::SIGXCPU));
        attribute_limits(&mut o, None, Fired::default());
        assert_eq!(o.limit, Some(LimitKind::Cpu));
        let mut o = Outcome::ended(Some(128 + libc::SIGXFSZ), Some(libc::SIGXFSZ));
        attribute_limits(&mut o, None, Fired::default());
        assert_eq!(o.limit, Some(LimitKind::FileSize));
    }

    #[test]
    fn process_limit_ends_a_failed_run_but_not_a_successful_one() {
        let mut o = Outcome::ended(Some(1), None);
        attribute_limits(&mut o, None, fired(false, true));
        assert_eq!(o.limit, Some(LimitKind::Processes));
        let mut o = Outcome::ended(Some(0), None);
        attribute_limits(&mut o, None, fired(false, true));
        assert_eq!(o.limit, None);
        assert_eq!(o.limits_reached, vec![LimitKind::Processes]);
    }
}
