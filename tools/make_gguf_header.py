#!/usr/bin/env python3
"""Writes the header of a real checkpoint's GGUF file, without its tensor data, for `wgmoe plan`
and `wgmoe inspect` (which read only headers).

    python3 tools/make_gguf_header.py            # writes models/gguf/headers/*.gguf

Needs PyPI's `gguf` (0.19.0, in tools/requirements.txt); no weights, no network.

Qwen3-30B-A3B-Q4_K_M.gguf: the metadata llama.cpp's convert_hf_to_gguf.py writes for
Qwen/Qwen3-30B-A3B (models/configs/qwen3-30b-a3b.json; the tokenizer's arrays are left out:
`plan` needs no tokenizer) and the tensor infos with the block types `llama-quantize ... Q4_K_M`
gives them (src/llama-quant.cpp, llama_tensor_get_type):
  - Q4_K for every 2-D/3-D weight by default, token_embd included;
  - Q6_K for output.weight;
  - Q6_K for attn_v and ffn_down_exps on the layers `use_more_bits` picks: the first and last
    eighth of the layers and every third one between ((i - n/8) % 3 == 2); 128 experts, so
    not the 8-expert rule (Q8_0 attn_v);
  - F32 for norms and the router (ffn_gate_inp).
The data section is absent; the offsets are those of the full file, whose size is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "models" / "gguf" / "headers"


def nbytes(ty: T, ne: list[int]) -> int:
    block, size = GGML_QUANT_SIZES[ty]
    assert ne[0] % block == 0, (ty, ne)
    n = 1
    for d in ne:
        n *= d
    return n // block * size


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def qwen3moe_q4_k_m(cfg: dict, path: Path) -> int:
    n_layer = cfg["num_hidden_layers"]
    h = cfg["hidden_size"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    n_exp, ff = cfg["num_experts"], cfg["moe_intermediate_size"]
    vocab = cfg["vocab_size"]
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_name("Qwen3-30B-A3B")
    w.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_quantization_version(2)
    w.add_block_count(n_layer)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_count(n_exp)
    w.add_expert_feed_forward_length(ff)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def t(name: str, ne: list[int], ty: T) -> None:
        # GGUFWriter takes numpy's order (ne reversed) and the byte count.
        w.add_tensor_info(name, list(reversed(ne)), np.dtype(np.float32), nbytes(ty, ne), ty)

    t("token_embd.weight", [h, vocab], T.Q4_K)
    for i in range(n_layer):
        more = use_more_bits(i, n_layer)
        b = f"blk.{i}."
        t(b + "attn_norm.weight", [h], T.F32)
        t(b + "attn_q.weight", [h, heads * hd], T.Q4_K)
        t(b + "attn_k.weight", [h, kv * hd], T.Q4_K)
        t(b + "attn_v.weight", [h, kv * hd], T.Q6_K if more else T.Q4_K)
        t(b + "attn_output.weight", [heads * hd, h], T.Q4_K)
        t(b + "attn_q_norm.weight", [hd], T.F32)
        t(b + "attn_k_norm.weight", [hd], T.F32)
        t(b + "ffn_norm.weight", [h], T.F32)
        t(b + "ffn_gate_inp.weight", [h, n_exp], T.F32)
        t(b + "ffn_gate_exps.weight", [h, ff, n_exp], T.Q4_K)
        t(b + "ffn_up_exps.weight", [h, ff, n_exp], T.Q4_K)
        t(b + "ffn_down_exps.weight", [ff, h, n_exp], T.Q6_K if more else T.Q4_K)
    t("output_norm.weight", [h], T.F32)
    t("output.weight", [h, vocab], T.Q6_K)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    total = sum(ti.nbytes for ti in w.tensors[0].values())
    return total


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((REPO / "models" / "configs" / "qwen3-30b-a3b.json").read_text())
    path = OUT / "Qwen3-30B-A3B-Q4_K_M.gguf"
    data = qwen3moe_q4_k_m(cfg, path)
    print(f"{path}: {path.stat().st_size} bytes of header; the full file holds "
          f"{data / 1e9:.2f} GB of tensor data")


if __name__ == "__main__":
    main()
