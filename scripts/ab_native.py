#!/usr/bin/env python3
"""Base vs change: two `nxrt` binaries on the same corpus models, interleaved (A B A B ...),
each round one `nxrt bench --json` per binary; prints the median of the per-round medians and
the change/base ratio as a markdown table.

    python3 scripts/ab_native.py BASE_BIN CHANGE_BIN [--provider webgpu] [--models a,b]
        [--rounds 5] [--runs 10] [--threads 1]

Models are given their first reference case's inputs (as `nxrt bench --input`). With
`--provider webgpu` on lavapipe the times are a CPU emulation of a GPU: they say how much work
is sent and how it is organised, not how fast a real GPU would be."""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_cases import corpus_models, first_case  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("change")
ap.add_argument("--provider", default="cpu")
ap.add_argument("--models", default="")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--runs", type=int, default=10)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def bench(binary, model, inputs):
    cmd = [binary, "bench", model, "--provider", a.provider, "--json", "--warmup", "2",
           "--runs", str(a.runs), "--threads", str(a.threads)]
    for n, f in inputs:
        cmd += ["--input", f"{n}={f}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{binary} failed on {model}: {out.stderr.strip()}")
    return json.loads(out.stdout)["median_ms"]


print(f"provider {a.provider}, {a.threads} thread(s), {a.rounds} interleaved rounds of "
      f"{a.runs} runs; medians of the per-round medians, ms")
print()
print("| model | base | change | change / base |")
print("|---|---:|---:|---:|")
for m in corpus_models(a.models):
    model, _case, inputs = first_case(m)
    base, change = [], []
    for _ in range(a.rounds):
        base.append(bench(a.base, model, inputs))
        change.append(bench(a.change, model, inputs))
    b, c = statistics.median(base), statistics.median(change)
    print(f"| {m} | {b:.2f} | {c:.2f} | {c / b:.2f} |", flush=True)
