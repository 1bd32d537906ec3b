//! The syscall filter handed to bubblewrap. Blocks the kernel interfaces a
//! sandboxed program has no business using (debugging or reaching into other
//! processes, the keyring, mounts and namespaces, kexec, bpf, perf,
//! userfaultfd, io_uring, x86 segment and port access, terminal injection,
//! personality changes, sockets to the host's VMs). docs/security.md compares
//! the list with Docker's default profile and Codex's Linux sandbox, and
//! gives the reason for each difference.
//!
//! The filter is one classic BPF program, built here, because its size is
//! paid in every sandbox: the kernel checks and compiles the program each
//! time bubblewrap loads it, about 60 us for this one against over 300 us
//! for the chain of comparisons a generic builder emits for the same list
//! (688 instructions). It checks the architecture (any other is killed),
//! refuses the x32 ABI as a whole (ENOSYS, as a kernel built without it
//! answers), then finds the call's number by binary search: at most 24
//! instructions for any call. What the filter adds to each system call is
//! mostly seccomp's own entry cost, the same for a two-instruction filter
//! (`bench/syscalls.py`).

/// Syscalls refused outright (with EPERM), by name. An environment may let
/// some of them through with `seccomp_allow`.
pub const BLOCKED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    // Like ptrace, these reach into another process (or compare its
    // kernel objects); Docker allows them only with CAP_SYS_PTRACE.
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    // Need capabilities the sandbox never has; refused here too, so a
    // kernel bug behind the capability check is out of reach.
    "quotactl",
    "vhangup",
    "fanotify_init",
    "lookup_dcookie",
    // x86 only: the local descriptor table (the path of several kernel
    // bugs, and needed only by 16-bit code and Wine), I/O ports, and
    // obsolete calls.
    #[cfg(target_arch = "x86_64")]
    "modify_ldt",
    #[cfg(target_arch = "x86_64")]
    "iopl",
    #[cfg(target_arch = "x86_64")]
    "ioperm",
    #[cfg(target_arch = "x86_64")]
    "uselib",
    #[cfg(target_arch = "x86_64")]
    "ustat",
    #[cfg(target_arch = "x86_64")]
    "sysfs",
];

/// Syscalls blocked only for some arguments: terminal injection ioctls,
/// namespace-creating clone flags, personality changes, and `socket` for
/// the vsock family (not confined by the network namespace: it reaches the
/// host's virtual machines, or the hypervisor when the host is one).
pub const CONDITIONAL: &[&str] = &["ioctl", "clone", "personality", "socket"];

const AF_VSOCK: u32 = 40;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
/// CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
/// CLONE_NEWPID, CLONE_NEWNET.
const CLONE_NAMESPACE_FLAGS: u32 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;
/// Personalities programs legitimately query or set (as Docker's profile allows).
const PERSONALITIES_ALLOWED: &[u32] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The compiled filter for one environment: `struct sock_filter`
/// instructions, native endian, as bubblewrap loads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program(pub Vec<u8>);

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp_allow: {0:?} is not a syscall the filter blocks (it blocks: {1})")]
    UnknownSyscall(String, String),
    #[error("seccomp filters are not available for this architecture ({0})")]
    Arch(&'static str),
    #[error("cannot build the seccomp filter: {0}")]
    Build(String),
}

/// Checks an environment's `seccomp_allow` list.
pub fn validate_allow(allow: &[String]) -> Result<(), SeccompError> {
    for name in allow {
        if !BLOCKED.contains(&name.as_str()) && !CONDITIONAL.contains(&name.as_str()) {
            let all: Vec<&str> = BLOCKED.iter().chain(CONDITIONAL).copied().collect();
            return Err(SeccompError::UnknownSyscall(name.clone(), all.join(", ")));
        }
    }
    Ok(())
}

/// What the filter does with one listed syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// EPERM.
    Refuse,
    /// ENOSYS: for `clone3`, so that the C library falls back to `clone`,
    /// whose flags the filter can see (`clone3` passes them in memory).
    Absent,
    /// EPERM when argument `arg` (its low 32 bits, which is what the kernel
    /// reads for these calls) is one of `values`.
    RefuseIfAny { arg: u32, values: &'static [u32] },
    /// EPERM when argument `arg` has any of the bits of `mask`.
    RefuseIfBits { arg: u32, mask: u32 },
    /// EPERM unless argument `arg` is one of `values`.
    RefuseUnless { arg: u32, values: &'static [u32] },
}

/// Builds the filter, minus the syscalls in `allow`.
pub fn compile(allow: &[String]) -> Result<Program, SeccompError> {
    validate_allow(allow)?;
    let arch = audit_arch().ok_or(SeccompError::Arch(std::env::consts::ARCH))?;
    let allowed = |name: &str| allow.iter().any(|a| a == name);
    let mut rules: std::collections::BTreeMap<u32, Rule> = std::collections::BTreeMap::new();
    let mut add = |name: &str, nr: i64, rule: Rule| {
        if !allowed(name) {
            rules.insert(nr as u32, rule);
        }
    };
    for name in BLOCKED {
        if let Some(nr) = syscall_number(name) {
            add(name, nr, Rule::Refuse);
        }
    }
    let ioctl = Rule::RefuseIfAny {
        arg: 1,
        values: &[TIOCSTI, TIOCLINUX],
    };
    add("ioctl", libc::SYS_ioctl, ioctl);
    let clone = Rule::RefuseIfBits {
        arg: 0,
        mask: CLONE_NAMESPACE_FLAGS,
    };
    add("clone", libc::SYS_clone, clone);
    // With `clone` allowed, clone3 is too: it could do nothing clone cannot.
    add("clone", libc::SYS_clone3, Rule::Absent);
    let vsock = Rule::RefuseIfAny {
        arg: 0,
        values: &[AF_VSOCK],
    };
    add("socket", libc::SYS_socket, vsock);
    let personality = Rule::RefuseUnless {
        arg: 0,
        values: PERSONALITIES_ALLOWED,
    };
    add("personality", libc::SYS_personality, personality);

    let listed: Vec<(u32, Rule)> = rules.into_iter().collect();
    let mut program = vec![
        load(SECCOMP_DATA_ARCH),
        jump(BPF_JEQ, arch, 1, 0),
        ret(SECCOMP_RET_KILL_PROCESS),
        load(SECCOMP_DATA_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        program.push(jump(BPF_JGE, X32_SYSCALL_BIT, 0, 1));
        program.push(ret(errno(libc::ENOSYS)));
    }
    program.extend(search(&listed)?);
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(Program(bytes))
}

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ: u16 = 0x15;
const BPF_JGE: u16 = 0x35;
const BPF_JSET: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// Offsets in `struct seccomp_data`: nr (int), arch (u32), the
/// instruction pointer (u64), then six u64 arguments.
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const SECCOMP_DATA_ARGS: u32 = 16;
/// x86-64's x32 ABI: the same architecture tag, this bit set in the number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Up to this many numbers are compared one by one; more are split in two.
const LINEAR: usize = 3;

fn load(offset: u32) -> Insn {
    Insn {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: offset,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}

fn ret(k: u32) -> Insn {
    Insn {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k,
    }
}

fn errno(e: i32) -> u32 {
    SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
}

/// The low 32 bits of argument `arg`.
fn load_arg(arg: u32) -> Insn {
    let low = if cfg!(target_endian = "little") { 0 } else { 4 };
    load(SECCOMP_DATA_ARGS + 8 * arg + low)
}

/// A forward jump over `n` instructions, which must fit the 8-bit offset.
fn skip(n: usize) -> Result<u8, SeccompError> {
    u8::try_from(n).map_err(|_| SeccompError::Build(format!("a jump over {n} instructions")))
}

/// The code that finds the number in the accumulator among `listed`
/// (sorted) and returns the action: halves compared with one jump each,
/// the last few numbers one by one; a number not listed is allowed.
fn search(listed: &[(u32, Rule)]) -> Result<Vec<Insn>, SeccompError> {
    if listed.len() <= LINEAR {
        let mut out = Vec::new();
        for (nr, rule) in listed {
            let body = action(*rule)?;
            out.push(jump(BPF_JEQ, *nr, 0, skip(body.len())?));
            out.extend(body);
        }
        out.push(ret(SECCOMP_RET_ALLOW));
        return Ok(out);
    }
    let (low, high) = listed.split_at(listed.len() / 2);
    let low = search(low)?;
    let mut out = vec![jump(BPF_JGE, high[0].0, skip(low.len())?, 0)];
    out.extend(low);
    out.extend(search(high)?);
    Ok(out)
}

/// The code for one listed call; it always returns.
fn action(rule: Rule) -> Result<Vec<Insn>, SeccompError> {
    let refuse = ret(errno(libc::EPERM));
    let allow = ret(SECCOMP_RET_ALLOW);
    Ok(match rule {
        Rule::Refuse => vec![refuse],
        Rule::Absent => vec![ret(errno(libc::ENOSYS))],
        Rule::RefuseIfBits { arg, mask } => {
            vec![load_arg(arg), jump(BPF_JSET, mask, 1, 0), allow, refuse]
        }
        // Each match jumps over the comparisons after it to the last
        // instruction; falling through all of them reaches the other one.
        Rule::RefuseIfAny { arg, values } | Rule::RefuseUnless { arg, values } => {
            let mut out = vec![load_arg(arg)];
            for (i, v) in values.iter().enumerate() {
                out.push(jump(BPF_JEQ, *v, skip(values.len() - i)?, 0));
            }
            let (no_match, matched) = match rule {
                Rule::RefuseIfAny { .. } => (allow, refuse),
                _ => (refuse, allow),
            };
            out.extend([no_match, matched]);
            out
        }
    })
}

/// The kernel's name for this architecture in `seccomp_data.arch`.
fn audit_arch() -> Option<u32> {
    match std::env::consts::ARCH {
        "x86_64" => Some(0xC000_003E),
        "aarch64" => Some(0xC000_00B7),
        "riscv64" => Some(0xC000_00F3),
        _ => None,
    }
}

fn syscall_number(name: &str) -> Option<i64> {
    let nr = match name {
        "ptrace" => libc::SYS_ptrace,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "keyctl" => libc::SYS_keyctl,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "userfaultfd" => libc::SYS_userfaultfd,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "fsopen" => libc::SYS_fsopen,
        "fsconfig" => libc::SYS_fsconfig,
        "fsmount" => libc::SYS_fsmount,
        "fspick" => libc::SYS_fspick,
        "move_mount" => libc::SYS_move_mount,
        "open_tree" => libc::SYS_open_tree,
        "mount_setattr" => libc::SYS_mount_setattr,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "reboot" => libc::SYS_reboot,
        "syslog" => libc::SYS_syslog,
        "acct" => libc::SYS_acct,
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_uring_enter" => libc::SYS_io_uring_enter,
        "io_uring_register" => libc::SYS_io_uring_register,
        "kcmp" => libc::SYS_kcmp,
        "pidfd_getfd" => libc::SYS_pidfd_getfd,
        "process_madvise" => libc::SYS_process_madvise,
        "quotactl" => libc::SYS_quotactl,
        "vhangup" => libc::SYS_vhangup,
        "fanotify_init" => libc::SYS_fanotify_init,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        #[cfg(target_arch = "x86_64")]
        "modify_ldt" => libc::SYS_modify_ldt,
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        "uselib" => libc::SYS_uselib,
        #[cfg(target_arch = "x86_64")]
        "ustat" => libc::SYS_ustat,
        #[cfg(target_arch = "x86_64")]
        "sysfs" => libc::SYS_sysfs,
        _ => return None,
    };
    Some(nr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF program the way the kernel does for one call,
    /// returning its action and how many instructions it ran.
    fn run(program: &Program, arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let insns: Vec<(u16, u8, u8, u32)> = program
            .0
            .chunks(8)
            .map(|c| {
                (
                    u16::from_ne_bytes([c[0], c[1]]),
                    c[2],
                    c[3],
                    u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let (code, jt, jf, k) = insns[pc];
            steps += 1;
            let branch = |taken: bool| pc + 1 + usize::from(if taken { jt } else { jf });
            pc = match code {
                BPF_LD_W_ABS => {
                    let at = k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                    pc + 1
                }
                BPF_JEQ => branch(acc == k),
                BPF_JGE => branch(acc >= k),
                BPF_JSET => branch(acc & k != 0),
                BPF_RET_K => return (k, steps),
                other => panic!("unexpected instruction {other:#x}"),
            };
        }
    }

    fn nr(name: &str) -> u32 {
        match name {
            "ioctl" => libc::SYS_ioctl as u32,
            "clone" => libc::SYS_clone as u32,
            "clone3" => libc::SYS_clone3 as u32,
            "socket" => libc::SYS_socket as u32,
            "personality" => libc::SYS_personality as u32,
            _ => syscall_number(name).unwrap() as u32,
        }
    }

    /// What the filter must answer, from the lists themselves.
    fn expected(allow: &[&str], nr_: u32, args: [u64; 6]) -> u32 {
        let eperm = errno(libc::EPERM);
        let blocked = |name: &str| !allow.contains(&name) && nr(name) == nr_;
        if cfg!(target_arch = "x86_64") && nr_ >= X32_SYSCALL_BIT {
            return errno(libc::ENOSYS);
        }
        if BLOCKED.iter().any(|n| blocked(n)) {
            return eperm;
        }
        let arg = |i: usize| args[i] as u32;
        // clone3 has no name of its own in `seccomp_allow`: it goes with clone.
        if nr_ == nr("clone3") && !allow.contains(&"clone") {
            return errno(libc::ENOSYS);
        }
        let refused = (blocked("ioctl") && (arg(1) == TIOCSTI || arg(1) == TIOCLINUX))
            || (blocked("clone") && arg(0) & CLONE_NAMESPACE_FLAGS != 0)
            || (blocked("socket") && arg(0) == AF_VSOCK)
            || (blocked("personality") && !PERSONALITIES_ALLOWED.contains(&arg(0)));
        if refused { eperm } else { SECCOMP_RET_ALLOW }
    }

    /// Argument sets that tell every conditional rule's cases apart,
    /// including values whose high 32 bits are set (the kernel ignores them
    /// for these calls, and so must the filter).
    fn argument_cases() -> Vec<[u64; 6]> {
        let mut cases = vec![[0; 6]];
        let firsts = [
            u64::from(AF_VSOCK),
            2,
            0x0002_0000,
            0x1000_0000,
            0x0001_0000 | 0x0000_0100,
            0x8,
            0x0040_0000,
            0xffff_ffff,
            (1 << 32) | u64::from(AF_VSOCK),
        ];
        for a in firsts {
            cases.push([a, 0, 0, 0, 0, 0]);
        }
        for b in [
            u64::from(TIOCSTI),
            u64::from(TIOCLINUX),
            0x5401,
            (7 << 32) | 0x5412,
        ] {
            cases.push([0, b, 0, 0, 0, 0]);
        }
        cases
    }

    fn agrees_with_the_lists(allow: &[&str]) {
        let program = compile(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let arch = audit_arch().unwrap();
        let mut longest = 0;
        let mut numbers: Vec<u32> = (0..1024).collect();
        numbers.extend([
            X32_SYSCALL_BIT,
            X32_SYSCALL_BIT | 39,
            X32_SYSCALL_BIT | 101,
            u32::MAX,
        ]);
        for n in numbers {
            for args in argument_cases() {
                let (action, steps) = run(&program, arch, n, args);
                assert_eq!(action, expected(allow, n, args), "nr {n} args {args:x?}");
                longest = longest.max(steps);
            }
        }
        // Any call, allowed or not, costs a handful of comparisons.
        assert!(longest <= 24, "{longest} instructions on the longest path");
    }

    #[test]
    fn every_call_gets_the_listed_answer() {
        agrees_with_the_lists(&[]);
    }

    #[test]
    fn allowed_calls_get_through_and_only_they() {
        agrees_with_the_lists(&["ptrace", "personality"]);
        agrees_with_the_lists(&["clone", "ioctl", "socket", "mount"]);
        let everything: Vec<&str> = BLOCKED.iter().chain(CONDITIONAL).copied().collect();
        agrees_with_the_lists(&everything);
    }

    #[test]
    fn another_architecture_is_killed() {
        let program = compile(&[]).unwrap();
        let i386 = 0x4000_0003;
        assert_eq!(run(&program, i386, 39, [0; 6]).0, SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn every_blocked_name_has_a_number() {
        for name in BLOCKED {
            assert!(syscall_number(name).is_some(), "{name}");
        }
    }

    #[test]
    fn unknown_allow_is_an_error() {
        let e = compile(&["read".to_string()]).unwrap_err().to_string();
        assert!(e.contains("\"read\"") && e.contains("ptrace"), "{e}");
    }
}
