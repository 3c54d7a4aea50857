#!/usr/bin/env python3
"""nxrt vs ONNX Runtime on the public corpus, each model timed in one process, interleaved.

For each model (its first reference case) the script runs `nxrt bench MODEL --vs-ort`: ONNX
Runtime's CPU EP (ORT_ENABLE_ALL, intra-op threads = THREADS, inter-op 1, sequential) through
its C API in the same process and loop as nxrt, on the same inputs, REPS rounds of RUNS runs
per arm (after WARMUP warm-up runs each), the arms' order rotating by round, plus a null
control (a second nxrt session of the model against the first) that shows the harness's own
noise. Prints a markdown table of each arm's median, the nxrt/ORT ratio, the control's ratio
and how far nxrt's outputs are from ORT's. No Python sits in ORT's timed calls (until
2026-12-07 this script timed ORT through its Python API, whose per-call overhead flattered nxrt
on small models).

Base against change (two commits of nxrt) is scripts/bench-compare's job (`--models`).

Every runtime runs on the same cores: the script pins itself (and so the nxrt processes it
starts, with ORT inside them) to the last THREADS cores it may use (--cpus overrides; --cpus all
pins nothing). On a shared virtual machine one core can run a model 1.8x slower than the other
for minutes when a neighbour loads it; unpinned, each process lands where it happens to, and
the ratio measures the cores rather than the runtimes.

Models in the quantized set's layout (--dir $NXRT_CACHE/quant) work too; where a model's folder
holds `ort_anchor.onnx` (MXFP4, which ONNX Runtime cannot run), ORT times that instead
(`--ort-model`).

usage: bench_vs_ort.py [--threads 1] [--cpus LIST|all] [--reps 5] [--runs 10] [--only a,b] [--dir DIR] [--nxrt target/release/nxrt]
Any python 3 runs it; nxrt finds ONNX Runtime's library in the corpus venv (or give
ORT_DYLIB_PATH).
"""
import argparse, json, math, os, statistics, subprocess, sys

from corpus_cases import corpus_models, first_case


def vs_ort(binary, model, inputs, threads, warmup, runs, reps):
    cmd = [binary, "bench", model, "--vs-ort", "--threads", str(threads), "--warmup",
           str(warmup), "--runs", str(runs), "--rounds", str(reps), "--json"]
    # the quantized set's MXFP4 models: ORT has no FP4 kernel and times its anchor (the same
    # weights as int8 blocks), as the set's quant_info.json says
    anchor = os.path.join(os.path.dirname(model), "ort_anchor.onnx")
    if os.path.exists(anchor):
        cmd += ["--ort-model", anchor]
    for name, path in inputs:
        cmd += ["--input", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)["vs_ort"]


def worst_diff(v):
    """The largest |nxrt - ORT| over the float outputs (NaN where one side is NaN and the other
    not), and whether integer outputs are equal."""
    outs = [o for o in v["outputs"].values() if isinstance(o, dict)]
    diffs = [o["max_abs_diff"] for o in outs if "max_abs_diff" in o]
    eq = [o["equal"] for o in outs if "equal" in o]
    parts = []
    if any(d is None for d in diffs):
        parts.append("**NaN**")
    elif diffs:
        parts.append(f"{max(diffs):.1e}")
    if eq:
        parts.append("ints equal" if all(eq) else "**ints differ**")
    return ", ".join(parts) or "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5, help="rounds (each runs every arm --runs times)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default=None,
                    help="models in the corpus layout (default: the corpus; e.g. $NXRT_CACHE/micro "
                         "from ../shared/bench/make_micro.py)")
    ap.add_argument("--nxrt", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "nxrt"))
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
    version = None
    print(f"threads={a.threads} cpus={','.join(map(str, pinned))} rounds={a.reps} "
          f"runs/round/arm={a.runs} warmup={a.warmup} (medians; ORT in the same process as nxrt, "
          f"`nxrt bench --vs-ort`; control = nxrt/nxrt)\n")
    print("| model | case | ORT ms | nxrt ms | nxrt/ORT | control | max abs diff |")
    print("|---|---|---:|---:|---:|---:|---|")
    ratios, controls = [], []
    for m in models:
        model, case, inputs = first_case(m, root)
        try:
            v = vs_ort(a.nxrt, model, inputs, a.threads, a.warmup, a.runs, a.reps)
        except RuntimeError as e:
            print(f"| {m} | {case} | | error: {str(e)[:100]} | |")
            continue
        version = version or v["ort_version"]
        o, n, r = v["ort"]["median_ms"], v["nxrt"]["median_ms"], v["ratio_median"]
        c = v["control_ratio_median"]
        flag = " **>5x**" if r > 5 else ""
        row = f"| {m} | {case} | {o:.3f} | {n:.3f} | {r:.2f}{flag} | {c:.2f} | {worst_diff(v)} |"
        print(row)
        sys.stdout.flush()
        ratios.append((o, r))
        controls.append(c)

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    big = [r for o, r in ratios if o >= 0.05]
    print(f"\nONNX Runtime {version}; geomean nxrt/ORT: {geomean(big):.2f} over the {len(big)} models "
          f"where ORT takes >= 0.05 ms; {geomean([r for _, r in ratios]):.2f} over all {len(ratios)}; "
          f"null control nxrt/nxrt geomean {geomean(controls):.3f}, "
          f"range {min(controls, default=float('nan')):.2f}-{max(controls, default=float('nan')):.2f}")


if __name__ == "__main__":
    main()
