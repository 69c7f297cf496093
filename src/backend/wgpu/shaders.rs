//! WGSL sources: one body per kernel family under `shaders/`, joined with the shared pieces
//! of `shaders/common/` its variant needs (the step uniform and flags always; INT4
//! unpacking, the dot product's arithmetic, where activations come from and how many lanes
//! compute a row for the W4A16 kernels). No text is generated: every piece is plain WGSL,
//! and every assembled variant is validated by naga in the tests.

use crate::backend::kernel::{Activations, Arith, Kernel, Lanes};

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
];

/// The kernel bodies, by family (file name under `shaders/` without `.wgsl`).
pub const BODIES: &[(&str, &str)] = &[
    ("embed", include_str!("../../../shaders/embed.wgsl")),
    ("rmsnorm", include_str!("../../../shaders/rmsnorm.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
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

/// The pieces a kernel is assembled from, in order (before its body).
pub fn pieces(k: Kernel) -> Vec<&'static str> {
    let mut v = vec!["step.wgsl", "flags.wgsl"];
    match k {
        Kernel::Matmul | Kernel::FfnGateUp | Kernel::FfnDown => {
            v.extend(["f16_halves.wgsl", "act8.wgsl"]);
        }
        Kernel::MatmulUniform | Kernel::MatmulWindow => v.push("uniform_window.wgsl"),
        Kernel::Q4GateUpSorted | Kernel::Q4DownSorted => v.push("q4_unpack.wgsl"),
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
        _ => {}
    }
    v
}

/// The complete WGSL module of a kernel variant.
pub fn source(k: Kernel) -> String {
    let mut s = String::new();
    if k.needs_f16() {
        // An enable directive must precede every declaration.
        s.push_str("enable f16;\n\n");
    }
    for p in pieces(k) {
        s.push_str(piece(p));
        s.push('\n');
    }
    s.push_str(body(k.family()));
    s
}
