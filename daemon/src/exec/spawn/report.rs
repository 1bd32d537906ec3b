//! Taking charge of a started bubblewrap. Out of the nest it is the process
//! launched; in the nest the launched process has exited, and the nest
//! reports the one it started for us, the staged tmpfs (or why staging
//! failed) and the network namespace it gave. Whatever cannot be taken
//! charge of is killed and reaped.

use std::io;
use std::os::fd::OwnedFd;

use rustix::process::{Pid, Signal};

use crate::exec::launch::Launched;
use crate::exec::nest::{Nest, Receipt, Reported, network};
use crate::exec::process::Process;

/// A bubblewrap the server holds.
pub(super) struct Adopted {
    pub(super) process: Process,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
    pub(super) staged: Option<OwnedFd>,
    pub(super) network: Option<network::Held>,
}

/// Takes charge of `launched`, reconciled with what the nest reports on
/// `receipt` (when it started in the nest); `staged` says whether the nest
/// was to stage its filesystems.
pub(super) fn adopt(
    launched: io::Result<Launched>,
    receipt: Option<Receipt>,
    nest: Option<&Nest>,
    staged: bool,
) -> io::Result<Adopted> {
    let (launched, mut reported) = match receipt {
        None => (launched?, None),
        Some(receipt) => {
            let reported = receipt.collect(launched.as_ref().ok().map(|c| c.pid));
            match launched {
                Ok(launched) => (launched, Some(reported)),
                Err(e) => {
                    kill_and_reap(reported.bubblewrap);
                    let why = match reported.staged {
                        Some(Err(why)) => format!("{why}: {e}"),
                        _ => e.to_string(),
                    };
                    return Err(io::Error::new(e.kind(), why));
                }
            }
        }
    };
    let (stdout, stderr) = launched.output.expect("piped");
    let network = reported
        .as_mut()
        .and_then(|r| r.network.take())
        .zip(nest)
        .map(|(namespace, n)| n.hold_network(namespace));
    // In the nest, bubblewrap is not the process launched (that one has
    // exited) but the one it started for us.
    let (pid, staged_root) = match reported {
        None => (launched.pid as i32, None),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: Some(Ok(fd)),
            ..
        }) => (pid, Some(fd)),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: None,
            ..
        }) if !staged => (pid, None),
        Some(r) => {
            kill_and_reap(r.bubblewrap);
            return Err(io::Error::other(match r.staged {
                Some(Err(why)) => why,
                _ => "bubblewrap did not start in the nest".to_string(),
            }));
        }
    };
    let process = match Process::adopt(pid as u32) {
        Ok(p) => p,
        Err(e) => {
            kill_and_reap(Some(pid));
            return Err(e);
        }
    };
    Ok(Adopted {
        process,
        stdout,
        stderr,
        staged: staged_root,
        network,
    })
}

/// Kills and reaps a child the server could not take charge of.
fn kill_and_reap(pid: Option<i32>) {
    if let Some(pid) = pid.and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}
