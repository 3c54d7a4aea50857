#!/usr/bin/env python3
"""What the profiling code costs: three arms, measured in one loop, interleaved.

  A  a build without the profiling code (`cargo build --release -p nxrt --no-default-features`:
     the gates are constant false, the recording code is compiled out);
  B  the normal build with every gate off (what users run);
  C  the normal build with the phase profiler on (`--phase-profile`), the profiler only.

Each round runs `nxrt bench MODEL --json` once per arm (WARMUP warm-up runs, then RUNS timed
runs, median) in the order A B C, REPS rounds (>= 15). Prints each arm's median of round medians
and the ratios B/A (gate-off cost: should be 1.00 within noise) and C/B (profiler-on cost: within
5%). Arm C's phase table (stderr) is checked to hold no `plan` row: with the shapes fixed, a
planned run never re-plans, so a profiled run pays no phase an unprofiled one does not.

usage: bench_gates.py [--reps 15] [--runs 50] [--threads 1] [--models silero_vad,mobilenet_v3_small]
        [--base target/bench/nxrt-noprof] [--nxrt target/release/nxrt]
Build the base first: scripts/bench_gates.sh does both builds and runs this.
"""
import argparse, json, os, statistics, subprocess

from corpus_cases import first_case
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def bench(binary, model, inputs, a, extra=()):
    cmd = [binary, "bench", model, "--threads", str(a.threads), "--warmup", str(a.warmup),
           "--runs", str(a.runs), "--json", *extra]
    for n, p in inputs:
        cmd += ["--input", f"{n}={p}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-300:])
    return json.loads(r.stdout)["median_ms"], r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="silero_vad,mobilenet_v3_small")
    ap.add_argument("--base", default=os.path.join(ROOT, "target", "bench", "nxrt-noprof"))
    ap.add_argument("--nxrt", default=os.path.join(ROOT, "target", "release", "nxrt"))
    a = ap.parse_args()
    print(f"threads={a.threads} reps={a.reps} runs/rep={a.runs} warmup={a.warmup}; "
          "medians of per-round medians, ms\n")
    print("| model | A: no profiling code | B: gates off | C: profiler on | B/A | C/B | plan phase in C |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m in a.models.split(","):
        model, _, inputs = first_case(m)
        arms = {"A": [], "B": [], "C": []}
        plan_rows = False
        for _ in range(a.reps):
            arms["A"].append(bench(a.base, model, inputs, a)[0])
            arms["B"].append(bench(a.nxrt, model, inputs, a)[0])
            t, table = bench(a.nxrt, model, inputs, a, ["--phase-profile"])
            arms["C"].append(t)
            if "kernel" not in table:
                raise RuntimeError("arm C printed no phase table")
            plan_rows |= any(line.startswith("plan ") for line in table.splitlines())
        med = {k: statistics.median(v) for k, v in arms.items()}
        print(f"| {m} | {med['A']:.4f} | {med['B']:.4f} | {med['C']:.4f} | "
              f"{med['B'] / med['A']:.3f} | {med['C'] / med['B']:.3f} | {'yes' if plan_rows else 'no'} |",
              flush=True)


if __name__ == "__main__":
    main()
