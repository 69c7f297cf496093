//! `wgmoe kernels` pins the memory access of the GPU plan on the real shapes: the figures are
//! counted by the probe build of the kernels themselves (lavapipe at its widest subgroups),
//! so a kernel that goes back to strided loads, or a dispatch too small to fill a large GPU,
//! fails here.

use wgmoe::backend::kernel::{KvFormat, WeightFormat};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::KernelOverrides;
use wgmoe::blocks::q8_0::Q8Matrix;
use wgmoe::config::ModelConfig;
use wgmoe::insight::kernel_report::{
    report, DeviceClass, KernelsOptions, KernelsReport, LatencyModel, Stages,
};

fn options(stages: Stages, context: usize, overrides: KernelOverrides) -> KernelsOptions {
    options_in(stages, context, overrides, WeightFormat::F16)
}

fn options_in(
    stages: Stages,
    context: usize,
    overrides: KernelOverrides,
    dense: WeightFormat,
) -> KernelsOptions {
    KernelsOptions {
        class: DeviceClass::Discrete,
        stages,
        context,
        prefill_chunk: 64,
        bandwidth_gbps: 672.0,
        overrides,
        int4: true,
        dense,
        latency: LatencyModel::NONE,
        // `run`'s default cache.
        kv: KvFormat::F16,
    }
}

fn config(path: &str) -> ModelConfig {
    // As the command does: subgroups of a warp's width, set before any Vulkan instance.
    std::env::set_var("LP_NATIVE_VECTOR_WIDTH", "1024");
    std::env::set_var(
        "XDG_RUNTIME_DIR",
        std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| "/tmp".into()),
    );
    if path.ends_with(".gguf") {
        let gguf = wgmoe::gguf::GgufModel::open_header(std::path::Path::new(path)).unwrap();
        return wgmoe::gguf::model_config(&gguf).unwrap();
    }
    let text = std::fs::read_to_string(path).unwrap();
    ModelConfig::from_json(&text, std::path::Path::new(path)).unwrap()
}

fn stage<'a>(r: &'a KernelsReport, name: &str) -> &'a wgmoe::insight::kernel_report::StageReport {
    r.kernels
        .iter()
        .find(|k| k.stage == name)
        .unwrap_or_else(|| panic!("no stage {name} in {:?}", r.kernels))
}

/// The bar at `--device-class discrete --context 4096`, with dense weights in
/// `dense` (measured by the probe in the kernels themselves).
fn decode_meets_the_bar(path: &str, dense: WeightFormat) -> KernelsReport {
    let cfg = config(path);
    let context = 4096;
    let r = report(
        path,
        &cfg,
        &options_in(Stages::Decode, context, KernelOverrides::default(), dense),
    )
    .unwrap();
    assert!(r.plan.coalesced_decode, "{:?}", r.plan);
    let mut weighted = 0;
    for k in &r.kernels {
        assert!(k.stage.starts_with("decode/"), "{}", k.stage);
        if let Some(eff) = k.sector_efficiency {
            weighted += 1;
            assert!(
                eff >= 0.90,
                "{path}: {} ({}) sector efficiency {eff}",
                k.stage,
                k.kernel
            );
            assert!(
                k.workgroups >= 256,
                "{path}: {} ({}) has a dispatch of {} workgroups",
                k.stage,
                k.kernel,
                k.workgroups
            );
        }
    }
    // Projections, router, both expert kernels, lm_head (and any shared or dense MLP).
    assert!(weighted >= 6, "{path}: only {weighted} stages read weights");
    // Attention reads each KV head's (f16) cache once, over enough workgroups.
    let a = stage(&r, "decode/attention");
    let cache = 2 * cfg.num_kv_heads * cfg.head_dim * context * 2;
    assert!(
        a.workgroups >= 128,
        "{path}: attention in {} workgroups",
        a.workgroups
    );
    assert!(
        a.kv_bytes as f64 <= 1.1 * cache as f64 && a.kv_bytes as f64 >= cache as f64,
        "{path}: attention reads {} bytes of a {cache}-byte cache",
        a.kv_bytes
    );
    assert!(a.kv_sector_efficiency.unwrap() >= 0.90);
    // lm_head streams its f16 (or Q8_0, or a GGUF file's blocks: quants and scales)
    // matrix exactly once.
    let head = stage(&r, "decode/lm_head");
    let head_bytes = match (dense, cfg.dense_kind("lm_head.weight")) {
        (WeightFormat::Q8, Some(kind)) => wgmoe::model::tensors::F16Matrix::chunk_bytes(
            WeightFormat::int4(kind),
            cfg.vocab_size,
            cfg.hidden_size,
        ) as usize,
        (WeightFormat::Q8, None) => Q8Matrix {
            out: cfg.vocab_size,
            inp: cfg.hidden_size,
        }
        .bytes(),
        _ => cfg.vocab_size * cfg.hidden_size * 2,
    };
    assert_eq!(head.weight_bytes as usize, head_bytes);
    // Every layer's experts: top_k experts' INT4 words (and scales) at least.
    let gate_up = stage(&r, "decode/experts_gate_up");
    assert!(
        gate_up.weight_bytes as usize >= cfg.top_k * 2 * cfg.moe_intermediate * cfg.hidden_size / 2,
        "{path}: gate/up reads {} bytes",
        gate_up.weight_bytes
    );
    let total = r.bytes_per_token.unwrap();
    assert!(r.predicted_decode_tokens_per_s.unwrap() > 0.0);
    // Latency and the host only ever slow the roofline down.
    assert!(
        r.predicted_decode_tokens_per_s.unwrap()
            <= r.roofline_decode_tokens_per_s.unwrap() * 1.0001,
        "{path}: predicted {:?} above the roofline {:?}",
        r.predicted_decode_tokens_per_s,
        r.roofline_decode_tokens_per_s
    );
    assert!(r.encode_seconds_per_token.unwrap() > 0.0);
    assert!(r.dispatches_per_token.unwrap() >= cfg.num_layers * 6);
    assert!(r.prefill_bytes_per_token.is_none());
    // The per-token sum counts every layer: at least lm_head plus each layer's KV.
    assert!(total as usize >= head.weight_bytes as usize + cfg.num_layers * cache);
    r
}

#[test]
fn olmoe_decode_is_coalesced_and_fills_a_gpu() {
    decode_meets_the_bar("models/configs/olmoe-1b-7b-0924.json", WeightFormat::F16);
}

#[test]
fn qwen3_decode_is_coalesced_and_fills_a_gpu() {
    decode_meets_the_bar("models/configs/qwen3-30b-a3b.json", WeightFormat::F16);
}

#[test]
fn mixtral_decode_is_coalesced_and_fills_a_gpu() {
    decode_meets_the_bar("models/configs/mixtral-8x7b-v0.1.json", WeightFormat::F16);
}

/// A Qwen3-30B-A3B Q4_K_M GGUF file, planned from its header as the loader holds it: its
/// Q4_K and Q6_K attention, lm_head and experts in their own blocks (q and k in Q4_K, v in
/// Q6_K on the layers llama-quantize gives more bits: runs of their own, the v run with
/// fewer rows per workgroup so it still fills a GPU). Every one of those kernels reads its
/// words coalesced and fills a GPU, and the probe's byte count per token is the plan's.
#[test]
fn qwen3_gguf_q4_k_m_decode_is_coalesced_and_fills_a_gpu() {
    let path = "models/gguf/headers/Qwen3-30B-A3B-Q4_K_M.gguf";
    let r = decode_meets_the_bar(path, WeightFormat::Q8);
    let kernels = [
        ("decode/qkv_proj", "q4_K"),
        ("decode/qkv_proj", "q6_K"),
        ("decode/lm_head", "q6_K"),
        ("decode/o_proj", "q4_K"),
        ("decode/experts_gate_up", "q4_K"),
        ("decode/experts_down", "q4_K"),
        ("decode/experts_down", "q6_K"),
    ];
    for (s, format) in kernels {
        let k = &stage(&r, s).kernel;
        assert!(k.contains(format), "{s}: {k}, not {format}");
    }
    let cfg = config(path);
    let plan =
        wgmoe::planner::decode_bytes_per_token(&cfg, WeightFormat::Q8, true, KvFormat::F16, 4096)
            .unwrap() as f64;
    let got = r.bytes_per_token.unwrap() as f64;
    assert!(
        (got - plan).abs() <= 0.01 * plan,
        "probe {got} vs plan {plan} bytes per token"
    );
}

/// The probe sees strided access: the storage kernels (one invocation per row) waste half
/// of each sector or more, and the tiled prefill GEMMs do not. With storage decode and
/// tiled prefill, one-token steps run the storage kernels, not the GEMMs.
#[test]
fn the_probe_tells_strided_from_coalesced_loads() {
    let path = "models/olmoe-tiny/config.json";
    let cfg = config(path);
    let storage_decode = KernelOverrides {
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Tiled),
        ..Default::default()
    };
    let r = report(path, &cfg, &options(Stages::All, 256, storage_decode)).unwrap();
    let qkv = stage(&r, "decode/qkv_proj");
    assert!(
        qkv.sector_efficiency.unwrap() < 0.75,
        "storage matvec: {qkv:?}"
    );
    assert_eq!(qkv.kernel, "matmul");
    assert_eq!(stage(&r, "decode/attention").kernel, "attention[f16 kv]");
    assert!(!stage(&r, "decode/experts_gate_up").kernel.contains("gemm"));
    for name in ["prefill/qkv_proj", "prefill/experts_gate_up"] {
        let k = stage(&r, name);
        assert!(k.kernel.contains("gemm"), "{name}: {k:?}");
        assert!(k.sector_efficiency.unwrap() >= 0.90, "{name}: {k:?}");
    }
    assert!(r.prefill_bytes_per_token.unwrap() > 0.0);
}

/// The attention stage reads the cache in the storage asked for: f16 by default (as
/// `run`'s), half of f32's bytes, q8_0 fewer still; the report says which.
#[test]
fn attention_reads_the_kv_cache_in_its_precision() {
    let path = "models/olmoe-tiny/config.json";
    let cfg = config(path);
    let context = 256;
    let kv_bytes = |kv: KvFormat| {
        let mut o = options(Stages::Decode, context, KernelOverrides::default());
        o.kv = kv;
        let r = report(path, &cfg, &o).unwrap();
        assert_eq!(r.kv_precision, kv);
        assert_eq!(r.plan.kv, kv);
        (
            stage(&r, "decode/attention").kv_bytes,
            r.bytes_per_token.unwrap(),
        )
    };
    let (f32_kv, f32_total) = kv_bytes(KvFormat::F32);
    let (f16_kv, f16_total) = kv_bytes(KvFormat::F16);
    let (q8_kv, _) = kv_bytes(KvFormat::Q8);
    let per_pos = |kv: KvFormat| 2 * kv.row_bytes(cfg.num_kv_heads * cfg.head_dim, cfg.head_dim);
    // (q8_0's scales are read apart from its values: fewer bytes still, checked below.)
    for (kv, got) in [(KvFormat::F32, f32_kv), (KvFormat::F16, f16_kv)] {
        let want = (per_pos(kv) * context) as f64;
        assert!(
            got as f64 >= want && got as f64 <= 1.1 * want,
            "{kv:?}: attention reads {got} bytes of a {want}-byte cache"
        );
    }
    assert!(q8_kv < f16_kv && f16_kv < f32_kv);
    // The per-token total moves by every layer's difference.
    assert_eq!(
        f32_total - f16_total,
        (f32_kv - f16_kv) * cfg.num_layers as u64
    );
}
