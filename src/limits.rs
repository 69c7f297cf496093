//! Bounds on the sizes a config.json can claim.
//!
//! Two lines of defence, both before anything proportional to a count is allocated or
//! iterated:
//! - `config.rs` refuses dimensions beyond the `MAX_*` bounds below (generous: every
//!   published model is far inside them), so parsing a config never allocates more than a
//!   few kilobytes whatever it says;
//! - `manifest::check_checkpoint` compares the counts with the checkpoint's real tensors
//!   (layers from the `model.layers.N.` prefixes, experts per layer from the expert
//!   tensors, vocab and hidden size from the embedding's shape), reading only the
//!   safetensors headers. After it and `manifest::check_tensors` pass, every weight size is
//!   bounded by the file sizes; what remains (KV cache and workspace, proportional to the
//!   context) is bounded by `model::workspace::check_context` and computed with checked
//!   arithmetic.

pub const MAX_LAYERS: usize = 1 << 14;
pub const MAX_EXPERTS: usize = 1 << 16;
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_HIDDEN: usize = 1 << 18;
pub const MAX_HEADS: usize = 1 << 14;
pub const MAX_HEAD_DIM: usize = 1 << 14;
pub const MAX_INTERMEDIATE: usize = 1 << 22;

/// The bound `config.rs` applies to a dimension field, if any.
pub fn max_of(field: &str) -> Option<usize> {
    Some(match field {
        "num_hidden_layers" => MAX_LAYERS,
        "num_experts" | "num_local_experts" | "num_experts_per_tok" => MAX_EXPERTS,
        "vocab_size" => MAX_VOCAB,
        "hidden_size" => MAX_HIDDEN,
        "num_attention_heads" | "num_key_value_heads" => MAX_HEADS,
        "head_dim" => MAX_HEAD_DIM,
        "intermediate_size" | "moe_intermediate_size" | "shared_expert_intermediate_size" => {
            MAX_INTERMEDIATE
        }
        _ => return None,
    })
}
