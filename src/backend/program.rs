//! Programs: backend-neutral descriptions of a sequence of kernel dispatches (kernel key,
//! parameter bytes, buffer bindings, grid). The model's op builders record them once at
//! load time; a backend turns each into its own objects once (`Device::prepare`), and a
//! step only re-issues them with the step's token count, which the grids follow.

use bytemuck::Pod;

use super::kernel::Kernel;
use super::Buffer;

/// One grid dimension, known at build time or derived from the step's token count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Const(u32),
    Tokens,
    /// ceil(tokens / n)
    TokensDiv(u32),
    /// 1 while the step has more than `first` items at `per_token` items per token (a
    /// window starting at item `first` has work), else 0 (the dispatch is skipped).
    Window {
        first: u32,
        per_token: u32,
    },
    /// 1 when the step's last token lies in [first, first + len), else 0.
    LastIn {
        first: u32,
        len: u32,
    },
    /// 1 for one-token steps, else 0 (a dispatch only decode steps make).
    OneToken,
    /// Key splits sized by the position: ceil((pos0 + tokens) / min_chunk) splits of at
    /// least `min_chunk` keys, at most `max` (attention decode: no split without keys).
    KeySplits {
        max: u32,
        min_chunk: u32,
    },
    /// 1 for a one-token step whose `KeySplits` are more than one (their combine), else 0.
    SplitCombine {
        max: u32,
        min_chunk: u32,
    },
}

/// The position static analyses evaluate grids at: past any context, so position-sized
/// grids are at their largest (an upper bound of what a step dispatches).
pub const LONGEST: u32 = u32::MAX;

impl Dim {
    /// The dimension for a step of `tokens` tokens starting at position `pos0`.
    pub fn eval(self, tokens: u32, pos0: u32) -> u32 {
        match self {
            Dim::Const(n) => n,
            Dim::Tokens => tokens,
            Dim::TokensDiv(n) => tokens.div_ceil(n),
            Dim::Window { first, per_token } => u32::from(tokens * per_token > first),
            Dim::LastIn { first, len } => {
                u32::from(tokens > first && tokens - 1 < first.saturating_add(len))
            }
            Dim::OneToken => u32::from(tokens == 1),
            Dim::KeySplits { max, min_chunk } => pos0
                .saturating_add(tokens)
                .div_ceil(min_chunk.max(1))
                .clamp(1, max.max(1)),
            Dim::SplitCombine { max, min_chunk } => {
                u32::from(tokens == 1 && Dim::KeySplits { max, min_chunk }.eval(tokens, pos0) > 1)
            }
        }
    }
}

/// Workgroups needed to cover `n` items with 64-wide workgroups.
pub fn groups64(n: usize) -> u32 {
    n.div_ceil(64) as u32
}

/// What one binding of an op refers to.
#[derive(Clone, Debug)]
pub enum Resource {
    Buffer(Buffer),
    /// At binding 2 of a kernel that reads its activations from a uniform window: the
    /// 64 KiB window of the buffer starting at byte `offset` (a multiple of the device's
    /// uniform offset alignment; the one-token alternative of an op binds offset 0). Any
    /// other kernel binds the whole buffer.
    Window {
        buffer: Buffer,
        offset: u64,
    },
}

/// A binding number (binding 0 is the op's params, 1 the step) and what it refers to.
#[derive(Clone, Debug)]
pub struct Bind {
    pub binding: u32,
    pub resource: Resource,
}

/// Buffers bound in order from binding 2, the kernels' common convention.
pub fn binds(buffers: &[&Buffer]) -> Vec<Bind> {
    buffers
        .iter()
        .enumerate()
        .map(|(i, b)| Bind {
            binding: 2 + i as u32,
            resource: Resource::Buffer((*b).clone()),
        })
        .collect()
}

/// One dispatch.
#[derive(Clone, Debug)]
pub struct Op {
    pub kernel: Kernel,
    pub params: Vec<u8>,
    pub binds: Vec<Bind>,
    pub grid: [Dim; 3],
    /// The dispatch one-token steps make instead (its uniform windows bound at offset 0):
    /// another kernel, its own parameters, bindings and grid.
    pub decode: Option<Box<Op>>,
    /// The stage of the model the op belongs to (`qkv_proj`, `attention`, ...: reports
    /// such as `wgmoe kernels` group dispatches by it); empty until a program labels it.
    pub stage: &'static str,
}

impl Op {
    pub fn new<P: Pod>(kernel: Kernel, params: &P, binds: Vec<Bind>, grid: [Dim; 3]) -> Self {
        Op {
            kernel,
            params: bytemuck::bytes_of(params).to_vec(),
            binds,
            grid,
            decode: None,
            stage: "",
        }
    }

    /// The op labelled with its stage (kept when a program labels what it pushes).
    pub fn in_stage(mut self, stage: &'static str) -> Self {
        self.stage = stage;
        self
    }

    /// One-token steps dispatch `kernel` with the same parameters and bindings instead.
    pub fn with_decode(mut self, decode: Option<(Kernel, [Dim; 3])>) -> Self {
        self.decode = decode.map(|(kernel, grid)| {
            Box::new(Op {
                kernel,
                grid,
                decode: None,
                ..self.clone()
            })
        });
        self
    }

    /// One-token steps dispatch `op` instead (its own parameters and bindings).
    pub fn with_decode_op(mut self, op: Option<Op>) -> Self {
        self.decode = op.map(Box::new);
        self
    }

    /// The op a step of `tokens` tokens runs (the decode alternative for one token).
    pub fn for_tokens(&self, tokens: u32) -> (&Op, bool) {
        match &self.decode {
            Some(d) if tokens == 1 => (d, true),
            _ => (self, false),
        }
    }

    /// The kernel and grid a step of `tokens` tokens at position `pos0` dispatches (None:
    /// skipped), and whether it is the decode alternative.
    pub fn dispatch(&self, tokens: u32, pos0: u32) -> Option<(Kernel, [u32; 3], bool)> {
        let (op, decode) = self.for_tokens(tokens);
        let g = op.grid.map(|d| d.eval(tokens, pos0));
        (!g.contains(&0)).then_some((op.kernel, g, decode))
    }
}

/// A recorded sequence of dispatches sharing one step uniform.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub ops: Vec<Op>,
    /// The stage the ops pushed next belong to (unless they name their own).
    stage: &'static str,
}

impl Program {
    pub fn push(&mut self, mut op: Op) {
        if op.stage.is_empty() {
            op.stage = self.stage;
        }
        if let Some(d) = op.decode.as_mut() {
            if d.stage.is_empty() {
                d.stage = op.stage;
            }
        }
        self.ops.push(op);
    }

    /// A copy with the ops of the stages in `stages` replaced by `ops` (labelled with the
    /// first of them), where the first of them stood.
    pub fn with_stages_replaced(&self, stages: &[&'static str], ops: Vec<Op>) -> Program {
        let at = self
            .ops
            .iter()
            .position(|o| stages.contains(&o.stage))
            .unwrap_or(self.ops.len());
        let mut out = Program {
            ops: Vec::with_capacity(self.ops.len() + ops.len()),
            stage: self.stage,
        };
        for (i, op) in self.ops.iter().enumerate() {
            if i == at {
                for o in &ops {
                    let mut o = o.clone();
                    if o.stage.is_empty() {
                        o.stage = stages.first().copied().unwrap_or("");
                    }
                    out.ops.push(o);
                }
            }
            if !stages.contains(&op.stage) {
                out.ops.push(op.clone());
            }
        }
        if at == self.ops.len() {
            out.ops.extend(ops);
        }
        out
    }

    /// Label the ops pushed from now on with `stage`.
    pub fn stage(&mut self, stage: &'static str) {
        self.stage = stage;
    }

    /// Dispatches a step of `tokens` tokens at position `pos0` makes.
    pub fn dispatches(&self, tokens: u32, pos0: u32) -> usize {
        self.ops
            .iter()
            .filter(|o| o.dispatch(tokens, pos0).is_some())
            .count()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Every kernel the program may dispatch (for pipelines built ahead of the first step).
    pub fn kernels(&self) -> Vec<Kernel> {
        let mut v: Vec<Kernel> = self
            .ops
            .iter()
            .flat_map(|o| std::iter::once(o.kernel).chain(o.decode.as_ref().map(|d| d.kernel)))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_follow_the_token_count() {
        let e = |d: Dim, t: u32| d.eval(t, 0);
        assert_eq!(e(Dim::TokensDiv(4), 9), 3);
        let w = Dim::Window {
            first: 16,
            per_token: 1,
        };
        assert_eq!((e(w, 16), e(w, 17)), (0, 1));
        let l = Dim::LastIn { first: 8, len: 8 };
        assert_eq!((e(l, 8), e(l, 9), e(l, 16), e(l, 17)), (0, 1, 1, 0));
    }

    #[test]
    fn key_splits_follow_the_position() {
        let (max, min_chunk) = (8, 32);
        let k = Dim::KeySplits { max, min_chunk };
        let c = Dim::SplitCombine { max, min_chunk };
        // (position, splits, combine) of one-token steps: position 31 is the 32nd key.
        for (pos, splits, combine) in [
            (0, 1, 0),
            (31, 1, 0),
            (32, 2, 1),
            (100, 4, 1),
            (255, 8, 1),
            (4000, 8, 1),
        ] {
            assert_eq!(
                (k.eval(1, pos), c.eval(1, pos)),
                (splits, combine),
                "position {pos}"
            );
        }
        assert_eq!((k.eval(1, LONGEST), c.eval(1, LONGEST)), (8, 1));
        // The combine is a one-token step's only.
        assert_eq!(c.eval(2, 100), 0);
    }
}
