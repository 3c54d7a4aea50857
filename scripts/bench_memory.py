#!/usr/bin/env python3
"""Peak resident memory: nxrt (planned and eager) vs ONNX Runtime, per public corpus model.

Each measurement is its own child process, so its peak resident set (ru_maxrss from wait4, what
`/usr/bin/time -v` reports as "Maximum resident set size") covers loading the model and RUNS runs
on the model's first reference case, at THREADS intra-op threads:

  - nxrt planned: `nxrt run MODEL --runs RUNS --memory-report` (also gives the plan's arena size,
    the sum of activation sizes and the reuse ratio);
  - nxrt eager:   the same with `--mode eager`;
  - ORT:          the Python API (CPU EP, ORT_ENABLE_ALL, intra/inter-op threads = THREADS), RUNS runs;
  - ORT import:   the same interpreter importing numpy and onnxruntime and loading the inputs,
    with no session: what ORT's figure costs before any model (shown for honesty; the verdict
    compares against ORT's full figure, as a user running it sees it).

Rounds alternate the arms (nxrt planned, ORT, nxrt eager, ...) and the table keeps each arm's
median over REPS rounds.

usage: bench_memory.py [--threads 1] [--reps 3] [--runs 3] [--only a,b] [--nxrt target/release/nxrt]
Run with the corpus venv's python ($NXRT_CACHE/corpus-venv/bin/python).
"""
import argparse, json, os, re, statistics, subprocess, sys

from corpus_cases import corpus_models, first_case

ORT_CHILD = r"""
import sys, numpy as np
import onnxruntime as ort
model, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
feeds = {}
for a in sys.argv[4:]:
    n, p = a.split('=', 1)
    feeds[n] = np.load(p)
if runs > 0:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(model, so, providers=['CPUExecutionProvider'])
    for _ in range(runs):
        s.run(None, feeds)
"""


def run_measured(cmd):
    """Runs cmd as a child; returns (its own peak RSS in bytes, its stdout)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # read pipes fully, then reap with wait4 to get this child's own rusage
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(err.decode(errors="replace").strip()[-300:])
    return ru.ru_maxrss * 1024, out.decode(errors="replace")


def mib(b):
    return b / (1024 * 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--nxrt", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "nxrt"))
    a = ap.parse_args()
    models = corpus_models(a.only)
    print(f"threads={a.threads} runs/process={a.runs} reps={a.reps} (peak RSS medians, MiB)\n")
    print("| model | nxrt planned | nxrt eager | ORT | ORT import only | planned/ORT | arena MiB | sum of activations MiB | reuse |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for m in models:
        model, _, inputs = first_case(m)
        base = [a.nxrt, "run", model, "--threads", str(a.threads), "--runs", str(a.runs), "--memory-report"]
        for n, p in inputs:
            base += ["--input", f"{n}={p}"]
        ort_cmd = [sys.executable, "-c", ORT_CHILD, model, str(a.threads), str(a.runs)] + [f"{n}={p}" for n, p in inputs]
        imp_cmd = [sys.executable, "-c", ORT_CHILD, model, str(a.threads), "0"] + [f"{n}={p}" for n, p in inputs]
        res = {"planned": [], "eager": [], "ort": [], "import": []}
        report = ""
        try:
            for _ in range(a.reps):
                b, report = run_measured(base)
                res["planned"].append(b)
                res["ort"].append(run_measured(ort_cmd)[0])
                res["eager"].append(run_measured(base + ["--mode", "eager"])[0])
                res["import"].append(run_measured(imp_cmd)[0])
        except RuntimeError as e:
            print(f"| {m} | error: {str(e)[:100]} | | | | | | | |")
            continue
        med = {k: statistics.median(v) for k, v in res.items()}
        mm = re.search(r"planned peak ([\d.]+) MiB \(arena\), sum of activations ([\d.]+) MiB, reuse ([\d.]+)x", report)
        arena, acts, reuse = (mm.group(1), mm.group(2), mm.group(3) + "x") if mm else ("-", "-", "-")
        ratio = med["planned"] / med["ort"]
        worst = max(worst, ratio)
        print(f"| {m} | {mib(med['planned']):.1f} | {mib(med['eager']):.1f} | {mib(med['ort']):.1f} | "
              f"{mib(med['import']):.1f} | {ratio:.2f} | {arena} | {acts} | {reuse} |", flush=True)
    print(f"\nworst planned/ORT peak-RSS ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
