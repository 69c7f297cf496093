//! Conversations: messages rendered with the model's chat template and tokenized, and the
//! context limit: a conversation too long for the context is refused, or with context
//! shift its oldest turns are dropped (the leading system messages and the last message
//! are kept) until it fits.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// The prompt of `messages` ending with the assistant's turn opened, as `run --chat` builds
/// it. The rendered text carries the template's special tokens, so the tokenizer adds none.
pub fn chat_prompt(tok: &Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
    let text = render(tok, messages).map_err(|e| explain(tok, messages, e))?;
    tok.encode(&text, false)
}

fn render(tok: &Tokenizer, messages: &[Message]) -> Result<String> {
    let pairs: Vec<(String, String)> = messages
        .iter()
        .map(|m| (m.role.as_str().to_string(), m.content.clone()))
        .collect();
    tok.apply_chat_template(&pairs, true)
}

/// A template's refusal in wgmoe's words: which message broke which rule (where the
/// conversation shows it), then what the template itself said.
fn explain(tok: &Tokenizer, messages: &[Message], e: Error) -> Error {
    let Error::ChatTemplate { said, template, .. } = e else {
        return e;
    };
    let (message, why) = match diagnose(messages, |m| render(tok, m).is_ok()) {
        Some((i, rule)) => (
            Some(i),
            format!("message {i} ({}): {rule}", messages[i].role.as_str()),
        ),
        None => (
            None,
            format!(
                "the chat template refused a conversation of {} messages ({})",
                messages.len(),
                messages
                    .iter()
                    .map(|m| m.role.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    };
    Error::ChatTemplate {
        message,
        msg: format!("{why}; the template ({template}) says: \"{said}\""),
        said,
        template,
    }
}

/// The message at fault and the rule it breaks, for the rules chat templates commonly
/// enforce; `renders` tries a changed conversation. None: none of them explains it.
fn diagnose(
    messages: &[Message],
    renders: impl Fn(&[Message]) -> bool,
) -> Option<(usize, &'static str)> {
    // A system message the template refuses: the rest renders without it.
    if let Some(i) = messages.iter().position(|m| m.role == Role::System) {
        let rest: Vec<Message> = messages
            .iter()
            .filter(|m| m.role != Role::System)
            .cloned()
            .collect();
        if !rest.is_empty() && renders(&rest) {
            return Some((
                i,
                "this chat template takes no system message (put the instructions in the first user message)",
            ));
        }
    }
    // user, assistant, user, ... after any leading system messages.
    let first = messages
        .iter()
        .position(|m| m.role != Role::System)
        .unwrap_or(messages.len());
    for (k, m) in messages[first..].iter().enumerate() {
        let want = if k % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if m.role != want {
            return Some((
                first + k,
                match (k, m.role) {
                    (0, _) => "the conversation must start with a user message",
                    (_, Role::System) => {
                        "a system message may only come first; the roles after it alternate user, assistant, user, ..."
                    }
                    _ => "the roles must alternate user, assistant, user, ...",
                },
            ));
        }
    }
    if messages.last().is_some_and(|m| m.role == Role::Assistant) {
        return Some((
            messages.len() - 1,
            "the last message must be the user's (the answer comes next)",
        ));
    }
    None
}

/// A conversation that fits: the messages kept, their prompt, and how many were dropped.
#[derive(Clone, Debug)]
pub struct Fitted {
    pub messages: Vec<Message>,
    pub prompt: Vec<u32>,
    pub dropped: usize,
}

/// A conversation that cannot fit even after dropping what may be dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooLong {
    /// Prompt tokens of the shortest conversation tried.
    pub prompt_tokens: usize,
    /// Positions that had to stay free for new tokens.
    pub reserve: usize,
    pub context: usize,
    /// Whether older turns were left that context shift would drop (so turning it on
    /// could help; it cannot for a single message).
    pub droppable: bool,
}

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} prompt tokens + {} new tokens exceed the context of {} positions",
            self.prompt_tokens, self.reserve, self.context
        )
    }
}

/// Index range of the oldest turn after the leading system messages: a message and the
/// non-user messages after it (so user/assistant keep alternating). None when only the
/// system messages and the last message are left.
fn oldest_turn(messages: &[Message]) -> Option<std::ops::Range<usize>> {
    let first = messages.iter().position(|m| m.role != Role::System)?;
    let last = messages.len().checked_sub(1)?;
    if first >= last {
        return None;
    }
    let mut end = first + 1;
    while end < last && messages[end].role != Role::User {
        end += 1;
    }
    Some(first..end)
}

/// The prompt of `messages` in a context of `context` positions, `need` of them left free
/// for new tokens. Without `shift` a conversation that does not fit is `TooLong`; with it,
/// the oldest turns are dropped while fewer than `reserve` (>= `need`) positions are left,
/// and what is left once none can be dropped is accepted as long as `need` fit, as it is
/// without shift (so shift never refuses what fits without it). Template and tokenizer
/// errors are the outer error.
pub fn fit(
    tok: &Tokenizer,
    messages: &[Message],
    context: usize,
    (reserve, need): (usize, usize),
    shift: bool,
) -> Result<std::result::Result<Fitted, TooLong>> {
    let mut kept = messages.to_vec();
    let mut dropped = 0;
    let want = if shift { reserve.max(need) } else { need };
    loop {
        let prompt = chat_prompt(tok, &kept)?;
        let turn = oldest_turn(&kept);
        let fits = |room: usize| prompt.len() + room <= context;
        if fits(want) || (fits(need) && (!shift || turn.is_none())) {
            return Ok(Ok(Fitted {
                messages: kept,
                prompt,
                dropped,
            }));
        }
        match turn.clone().filter(|_| shift) {
            Some(r) => {
                dropped += r.len();
                kept.drain(r);
            }
            None => {
                return Ok(Err(TooLong {
                    prompt_tokens: prompt.len(),
                    reserve: need,
                    context,
                    droppable: turn.is_some(),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(roles: &[Role]) -> Vec<Message> {
        roles
            .iter()
            .enumerate()
            .map(|(i, r)| Message::new(*r, format!("m{i}")))
            .collect()
    }

    #[test]
    fn the_broken_rule_is_named_with_its_message() {
        use Role::*;
        let never = |_: &[Message]| false;
        assert_eq!(diagnose(&conv(&[User, User]), never).map(|d| d.0), Some(1));
        assert_eq!(
            diagnose(&conv(&[Assistant, User]), never).map(|d| d.0),
            Some(0)
        );
        assert_eq!(
            diagnose(&conv(&[User, Assistant]), never).map(|d| d.0),
            Some(1)
        );
        assert_eq!(diagnose(&conv(&[System, User]), never), None);
        // A system message is at fault when the rest renders.
        let no_system = |m: &[Message]| m.iter().all(|m| m.role != System);
        let d = diagnose(&conv(&[System, User]), no_system).unwrap();
        assert_eq!(d.0, 0);
        assert!(d.1.contains("no system message"), "{}", d.1);
    }

    #[test]
    fn the_oldest_turn_is_a_user_message_and_its_answers() {
        use Role::*;
        let m = conv(&[System, User, Assistant, User, Assistant, User]);
        assert_eq!(oldest_turn(&m), Some(1..3));
        let m = conv(&[User, Assistant, Assistant, User]);
        assert_eq!(oldest_turn(&m), Some(0..3));
        // Never the system messages nor the last message.
        assert_eq!(oldest_turn(&conv(&[System, User])), None);
        assert_eq!(oldest_turn(&conv(&[System, System, User])), None);
        assert_eq!(oldest_turn(&conv(&[User])), None);
        assert_eq!(oldest_turn(&[]), None);
    }
}
