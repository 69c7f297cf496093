// Flag bits of the kernels' `flags` parameters, defined once for every kernel (the Rust
// twins are in `backend::params::flags`; a test checks that both lists agree).
const LAST_TOKEN_ONLY: u32 = 4u;      // rmsnorm, matmul: only the step's last token
const MATMUL_BIAS: u32 = 1u;          // add bias[row]
const MATMUL_ACCUMULATE: u32 = 2u;    // out += (residual add)
const FFN_FIXED_SLOT: u32 = 1u;       // ffn_gate_up / ffn_down: slot 0, not routed
const COMBINE_ROUTED: u32 = 1u;       // moe_combine: the routed experts' weighted sum
const COMBINE_SHARED: u32 = 2u;       // moe_combine: the shared expert / dense MLP term
const COMBINE_SHARED_GATED: u32 = 4u; // moe_combine: that term times sigmoid(gate logit)
const COMBINE_RESIDENT: u32 = 8u;     // moe_combine: only pairs whose expert has a slot
const COMBINE_HOST: u32 = 16u;        // moe_combine: plus the CPU experts' sum host_y[t]
const EXPERT_COMBINE: u32 = 2u;       // expert_down: weighted sum of the top-k into x
const FFN_ROUTE: u32 = 4u;            // expert_gate_up: the top-k from the router logits
const FFN_ROUTE_WRITE: u32 = 8u;      // expert_gate_up: workgroup (0, 0) writes ids, weights
const EXPERT_GEMM_DOWN: u32 = 4u;     // expert_gemm: the down projection (else gate/up)
const ROPE_QK_NORM: u32 = 1u;         // rope_kv: RMSNorm of q and k first
const ROPE_CLIP: u32 = 2u;            // rope_kv: clamp q, k, v to [-clip, clip]
const ROPE_QK_NORM_PER_HEAD: u32 = 4u; // rope_kv: RMSNorm of each q / k head over head_dim
const MATVEC_NORM_WRITE: u32 = 8u;   // matvec_norm: one workgroup writes the normalised row
const ATTN_LIVE_SPLITS: u32 = 1u;     // attn_flash/combine: decode splits follow the position
const ARGMAX_LAST_ROW: u32 = 1u;      // argmax: the step's last row of [T, n] logits
const ARGMAX_PARTS: u32 = 2u;         // argmax: each workgroup's best of its share to part[]
const ARGMAX_FROM_PARTS: u32 = 4u;    // argmax: the id from the n parts
