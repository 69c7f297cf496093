#!/usr/bin/env python3
"""Side-by-side decode comparison of wgmoe and llama.cpp on one machine.

    python3 tools/compare_llamacpp.py MODEL --llama-cpp ~/llama.cpp [--prompts 4 --blocks 1 -n 64]

MODEL is either
  - a Hugging Face checkpoint directory: a fixture under models/ or the output of
    `wgmoe synth --format hf` (wgmoe's converted INT4 format is wgmoe's own; llama.cpp cannot read
    it). It is converted to GGUF Q4_0 for llama.cpp (step 2); wgmoe runs the directory itself; or
  - a GGUF file (a name ending in .gguf, or a file starting with the GGUF magic; the first file of
    a split GGUF), e.g. one made with llama-quantize ... Q4_K_M. Nothing is converted: BOTH
    runtimes run this same file as it is (`wgmoe bench FILE.gguf`, `llama-bench -m FILE.gguf`), and
    the llama.cpp rows are labelled with its file type (general.file_type, e.g. Q4_K_M).

Steps, all on this machine, one after the other (never concurrently):
  1. `wgmoe bench MODEL --prompts P --blocks B -n N --warmup W --json-out ...` (wgmoe's fixed
     prompt set, greedy, EOS suppressed); its records give the prompt token counts.
  2. Directories only: llama.cpp's own converter `python3 convert_hf_to_gguf.py MODEL_DIR --outtype
     f16`, then `llama-quantize F16.gguf Q4_0.gguf Q4_0` (cached in --work-dir, keyed on the model's
     files). A GGUF MODEL skips this step (and needs neither the converter nor llama-quantize).
  3. `llama-bench -m GGUF -p <mean wgmoe prompt tokens> -n N -r B*P -t THREADS -ngl 0 -o json`
     for the CPU backend, and again with `-ngl 99` for a GPU backend (Vulkan) when the build has one.
     Without llama-bench, `llama-cli` with the same prompt/token counts (its perf summary is parsed).
  4. A table: decode tok/s, TTFT / prefill tok/s, peak memory, with both runtimes' versions and
     backends.

llama.cpp is not installed by this tool: build it yourself (see docs/benchmarks.md, "Comparison with
llama.cpp"). This is a measuring tool, not a test; it is not run in CI. Python 3.8+, stdlib only
(llama.cpp's converter needs its own requirements: `pip install -r llama.cpp/requirements.txt`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class ToolError(Exception):
    """A problem the user can fix; printed without a traceback."""


# ---------------------------------------------------------------------------------------------
# Locating the programs


def find_llama_cpp(llama_dir: str | None, convert: bool = True) -> dict:
    """Paths of convert_hf_to_gguf.py, llama-quantize, llama-bench and llama-cli.

    With --llama-cpp DIR: DIR/convert_hf_to_gguf.py and the binaries in DIR/build/bin, DIR/bin or
    DIR. Without: the binaries on PATH and convert_hf_to_gguf.py next to them, on PATH, or in
    $LLAMA_CPP_DIR. convert=False (a GGUF model): the converter and llama-quantize may be missing.
    Raises ToolError naming what is missing and how to get it."""
    found: dict = {}
    missing = []
    search: list[Path] = []
    root = None
    if llama_dir is None and os.environ.get("LLAMA_CPP_DIR"):
        llama_dir = os.environ["LLAMA_CPP_DIR"]
    if llama_dir is not None:
        root = Path(llama_dir).expanduser()
        if not root.is_dir():
            raise ToolError(
                f"--llama-cpp {llama_dir}: not a directory. Give the path of a llama.cpp checkout "
                "(git clone https://github.com/ggml-org/llama.cpp) built with cmake "
                "(cmake -B build [-DGGML_VULKAN=ON] && cmake --build build --config Release -j)."
            )
        search = [root / "build" / "bin", root / "bin", root / "build", root]

    def binary(name: str) -> str | None:
        for d in search:
            p = d / name
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
        if root is None:
            return shutil.which(name)
        return None

    for name in ["llama-quantize", "llama-bench", "llama-cli"]:
        found[name] = binary(name)
    conv = None
    candidates = []
    if root is not None:
        candidates.append(root / "convert_hf_to_gguf.py")
    else:
        for name in ["llama-quantize", "llama-bench", "llama-cli"]:
            if found[name]:
                b = Path(found[name]).resolve().parent
                candidates += [b / "convert_hf_to_gguf.py", b.parent / "convert_hf_to_gguf.py",
                               b.parent.parent / "convert_hf_to_gguf.py"]
        w = shutil.which("convert_hf_to_gguf.py")
        if w:
            candidates.append(Path(w))
    for c in candidates:
        if c.is_file():
            conv = str(c)
            break
    found["convert_hf_to_gguf.py"] = conv
    if conv is None and convert:
        missing.append("convert_hf_to_gguf.py (in the root of a llama.cpp checkout)")
    if found["llama-quantize"] is None and convert:
        missing.append("llama-quantize")
    if found["llama-bench"] is None and found["llama-cli"] is None:
        missing.append("llama-bench (or llama-cli)")
    if missing:
        where = f"in {root} (looked in build/bin, bin, build and the root)" if root else \
            "on PATH (or give --llama-cpp DIR / set LLAMA_CPP_DIR)"
        raise ToolError(
            "llama.cpp not found: missing " + ", ".join(missing) + f" {where}.\n"
            "Install it first (the tool never builds it):\n"
            "  git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp\n"
            "  cmake -B build -DGGML_VULKAN=ON   # drop -DGGML_VULKAN=ON for a CPU-only build\n"
            "  cmake --build build --config Release -j\n"
            "  pip install -r requirements.txt   # for convert_hf_to_gguf.py\n"
            "then: python3 tools/compare_llamacpp.py MODEL --llama-cpp /path/to/llama.cpp"
        )
    return found


def find_wgmoe(arg: str | None) -> str:
    if arg:
        p = Path(arg)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ToolError(f"--wgmoe {arg}: not an executable file")
        return str(p)
    for p in [REPO / "target" / "release" / "wgmoe"]:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    w = shutil.which("wgmoe")
    if w:
        return w
    raise ToolError(
        "wgmoe not found: build it (cargo build --release, giving target/release/wgmoe), put it "
        "on PATH, or pass --wgmoe PATH"
    )


# ---------------------------------------------------------------------------------------------
# Running with peak memory


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, int | None, str]:
    """Run cmd to completion with stdout+stderr in `log`; (exit code, peak RSS bytes, output).

    The peak RSS is the child's own (wait4 rusage: Linux ru_maxrss is in KiB)."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env)
        rss = None
        try:
            _, status, ru = os.wait4(p.pid, 0)
            code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") \
                else (status >> 8)
            rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
            p.returncode = code
        except (AttributeError, ChildProcessError):
            code = p.wait()
    out = log.read_text(errors="replace")
    return code, rss, out


def check(code: int, cmd: list[str], out: str, what: str) -> None:
    if code != 0:
        tail = "\n".join(out.splitlines()[-25:])
        raise ToolError(f"{what} failed (exit {code}): {' '.join(cmd)}\n--- last lines ---\n{tail}")


# ---------------------------------------------------------------------------------------------
# The model


def safetensors_metadata(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header.get("__metadata__") or {}


def check_hf_model(model: Path) -> None:
    if not (model / "config.json").is_file():
        raise ToolError(f"{model}: no config.json (not a model directory)")
    shards = sorted(model.glob("*.safetensors"))
    if not shards:
        raise ToolError(f"{model}: no *.safetensors weights")
    if safetensors_metadata(shards[0]).get("wgmoe.format"):
        raise ToolError(
            f"{model} is in wgmoe's converted INT4 format, which llama.cpp cannot read. Use the "
            "Hugging Face checkpoint it came from, or a synthetic one written with "
            "`wgmoe synth --format hf -o DIR ...`"
        )


def model_key(model: Path) -> str:
    """A short hash of the model's files (names, sizes, mtimes) to cache the GGUF files."""
    h = hashlib.sha256()
    for p in sorted(model.iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:12]


GGUF_MAGIC = b"GGUF"

# llama.cpp's llama_ftype (include/llama.h), the value of general.file_type.
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


def is_gguf(model: Path) -> bool:
    """A GGUF file: a file named *.gguf, or any file starting with the GGUF magic."""
    if not model.is_file():
        return False
    if model.suffix.lower() == ".gguf":
        return True
    try:
        with open(model, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def gguf_metadata(path: Path) -> dict:
    """The scalar and string key/values of a GGUF file's header (arrays are skipped)."""
    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
               11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def read(fmt: str):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise ToolError(f"{path}: truncated GGUF header")
            return struct.unpack(fmt, b)[0]

        def string() -> str:
            return f.read(read("<Q")).decode("utf-8", errors="replace")

        if f.read(4) != GGUF_MAGIC:
            raise ToolError(f"{path}: not a GGUF file (no GGUF magic)")
        version = read("<I")
        if version < 2:
            raise ToolError(f"{path}: GGUF version {version} is too old (need 2 or later)")
        read("<Q")  # tensor count
        n_kv = read("<Q")
        meta: dict = {"gguf.version": version}
        for _ in range(n_kv):
            key = string()
            t = read("<I")
            if t == 8:
                meta[key] = string()
            elif t in scalars:
                meta[key] = read(scalars[t])
            elif t == 9:
                et, n = read("<I"), read("<Q")
                if et == 8:
                    for _ in range(n):
                        f.seek(read("<Q"), os.SEEK_CUR)
                elif et in scalars:
                    f.seek(n * struct.calcsize(scalars[et]), os.SEEK_CUR)
                else:
                    raise ToolError(f"{path}: GGUF key {key}: unsupported array type {et}")
            else:
                raise ToolError(f"{path}: GGUF key {key}: unknown value type {t}")
    return meta


def gguf_quant_label(path: Path) -> str:
    """The file type of a GGUF file (general.file_type), e.g. "Q4_K_M"; "GGUF" when unknown."""
    try:
        ft = gguf_metadata(path).get("general.file_type")
    except (OSError, ToolError):
        return "GGUF"
    if ft is None:
        return "GGUF"
    return GGUF_FILE_TYPES.get(ft, f"GGUF file type {ft}")


def convert_to_q4_0(model: Path, tools: dict, work: Path, python: str, force: bool) -> Path:
    key = model_key(model)
    f16 = work / f"{model.name}-{key}-f16.gguf"
    q4 = work / f"{model.name}-{key}-Q4_0.gguf"
    if q4.is_file() and not force:
        print(f"using cached {q4}", file=sys.stderr)
        return q4
    cmd = [python, tools["convert_hf_to_gguf.py"], str(model), "--outtype", "f16",
           "--outfile", str(f16)]
    code, _, out = run_measured(cmd, work / "convert.log")
    if code != 0 and "pre-tokenizer" in out:
        out += ("\n(llama.cpp's converter does not know this tokenizer: for a synthetic model's "
                "word-level tokenizer, or a new one, see convert_hf_to_gguf_update.py in llama.cpp)")
    check(code, cmd, out, "convert_hf_to_gguf.py")
    cmd = [tools["llama-quantize"], str(f16), str(q4), "Q4_0"]
    code, _, out = run_measured(cmd, work / "quantize.log")
    check(code, cmd, out, "llama-quantize")
    return q4


# ---------------------------------------------------------------------------------------------
# The two runtimes


def run_wgmoe(args, wgmoe: str, work: Path) -> list[dict]:
    """One row per configuration wgmoe bench measured (one, or the --resident-experts x
    --miss-policy sweep)."""
    out_json = work / "wgmoe-bench.json"
    cmd = [wgmoe, "bench", str(args.model), "--prompts", str(args.prompts), "--blocks",
           str(args.blocks), "-n", str(args.n), "--warmup", str(args.warmup), "--executor",
           args.executor, "--json-out", str(out_json)]
    if args.wgmoe_backend:
        cmd += ["--backend", args.wgmoe_backend]
    if args.wgmoe_adapter:
        cmd += ["--adapter", args.wgmoe_adapter]
    if args.resident_experts:
        cmd += ["--resident-experts", args.resident_experts]
    if args.miss_policy:
        cmd += ["--miss-policy", args.miss_policy]
    if args.resident_experts or args.miss_policy:
        # CPU experts use as many threads as llama.cpp gets.
        cmd += ["--cpu-threads", str(args.threads)]
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    code, rss, out = run_measured(cmd, work / "wgmoe-bench.log", env)
    check(code, cmd, out, "wgmoe bench")
    recs = json.loads(out_json.read_text())
    if not recs:
        raise ToolError("wgmoe bench wrote no records")
    return [wgmoe_row(r, rss) for r in recs]


def wgmoe_row(r: dict, rss) -> dict:
    config = f"{r['expert_precision']}/{r['executor']}"
    n, e = r.get("resident_experts_per_layer"), r.get("num_experts")
    if n is not None and e is not None and n < e:
        config += f", {n}/{e} experts resident, misses {r.get('miss_policy') or 'upload'}"
        if r.get("cpu_expert_seconds") is not None:
            config += f" (CPU experts {r['cpu_expert_seconds']:.2f} s)"
    return {
        "runtime": "wgmoe",
        "version": f"wgmoe {r['wgmoe_version']} ({r['git_revision'][:12]})",
        "backend": f"{r['backend']}: {r['adapter']}",
        "config": config,
        "decode_tok_s": r["decode_tokens_per_s"],
        "prefill_tok_s": r["prefill_tokens_per_s"],
        "ttft_s": r["ttft_s_mean"],
        "peak_rss_bytes": r.get("peak_rss_bytes") or rss,
        "peak_gpu_bytes": r.get("peak_gpu_bytes"),
        "prompt_tokens": r["prompt_tokens"],
        "note": "",
        "record": r,
    }


def llama_version(tools: dict) -> str:
    for name in ["llama-cli", "llama-bench", "llama-quantize"]:
        b = tools.get(name)
        if not b:
            continue
        try:
            p = subprocess.run([b, "--version"], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"version:\s*(\d+)\s*\(([0-9a-f]+)\)", p.stdout + p.stderr)
        if m:
            return f"llama.cpp b{m.group(1)} ({m.group(2)})"
        # e.g. "version: 0.5.0-dev (build 1, commit 0c1e570)" (builds without git history; a
        # source tree without .git, e.g. llama-cpp-python's vendor/llama.cpp: "commit unknown")
        m = re.search(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*(\w+)\)",
                      p.stdout + p.stderr)
        if m:
            return f"llama.cpp {m.group(1)} b{m.group(2)} ({m.group(3)})"
    return "llama.cpp (version unknown)"


def parse_llama_bench(out: str) -> list[dict]:
    """llama-bench -o json: a JSON array (possibly after log lines)."""
    start = out.find("[")
    while start != -1:
        try:
            v = json.loads(out[start:])
            if isinstance(v, list):
                return v
        except json.JSONDecodeError:
            pass
        start = out.find("[", start + 1)
    # -o jsonl: one object per line
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if not rows:
        raise ToolError("could not find llama-bench's JSON output")
    return rows


def is_gpu_backend(backends: str) -> bool:
    return any(b in backends.lower() for b in ["vulkan", "cuda", "metal", "rocm", "hip", "sycl",
                                               "opencl"])


def run_llama_bench(tools, q4: Path, ngl: int, p_tokens: int, args, work: Path,
                    version: str, quant: str = "Q4_0") -> dict:
    reps = max(1, args.blocks * args.prompts)
    cmd = [tools["llama-bench"], "-m", str(q4), "-p", str(p_tokens), "-n", str(args.n), "-r",
           str(reps), "-t", str(args.threads), "-ngl", str(ngl), "-o", "json"]
    # In a GPU build, -ngl 0 still lets llama.cpp use the GPU device (KV cache, op offload, host
    # buffers): -dev none makes the CPU row a CPU-only run, as in a CPU-only build.
    cpu_only = ngl == 0 and bench_has_device_flag(tools["llama-bench"])
    if cpu_only:
        cmd += ["-dev", "none"]
    code, rss, out = run_measured(cmd, work / f"llama-bench-ngl{ngl}.log")
    check(code, cmd, out, "llama-bench")
    rows = parse_llama_bench(out)
    pp = next((r for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), None)
    tg = next((r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), None)
    if tg is None:
        raise ToolError(f"llama-bench printed no generation test: {rows}")
    any_row = tg or pp
    backends = str(any_row.get("backends") or any_row.get("backend") or "?")
    if any_row.get("build_commit") and any_row["build_commit"] != "unknown":
        version = f"llama.cpp b{any_row.get('build_number', '?')} ({any_row['build_commit']})"
    gpu_info = str(any_row.get("gpu_info") or "")
    device = gpu_info or any_row.get("devices") or ""
    if ngl == 0 or not is_gpu_backend(backends):
        device = any_row.get("cpu_info") or device
    # A GPU build lists its backend ("Vulkan") even when it found no device: then -ngl 99 ran on
    # the CPU. ggml-vulkan skips CPU-type devices (lavapipe/llvmpipe, SwiftShader) unless
    # GGML_VK_VISIBLE_DEVICES names them.
    gpu = ngl > 0 and is_gpu_backend(backends) and bool(gpu_info)
    if ngl > 0 and is_gpu_backend(backends) and not gpu_info:
        print(f"llama.cpp: {backends} build found no GPU device (llama-bench gpu_info is empty): "
              "the -ngl 99 run used the CPU. For a CPU-type Vulkan device (lavapipe) set "
              "GGML_VK_VISIBLE_DEVICES=0.", file=sys.stderr)
    if cpu_only:
        backends = "CPU"
    pp_ts = pp.get("avg_ts") if pp else None
    return {
        "runtime": "llama.cpp",
        "version": version,
        "backend": f"{backends}{': ' + str(device) if device else ''}",
        "config": f"{quant} -ngl {ngl} -t {args.threads}",
        "decode_tok_s": tg.get("avg_ts"),
        "prefill_tok_s": pp_ts,
        # llama-bench times prompt processing alone: TTFT ~ prompt tokens / prefill rate.
        "ttft_s": (p_tokens / pp_ts) if pp_ts else None,
        "peak_rss_bytes": rss,
        "peak_gpu_bytes": None,
        "note": f"llama-bench pp{p_tokens}/tg{args.n} x{reps} (tg on an empty context)"
                + (" -dev none" if cpu_only else ""),
        "gpu": gpu,
    }


def bench_has_device_flag(bench: str) -> bool:
    """Whether this llama-bench has -dev/--device (newer builds)."""
    try:
        p = subprocess.run([bench, "--help"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--device" in (p.stdout + p.stderr)


PERF_RE = {
    "prompt": re.compile(r"prompt eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*tokens"),
    "eval": re.compile(r"(?<!prompt )eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*(?:runs|tokens)"),
}


def parse_llama_cli_perf(out: str) -> tuple[float | None, float | None]:
    """(prefill tok/s, decode tok/s) from llama-cli's `llama_perf_context_print` summary."""
    pre = dec = None
    m = PERF_RE["prompt"].search(out)
    if m and float(m.group(1)) > 0:
        pre = int(m.group(2)) / (float(m.group(1)) / 1e3)
    ms = [m for m in PERF_RE["eval"].finditer(out)]
    if ms and float(ms[-1].group(1)) > 0:
        dec = int(ms[-1].group(2)) / (float(ms[-1].group(1)) / 1e3)
    return pre, dec


def run_llama_cli(tools, q4: Path, ngl: int, prompts: list[str], args, work: Path,
                  version: str, quant: str = "Q4_0") -> dict:
    """llama-cli on wgmoe's own prompt texts, greedy, EOS ignored, same new-token count."""
    pre_t = pre_n = dec_t = dec_n = 0.0
    peak = 0
    backends = "CPU" if ngl == 0 else "GPU (-ngl 99)"
    for k in range(args.blocks):
        for i, text in enumerate(prompts):
            cmd = [tools["llama-cli"], "-m", str(q4), "-p", text, "-n", str(args.n), "-t",
                   str(args.threads), "-ngl", str(ngl), "--temp", "0", "--ignore-eos", "-no-cnv",
                   "--seed", "0"]
            code, rss, out = run_measured(cmd, work / f"llama-cli-ngl{ngl}-{k}-{i}.log")
            check(code, cmd, out, "llama-cli")
            peak = max(peak, rss or 0)
            pre, dec = parse_llama_cli_perf(out)
            if dec is None:
                raise ToolError("could not parse llama-cli's perf summary (eval time)")
            m = PERF_RE["prompt"].search(out)
            pre_n += int(m.group(2)) if m else 0
            pre_t += float(m.group(1)) / 1e3 if m else 0
            ms = list(PERF_RE["eval"].finditer(out))
            dec_n += int(ms[-1].group(2))
            dec_t += float(ms[-1].group(1)) / 1e3
            if "vulkan" in out.lower():
                backends = "Vulkan" if ngl else "CPU (Vulkan build)"
    n_resp = max(1, args.blocks * len(prompts))
    return {
        "runtime": "llama.cpp",
        "version": version,
        "backend": backends,
        "config": f"{quant} -ngl {ngl} -t {args.threads}",
        "decode_tok_s": dec_n / dec_t if dec_t else None,
        "prefill_tok_s": pre_n / pre_t if pre_t else None,
        "ttft_s": pre_t / n_resp if pre_t else None,
        "peak_rss_bytes": peak or None,
        "peak_gpu_bytes": None,
        "note": "llama-cli, wgmoe's prompt texts (llama.cpp's tokenizer), pooled rates",
        "gpu": ngl > 0 and "vulkan" in backends.lower(),
    }


# ---------------------------------------------------------------------------------------------
# Output


def human(b) -> str:
    if b is None:
        return "-"
    b = float(b)
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"]:
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1024
    return "-"


def fmt(v, spec) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    head = ["runtime", "configuration", "decode tok/s", "prefill tok/s", "TTFT s", "peak RSS",
            "peak GPU"]
    body = [[r["runtime"], r["config"], fmt(r["decode_tok_s"], ".2f"), fmt(r["prefill_tok_s"], ".1f"),
             fmt(r["ttft_s"], ".3f"), human(r["peak_rss_bytes"]), human(r["peak_gpu_bytes"])]
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in
                       enumerate(zip(head, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for b in body:
        lines.append("  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in
                               enumerate(zip(b, widths))))
    lines.append("")
    for r in rows:
        lines.append(f"{r['runtime']} [{r['config']}]: {r['version']}; backend {r['backend']}"
                     + (f"; {r['note']}" if r.get("note") else ""))
    for w in rows:
        if w["runtime"] != "wgmoe" or not w["decode_tok_s"]:
            continue
        for r in rows:
            if r["runtime"] != "wgmoe" and r["decode_tok_s"]:
                lines.append(f"wgmoe [{w['config']}] / llama.cpp [{r['config']}] decode: "
                             f"{w['decode_tok_s'] / r['decode_tok_s']:.2f}x")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Measure wgmoe and llama.cpp side by side on one machine (a Hugging Face "
                    "directory: llama.cpp gets its Q4_0 conversion; a GGUF file: both run it as "
                    "is): decode tok/s, TTFT/prefill, peak memory.",
        epilog="llama.cpp is not installed by this tool; see docs/benchmarks.md, 'Comparison with "
               "llama.cpp'.")
    ap.add_argument("model", type=Path,
                    help="Hugging Face model directory (fixture, or `wgmoe synth --format hf` "
                         "output; converted to Q4_0 for llama.cpp), or a GGUF file that both "
                         "runtimes run as is")
    ap.add_argument("--llama-cpp", metavar="DIR",
                    help="llama.cpp checkout with convert_hf_to_gguf.py and built binaries "
                         "(build/bin); default: binaries on PATH, or $LLAMA_CPP_DIR")
    ap.add_argument("--wgmoe", metavar="PATH", help="wgmoe binary (default: target/release/wgmoe, "
                                                     "then PATH)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts of wgmoe's set (default 4)")
    ap.add_argument("--blocks", type=int, default=1, help="repetitions (default 1)")
    ap.add_argument("-n", type=int, default=64, help="new tokens per response (default 64)")
    ap.add_argument("--warmup", type=int, default=1, help="wgmoe warm-up responses (default 1)")
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count() or 1,
                    help="llama.cpp CPU threads (default: all cores)")
    ap.add_argument("--backends", default="cpu,vulkan",
                    help="llama.cpp runs: cpu (-ngl 0), vulkan (-ngl 99, skipped when the build "
                         "has no GPU backend); default cpu,vulkan")
    ap.add_argument("--executor", default="grouped", help="wgmoe executor (default grouped)")
    ap.add_argument("--wgmoe-backend", help="wgmoe --backend")
    ap.add_argument("--wgmoe-adapter", help="wgmoe --adapter")
    ap.add_argument("--resident-experts", metavar="LIST",
                    help="wgmoe bench --resident-experts sweep, e.g. 0,64 (0: every routed "
                         "expert on the CPU, llama.cpp's --cpu-moe); CPU experts get --threads")
    ap.add_argument("--miss-policy", metavar="LIST",
                    help="wgmoe bench --miss-policy sweep (upload,cpu,auto)")
    ap.add_argument("--llama-runner", choices=["auto", "bench", "cli"], default="auto",
                    help="llama-bench (synthetic prompt of the same token count) or llama-cli "
                         "(wgmoe's prompt texts); auto: llama-bench when present")
    ap.add_argument("--work-dir", type=Path,
                    help="where GGUF files and logs go (default: a new temporary directory)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python for convert_hf_to_gguf.py (default: this one)")
    ap.add_argument("--reconvert", action="store_true",
                    help="ignore cached GGUF files (directories only)")
    ap.add_argument("--wgmoe-only", action="store_true",
                    help="run only the wgmoe half (no llama.cpp needed)")
    ap.add_argument("--json-out", type=Path, help="write the rows as JSON")
    a = ap.parse_args(argv)
    for k in ["prompts", "blocks", "n", "threads"]:
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be at least 1")
    if a.n < 2:
        ap.error("-n must be at least 2")
    if a.warmup < 0:
        ap.error("--warmup must be at least 0")
    a.backends = [b.strip().lower() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in a.backends if b not in ("cpu", "vulkan")]
    if bad or not a.backends:
        ap.error(f"--backends: unknown {bad or 'empty list'} (use cpu and/or vulkan)")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        gguf = is_gguf(args.model)
        if not gguf and not args.model.is_dir():
            if args.model.is_file():
                raise ToolError(f"{args.model}: neither a model directory nor a GGUF file")
            raise ToolError(f"{args.model}: model directory or GGUF file not found")
        # Check every prerequisite before measuring anything.
        if gguf:
            gguf_metadata(args.model)  # a readable GGUF header
        else:
            check_hf_model(args.model)
        tools = None if args.wgmoe_only else find_llama_cpp(args.llama_cpp, convert=not gguf)
        wgmoe = find_wgmoe(args.wgmoe)
        work = args.work_dir or Path(tempfile.mkdtemp(prefix="compare-llamacpp-"))
        work.mkdir(parents=True, exist_ok=True)
        print(f"work directory: {work}", file=sys.stderr)
        rows = run_wgmoe(args, wgmoe, work)
        w = rows[0]
        if tools is not None:
            version = llama_version(tools)
            if gguf:
                # The same file for both runtimes: no conversion.
                q4, quant = args.model, gguf_quant_label(args.model)
                print(f"llama.cpp runs {q4} as is ({quant})", file=sys.stderr)
            else:
                q4, quant = convert_to_q4_0(args.model, tools, work, args.python,
                                            args.reconvert), "Q4_0"
            p_tokens = max(1, round(sum(w["prompt_tokens"]) / len(w["prompt_tokens"])))
            runner = args.llama_runner
            if runner == "auto":
                runner = "bench" if tools["llama-bench"] else "cli"
            if tools.get(f"llama-{runner}") is None:
                raise ToolError(f"llama-{runner} not found")
            prompt_texts = []
            if runner == "cli":
                prompt_texts = [p["text"] for p in json.loads(
                    (REPO / "bench" / "prompts.json").read_text())["prompts"][:args.prompts]]
            for b in args.backends:
                ngl = 0 if b == "cpu" else 99
                if runner == "bench":
                    r = run_llama_bench(tools, q4, ngl, p_tokens, args, work, version, quant)
                else:
                    r = run_llama_cli(tools, q4, ngl, prompt_texts, args, work, version, quant)
                if b == "vulkan" and not r["gpu"]:
                    print("llama.cpp: no GPU device ran the -ngl 99 run (backend reported: "
                          f"{r['backend']}); skipping that row", file=sys.stderr)
                    continue
                rows.append(r)
        print(f"\n{args.model}: {args.prompts} prompts x {args.blocks} blocks, {args.n} new "
              f"tokens; measured one after the other on this machine, {time.strftime('%Y-%m-%d')}"
              "\n")
        print(table(rows))
        if args.json_out:
            args.json_out.write_text(json.dumps(
                [{k: v for k, v in r.items() if k != "record"} for r in rows], indent=2) + "\n")
        return 0
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
