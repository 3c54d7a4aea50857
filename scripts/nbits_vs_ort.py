#!/usr/bin/env python3
"""MatMulNBits alone, nxrt against ONNX Runtime, bit for bit: for every block size (16-256),
with and without zero points, at accuracy_level 4 (activations quantized to int8 per block),
one row (decode) and several (prefill). Prints how many outputs differ and by how much.

    $NXRT_CACHE/corpus-venv/bin/python scripts/nbits_vs_ort.py [--nxrt target/release/nxrt]
        [--k 512] [--n 256] [--level 4] [--bias]

ONNX Runtime picks its kernel by block length and instruction set, each with its own
summation order; nxrt reproduces the one for blocks of 32 on AVX-512 VNNI (docs/genai.md,
"int4 and last bits"), which this shows as 0 differing outputs there."""
import argparse, os, subprocess, tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--nxrt", default=os.path.join(ROOT, "target", "release", "nxrt"))
ap.add_argument("--k", type=int, default=512)
ap.add_argument("--n", type=int, default=256)
ap.add_argument("--level", type=int, default=4)
ap.add_argument("--bias", action="store_true", help="give the node a bias input")
a = ap.parse_args()

rng = np.random.default_rng(0)
work = tempfile.mkdtemp(prefix="nbits-")
inputs = {}
for m in (1, 5):
    inputs[m] = os.path.join(work, f"a{m}.npy")
    np.save(inputs[m], (rng.standard_normal((m, a.k)) * 1.5).astype(np.float32))

so = ort.SessionOptions()
so.intra_op_num_threads = 1
print(f"K {a.k}, N {a.n}, 4 bits, accuracy_level {a.level}; ONNX Runtime {ort.__version__}")
for blk in (16, 32, 64, 128, 256):
    for with_zp in (False, True):
        nb = a.k // blk
        inits = [
            numpy_helper.from_array(rng.integers(0, 256, (a.n, nb, blk // 2), dtype=np.uint8), "B"),
            numpy_helper.from_array((rng.random(a.n * nb) * 0.02 + 0.001).astype(np.float32), "scales"),
        ]
        names = ["A", "B", "scales"]
        if with_zp:
            zp = rng.integers(0, 256, (a.n * ((nb + 1) // 2),), dtype=np.uint8)
            inits.append(numpy_helper.from_array(zp, "zp"))
            names.append("zp")
        if a.bias:
            if not with_zp:
                names.append("")
            inits.append(numpy_helper.from_array(rng.standard_normal(a.n).astype(np.float32), "bias"))
            names += ["", "bias"]
        node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=a.k, N=a.n,
                                bits=4, block_size=blk, accuracy_level=a.level)
        graph = helper.make_graph(
            [node], "nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", a.k])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", a.n])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        path = os.path.join(work, f"b{blk}_z{int(with_zp)}.onnx")
        onnx.save(model, path)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        cols = []
        for m, npy in inputs.items():
            want = sess.run(None, {"A": np.load(npy)})[0]
            out = tempfile.mkdtemp(dir=work)
            subprocess.run([a.nxrt, "run", path, "--input", f"A={npy}", "--output-dir", out],
                           check=True, capture_output=True)
            got = np.load(os.path.join(out, "Y.npy"))
            cols.append(f"M={m}: {int((got != want).sum())}/{want.size} differ, "
                        f"max {float(np.abs(got - want).max()):.2e}")
        print(f"block {blk:3} zero points {'yes' if with_zp else 'no '}  " + "; ".join(cols))
