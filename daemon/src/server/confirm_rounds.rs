//! Confirmation of a declared command under the stateless revision
//! (2026-07-28), where the server cannot ask the client anything: the call
//! answers `input_required` with the question (a form: the exact argv, the
//! environment, the network, what it may write) and a sealed
//! `requestState`; the client asks its user and calls again with the answer
//! and the state. The state is checked (`commands/sealed.rs`: ours, not
//! expired, this caller's, this invocation's, not used before) before the
//! answer is read; a refused one runs nothing and says why. A client that
//! cannot ask its user gets a token, as under 2025-11-25.

use rmcp::RoleServer;
use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitResult, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, JsonObject,
};
use rmcp::service::RequestContext;
use serde::Deserialize;

use super::commands::How;
use super::result::{self, ErrorCode, ToolError};
use super::{Progress, SandboxServer};
use crate::commands::confirm::{self, Answer};
use crate::commands::sealed::Refused;
use crate::commands::{Commands, Offered, ResolvedInvocation};

/// The key of the one input request a confirmation makes.
const QUESTION: &str = "confirm";

/// What a retried call brings back: the client's answers and the state.
#[derive(Clone, Copy, Default)]
pub(super) struct Retry<'a> {
    pub(super) input_responses: Option<&'a InputResponses>,
    pub(super) request_state: Option<&'a str>,
}

impl SandboxServer {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn confirm_in_rounds(
        &self,
        commands: &Commands,
        offered: &Offered,
        args: Option<&JsonObject>,
        inv: &ResolvedInvocation,
        how: How,
        retry: Retry<'_>,
        context: &RequestContext<RoleServer>,
        progress: Option<Progress>,
    ) -> CallToolResponse {
        let digest = inv.digest();
        let can_ask = confirm::client_can_ask(context.client_capabilities().as_ref());
        let Some(sealed) = self.sealed.as_ref().filter(|_| can_ask) else {
            if retry.request_state.is_some() {
                return result::error_result(&refusal(offered, &Refused::NotOurs)).into();
            }
            return self
                .issue_token(commands, offered, args, inv, digest)
                .into();
        };
        let Some(state) = retry.request_state else {
            return self.ask_in_result(commands, offered, inv);
        };
        if let Err(refused) = sealed.open(state, &self.principal, &digest) {
            let e = refusal(offered, &refused);
            let event = if refused == Refused::Expired {
                "expired"
            } else {
                "refused"
            };
            self.audit_command(
                event,
                inv,
                Some("input_required"),
                None,
                Some(e.code.as_str()),
            );
            return result::error_result(&e).into();
        }
        let answer = retry
            .input_responses
            .and_then(|r| r.get(QUESTION))
            .and_then(|v| ElicitResult::deserialize(v).ok())
            .map(|r| confirm::answer_of(&r));
        match answer {
            // No answer to the question: asked again, with a new state.
            None => self.ask_in_result(commands, offered, inv),
            Some(Answer::Approved) => {
                self.audit_command("confirmed", inv, Some("input_required"), None, None);
                self.run_invocation(commands, inv, how, context.ct.clone(), progress)
                    .await
            }
            Some(answer) => {
                let e = super::commands::declined(offered, &answer);
                self.audit_command(
                    "declined",
                    inv,
                    Some("input_required"),
                    None,
                    Some(e.code.as_str()),
                );
                result::error_result(&e).into()
            }
        }
    }

    /// The result that asks the client's user whether to run `inv`.
    fn ask_in_result(
        &self,
        commands: &Commands,
        offered: &Offered,
        inv: &ResolvedInvocation,
    ) -> CallToolResponse {
        let sealed = self
            .sealed
            .as_ref()
            .expect("asked only with a key for states");
        let state = match sealed.seal(&self.principal, &inv.digest(), commands.ask_timeout) {
            Ok(s) => s,
            Err(e) => {
                return result::error_result(&ToolError::new(
                    ErrorCode::Internal,
                    format!("no randomness for a confirmation state: {e}"),
                    "Tell the user; the command cannot be confirmed on this machine now.",
                ))
                .into();
            }
        };
        let form = match confirm::question_form(super::commands::question(commands, offered, inv)) {
            Ok(f) => f,
            Err(e) => {
                return result::error_result(&ToolError::new(
                    ErrorCode::Internal,
                    format!("cannot make the confirmation form: {e}"),
                    "Report this with the server's log.",
                ))
                .into();
            }
        };
        self.audit_command("asked", inv, Some("input_required"), None, None);
        let mut requests = InputRequests::new();
        requests.insert(
            QUESTION.to_string(),
            InputRequest::Elicitation(ElicitRequest::new(form)),
        );
        InputRequiredResult::new(Some(requests), Some(state)).into()
    }
}

/// The error for a state that was refused: what it was, and that nothing ran.
fn refusal(offered: &Offered, refused: &Refused) -> ToolError {
    let code = match refused {
        Refused::Expired => ErrorCode::ConfirmationExpired,
        _ => ErrorCode::ConfirmationInvalid,
    };
    ToolError::new(
        code,
        format!("{}; nothing ran", refused.describe()),
        format!(
            "Call {} again without requestState to ask the user anew.",
            offered.tool
        ),
    )
}
