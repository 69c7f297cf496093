#!/usr/bin/env python3
"""Build the tiny random-weight MoE test fixtures of wgmoe and their golden outputs.

Run from the repository root, inside an environment made from tools/requirements.txt:

    python3 -m venv .venv && .venv/bin/pip install -r tools/requirements.txt
    .venv/bin/python tools/make_fixtures.py                                  # every fixture
    .venv/bin/python tools/make_fixtures.py --only qwen3moe-tiny,mixtral-tiny  # some of them
    .venv/bin/python tools/make_fixtures.py --q8-only      # only the Q8_0 goldens, from the models in place

Writes (replacing whatever was there for the fixtures it builds):
    models/olmoe-tiny/        OlmoeForCausalLM, real OLMo tokenizer, single model.safetensors (bf16)
    models/qwen2moe-tiny/     Qwen2MoeForCausalLM, small trained byte-level BPE, sharded safetensors (bf16)
    models/qwen3moe-tiny/     Qwen3MoeForCausalLM (GQA, explicit head_dim, per-head q/k norm, a dense layer),
                              the same BPE, sharded safetensors (bf16), config.json in the published Qwen3 form
    models/mixtral-tiny/      MixtralForCausalLM (GQA), the same BPE with Mistral's specials, sharded safetensors
                              (bf16) under the hub's block_sparse_moe names, config.json in the published form
    models/goldens/<fixture>.safetensors        transformers float32 logits + greedy tokens
    models/goldens/<fixture>.int4.safetensors   same, with routed experts replaced by their INT4 round trip
    models/goldens/<fixture>.int4_ref.safetensors  reference quantiser output (nibbles + f16 scales)
    models/goldens/<fixture>.q8_0.safetensors   same as .int4, with also the dense weights (attention q/k/v/o,
                                                shared expert, dense MLP layers, lm_head) replaced by their
                                                Q8_0 round trip
    models/goldens/README.md                    (sanity figures of fixtures not rebuilt are kept)

Everything is deterministic: fixed seeds, one CPU thread, no sampling, and no time stamps anywhere.
Shared pieces (tokenizers, INT4 and Q8_0 quantisers, safetensors writer) live in tools/fixtures_common.py.

--q8-only writes models/goldens/<fixture>.q8_0.safetensors (and the README) only: it loads the fixture models
already under models/, first checks that their f32 and INT4 goldens recompute to the files in place (same greedy
tokens and router ids, floats bit-identical on the CPU that made them, else within one f16 step), and leaves
every other file as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_common import (  # noqa: E402
    GOLDENS,
    MODELS,
    QWEN3_CHAT_TEMPLATE,
    QWEN_VOCAB,
    ROOT,
    int4_dequantise,
    int4_quantise,
    olmo_tokenizer_bytes,
    pack_nibbles,
    q8_0_check_against_numpy,
    q8_0_dequantise,
    q8_0_quantise,
    q8_0_selfcheck,
    published_config,
    save_safetensors,
    sha256,
    top2_gap,
    write_mistral_tokenizer,
    write_olmoe_tokenizer,
    write_qwen_tokenizer,
)

SEED = 20240924
N_NEW = 24

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------

FIXTURES = {
    "olmoe-tiny": dict(
        cls=OlmoeForCausalLM,
        config=lambda: OlmoeConfig(
            vocab_size=50304,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_act="silu",
            max_position_embeddings=512,
            initializer_range=0.15,
            rms_norm_eps=1e-5,
            use_cache=True,
            pad_token_id=1,
            bos_token_id=None,
            eos_token_id=50279,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attention_bias=False,
            attention_dropout=0.0,
            clip_qkv=None,
            num_experts_per_tok=3,
            num_experts=7,
            output_router_logits=False,
            router_aux_loss_coef=0.01,
            norm_topk_prob=False,
        ),
        generation=dict(bos_token_id=None, eos_token_id=50279, pad_token_id=1),
        eos_ids=[50279],
        # std of the normal init per parameter kind (see init_weights)
        std=dict(embed=1.0, lm_head=0.35, lm_head_row_lognormal=0.5, linear=0.2, router=0.2, shared_gate=0.0),
        prompts=["The old clockmaker walked along the river and counted the stars.", "Hello, world"],
        sharded=False,
        tokenizer="olmo",
        int4_packed=False,
    ),
    "qwen2moe-tiny": dict(
        cls=Qwen2MoeForCausalLM,
        config=lambda: Qwen2MoeConfig(
            vocab_size=QWEN_VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_act="silu",
            max_position_embeddings=512,
            initializer_range=0.1,
            rms_norm_eps=1e-6,
            use_cache=True,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
            attention_dropout=0.0,
            decoder_sparse_step=1,
            moe_intermediate_size=320,
            shared_expert_intermediate_size=384,
            num_experts_per_tok=3,
            num_experts=6,
            norm_topk_prob=False,
            output_router_logits=False,
            router_aux_loss_coef=0.001,
            mlp_only_layers=[],
            qkv_bias=True,
            bos_token_id=2045,
            eos_token_id=2045,
            pad_token_id=None,
        ),
        generation=dict(bos_token_id=2045, eos_token_id=[2047, 2045], pad_token_id=2045),
        eos_ids=[2047, 2045],
        std=dict(embed=1.0, lm_head=0.3, lm_head_row_lognormal=0.6, linear=0.15, router=0.1, shared_gate=0.15),
        prompts=["The old clockmaker walked along the river at night.", "Hello, world"],
        sharded=True,
        tokenizer="qwen",
        int4_packed=True,
    ),
    # Qwen3-30B-A3B in small: GQA (4 query heads over 2 KV heads), head_dim 32 given explicitly (q dims 128 !=
    # hidden 64), RMSNorm of q and k per head, layer 1 a dense SwiGLU MLP (mlp_only_layers), 7 experts top-3
    # renormalised; INT4 blocks all partial (gate/up rows in = 64, down rows in = 96).
    "qwen3moe-tiny": dict(
        cls=Qwen3MoeForCausalLM,
        config=lambda: Qwen3MoeConfig(
            vocab_size=QWEN_VOCAB,
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            hidden_act="silu",
            max_position_embeddings=512,
            initializer_range=0.1,
            rms_norm_eps=1e-6,
            use_cache=True,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            attention_dropout=0.0,
            decoder_sparse_step=1,
            moe_intermediate_size=96,
            num_experts_per_tok=3,
            num_experts=7,
            norm_topk_prob=True,
            output_router_logits=False,
            router_aux_loss_coef=0.001,
            mlp_only_layers=[1],
            bos_token_id=2045,
            eos_token_id=2047,
            pad_token_id=None,
        ),
        # as Qwen3-30B-A3B's generation_config.json (ids mapped to this vocabulary): sampling defaults included
        generation=dict(bos_token_id=2045, eos_token_id=[2047, 2045], pad_token_id=2045, do_sample=True,
                        temperature=0.6, top_k=20, top_p=0.95),
        eos_ids=[2047, 2045],
        std=dict(embed=1.0, lm_head=0.35, lm_head_row_lognormal=0.5, linear=0.2, router=0.2),
        prompts=["The quick brown fox jumps over the lazy dog near the river bank.", "Hello, world"],
        sharded=True,
        shard_size="400KB",
        tokenizer="qwen3",
        int4_packed=True,
        published="qwen3_moe",
        routing="softmax over all experts in f32, top-k of the probabilities, divided by their sum "
                "(norm_topk_prob true)",
    ),
    # Mixtral-8x7B in small: GQA (8 query heads over 2 KV heads, head_dim = hidden / heads = 16, no head_dim
    # key, as the real config), 5 experts top-3, sliding_window null; INT4 down rows in = 320 (one full block
    # of 256 + a partial one of 64), gate/up rows in = 128 (partial). Tensors under the hub's names.
    "mixtral-tiny": dict(
        cls=MixtralForCausalLM,
        config=lambda: MixtralConfig(
            vocab_size=QWEN_VOCAB,
            hidden_size=128,
            intermediate_size=320,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=None,
            hidden_act="silu",
            max_position_embeddings=512,
            initializer_range=0.1,
            rms_norm_eps=1e-5,
            use_cache=True,
            pad_token_id=None,
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=False,
            sliding_window=None,
            attention_dropout=0.0,
            num_experts_per_tok=3,
            num_local_experts=5,
            output_router_logits=False,
            router_aux_loss_coef=0.02,
            router_jitter_noise=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        generation=dict(bos_token_id=1, eos_token_id=2),
        eos_ids=[2],
        std=dict(embed=1.0, lm_head=0.35, lm_head_row_lognormal=0.5, linear=0.15, router=0.2),
        prompts=["Once upon a time, in a village between two mountains, there lived an old clockmaker.",
                 "Hello, world"],
        sharded=True,
        shard_size="1MB",
        tokenizer="mistral",
        int4_packed=True,
        published="mixtral",
        routing="softmax over all experts in f32, top-k of the probabilities, divided by their sum (always; "
                "equal to a softmax over the k selected logits)",
    ),
}

def param_kind(name: str) -> str:
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return "norm"  # input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm
    if name.endswith(".bias"):
        return "bias"
    if name == "model.embed_tokens.weight":
        return "embed"
    if name == "lm_head.weight":
        return "lm_head"
    if name.endswith("mlp.gate.weight"):
        return "router"
    if name.endswith("mlp.shared_expert_gate.weight"):
        return "shared_gate"
    if any(name.endswith(s) for s in ("_proj.weight", "experts.gate_up_proj", "experts.down_proj")):
        return "linear"
    raise SystemExit(f"unclassified parameter {name}")


@torch.no_grad()
def init_weights(model: torch.nn.Module, std: dict, seed: int) -> None:
    """Re-initialise every parameter from one seeded generator, in sorted name order."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        kind = param_kind(name)
        r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if kind == "norm":
            v = 1.0 + 0.3 * r
        elif kind == "bias":
            v = 0.1 * r
        else:
            v = std[kind] * r
        if kind == "lm_head" and std.get("lm_head_row_lognormal", 0.0) > 0:
            # heavy-tailed row norms: a few tokens are "frequent", which makes the top-2 logit gap clearer
            v = v * torch.exp(std["lm_head_row_lognormal"] * torch.randn((p.shape[0], 1), generator=gen))
        p.copy_(v)


def save_model(name: str, spec: dict, olmo_tok: bytes) -> Path:
    dst = MODELS / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    torch.manual_seed(SEED)
    config = spec["config"]()
    model = spec["cls"](config).eval()
    init_weights(model, spec["std"], SEED)
    model = model.to(torch.bfloat16)
    kwargs = {"max_shard_size": spec.get("shard_size", "4MB")} if spec["sharded"] else {"max_shard_size": "1GB"}
    model.save_pretrained(dst, **kwargs)
    if spec.get("published"):
        write_published_config(dst, config, spec["published"])
    GenerationConfig(**spec["generation"]).save_pretrained(dst)
    tokenizer = spec["tokenizer"]
    if tokenizer == "olmo":
        write_olmoe_tokenizer(dst, olmo_tok)
    elif tokenizer == "qwen":
        write_qwen_tokenizer(dst)
    elif tokenizer == "qwen3":
        write_qwen_tokenizer(dst, chat_template=QWEN3_CHAT_TEMPLATE)
    elif tokenizer == "mistral":
        write_mistral_tokenizer(dst)
    else:
        raise SystemExit(f"unknown tokenizer {tokenizer}")
    return dst


def write_published_config(dst: Path, config, family: str) -> None:
    """Rewrite dst/config.json (as save_pretrained wrote it) to the published form, then check that
    transformers reads it back to the configuration the model was made from."""
    path = dst / "config.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    out, dropped = published_config(written, family)
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    reread = type(config).from_pretrained(dst).to_dict()
    orig = config.to_dict()
    ignore = {"_name_or_path", "max_window_layers"}  # max_window_layers: a published key Qwen3MoeConfig lacks
    diff = {k: (orig.get(k, "<absent>"), reread.get(k, "<absent>")) for k in set(orig) | set(reread)
            if k not in ignore and orig.get(k, "<absent>") != reread.get(k, "<absent>")}
    if diff:
        raise SystemExit(f"{path}: the published form does not read back to the same config: {diff}")
    print(f"config.json rewritten to the published {family} form; dropped (defaults): {dropped}")


def written_tensor_names(dst: Path) -> dict:
    out = {}
    for f in sorted(dst.glob("*.safetensors")):
        with safetensors.safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                out[k] = (f.name, sf.get_slice(k).get_dtype(), tuple(sf.get_slice(k).get_shape()))
    return out


def expert_layout(names: dict) -> str:
    if any(".block_sparse_moe.experts.0.w1.weight" in k for k in names):
        return ("per-expert hub names: model.layers.{L}.block_sparse_moe.experts.{E}.{w1,w2,w3}.weight [out, in] "
                "(w1 = gate, w3 = up, w2 = down), router model.layers.{L}.block_sparse_moe.gate.weight")
    if any(".mlp.experts.0.gate_proj.weight" in k for k in names):
        return "per-expert hub names: model.layers.{L}.mlp.experts.{E}.{gate_proj,up_proj,down_proj}.weight [out, in]"
    if any(k.endswith("mlp.experts.gate_up_proj") for k in names):
        return "fused: model.layers.{L}.mlp.experts.gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]"
    raise SystemExit("unrecognised expert tensor layout")


def load_f32(cls, dst: Path):
    return cls.from_pretrained(dst, dtype=torch.float32, attn_implementation="eager",
                               experts_implementation="eager").eval()


@torch.no_grad()
def check_roundtrip(model, dst: Path, names: dict) -> None:
    """The loaded float32 model must hold exactly the bf16 values on disk (also checks the expert mapping)."""
    disk = {}
    for f in sorted(dst.glob("*.safetensors")):
        disk.update(safetensors.torch.load_file(str(f)))
    sd = model.state_dict()
    n_checked = 0
    hub = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's per-expert names
    for k, v in disk.items():
        if (".mlp.experts." in k or ".block_sparse_moe.experts." in k) and k.endswith(".weight"):
            parts = k.split(".")
            li, e, proj = int(parts[2]), int(parts[5]), hub.get(parts[6], parts[6])
            fused_gu = sd[f"model.layers.{li}.mlp.experts.gate_up_proj"][e]
            inter = fused_gu.shape[0] // 2
            ref = {"gate_proj": fused_gu[:inter], "up_proj": fused_gu[inter:],
                   "down_proj": sd[f"model.layers.{li}.mlp.experts.down_proj"][e]}[proj]
        elif ".block_sparse_moe.gate." in k:
            ref = sd[k.replace(".block_sparse_moe.", ".mlp.")]
        else:
            ref = sd[k]
        assert v.dtype == torch.bfloat16, (k, v.dtype)
        assert torch.equal(v.float(), ref), f"tensor {k} changed on reload"
        n_checked += 1
    assert n_checked == len(names)


def moe_layers(model) -> list[int]:
    """Indices of the decoder layers with routed experts (Qwen3's mlp_only_layers have a dense MLP instead)."""
    return [li for li, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


@torch.no_grad()
def run_prompt(model, ids: list[int]) -> dict:
    x = torch.tensor([ids], dtype=torch.long)
    prompt_logits = model(x).logits[0].float()
    seq = list(ids)
    gen, rows = [], []
    for _ in range(N_NEW):
        # full recompute each step, no cache, no logits processor: plain argmax (first index on ties)
        row = model(torch.tensor([seq], dtype=torch.long)).logits[0, -1].float()
        tok = int(torch.argmax(row))
        rows.append(row)
        gen.append(tok)
        seq.append(tok)
    step_logits = torch.stack(rows)
    assert torch.allclose(step_logits[0], prompt_logits[-1], atol=1e-4, rtol=0)
    # routing over every position that was fed (prompt + first N_NEW-1 generated tokens)
    captured = []
    hooks = [model.model.layers[li].mlp.gate.register_forward_hook(
                 lambda m, i, o: captured.append(o[0].detach().float()))
             for li in moe_layers(model)]
    model(torch.tensor([seq[:-1]], dtype=torch.long))
    for h in hooks:
        h.remove()
    router_logits = torch.stack(captured)  # [L_moe, T, E]
    probs = torch.softmax(router_logits, dim=-1)
    k = model.config.num_experts_per_tok
    top = torch.topk(probs, k + 1, dim=-1)
    top_logits = torch.topk(router_logits, k + 1, dim=-1).values
    return dict(
        prompt_ids=torch.tensor(ids, dtype=torch.int64),
        prompt_logits=prompt_logits,
        generated_ids=torch.tensor(gen, dtype=torch.int64),
        step_logits=step_logits,
        router_probs=probs,
        router_ids=top.indices[..., :k].contiguous(),
        router_margin=(top_logits[..., k - 1] - top_logits[..., k]),
    )


def golden_tensors(results: list[dict]) -> dict:
    out = {}
    for p, r in enumerate(results):
        out[f"p{p}.prompt_ids"] = r["prompt_ids"]
        out[f"p{p}.prompt_logits"] = r["prompt_logits"].to(torch.float16)
        out[f"p{p}.generated_ids"] = r["generated_ids"]
        out[f"p{p}.step_logits"] = r["step_logits"].to(torch.float16)
        out[f"p{p}.prompt_logits_top2_gap"] = top2_gap(r["prompt_logits"])
        out[f"p{p}.step_top2_gap"] = top2_gap(r["step_logits"])
        out[f"p{p}.router_ids"] = r["router_ids"].to(torch.int64)
        out[f"p{p}.router_probs"] = r["router_probs"].to(torch.float32)
        out[f"p{p}.router_margin"] = r["router_margin"].to(torch.float32)
    return {k: v.contiguous() for k, v in out.items()}


@torch.no_grad()
def quantise_routed_experts(model, pack: bool) -> tuple[dict, float]:
    """Replace every routed expert matrix by its INT4 round trip; return reference tensors."""
    ref = {}
    max_err = 0.0
    for li in moe_layers(model):
        ex = model.model.layers[li].mlp.experts
        inter = ex.gate_up_proj.shape[1] // 2
        for e in range(ex.gate_up_proj.shape[0]):
            mats = {"gate_proj": ex.gate_up_proj[e, :inter], "up_proj": ex.gate_up_proj[e, inter:],
                    "down_proj": ex.down_proj[e]}
            for proj, w in mats.items():
                q, scale = int4_quantise(w)
                wq = int4_dequantise(q, scale)
                max_err = max(max_err, float((wq - w).abs().max()))
                w.copy_(wq)  # views into the fused parameters
                base = f"layers.{li}.experts.{e}.{proj}"
                ref[base + ".q"] = pack_nibbles(q) if pack else (q.to(torch.int16) + 8).to(torch.uint8).contiguous()
                ref[base + ".scale"] = scale.contiguous()
    return ref, max_err


def gap_summary(results: list[dict]) -> tuple[float, float]:
    gaps = torch.cat([torch.cat([top2_gap(r["prompt_logits"]), top2_gap(r["step_logits"])]) for r in results])
    return float(gaps.min()), float(gaps.median())


ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJ = ("gate_proj", "up_proj", "down_proj")
Q8_0_DESC = ("dense weights (on top of the INT4 round trip of the routed experts): every layer's "
             "self_attn.{q,k,v,o}_proj.weight, the shared expert's mlp.shared_expert.{gate,up,down}_proj.weight, "
             "a dense layer's mlp.{gate,up,down}_proj.weight, and lm_head.weight (the names in q8_0_tensors); not "
             "biases, norms (q_norm/k_norm included), embeddings, routers, shared_expert_gate. Q8_0 as ggml's "
             "quantize_row_q8_0_ref: per row of [out, in], blocks of 32 along in (a partial last block padded with "
             "zeros); amax = max|w_block| of the bf16 weight in f32; d = amax / 127 (f32); id = 1 / d (0 where "
             "d == 0); q = clamp(roundf(w * id), -127, 127) with roundf half away from zero; "
             "w' = q * f32(f16(d)) (f16 round to nearest even)")


def untie_lm_head(model) -> bool:
    """With tied embeddings, give lm_head its own copy of the embedding matrix (wgmoe keeps the embeddings f16 and
    builds a separate Q8_0 lm_head); returns whether it was tied."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head.weight is not emb and head.weight.data_ptr() != emb.data_ptr():
        return False
    head.weight = torch.nn.Parameter(emb.detach().clone())
    model.config.tie_word_embeddings = False
    assert model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    return True


def dense_q8_0_names(model) -> list[str]:
    """The HF names (in memory; the checkpoint uses the same ones for these) of the dense weights wgmoe stores as
    Q8_0, in layer order, lm_head last. Every other matrix must be an embedding, router, shared-expert gate or
    routed expert."""
    moe = moe_layers(model)
    names = []
    for li, layer in enumerate(model.model.layers):
        names += [f"model.layers.{li}.self_attn.{p}.weight" for p in ATTN_PROJ]
        if li not in moe:
            names += [f"model.layers.{li}.mlp.{p}.weight" for p in MLP_PROJ]
        elif hasattr(layer.mlp, "shared_expert"):
            names += [f"model.layers.{li}.mlp.shared_expert.{p}.weight" for p in MLP_PROJ]
    names.append("lm_head.weight")
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params or params[n].dim() != 2]
    if missing:
        raise SystemExit(f"dense Q8_0 weights not found as 2-d parameters: {missing}")
    for n, p in params.items():
        if n in names:
            continue
        kind = param_kind(n)
        fused_expert = n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
        if not (kind in ("norm", "bias", "embed", "router", "shared_gate") or fused_expert):
            raise SystemExit(f"parameter {n} ({kind}, {tuple(p.shape)}) is neither Q8_0 dense nor excluded")
    return names


@torch.no_grad()
def quantise_dense_q8_0(model) -> tuple[list[str], bool, float]:
    """Replace the dense weights (dense_q8_0_names) by their Q8_0 round trip, each checked bit-exact against the
    numpy reference; returns the names, whether lm_head was untied from the embeddings, and max |w' - w|."""
    tied = untie_lm_head(model)
    names = dense_q8_0_names(model)
    params = dict(model.named_parameters())
    max_err = 0.0
    for n in names:
        w = params[n]
        assert torch.equal(w, w.to(torch.bfloat16).to(torch.float32)), f"{n} does not hold bf16 values"
        q, d = q8_0_quantise(w)
        q8_0_check_against_numpy(w, q, d)
        wq = q8_0_dequantise(q, d)
        max_err = max(max_err, float((wq - w).abs().max()))
        w.copy_(wq)
    return names, tied, max_err


def q8_0_golden(spec: dict, dst: Path, prompt_ids: list, qmeta: dict) -> tuple[list[dict], float]:
    """The Q8_0 golden: the INT4 golden's model with the dense weights also round-tripped through Q8_0."""
    model = load_f32(spec["cls"], dst)
    quantise_routed_experts(model, spec["int4_packed"])
    names, tied, max_err = quantise_dense_q8_0(model)
    on_disk = written_tensor_names(dst)
    assert all(n in on_disk or (tied and n == "lm_head.weight") for n in names), "Q8_0 names not in the checkpoint"
    results = [run_prompt(model, ids) for ids in prompt_ids]
    meta = dict(qmeta)
    meta["q8_0"] = Q8_0_DESC
    meta["q8_0_tensors"] = json.dumps(names)
    meta["q8_0_lm_head"] = ("tied embeddings, untied: lm_head.weight = Q8_0 round trip of model.embed_tokens.weight; "
                            "model.embed_tokens.weight unchanged" if tied else
                            "untied lm_head.weight of the checkpoint; model.embed_tokens.weight unchanged")
    save_safetensors(golden_tensors(results), GOLDENS / f"{dst.name}.q8_0.safetensors", meta)
    print(f"q8_0: round-tripped {len(names)} dense tensors{' (lm_head untied)' if tied else ''}: {names}")
    return results, max_err


def q8_0_report(results: list[dict], qresults: list[dict], q8results: list[dict], max_err: float, eos: list) -> list:
    def agree(a, b):
        return [sum(int(x == y) for x, y in zip(r["generated_ids"].tolist(), s["generated_ids"].tolist()))
                for r, s in zip(a, b)]

    def prefix(a, b):
        out = []
        for r, s in zip(a, b):
            x, y = r["generated_ids"].tolist(), s["generated_ids"].tolist()
            out.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x)))
        return out

    gmin, gmed = gap_summary(q8results)
    lines = [f"  [q8_0] top1-top2 logit gap: min {gmin:.4f}, median {gmed:.4f}"]
    for p, r in enumerate(q8results):
        gen = r["generated_ids"].tolist()
        lines.append(f"  [q8_0] p{p} generated {gen}"
                     + (f"  (eos at steps {[i for i, t in enumerate(gen) if t in eos]})"
                        if any(t in eos for t in gen) else ""))
    lines.append(f"  q8_0 greedy tokens equal per prompt: vs f32 {agree(results, q8results)} / {N_NEW} (equal prefix "
                 f"{prefix(results, q8results)}), vs int4 {agree(qresults, q8results)} / {N_NEW} (equal prefix "
                 f"{prefix(qresults, q8results)}); max |w'-w| of the Q8_0 dense weights {max_err:.4g}")
    return lines


def build(name: str, spec: dict, versions: dict, report: dict, olmo_tok: bytes | None) -> None:
    print(f"\n=== {name} ===")
    dst = save_model(name, spec, olmo_tok)
    names = written_tensor_names(dst)
    layout = expert_layout(names)
    config_json = json.loads((dst / "config.json").read_text())
    rope_keys = [k for k in ("rope_theta", "rope_parameters", "rope_scaling") if k in config_json]
    print("expert layout:", layout)
    print("rope keys in config.json:", rope_keys, {k: config_json[k] for k in rope_keys})
    print("safetensors files:", sorted({v[0] for v in names.values()}))

    hf_tok = AutoTokenizer.from_pretrained(dst)
    raw_tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    print("tokenizer:", type(hf_tok).__name__, "len", len(hf_tok), "raw vocab", raw_tok.get_vocab_size())
    prompt_ids = []
    for text in spec["prompts"]:
        ids = hf_tok(text)["input_ids"]
        raw = raw_tok.encode(text).ids
        assert ids == raw, (text, ids, raw)
        assert ids == hf_tok(text, add_special_tokens=False)["input_ids"], "tokenizer adds special tokens"
        print(f"  prompt {text!r}: {len(ids)} tokens {ids}")
        prompt_ids.append(ids)
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    print("  chat template render:", repr(chat))

    model = load_f32(spec["cls"], dst)
    check_roundtrip(model, dst, names)
    moe = moe_layers(model)
    results = [run_prompt(model, ids) for ids in prompt_ids]

    meta = {
        "fixture": name,
        "p0.text": spec["prompts"][0],
        "p1.text": spec["prompts"][1],
        "transformers_version": versions["transformers"],
        "torch_version": versions["torch"],
        "tokenizers_version": versions["tokenizers"],
        "safetensors_version": versions["safetensors"],
        "seed": str(SEED),
        "logits_dtype": "f16 (computed in f32)",
        "compute": "transformers float32 from the bf16 checkpoint, eager attention, eager experts, no KV cache "
                   "(full recompute per step), 1 CPU thread",
        "decode": f"greedy argmax (first index on ties) for {N_NEW} new tokens, no logits processor, EOS never "
                  "stops or masks decoding; step_logits[i] is the row token i was chosen from; step 0 == last prompt row",
        "prompt_ids": "tokenizer(text) with its defaults; it adds no special tokens",
        "expert_tensor_layout": layout,
        "eos_ids": json.dumps(spec["eos_ids"]),
        "router": "router_ids [L, T, k]: top-k expert ids per layer over positions fed = prompt + first 23 generated; "
                  "router_probs [L, T, E] f32 softmax of the router logits; router_margin [L, T] f32 k-th minus "
                  "(k+1)-th router logit (routing near-ties)",
    }
    extra = {}
    if spec.get("routing"):  # the new fixtures (the old files keep their exact metadata)
        extra = {
            "moe_layers": json.dumps(moe),
            "routing": spec["routing"],
            "router": "router_ids [L_moe, T, k]: top-k expert ids per MoE layer (the layers in moe_layers, in that "
                      "order; dense layers have no router) over positions fed = prompt + first 23 generated; "
                      "router_probs [L_moe, T, E] f32 softmax of the router logits; router_margin [L_moe, T] f32 "
                      "k-th minus (k+1)-th router logit (routing near-ties)",
        }
    meta.update(extra)

    GOLDENS.mkdir(parents=True, exist_ok=True)
    save_safetensors(golden_tensors(results), GOLDENS / f"{name}.safetensors", meta)

    # INT4 round trip
    qmodel = load_f32(spec["cls"], dst)
    pack = spec["int4_packed"]
    ref, max_err = quantise_routed_experts(qmodel, pack)
    qresults = [run_prompt(qmodel, ids) for ids in prompt_ids]
    qlayout = "packed" if pack else "unpacked"
    qformat = ("U8 [out, ceil(in/2)], byte = (q[2j]+8) | (q[2j+1]+8) << 4 (low nibble = even column)"
               if pack else "U8 [out, in], one nibble per byte, value q+8")
    qdesc = ("routed experts only (gate_proj, up_proj, down_proj of every routed expert; not shared_expert, router, "
             "attention, embeddings, lm_head): per row of [out, in], blocks of 256 along in (last block may be "
             "partial); scale = f16(max|w_block| / 7) computed in f32 from the bf16 weight; "
             "q = clamp(round_half_even(w / f32(scale)), -8, 7), q = 0 where scale == 0; w' = q * f32(scale)")
    qmeta = dict(meta, int4=qdesc)
    save_safetensors(golden_tensors(qresults), GOLDENS / f"{name}.int4.safetensors", qmeta)
    ref_meta = {
        "fixture": name, "int4": qdesc, "q_layout": qlayout, "q_format": qformat,
        "names": "layers.{L}.experts.{E}.{gate_proj|up_proj|down_proj}.q and .scale (F16 [out, ceil(in/256)])",
        "torch_version": versions["torch"], "transformers_version": versions["transformers"],
    }
    if spec.get("routing"):
        ref_meta["moe_layers"] = json.dumps(moe)
        if "block_sparse_moe" in layout:
            ref_meta["names"] += "; gate_proj = w1, up_proj = w3, down_proj = w2 of the checkpoint"
    save_safetensors(ref, GOLDENS / f"{name}.int4_ref.safetensors", ref_meta)

    # Q8_0 dense weights on top of the INT4 experts
    q8results, q8_err = q8_0_golden(spec, dst, prompt_ids, qmeta)

    # sanity report
    lines = [f"{name}:"]
    for tag, res in (("f32", results), ("int4", qresults)):
        gmin, gmed = gap_summary(res)
        lines.append(f"  [{tag}] top1-top2 logit gap: min {gmin:.4f}, median {gmed:.4f}")
        for p, r in enumerate(res):
            gen = r["generated_ids"].tolist()
            lines.append(f"  [{tag}] p{p} generated {gen}"
                         + (f"  (eos at steps {[i for i, t in enumerate(gen) if t in spec['eos_ids']]})"
                            if any(t in spec["eos_ids"] for t in gen) else ""))
    agree = [sum(int(a == b) for a, b in zip(r["generated_ids"].tolist(), q["generated_ids"].tolist()))
             for r, q in zip(results, qresults)]
    lines.append(f"  int4 vs f32 greedy tokens equal per prompt: {agree} / {N_NEW}; max |w'-w| {max_err:.4g}")
    lines += q8_0_report(results, qresults, q8results, q8_err, spec["eos_ids"])
    n_exp = model.config.num_experts
    for j, li in enumerate(moe):
        ids = torch.cat([r["router_ids"][j].flatten() for r in results])
        counts = torch.bincount(ids, minlength=n_exp).tolist()
        margin = min(float(r["router_margin"][j].min()) for r in results)
        lines.append(f"  layer {li}: distinct experts picked {sum(c > 0 for c in counts)}/{n_exp}, "
                     f"counts {counts}, min router-logit margin k-th vs (k+1)-th {margin:.4g}")
    dense = [li for li in range(model.config.num_hidden_layers) if li not in moe]
    if dense:
        lines.append(f"  layers {dense}: dense MLP (no router)")
    print("\n".join(lines))
    report[name] = lines
    del model, qmodel


def recompute_check(ours: dict, theirs: dict, label: str) -> str:
    """A golden recomputed from the model in place against the file: bit-identical on the CPU that made it; on
    another one, float32 summation order in the BLAS kernels may move the last bits, so ids (greedy tokens, router
    top-k) must be equal, logits and their top-2 gaps within 2e-3 + 2^-10 |g| (one f16 step of the logits), router
    probabilities and margins within 1e-4 + 1e-4 |g|. Exits otherwise."""
    if set(ours) != set(theirs):
        raise SystemExit(f"{label}: tensor names differ: {sorted(set(ours) ^ set(theirs))}")
    bad, n_diff, worst = [], 0, 0.0
    for k in sorted(ours):
        a, b = ours[k], theirs[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            bad.append(k)
            continue
        if torch.equal(a, b):
            continue
        n_diff += 1
        if a.dtype == torch.int64:
            bad.append(k)
            continue
        a, b = a.float(), b.float()
        tol = (2e-3 + 2.0 ** -10 * b.abs()) if "logits" in k or "gap" in k else (1e-4 + 1e-4 * b.abs())
        d = (a - b).abs()
        worst = max(worst, float((d / tol).max()))
        if not (d <= tol).all():
            bad.append(k)
    if bad:
        raise SystemExit(f"{label}: does not recompute from the model in place ({bad[:6]}); rebuild the fixture")
    return ("recomputes bit-identically" if n_diff == 0 else
            f"recomputes with equal ids, {n_diff} float tensors differ in the last bits (max |d| / tol {worst:.3g})")


def build_q8_only(name: str, spec: dict, versions: dict, report: dict) -> None:
    """Write only the Q8_0 golden of a fixture already in place (models/<name>/ and its goldens unchanged), after
    checking that the f32 and INT4 goldens recompute from it with the installed versions (recompute_check)."""
    print(f"\n=== {name} (Q8_0 golden only) ===")
    dst = MODELS / name
    paths = {suffix: GOLDENS / f"{name}{suffix}" for suffix in (".safetensors", ".int4.safetensors")}
    if not dst.is_dir() or not all(p.is_file() for p in paths.values()) or name not in report:
        raise SystemExit(f"{name}: --q8-only needs models/{name}/, its f32 and int4 goldens and its README sanity "
                         "figures; build it without --q8-only")
    with safetensors.safe_open(str(paths[".int4.safetensors"]), framework="pt") as f:
        qmeta = f.metadata()
    for k in ("transformers", "torch", "tokenizers", "safetensors"):
        if qmeta[f"{k}_version"] != versions[k]:
            raise SystemExit(f"{name}: goldens made with {k} {qmeta[f'{k}_version']}, installed {versions[k]}")
    golden = {suffix: safetensors.torch.load_file(str(p)) for suffix, p in paths.items()}
    prompt_ids = [golden[".safetensors"][f"p{p}.prompt_ids"].tolist() for p in range(len(spec["prompts"]))]
    hf_tok = AutoTokenizer.from_pretrained(dst)
    for p, (text, ids) in enumerate(zip(spec["prompts"], prompt_ids)):
        assert qmeta[f"p{p}.text"] == text and hf_tok(text)["input_ids"] == ids, (name, p, text)
    model = load_f32(spec["cls"], dst)
    check_roundtrip(model, dst, written_tensor_names(dst))
    results = [run_prompt(model, ids) for ids in prompt_ids]
    qmodel = load_f32(spec["cls"], dst)
    quantise_routed_experts(qmodel, spec["int4_packed"])
    qresults = [run_prompt(qmodel, ids) for ids in prompt_ids]
    for suffix, res in ((".safetensors", results), (".int4.safetensors", qresults)):
        print(f"{name}{suffix}: {recompute_check(golden_tensors(res), golden[suffix], name + suffix)}")
    q8results, q8_err = q8_0_golden(spec, dst, prompt_ids, qmeta)
    lines = [line for line in report[name] if not line.startswith(("  [q8_0]", "  q8_0 "))]
    at = next(i for i, line in enumerate(lines) if line.startswith("  int4 vs f32")) + 1
    lines[at:at] = q8_0_report(results, qresults, q8results, q8_err, spec["eos_ids"])
    print("\n".join(lines))
    report[name] = lines
    del model, qmodel


def shape_table() -> str:
    """Golden tensor sizes per fixture, read from the golden files on disk."""
    rows = ["| fixture | V | P (p0, p1) | L (router layers) | T = P + 23 | k | E |", "|---|---|---|---|---|---|---|"]
    for name in FIXTURES:
        path = GOLDENS / f"{name}.safetensors"
        if not path.is_file():
            continue
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            shape = {k: f.get_slice(k).get_shape() for k in f.keys()}
        layers = meta.get("moe_layers", json.dumps(list(range(shape["p0.router_ids"][0]))))
        rows.append(f"| {name} | {shape['p0.prompt_logits'][1]} | {shape['p0.prompt_ids'][0]}, "
                    f"{shape['p1.prompt_ids'][0]} | {shape['p0.router_ids'][0]} {layers} | "
                    f"{shape['p0.router_ids'][1]}, {shape['p1.router_ids'][1]} | {shape['p0.router_ids'][2]} | "
                    f"{shape['p0.router_probs'][2]} |")
    return "\n".join(rows)


def write_readme(report: list[str], versions: dict) -> None:
    readme = GOLDENS / "README.md"
    files = sorted(f for f in MODELS.rglob("*")
                   if f.is_file() and f != readme and f.relative_to(MODELS).parts[0] not in ("configs", "gguf"))
    rows = "\n".join(f"| `{f.relative_to(MODELS)}` | {f.stat().st_size} |" for f in files)
    text = f"""# Golden outputs for the tiny fixtures

Produced by `python3 tools/make_fixtures.py` (repository root, environment from `tools/requirements.txt`:
transformers {versions['transformers']}, torch {versions['torch']}, tokenizers {versions['tokenizers']},
safetensors {versions['safetensors']}). The script is deterministic: rerunning it rewrites identical files
(`--only a,b` rebuilds some fixtures and leaves the others' files as they are; `--q8-only` writes only the
`.q8_0` goldens, from the fixture models in place).
Tolerances are decided by the Rust tests, not here. `tools/check_fixtures.py` loads every fixture back with
`AutoTokenizer` / `AutoModelForCausalLM` and checks it against these goldens.

Fixtures (random weights, bf16 on disk, made by the real transformers classes):
- `../olmoe-tiny/`: `OlmoeForCausalLM`, real OLMo tokenizer (vocab 50280, embeddings padded to 50304),
  one `model.safetensors`.
- `../qwen2moe-tiny/`: `Qwen2MoeForCausalLM`, byte-level BPE of 2048 tokens trained by the script,
  sharded `model-0000X-of-0000N.safetensors` + `model.safetensors.index.json`.
- `../qwen3moe-tiny/`: `Qwen3MoeForCausalLM` (`qwen3_moe`), the same BPE (bos `<|endoftext|>` 2045,
  eos `<|im_end|>` 2047), 4 shards + index. hidden 64, 3 layers, 4 query heads / 2 KV heads (GQA group 2),
  `head_dim` 32 given in config.json (q_proj [128, 64], k/v_proj [64, 64], o_proj [64, 128]: q dims 128 !=
  hidden 64), RMSNorm of q and k per head (`q_norm`/`k_norm` weight [32], over head_dim), no attention bias,
  no shared expert; layer 1 is dense (`mlp_only_layers: [1]`, SwiGLU of `intermediate_size` 192: names
  `model.layers.1.mlp.{{gate_proj,up_proj,down_proj}}.weight`), layers 0 and 2 have 7 experts
  (`moe_intermediate_size` 96) top-3 with `norm_topk_prob: true`; rope_theta 1e6, rms eps 1e-6.
  INT4: every block partial (gate/up rows in = 64, down rows in = 96).
- `../mixtral-tiny/`: `MixtralForCausalLM` (`mixtral`), the same BPE trained with Mistral's special tokens
  first (`<unk>` 0, `<s>` 1 = bos, `</s>` 2 = eos), 5 shards + index. hidden 128, 2 layers, 8 query heads /
  2 KV heads (GQA group 4), no `head_dim` key (head_dim = 128 / 8 = 16: q_proj [128, 128], k/v_proj [32, 128]),
  5 experts (`num_local_experts`, intermediate 320) top-3, `sliding_window: null`; rope_theta 1e6, rms eps
  1e-5. INT4: down rows in = 320 (one full block of 256 + a partial one of 64), gate/up rows in = 128 (partial).

### Tensor names on disk
- olmoe-tiny, qwen2moe-tiny, qwen3moe-tiny: the hub's per-expert names
  `model.layers.{{L}}.mlp.experts.{{E}}.{{gate_proj,up_proj,down_proj}}.weight` [out, in], router
  `model.layers.{{L}}.mlp.gate.weight` [E, hidden] (what `save_pretrained` of transformers 5.24 writes by default:
  it converts its fused in-memory experts back to the checkpoint names).
- mixtral-tiny: the hub's Mixtral names `model.layers.{{L}}.block_sparse_moe.experts.{{E}}.{{w1,w2,w3}}.weight`
  (w1 = gate [320, 128], w3 = up [320, 128], w2 = down [128, 320]) and router
  `model.layers.{{L}}.block_sparse_moe.gate.weight` [5, 128]. This is what `save_pretrained` of transformers 5.24
  writes for Mixtral by default (its conversion mapping renames `mlp.` back to `block_sparse_moe.` and splits
  the fused experts); the script renames nothing, and `from_pretrained` loads these names back (checked).
- transformers 5's fused in-memory form, which `save_pretrained(..., save_original_format=False)` writes instead
  (no fixture uses it): `model.layers.{{L}}.mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first),
  `model.layers.{{L}}.mlp.experts.down_proj` [E, H, I], router `model.layers.{{L}}.mlp.gate.weight`, for every
  family including Mixtral.

### config.json
olmoe-tiny and qwen2moe-tiny keep what transformers 5.24 writes (`rope_parameters`, `dtype`, `num_experts`).
qwen3moe-tiny and mixtral-tiny are rewritten to the key set of the published Qwen3-30B-A3B and
Mixtral-8x7B-v0.1 config.json (`../configs/`), values unchanged: `rope_parameters` -> top-level `rope_theta`
(+ `rope_scaling: null` for Qwen3), `dtype` -> `torch_dtype`, Qwen3's `num_local_experts` -> `num_experts`,
`max_window_layers` = num_hidden_layers (Qwen3); dropped because the published files lack them and they hold
defaults: `pad_token_id` (null), Mixtral's `head_dim` (null) and `router_jitter_noise` (0.0). The script checks
that transformers reads the rewritten file back to the same configuration. qwen3moe-tiny's
generation_config.json carries Qwen3's sampling defaults (do_sample, temperature 0.6, top_k 20, top_p 0.95);
the goldens ignore them (greedy).

### Routing, as the installed transformers computes it
- OLMoE, Qwen2-MoE, Qwen3-MoE (`OlmoeTopKRouter`, `Qwen2MoeTopKRouter`, `Qwen3MoeTopKRouter`):
  `router_probs = softmax(router_logits, dtype=torch.float, dim=-1)`; `router_top_value, router_indices =
  torch.topk(router_probs, self.top_k, dim=-1)`; `if self.norm_topk_prob: router_top_value /=
  router_top_value.sum(dim=-1, keepdim=True)`. Softmax over all experts in f32, then top-k, then renormalised
  only when `norm_topk_prob` (false for olmoe/qwen2moe-tiny, true for qwen3moe-tiny).
- Mixtral (`MixtralTopKRouter`, modeling_mixtral.py lines 106-110): `router_probs =
  softmax(router_logits.float(), dim=-1)`; `router_top_value, router_indices = torch.topk(router_probs,
  self.top_k, dim=-1)`; `router_top_value /= router_top_value.sum(dim=-1, keepdim=True)`. Softmax over all
  experts, top-k of the probabilities, always renormalised (there is no `norm_topk_prob` in Mixtral's config).
  This equals a softmax over the k selected logits (top-k of the logits picks the same experts).
- Every family: each selected expert's SwiGLU output (down(silu(gate x) * up x)) is multiplied by its weight and
  summed. The metadata key `routing` of the new fixtures' goldens says the same in words.

## `<fixture>.safetensors`
transformers in float32 (the bf16 checkpoint loaded with `dtype=torch.float32`), eager attention,
eager experts, no KV cache (full recompute per step). For prompt p in {{0, 1}} (texts in the metadata
`p0.text`, `p1.text`; the tokenizer adds no special tokens):
- `p{{p}}.prompt_ids` I64 [P]
- `p{{p}}.prompt_logits` F16 [P, V]: logits at every prompt position (computed in f32, stored f16)
- `p{{p}}.generated_ids` I64 [24]: greedy argmax, no logits processor, EOS neither stops nor is masked
- `p{{p}}.step_logits` F16 [24, V]: row i is the logits token i was chosen from (row 0 = last prompt row)
- `p{{p}}.prompt_logits_top2_gap` F32 [P], `p{{p}}.step_top2_gap` F32 [24]: top-1 minus top-2 logit (f32)
- `p{{p}}.router_ids` I64 [L, T, k]: top-k expert ids per layer at each of the T = P + 23 positions fed
- `p{{p}}.router_probs` F32 [L, T, E]: softmax of the router logits at those positions
- `p{{p}}.router_margin` F32 [L, T]: k-th minus (k+1)-th router logit (small = routing near-tie)

L counts the layers with a router only: for qwen3moe-tiny L = 2 (layers 0 and 2; layer 1 is dense). The new
fixtures' metadata has `moe_layers` (a JSON list of the decoder-layer index of each router row: `[0, 2]` for
qwen3moe-tiny, `[0, 1]` for mixtral-tiny) and `routing`.

{shape_table()}

## `<fixture>.int4.safetensors`
Same tensors, computed on a copy of the model whose routed expert matrices (gate_proj, up_proj,
down_proj of every routed expert; not Qwen's shared expert, Qwen3's dense layer, router, attention, embeddings,
lm_head) are replaced by their INT4 round trip: per row of the [out, in] matrix, blocks of 256 along `in` (the last
block may be partial); scale = f16(max|w_block| / 7) computed in f32 from the bf16 weight;
q = clamp(round_half_even(w / f32(scale)), -8, 7), q = 0 where scale == 0; w' = q * f32(scale).

## `<fixture>.int4_ref.safetensors`
The quantiser's output for every routed expert matrix: `layers.{{L}}.experts.{{E}}.{{gate_proj|up_proj|down_proj}}.q`
and `.scale` (F16 [out, ceil(in/256)]). `{{L}}` is the decoder-layer index, so qwen3moe-tiny has layers 0 and 2
only (metadata `moe_layers`). For mixtral-tiny gate_proj = w1, up_proj = w3, down_proj = w2 of the checkpoint.
- olmoe-tiny: `.q` unpacked, U8 [out, in], value q+8.
- qwen2moe-tiny, qwen3moe-tiny, mixtral-tiny: `.q` packed, U8 [out, ceil(in/2)], byte = (q[2j]+8) | (q[2j+1]+8) << 4
  (low nibble = even column).
The metadata key `q_layout` says which (`unpacked` or `packed`); `q_format` spells it out.

## `<fixture>.q8_0.safetensors`
Same tensors, computed on the INT4 golden's model (routed experts INT4 round-tripped, as above) whose dense
weights are also replaced by their Q8_0 round trip: every layer's `self_attn.{{q,k,v,o}}_proj.weight`, Qwen2-MoE's
`mlp.shared_expert.{{gate,up,down}}_proj.weight`, qwen3moe-tiny's dense layer `model.layers.1.mlp.{{gate,up,down}}_proj.weight`,
and `lm_head.weight`; not biases, norms (`q_norm`/`k_norm` included), embeddings, routers, `shared_expert_gate`.
No fixture ties its embeddings (with tied ones, lm_head would get the round trip of `embed_tokens`, which stays as
it is). Q8_0 is ggml's `quantize_row_q8_0_ref` (as `src/blocks/q8_0.rs`): per row of the [out, in] matrix, blocks
of 32 along `in` (a partial last block padded with zeros); d = max|w_block| / 127 in f32 from the bf16 weight;
q = clamp(roundf(w * (1/d)), -127, 127), roundf half away from zero, q = 0 where d == 0; w' = q * f32(f16(d))
(f16 nearest even). Metadata: the INT4 golden's keys plus `q8_0` (this in words), `q8_0_tensors` (a JSON list of
the HF names round-tripped, the same in the checkpoint) and `q8_0_lm_head`.

## Sanity figures printed by the script
```
{chr(10).join(report)}
```

## Sizes (bytes)
| file | bytes |
|---|---|
{rows}

Fixtures and goldens, without this README, `../configs/` and `../gguf/` (made by `tools/make_gguf_fixtures.py`):
{sum(f.stat().st_size for f in files)} bytes. The last line the script prints is the total of everything under `models/`.
"""
    (GOLDENS / "README.md").write_text(text, encoding="utf-8")


def previous_report() -> dict:
    """Sanity figures per fixture from the README in place (kept for the fixtures a run does not rebuild)."""
    readme = GOLDENS / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text(encoding="utf-8")
    head = "## Sanity figures printed by the script\n```\n"
    if head not in text:
        return {}
    block = text.split(head, 1)[1].split("\n```", 1)[0]
    out: dict = {}
    current = None
    for line in block.split("\n"):
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            out[current] = []
        if current is not None:
            out[current].append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated fixture names to build (default: all of "
                                   + ", ".join(FIXTURES) + "); the others' files are left as they are")
    ap.add_argument("--q8-only", action="store_true",
                    help="write only goldens/<fixture>.q8_0.safetensors (and the README), from the fixture models "
                         "in place, after checking that their f32 and int4 goldens recompute (same tokens)")
    args = ap.parse_args()
    names = list(FIXTURES) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIXTURES]
    if unknown or not names:
        raise SystemExit(f"unknown fixture(s) {unknown}; known: {', '.join(FIXTURES)}")
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}
    print("python", sys.version.split()[0], versions, "building", names, "(Q8_0 goldens only)" if args.q8_only else "")
    q8_0_selfcheck()
    if args.q8_only:
        report = previous_report()
        for name in names:
            (GOLDENS / f"{name}.q8_0.safetensors").unlink(missing_ok=True)
            build_q8_only(name, FIXTURES[name], versions, report)
        write_readme([line for n in FIXTURES if n in report for line in report[n]], versions)
        for name in names:
            f = GOLDENS / f"{name}.q8_0.safetensors"
            print(f"  {f.stat().st_size:>10}  {f.relative_to(ROOT)}  sha256 {sha256(f)[:16]}")
        return
    olmo_tok = olmo_tokenizer_bytes() if any(FIXTURES[n]["tokenizer"] == "olmo" for n in names) else None
    report = previous_report() if args.only is not None else {}
    if args.only is None:
        if GOLDENS.exists():
            shutil.rmtree(GOLDENS)
    else:
        for n in names:
            for suffix in (".safetensors", ".int4.safetensors", ".int4_ref.safetensors", ".q8_0.safetensors"):
                (GOLDENS / f"{n}{suffix}").unlink(missing_ok=True)
    for name in names:
        build(name, FIXTURES[name], versions, report, olmo_tok)
    write_readme([line for n in FIXTURES if n in report for line in report[n]], versions)
    print("\nfiles written:" if args.only is None else "\nfiles in models/:")
    total = 0
    for f in sorted(p for p in MODELS.rglob("*") if p.is_file()):
        total += f.stat().st_size
        print(f"  {f.stat().st_size:>10}  {f.relative_to(ROOT)}  sha256 {sha256(f)[:16]}")
    print(f"total size of models/: {total} bytes ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
