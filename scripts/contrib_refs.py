#!/usr/bin/env python3
"""ONNX Runtime's outputs for single-node models of the com.microsoft encoder/decoder ops
(Gelu, FastGelu, BiasGelu, QuickGelu, SkipLayerNormalization, RotaryEmbedding,
MultiHeadAttention), QLinearAveragePool, MatMulIntegerToFloat, and MatMulNBits bit for bit,
the references `tests/tests/contrib_refs.rs` compares nxrt with.

Usage: contrib_refs.py OUT_DIR   (the test command writes $NXRT_CACHE/contrib_refs)

Each case is OUT_DIR/<case>/ with model.onnx, input_<k>.npy and output_<k>.npy; OUT_DIR/
manifest.json lists the cases with their input and output names. Inputs are seeded random
values, so the files are the same on every run.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32


def rotary_caches(rows, half):
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    ang = np.arange(rows, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def case(name, op, inputs, attrs=None, outputs=("y",), opt=()):
    """inputs: list of (name, array or None); names of absent optional inputs are ''."""
    node_in = [n if a is not None else "" for n, a in inputs]
    while node_in and node_in[-1] == "":
        node_in.pop()
    vis = []
    feeds = {}
    for n, a in inputs:
        if a is None:
            continue
        dt = {np.dtype(np.float32): F, np.dtype(np.int64): I64, np.dtype(np.int32): I32}[a.dtype]
        vis.append(helper.make_tensor_value_info(n, dt, list(a.shape)))
        feeds[n] = a
    outs = [o for o in outputs if o]
    node = helper.make_node(op, node_in, list(outputs), domain="com.microsoft", **(attrs or {}))
    graph = helper.make_graph(
        [node], name, vis, [helper.make_tensor_value_info(o, F, None) for o in outs]
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 9
    return name, model, feeds, outs


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261205)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    cases = []
    cases.append(case("gelu", "Gelu", [("x", r(2, 3, 17) * 2)]))
    cases.append(case("fast_gelu_bias", "FastGelu", [("x", r(2, 5, 16) * 2), ("bias", r(16))]))
    cases.append(case("fast_gelu", "FastGelu", [("x", r(3, 33) * 3)]))
    cases.append(case("bias_gelu", "BiasGelu", [("a", r(3, 7, 20) * 2), ("b", r(20))]))
    cases.append(case("quick_gelu", "QuickGelu", [("x", r(4, 9) * 3)]))
    cases.append(case("quick_gelu_alpha", "QuickGelu", [("x", r(2, 3, 5) * 3)], {"alpha": 1.0}))
    # (BiasAdd has no CPU kernel in ONNX Runtime: core's unit test checks it directly)
    for name, skip_shape, beta, bias, sum_out in [
        ("skip_ln_full", (2, 4, 32), True, True, True),
        ("skip_ln_plain", (2, 4, 32), False, False, False),
        ("skip_ln_bcast", (1, 4, 32), True, False, True),
        ("skip_ln_wide", (1, 3, 768), True, True, False),
    ]:
        h = skip_shape[-1]
        x = r(2, *skip_shape[1:]) * 3 + 1
        ins = [
            ("input", x),
            ("skip", r(*skip_shape)),
            ("gamma", r(h)),
            ("beta", r(h) if beta else None),
            ("bias", r(h) if bias else None),
        ]
        outs = ("y", "", "", "sum") if sum_out else ("y",)
        cases.append(case(name, "SkipLayerNormalization", ins, {"epsilon": 1e-5}, outs))
    cos, sin = rotary_caches(32, 8)
    for inter in (0, 1):
        pos = rng.integers(0, 32, size=(2, 5)).astype(np.int64)
        cases.append(
            case(
                f"rotary_3d_inter{inter}",
                "RotaryEmbedding",
                [("x", r(2, 5, 32)), ("pos", pos), ("cos", cos), ("sin", sin)],
                {"interleaved": inter},
            )
        )
    cases.append(
        case(
            "rotary_4d_offset",
            "RotaryEmbedding",
            [("x", r(1, 2, 5, 16)), ("pos", np.array([3], dtype=np.int64)), ("cos", cos), ("sin", sin)],
        )
    )
    cos4, sin4 = rotary_caches(32, 4)
    cases.append(
        case(
            "rotary_partial",
            "RotaryEmbedding",
            [
                ("x", r(2, 3, 48)),
                ("pos", rng.integers(0, 32, size=(2, 3)).astype(np.int64)),
                ("cos", cos4),
                ("sin", sin4),
            ],
            {"num_heads": 3, "rotary_embedding_dim": 8},
        )
    )

    # MultiHeadAttention: query (2, 4, 16), key/value of 6 rows, 2 heads (value head size 4)
    q, k, v = r(2, 4, 16), r(2, 6, 16), r(2, 6, 8)
    mha = lambda extra: [("q", q), ("k", k), ("v", v)] + extra
    cases.append(case("mha_plain", "MultiHeadAttention", mha([]), {"num_heads": 2}))
    mask = np.ones((2, 6), dtype=np.int32)
    mask[0, 4:] = 0
    mask[1, 1] = 0
    cases.append(
        case(
            "mha_bias_mask_scale",
            "MultiHeadAttention",
            mha([("bias", r(40)), ("mask", mask)]),
            {"num_heads": 2, "scale": 0.3},
        )
    )
    # a decoder step: 2 new tokens after 3 past ones, causal, an additive attention bias
    q2, k2, v2 = r(2, 2, 16), r(2, 2, 16), r(2, 2, 16)
    cases.append(
        case(
            "mha_past_causal",
            "MultiHeadAttention",
            [
                ("q", q2),
                ("k", k2),
                ("v", v2),
                ("bias", None),
                ("mask", None),
                ("attn_bias", r(1, 2, 2, 5)),
                ("past_k", r(2, 2, 3, 8)),
                ("past_v", r(2, 2, 3, 8)),
            ],
            {"num_heads": 2, "unidirectional": 1},
            ("y", "present_k", "present_v"),
        )
    )

    # MatMulNBits, 4 bits, blocks of 32, accuracy level 4, with a bias and N not a multiple of
    # 4 (ONNX Runtime sums the last N % 4 columns in another order, and adds the bias before
    # the zero points' share): nxrt must equal it bit for bit on AVX-512 VNNI machines
    from onnx import numpy_helper  # noqa: E402

    K, N = 512, 259
    for m in (1, 5):
        for zp in (False, True):
            nb = K // 32
            names = ["a", "B", "scales"]
            inits = [
                numpy_helper.from_array(rng.integers(0, 256, (N, nb, 16), dtype=np.uint8), "B"),
                numpy_helper.from_array((rng.random(N * nb) * 0.02 + 0.001).astype(np.float32), "scales"),
            ]
            names.append("zp" if zp else "")
            if zp:
                inits.append(numpy_helper.from_array(rng.integers(0, 256, (N * nb // 2,), dtype=np.uint8), "zp"))
            inits.append(numpy_helper.from_array(r(N), "bias"))
            names += ["", "bias"]
            node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=K, N=N,
                                    bits=4, block_size=32, accuracy_level=4)
            a_in = (r(m, K) * 1.5).astype(np.float32)
            graph = helper.make_graph(
                [node], "nbits", [helper.make_tensor_value_info("a", F, [m, K])],
                [helper.make_tensor_value_info("y", F, [m, N])], inits)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("com.microsoft", 1)])
            model.ir_version = 9
            cases.append((f"nbits_exact_m{m}_zp{int(zp)}", model, {"a": a_in}, ["y"]))

    # QLinearAveragePool (uint8 and int8; padding counted and not, ceil mode, 1-D and 2-D)
    for name, dt, shape, attrs in [
        ("qavgpool_u8_pad", np.uint8, (2, 3, 11, 13),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
        ("qavgpool_i8_count_pad_ceil", np.int8, (1, 4, 10, 9),
         {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1,
          "ceil_mode": 1}),
        ("qavgpool_u8_1d", np.uint8, (2, 5, 17), {"kernel_shape": [4], "strides": [3]}),
    ]:
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max + 1, shape, dtype=dt)
        tp = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt))
        inits = [
            numpy_helper.from_array(np.array(0.0371, np.float32), "xs"),
            numpy_helper.from_array(np.array(7 if dt == np.int8 else 131, dt), "xz"),
            numpy_helper.from_array(np.array(0.0217, np.float32), "ys"),
            numpy_helper.from_array(np.array(-5 if dt == np.int8 else 118, dt), "yz"),
        ]
        node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                                domain="com.microsoft", **attrs)
        graph = helper.make_graph(
            [node], name, [helper.make_tensor_value_info("x", tp, list(shape))],
            [helper.make_tensor_value_info("y", tp, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 9
        cases.append((name, model, {"x": x}, ["y"]))

    # com.microsoft MatMulIntegerToFloat: (A - a_zp)(B - b_zp) * a_scale * b_scale + bias.
    # Codes kept small enough that no pair of products leaves int16 (ONNX Runtime's AVX2
    # kernel sums byte pairs in int16 with saturation; nxrt's sums are exact): the answers are
    # the exact ones on both sides. B as a constant (packed at load) and as an input, per-column
    # and per-tensor scales and zero points, with and without a bias, a batched B (the general
    # product).
    qr = np.random.default_rng(20261207)
    for name, (at, bt), (m_shape, k, n), per_col, bias, b_const, batch_b in [
        ("mm_int_to_float_u8s8", (np.uint8, np.int8), ((2, 5), 37, 19), True, True, True, False),
        ("mm_int_to_float_u8u8", (np.uint8, np.uint8), ((7,), 16, 8), False, False, False, False),
        ("mm_int_to_float_s8s8", (np.int8, np.int8), ((3, 4), 9, 33), True, False, True, False),
        ("mm_int_to_float_batched", (np.uint8, np.int8), ((2, 3), 12, 6), False, True, False, True),
    ]:
        def codes(dt, shape):
            lo, hi = (0, 100) if dt == np.uint8 else (-60, 61)
            return qr.integers(lo, hi, shape).astype(dt)
        a = codes(at, m_shape + (k,))
        b = codes(bt, ((2,) if batch_b else ()) + (k, n))
        a_scale = np.array(0.0123, np.float32)
        b_scale = (qr.uniform(0.001, 0.01, n) if per_col else np.array(0.0071)).astype(np.float32)
        a_zp = np.array(37 if at == np.uint8 else -5, at)
        b_zp = (codes(bt, (n,)) if per_col else np.array(3, bt)).astype(bt)
        tensors = [("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale),
                   ("a_zp", a_zp), ("b_zp", b_zp)]
        if bias:
            tensors.append(("bias", qr.standard_normal(n).astype(np.float32)))
        consts = {"b", "a_scale", "b_scale", "a_zp", "b_zp", "bias"} if b_const else {"bias"}
        inits = [numpy_helper.from_array(v, nm) for nm, v in tensors if nm in consts]
        ins = [helper.make_tensor_value_info(
            nm, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for nm, v in tensors if nm not in consts]
        node = helper.make_node("MatMulIntegerToFloat", [nm for nm, _ in tensors], ["y"],
                                domain="com.microsoft")
        graph = helper.make_graph([node], name, ins,
                                  [helper.make_tensor_value_info("y", F, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 9
        cases.append((name, model, {nm: v for nm, v in tensors if nm not in consts}, ["y"]))

    manifest = []
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for name, model, feeds, outs in cases:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)

        data = model.SerializeToString()
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(data)
        s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        res = s.run(outs, feeds)
        entry = {"name": name, "inputs": [], "outputs": []}
        for k, (n, a) in enumerate(feeds.items()):
            fn = f"input_{k}.npy"
            np.save(os.path.join(d, fn), a)
            entry["inputs"].append({"name": n, "file": fn})
        for k, (n, a) in enumerate(zip(outs, res)):
            fn = f"output_{k}.npy"
            np.save(os.path.join(d, fn), a)
            entry["outputs"].append({"name": n, "file": fn})
        manifest.append(entry)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"made_with": f"onnxruntime {ort.__version__}", "cases": manifest}, f, indent=1)
    print(f"{len(manifest)} contrib-op cases from onnxruntime {ort.__version__} -> {out}")


if __name__ == "__main__":
    main()
