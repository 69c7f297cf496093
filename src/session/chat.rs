//! Conversations: messages rendered with the model's chat template and tokenized, and the
//! context limit: a conversation too long for the context is refused, or with context
//! shift its oldest turns are dropped (the leading system messages and the last message
//! are kept) until it fits.

use crate::error::Result;
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
    let pairs: Vec<(String, String)> = messages
        .iter()
        .map(|m| (m.role.as_str().to_string(), m.content.clone()))
        .collect();
    let text = tok.apply_chat_template(&pairs, true)?;
    tok.encode(&text, false)
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

/// The prompt of `messages` with `reserve` positions left free in a context of `context`.
/// Without `shift` a conversation that does not fit is `TooLong`; with it, the oldest
/// turns are dropped until it fits. Template and tokenizer errors are the outer error.
pub fn fit(
    tok: &Tokenizer,
    messages: &[Message],
    context: usize,
    reserve: usize,
    shift: bool,
) -> Result<std::result::Result<Fitted, TooLong>> {
    let mut kept = messages.to_vec();
    let mut dropped = 0;
    loop {
        let prompt = chat_prompt(tok, &kept)?;
        if prompt.len() + reserve <= context {
            return Ok(Ok(Fitted {
                messages: kept,
                prompt,
                dropped,
            }));
        }
        match oldest_turn(&kept).filter(|_| shift) {
            Some(r) => {
                dropped += r.len();
                kept.drain(r);
            }
            None => {
                return Ok(Err(TooLong {
                    prompt_tokens: prompt.len(),
                    reserve,
                    context,
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
