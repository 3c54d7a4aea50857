#!/usr/bin/env python3
"""ONNX Runtime's own per-node kernel times for one model, to set beside `nxrt bench
--phase-profile` (which prints nxrt's per node).

Runs the model on ORT's CPU EP (ORT_ENABLE_ALL, THREADS intra-op threads) with profiling on,
WARMUP + RUNS times, and prints each node's median kernel time over the timed runs (ORT names
a node after its fused output where its optimiser rewrote it, e.g. `..._nchwc`).

usage: ort_node_profile.py MODEL NAME=FILE.npy [NAME=FILE.npy ...] [--threads 1] [--runs 100] [--top 40]
Run with the corpus venv's python ($NXRT_CACHE/corpus-venv/bin/python).
"""
import argparse, collections, json, os, statistics, tempfile

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("inputs", nargs="*", help="NAME=FILE.npy")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    feed = {}
    for kv in a.inputs:
        name, path = kv.split("=", 1)
        feed[name] = np.load(path)
    for _ in range(a.warmup + a.runs):
        sess.run(None, feed)
    events = json.load(open(sess.end_profiling()))
    per_node = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[(e["name"][: -len("_kernel_time")], e["args"].get("op_name", ""))].append(e["dur"])
    rows = sorted(
        ((statistics.median(v[-a.runs:]), name, op) for (name, op), v in per_node.items()),
        reverse=True,
    )
    print(f"threads={a.threads} runs={a.runs}: median kernel us per node; sum {sum(r[0] for r in rows):.1f} us")
    for us, name, op in rows[: a.top]:
        print(f"{us:9.1f}  {op:24s} {name}")


if __name__ == "__main__":
    main()
