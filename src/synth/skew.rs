//! `wgmoe synth --router-skew S`: routers that prefer some experts, as trained ones do.
//!
//! Random router rows give every expert the same chance: the worst case for an expert
//! cache, and no test of what prefetch and caching do with real routing. With a skew S > 0
//! each MoE layer ranks its experts (a seeded permutation, different in every layer) and
//! scales the router row of the expert of rank r by (1 + r)^-S. A token's logits are then
//! Gaussian with a spread that falls with the rank, and top-k picks the wide ones far more
//! often: a Zipf-like popularity (with 64 experts and top-8, S = 0.5 gives the top tenth of
//! the experts about a quarter of the picks, S = 1 about a third, against a tenth
//! uniformly). Consecutive tokens share experts through that popularity alone: a random
//! model's hidden states carry no topic from token to token.
//!
//! Only the routers change, in every format (`converted`, `hf`, `gguf`); S = 0 writes the
//! bytes it always did.

#[cfg(test)]
use super::random::RowScales;
use super::random::{splitmix, stream_seed};

/// The MoE layer a router tensor belongs to, under any of the names synth writes
/// (`model.layers.L.mlp.gate.weight`, Mixtral's `...block_sparse_moe.gate.weight`,
/// GGUF's `blk.L.ffn_gate_inp.weight`). Qwen1.5's shared-expert gate is not a router.
pub(super) fn router_layer(name: &str) -> Option<usize> {
    let hf = name.strip_prefix("model.layers.").and_then(|rest| {
        let (l, tail) = rest.split_once('.')?;
        matches!(tail, "mlp.gate.weight" | "block_sparse_moe.gate.weight").then_some(l)
    });
    let gguf = || {
        name.strip_prefix("blk.")
            .and_then(|rest| rest.strip_suffix(".ffn_gate_inp.weight"))
    };
    hf.or_else(gguf)?.parse().ok()
}

/// The rank of each expert of `layer` (0: the most popular), a permutation drawn from the
/// seed.
pub fn expert_ranks(seed: u64, layer: usize, experts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..experts).collect();
    let mut st = stream_seed(seed, "router-skew", layer as u64);
    for i in (1..experts).rev() {
        let j = (splitmix(&mut st) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    // order[rank] = expert; invert it.
    let mut rank = vec![0; experts];
    for (r, &e) in order.iter().enumerate() {
        rank[e] = r;
    }
    rank
}

/// Per-row scales of tensor `name` (`rows` rows) under skew `skew`: None when the tensor is
/// not a router or the skew is 0 (its values are written unscaled).
pub(super) fn row_scales(seed: u64, name: &str, rows: usize, skew: f64) -> Option<Vec<f32>> {
    if skew == 0.0 {
        return None;
    }
    let layer = router_layer(name)?;
    Some(
        expert_ranks(seed, layer, rows)
            .into_iter()
            .map(|r| (1.0 + r as f64).powf(-skew) as f32)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routers_are_found_under_every_name() {
        assert_eq!(router_layer("model.layers.3.mlp.gate.weight"), Some(3));
        assert_eq!(
            router_layer("model.layers.12.block_sparse_moe.gate.weight"),
            Some(12)
        );
        assert_eq!(router_layer("blk.7.ffn_gate_inp.weight"), Some(7));
        assert_eq!(
            router_layer("model.layers.3.mlp.shared_expert_gate.weight"),
            None
        );
        assert_eq!(router_layer("blk.7.ffn_gate_inp_shexp.weight"), None);
        assert_eq!(router_layer("model.layers.3.mlp.gate_proj.weight"), None);
        assert_eq!(router_layer("model.embed_tokens.weight"), None);
    }

    #[test]
    fn ranks_are_a_permutation_that_differs_by_layer() {
        let a = expert_ranks(5, 0, 60);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..60).collect::<Vec<_>>());
        assert_ne!(a, expert_ranks(5, 1, 60));
        assert_eq!(a, expert_ranks(5, 0, 60), "deterministic in the seed");
    }

    #[test]
    fn scales_fall_with_the_rank_and_vanish_at_zero_skew() {
        assert!(row_scales(1, "model.layers.0.mlp.gate.weight", 8, 0.0).is_none());
        assert!(row_scales(1, "model.layers.0.mlp.up_proj.weight", 8, 1.0).is_none());
        let s = row_scales(1, "model.layers.0.mlp.gate.weight", 8, 1.0).unwrap();
        let r = expert_ranks(1, 0, 8);
        for e in 0..8 {
            assert!((s[e] - 1.0 / (1.0 + r[e] as f32)).abs() < 1e-6);
        }
        let rs = RowScales {
            scales: &s,
            row_len: 4,
        };
        assert_eq!(rs.at(5), s[1]);
    }
}
