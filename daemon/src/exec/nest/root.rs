//! The host's root as a staged sandbox's bubblewrap sees it. bubblewrap
//! reads and parses the whole mount table for each bind it makes (about
//! 27 in a sandbox of ours), and a mount namespace made in the nest starts
//! as a copy of the host's: on a desktop, dozens of mounts (/sys and its
//! cgroups, /run, /boot, snaps…), each of which costs every sandbox about
//! 35 µs of CPU (`bench/`: 40 more host mounts, 1.4 ms more a sandbox).
//! So the staging child pivots into a root of its own before it becomes
//! bubblewrap: a small tmpfs holding only the top-level entries of the
//! host's root that are needed (those holding what the sandbox binds, the
//! system directories bubblewrap runs from, the nest's /proc), each
//! directory bound with what is mounted under it, each symlink copied.
//! Paths stay the host's, so bubblewrap's options do not change.
//!
//! What bubblewrap needs to run is known from its program (its ELF
//! interpreter; its libraries are in the system directories, which are
//! always kept); the daemon checks it at start-up by running bubblewrap in
//! such a root, and does without when that fails.

use crate::sync::Recover;
use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// Top-level entries every such root keeps where the host has them: the
/// system directories (and their merged-/usr symlinks) that programs and
/// their libraries come from, and /proc (the nest's, mounted by the
/// stage). Not /dev: the stage makes the sandbox's from the host's before
/// it changes root, and bubblewrap binds that in one piece.
const SYSTEM: [&str; 10] = [
    "usr", "etc", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "nix", "proc",
];

/// What bubblewrap itself needs of the host's root.
#[derive(Debug)]
pub struct HostRoot {
    entries: BTreeSet<PathBuf>,
    /// Entries by the sources they were found for: a call's recipe asks
    /// again for the same sources, and the answer takes system calls.
    known: Mutex<HashMap<Asked, Vec<PathBuf>>>,
}

/// A sandbox's bind sources and its stage root.
type Asked = (Vec<PathBuf>, PathBuf);

/// How many answers [`HostRoot::entries`] keeps.
const KNOWN_MAX: usize = 64;

impl HostRoot {
    /// The entries the program at `bwrap` needs: the system ones, its
    /// own and its ELF interpreter's. `None` for a program that is not an
    /// ELF executable (a script: what it runs cannot be known).
    pub fn for_bubblewrap(bwrap: &Path) -> Option<HostRoot> {
        let program = std::fs::read(bwrap).ok()?;
        let interpreter = elf_interpreter(&program).ok()?;
        let mut entries: BTreeSet<PathBuf> =
            SYSTEM.iter().map(|e| Path::new("/").join(e)).collect();
        entries.extend(tops(bwrap));
        if let Some(i) = interpreter {
            entries.extend(tops(&i));
        }
        Some(HostRoot {
            entries,
            known: Mutex::default(),
        })
    }

    /// The entries a sandbox needs whose bubblewrap binds `sources` and
    /// whose scratch space is staged under `stage_root`: those that exist
    /// on the host, sorted.
    pub fn entries(&self, sources: &[PathBuf], stage_root: &Path) -> Vec<PathBuf> {
        let key = (sources.to_vec(), stage_root.to_path_buf());
        if let Some(known) = self.known.lock().recover().get(&key) {
            return known.clone();
        }
        let found = self.find(sources, stage_root);
        let mut known = self.known.lock().recover();
        if known.len() >= KNOWN_MAX {
            known.clear();
        }
        known.insert(key, found.clone());
        found
    }

    fn find(&self, sources: &[PathBuf], stage_root: &Path) -> Vec<PathBuf> {
        let mut all = self.entries.clone();
        for s in sources.iter().map(PathBuf::as_path).chain([stage_root]) {
            all.extend(tops(s));
        }
        all.into_iter()
            .filter(|e| e.symlink_metadata().is_ok())
            .collect()
    }
}

/// The top-level entry holding `path`, and the one holding where it leads
/// (through symlinks), when that differs.
fn tops(path: &Path) -> Vec<PathBuf> {
    let top = |p: &Path| match p.components().nth(1) {
        Some(Component::Normal(name)) => Some(Path::new("/").join(name)),
        _ => None,
    };
    let mut out: Vec<PathBuf> = top(path).into_iter().collect();
    if let Some(real) = std::fs::canonicalize(path).ok().as_deref().and_then(top)
        && !out.contains(&real)
    {
        out.push(real);
    }
    out
}

/// The interpreter an ELF program names (`PT_INTERP`), `None` for a
/// static one; an error for what is not an ELF program.
fn elf_interpreter(program: &[u8]) -> Result<Option<PathBuf>, &'static str> {
    use std::os::unix::ffi::OsStrExt;
    const PT_INTERP: u32 = 3;
    if program.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF program");
    }
    let wide = match program.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF class"),
    };
    let little = match program.get(5) {
        Some(1) => true,
        Some(2) => false,
        _ => return Err("unknown ELF byte order"),
    };
    let int = |at: usize, len: usize| -> Result<u64, &'static str> {
        let bytes = program.get(at..at + len).ok_or("truncated ELF program")?;
        let mut v = 0u64;
        for i in 0..len {
            let b = if little { bytes[len - 1 - i] } else { bytes[i] };
            v = (v << 8) | u64::from(b);
        }
        Ok(v)
    };
    let word = if wide { 8 } else { 4 };
    let (phoff, phentsize, phnum) = if wide {
        (int(0x20, 8)?, int(0x36, 2)?, int(0x38, 2)?)
    } else {
        (int(0x1c, 4)?, int(0x2a, 2)?, int(0x2c, 2)?)
    };
    for i in 0..phnum {
        let header = (phoff + i * phentsize) as usize;
        if int(header, 4)? != u64::from(PT_INTERP) {
            continue;
        }
        // p_offset follows p_type (and, in 64-bit headers, p_flags);
        // p_filesz follows p_offset, p_vaddr and p_paddr.
        let offset_at = header + if wide { 8 } else { 4 };
        let offset = int(offset_at, word)? as usize;
        let size = int(offset_at + 3 * word, word)? as usize;
        let name = program
            .get(offset..offset + size)
            .ok_or("truncated ELF program")?;
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(name))));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_programs_interpreter_is_found() {
        let sh = std::fs::read("/bin/sh").unwrap();
        let interpreter = elf_interpreter(&sh).unwrap().unwrap();
        assert!(interpreter.is_absolute(), "{interpreter:?}");
        assert!(
            interpreter.to_string_lossy().contains("ld-"),
            "{interpreter:?}"
        );
        assert!(interpreter.exists());
    }

    #[test]
    fn a_script_is_not_a_program_whose_needs_are_known() {
        assert!(elf_interpreter(b"#!/bin/sh\necho hi\n").is_err());
        assert!(elf_interpreter(b"\x7fELF").is_err());
    }

    #[test]
    fn entries_are_the_top_level_ones_holding_each_source_and_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot {
            entries: [PathBuf::from("/usr")].into(),
            known: Mutex::default(),
        };
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        let entries = root.entries(
            &[
                link,
                PathBuf::from("/no/such/place"),
                PathBuf::from("/dev/null"),
            ],
            Path::new("/proc/self"),
        );
        let tmp_top = tops(dir.path())[0].clone();
        for wanted in ["/usr", "/etc", "/dev", "/proc"] {
            assert!(
                entries.contains(&PathBuf::from(wanted)),
                "{wanted}: {entries:?}"
            );
        }
        assert!(entries.contains(&tmp_top), "{entries:?}");
        assert!(!entries.contains(&PathBuf::from("/no")), "{entries:?}");
        assert!(!entries.contains(&PathBuf::from("/sys")), "{entries:?}");
    }
}
