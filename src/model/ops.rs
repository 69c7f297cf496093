//! Op builders: each appends the dispatches of one operation of the model to a program,
//! with the kernel the plan picks for the shapes. The forward pass, the kernel tests and
//! the benches all build their programs with these functions, so a test exercises exactly
//! what a model runs. (The routed experts' ops are in `model::moe`.)

use crate::backend::kernel::Kernel;
use crate::backend::params::*;
use crate::backend::{binds, groups64, Bind, Buffer, Dim, KernelPlan, Op, Program, Resource};
use crate::model::tensors::F16Matrix;

/// What every builder needs besides its operands.
#[derive(Clone, Copy)]
pub struct OpEnv<'a> {
    pub plan: &'a KernelPlan,
    /// Most tokens of a step (the prefill chunk).
    pub chunk: usize,
    /// A small buffer bound where a kernel's optional input is absent.
    pub dummy: &'a Buffer,
}

/// x[t, :] = embedding row ids[t], one dispatch per chunk of the table.
pub fn embed(prog: &mut Program, table: &F16Matrix, ids: &Buffer, x: &Buffer, hidden: usize) {
    for c in &table.chunks {
        prog.push(Op::new(
            Kernel::Embed,
            &EmbedParams {
                hidden: hidden as u32,
                row_start: c.row_start as u32,
                rows: c.rows as u32,
                words_per_row: table.vec4_per_row() * 4,
            },
            binds(&[ids, &c.buffer, x]),
            [Dim::Const(groups64(hidden)), Dim::Tokens, Dim::Const(1)],
        ));
    }
}

/// RMSNorm of each token row of `src` (n values) into `dst`.
pub fn rmsnorm(
    prog: &mut Program,
    weight: &Buffer,
    src: &Buffer,
    dst: &Buffer,
    n: usize,
    eps: f32,
) {
    prog.push(Op::new(
        Kernel::RmsNorm,
        &RmsNormParams {
            n: n as u32,
            x_stride: n as u32,
            out_stride: n as u32,
            eps,
            ..Default::default()
        },
        binds(&[src, weight, dst]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    ));
}

/// dst[t, row] (+)= m[row] . src[t] (+ bias[row]), for every chunk of `m`. `flags`:
/// MATMUL_ACCUMULATE and/or LAST_TOKEN_ONLY (the bias flag follows `bias`). A
/// window-capable `src` lets multi-token steps read it in uniform windows of token rows
/// and one-token steps read one uniform window, where the plan says so.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    src: &Buffer,
    bias: Option<&Buffer>,
    dst: &Buffer,
    out_stride: usize,
    flags: u32,
) {
    let t = env.chunk;
    let window_capable = src.window_capable();
    let last = flags & flags::LAST_TOKEN_ONLY != 0;
    let f = flags
        | if bias.is_some() {
            flags::MATMUL_BIAS
        } else {
            0
        };
    let bias = bias.unwrap_or(env.dummy);
    let tw = if window_capable {
        env.plan.matmul_window_tokens(m.cols, t)
    } else {
        0
    };
    let windows = if tw > 0 { t.div_ceil(tw) } else { 0 };
    // The last window must lie inside the buffer.
    let windows_fit = windows > 0
        && ((windows - 1) * tw * m.cols * 4 + UNIFORM_WINDOW_BYTES) as u64 <= src.size();
    for c in &m.chunks {
        let decode = (window_capable
            && src.size() >= UNIFORM_WINDOW_BYTES as u64
            && env.plan.matmul_decode_uniform(m.cols))
        .then_some((
            Kernel::MatmulUniform,
            [Dim::Const(groups64(c.rows)), Dim::Const(1), Dim::Const(1)],
        ));
        if windows_fit {
            for wi in 0..windows {
                let t0 = wi * tw;
                let gate = if last {
                    Dim::LastIn {
                        first: t0 as u32,
                        len: tw as u32,
                    }
                } else {
                    Dim::Window {
                        first: t0 as u32,
                        per_token: 1,
                    }
                };
                let ty = if last {
                    1
                } else {
                    (tw as u32).div_ceil(MATMUL_W_TOKENS_PER_THREAD)
                };
                let mut b = vec![Bind {
                    binding: 2,
                    resource: Resource::Window {
                        buffer: src.clone(),
                        offset: (t0 * m.cols * 4) as u64,
                    },
                }];
                b.extend(binds(&[&c.buffer, bias, dst]).into_iter().map(|mut x| {
                    x.binding += 1;
                    x
                }));
                prog.push(
                    Op::new(
                        Kernel::MatmulWindow,
                        &MatmulWindowParams {
                            k: m.cols as u32,
                            n_rows: c.rows as u32,
                            row_base: c.row_start as u32,
                            vec4_per_row: m.vec4_per_row(),
                            t0: t0 as u32,
                            out_stride: out_stride as u32,
                            flags: f,
                            tw: tw as u32,
                        },
                        b,
                        [Dim::Const(groups64(c.rows)), Dim::Const(ty), gate],
                    )
                    // Window 0 serves one-token steps (later windows are skipped).
                    .with_decode(if wi == 0 { decode } else { None }),
                );
            }
            continue;
        }
        let mut b = binds(&[src, &c.buffer, bias, dst]);
        if decode.is_some() {
            // The one-token kernel reads binding 2 as a uniform window at offset 0.
            b[0].resource = Resource::Window {
                buffer: src.clone(),
                offset: 0,
            };
        }
        prog.push(
            Op::new(
                Kernel::Matmul,
                &MatmulParams {
                    k: m.cols as u32,
                    n_rows: c.rows as u32,
                    row_base: c.row_start as u32,
                    vec4_per_row: m.vec4_per_row(),
                    x_stride: m.cols as u32,
                    out_stride: out_stride as u32,
                    flags: f,
                    _a: 0,
                },
                b,
                [
                    Dim::Const(groups64(c.rows)),
                    if last {
                        Dim::Const(1)
                    } else {
                        Dim::TokensDiv(MATMUL_TOKENS_PER_THREAD)
                    },
                    Dim::Const(1),
                ],
            )
            .with_decode(decode),
        );
    }
}

/// The buffers of one layer's attention.
pub struct AttentionBuffers<'a> {
    pub qkv: &'a Buffer,
    pub q_norm: Option<&'a Buffer>,
    pub k_norm: Option<&'a Buffer>,
    pub rope: &'a Buffer,
    pub q: &'a Buffer,
    pub cache_k: &'a Buffer,
    pub cache_v: &'a Buffer,
    pub scratch: &'a Buffer,
    pub out: &'a Buffer,
}

/// Optional q/k norm or clip, RoPE, and the step's k, v into the KV cache.
pub fn rope_kv(prog: &mut Program, env: &OpEnv, p: &RopeKvParams, b: &AttentionBuffers) {
    prog.push(Op::new(
        Kernel::RopeKv,
        p,
        binds(&[
            b.qkv,
            b.q_norm.unwrap_or(env.dummy),
            b.k_norm.unwrap_or(env.dummy),
            b.rope,
            b.q,
            b.cache_k,
            b.cache_v,
        ]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    ));
}

/// Causal attention of the step's queries over the KV cache.
pub fn attention(prog: &mut Program, env: &OpEnv, p: &AttentionParams, b: &AttentionBuffers) {
    let kernel = env.plan.attention(p.head_dim as usize, env.chunk);
    let grid = match kernel {
        Kernel::AttentionWindow => [
            Dim::Const(p.n_heads),
            Dim::TokensDiv(ATTENTION_W_TOKENS),
            Dim::Const(1),
        ],
        _ => [Dim::Const(p.n_heads), Dim::Tokens, Dim::Const(1)],
    };
    prog.push(Op::new(
        kernel,
        p,
        binds(&[b.q, b.cache_k, b.cache_v, b.scratch, b.out]),
        grid,
    ));
}

/// Softmax over the experts, top-k, optionally renormalised, per token.
pub fn router_topk(
    prog: &mut Program,
    p: &RouterTopkParams,
    logits: &Buffer,
    ids: &Buffer,
    weights: &Buffer,
) {
    prog.push(Op::new(
        Kernel::RouterTopk,
        p,
        binds(&[logits, ids, weights]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    ));
}

/// The buffers the MoE combine reads and writes.
pub struct CombineBuffers<'a> {
    pub y: &'a Buffer,
    pub weights: &'a Buffer,
    pub shared_y: &'a Buffer,
    pub router: &'a Buffer,
    pub x: &'a Buffer,
    /// COMBINE_RESIDENT: the router's expert ids and the layer's expert -> slot table.
    pub ids: &'a Buffer,
    pub slot_of: &'a Buffer,
    /// COMBINE_HOST: the CPU experts' weighted sum [T, H].
    pub host_y: &'a Buffer,
}

/// x[t] += sum_j w[t, j] y[t, j] (+ gated shared term, + the CPU experts' sum), as
/// `flags` say.
pub fn moe_combine(prog: &mut Program, p: &MoeCombineParams, b: &CombineBuffers) {
    prog.push(Op::new(
        Kernel::MoeCombine,
        p,
        binds(&[
            b.y, b.weights, b.shared_y, b.router, b.x, b.ids, b.slot_of, b.host_y,
        ]),
        [
            Dim::Const(groups64(p.hidden as usize)),
            Dim::Tokens,
            Dim::Const(1),
        ],
    ));
}

/// The argmax of a logits row into ids[0] (greedy decoding on the device).
pub fn argmax(prog: &mut Program, p: &ArgmaxParams, logits: &Buffer, ids: &Buffer) {
    prog.push(Op::new(
        Kernel::Argmax,
        p,
        binds(&[logits, ids]),
        [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
    ));
}

/// cos/sin of RoPE for positions [0, rows), as transformers computes them in f32:
/// inv_freq = 1 / theta^(2i/d); angle = pos * inv_freq; emb = cat(freqs, freqs).
pub fn rope_table(theta: f64, head_dim: usize, rows: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let mut t = Vec::with_capacity(rows * half * 2);
    for pos in 0..rows {
        for &f in &inv {
            let a = pos as f32 * f;
            t.push((a as f64).cos() as f32);
            t.push((a as f64).sin() as f32);
        }
    }
    t
}
