#!/usr/bin/env python3
"""Decode speed against onnxruntime-genai, interleaved in one run.

For each decode-speed model ($NXRT_CACHE/genai/models/llama_bench_{fp32,int4}) and thread
count, each round runs onnxruntime-genai (../shared/genai/og_worker.py speed, a fresh process)
and `nxrt generate --json` (a fresh process) on the same 64-id prompt with 128 new tokens and
EOS held back, one after the other; the table gives medians over the rounds and the ratio
nxrt / onnxruntime-genai of decode tokens/s (above 1: nxrt is faster). Decode tokens/s is
127 / the time from the first new token to the last in both.

  python3 scripts/bench_genai.py [--rounds 3] [--threads 1,2] [--models fp32,int4] [--nxrt BIN]

Run it with the corpus venv's Python (onnxruntime-genai lives there):
  ~/.cache/nxrt/corpus-venv/bin/python scripts/bench_genai.py
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("NXRT_SHARED", os.path.join(ROOT, "..", "shared"))
CACHE = os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt"))


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="fp32,int4")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--nxrt", default=os.path.join(ROOT, "target", "release", "nxrt"))
    a = ap.parse_args()
    speed = json.load(open(os.path.join(CACHE, "genai", "ort_speed.json")))
    prompt = speed["prompt_ids"]
    ids = ",".join(str(i) for i in prompt)
    worker = os.path.join(SHARED, "genai", "og_worker.py")
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    for prec in a.models.split(","):
        d = os.path.join(CACHE, "genai", "models", f"llama_bench_{prec}")
        for t in threads:
            og, nx = [], []
            for _ in range(a.rounds):
                og.append(run_json([sys.executable, worker, "speed", d, "--threads", str(t),
                                    "--prompt-ids", ids, "--new", str(a.new)]))
                nx.append(run_json([a.nxrt, "generate", d, "--prompt-ids", ids,
                                    "--max-new-tokens", str(a.new), "--min-new-tokens", str(a.new),
                                    "--threads", str(t), "--json"]))
            same = all(o["tokens"] == n["tokens"] for o, n in zip(og, nx))
            med = lambda xs, k: statistics.median(x[k] for x in xs)
            rows.append({
                "model": f"llama_bench_{prec}", "threads": t,
                "og_tok_s": med(og, "decode_tokens_per_s"), "nxrt_tok_s": med(nx, "decode_tokens_per_s"),
                "og_prefill_ms": med(og, "prefill_ms"), "nxrt_prefill_ms": med(nx, "prefill_ms"),
                "nxrt_kv_bytes": nx[-1].get("kv_bytes"), "same_tokens": same,
                "og_runs": [round(x["decode_tokens_per_s"], 1) for x in og],
                "nxrt_runs": [round(x["decode_tokens_per_s"], 1) for x in nx],
            })
            r = rows[-1]
            print(f"{r['model']:<18} {t}t  onnxruntime-genai {r['og_tok_s']:7.1f} tok/s  "
                  f"nxrt {r['nxrt_tok_s']:7.1f} tok/s  ratio {r['nxrt_tok_s'] / r['og_tok_s']:.2f}  "
                  f"prefill {r['og_prefill_ms']:.1f} / {r['nxrt_prefill_ms']:.1f} ms  "
                  f"KV {r['nxrt_kv_bytes'] / 2**20:.2f} MiB  same tokens: {same}", flush=True)
    print(json.dumps({"rounds": a.rounds, "prompt_len": len(prompt), "new_tokens": a.new,
                      "rows": rows}))


if __name__ == "__main__":
    main()
