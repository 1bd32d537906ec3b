//! The syscall filter handed to bubblewrap. Blocks the kernel interfaces a
//! sandboxed program has no business using (debugging or reaching into other
//! processes, the keyring, mounts and namespaces, kexec, bpf, perf,
//! userfaultfd, io_uring, x86 segment and port access, terminal injection,
//! personality changes, sockets to the host's VMs). Built with seccompiler;
//! each program is serialized once and copied into a memfd per run.
//! docs/security.md compares the list with Docker's default profile and
//! Codex's Linux sandbox, and gives the reason for each difference.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

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

const AF_VSOCK: u64 = 40;

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const CLONE_NAMESPACE_FLAGS: &[u64] = &[
    0x0002_0000, // CLONE_NEWNS
    0x0200_0000, // CLONE_NEWCGROUP
    0x0400_0000, // CLONE_NEWUTS
    0x0800_0000, // CLONE_NEWIPC
    0x1000_0000, // CLONE_NEWUSER
    0x2000_0000, // CLONE_NEWPID
    0x4000_0000, // CLONE_NEWNET
];
/// Personalities programs legitimately query or set (as Docker's profile allows).
const PERSONALITIES_ALLOWED: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The compiled filters for one environment, in the order bubblewrap loads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs(pub Vec<Vec<u8>>);

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

/// Builds the two filters, minus the syscalls in `allow`. The first refuses the
/// blocked calls with EPERM; the second answers `clone3` with ENOSYS so the C
/// library falls back to `clone`, whose flags the first filter can inspect.
pub fn compile(allow: &[String]) -> Result<Programs, SeccompError> {
    validate_allow(allow)?;
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| SeccompError::Arch(std::env::consts::ARCH))?;
    let allowed = |name: &str| allow.iter().any(|a| a == name);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for name in BLOCKED {
        if !allowed(name)
            && let Some(nr) = syscall_number(name)
        {
            for n in abi_variants(name, nr) {
                rules.insert(n, vec![]);
            }
        }
    }
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
            .map_err(|e| SeccompError::Build(e.to_string()))
    };
    let rule = |conds: Vec<SeccompCondition>| {
        SeccompRule::new(conds).map_err(|e| SeccompError::Build(e.to_string()))
    };
    if !allowed("ioctl") {
        let r = vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, TIOCSTI)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, TIOCLINUX)?])?,
        ];
        for n in abi_variants("ioctl", libc::SYS_ioctl) {
            rules.insert(n, r.clone());
        }
    }
    if !allowed("clone") {
        let r = CLONE_NAMESPACE_FLAGS
            .iter()
            .map(|f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)?]))
            .collect::<Result<Vec<_>, _>>()?;
        for n in abi_variants("clone", libc::SYS_clone) {
            rules.insert(n, r.clone());
        }
    }
    if !allowed("socket") {
        let r = vec![rule(vec![cond(0, SeccompCmpOp::Eq, AF_VSOCK)?])?];
        for n in abi_variants("socket", libc::SYS_socket) {
            rules.insert(n, r.clone());
        }
    }
    if !allowed("personality") {
        let conds = PERSONALITIES_ALLOWED
            .iter()
            .map(|p| cond(0, SeccompCmpOp::Ne, *p))
            .collect::<Result<Vec<_>, _>>()?;
        let r = vec![rule(conds)?];
        for n in abi_variants("personality", libc::SYS_personality) {
            rules.insert(n, r.clone());
        }
    }
    let main = build(rules, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    // Always two programs, so bubblewrap's descriptors are the same for every
    // environment; with `clone` allowed the second lets everything through.
    let clone3: BTreeMap<i64, Vec<SeccompRule>> = if allowed("clone") {
        BTreeMap::new()
    } else {
        abi_variants("clone3", libc::SYS_clone3)
            .into_iter()
            .map(|n| (n, vec![]))
            .collect()
    };
    let programs = vec![
        main,
        build(clone3, SeccompAction::Errno(libc::ENOSYS as u32), arch)?,
    ];
    Ok(Programs(programs))
}

fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    on_match: SeccompAction,
    arch: TargetArch,
) -> Result<Vec<u8>, SeccompError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, on_match, arch)
        .map_err(|e| SeccompError::Build(e.to_string()))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))?;
    // The kernel's struct sock_filter: u16 code, u8 jt, u8 jf, u32 k, native endian.
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}

/// The numbers under which a syscall can be reached. On x86_64 the x32 ABI
/// shares the architecture tag but sets bit 30 in the number (and has its own
/// numbers for a few calls), so the filter lists those too. The i386 ABI has a
/// different tag and is killed by the architecture check.
fn abi_variants(name: &str, nr: i64) -> Vec<i64> {
    #[cfg(target_arch = "x86_64")]
    {
        const X32: i64 = 0x4000_0000;
        let mut v = vec![nr, nr | X32];
        let x32_specific: &[(&str, i64)] = &[
            ("ioctl", 514),
            ("ptrace", 521),
            ("kexec_load", 528),
            ("process_vm_readv", 539),
            ("process_vm_writev", 540),
        ];
        if let Some((_, n)) = x32_specific.iter().find(|(s, _)| *s == name) {
            v.push(n | X32);
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        vec![nr]
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

    #[test]
    fn every_blocked_name_has_a_number() {
        for name in BLOCKED {
            assert!(syscall_number(name).is_some(), "{name}");
        }
    }

    #[test]
    fn compiles_to_whole_instructions() {
        let p = compile(&[]).unwrap();
        assert_eq!(p.0.len(), 2);
        assert!(p.0.iter().all(|b| !b.is_empty() && b.len() % 8 == 0));
    }

    #[test]
    fn allowing_shrinks_the_filter() {
        let full = compile(&[]).unwrap();
        let relaxed = compile(&["ptrace".to_string()]).unwrap();
        assert!(relaxed.0[0].len() < full.0[0].len());
        let no_clone = compile(&["clone".to_string()]).unwrap();
        assert_eq!(no_clone.0.len(), 2);
        assert!(no_clone.0[1].len() < full.0[1].len());
    }

    #[test]
    fn unknown_allow_is_an_error() {
        let e = compile(&["read".to_string()]).unwrap_err().to_string();
        assert!(e.contains("\"read\"") && e.contains("ptrace"), "{e}");
    }
}
