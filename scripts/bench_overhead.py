#!/usr/bin/env python3
"""Per-run overhead on one-node models: nxrt (Rust API through `nxrt bench`) vs ONNX Runtime
(`session.run` from its Python API), interleaved in one loop.

Models (written to $NXRT_CACHE/overhead/): Identity and Add of 1024 float32s. Each round times
ORT over RUNS individually timed `sess.run` calls (after warm-up) and then `nxrt bench` in
planned and eager mode over RUNS runs; both sides time each call with a monotonic clock and
keep the median. Prints medians over REPS rounds in microseconds and the ratios to ORT.

usage: bench_overhead.py [--reps 9] [--runs 20000]   (corpus venv python)
"""
import argparse, json, os, statistics, subprocess, time

import numpy as np
import onnx
from onnx import TensorProto, helper
import onnxruntime as ort

CACHE = os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt"))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def write_models(d):
    os.makedirs(d, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1024])
    paths = {}
    for name, node, ins in [("identity", helper.make_node("Identity", ["x"], ["y"]), [x]),
                            ("add", helper.make_node("Add", ["x", "b"], ["y"]), [x, b])]:
        g = helper.make_graph([node], name, ins, [y])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 9
        p = os.path.join(d, f"{name}.onnx")
        onnx.save(m, p)
        paths[name] = (p, [i.name for i in ins])
    return paths


def ort_median(path, names, runs, warmup):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {n: np.random.rand(1024).astype(np.float32) for n in names}
    for _ in range(warmup):
        s.run(None, feed)
    ts = []
    pc = time.perf_counter_ns
    for _ in range(runs):
        t0 = pc()
        s.run(None, feed)
        ts.append(pc() - t0)
    return statistics.median(ts) / 1e3


def nxrt_median(binary, path, mode, runs, warmup):
    r = subprocess.run([binary, "bench", path, "--threads", "1", "--mode", mode, "--warmup", str(warmup),
                        "--runs", str(runs), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)["median_ms"] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--nxrt", default=os.path.join(ROOT, "target", "release", "nxrt"))
    a = ap.parse_args()
    models = write_models(os.path.join(CACHE, "overhead"))
    print(f"1 thread, reps={a.reps}, runs/rep={a.runs}; medians of per-round medians, us per run\n")
    print("| model | ORT session.run (Python) | nxrt planned | nxrt eager | planned/ORT | eager/ORT |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (path, names) in models.items():
        o, p, e = [], [], []
        for _ in range(a.reps):
            o.append(ort_median(path, names, a.runs, a.warmup))
            p.append(nxrt_median(a.nxrt, path, "planned", a.runs, a.warmup))
            e.append(nxrt_median(a.nxrt, path, "eager", a.runs, a.warmup))
        o, p, e = statistics.median(o), statistics.median(p), statistics.median(e)
        print(f"| {name} (1024 f32) | {o:.2f} | {p:.2f} | {e:.2f} | {p / o:.2f} | {e / o:.2f} |", flush=True)


if __name__ == "__main__":
    main()
