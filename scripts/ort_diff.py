#!/usr/bin/env python3
"""Where does nxrt's arithmetic first part from ONNX Runtime's? Runs one model on both with the
same inputs, every float intermediate exposed as a graph output, and lists the intermediates in
node order with how many elements differ and by how much (bit for bit: 0 means equal).

    $NXRT_CACHE/corpus-venv/bin/python scripts/ort_diff.py MODEL.onnx --input NAME=FILE.npy ...
        [--nxrt target/release/nxrt] [--ops MatMulNBits,GroupQueryAttention] [--all]

The model is copied (external data included) into a temporary folder with the extra outputs;
an intermediate counts as float where ONNX shape inference says so, or, for ops it cannot
type (com.microsoft), where the op is one of FLOAT_OPS. Without --all only the first ten
differing intermediates are printed. Both runtimes use 1 thread. This is how the int4
decoders' rounding was matched to ONNX Runtime's, op by op (docs/genai.md, "int4 and last
bits")."""
import argparse, os, subprocess, sys, tempfile

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# contrib ops whose first output is float for float inputs (shape inference cannot type them)
FLOAT_OPS = {
    "MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "RotaryEmbedding",
    "MultiHeadAttention", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd",
}

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--input", action="append", default=[], help="NAME=FILE.npy")
ap.add_argument("--nxrt", default=os.path.join(ROOT, "target", "release", "nxrt"))
ap.add_argument("--ops", default="", help="only the outputs of these op types")
ap.add_argument("--all", action="store_true", help="print every differing intermediate")
a = ap.parse_args()

m = onnx.load(a.model)
try:
    typed = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in typed.graph.value_info}
except Exception:  # noqa: BLE001 (a model shape inference rejects: fall back to FLOAT_OPS)
    types = {}
only = set(filter(None, a.ops.split(",")))
have = {o.name for o in m.graph.output}
order = []
for n in m.graph.node:
    if only and n.op_type not in only:
        continue
    for i, o in enumerate(n.output):
        if not o or o in have:
            continue
        t = types.get(o)
        if t == onnx.TensorProto.FLOAT or (t is None and n.op_type in FLOAT_OPS and i == 0):
            m.graph.output.append(onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None))
            have.add(o)
            order.append((o, n.op_type))
order += [(o.name, "graph output") for o in m.graph.output[: len(m.graph.output) - len(order)]]

feeds = {}
for kv in a.input:
    name, path = kv.split("=", 1)
    feeds[name] = np.load(path)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.onnx")
    onnx.save(m, path, save_as_external_data=True, location="model.onnx.data")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    out = os.path.join(tmp, "out")
    cmd = [a.nxrt, "run", path, "--output-dir", out]
    for kv in a.input:
        cmd += ["--input", kv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"nxrt failed:\n{r.stderr}")
    shown, equal = 0, 0
    for name, op in order:
        f = os.path.join(out, name.replace("/", "_") + ".npy")
        if not os.path.exists(f):
            print(f"{name} ({op}): no nxrt output")
            continue
        got, ref = np.load(f), want[name]
        if got.shape != ref.shape:
            print(f"{name} ({op}): shape {got.shape} vs ONNX Runtime's {ref.shape}")
            continue
        diff = got != ref
        if not diff.any():
            equal += 1
            continue
        if shown < 10 or a.all:
            dmax = float(np.abs(got.astype(np.float64) - ref).max())
            print(f"{name} ({op}): {int(diff.sum())} of {ref.size} differ, max {dmax:.3e}")
        shown += 1
    print(f"{equal} of {len(order)} intermediates and outputs equal bit for bit; {shown} differ")
