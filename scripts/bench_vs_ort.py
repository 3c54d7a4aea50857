#!/usr/bin/env python3
"""nxrt vs ONNX Runtime on the public corpus, measured in one run, interleaved (A B A B).

For each model (its first reference case): REPS rounds; each round times ONNX Runtime (Python
API, CPU EP, ORT_ENABLE_ALL, intra/inter-op threads = THREADS) over RUNS runs and then
`nxrt bench --json` over RUNS runs (after WARMUP warm-up runs each), and keeps each round's
median. Prints a markdown table of the medians over rounds and the nxrt/ORT ratio.

With --base BIN, a second nxrt binary (the base of a change) is timed in the same rounds,
right after the first (ORT, nxrt, base per round), and the table adds its time and the
change/base ratio.

Between one runtime's timing and the next the script idles --settle seconds (0.3): ONNX
Runtime's workers spin after a run, and at 2 threads on 2 cores the runtime timed right after
it would otherwise share the cores with them (nxrt's small models measured up to 1.5x slower).

Every runtime runs on the same cores: the script pins itself (and so ONNX Runtime and the nxrt
processes it starts) to the last THREADS cores it may use (--cpus overrides; --cpus all pins
nothing). On a shared virtual machine one core can run a model 1.8x slower than the other for
minutes when a neighbour loads it; unpinned, each process lands where it happens to, and the
ratio measures the cores rather than the runtimes.

Models in the quantized set's layout (--dir $NXRT_CACHE/quant) work too; where a model's folder
holds `ort_anchor.onnx` (MXFP4, which ONNX Runtime cannot run), ORT times that instead.

usage: bench_vs_ort.py [--threads 1] [--cpus LIST|all] [--settle 0.3] [--reps 5] [--runs 10] [--only a,b] [--dir DIR] [--nxrt target/release/nxrt] [--base BIN]
Run with the corpus venv's python ($NXRT_CACHE/corpus-venv/bin/python), which has onnxruntime.
"""
import argparse, json, math, os, statistics, subprocess, sys, time

import numpy as np
import onnxruntime as ort

from corpus_cases import corpus_models, first_case



def ort_median(sess, feed, warmup, runs):
    for _ in range(warmup):
        sess.run(None, feed)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def nxrt_median(binary, model, inputs, threads, warmup, runs):
    cmd = [binary, "bench", model, "--threads", str(threads), "--warmup", str(warmup),
           "--runs", str(runs), "--json"]
    for name, path in inputs:
        cmd += ["--input", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)["median_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds of idle between one runtime's timing and the next's")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default=None,
                    help="models in the corpus layout (default: the corpus; e.g. $NXRT_CACHE/micro "
                         "from ../shared/bench/make_micro.py)")
    ap.add_argument("--nxrt", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "nxrt"))
    ap.add_argument("--base", default=None, help="a base nxrt binary, timed in the same rounds")
    ap.add_argument("--cpus", default=None,
                    help="comma-separated cores to pin to (default: the last THREADS allowed), or all")
    a = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    if a.cpus == "all":
        pinned = allowed
    elif a.cpus:
        pinned = [int(c) for c in a.cpus.split(",")]
    else:
        pinned = allowed[-max(1, a.threads):]
    os.sched_setaffinity(0, pinned)
    root = a.dir or os.path.join(os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt")), "corpus")
    models = corpus_models(a.only, root)
    print(f"threads={a.threads} cpus={','.join(map(str, pinned))} reps={a.reps} runs/rep={a.runs} "
          f"warmup={a.warmup} (medians; ratio = nxrt/ORT)\n")
    if a.base:
        print("| model | case | ORT ms | nxrt ms | nxrt/ORT | base ms | base/ORT | nxrt/base |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
    else:
        print("| model | case | ORT ms | nxrt ms | nxrt/ORT |")
        print("|---|---|---:|---:|---:|")
    ratios, base_ratios = [], []
    for m in models:
        model, case, inputs = first_case(m, root)
        feed = {n: np.load(p) for n, p in inputs}
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        # the quantized set's MXFP4 models: ORT has no FP4 kernel and times its anchor (the
        # same weights as int8 blocks), as the set's quant_info.json says
        anchor = os.path.join(os.path.dirname(model), "ort_anchor.onnx")
        sess = ort.InferenceSession(anchor if os.path.exists(anchor) else model, so,
                                    providers=["CPUExecutionProvider"])
        o_t, n_t, b_t = [], [], []
        try:
            for _ in range(a.reps):
                o_t.append(ort_median(sess, feed, a.warmup, a.runs))
                # ORT's idle workers spin for a while after a run; let them stop before the
                # next runtime is timed, or whichever runs right after ORT shares the cores
                time.sleep(a.settle)
                n_t.append(nxrt_median(a.nxrt, model, inputs, a.threads, a.warmup, a.runs))
                if a.base:
                    time.sleep(a.settle)
                    b_t.append(nxrt_median(a.base, model, inputs, a.threads, a.warmup, a.runs))
        except RuntimeError as e:
            print(f"| {m} | {case} | {statistics.median(o_t) if o_t else float('nan'):.3f} | error: {str(e)[:80]} | |")
            continue
        o, n = statistics.median(o_t), statistics.median(n_t)
        flag = " **>5x**" if n / o > 5 else ""
        if a.base:
            b = statistics.median(b_t)
            print(f"| {m} | {case} | {o:.3f} | {n:.3f} | {n / o:.2f}{flag} | {b:.3f} | {b / o:.2f} | {n / b:.2f} |")
            base_ratios.append((o, b / o))
        else:
            print(f"| {m} | {case} | {o:.3f} | {n:.3f} | {n / o:.2f}{flag} |")
        sys.stdout.flush()
        ratios.append((o, n / o))

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    big = [r for o, r in ratios if o >= 0.05]
    print(f"\ngeomean nxrt/ORT: {geomean(big):.2f} over the {len(big)} models where ORT takes "
          f">= 0.05 ms; {geomean([r for _, r in ratios]):.2f} over all {len(ratios)}")
    if a.base:
        bbig = [r for o, r in base_ratios if o >= 0.05]
        print(f"geomean base/ORT: {geomean(bbig):.2f} over the same {len(bbig)}; "
              f"{geomean([r for _, r in base_ratios]):.2f} over all {len(base_ratios)}")


if __name__ == "__main__":
    main()
