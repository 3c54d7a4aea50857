#!/usr/bin/env python3
"""ONNX Runtime's outputs for the *uint8-weight twin* of every int8 model of the quantized set:
a second reference that `tests/src/quant.rs` (the quantized set's judge) accepts beside the
set's own.

Usage: quant_refs.py QUANT_DIR OUT_DIR   (the test command: $NXRT_CACHE/quant -> $NXRT_CACHE/quant_refs)

Why: on x86 machines without VNNI (AVX2, AVX-512 without VNNI) ONNX Runtime's u8s8 integer
kernels sum pairs of uint8 x int8 products in int16 with saturation (vpmaddubsw), so its
outputs there depart from the ONNX definition: by up to 50 quantization steps on the
quantized set, where its own ORT_DISABLE_ALL and ORT_ENABLE_ALL disagree just as far. The twin
re-expresses every int8 weight (and its zero point) as uint8, w + 128 with zp + 128: the same
dequantized values, so the same model by the definition, which ONNX Runtime runs on its
u8u8 kernels (no saturation). nxrt computes the definition on every instruction set.

OUT_DIR/<model>/ holds output_<k>.npy (ORT_ENABLE_ALL, one thread), io.json (the reference
case's outputs, with these files) and stamp.json (the model's sha256, ORT's version and this
script's hash: a model whose stamp matches is not run again). Models with no int8 weight get no twin.
"""
import hashlib
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

# (op, domain) -> indices of the weight and its zero point among the node's inputs
WEIGHT_INPUTS = {
    ("DequantizeLinear", ""): (0, 2),
    ("QLinearConv", ""): (3, 5),
    ("QLinearMatMul", ""): (3, 5),
    ("QGemm", "com.microsoft"): (3, 5),
    ("MatMulInteger", ""): (1, 3),
    ("ConvInteger", ""): (1, 3),
}


def twin(model):
    """Shifts the int8 weight initializers (and their zero points) to uint8 in place; returns
    how many initializers changed."""
    inits = {i.name: i for i in model.graph.initializer}
    shifted = set()

    def shift(name):
        t = inits.get(name)
        if t is None or name in shifted or t.data_type != onnx.TensorProto.INT8:
            return
        a = numpy_helper.to_array(t).astype(np.int16) + 128
        t.CopyFrom(numpy_helper.from_array(a.astype(np.uint8), name))
        shifted.add(name)

    for n in model.graph.node:
        idx = WEIGHT_INPUTS.get((n.op_type, n.domain))
        if idx is None:
            continue
        w, z = idx
        # a weight with a constant int8 zero point, or none (int8 zero), shifts with it;
        # an activation (not an initializer) is left alone
        if w >= len(n.input) or n.input[w] not in inits:
            continue  # an activation: left alone
        has_zp = z < len(n.input) and n.input[z] != ""
        if has_zp and n.input[z] not in inits:
            continue  # a zero point computed at run time: left alone
        if not has_zp:
            if inits[n.input[w]].data_type != onnx.TensorProto.INT8:
                continue
            # no zero point (int8 zero): the twin's is uint8 128
            name = n.input[w] + "__twin_zp"
            if name not in inits:
                inits[name] = numpy_helper.from_array(np.array(0, dtype=np.int8), name)
                model.graph.initializer.append(inits[name])
            while len(n.input) <= z:
                n.input.append("")
            n.input[z] = name
        shift(n.input[w])
        shift(n.input[z])
    return len(shifted)


with open(__file__, "rb") as _f:
    SCRIPT_SHA = hashlib.sha256(_f.read()).hexdigest()[:16]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    if not os.path.isfile(os.path.join(src, "manifest.json")):
        sys.exit(f"no quantized set at {src}: run ../shared/quant/fetch_quant.sh")
    for name in sorted(os.listdir(src)):
        mpath = os.path.join(src, name, "model.onnx")
        if not os.path.isfile(mpath):
            continue
        case = os.path.join(src, name, "ref", "default")
        dst = os.path.join(out, name)
        with open(mpath, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        stamp = json.dumps({"sha256": sha, "ort": ort.__version__, "script": SCRIPT_SHA})
        sp = os.path.join(dst, "stamp.json")
        if os.path.isfile(sp) and open(sp).read() == stamp:
            print(f"{name}: exists")
            continue
        model = onnx.load(mpath)
        n = twin(model)
        if n == 0:
            print(f"{name}: no int8 weights, no twin")
            continue
        io = json.load(open(os.path.join(case, "io.json")))
        feeds = {i["name"]: np.load(os.path.join(case, i["file"])) for i in io["inputs"]}
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o["name"] for o in io["outputs"]]
        res = sess.run(names, feeds)
        os.makedirs(dst, exist_ok=True)
        outs = []
        for k, (o, v) in enumerate(zip(io["outputs"], res)):
            f = f"output_{k}.npy"
            np.save(os.path.join(dst, f), v)
            outs.append({"name": o["name"], "file": f})
            ref = np.load(os.path.join(case, o["file"]))
            d = float(np.abs(v.astype(np.float64) - ref.astype(np.float64)).max()) if v.size else 0.0
            print(f"{name}: {n} initializers shifted; {o['name']}: max |twin - reference| {d:.3e}")
        with open(os.path.join(dst, "io.json"), "w") as f:
            json.dump({"outputs": outs, "note": "ORT_ENABLE_ALL, 1 thread, int8 weights as uint8"}, f, indent=1)
        with open(sp, "w") as f:
            f.write(stamp)


if __name__ == "__main__":
    main()
