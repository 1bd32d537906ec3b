//! The session agent protocol (docs/sessions.md). An agent, a small program
//! in the environment's own language (agent.py, agent.js, agent.sh beside
//! this file), reads requests on its first descriptor (`<id> <bytes>\n`, then
//! the code) and answers each with one JSON line on its second
//! (`{"id": N, "status": S}`, plus `"exited": true` when bash's `exit` ended
//! its shell); it announces itself with `{"ready": true}`. The two protocols
//! here tell exec's supervisor what to send and which line ends a call.

use crate::environment::InterpreterKind;
use crate::exec::Protocol;

const PYTHON_AGENT: &str = include_str!("agent.py");
const NODE_AGENT: &str = include_str!("agent.js");
const BASH_AGENT: &str = include_str!("agent.sh");

/// The agent program for an interpreter of this kind.
pub(super) fn program_for(kind: InterpreterKind) -> &'static str {
    match kind {
        InterpreterKind::Python => PYTHON_AGENT,
        InterpreterKind::Node => NODE_AGENT,
        InterpreterKind::Bash => BASH_AGENT,
    }
}

/// One line from an agent.
#[derive(Debug, serde::Deserialize)]
pub(super) struct Reply {
    pub(super) id: Option<u64>,
    pub(super) status: Option<i32>,
    #[serde(default)]
    pub(super) exited: bool,
    #[serde(default)]
    ready: bool,
}

fn parse(line: &[u8]) -> Option<Reply> {
    serde_json::from_slice(line).ok()
}

/// Waiting for a new agent to say it is ready.
pub(super) struct AwaitReady;

impl Protocol for AwaitReady {
    type Reply = ();
    fn request(&self) -> Option<&[u8]> {
        None
    }
    fn reply(&mut self, line: &[u8]) -> Option<()> {
        parse(line).filter(|r| r.ready).map(|_| ())
    }
}

/// One call: the framed code, answered by the reply that carries its id.
pub(super) struct Call {
    id: u64,
    request: Vec<u8>,
}

impl Call {
    pub(super) fn new(id: u64, code: &[u8]) -> Call {
        let mut request = format!("{id} {}\n", code.len()).into_bytes();
        request.extend_from_slice(code);
        Call { id, request }
    }
}

impl Protocol for Call {
    type Reply = Reply;
    fn request(&self) -> Option<&[u8]> {
        Some(&self.request)
    }
    fn reply(&mut self, line: &[u8]) -> Option<Reply> {
        parse(line).filter(|r| r.id == Some(self.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_framed_and_answered_by_its_own_id() {
        let mut call = Call::new(7, "print(1)\n".as_bytes());
        assert_eq!(call.request().unwrap(), b"7 9\nprint(1)\n");
        assert!(call.reply(br#"{"id": 6, "status": 0}"#).is_none());
        assert!(call.reply(b"not json").is_none());
        let r = call
            .reply(br#"{"id": 7, "status": 3, "exited": true}"#)
            .unwrap();
        assert_eq!((r.status, r.exited), (Some(3), true));
        assert!(AwaitReady.reply(br#"{"ready": true}"#).is_some());
        assert!(AwaitReady.reply(br#"{"id": 1}"#).is_none());
    }

    /// The bash agent is handed its two descriptors under whatever numbers
    /// they have in the server (inherited as they are): it must work
    /// whichever, the numbers it moves them to (203, 204) included.
    #[test]
    fn the_bash_agent_works_with_any_descriptor_numbers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agent.sh"), BASH_AGENT).unwrap();
        // The agent's side opens requests, then replies, as FIFOs on the
        // numbers given; this side writes one call and reads the replies.
        let driver = r#"
            rm -f requests replies && mkfifo requests replies
            bash -c "exec $1<requests $2>replies; exec bash agent.sh $1 $2" &
            exec 7>requests 8<replies
            read -r ready <&8
            printf '1 7\necho hi' >&7
            read -r reply <&8
            exec 7>&-
            wait
            echo "$ready $reply"
        "#;
        for (requests, replies) in [(203, 204), (204, 203), (204, 250), (150, 203), (5, 6)] {
            // A broken agent would leave the FIFOs' other ends blocked.
            let o = std::process::Command::new("timeout")
                .args([
                    "30",
                    "bash",
                    "-c",
                    driver,
                    "driver",
                    &requests.to_string(),
                    &replies.to_string(),
                ])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&o.stdout),
                "hi\n{\"ready\":true} {\"id\":1,\"status\":0}\n",
                "descriptors {requests} and {replies}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}
