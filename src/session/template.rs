//! Chat templates wgmoe brings: `--chat-template NAME` for a model whose template is
//! missing or wrong, and the plain `User:`/`Assistant:` lines used when a model has none.
//! A `--chat-template FILE` is a Jinja file in the Hugging Face form (`messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// ChatML (Qwen, many fine-tunes): `<|im_start|>role\ncontent<|im_end|>\n`.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Llama 2 chat: `[INST] ... [/INST]`, a system message folded into the first user turn
/// between `<<SYS>>` markers.
const LLAMA2: &str = "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}{% for message in turns %}{% if message['role'] == 'user' %}{% if loop.first and system %}{{ bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] + ' [/INST]' }}{% else %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}";

/// Plain lines: a system message as a paragraph, then `User: ...` and `Assistant: ...`.
const PLAIN: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n' }}{% else %}{{ 'Assistant: ' + message['content'] + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

/// The built-in templates by name.
pub const BUILTIN: [(&str, &str); 3] = [("chatml", CHATML), ("llama-2", LLAMA2), ("plain", PLAIN)];

/// The names `--chat-template` takes, for messages.
pub fn builtin_names() -> String {
    BUILTIN.map(|b| b.0).join(", ")
}

/// Install the chat template of `--chat-template FILE|NAME` (`option`), or, when the model
/// has none, the plain one. Returns the note to print when wgmoe chose the template.
pub fn choose(tok: &mut Tokenizer, option: Option<&str>, model: &Path) -> Result<Option<String>> {
    match option {
        Some(name) => {
            if let Some((n, text)) = BUILTIN.iter().find(|b| b.0 == name) {
                tok.set_chat_template(text.to_string(), format!("the built-in {n} chat template"));
                return Ok(None);
            }
            let path = Path::new(name);
            if !path.is_file() {
                return Err(Error::option(
                    "--chat-template",
                    format!(
                        "`{name}` is neither a file nor a built-in template ({})",
                        builtin_names()
                    ),
                ));
            }
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::option("--chat-template", format!("{}: {e}", path.display()))
            })?;
            tok.set_chat_template(text, path);
            Ok(None)
        }
        None if tok.chat_template().is_none() => {
            tok.set_chat_template(PLAIN.to_string(), "the built-in plain chat template");
            Ok(Some(format!(
                "note: {} has no chat template: using plain User:/Assistant: lines (--chat-template {} or FILE picks another)",
                model.display(),
                BUILTIN.map(|b| b.0)[..2].join("|")
            )))
        }
        None => Ok(None),
    }
}
