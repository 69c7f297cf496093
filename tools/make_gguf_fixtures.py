#!/usr/bin/env python3
"""GGUF fixtures and llama.cpp goldens for wgmoe's GGUF reader, tokenizer and (later) kernels.

    tools/build_llamacpp.sh                      # once: llama.cpp from the llama-cpp-python sdist (~15 min)
    .venv/bin/pip install -r tools/requirements.txt   # (tools/requirements.txt has gguf, sentencepiece, protobuf)
    .venv/bin/python tools/make_gguf_fixtures.py [--llama-cpp .llamacpp/llama.cpp] [--only dequant,models,tokenizers]

Writes models/gguf/ (see models/gguf/README.md, which this script also writes):
    dequant.gguf                  random blocks of every supported type + the gguf package's dequantisation
    <family>/config.json          the Hugging Face config of the model converted (its weights are not kept)
    <family>/<family>-<TYPE>.gguf llama.cpp's convert_hf_to_gguf.py (f16) then llama-quantize
    <family>/goldens.json         llama.cpp's greedy tokens and top logits on each file (tools/llamacpp_logits.cpp)
    tokenizers/<name>.gguf        vocab-only files (convert_hf_to_gguf.py --vocab-only)
    tokenizers/<name>.json        llama-tokenize's ids for a set of strings, with and without the BOS

The models are random-weight MoE models of the four families with rows of 256 (hidden 256, expert
intermediate 256), so that llama-quantize's K-quants really appear (rows must divide 256; the fixtures under
models/*-tiny fall back to Q5_0/Q8_0). Deterministic: seeded init, one thread, no sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_common import (  # noqa: E402
    MISTRAL_CHAT_TEMPLATE,
    OLMOE_CHAT_TEMPLATE,
    QWEN3_CHAT_TEMPLATE,
    QWEN_CHAT_TEMPLATE,
    QWEN_PRETOKENIZE_REGEX,
    added_tokens_decoder,
    qwen_corpus,
    write_json,
)
from make_fixtures import SEED, init_weights  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "models" / "gguf"
LLAMA_VERSION = "llama-cpp-python 0.3.36 sdist (vendor/llama.cpp)"

# --------------------------------------------------------------------------------------------------
# Dequantiser fixtures
# --------------------------------------------------------------------------------------------------

# Byte offsets of the f16 scale fields per block, set to finite values (random bits elsewhere).
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def make_dequant(rng: np.random.Generator) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    w = gguf.GGUFWriter(str(OUT / "dequant.gguf"), "dequant-fixture")
    w.add_string("fixture.note", "tensor X.blocks holds random blocks of type X; X.expected is gguf.quants.dequantize of them")
    for name in ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]:
        t = Q[name]
        block, size = gguf.GGML_QUANT_SIZES[t]
        rows, cols = 3, 512
        nblocks = rows * cols // block
        raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
        if name in F16_FIELDS:
            for off in F16_FIELDS[name]:
                d = rng.normal(0, 0.05, size=nblocks).astype(np.float16)
                if name in ("Q5_1", "Q4_K", "Q5_K") and off == 2:
                    d = np.abs(d)
                raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
        elif name in ("F16", "BF16", "F32"):
            # finite values of every magnitude the models use
            vals = rng.normal(0, 1, size=rows * cols).astype(np.float32) * np.exp(rng.normal(0, 2, size=rows * cols)).astype(np.float32)
            if name == "F16":
                raw = vals.astype(np.float16).view(np.uint8).reshape(nblocks, size)
            elif name == "BF16":
                raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(nblocks, size)
            else:
                raw = vals.view(np.uint8).reshape(nblocks, size)
        data = raw.reshape(rows, cols // block * size)
        expected = dequantize(data, t).astype(np.float32)
        assert expected.shape == (rows, cols) and np.isfinite(expected).all(), name
        w.add_tensor(f"{name.lower()}.blocks", data, raw_shape=data.shape, raw_dtype=t)
        w.add_tensor(f"{name.lower()}.expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", (OUT / "dequant.gguf").relative_to(ROOT))


# --------------------------------------------------------------------------------------------------
# Tokenizers of the model fixtures
# --------------------------------------------------------------------------------------------------

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def train_bpe(n_vocab: int, specials: list[str], specials_first: bool, regex: str):
    from tokenizers import Regex, Tokenizer, AddedToken, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    n_regular = n_vocab - len(specials)
    trainer = trainers.BpeTrainer(vocab_size=n_vocab if specials_first else n_regular, min_frequency=0,
                                  show_progress=False, special_tokens=list(specials) if specials_first else [],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(qwen_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tok.get_vocab_size() == n_vocab, tok.get_vocab_size()
    return tok


def write_bpe_tokenizer(dst: Path, tok, cfg: dict) -> None:
    tok.save(str(dst / "tokenizer.json"), pretty=True)
    tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    write_json(dst / "tokenizer_config.json", {"added_tokens_decoder": added_tokens_decoder(tj),
                                               "tokenizer_class": "PreTrainedTokenizerFast", **cfg})


def train_spm(dst: Path, n_vocab: int) -> None:
    import sentencepiece as spm
    text = [p.replace("\n", " ") for p in qwen_corpus()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_prefix=str(dst / "tokenizer"), vocab_size=n_vocab, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", minloglevel=2, max_sentence_length=1 << 16)
    (dst / "tokenizer.vocab").unlink()
    write_json(dst / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": MISTRAL_CHAT_TEMPLATE, "tokenizer_class": "LlamaTokenizer", "legacy": True})


# --------------------------------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------------------------------

def family_specs() -> dict:
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig
    common = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                  tie_word_embeddings=False, num_experts_per_tok=2)
    std = dict(embed=1.0, lm_head=0.35, lm_head_row_lognormal=0.5, linear=0.15, router=0.3, shared_gate=0.15)
    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return {
        "olmoe": dict(
            # llama.cpp's olmoe has k_norm over n_embd: as many KV heads as heads.
            config=lambda v: OlmoeConfig(vocab_size=v, intermediate_size=256, num_key_value_heads=4, num_experts=3,
                                         rope_theta=10000.0, rms_norm_eps=1e-5, norm_topk_prob=False, clip_qkv=None,
                                         bos_token_id=None, eos_token_id=v - 2, pad_token_id=v - 1, **common),
            vocab=512, tokenizer=("bpe", ["<|endoftext|>", "<|padding|>"], False, GPT2_REGEX), pre="olmo",
            tok_cfg=dict(add_bos_token=False, bos_token=None, eos_token="<|endoftext|>", pad_token="<|padding|>",
                         chat_template=OLMOE_CHAT_TEMPLATE), std=std),
        "qwen2moe": dict(
            config=lambda v: Qwen2MoeConfig(vocab_size=v, intermediate_size=512, moe_intermediate_size=256,
                                            shared_expert_intermediate_size=256, num_key_value_heads=1, num_experts=3,
                                            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False,
                                            rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False,
                                            bos_token_id=v - 3, eos_token_id=v - 1, **common),
            vocab=512, tokenizer=("bpe", qwen_specials, False, QWEN_PRETOKENIZE_REGEX), pre="qwen2",
            tok_cfg=dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         chat_template=QWEN_CHAT_TEMPLATE), std=std),
        "qwen3moe": dict(
            config=lambda v: Qwen3MoeConfig(vocab_size=v, intermediate_size=512, moe_intermediate_size=256,
                                            num_key_value_heads=1, head_dim=64, num_experts=3, decoder_sparse_step=1,
                                            mlp_only_layers=[], norm_topk_prob=True, rope_theta=1e6,
                                            rms_norm_eps=1e-6, use_sliding_window=False,
                                            bos_token_id=v - 3, eos_token_id=v - 1, **common),
            vocab=512, tokenizer=("bpe", qwen_specials, False, QWEN_PRETOKENIZE_REGEX), pre="qwen2",
            tok_cfg=dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         chat_template=QWEN3_CHAT_TEMPLATE), std=std),
        "mixtral": dict(
            config=lambda v: MixtralConfig(vocab_size=v, intermediate_size=256, num_key_value_heads=1,
                                           num_local_experts=3, rope_theta=1e6, rms_norm_eps=1e-5,
                                           sliding_window=None, bos_token_id=1, eos_token_id=2, **common),
            vocab=512, tokenizer=("spm",), pre=None, tok_cfg={}, std=std),
    }


HUB_EXPERT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}


def hub_state_dict(family: str, model) -> dict:
    """The model's weights under the per-expert names the published checkpoints use."""
    prefix, g, u, d = HUB_EXPERT_NAMES.get(family, ("mlp", "gate_proj", "up_proj", "down_proj"))
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(torch.bfloat16).contiguous()
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k.removesuffix("mlp.experts.gate_up_proj") + prefix + ".experts"
            ff = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}.{e}.{g}.weight"] = v[e, :ff].clone()
                out[f"{base}.{e}.{u}.weight"] = v[e, ff:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            base = k.removesuffix("mlp.experts.down_proj") + prefix + ".experts"
            for e in range(v.shape[0]):
                out[f"{base}.{e}.{d}.weight"] = v[e].clone()
        elif family == "mixtral" and k.endswith("mlp.gate.weight"):
            out[k.replace("mlp.gate.weight", "block_sparse_moe.gate.weight")] = v
        else:
            out[k] = v
    return out


def published_config_json(model_config) -> dict:
    d = model_config.to_dict()
    rope = d.pop("rope_parameters", None) or {}
    d["rope_theta"] = rope.get("rope_theta", d.get("rope_theta"))
    d["torch_dtype"] = "bfloat16"
    d.pop("dtype", None)
    if d.get("model_type") == "qwen3_moe" and "num_local_experts" in d:
        d["num_experts"] = d.pop("num_local_experts")
    return dict(sorted(d.items()))


def build_hf_model(family: str, spec: dict, work: Path) -> Path:
    import safetensors.torch
    from transformers import AutoModelForCausalLM
    dst = work / family
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    kind = spec["tokenizer"][0]
    if kind == "bpe":
        _, specials, first, regex = spec["tokenizer"]
        write_bpe_tokenizer(dst, train_bpe(spec["vocab"], specials, first, regex), spec["tok_cfg"])
    else:
        train_spm(dst, spec["vocab"])
    config = spec["config"](spec["vocab"])
    torch.manual_seed(SEED)
    cls = AutoModelForCausalLM.from_config(config).__class__
    config.architectures = [cls.__name__]
    model = cls(config).eval()
    init_weights(model, spec["std"], SEED)
    model = model.to(torch.bfloat16).float()
    safetensors.torch.save_file(hub_state_dict(family, model), str(dst / "model.safetensors"), metadata={"format": "pt"})
    write_json(dst / "config.json", published_config_json(config))
    # The rewritten checkpoint must load back to exactly the same weights and config.
    back = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    sa, sb = model.state_dict(), back.state_dict()
    if sa.keys() != sb.keys() or any(not torch.equal(sa[k], sb[k]) for k in sa):
        raise SystemExit(f"{family}: the hub-named checkpoint does not load back to the same weights")
    da, db = model.config.to_dict(), back.config.to_dict()
    diff = {k for k in set(da) | set(db) if da.get(k) != db.get(k)} - {"dtype", "_name_or_path"}
    if diff:
        raise SystemExit(f"{family}: config.json reads back differently: {sorted(diff)}")
    return dst


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


CONVERT_SHIM = r"""
import sys
sys.argv = [sys.argv[0]] + sys.argv[2:]
pre = __import__("os").environ["WGMOE_PRE"]
sys.path.insert(0, LLAMA)
import conversion.base as base
if pre:
    # The fixtures' own tokenizers have hashes the converter does not know: say which llama.cpp
    # pre-tokenizer they are for.
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import runpy
runpy.run_path(LLAMA + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert(llama: Path, src: Path, out: Path, pre: str | None, vocab_only: bool = False) -> None:
    shim = f"LLAMA = {str(llama)!r}\n" + CONVERT_SHIM
    cmd = [sys.executable, "-c", shim, "x", str(src), "--outfile", str(out), "--outtype", "f16"]
    if vocab_only:
        cmd.append("--vocab-only")
    env = dict(os.environ, WGMOE_PRE=pre or "")
    env.pop("NO_LOCAL_GGUF", None)  # the converter needs its own gguf-py (newer than PyPI's)
    run(cmd, env=env, cwd=str(llama))


def build_logits_tool(llama: Path, work: Path) -> Path:
    exe = work / "llamacpp_logits"
    b = llama / "build"
    libs = [b / "src" / "libllama.a", b / "ggml" / "src" / "libggml.a", b / "ggml" / "src" / "libggml-cpu.a",
            b / "ggml" / "src" / "libggml-base.a"]
    run(["g++", "-O2", "-std=c++17", ROOT / "tools" / "llamacpp_logits.cpp", "-I", llama / "include",
         "-I", llama / "ggml" / "include", "-o", exe, *libs, "-lpthread", "-fopenmp", "-ldl"])
    return exe


def llama_tokenize(llama: Path, model: Path, text: str, bos: bool) -> list[int]:
    cmd = [llama / "build" / "bin" / "llama-tokenize", "-m", model, "--ids", "--log-disable", "-p", text]
    if not bos:
        cmd.append("--no-bos")
    out = run(cmd).stdout.strip().splitlines()
    return json.loads(out[-1])


QUANTS = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K"]
EXTRA_QUANTS = {"qwen3moe": ["Q5_K_M"]}
# f16 files are the largest (2 bytes a weight): kept for these families only.
F16_FAMILIES = ["qwen3moe", "mixtral"]
PROMPTS = {
    "olmoe": ["The quick brown fox", "<|user|>\nWhat is the capital of France?\n<|assistant|>\n"],
    "qwen2moe": ["Once upon a time", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"],
    "qwen3moe": ["def add(a, b):\n    return", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"],
    "mixtral": ["Weather report: cloudy", "[INST] Tell me a story [/INST]"],
}


def gguf_tensor_types(path: Path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(path))
    counts: dict = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def write_hf_qk(family: str, src: Path, dst: Path) -> None:
    """Layer 0's q_proj and k_proj, first 4 input columns, as the HF checkpoint holds them: the
    reference for the Q/K row order of the GGUF files (permuted for llama/Mixtral only)."""
    import safetensors.torch
    sd = safetensors.torch.load_file(str(src / "model.safetensors"))
    out = {}
    for p in ["q_proj", "k_proj"]:
        w = sd[f"model.layers.0.self_attn.{p}.weight"].float()
        out[p] = {"shape": list(w.shape), "cols": 4, "rows": w[:, :4].tolist()}
    write_json(dst / "hf_qk.json", out)


def make_models(llama: Path, work: Path, report: list) -> None:
    exe = build_logits_tool(llama, work)
    for family, spec in family_specs().items():
        src = build_hf_model(family, spec, work)
        dst = OUT / family
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        shutil.copy(src / "config.json", dst / "config.json")
        if family in F16_FAMILIES:
            write_hf_qk(family, src, dst)
        f16 = work / f"{family}-F16.gguf"
        convert(llama, src, f16, spec["pre"])
        files = {}
        if family in F16_FAMILIES:
            shutil.copy(f16, dst / f"{family}-F16.gguf")
            files["F16"] = dst / f"{family}-F16.gguf"
        for q in QUANTS + EXTRA_QUANTS.get(family, []):
            out = dst / f"{family}-{q}.gguf"
            run([llama / "build" / "bin" / "llama-quantize", f16, out, q, "1"])
            files[q] = out
        goldens = {"llama_cpp": LLAMA_VERSION, "n_predict": 8, "top_k": 8, "files": {}}
        prompts = [llama_tokenize(llama, f16, p, True) for p in PROMPTS[family]]
        for q, path in files.items():
            lines = run([exe, path, 8, 8, *[",".join(map(str, p)) for p in prompts]]).stdout.strip().splitlines()
            goldens["files"][path.name] = [json.loads(l) for l in lines]
            report.append((path.relative_to(OUT), gguf_tensor_types(path), path.stat().st_size))
        goldens["prompt_texts"] = PROMPTS[family]
        write_json(dst / "goldens.json", goldens)
        print("wrote", dst.relative_to(ROOT), [p.name for p in files.values()])


# --------------------------------------------------------------------------------------------------
# Tokenizers: vocab-only files and llama-tokenize ids
# --------------------------------------------------------------------------------------------------

TOKENIZE_STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,   three inside, trailing   ",
    "tabs\tand\nnew\n\nlines\r\n and \u00a0no-break",
    "café naïve Ελληνικά русский 日本語 中文 한국어",
    "emoji 🦙🚀👍🏽 and ZWJ 😶\u200d🌫️",
    "digits 1 12 123 1234 12345 3.14159 1,000,000 2024-06-01",
    "def f(x):\n    return x**2 + 1  # comment\n\n\tpass",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|user|>\nhello\n<|assistant|>\nhi<|endoftext|>",
    "<s>[INST] hello [/INST] answer</s>",
    "<|endoftext|><|endoftext|>",
    " ",
    "\n\n\n",
    "a",
]


def make_tokenizers(llama: Path, work: Path) -> None:
    dst = OUT / "tokenizers"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    sources = []
    # The fixtures' 2048-token byte-level BPE (Qwen specials) under three pre-tokenizers, Mistral's specials
    # under GPT-2's, the real OLMo tokenizer, and SentencePiece (llama) vocabularies.
    for name, model_dir, pre in [("qwen2", "qwen2moe-tiny", "qwen2"), ("default", "qwen2moe-tiny", "default"),
                                 ("gpt2", "mixtral-tiny", "gpt-2"), ("olmo", "olmoe-tiny", "olmo")]:
        sources.append((name, ROOT / "models" / model_dir, pre))
    spm_dir = work / "spm2048"
    if spm_dir.exists():
        shutil.rmtree(spm_dir)
    spm_dir.mkdir(parents=True)
    train_spm(spm_dir, 2048)
    shutil.copy(ROOT / "models" / "mixtral-tiny" / "config.json", spm_dir / "config.json")
    cfg = json.loads((spm_dir / "config.json").read_text())
    cfg["vocab_size"] = 2048
    write_json(spm_dir / "config.json", cfg)
    sources.append(("llama-spm", spm_dir, None))
    sources.append(("llama-spm512", work / "mixtral", None))
    for name, src, pre in sources:
        tmp = work / f"vocab-{name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for f in src.iterdir():
            if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
                shutil.copy(f, tmp / f.name)
        out = dst / f"{name}.gguf"
        convert(llama, tmp, out, pre, vocab_only=True)
        ids = []
        for s in TOKENIZE_STRINGS:
            ids.append({"text": s, "ids": llama_tokenize(llama, out, s, True),
                        "ids_no_bos": llama_tokenize(llama, out, s, False)})
        write_json(dst / f"{name}.json", {"llama_cpp": LLAMA_VERSION, "file": out.name, "cases": ids})
        print("wrote", out.relative_to(ROOT), out.stat().st_size)


def write_readme(report: list) -> None:
    rows = "\n".join(f"| `{p}` | {', '.join(f'{k} x{v}' for k, v in t.items())} | {s / 1e6:.2f} MB |"
                     for p, t, s in report)
    (OUT / "README.md").write_text(f"""# GGUF fixtures

Made by `tools/make_gguf_fixtures.py` (run `tools/build_llamacpp.sh` first) with llama.cpp from the
{LLAMA_VERSION}, built for the CPU with `GGML_NATIVE=OFF` and AVX2/FMA/F16C, and PyPI's `gguf` 0.19.0.

- `dequant.gguf`: for each type wgmoe computes with (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K,
  Q6_K), `<type>.blocks` holds 3 rows of 512 elements of random blocks (scale fields finite), and
  `<type>.expected` their dequantisation by `gguf.quants.dequantize` (f32).
- `<family>/`: a random-weight model of each family (hidden 256, 2 layers, 4 heads of 64, 3 experts top-2,
  expert intermediate 256, vocab 512; OLMoE with 4 KV heads as llama.cpp's olmoe needs, the others 1;
  Qwen2-MoE with a shared expert of 256) made with transformers, saved under the published per-expert names,
  converted by llama.cpp's `convert_hf_to_gguf.py --outtype f16` and quantised by `llama-quantize`.
  `config.json` is the Hugging Face config it was converted from (weights not kept). The BPE vocabularies
  are trained on the fixtures' corpus (pre-tokenizer names given to the converter: `olmo`, `qwen2`); Mixtral
  has a SentencePiece BPE (byte fallback), so its files are `tokenizer.ggml.model = llama` and its Q/K rows
  are permuted by the converter. f16 files are kept for {', '.join(F16_FAMILIES)} only (the largest).
  `goldens.json`: for each file and prompt (ids from `llama-tokenize` on the f16 file), llama.cpp's 8 greedy
  tokens and, per step, the top-8 raw logits and the top-1/top-2 gap (tools/llamacpp_logits.cpp, CPU, 2
  threads). `hf_qk.json` (f16 families): layer 0's HF `q_proj`/`k_proj`, first 4 input columns, the
  reference for the Q/K row order (permuted by the converter for Mixtral only).
- `tokenizers/<name>.gguf`: vocab-only files (`--vocab-only`): `qwen2`, `default` (the 2048-token BPE of
  models/qwen2moe-tiny with those pre-tokenizer names), `gpt2` (models/mixtral-tiny's BPE as `gpt-2`), `olmo`
  (models/olmoe-tiny's real OLMo tokenizer), `llama-spm` (a 2048-piece SentencePiece BPE) and `llama-spm512`
  (the Mixtral model's). `<name>.json`: `llama-tokenize --ids` of each string, with and without the BOS
  (special tokens parsed, as llama-tokenize does by default).

| file | tensor types | size |
| --- | --- | --- |
{rows}
""", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=str(ROOT / ".llamacpp" / "llama.cpp"))
    ap.add_argument("--only", default="dequant,models,tokenizers")
    a = ap.parse_args()
    llama = Path(a.llama_cpp).resolve()
    parts = set(a.only.split(","))
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    work = ROOT / ".llamacpp" / "work"
    work.mkdir(parents=True, exist_ok=True)
    if "dequant" in parts:
        make_dequant(np.random.default_rng(SEED))
    report: list = []
    if "models" in parts:
        make_models(llama, work, report)
        write_readme(report)
        write_json(work / "report.json", [[str(p), t, s] for p, t, s in report])
    if "tokenizers" in parts:
        if not (work / "mixtral").is_dir():
            raise SystemExit("run with --only models first (the llama-spm512 vocabulary is the Mixtral model's)")
        make_tokenizers(llama, work)
    if "models" not in parts and (work / "report.json").is_file():
        write_readme([(Path(p), t, s) for p, t, s in json.loads((work / "report.json").read_text())])


if __name__ == "__main__":
    main()
