//! The RMSNorm folded into its consumer: on the GPU plan a one-token step runs no norm
//! dispatch before a matrix product; its matvecs read the residual stream and normalise it
//! on load (`Kernel::MatvecNorm`, shaders/common/act_cols_norm.wgsl), each workgroup
//! recomputing the row's scale from the row it reads anyway. Multi-token steps (the tiled
//! GEMM reads many rows) keep the norm dispatch. Where a later op of the step reads the
//! normalised row too (the experts after the router), the product's first workgroup writes
//! it.

use crate::backend::params::{flags, DenseParams};
use crate::backend::{Buffer, Dim, Kernel, Op, Program};
use crate::model::op_env::numbered;
use crate::model::ops::{self, OpEnv};
use crate::model::tensors::F16Matrix;

/// A product's input as the residual stream `x` before its RMSNorm.
#[derive(Clone, Copy)]
pub struct NormInput<'a> {
    /// The norm's weight (f16 pairs).
    pub weight: &'a Buffer,
    pub x: &'a Buffer,
    /// Where the normalised rows go (the product's input on steps that keep the norm).
    pub xn: &'a Buffer,
    /// Hidden size (the norm's width).
    pub n: usize,
    pub eps: f32,
    /// One-token steps still write the normalised row to `xn` (later ops read it).
    pub write: bool,
    /// The norm dispatch's stage (`attn_norm`, ...; the product keeps the program's).
    pub stage: &'static str,
}

/// rmsnorm(x) into xn, then `dst (+)= m . xn` as `ops::matmul` builds it, with the norm
/// folded into the matvecs of one-token steps where the plan runs them.
#[allow(clippy::too_many_arguments)]
pub fn normed_matmul(
    prog: &mut Program,
    env: &OpEnv,
    norm: &NormInput,
    m: &F16Matrix,
    bias: Option<&Buffer>,
    dst: &Buffer,
    out_stride: usize,
    fl: u32,
) {
    let mut p = Program::default();
    ops::matmul(&mut p, env, m, norm.xn, bias, dst, out_stride, fl);
    push_folded(prog, env, norm, p);
}

/// `ops::router_matmul` of the normalised row, the norm folded likewise.
pub fn normed_router_matmul(
    prog: &mut Program,
    env: &OpEnv,
    norm: &NormInput,
    m: &F16Matrix,
    dst: &Buffer,
    out_stride: usize,
) {
    let mut p = Program::default();
    ops::router_matmul(&mut p, env, m, norm.xn, dst, out_stride);
    push_folded(prog, env, norm, p);
}

/// The norm dispatch (where some step still needs it) and the product's ops, their
/// matvecs folded.
fn push_folded(prog: &mut Program, env: &OpEnv, norm: &NormInput, mut p: Program) {
    if env.plan.coalesced_decode {
        let mut write = norm.write;
        for op in &mut p.ops {
            // The one-token alternative, or the op itself where a matvec serves every
            // step (the last token alone) or only one-token steps (a chunk's extras).
            match op.decode.as_deref_mut() {
                Some(d) => fold(d, norm, &mut write),
                None => fold(op, norm, &mut write),
            }
        }
    }
    // A step of `t` tokens needs the norm while one of its dispatches reads xn.
    let needs = |t: u32| {
        p.ops.iter().any(|o| {
            o.dispatch(t, crate::backend::LONGEST)
                .is_some_and(|(k, _, _)| !matches!(k, Kernel::MatvecNorm(_)))
        })
    };
    let (one, many) = (needs(1), needs(2));
    if one || many {
        let op =
            ops::rmsnorm_op(norm.weight, norm.x, norm.xn, norm.n, norm.eps).in_stage(norm.stage);
        // Skipped by one-token steps, whose matvecs normalise on load.
        let op = if one {
            op
        } else {
            op.with_decode(Some((Kernel::RmsNorm, [Dim::Const(0); 3])))
        };
        prog.push(op);
    }
    for op in p.ops {
        prog.push(op);
    }
}

/// A matvec made its normalising twin: x for xn, the norm's weight and output bound, the
/// first one told to write the normalised row when `write` is still set.
fn fold(op: &mut Op, n: &NormInput, write: &mut bool) {
    let Kernel::Matvec(r) = op.kernel else {
        return;
    };
    let mut p: DenseParams = bytemuck::pod_read_unaligned(&op.params);
    p.eps = n.eps;
    if *write {
        p.flags |= flags::MATVEC_NORM_WRITE;
        *write = false;
    }
    op.kernel = Kernel::MatvecNorm(r);
    op.params = bytemuck::bytes_of(&p).to_vec();
    op.binds.retain(|b| b.binding != 2 && b.binding != 3);
    op.binds
        .extend(numbered(&[(2, n.x), (3, n.x), (6, n.weight), (7, n.xn)]));
    op.binds.sort_by_key(|b| b.binding);
}
