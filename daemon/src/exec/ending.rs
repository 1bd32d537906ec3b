//! How a call ended, told once for runs, jobs, declared commands, sessions
//! and the CLI: which [`Ending`] an [`Outcome`] is, the sentence a model or
//! a user reads for it, and the status `run` exits with.
//!
//! | ending | sentence (a run; in a session, "a call" or "the session") | `run` exits |
//! |---|---|---|
//! | exited with N | the program exited with status N | N |
//! | killed by signal N | the program was killed by SIGNAME | 128+N |
//! | [`LimitKind::Timeout`] | the run exceeded its T ms time limit | 124 |
//! | [`LimitKind::Memory`] | the run used more than its M MiB memory limit | 125 |
//! | [`LimitKind::Processes`] | the run hit its limit of P processes and threads | 125 |
//! | [`LimitKind::Cpu`] | the run used more than its S s of CPU time | 125 |
//! | [`LimitKind::Output`] | the run wrote more than O MiB of output | 125 |
//! | [`LimitKind::FileSize`] | a file grew beyond the F MiB file size limit | 125 |
//! | cancelled | the run was cancelled | 130 |
//! | no status | the sandbox ended without an exit status | 126 |
//!
//! A limit outranks the exit status it caused (a SIGKILL, a SIGXFSZ), and
//! a cancellation outranks both. Where `run`'s own failures (123, 126,
//! 127, 141) come from is the CLI's.

use super::outcome::{LimitKind, Outcome};
use crate::limits::Limits;

/// What ended a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signalled(i32),
    Limit(LimitKind),
    Cancelled,
    /// The sandbox ended and reported no status (a failure of the host's).
    NoStatus,
}

/// Whose ending a sentence tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A run, a job or a declared command: "the run".
    Run,
    /// A call in a session: "a call" for what bounds one call (time, CPU,
    /// output), "the session" for what bounds its sandbox (memory,
    /// processes, files).
    Session,
}

impl Ending {
    pub fn of(o: &Outcome) -> Ending {
        if o.cancelled {
            return Ending::Cancelled;
        }
        if let Some(limit) = o.limit {
            return Ending::Limit(limit);
        }
        match (o.exit_code, o.signal) {
            (_, Some(signal)) => Ending::Signalled(signal),
            (Some(code), None) => Ending::Exited(code),
            (None, None) => Ending::NoStatus,
        }
    }

    /// What happened, in words, for `subject` under `limits`.
    pub fn sentence(self, subject: Subject, limits: &Limits) -> String {
        let (per_call, per_sandbox) = match subject {
            Subject::Run => ("the run", "the run"),
            Subject::Session => ("a call", "the session"),
        };
        match self {
            Ending::Exited(code) => format!("the program exited with status {code}"),
            Ending::Signalled(signal) => {
                format!("the program was killed by {}", signal_name(signal))
            }
            Ending::Cancelled => format!("{per_call} was cancelled"),
            Ending::NoStatus => "the sandbox ended without an exit status".to_string(),
            Ending::Limit(LimitKind::Timeout) => format!(
                "{per_call} exceeded its {} ms time limit",
                limits.timeout.as_millis()
            ),
            Ending::Limit(LimitKind::Memory) => format!(
                "{per_sandbox} used more than its {} MiB memory limit",
                limits.memory_bytes >> 20
            ),
            Ending::Limit(LimitKind::Processes) => format!(
                "{per_sandbox} hit its limit of {} processes and threads",
                limits.pids
            ),
            Ending::Limit(LimitKind::Cpu) => format!(
                "{per_call} used more than its {} s of CPU time",
                limits.cpu_seconds
            ),
            Ending::Limit(LimitKind::Output) => format!(
                "{per_call} wrote more than {} MiB of output",
                limits.output_limit_bytes >> 20
            ),
            Ending::Limit(LimitKind::FileSize) => format!(
                "a file grew beyond the {} MiB file size limit",
                limits.file_size_bytes >> 20
            ),
        }
    }

    /// The status `nix-sandbox-mcp run` exits with.
    pub fn exit_status(self) -> u8 {
        match self {
            Ending::Exited(code) => code.clamp(0, 255) as u8,
            Ending::Signalled(signal) => (128 + signal).clamp(0, 255) as u8,
            Ending::Limit(LimitKind::Timeout) => 124,
            Ending::Limit(_) => 125,
            Ending::Cancelled => 130,
            Ending::NoStatus => 126,
        }
    }
}

/// The signal's name (`SIGKILL`), or `signal N` for one without a common one.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;

    #[test]
    fn a_limit_outranks_the_status_it_caused_and_a_cancellation_outranks_both() {
        let mut o = Outcome::ended(None, Some(9));
        assert_eq!(Ending::of(&o), Ending::Signalled(9));
        o.limit = Some(LimitKind::Memory);
        assert_eq!(Ending::of(&o), Ending::Limit(LimitKind::Memory));
        o.cancelled = true;
        assert_eq!(Ending::of(&o), Ending::Cancelled);
        assert_eq!(
            Ending::of(&Outcome::ended(Some(3), None)),
            Ending::Exited(3)
        );
        assert_eq!(Ending::of(&Outcome::ended(None, None)), Ending::NoStatus);
    }

    #[test]
    fn the_cli_statuses_are_the_documented_table() {
        let cases = [
            (Ending::Exited(0), 0),
            (Ending::Exited(122), 122),
            (Ending::Signalled(9), 137),
            (Ending::Limit(LimitKind::Timeout), 124),
            (Ending::Limit(LimitKind::Memory), 125),
            (Ending::Limit(LimitKind::Processes), 125),
            (Ending::Limit(LimitKind::Cpu), 125),
            (Ending::Limit(LimitKind::Output), 125),
            (Ending::Limit(LimitKind::FileSize), 125),
            (Ending::Cancelled, 130),
            (Ending::NoStatus, 126),
        ];
        for (ending, status) in cases {
            assert_eq!(ending.exit_status(), status, "{ending:?}");
        }
    }

    #[test]
    fn a_session_names_the_call_or_the_session_as_the_limit_bounds_either() {
        let limits = Limits::resolve(Default::default());
        let run = |e: Ending| e.sentence(Subject::Run, &limits);
        let session = |e: Ending| e.sentence(Subject::Session, &limits);
        let timeout = Ending::Limit(LimitKind::Timeout);
        let memory = Ending::Limit(LimitKind::Memory);
        assert_eq!(
            run(timeout),
            format!(
                "the run exceeded its {} ms time limit",
                limits.timeout.as_millis()
            )
        );
        assert!(session(timeout).starts_with("a call exceeded its "));
        assert!(run(memory).starts_with("the run used more than its "));
        assert!(session(memory).starts_with("the session used more than its "));
        assert_eq!(
            run(Ending::Signalled(9)),
            "the program was killed by SIGKILL"
        );
    }
}
