#!/usr/bin/env python3
"""Load the committed fixtures back the way a user would and check them against their goldens.

    .venv/bin/python tools/check_fixtures.py                      # every fixture under models/
    .venv/bin/python tools/check_fixtures.py qwen3moe-tiny mixtral-tiny

For each fixture: AutoTokenizer and AutoModelForCausalLM.from_pretrained(models/<fixture>, dtype=float32)
(transformers' own loading, hub tensor names and all), then
- the tokenizer reproduces the golden prompt ids from the golden texts;
- prompt logits at every position: with the goldens' settings (eager attention and experts) they round to the
  golden f16 values exactly; with transformers' defaults they are within 2e-3 + 2^-10 |golden|;
- model.generate (greedy, KV cache: a different code path from the goldens' full recompute) gives the golden
  tokens, and its per-step logits are within that bound of the golden step logits.
Also prints a summary: config, tensor names (layer index and expert index folded into {L} and {E}) with
shapes, and file sizes. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import safetensors
import safetensors.torch
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
GOLDENS = MODELS / "goldens"

torch.set_num_threads(1)

CONFIG_KEYS = ["model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
               "num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob", "mlp_only_layers",
               "decoder_sparse_step", "sliding_window", "vocab_size", "rope_theta", "rope_parameters",
               "rms_norm_eps", "bos_token_id", "eos_token_id"]


def within(ours: torch.Tensor, golden: torch.Tensor, exact: bool) -> tuple[bool, float]:
    """exact: ours rounded to f16 must equal the golden (same computation as the goldens). Otherwise
    |d| <= 2e-3 + 2^-10 |g|: f16 rounding of the golden plus f32 summation-order differences of other
    attention / expert kernels and of the KV cache."""
    d = (ours - golden).abs()
    if exact:
        return bool(torch.equal(ours.to(torch.float16).float(), golden)), float(d.max())
    return bool((d <= 2e-3 + golden.abs() * 2.0 ** -10).all()), float(d.max())


def summary(name: str) -> None:
    d = MODELS / name
    cfg = json.loads((d / "config.json").read_text())
    print(f"--- {name}: config.json", {k: cfg[k] for k in CONFIG_KEYS if k in cfg})
    print("    generation_config.json", json.loads((d / "generation_config.json").read_text()))
    groups: dict[str, set] = defaultdict(set)
    for f in sorted(d.glob("*.safetensors")):
        with safetensors.safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                pattern = re.sub(r"\.experts\.\d+\.", ".experts.{E}.", re.sub(r"^model\.layers\.\d+\.", "model.layers.{L}.", k))
                layer = re.match(r"^model\.layers\.(\d+)\.", k)
                groups[(pattern, tuple(sf.get_slice(k).get_shape()), sf.get_slice(k).get_dtype())].add(
                    int(layer.group(1)) if layer else -1)
    print("    tensors (pattern, shape, dtype, layers):")
    for (pattern, shape, dtype), layers in sorted(groups.items()):
        where = "" if layers == {-1} else f" layers {sorted(layers)}"
        print(f"      {pattern} {list(shape)} {dtype}{where}")
    for f in sorted(d.iterdir()):
        print(f"    {f.stat().st_size:>9}  {f.name}")
    for f in sorted(GOLDENS.glob(f"{name}.*safetensors")):
        print(f"    {f.stat().st_size:>9}  goldens/{f.name}")


@torch.no_grad()
def check(name: str) -> list[str]:
    d = MODELS / name
    golden = safetensors.torch.load_file(str(GOLDENS / f"{name}.safetensors"))
    with safetensors.safe_open(str(GOLDENS / f"{name}.safetensors"), framework="pt") as f:
        meta = f.metadata()
    errors = []
    tok = AutoTokenizer.from_pretrained(d)
    prompts = []
    for p in range(2):
        ids = golden[f"p{p}.prompt_ids"].tolist()
        enc = tok(meta[f"p{p}.text"])["input_ids"]
        if enc != ids:
            errors.append(f"{name} p{p}: tokenizer gives {enc}, golden {ids}")
        prompts.append(ids)
    for exact in (True, False):
        # exact: the goldens' own settings (eager attention and experts); else transformers' defaults
        kwargs = {"attn_implementation": "eager", "experts_implementation": "eager"} if exact else {}
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kwargs).eval()
        impl = (f"attn {model.config._attn_implementation}, experts "
                f"{getattr(model.config, '_experts_implementation', '?')}")
        for p, ids in enumerate(prompts):
            x = torch.tensor([ids])
            logits = model(x).logits[0].float()
            ok, dmax = within(logits, golden[f"p{p}.prompt_logits"].float(), exact)
            print(f"{name} [{type(model).__name__}, {impl}] p{p}: prompt logits "
                  f"{'f16-equal' if exact and ok else f'max |d| {dmax:.2e}'}" + ("" if ok else "  MISMATCH"))
            if not ok:
                errors.append(f"{name} {impl} p{p}: prompt logits differ by {dmax}")
            n_new = golden[f"p{p}.generated_ids"].numel()
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n_new, do_sample=False,
                                 temperature=None, top_k=None, top_p=None, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id or 0)
            gen = out.sequences[0, len(ids):].tolist()
            want = golden[f"p{p}.generated_ids"].tolist()
            steps = torch.stack([s[0].float() for s in out.logits])
            ok2, dmax2 = within(steps[: len(gen)], golden[f"p{p}.step_logits"].float()[: len(gen)], False)
            same = gen == want
            print(f"{name} [{type(model).__name__}, {impl}] p{p}: generate (KV cache) tokens "
                  f"{'equal' if same else 'DIFFER'} ({len(gen)}/{n_new}), step logits max |d| {dmax2:.2e}"
                  + ("" if ok2 else "  MISMATCH"))
            if not same or not ok2:
                errors.append(f"{name} {impl} p{p}: generate gave {gen} (want {want}), step |d| {dmax2}")
    return errors


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in MODELS.iterdir()
                                   if p.is_dir() and (p / "config.json").is_file() and p.name != "configs")
    errors = []
    for name in names:
        summary(name)
        errors += check(name)
    if errors:
        print("\nFAILED:\n  " + "\n  ".join(errors))
        raise SystemExit(1)
    print(f"\nall {len(names)} fixtures load with transformers and match their goldens")


if __name__ == "__main__":
    main()
