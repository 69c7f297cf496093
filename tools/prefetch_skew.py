#!/usr/bin/env python3
"""Prefetch and caching on skewed routing, side by side in one run.

Writes synthetic models (`wgmoe synth --router-skew S`) for each skew, then runs each at
half residency (uploads for every miss) with --prefetch off, next-layer-ungated and
next-layer (the gated default), sampled so the decode does not loop, and prints one table:
hit rate, host-to-device bytes (and their ratio to prefetch off's), prefetch precision,
the gate's held-back guesses and gated layers, the device's stall seconds and decode tok/s.

    python3 tools/prefetch_skew.py [--wgmoe target/release/wgmoe] [--skews 0,0.5,1]

Standard library only; the models go to a temporary directory, removed at the end.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPE = ["--arch", "olmoe-1b-7b", "--hidden", "512", "--layers", "8", "--heads", "8",
         "--experts", "64", "--top-k", "8", "--expert-intermediate", "256", "--vocab", "4096"]
PROMPT = "The old clockmaker opened his shop before dawn and wound every clock on the wall"
MODES = ["off", "next-layer-ungated", "next-layer"]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wgmoe", default="target/release/wgmoe")
    ap.add_argument("--skews", default="0,0.5,1")
    ap.add_argument("--resident", default="32", help="resident experts per layer (of 64)")
    ap.add_argument("-n", default="96", help="tokens generated per run")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.skews.split(","):
            d = Path(tmp) / f"skew{s}"
            run([a.wgmoe, "synth", *SHAPE, "--router-skew", s, "-o", str(d)])
            base = None
            for mode in MODES:
                out = run([a.wgmoe, "run", str(d), "-p", PROMPT, "-n", a.n, "--ignore-eos",
                           "--temperature", "1", "--seed", "7", "--json",
                           "--resident-experts", a.resident, "--miss-policy", "upload",
                           "--prefetch", mode])
                v = json.loads(out)
                m = v["metrics"]
                hits, misses = m["expert_hits"], m["expert_misses"]
                h2d = m["h2d_bytes"]
                base = h2d if mode == "off" else base
                issued, used = m["prefetch_issued"] or 0, m["prefetch_used"] or 0
                rows.append([
                    s, mode,
                    f"{hits / max(1, hits + misses):.3f}",
                    f"{h2d / 2**20:.1f}",
                    f"{h2d / base:.2f}" if base else "-",
                    f"{used}/{issued}" if issued else "-",
                    str(m["prefetch_held_back"] or 0),
                    ",".join(map(str, m["prefetch_gated_layers"] or [])) or "-",
                    f"{m['upload_stall_seconds']:.3f}",
                    f"{m['decode_tokens_per_s']:.2f}",
                ])
                adapter = f"{m['adapter']} ({m['driver']})"
    head = ["skew", "prefetch", "hit rate", "H2D MiB", "x off", "used/copied", "held back",
            "gated layers", "stall s", "decode tok/s"]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |")
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |")
    print(f"\nadapter: {adapter}; {a.n} tokens sampled (temperature 1, seed 7) per run, "
          f"{a.resident} of 64 experts resident per layer, --miss-policy upload")


if __name__ == "__main__":
    main()
