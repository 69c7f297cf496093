//! `POST /tokenize` and `POST /detokenize` (llama-server's names and shapes): their answers
//! equal the tokenizer's own on every fixture tokenizer, GGUF ones included, and text comes
//! back through both; bad requests are 400s naming the field. Through a real server: the
//! routes, and the model name a request gives (answered by the loaded model unless
//! `--strict-model`).

mod common;

use std::path::Path;

use common::fixture;
use common::server::*;
use serde_json::{json, Value};
use wgmoe::gguf::GgufModel;
use wgmoe::serve::tokenize::{detokenize, tokenize};
use wgmoe::tokenizer::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello, world! 123",
    "The old clockmaker",
    "naïve café – 東京 🙂",
    "line\nbreak\ttab  two spaces",
    "",
];

/// Every tokenizer the fixtures hold: the safetensors models' tokenizer.json files, the
/// GGUF tokenizer files and one GGUF model per family.
fn tokenizers() -> Vec<(String, Tokenizer)> {
    let mut out = Vec::new();
    for m in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        out.push((m.to_string(), Tokenizer::from_dir(&fixture(m)).unwrap()));
    }
    let gguf = |p: &Path| {
        let m = GgufModel::open(p).unwrap_or_else(|e| panic!("{e}"));
        wgmoe::gguf::tokenizer::tokenizer(&m).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let dir = common::repo().join("models/gguf/tokenizers");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for f in files {
        out.push((f.display().to_string(), gguf(&f)));
    }
    for family in ["olmoe", "qwen2moe", "qwen3moe", "mixtral"] {
        let f = common::repo().join(format!("models/gguf/{family}/{family}-Q8_0.gguf"));
        out.push((f.display().to_string(), gguf(&f)));
    }
    out
}

#[test]
fn tokenize_and_detokenize_round_trip_on_every_fixture_tokenizer() {
    for (name, tok) in tokenizers() {
        for &text in TEXTS {
            for add_special in [false, true] {
                let what = format!("{name}: {text:?} add_special {add_special}");
                let r = tokenize(&tok, &json!({"content": text, "add_special": add_special}))
                    .unwrap_or_else(|e| panic!("{what}: {:?}", e.body()));
                let ids: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
                assert_eq!(ids, tok.encode(text, add_special).unwrap(), "{what}");
                // Pieces: the same ids, each with its own text.
                let p = tokenize(
                    &tok,
                    &json!({"content": text, "add_special": add_special, "with_pieces": true}),
                )
                .unwrap();
                let pieces = p["tokens"].as_array().unwrap();
                assert_eq!(pieces.len(), ids.len(), "{what}");
                for (piece, &id) in pieces.iter().zip(&ids) {
                    assert_eq!(piece["id"], id, "{what}");
                    assert!(piece["piece"].is_string(), "{what}: {piece}");
                }
                let back = detokenize(&tok, &json!({ "tokens": ids })).unwrap();
                let content = back["content"].as_str().unwrap();
                if !add_special {
                    assert_eq!(content, text, "{what}: the round trip");
                } else {
                    // Special tokens are written out: the text follows them.
                    assert!(content.ends_with(text), "{what}: {content:?}");
                }
            }
        }
    }
}

#[test]
fn bad_tokenize_requests_name_their_field() {
    let tok = Tokenizer::from_dir(&fixture("olmoe-tiny")).unwrap();
    let vocab = tok.vocab_size() as u64;
    for (body, param) in [
        (json!({}), "content"),
        (json!({"content": 5}), "content"),
        (json!({"content": "x", "add_special": "yes"}), "add_special"),
        (json!({"content": "x", "with_pieces": 1}), "with_pieces"),
        (json!([1, 2]), ""),
    ] {
        let e = tokenize(&tok, &body).expect_err(&body.to_string());
        // A body that is no object names no field.
        let want = if param.is_empty() {
            Value::Null
        } else {
            json!(param)
        };
        assert_eq!(
            (e.status, e.body()["error"]["param"].clone()),
            (400, want),
            "{body}"
        );
    }
    for (body, param) in [
        (json!({}), "tokens"),
        (json!({"tokens": "1 2"}), "tokens"),
        (json!({"tokens": [1, -2]}), "tokens[1]"),
        (json!({"tokens": [1, 2.5]}), "tokens[1]"),
        (json!({"tokens": [0, vocab + 1000]}), "tokens[1]"),
        (json!({"tokens": [0, 1u64 << 40]}), "tokens[1]"),
    ] {
        let e = detokenize(&tok, &body).expect_err(&body.to_string());
        let b = e.body();
        assert_eq!(
            (e.status, b["error"]["param"].clone()),
            (400, json!(param)),
            "{body}: {b}"
        );
    }
    // An empty list is an empty text.
    assert_eq!(
        detokenize(&tok, &json!({"tokens": []})).unwrap()["content"],
        ""
    );
}

fn completion(srv: &Server, model: &str) -> (u16, Value) {
    srv.post(
        "/v1/completions",
        &json!({"model": model, "prompt": "hi", "max_tokens": 2}),
    )
}

#[test]
fn the_server_tokenizes_and_answers_any_model_name_unless_strict() {
    let dir = fixture("olmoe-tiny");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let srv = Server::start(&dir, &[]);
    let (st, v) = srv.post("/tokenize", &json!({"content": "The old clockmaker"}));
    assert_eq!(st, 200, "{v}");
    let ids = tok.encode("The old clockmaker", false).unwrap();
    assert_eq!(v["tokens"], json!(ids));
    let (st, v) = srv.post("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(
        (st, v["content"].as_str()),
        (200, Some("The old clockmaker")),
        "{v}"
    );
    let (st, v) = srv.post("/detokenize", &json!({"tokens": [u32::MAX]}));
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("tokens[0]")),
        "{v}"
    );
    // Without --strict-model, any name is answered by the loaded model, named as itself.
    let (st, v) = completion(&srv, "gpt-4o");
    assert_eq!((st, v["model"].as_str()), (200, Some("olmoe-tiny")), "{v}");
    drop(srv);
    // --strict-model: the alias and the directory's name are answered, another is a 404.
    let srv = Server::start(&dir, &["--strict-model", "--alias", "tiny"]);
    for m in ["tiny", "olmoe-tiny"] {
        let (st, v) = completion(&srv, m);
        assert_eq!((st, v["model"].as_str()), (200, Some("tiny")), "{m}: {v}");
        assert_eq!(srv.get(&format!("/v1/models/{m}")).0, 200, "{m}");
    }
    let (st, v) = completion(&srv, "gpt-4o");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{v}"
    );
    assert_eq!(srv.get("/v1/models/gpt-4o").0, 404);
}
