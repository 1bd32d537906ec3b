//! The optional audit log: one JSON line per run (time, environment, what ran
//! it, a SHA-256 of the code, how it ended, the limit that fired, output sizes),
//! and one per step of a declared command's call (asked, confirmed, declined,
//! expired, refused, run). Code, argv and output are recorded only when
//! configured to be; confirmation tokens never are.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::environment::Environment;
use crate::exec::Outcome;

pub struct AuditLog {
    file: Mutex<File>,
    include_code: bool,
    include_output: bool,
}

/// What to record about one call.
pub struct Entry<'a> {
    /// Who made the call (over HTTP, the name its credentials give).
    pub principal: &'a str,
    pub env: &'a Environment,
    pub code: &'a [u8],
    /// How the call was made: "run", "job", "session".
    pub kind: &'a str,
    pub outcome: Option<&'a Outcome>,
    /// The error code of the result, when it was an error.
    pub error: Option<&'a str>,
}

/// What to record about one step of a declared command's call.
pub struct CommandEntry<'a> {
    /// Who made the call.
    pub principal: &'a str,
    /// "asked", "confirmed", "declined", "expired", "refused" or "run".
    pub event: &'a str,
    pub command: &'a str,
    pub env: &'a str,
    /// The resolved argv, recorded as the code is (only when configured).
    pub argv: &'a [String],
    /// SHA-256 of the resolved invocation, which a confirmation is bound to.
    pub invocation: &'a [u8; 32],
    /// How the user was asked: "elicitation" or "token".
    pub via: Option<&'a str>,
    pub outcome: Option<&'a Outcome>,
    pub error: Option<&'a str>,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600).
    pub fn open(path: &Path, include_code: bool, include_output: bool) -> io::Result<AuditLog> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(AuditLog {
            file: Mutex::new(file),
            include_code,
            include_output,
        })
    }

    pub fn record(&self, e: &Entry) {
        self.write(&self.line(e, SystemTime::now()));
    }

    pub fn record_command(&self, e: &CommandEntry) {
        let mut v = json!({
            "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "kind": "command",
            "principal": e.principal,
            "event": e.event,
            "command": e.command,
            "env": e.env,
            "invocation_sha256": hex(e.invocation),
            "via": e.via,
            "error": e.error,
        });
        if let Some(o) = e.outcome {
            self.outcome(&mut v, o);
        }
        if self.include_code {
            v["argv"] = json!(e.argv);
        }
        self.write(&v);
    }

    fn write(&self, line: &Value) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = writeln!(f, "{line}") {
            tracing::warn!("cannot write the audit log: {err}");
        }
    }

    fn line(&self, e: &Entry, now: SystemTime) -> Value {
        let mut v = json!({
            "time": humantime::format_rfc3339_millis(now).to_string(),
            "kind": e.kind,
            "principal": e.principal,
            "env": e.env.name,
            "source": e.env.origin.to_string(),
            "interpreter": e.env.interpreter,
            "code_sha256": hex(&Sha256::digest(e.code)),
            "code_bytes": e.code.len(),
            "error": e.error,
        });
        if let Some(o) = e.outcome {
            self.outcome(&mut v, o);
        }
        if self.include_code {
            v["code"] = json!(String::from_utf8_lossy(e.code));
        }
        v
    }

    fn outcome(&self, v: &mut Value, o: &Outcome) {
        v["exit_code"] = json!(o.exit_code);
        v["signal"] = json!(o.signal);
        v["duration_ms"] = json!(o.duration.as_millis() as u64);
        v["timed_out"] = json!(o.timed_out);
        v["limit"] = json!(o.limit.map(|l| l.as_str()));
        v["cpu_ms"] = json!(o.usage.cpu.map(|c| c.as_millis() as u64));
        v["peak_memory_bytes"] = json!(o.usage.peak_memory_bytes);
        // Every host allowed and denied, with the bytes moved.
        if let Some(n) = &o.network {
            v["network"] = json!(n);
        }
        v["stdout_bytes"] = json!(o.stdout.total_bytes);
        v["stderr_bytes"] = json!(o.stderr.total_bytes);
        if self.include_output {
            v["stdout"] = json!(o.stdout.text);
            v["stderr"] = json!(o.stderr.text);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::capture::Captured;

    use std::time::Duration;

    fn env() -> Environment {
        crate::registry::host_environment(
            "python",
            "/usr/bin/python3".into(),
            vec!["/usr/bin/python3".into(), "{file}".into()],
            ".main.py",
            None,
            vec![],
            Default::default(),
        )
    }

    fn outcome() -> Outcome {
        Outcome {
            stdout: Captured {
                text: "SECRET OUTPUT".into(),
                total_bytes: 13,
                dropped_bytes: 0,
                incomplete: None,
            },
            duration: Duration::from_millis(5),
            ..Outcome::ended(Some(0), None)
        }
    }

    #[test]
    fn records_a_hash_not_the_code_or_output_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false, false).unwrap();
        let o = outcome();
        log.record(&Entry {
            principal: "alice",
            env: &env(),
            code: b"print('SECRET CODE')",
            kind: "run",
            outcome: Some(&o),
            error: None,
        });
        log.record(&Entry {
            principal: "alice",
            env: &env(),
            code: b"x",
            kind: "run",
            outcome: None,
            error: Some("busy"),
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("SECRET"), "{text}");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0]["code_sha256"],
            hex(&Sha256::digest(b"print('SECRET CODE')"))
        );
        assert_eq!(lines[0]["exit_code"], 0);
        assert_eq!(lines[0]["stdout_bytes"], 13);
        assert_eq!(lines[0]["source"], "host /usr/bin/python3");
        assert!(lines[0]["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(lines[1]["error"], "busy");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn records_command_steps_with_the_argv_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        for include in [false, true] {
            let path = dir.path().join(format!("audit-{include}.jsonl"));
            let log = AuditLog::open(&path, include, false).unwrap();
            let argv = vec![
                "git".to_string(),
                "push".to_string(),
                "SECRET-BRANCH".to_string(),
            ];
            let o = outcome();
            for (event, outcome) in [("asked", None), ("confirmed", None), ("run", Some(&o))] {
                log.record_command(&CommandEntry {
                    principal: "alice",
                    event,
                    command: "push",
                    env: "bash",
                    argv: &argv,
                    invocation: &[0xab; 32],
                    via: Some("token"),
                    outcome,
                    error: None,
                });
            }
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.contains("SECRET-BRANCH"), include, "{text}");
            let lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(
                lines
                    .iter()
                    .map(|l| l["event"].as_str().unwrap())
                    .collect::<Vec<_>>(),
                ["asked", "confirmed", "run"]
            );
            assert_eq!(lines[0]["kind"], "command");
            assert_eq!(lines[0]["invocation_sha256"], "ab".repeat(32));
            assert_eq!(lines[2]["exit_code"], 0);
        }
    }

    #[test]
    fn records_code_and_output_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, true, true).unwrap();
        let o = outcome();
        log.record(&Entry {
            principal: "alice",
            env: &env(),
            code: b"print('SECRET CODE')",
            kind: "run",
            outcome: Some(&o),
            error: None,
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("SECRET CODE") && text.contains("SECRET OUTPUT"));
    }
}
