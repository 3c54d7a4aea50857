#!/usr/bin/env python3
"""Per corpus model, what the WebGPU provider does: nodes on WebGPU, copies the partition
inserts (`nxrt inspect --provider webgpu --json`), and per run the dispatches, uploads and
read-backs and the device bytes (`nxrt run --provider webgpu`'s counter line, on the first
reference case's inputs, second run: the first warms the pools). Prints a markdown table.

    python3 scripts/webgpu_partition.py [--bin target/release/nxrt] [--models a,b]

Needs a WebGPU adapter natively (lavapipe in CI and here) and the corpus. Dispatch counts do not
depend on the adapter; times are not reported (lavapipe is a CPU emulation)."""
import argparse, json, os, re, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_cases import corpus_models, first_case  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "nxrt"))
ap.add_argument("--models", default="")
a = ap.parse_args()
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

print("| model | nodes on WebGPU / all | copies (partition) | of them per run | dispatches per run | uploads per run | read-backs per run | device MB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for m in corpus_models(a.models):
    model, case, inputs = first_case(m)
    j = json.loads(subprocess.run([a.bin, "inspect", "--json", "--provider", "webgpu", model],
                                  capture_output=True, text=True, check=True).stdout)
    per = {p["provider"]: p["nodes"] for p in j["partition"]["nodes_per_provider"]}
    cmd = [a.bin, "run", model, "--provider", "webgpu", "--runs", "2"]
    for n, f in inputs:
        cmd += ["--input", f"{n}={f}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    c = re.search(r"provider webgpu \(this run\): (.*)", r.stderr)
    if r.returncode != 0 or not c:
        print(f"| {m} | {per.get('webgpu', 0)} / {sum(per.values())} | {j['partition']['copies']} | {j['partition']['copies_per_run']} | error: {r.stderr.strip()[-80:]} | | | |")
        continue
    kv = dict((k, int(v)) for k, v in (p.rsplit(" ", 1) for p in c.group(1).split(", ")))
    print(f"| {m} | {per.get('webgpu', 0)} / {sum(per.values())} | {j['partition']['copies']} | {j['partition']['copies_per_run']} | {kv['dispatches']} | "
          f"{kv['uploads']} | {kv['downloads']} | {kv['device_bytes'] / 1e6:.1f} |")
