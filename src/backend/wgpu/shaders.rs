//! WGSL sources: one body per kernel family under `shaders/`, joined with the shared pieces
//! of `shaders/common/` its variant needs (the step uniform and flags always; INT4
//! unpacking, the dot product's arithmetic, where activations come from and how many lanes
//! compute a row for the W4A16 kernels). No text is generated: every piece is plain WGSL,
//! and every assembled variant is validated by naga in the tests.

use crate::backend::kernel::{Activations, Arith, Kernel, KvFormat, Lanes, Reduce, WeightFormat};

/// The shared pieces, by file name under `shaders/common/`.
pub const PIECES: &[(&str, &str)] = &[
    (
        "step.wgsl",
        include_str!("../../../shaders/common/step.wgsl"),
    ),
    (
        "flags.wgsl",
        include_str!("../../../shaders/common/flags.wgsl"),
    ),
    (
        "f16_halves.wgsl",
        include_str!("../../../shaders/common/f16_halves.wgsl"),
    ),
    (
        "act8.wgsl",
        include_str!("../../../shaders/common/act8.wgsl"),
    ),
    (
        "uniform_window.wgsl",
        include_str!("../../../shaders/common/uniform_window.wgsl"),
    ),
    (
        "q4_unpack.wgsl",
        include_str!("../../../shaders/common/q4_unpack.wgsl"),
    ),
    (
        "q4_dot_f32.wgsl",
        include_str!("../../../shaders/common/q4_dot_f32.wgsl"),
    ),
    (
        "q4_dot_f16.wgsl",
        include_str!("../../../shaders/common/q4_dot_f16.wgsl"),
    ),
    (
        "q4_act32.wgsl",
        include_str!("../../../shaders/common/q4_act32.wgsl"),
    ),
    (
        "q4_act_storage.wgsl",
        include_str!("../../../shaders/common/q4_act_storage.wgsl"),
    ),
    (
        "q4_act_uniform.wgsl",
        include_str!("../../../shaders/common/q4_act_uniform.wgsl"),
    ),
    (
        "lanes_1.wgsl",
        include_str!("../../../shaders/common/lanes_1.wgsl"),
    ),
    (
        "lanes_8.wgsl",
        include_str!("../../../shaders/common/lanes_8.wgsl"),
    ),
    (
        "q4_down_row.wgsl",
        include_str!("../../../shaders/common/q4_down_row.wgsl"),
    ),
    (
        "wg_tree.wgsl",
        include_str!("../../../shaders/common/wg_tree.wgsl"),
    ),
    (
        "route_topk.wgsl",
        include_str!("../../../shaders/common/route_topk.wgsl"),
    ),
    (
        "attn_scratch.wgsl",
        include_str!("../../../shaders/common/attn_scratch.wgsl"),
    ),
    (
        "ffn_slot.wgsl",
        include_str!("../../../shaders/common/ffn_slot.wgsl"),
    ),
    (
        "q4_pairs8.wgsl",
        include_str!("../../../shaders/common/q4_pairs8.wgsl"),
    ),
    (
        "kv_f16.wgsl",
        include_str!("../../../shaders/common/kv_f16.wgsl"),
    ),
    (
        "kv4_f32.wgsl",
        include_str!("../../../shaders/common/kv4_f32.wgsl"),
    ),
    (
        "kv4_f16.wgsl",
        include_str!("../../../shaders/common/kv4_f16.wgsl"),
    ),
    (
        "kv_store_f32.wgsl",
        include_str!("../../../shaders/common/kv_store_f32.wgsl"),
    ),
    (
        "kv_store_f16.wgsl",
        include_str!("../../../shaders/common/kv_store_f16.wgsl"),
    ),
    (
        "kv_store_pairs.wgsl",
        include_str!("../../../shaders/common/kv_store_pairs.wgsl"),
    ),
    (
        "kv_store_q8.wgsl",
        include_str!("../../../shaders/common/kv_store_q8.wgsl"),
    ),
    (
        "dense_params.wgsl",
        include_str!("../../../shaders/common/dense_params.wgsl"),
    ),
    (
        "tokens_window.wgsl",
        include_str!("../../../shaders/common/tokens_window.wgsl"),
    ),
    (
        "tokens_storage.wgsl",
        include_str!("../../../shaders/common/tokens_storage.wgsl"),
    ),
    (
        "store_rows.wgsl",
        include_str!("../../../shaders/common/store_rows.wgsl"),
    ),
    (
        "q8_row.wgsl",
        include_str!("../../../shaders/common/q8_row.wgsl"),
    ),
    (
        "q8_unpack.wgsl",
        include_str!("../../../shaders/common/q8_unpack.wgsl"),
    ),
    (
        "kv_q8_read.wgsl",
        include_str!("../../../shaders/common/kv_q8_read.wgsl"),
    ),
    (
        "kv_q8.wgsl",
        include_str!("../../../shaders/common/kv_q8.wgsl"),
    ),
    (
        "kv4_q8.wgsl",
        include_str!("../../../shaders/common/kv4_q8.wgsl"),
    ),
    (
        "kv_f32.wgsl",
        include_str!("../../../shaders/common/kv_f32.wgsl"),
    ),
    (
        "probe_sites.wgsl",
        include_str!("../../../shaders/common/probe_sites.wgsl"),
    ),
    (
        "probe_off.wgsl",
        include_str!("../../../shaders/common/probe_off.wgsl"),
    ),
    (
        "probe_on.wgsl",
        include_str!("../../../shaders/common/probe_on.wgsl"),
    ),
    (
        "reduce_sg.wgsl",
        include_str!("../../../shaders/common/reduce_sg.wgsl"),
    ),
    (
        "reduce_wg.wgsl",
        include_str!("../../../shaders/common/reduce_wg.wgsl"),
    ),
    (
        "act_x4.wgsl",
        include_str!("../../../shaders/common/act_x4.wgsl"),
    ),
    (
        "act_cols.wgsl",
        include_str!("../../../shaders/common/act_cols.wgsl"),
    ),
    (
        "act_cols_norm.wgsl",
        include_str!("../../../shaders/common/act_cols_norm.wgsl"),
    ),
    (
        "onehot.wgsl",
        include_str!("../../../shaders/common/onehot.wgsl"),
    ),
    (
        "tile_f16.wgsl",
        include_str!("../../../shaders/common/tile_f16.wgsl"),
    ),
    (
        "tile_q4.wgsl",
        include_str!("../../../shaders/common/tile_q4.wgsl"),
    ),
    (
        "tile_q4a.wgsl",
        include_str!("../../../shaders/common/tile_q4a.wgsl"),
    ),
    (
        "fmt_f16.wgsl",
        include_str!("../../../shaders/common/fmt_f16.wgsl"),
    ),
    (
        "scales_staged.wgsl",
        include_str!("../../../shaders/common/scales_staged.wgsl"),
    ),
    (
        "fmt_q8.wgsl",
        include_str!("../../../shaders/common/fmt_q8.wgsl"),
    ),
    (
        "tile_q8.wgsl",
        include_str!("../../../shaders/common/tile_q8.wgsl"),
    ),
    (
        "fmt_q4.wgsl",
        include_str!("../../../shaders/common/fmt_q4.wgsl"),
    ),
    (
        "fmt_q4a.wgsl",
        include_str!("../../../shaders/common/fmt_q4a.wgsl"),
    ),
    (
        "kq_common.wgsl",
        include_str!("../../../shaders/common/kq_common.wgsl"),
    ),
    (
        "kq_k4.wgsl",
        include_str!("../../../shaders/common/kq_k4.wgsl"),
    ),
    (
        "fmt_q4k.wgsl",
        include_str!("../../../shaders/common/fmt_q4k.wgsl"),
    ),
    (
        "fmt_q5k.wgsl",
        include_str!("../../../shaders/common/fmt_q5k.wgsl"),
    ),
    (
        "fmt_q6k.wgsl",
        include_str!("../../../shaders/common/fmt_q6k.wgsl"),
    ),
    (
        "fmt_q5a.wgsl",
        include_str!("../../../shaders/common/fmt_q5a.wgsl"),
    ),
    (
        "tile_kq.wgsl",
        include_str!("../../../shaders/common/tile_kq.wgsl"),
    ),
];

/// The kernel bodies, by family (file name under `shaders/` without `.wgsl`).
pub const BODIES: &[(&str, &str)] = &[
    ("embed", include_str!("../../../shaders/embed.wgsl")),
    ("rmsnorm", include_str!("../../../shaders/rmsnorm.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
    ("matmul_q8", include_str!("../../../shaders/matmul_q8.wgsl")),
    (
        "matmul_q8_u",
        include_str!("../../../shaders/matmul_q8_u.wgsl"),
    ),
    (
        "matmul_q8_w",
        include_str!("../../../shaders/matmul_q8_w.wgsl"),
    ),
    ("matmul_u", include_str!("../../../shaders/matmul_u.wgsl")),
    ("matmul_w", include_str!("../../../shaders/matmul_w.wgsl")),
    ("rope_kv", include_str!("../../../shaders/rope_kv.wgsl")),
    ("attention", include_str!("../../../shaders/attention.wgsl")),
    (
        "attention_w",
        include_str!("../../../shaders/attention_w.wgsl"),
    ),
    (
        "router_topk",
        include_str!("../../../shaders/router_topk.wgsl"),
    ),
    (
        "ffn_gate_up",
        include_str!("../../../shaders/ffn_gate_up.wgsl"),
    ),
    ("ffn_down", include_str!("../../../shaders/ffn_down.wgsl")),
    (
        "ffn_gate_up_q4",
        include_str!("../../../shaders/ffn_gate_up_q4.wgsl"),
    ),
    (
        "ffn_down_q4",
        include_str!("../../../shaders/ffn_down_q4.wgsl"),
    ),
    (
        "ffn_down_q4_combine",
        include_str!("../../../shaders/ffn_down_q4_combine.wgsl"),
    ),
    (
        "ffn_gate_up_q4_e",
        include_str!("../../../shaders/ffn_gate_up_q4_e.wgsl"),
    ),
    (
        "ffn_down_q4_e",
        include_str!("../../../shaders/ffn_down_q4_e.wgsl"),
    ),
    ("moe_sort", include_str!("../../../shaders/moe_sort.wgsl")),
    (
        "moe_gather",
        include_str!("../../../shaders/moe_gather.wgsl"),
    ),
    (
        "moe_combine",
        include_str!("../../../shaders/moe_combine.wgsl"),
    ),
    ("argmax", include_str!("../../../shaders/argmax.wgsl")),
    ("matvec", include_str!("../../../shaders/matvec.wgsl")),
    (
        "expert_gate_up",
        include_str!("../../../shaders/expert_gate_up.wgsl"),
    ),
    (
        "expert_down",
        include_str!("../../../shaders/expert_down.wgsl"),
    ),
    (
        "attn_flash",
        include_str!("../../../shaders/attn_flash.wgsl"),
    ),
    (
        "attn_combine",
        include_str!("../../../shaders/attn_combine.wgsl"),
    ),
    ("gemm", include_str!("../../../shaders/gemm.wgsl")),
    (
        "expert_gemm",
        include_str!("../../../shaders/expert_gemm.wgsl"),
    ),
];

fn piece(name: &str) -> &'static str {
    PIECES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .unwrap_or_default()
}

fn body(family: &str) -> &'static str {
    BODIES
        .iter()
        .find(|(n, _)| *n == family)
        .map(|(_, s)| *s)
        .unwrap_or_default()
}

/// The pieces a kernel is assembled from, in order (before its body); `probe`: the probe
/// build of a kernel that calls the memory-access probe.
pub fn pieces_for(k: Kernel, probe: bool) -> Vec<&'static str> {
    let mut v = vec!["step.wgsl", "flags.wgsl"];
    if k.probed() {
        v.push("probe_sites.wgsl");
        v.push(if probe {
            "probe_on.wgsl"
        } else {
            "probe_off.wgsl"
        });
    }
    match k {
        Kernel::Matmul => v.extend([
            "f16_halves.wgsl",
            "act8.wgsl",
            "tokens_storage.wgsl",
            "store_rows.wgsl",
        ]),
        Kernel::MatmulQ8 => v.extend([
            "dense_params.wgsl",
            "tokens_storage.wgsl",
            "store_rows.wgsl",
            "act_x4.wgsl",
            "act_cols.wgsl",
            "q8_unpack.wgsl",
            "q8_row.wgsl",
        ]),
        Kernel::MatmulQ8Uniform => v.extend([
            "dense_params.wgsl",
            "uniform_window.wgsl",
            "q8_unpack.wgsl",
            "q8_row.wgsl",
        ]),
        Kernel::MatmulQ8Window => v.extend([
            "tokens_window.wgsl",
            "store_rows.wgsl",
            "uniform_window.wgsl",
            "q8_unpack.wgsl",
            "q8_row.wgsl",
        ]),
        Kernel::FfnGateUp | Kernel::FfnDown => {
            v.extend(["f16_halves.wgsl", "act8.wgsl", "ffn_slot.wgsl"])
        }
        Kernel::MatmulUniform => v.extend(["f16_halves.wgsl", "uniform_window.wgsl"]),
        Kernel::MatmulWindow => v.extend([
            "tokens_window.wgsl",
            "store_rows.wgsl",
            "uniform_window.wgsl",
        ]),
        Kernel::Attention(kv) => {
            v.extend(["wg_tree.wgsl", "attn_scratch.wgsl"]);
            v.extend(kv_read(kv));
        }
        Kernel::RouterTopk => v.push("wg_tree.wgsl"),
        Kernel::AttentionWindow(kv) => {
            v.push("attn_scratch.wgsl");
            match kv {
                KvFormat::F32 => v.push("kv4_f32.wgsl"),
                KvFormat::F16 => v.push("kv4_f16.wgsl"),
                // Keys one at a time through the q8_0 reader.
                KvFormat::Q8 => v.extend(["kv_q8_read.wgsl", "kv4_q8.wgsl"]),
            }
        }
        Kernel::AttnFlash(kv) => v.extend(kv_read(kv)),
        Kernel::RopeKv(kv) => v.extend(match kv {
            KvFormat::F32 => ["kv_store_f32.wgsl", "kv_store_pairs.wgsl"].as_slice(),
            KvFormat::F16 => &["kv_store_f16.wgsl", "kv_store_pairs.wgsl"],
            KvFormat::Q8 => &["kv_store_q8.wgsl"],
        }),
        Kernel::Q4GateUpSorted | Kernel::Q4DownSorted => {
            v.extend(["q4_unpack.wgsl", "q4_pairs8.wgsl"])
        }
        Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => {
            v.push("q4_unpack.wgsl");
            v.push(match q.arith {
                Arith::F32 => "q4_dot_f32.wgsl",
                Arith::F16 => "q4_dot_f16.wgsl",
            });
            v.push("q4_act32.wgsl");
            match q.act {
                Activations::Storage => v.push("q4_act_storage.wgsl"),
                Activations::Uniform => v.extend(["uniform_window.wgsl", "q4_act_uniform.wgsl"]),
            }
            v.push(match q.lanes {
                Lanes::One => "lanes_1.wgsl",
                Lanes::Eight => "lanes_8.wgsl",
            });
            if !matches!(k, Kernel::Q4GateUp(_)) {
                v.push("q4_down_row.wgsl");
            }
        }
        Kernel::Matvec(r)
        | Kernel::MatvecNorm(r)
        | Kernel::ExpertGateUp(r)
        | Kernel::ExpertDown(r) => {
            if matches!(k, Kernel::Matvec(_) | Kernel::MatvecNorm(_)) {
                v.push("dense_params.wgsl");
            }
            v.push("act_x4.wgsl");
            v.push(if matches!(k, Kernel::MatvecNorm(_)) {
                "act_cols_norm.wgsl"
            } else {
                "act_cols.wgsl"
            });
            match r.format {
                WeightFormat::F16 => v.extend(["f16_halves.wgsl", "fmt_f16.wgsl"]),
                WeightFormat::Q4 => {
                    v.extend(["q4_dot_f32.wgsl", "scales_staged.wgsl", "fmt_q4.wgsl"])
                }
                WeightFormat::Q4A => {
                    v.extend(["q4_dot_f32.wgsl", "scales_staged.wgsl", "fmt_q4a.wgsl"])
                }
                WeightFormat::Q8 => {
                    v.extend(["scales_staged.wgsl", "q8_unpack.wgsl", "fmt_q8.wgsl"])
                }
                kq => v.extend(kq_pieces(kq)),
            }
            v.push("onehot.wgsl");
            v.push(match r.reduce {
                Reduce::Subgroup => "reduce_sg.wgsl",
                Reduce::Workgroup => "reduce_wg.wgsl",
            });
            if matches!(k, Kernel::ExpertGateUp(_)) {
                v.push("route_topk.wgsl");
            }
        }
        Kernel::Gemm(f) | Kernel::ExpertGemm(f) => {
            if matches!(k, Kernel::Gemm(_)) {
                v.push("dense_params.wgsl");
            }
            v.extend(["act_x4.wgsl", "act_cols.wgsl"]);
            match f {
                WeightFormat::F16 => v.extend(["f16_halves.wgsl", "fmt_f16.wgsl", "tile_f16.wgsl"]),
                WeightFormat::Q4 => v.extend([
                    "q4_dot_f32.wgsl",
                    "scales_staged.wgsl",
                    "fmt_q4.wgsl",
                    "tile_q4.wgsl",
                ]),
                WeightFormat::Q4A => v.extend([
                    "q4_dot_f32.wgsl",
                    "scales_staged.wgsl",
                    "fmt_q4a.wgsl",
                    "tile_q4a.wgsl",
                ]),
                WeightFormat::Q8 => v.extend([
                    "scales_staged.wgsl",
                    "q8_unpack.wgsl",
                    "fmt_q8.wgsl",
                    "tile_q8.wgsl",
                ]),
                kq => {
                    v.extend(kq_pieces(kq));
                    v.push("tile_kq.wgsl");
                }
            }
        }
        _ => {}
    }
    v
}

/// The pieces of a K-plane weight format (`blocks/kquant.rs`): the shared word reader and
/// the format's record reader.
fn kq_pieces(f: WeightFormat) -> Vec<&'static str> {
    let mut v = vec!["scales_staged.wgsl", "kq_common.wgsl"];
    match f {
        WeightFormat::Q4K => v.extend(["kq_k4.wgsl", "fmt_q4k.wgsl"]),
        WeightFormat::Q5K => v.extend(["kq_k4.wgsl", "fmt_q5k.wgsl"]),
        WeightFormat::Q6K => v.push("fmt_q6k.wgsl"),
        _ => v.push("fmt_q5a.wgsl"),
    }
    v
}

/// The pieces through which the attention kernels read a KV cache of format `kv`.
fn kv_read(kv: KvFormat) -> &'static [&'static str] {
    match kv {
        KvFormat::F32 => &["kv_f32.wgsl"],
        KvFormat::F16 => &["kv_f16.wgsl"],
        KvFormat::Q8 => &["kv_q8_read.wgsl", "kv_q8.wgsl"],
    }
}

/// The pieces of a kernel's normal (not probe) build.
pub fn pieces(k: Kernel) -> Vec<&'static str> {
    pieces_for(k, false)
}

/// The complete WGSL module of a kernel variant (`probe`: its probe build).
pub fn source_for(k: Kernel, probe: bool) -> String {
    let mut s = String::new();
    if k.needs_f16() {
        // An enable directive must precede every declaration.
        s.push_str("enable f16;\n\n");
    }
    for p in pieces_for(k, probe) {
        s.push_str(piece(p));
        s.push('\n');
    }
    s.push_str(body(k.family()));
    s
}

/// `src` with the kernel's parameters (binding 0) and the step (binding 1) read from
/// storage instead of uniform buffers: the form built for llvmpipe. Mesa's lavapipe (22.3
/// measured) inlines uniform values that decide a branch or a loop bound into the shader
/// and, for some pipelines, compiles a new variant at every dispatch without freeing the
/// old ones (about 280 KB per decode step on the storage kernels' moe_combine; a 40-line
/// wgpu program shows it, and a storage binding of the same values does not): the memory
/// of a long run grows without bound. The activation windows stay uniform.
pub fn params_in_storage(src: &str) -> String {
    src.replace(
        "@group(0) @binding(0) var<uniform> p:",
        "@group(0) @binding(0) var<storage, read> p:",
    )
    .replace(
        "@group(0) @binding(1) var<uniform> step:",
        "@group(0) @binding(1) var<storage, read> step:",
    )
}

/// Whether an adapter's driver is lavapipe (llvmpipe), whose uniform inlining leaks.
pub fn inlines_uniforms(info: &crate::backend::DeviceInfo) -> bool {
    info.name.contains("llvmpipe") || info.driver.contains("llvmpipe")
}

/// The complete WGSL module of a kernel variant.
pub fn source(k: Kernel) -> String {
    source_for(k, false)
}
