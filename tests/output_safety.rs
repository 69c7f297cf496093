//! `wgmoe quantize` and `wgmoe synth` never destroy a user's files: the input is never the
//! output (or inside it, or around it, through symlinks or `.`), a directory holding another
//! model is refused without `--force`, a failed write leaves what was there byte-identical
//! (and no new directory), and replacing an earlier wgmoe output leaves no stale file of
//! the old model. Every check of a victim directory compares the content hash of every
//! file before and after.

mod common;

use std::path::Path;

use common::cli::*;

/// A tiny synthetic model's shape (fast to write).
const TINY: &[&str] = &[
    "--hidden",
    "64",
    "--layers",
    "2",
    "--heads",
    "4",
    "--experts",
    "4",
    "--top-k",
    "2",
    "--expert-intermediate",
    "64",
    "--vocab",
    "512",
];

fn synth_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["synth", "--arch", "olmoe-1b-7b", "-o", &s(out)]
        .iter()
        .map(|a| a.to_string())
        .collect();
    v.extend(TINY.iter().chain(extra).map(|a| a.to_string()));
    v
}

/// `wgmoe run DIR` greedy, 3 tokens: the generated ids.
fn generated(dir: &Path) -> Vec<u64> {
    let r = wgmoe([
        "run",
        &s(dir),
        "--prompt-ids",
        "1,2,3",
        "-n",
        "3",
        "--ignore-eos",
        "--json",
    ]);
    ids(&json_of(&r), "generated_ids")
}

#[test]
fn quantize_never_writes_into_its_input() {
    for fixture in [OLMOE, QWEN] {
        let (t, m) = copy_fixture(fixture);
        let link = t.path().join("link");
        common::symlink_dir(&m, &link).unwrap();
        let ms = s(&m);
        let cases: Vec<Vec<String>> = vec![
            vec![ms.clone(), ms.clone()],
            vec![ms.clone(), format!("{ms}/.")],
            vec![ms.clone(), format!("{ms}/../{fixture}")],
            vec![ms.clone(), s(&link)],
            vec![s(&link), ms.clone()],
            vec![ms.clone(), format!("{ms}/sub/out")],
            vec![ms.clone(), s(t.path())],
        ];
        for c in cases {
            let r = run_untouched(&m, &["quantize", &c[0], "-o", &c[1]]);
            assert_error(&r, &["-o/--out", "input model directory"]);
        }
        assert!(
            !m.join("sub").exists(),
            "a nested output directory was created"
        );
        // `cd M && wgmoe quantize . -o .`
        let before = snapshot(&m);
        let r = wgmoe_in(&m, &["quantize", ".", "-o", "."]);
        assert_error(&r, &["-o/--out", "is the input model directory"]);
        assert_eq!(before, snapshot(&m), "{r}");
        assert_eq!(
            names(t.path()),
            vec!["link".to_string(), fixture.to_string()]
        );
    }
}

#[test]
fn a_directory_holding_another_model_is_refused() {
    let (_ta, a) = copy_fixture(OLMOE);
    let (_tb, b) = copy_fixture(QWEN);
    let r = run_untouched(&b, &["quantize", &s(&a), "-o", &s(&b)]);
    assert_error(
        &r,
        &[
            "-o/--out",
            "not empty",
            "model.safetensors.index.json",
            "--force",
        ],
    );
    let r = run_untouched(&b, &synth_args(&b, &[]));
    assert_error(&r, &["-o/--out", "not empty", "--force"]);
    let r = run_untouched(&b, &synth_args(&b, &["--format", "hf"]));
    assert_error(&r, &["-o/--out", "not empty"]);
    // A directory of anything else too, and a file.
    let (_tc, c) = copy_fixture(OLMOE);
    let other = c.parent().unwrap().join("notes");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("todo.txt"), "keep me").unwrap();
    let r = run_untouched(&other, &["quantize", &s(&a), "-o", &s(&other)]);
    assert_error(&r, &["todo.txt", "--force"]);
    let file = other.join("todo.txt");
    let r = run_untouched(&other, &["quantize", &s(&a), "-o", &s(&file)]);
    assert_error(&r, &["not a directory"]);
    let r = run_untouched(&other, &synth_args(&file, &[]));
    assert_error(&r, &["not a directory"]);
}

#[test]
fn a_failed_write_leaves_no_trace_and_the_earlier_output_intact() {
    let (t, good) = copy_fixture(OLMOE);
    let earlier = t.path().join("earlier");
    assert_ok(&wgmoe(["quantize", &s(&good), "-o", &s(&earlier)]));
    // The last dense tensor written: the converted file is half written when it fails.
    let (_tb, bad) = copy_fixture(OLMOE);
    set_element(
        &bad.join("model.safetensors"),
        "model.norm.weight",
        5,
        f32::NAN,
    );
    let r = run_untouched(&earlier, &["quantize", &s(&bad), "-o", &s(&earlier)]);
    assert_error(&r, &["model.norm.weight", "element 5", "NaN"]);
    assert!(
        !names(&earlier).iter().any(|n| n.starts_with('.')),
        "temporaries left: {:?}",
        names(&earlier)
    );
    // A new directory (and its new parent) is removed again.
    let new = t.path().join("new/out");
    let r = run_untouched(t.path(), &["quantize", &s(&bad), "-o", &s(&new)]);
    assert_error(&r, &["model.norm.weight"]);
    assert!(!t.path().join("new").exists(), "{r}");
    // The earlier output still loads.
    assert_eq!(generated(&earlier).len(), 3);
}

#[test]
fn replacing_an_earlier_output_leaves_no_stale_files() {
    let (t, a) = copy_fixture(OLMOE);
    let (_tq, q) = copy_fixture(QWEN);
    // A chat_template.jinja (which takes precedence over tokenizer_config.json's template)
    // that the next model does not have.
    std::fs::write(
        a.join("chat_template.jinja"),
        "{{ messages[0]['content'] }}",
    )
    .unwrap();
    let c = t.path().join("c");

    // An earlier sharded synth --format hf output ...
    let r = wgmoe(synth_args(
        &c,
        &["--format", "hf", "--max-shard-bytes", "100000"],
    ));
    assert_ok(&r);
    assert!(c.join("model.safetensors.index.json").is_file(), "{r}");
    // ... replaced by a conversion: no shard or index left.
    let r = wgmoe(["quantize", &s(&a), "-o", &s(&c)]);
    assert_ok(&r);
    assert!(
        r.stderr
            .contains("replaced an earlier `wgmoe synth --format hf` model"),
        "{r}"
    );
    let converted = [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    assert_eq!(names(&c), converted, "{r}");
    for f in ["config.json", "tokenizer.json", "chat_template.jinja"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(c.join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(generated(&c).len(), 3);

    // A conversion of another model replaces it; the old chat template goes.
    let r = wgmoe(["quantize", &s(&q), "-o", &s(&c)]);
    assert_ok(&r);
    assert!(
        r.stderr
            .contains("replaced an earlier `wgmoe quantize` conversion"),
        "{r}"
    );
    assert_eq!(names(&c), converted[1..], "{r}");
    assert_eq!(
        std::fs::read(q.join("config.json")).unwrap(),
        std::fs::read(c.join("config.json")).unwrap()
    );
    assert_eq!(
        generated(&c),
        generated(&q),
        "the directory loads as the new model"
    );

    // synth over a conversion: special_tokens_map.json (which synth does not write) goes.
    let r = wgmoe(synth_args(&c, &[]));
    assert_ok(&r);
    assert!(
        r.stderr
            .contains("replaced an earlier `wgmoe quantize` conversion"),
        "{r}"
    );
    let synth = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    assert_eq!(names(&c), synth, "{r}");
    // and synth over synth.
    let r = wgmoe(synth_args(&c, &["--seed", "3"]));
    assert_ok(&r);
    assert!(
        r.stderr.contains("replaced an earlier `wgmoe synth` model"),
        "{r}"
    );
    assert_eq!(names(&c), synth, "{r}");
    assert_eq!(generated(&c).len(), 3);
}

#[test]
fn force_replaces_the_model_files_and_keeps_the_rest() {
    let (_ta, a) = copy_fixture(OLMOE);
    let (_tb, b) = copy_fixture(QWEN);
    std::fs::write(b.join("notes.txt"), "mine").unwrap();
    let r = wgmoe(["quantize", &s(&a), "-o", &s(&b), "--force"]);
    assert_ok(&r);
    assert_eq!(
        names(&b),
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "notes.txt",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ],
        "{r}"
    );
    assert_eq!(std::fs::read(b.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(generated(&b), generated(&a));
}

/// A user's GGUF is never replaced or removed, `--force` or not, by `synth` in any format
/// or by `quantize`; synth's own GGUF output is recognised and replaced without `--force`,
/// and a later output of another format leaves no stale `model.gguf`.
#[test]
fn a_users_gguf_is_never_replaced_and_synths_own_is() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("mine");
    std::fs::create_dir(&d).unwrap();
    std::fs::copy(
        common::repo().join("models/gguf/qwen3moe/qwen3moe-Q8_0.gguf"),
        d.join("model.gguf"),
    )
    .unwrap();
    let (_ta, a) = copy_fixture(OLMOE);
    for force in [false, true] {
        let f: &[&str] = if force { &["--force"] } else { &[] };
        for format in ["gguf", "converted", "hf"] {
            let mut extra = vec!["--format", format];
            extra.extend_from_slice(f);
            let r = run_untouched(&d, &synth_args(&d, &extra));
            assert_error(&r, &["-o/--out", "model.gguf", "never replaces"]);
        }
        let mut q = vec!["quantize".to_string(), s(&a), "-o".into(), s(&d)];
        q.extend(f.iter().map(|x| x.to_string()));
        let r = run_untouched(&d, &q);
        assert_error(&r, &["-o/--out", "model.gguf", "never replaces"]);
    }

    // synth's own GGUF: rewritten without --force, then replaced by another format.
    let c = t.path().join("synth");
    assert_ok(&wgmoe(synth_args(&c, &["--format", "gguf"])));
    let r = wgmoe(synth_args(&c, &["--format", "gguf", "--seed", "5"]));
    assert_ok(&r);
    assert!(
        r.stderr
            .contains("replaced an earlier `wgmoe synth --format gguf` model"),
        "{r}"
    );
    assert_eq!(names(&c), ["model.gguf"], "{r}");
    let r = wgmoe(synth_args(&c, &[]));
    assert_ok(&r);
    assert!(
        !names(&c).contains(&"model.gguf".to_string()),
        "a stale model.gguf is left: {:?}",
        names(&c)
    );
    assert_eq!(generated(&c).len(), 3);
}
