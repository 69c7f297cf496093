//! `wgmoe plan` of GGUF files: a header-only file (metadata and tensor infos) plans as its
//! published config does, names the blocks its weights are held in, and warns that it
//! cannot run; a whole file gets no such warning.

mod common;

use common::cli::*;
use common::fixture;
use serde_json::Value;

/// A GGUF file's header (metadata and tensor infos; the data need not be there) plans as
/// its published config.json does: Qwen3-30B-A3B Q4_K_M's header
/// (models/gguf/headers, tools/make_gguf_header.py) on 8 and 12 GiB cards. `run` refuses
/// the header-only file; `inspect` describes it.
#[test]
fn a_gguf_header_plans_as_its_published_config() {
    let gguf = s(&fixture("gguf/headers/Qwen3-30B-A3B-Q4_K_M.gguf"));
    let json = config("qwen3-30b-a3b.json");
    for vram in ["8GiB", "12GiB"] {
        let plan = |m: &str, extra: &[&str]| {
            let mut a = vec![
                m,
                "--vram",
                vram,
                "--ram",
                "32GiB",
                "--device-gbps",
                "400",
                "--h2d-gbps",
                "25",
                "--json",
            ];
            a.extend_from_slice(extra);
            plan_json(&a)
        };
        let args = |m: &str| plan(m, &[]);
        let same = |v: Value, path: &str| -> Value {
            let t = serde_json::to_string(&v)
                .unwrap()
                .replace(path, "M")
                .replace("MODEL_DIR", "M");
            serde_json::from_str(&t).unwrap()
        };
        let (a, b) = (same(args(&gguf), &gguf), same(args(&json), &json));
        // The same model: every figure the expert format does not change is the config's.
        for k in [
            "model_type",
            "num_layers",
            "moe_layers",
            "num_experts",
            "top_k",
            "parameters",
            "routed_parameters",
            "expert_bytes_f16",
            "kv_cache_bytes",
            "workspace_bytes",
            "dense_precision",
        ] {
            assert_eq!(
                a[k], b[k],
                "{vram}: {k} of the GGUF header and of the config"
            );
        }
        // GGUF experts are held in their own blocks: Q4_K gate/up (4.5 bits per weight), and
        // on the 24 layers whose ffn_down_exps is Q6_K a Q6_K down (6.625 bits: its f16 d
        // in a word of its own), so every slot is as large as those layers' (Q4_K downs,
        // 4.5 bits, on the other 24); the config's experts are wgmoe's block-256 INT4
        // (4.0625 bits).
        use wgmoe::blocks::quant::{Q4Kind, Q4SlotLayout};
        let gguf_slot = Q4SlotLayout::mixed(2048, 768, Q4Kind::Q4K, Q4Kind::Q6K).bytes as u64;
        assert_eq!(gguf_slot, 2 * 768 * 2048 * 9 / 16 + 2048 * 768 * 53 / 64);
        assert_eq!(u(&a, "expert_bytes"), gguf_slot, "{vram}");
        assert_eq!(
            u(&b, "expert_bytes"),
            Q4SlotLayout::new(2048, 768).bytes as u64,
            "{vram}"
        );
        assert_eq!(u(&a, "routed_expert_bytes"), 48 * 128 * gguf_slot);
        // `--expert-precision int4-strict` plans every expert matrix 4-bit (the Q6_K downs rounded into
        // affine INT4, 5 bits), as `run --expert-precision int4-strict` holds them: more
        // resident.
        let strict = plan(&gguf, &["--expert-precision", "int4-strict"]);
        // The old flag plans the same.
        assert_eq!(plan(&gguf, &["--int4-strict"]), strict, "{vram}");
        assert_eq!(
            u(&strict, "expert_bytes"),
            Q4SlotLayout::mixed(2048, 768, Q4Kind::Q4K, Q4Kind::Affine32).bytes as u64
        );
        assert!(
            u(&strict, "resident_experts_per_layer") > u(&a, "resident_experts_per_layer"),
            "{vram}: {} vs {}",
            strict["resident_experts_per_layer"],
            a["resident_experts_per_layer"]
        );
        // Its Q4_K and Q6_K attention matrices are held in their own blocks, not as Q8_0.
        assert!(
            u(&a, "non_routed_bytes") < u(&b, "non_routed_bytes"),
            "{vram}: {} vs {}",
            a["non_routed_bytes"],
            b["non_routed_bytes"]
        );
        assert!(
            u(&a, "resident_experts_per_layer") <= u(&b, "resident_experts_per_layer"),
            "{vram}: larger slots cannot fit more experts"
        );
        assert_eq!(u(&a, "num_experts"), 128);
        assert_eq!(u(&a, "moe_layers"), 48);
        let n = u(&a, "resident_experts_per_layer");
        assert!(n > 8 && n < 128, "{vram}: {n} experts per layer");
    }
    let r = wgmoe(["plan", &gguf, "--vram", "8GiB", "--ram", "32GiB"]);
    assert_ok(&r);
    let last = r
        .stdout
        .trim_end()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_string();
    assert!(last.starts_with(&format!("wgmoe run {gguf} ")), "{r}");
    // The data is not there: run refuses, naming the file.
    let r = wgmoe(["run", &gguf, "-p", "hi", "-n", "1"]);
    assert_error(&r, &["Qwen3-30B-A3B-Q4_K_M.gguf", "truncated"]);
    // inspect: every tensor class by type, from the header alone.
    let v = json_of(&wgmoe(["inspect", &gguf, "--json"]));
    assert_eq!(v["header_only"], true, "{v}");
    assert_eq!(v["loadable"], false, "{v}");
    // tools/make_gguf_header.py's count: 18.55 GB of tensor data, as the published file.
    assert_eq!(u(&v, "tensor_bytes"), 18_550_716_416, "{v}");
    let experts = &v["classes"]["routed_experts"];
    // ffn_down_exps on 24 of the 48 layers is Q6_K (use_more_bits), the rest Q4_K.
    assert_eq!(experts["types"]["q6_K"], 24, "{v}");
    assert_eq!(experts["types"]["q4_K"], 48 * 2 + 24, "{v}");
}

/// Mixtral at 12 GiB: the prefetch slots are what keep n = 1 off the card, and the plan says
/// so with the bytes n = 1 needs and what `--prefetch off` gives; the claim holds when taken.
/// At full residency the heading speaks of no misses (issue 39, 7 and 8).
/// A header-only GGUF plans, and the plan says after its "Run it" line that the file cannot
/// run as it is; a whole GGUF gets no such warning (issue 39, friction).
#[test]
fn a_header_only_gguf_plan_warns_that_it_cannot_run() {
    let header = s(&fixture("gguf/headers/Qwen3-30B-A3B-Q4_K_M.gguf"));
    let whole = s(&fixture("gguf/qwen3moe/qwen3moe-Q8_0.gguf"));
    let r = wgmoe(["plan", &header, "--vram", "12GiB", "--ram", "32GiB"]);
    assert_ok(&r);
    assert!(r.stdout.contains("Run it:"), "{r}");
    // Its weights are named by the blocks they are held in: Q4_K_M holds Q4_K gate/up, and
    // Q6_K downs on some layers (the Q6_K attention and lm_head in their own blocks too).
    for want in [
        "routed experts as the GGUF file's blocks: gate/up q4_K, down ",
        "down q6_K on ",
        "dense weights as the GGUF file's blocks where the kernels compute them (",
        "routed experts, GGUF:",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{r}");
    }
    assert!(!r.stdout.contains("routed experts INT4"), "{r}");
    assert!(
        r.stderr
            .contains("warning: the plan is of the file's header; the file cannot run as it is"),
        "{r}"
    );
    let r = wgmoe(["plan", &whole, "--vram", "12GiB", "--ram", "32GiB"]);
    assert_ok(&r);
    assert!(!r.stderr.contains("warning"), "{r}");
}
