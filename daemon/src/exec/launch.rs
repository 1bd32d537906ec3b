//! Starting a sandbox's bubblewrap without copying the daemon. A fork
//! copies the daemon's page tables, and every page the daemon then writes
//! faults once to be made its own again: under sustained load that was
//! about a tenth of all the machine's CPU. Here the child shares the
//! daemon's memory until it execs (`CLONE_VM | CLONE_VFORK`, as
//! posix_spawn does), on a stack of its own, while the thread that started
//! it waits.
//!
//! In the nest there are two such children: the first sets the rlimits and
//! joins the nest's namespaces, then starts the second as the daemon's
//! child (`CLONE_PARENT`) inside the nest's pid namespace, reports its pid
//! and exits; the second stages the sandbox's filesystems and execs. Out of
//! the nest the first child does both parts.
//!
//! What the children run may make system calls on data prepared before,
//! and nothing else: they share the daemon's heap while its other threads
//! run, and the waiting thread's thread-local storage (so no allocation, no
//! lock, no panic). Signals stay blocked from before the clone until just
//! before exec, by when every handler the daemon installed is reset (a
//! handler would run on the daemon's memory).
//!
//! A child that does not exec (the nest's first child, [`in_child`]'s)
//! shares the daemon's descriptor table too (`CLONE_FILES`), and closes
//! what it opens: with a table of its own, its start would take a
//! reference on each of the daemon's hundreds of descriptors and its exit
//! close them all again. Only the child that execs gets a copy, whose
//! descriptors it may renumber and which exec trims to what it passes on.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

use super::child::ChildPlan;

/// Each child's stack. The children call nothing deep (staging is a few
/// dozen system calls), but a stack overflow would write into the daemon's
/// memory: each stack has a guard page below it.
const STACK_BYTES: usize = 256 * 1024;
/// How many pairs of stacks are kept for the next children (about one for
/// each sandbox being started at once).
const SPARE_STACKS_KEPT: usize = 8;

/// Where the program's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Output {
    /// Pipes, whose read ends the daemon gets.
    Piped,
    /// /dev/null.
    Discarded,
}

/// Whether a child shares the daemon's descriptor table or gets a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Descriptors {
    /// The child execs: it gets a copy, to renumber and pass on.
    Copied,
    /// The child exits without exec, closing what it opened.
    Shared,
}

impl Descriptors {
    fn clone_flags(self) -> libc::c_int {
        match self {
            Descriptors::Copied => 0,
            Descriptors::Shared => libc::CLONE_FILES,
        }
    }
}

/// A started program.
pub(super) struct Launched {
    /// The process started: the program itself or, in the nest, the first
    /// child, which reports the program's pid and exits.
    pub(super) pid: u32,
    /// The read ends of its stdout and stderr, when piped.
    pub(super) output: Option<(OwnedFd, OwnedFd)>,
}

/// What both children read, in the daemon's memory.
struct Shared<'a> {
    plan: &'a ChildPlan,
    program: &'a CStr,
    /// NUL-terminated arrays for execve.
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    /// Descriptors (all above 2) that become stdin, stdout and stderr.
    stdio: [RawFd; 3],
    /// The top of the second child's stack.
    second_stack: *mut libc::c_void,
    /// The first error either child met, as an errno; 0 if none.
    failed: AtomicI32,
}

/// Starts `program` with `args`, an empty environment, stdin on /dev/null
/// and `output`, following `plan` (see [`ChildPlan`]). Returns once the
/// program has been exec'd or failed to be (the error is the child's).
pub(super) fn launch(
    program: &Path,
    args: &[&OsStr],
    plan: &ChildPlan,
    output: Output,
) -> io::Result<Launched> {
    let cstring =
        |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| io::Error::other("NUL in an argument"));
    let program_c = cstring(program.as_os_str())?;
    let args_c = std::iter::once(Ok(program_c.clone()))
        .chain(args.iter().map(|a| cstring(a)))
        .collect::<io::Result<Vec<CString>>>()?;
    let argv: Vec<*const libc::c_char> = args_c
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp = [std::ptr::null::<libc::c_char>()];

    let flags = rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC;
    let null = above_stdio(rustix::fs::open(
        c"/dev/null",
        flags,
        rustix::fs::Mode::empty(),
    )?)?;
    let (pipes, child_out, child_err) = match output {
        Output::Piped => {
            let pipe = || -> io::Result<(OwnedFd, OwnedFd)> {
                let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
                Ok((r, above_stdio(w)?))
            };
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            (Some((out_r, err_r)), Some(out_w), Some(err_w))
        }
        Output::Discarded => (None, None, None),
    };
    let raw = |fd: &Option<OwnedFd>| fd.as_ref().map_or(null.as_raw_fd(), |f| f.as_raw_fd());
    let stacks = Stacks::take()?;
    let shared = Shared {
        plan,
        program: &program_c,
        argv: &argv,
        envp: &envp,
        stdio: [null.as_raw_fd(), raw(&child_out), raw(&child_err)],
        second_stack: stacks.top(1),
        failed: AtomicI32::new(0),
    };

    // In the nest the first child only joins namespaces and starts the
    // second, which execs; out of it the first child execs.
    let descriptors = match plan.nest {
        Some(_) => Descriptors::Shared,
        None => Descriptors::Copied,
    };
    // SAFETY: `first` reads `shared`, which outlives it: CLONE_VFORK keeps
    // this thread here until the child has exec'd or exited (in the nest,
    // until the first child has exited, after its own child has exec'd or
    // exited). The children follow the rules in the module's header; in the
    // nest the first child opens, renumbers and closes no descriptor.
    let started = unsafe {
        clone_sharing_memory(
            first,
            &stacks,
            &shared as *const Shared as *mut libc::c_void,
            descriptors,
        )
    };
    stacks.give_back();
    let pid = started?;
    match shared.failed.load(Ordering::SeqCst) {
        0 => Ok(Launched {
            pid: pid as u32,
            output: pipes,
        }),
        errno => {
            // The child started here has exited (or is about to); in the
            // nest, the second one is named in the reports, whose reader
            // reaps it.
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = wait_for(pid);
            }
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// Runs `body` in a child that shares the daemon's memory (under the rules
/// in the module's header) and exits with what `body` returns; waits for
/// it and returns its exit code. For short sequences of system calls in
/// other namespaces, which a thread of the daemon cannot join. The child
/// shares the daemon's descriptors: `body` must close every descriptor it
/// opens, and no other.
pub(super) fn in_child(body: &dyn Fn() -> i32) -> io::Result<i32> {
    let stacks = Stacks::take()?;
    // SAFETY: `run_body` reads `body`, which outlives it: CLONE_VFORK keeps
    // this thread here until the child has exited, which it does without
    // exec; `body` closes what it opens (the caller's promise).
    let started = unsafe {
        clone_sharing_memory(
            run_body,
            &stacks,
            &body as *const &dyn Fn() -> i32 as *mut libc::c_void,
            Descriptors::Shared,
        )
    };
    stacks.give_back();
    let pid = rustix::process::Pid::from_raw(started?).expect("a child's pid is positive");
    let status = wait_for(pid)?;
    status
        .exit_status()
        .ok_or_else(|| io::Error::other(format!("the child ended with {status:?}")))
}

/// Waits for the child `pid` to end and reaps it.
fn wait_for(pid: rustix::process::Pid) -> io::Result<rustix::process::WaitStatus> {
    loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => return Ok(status),
            Ok(None) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Starts `child(arg)` on the first of `stacks`, sharing this process's
/// memory, and returns its pid once it has exec'd or exited
/// (`CLONE_VFORK`). Every signal is blocked on this thread for the clone,
/// so that the child starts with all blocked (see the module's header),
/// and restored after.
///
/// With `Descriptors::Shared` the child shares this process's descriptor
/// table (see the module's header).
///
/// # Safety
/// `arg` must stay valid until the child has exec'd or exited, and the
/// child must follow the rules in the module's header; a child sharing
/// the descriptor table must neither exec nor change or close a
/// descriptor it did not open.
unsafe fn clone_sharing_memory(
    child: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stacks: &Stacks,
    arg: *mut libc::c_void,
    descriptors: Descriptors,
) -> io::Result<i32> {
    // SAFETY: the signal sets are plain values on this stack; the mask
    // saved is this thread's own, put back below.
    let saved = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut saved: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
        saved
    };
    // SAFETY: the child runs on a stack of its own, mapped for it and used
    // by no one else; the caller vouches for `arg` and the child.
    let pid = unsafe {
        libc::clone(
            child,
            stacks.top(0),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | descriptors.clone_flags(),
            arg,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: puts back this thread's mask, saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    if pid < 0 { Err(clone_error) } else { Ok(pid) }
}

/// The child of [`in_child`].
extern "C" fn run_body(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&dyn Fn` that `in_child` keeps alive until this
    // process has exited.
    let body = unsafe { &*(arg as *const &dyn Fn() -> i32) };
    let code = body();
    // SAFETY: ends this process at once, running nothing of the daemon's.
    unsafe { libc::_exit(code) }
}

/// `fd`, moved above 0, 1 and 2 when it is one of them (the daemon's own
/// standard streams may be closed), so that making the child's standard
/// streams cannot overwrite another.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(fd.as_fd(), 3)?)
}

/// The first child: see the module's header. Never returns.
extern "C" fn first(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` that `launch` keeps alive until this
    // process has exited or exec'd.
    let shared = unsafe { &*(arg as *const Shared) };
    if let Err(e) = shared.plan.enter() {
        fail(shared, &e);
    }
    let Some(nest) = &shared.plan.nest else {
        become_program(shared)
    };
    // SAFETY: as in `launch`; CLONE_PARENT makes the new process the
    // daemon's child, and this one waits for it to exec or exit.
    let pid = unsafe {
        libc::clone(
            second,
            shared.second_stack,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT | libc::SIGCHLD,
            arg,
        )
    };
    if pid < 0 {
        let e = io::Error::last_os_error();
        nest.report_started(Err(
            rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::AGAIN)
        ));
        fail(shared, &e);
    }
    nest.report_started(Ok(pid));
    // SAFETY: ends this process at once, running nothing of the daemon's.
    unsafe { libc::_exit(0) }
}

/// The second child, in the nest: see the module's header. Never returns.
extern "C" fn second(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as in `first`.
    become_program(unsafe { &*(arg as *const Shared) })
}

/// Stages, takes the program's identity and descriptors, and execs it.
fn become_program(shared: &Shared) -> ! {
    if shared.plan.nest.is_none()
        && let Err(e) = rustix::process::setpgid(None, None)
    {
        fail(shared, &io::Error::from(e));
    }
    if let Err(e) = shared.plan.prepare() {
        fail(shared, &e);
    }
    for (target, &fd) in shared.stdio.iter().enumerate() {
        // SAFETY: dup2 onto 0, 1, 2 from descriptors above them; the copies
        // are not close-on-exec.
        if unsafe { libc::dup2(fd, target as RawFd) } < 0 {
            fail(shared, &io::Error::last_os_error());
        }
    }
    reset_signals();
    // SAFETY: the arrays are NUL-terminated and point at C strings that
    // `launch` keeps alive; on success this process is replaced.
    unsafe {
        libc::execve(
            shared.program.as_ptr(),
            shared.argv.as_ptr(),
            shared.envp.as_ptr(),
        )
    };
    fail(shared, &io::Error::last_os_error())
}

/// The kernel's `struct sigaction` (x86-64 and aarch64 both have the
/// restorer field): the C library's refuses the signals it keeps for itself.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Gives the program the signal state of a fresh process: every signal's
/// disposition the default (a handler of the daemon's must not run before
/// exec, and an ignored signal, such as SIGPIPE, which the daemon ignores,
/// would stay ignored after it) and nothing blocked.
fn reset_signals() {
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sets this process's disposition of `signal` from a value
        // on this stack; the size is the kernel's signal set's.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
    }
    let none: u64 = 0;
    // SAFETY: an empty signal set on this stack, of the kernel's size.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
}

/// Records the first error and ends the child.
fn fail(shared: &Shared, e: &io::Error) -> ! {
    let errno = e.raw_os_error().unwrap_or(libc::EIO);
    let _ = shared
        .failed
        .compare_exchange(0, errno, Ordering::SeqCst, Ordering::SeqCst);
    // SAFETY: ends this process at once, running nothing of the daemon's.
    unsafe { libc::_exit(127) }
}

/// The children's two stacks, each above a guard page, in one mapping.
struct Stacks {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping belongs to the value alone; a child uses it only
// while the thread that started it waits (CLONE_VFORK), and the value
// moves between threads only when no child runs on it.
unsafe impl Send for Stacks {}

/// Stacks whose children have exec'd or exited, for the next ones: a
/// fresh mapping for each child cost its system calls, its page faults,
/// and at its unmapping, with the daemon's threads on other CPUs, a flush
/// of their address translations.
static SPARE_STACKS: Mutex<Vec<Stacks>> = Mutex::new(Vec::new());

impl Stacks {
    /// A pair kept from an earlier child, or a new one.
    fn take() -> io::Result<Stacks> {
        let spare = SPARE_STACKS.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match spare {
            Some(stacks) => Ok(stacks),
            None => Stacks::new(),
        }
    }

    /// Keeps the pair for a later child, or unmaps it when enough are kept.
    /// Only once every child that ran on it has exec'd or exited.
    fn give_back(self) {
        let mut spare = SPARE_STACKS.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < SPARE_STACKS_KEPT {
            spare.push(self);
        }
    }

    fn new() -> io::Result<Stacks> {
        let page = rustix::param::page_size();
        let len = 2 * (page + STACK_BYTES);
        // SAFETY: a new private anonymous mapping, owned by the returned
        // value, which unmaps it; nothing else refers to it.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::STACK,
            )?
        };
        let stacks = Stacks { base, len };
        for i in 0..2 {
            // SAFETY: the guard pages lie inside the mapping made above.
            unsafe {
                rustix::mm::mprotect(stacks.guard(i), page, rustix::mm::MprotectFlags::empty())?;
            }
        }
        Ok(stacks)
    }

    /// The lowest page of stack `i`'s part: its guard.
    fn guard(&self, i: usize) -> *mut libc::c_void {
        let part = self.len / 2;
        self.base.cast::<u8>().wrapping_add(i * part).cast()
    }

    /// The top of stack `i` (stacks grow down), 16-byte aligned.
    fn top(&self, i: usize) -> *mut libc::c_void {
        let part = self.len / 2;
        self.base.cast::<u8>().wrapping_add((i + 1) * part).cast()
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, and no child runs on it any more
        // (CLONE_VFORK: each has exec'd or exited).
        let _ = unsafe { rustix::mm::munmap(self.base, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn wait(pid: u32) -> rustix::process::WaitStatus {
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
            .unwrap()
            .unwrap()
            .1
    }

    fn read(fd: OwnedFd) -> String {
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn in_child_runs_in_a_process_of_its_own_and_returns_its_exit_code() {
        let me = rustix::process::getpid();
        let other = || {
            if rustix::process::getpid() != me {
                42
            } else {
                1
            }
        };
        assert_eq!(in_child(&other).unwrap(), 42);
    }

    #[test]
    fn the_program_gets_its_arguments_an_empty_environment_and_its_pipes() {
        let plan = ChildPlan::bare(None);
        let script = OsStr::new("echo \"$0 $1\" \"${HOME-unset}\"; echo err >&2; exit 7");
        let args = [
            OsStr::new("-c"),
            script,
            OsStr::new("zero"),
            OsStr::new("one"),
        ];
        let started = launch(Path::new("/bin/sh"), &args, &plan, Output::Piped).unwrap();
        let (out, err) = started.output.unwrap();
        assert_eq!(read(out), "zero one unset\n");
        assert_eq!(read(err), "err\n");
        assert_eq!(wait(started.pid).exit_status(), Some(7));
    }

    #[test]
    fn the_program_starts_with_no_signal_blocked_or_ignored_in_its_own_group() {
        // SAFETY: ignores SIGPIPE (as the daemon does) and blocks SIGUSR1 on
        // this test's thread; both are put back before the test ends.
        let saved = unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGUSR1);
            let mut saved: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut saved);
            (saved, libc::signal(libc::SIGPIPE, libc::SIG_IGN))
        };
        let plan = ChildPlan::bare(None);
        let script = OsStr::new("grep -E '^Sig(Blk|Ign)' /proc/self/status; ps -o pgid= -p $$");
        let started = launch(
            Path::new("/bin/sh"),
            &[OsStr::new("-c"), script],
            &plan,
            Output::Piped,
        );
        // SAFETY: puts back what was saved above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &saved.0, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, saved.1);
        }
        let started = started.unwrap();
        let out = read(started.output.unwrap().0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        for line in &lines[..2] {
            assert!(line.ends_with("0000000000000000"), "{line}");
        }
        assert_eq!(
            lines[2].trim(),
            started.pid.to_string(),
            "its own process group"
        );
        assert!(wait(started.pid).exit_status() == Some(0));
    }

    #[test]
    fn a_program_that_cannot_be_executed_is_the_launch_error() {
        let plan = ChildPlan::bare(None);
        let e = launch(
            Path::new("/nonexistent/program"),
            &[],
            &plan,
            Output::Discarded,
        )
        .err()
        .expect("no such program");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = launch(Path::new("/etc"), &[], &plan, Output::Discarded)
            .err()
            .expect("a directory");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn the_program_inherits_exactly_the_descriptors_it_is_given() {
        let (kept, _kept_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let (other, _other_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::empty()).unwrap();
        let kept_number = kept.as_raw_fd();
        let mut plan = ChildPlan::bare(None);
        plan.inherit = std::sync::Arc::new(vec![kept]);
        let script = format!(
            "ls /proc/self/fd; test -e /proc/self/fd/{}",
            other.as_raw_fd()
        );
        let started = launch(
            Path::new("/bin/sh"),
            &[OsStr::new("-c"), OsStr::new(&script)],
            &plan,
            Output::Piped,
        )
        .unwrap();
        let out = read(started.output.unwrap().0);
        let mut fds: Vec<i32> = out.lines().filter_map(|l| l.parse().ok()).collect();
        fds.sort();
        // 0, 1, 2, the one given, and the one ls opens to list them.
        assert_eq!(fds[..3], [0, 1, 2], "{out}");
        assert!(fds.contains(&kept_number), "{out}");
        assert_eq!(fds.len(), 5, "{out}");
        assert_eq!(
            wait(started.pid).exit_status(),
            Some(1),
            "the other is not inherited"
        );
    }
}
