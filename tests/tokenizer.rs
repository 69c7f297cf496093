//! tokenizer.json, tokenizer_config.json and the chat template; streaming decode of
//! multi-byte text. No GPU needed.

mod common;

use std::fs;
use std::path::PathBuf;

use tempfile::TempDir;

use common::st::*;
use wgmoe::tokenizer::{TextStream, Tokenizer};

fn fixture(name: &str) -> PathBuf {
    common::fixture(name)
}

// Tokenizer

#[test]
fn bad_tokenizer_files() {
    let dir = TempDir::new().unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer.json"],
    );
    fs::write(dir.path().join("tokenizer.json"), "{\"model\": 12}").unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer.json"],
    );
    // A good tokenizer.json with a malformed tokenizer_config.json.
    fs::copy(
        fixture("olmoe-tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    fs::write(dir.path().join("tokenizer_config.json"), "{,}").unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer_config.json"],
    );
    fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": 5}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer_config.json", "eos_token"],
    );
}

/// tokenizer_config.json variants: AddedToken-object special tokens, the list-of-templates
/// form, add_bos_token, an unknown tokenizer_class, and raise_exception.
#[test]
fn tokenizer_config_variants_and_chat_template() {
    let dir = TempDir::new().unwrap();
    fs::copy(
        fixture("olmoe-tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let template = "{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}\
                    {{ bos_token }}<{{ m.role }}>{{ m['content'].strip() }}{{ eos_token }}\n{% endfor %}\
                    {% if add_generation_prompt %}<assistant>{% endif %}";
    let cfg = serde_json::json!({
        "tokenizer_class": "SomeFutureTokenizer",
        "bos_token": {"content": "<|endoftext|>", "lstrip": false, "special": true},
        "eos_token": "<|padding|>",
        "add_bos_token": true,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": template}
        ]
    });
    fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.eos_token(), Some("<|padding|>"));
    assert_eq!(tok.chat_template(), Some(template));
    let msgs = vec![
        ("user".to_string(), "  hi there ".to_string()),
        ("assistant".to_string(), "yo".to_string()),
    ];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(text, "<|endoftext|><user>hi there<|padding|>\n<|endoftext|><assistant>yo<|padding|>\n<assistant>");
    let err = err_string(tok.apply_chat_template(&[("bad".to_string(), String::new())], false));
    assert_mentions(&err, &["tokenizer_config.json", "no bad roles"]);

    // add_bos_token prepends BOS once when special tokens are requested.
    let bos = tok.bos_token_id().unwrap();
    let plain = tok.encode("hello", false).unwrap();
    assert_ne!(plain.first(), Some(&bos));
    let with = tok.encode("hello", true).unwrap();
    assert_eq!(with[0], bos);
    assert_eq!(&with[1..], &plain[..]);

    // A chat_template.jinja file takes precedence (what transformers 5 saves).
    fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages | length }}{{ undefined_var }}",
    )
    .unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.apply_chat_template(&msgs, false).unwrap(), "2");
    fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_mentions(
        &err_string(tok.apply_chat_template(&msgs, false)),
        &["chat_template.jinja"],
    );

    // No template at all.
    fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(tok.chat_template().is_none());
    assert_mentions(
        &err_string(tok.apply_chat_template(&msgs, true)),
        &["no chat template"],
    );
}

/// Streaming decode: byte-level BPE splits multi-byte characters across tokens; the stream
/// must hold them back until complete and its concatenation must equal a full decode.
#[test]
fn text_stream_multibyte() {
    let tok = Tokenizer::from_dir(&fixture("olmoe-tiny")).unwrap();
    let text = "Grüße, 世界! 🌍🚀 naïve café — ok";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = TextStream::new();
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        let piece = stream.push(&tok, id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "partial character emitted: {piece:?}"
        );
        held += usize::from(piece.is_empty());
        out.push_str(&piece);
    }
    // Some characters (the emoji at least) span several byte-level tokens.
    assert!(
        held > 0,
        "no token was held back; the test text no longer exercises split characters"
    );
    out.push_str(&stream.finish(&tok).unwrap());
    assert_eq!(out, tok.decode(&ids).unwrap());
    assert_eq!(out, text);
    assert_eq!(stream.ids(), &ids[..]);
}

// ---------------------------------------------------------------------------------------------
