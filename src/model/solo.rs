//! The MLP block of a sparse batched step, one token at a time (the density gate of
//! `serve --parallel`). A batched decode step holds one token of each of B sequences;
//! their routed experts are mostly different, so the multi-token expert kernels (the
//! expert GEMMs on GPUs, the 8-pair windows on CPU adapters) would compute mostly empty
//! tiles. While the step's (token, expert) pairs are at most `SOLO_PAIRS_PER_EXPERT` per
//! expert, each token's MLP block runs as a one-token step instead: its rows of the MLP
//! inputs are copied to row 0, the layer's one-token program runs (`post_decode`: the
//! decode kernels, each expert's rows read for that token), and row 0 of the hidden state
//! is copied back to the token's row. Attention, the router and the head still run once
//! for all B tokens.
//!
//! Token 0 runs first, in place, and its result is set aside (`x0`) while the others use
//! row 0; wgpu copies between two regions of one buffer only through another buffer
//! (`row`).

use crate::backend::{Buffer, Work};
use crate::error::Result;
use crate::model::forward::{Forward, SoloBuffers};
use crate::model::layers::LayerPrograms;

/// The rows a one-token MLP block reads besides the hidden state: (buffer, bytes per row).
fn rows<'a>(f: &'a Forward, s: &'a SoloBuffers) -> [(&'a Buffer, u64); 4] {
    let (h, k) = (f.cfg.hidden_size as u64, f.cfg.top_k as u64);
    let stride = crate::model::workspace::router_stride(&f.cfg) as u64;
    [
        (&f.xn, h * 4),
        (&f.topk_ids, k * 4),
        (&f.topk_weights, k * 4),
        (&s.router_logits, stride * 4),
    ]
}

/// Copy row `from` of `b` to row `to` of it (through `via`).
fn move_row<'a>(
    work: &mut Vec<Work<'a>>,
    b: &'a Buffer,
    bytes: u64,
    from: u64,
    to: u64,
    via: &'a Buffer,
) {
    work.push(Work::Copy {
        src: b,
        src_offset: from * bytes,
        dst: via,
        dst_offset: 0,
        bytes,
    });
    work.push(Work::Copy {
        src: via,
        src_offset: 0,
        dst: b,
        dst_offset: to * bytes,
        bytes,
    });
}

impl Forward {
    /// Whether a batched step of `n` tokens runs its MLP blocks one token at a time.
    pub fn solo_mlp(&self, n: usize) -> bool {
        self.batched
            && self.solo.is_some()
            && n * self.cfg.top_k <= self.solo_pairs_per_expert * self.cfg.num_experts.max(1)
    }

    /// Layer `l`'s MLP block for the `n` tokens of a batched step, one token at a time
    /// (layers without a one-token program run theirs for all tokens at once).
    pub(crate) fn push_solo_mlp<'a>(
        &'a self,
        l: &'a LayerPrograms,
        n: usize,
        work: &mut Vec<Work<'a>>,
    ) -> Result<()> {
        let (Some(one), Some(s)) = (l.post_decode.as_ref(), self.solo.as_ref()) else {
            work.push(Work::Run {
                program: l.post_for(n),
                tokens: n as u32,
                pos0: crate::backend::LONGEST,
            });
            return Ok(());
        };
        let hb = self.cfg.hidden_size as u64 * 4;
        work.push(Work::Run {
            program: one,
            tokens: 1,
            pos0: crate::backend::LONGEST,
        });
        work.push(Work::Copy {
            src: &s.x,
            src_offset: 0,
            dst: &s.x0,
            dst_offset: 0,
            bytes: hb,
        });
        for t in 1..n as u64 {
            for (b, bytes) in rows(self, s) {
                move_row(work, b, bytes, t, 0, &s.row);
            }
            move_row(work, &s.x, hb, t, 0, &s.row);
            work.push(Work::Run {
                program: one,
                tokens: 1,
                pos0: crate::backend::LONGEST,
            });
            move_row(work, &s.x, hb, 0, t, &s.row);
        }
        work.push(Work::Copy {
            src: &s.x0,
            src_offset: 0,
            dst: &s.x,
            dst_offset: 0,
            bytes: hb,
        });
        Ok(())
    }
}
