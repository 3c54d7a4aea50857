#!/usr/bin/env python3
"""Runs the ONNX backend test suites shipped in the onnx wheel besides the node tests
(`onnx/backend/test/data/{simple,pytorch-converted,pytorch-operator,real}`) on nxrt and on
ONNX Runtime, and prints one markdown table per suite.

1. Prepare: every case is written to $NXRT_CACHE/other-suites/<suite>/node/<case>/
   (model.onnx + test_data_set_0/{input,output}_N.pb) with a node_manifest.json in the format
   of the node-test manifest, so the conformance runner reads it as is. Models importing an
   ai.onnx opset older than 7 are upgraded to opset 7 with onnx.version_converter. Cases that
   cannot be prepared are listed with the reason in <suite>/skipped.json.
   `real/*` only carries data.json pointing at onnx/backend/test/data/light/light_<name>.onnx:
   its inputs are made as onnx's runner makes them (Runner.generate_dummy_data with
   random=False: every float input of shape S, free dims as 1, is arange(prod(S))/prod(S)
   reshaped to S, as float32) and the expected output is light_<name>_output_<i>.pb.
2. nxrt: target/release/conformance --dir <suite dir> --out <suite dir>/nxrt_results.json
   (build it first: cargo build --release -p nxrt-tests --bin conformance).
3. ONNX Runtime (CPU EP, Python API) on the same prepared cases with the same comparison:
   the first len(expected) outputs, shape and dtype equal, strings exactly, numbers with
   np.testing.assert_allclose(rtol, atol) from the manifest. Written to ort_results.json.

4. With --real-logits, also `real-logits`: the `real` models without their final Softmax,
   compared with ONNX Runtime's logits (the shipped outputs are constant; see
   prepare_real_logits).

usage: $NXRT_CACHE/corpus-venv/bin/python scripts/other_suites.py
          [--suite NAME ...] [--real-logits] [--prepare-only] [--no-ort] [--timeout SECS]
"""
import argparse, glob, json, os, shutil, subprocess, sys, time
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper, version_converter

CACHE = os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt"))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
ONNX_DIR = os.path.dirname(os.path.abspath(onnx.__file__))
DATA = os.path.join(ONNX_DIR, "backend", "test", "data")
SUITES = ["simple", "pytorch-converted", "pytorch-operator", "real"]
MIN_OPSET = 7  # the oldest ai.onnx opset nxrt is meant to run; older models are upgraded to it
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7  # onnx.backend.test.loader's defaults


def ai_onnx_opset(model):
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return None


def dummy_input(value_info, case):
    """The input onnx's runner feeds a `light` model: arange(n)/n in float32, free dims as 1."""
    t = value_info.type
    if t.WhichOneof("value") != "tensor_type" or t.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise ValueError(f"{case}: input '{value_info.name}' is not a float tensor; "
                         "onnx's runner only generates float inputs")
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in t.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def prepare_case(suite, case, src, dst):
    """Writes dst/model.onnx and dst/test_data_set_0; returns the manifest entry (or raises)."""
    rtol, atol = DEFAULT_RTOL, DEFAULT_ATOL
    meta = {}
    if os.path.exists(os.path.join(src, "data.json")):
        with open(os.path.join(src, "data.json")) as f:
            meta = json.load(f)
        rtol, atol = meta.get("rtol", rtol), meta.get("atol", atol)
    light = None
    if os.path.exists(os.path.join(src, "model.onnx")):
        model_path = os.path.join(src, "model.onnx")
        sets = sorted(glob.glob(os.path.join(src, "test_data_set_*")))
        if not sets:
            raise ValueError("no test_data_set_* directory")
    else:
        url = meta.get("url", "")
        if not url.startswith("onnx/backend/test/data/light/"):
            raise ValueError(f"model is only downloadable ({url}); not fetched")
        model_path = os.path.normpath(os.path.join(ONNX_DIR, "..", url))
        if not os.path.exists(model_path):
            raise ValueError(f"{url} is not in the installed onnx wheel")
        light = os.path.splitext(model_path)[0]
        sets = []
    model = onnx.load(model_path)
    opset = ai_onnx_opset(model)
    entry = {"rtol": rtol, "atol": atol, "source": os.path.relpath(model_path, ONNX_DIR),
             "source_ir_version": model.ir_version, "source_opset": opset}
    if opset is not None and opset < MIN_OPSET:
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
            onnx.checker.check_model(model)
        except Exception as e:  # the converter's or the checker's message is the reason
            msg = " ".join(str(e).split())
            raise ValueError(f"version_converter {opset} -> {MIN_OPSET} failed: "
                             f"{type(e).__name__}: {msg[:400]}") from None
        entry["converted_to_opset"] = MIN_OPSET
    os.makedirs(os.path.join(dst, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(dst, "model.onnx"))
    out_set = os.path.join(dst, "test_data_set_0")
    if light is None:
        for f in sorted(os.listdir(sets[0])):
            shutil.copyfile(os.path.join(sets[0], f), os.path.join(out_set, f))
        entry["n_data_sets_in_source"] = len(sets)
    else:
        inits = {i.name for i in model.graph.initializer}
        feeds = [vi for vi in model.graph.input if vi.name not in inits]
        for k, vi in enumerate(feeds):
            t = numpy_helper.from_array(dummy_input(vi, case))
            with open(os.path.join(out_set, f"input_{k}.pb"), "wb") as f:
                f.write(t.SerializeToString())
        for k in range(len(model.graph.output)):
            ref = f"{light}_output_{k}.pb"
            if not os.path.exists(ref):
                raise ValueError(f"no expected output {os.path.basename(ref)} in the wheel "
                                 "(onnx's runner would compute it with its ReferenceEvaluator)")
            shutil.copyfile(ref, os.path.join(out_set, f"output_{k}.pb"))
        entry["inputs"] = "arange(n)/n float32, as onnx Runner.generate_dummy_data(random=False)"
    ops = Counter(n.op_type for n in model.graph.node)
    domains = sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    entry.update({
        "op_type": ops.most_common(1)[0][0] if len(ops) == 1 else "+".join(sorted(ops)),
        "domain": ",".join(domains),
        "expanded": False,
        "ir_version": model.ir_version,
        "n_nodes": len(model.graph.node),
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
    })
    return entry


def prepare_suite(suite):
    src_root = os.path.join(DATA, suite)
    out = os.path.join(CACHE, "other-suites", suite)
    shutil.rmtree(os.path.join(out, "node"), ignore_errors=True)
    os.makedirs(os.path.join(out, "node"), exist_ok=True)
    cases, skipped = {}, {}
    names = sorted(c for c in os.listdir(src_root) if os.path.isdir(os.path.join(src_root, c)))
    for case in names:
        dst = os.path.join(out, "node", case)
        try:
            cases[case] = prepare_case(suite, case, os.path.join(src_root, case), dst)
        except Exception as e:
            skipped[case] = str(e)
            shutil.rmtree(dst, ignore_errors=True)
    manifest = {"suite": suite, "onnx_version": onnx.__version__,
                "numpy_version": np.__version__, "source": os.path.relpath(src_root, ONNX_DIR),
                "n_cases": len(cases), "cases": cases}
    with open(os.path.join(out, "node_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "skipped.json"), "w") as f:
        json.dump(skipped, f, indent=1, sort_keys=True)
    return out, names, cases, skipped


# ------------------------------------------------------------------ ONNX Runtime side
def load_value(path, type_proto):
    """A .pb of the kind the graph declares (tensor, sequence, optional or map)."""
    with open(path, "rb") as f:
        b = f.read()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        p = onnx.SequenceProto(); p.ParseFromString(b); return numpy_helper.to_list(p)
    if kind == "optional_type":
        p = onnx.OptionalProto(); p.ParseFromString(b); return numpy_helper.to_optional(p)
    if kind == "map_type":
        p = onnx.MapProto(); p.ParseFromString(b); return numpy_helper.to_dict(p)
    p = onnx.TensorProto(); p.ParseFromString(b); return numpy_helper.to_array(p)


def compare(got, want, rtol, atol):
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            raise AssertionError(f"sequence of {len(want)} expected, got {type(got).__name__}")
        for g, w in zip(got, want):
            compare(g, w, rtol, atol)
        return
    got = np.asarray(got)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape}, expected {want.shape}")
    if want.dtype == object or want.dtype.kind in "US":
        np.testing.assert_array_equal(got.astype(object), want.astype(object))
        return
    if got.dtype != want.dtype:
        raise AssertionError(f"dtype {got.dtype}, expected {want.dtype}")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def ort_case(ort, case_dir, rtol, atol):
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    # input_k.pb feeds the k-th graph input that has no initializer (how onnx's runner writes
    # the light models' inputs, and how nxrt's runner maps them); in IR 3 models the weights
    # are graph inputs too, sometimes listed before the data.
    inits = {i.name for i in model.graph.initializer}
    data = os.path.join(case_dir, "test_data_set_0")
    feeds = {}
    for k, vi in enumerate(v for v in model.graph.input if v.name not in inits):
        p = os.path.join(data, f"input_{k}.pb")
        if not os.path.exists(p):
            break
        feeds[vi.name] = load_value(p, vi.type)
    expected = []
    for k, vo in enumerate(model.graph.output):
        p = os.path.join(data, f"output_{k}.pb")
        if not os.path.exists(p):
            break
        expected.append(load_value(p, vo.type))
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:
        return "error", "load: " + " ".join(str(e).split())[:300]
    try:
        outs = sess.run(None, feeds)
    except Exception as e:
        return "error", "run: " + " ".join(str(e).split())[:300]
    if len(outs) < len(expected):
        return "fail", f"{len(outs)} outputs, expected {len(expected)}"
    for k, (g, w) in enumerate(zip(outs, expected)):
        try:
            compare(g, w, rtol, atol)
        except AssertionError as e:
            lines = [l.strip() for l in str(e).splitlines() if l.strip()]
            return "fail", f"output {k}: " + " | ".join(lines[:4])[:300]
    return "pass", ""


def run_ort(out, cases):
    import onnxruntime as ort
    ort.set_default_logger_severity(4)  # errors are recorded per case; keep stderr quiet
    res = {}
    for case, meta in cases.items():
        try:
            res[case] = ort_case(ort, os.path.join(out, "node", case), meta["rtol"], meta["atol"])
        except Exception as e:  # harness problem (unreadable data): counted as an error
            res[case] = ("error", f"harness: {type(e).__name__}: {e}"[:300])
    with open(os.path.join(out, "ort_results.json"), "w") as f:
        json.dump({"onnxruntime_version": ort.__version__, "provider": "CPUExecutionProvider",
                   "results": {c: (s if s == "pass" else f"{s}: {m}") for c, (s, m) in res.items()}},
                  f, indent=1, sort_keys=True)
    return res, ort.__version__


# ------------------------------------------------------------------ nxrt side
def run_nxrt(out, timeout):
    exe = os.path.join(ROOT, "target", "release", "conformance")
    if not os.path.exists(exe):
        sys.exit(f"{exe} is missing: cargo build --release -p nxrt-tests --bin conformance")
    res_path = os.path.join(out, "nxrt_results.json")
    p = subprocess.run([exe, "--dir", out, "--out", res_path, "--timeout", str(timeout)],
                       capture_output=True, text=True)
    summary = p.stdout.strip().splitlines()
    if p.returncode != 0 or not os.path.exists(res_path):
        sys.exit(f"conformance failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    with open(res_path) as f:
        r = json.load(f)
    res = {c: ("pass", "") for c in r["passing_cases"]}
    for c, m in r["failing_cases"].items():
        tag, _, msg = m.partition(": ")
        res[c] = (tag, msg)
    return res, summary[-2] if len(summary) >= 2 else ""


def tally(res):
    c = Counter(s for s, _ in res.values())
    return c["pass"], c["fail"], c["error"]


def prepare_real_logits():
    """A stronger check than `real` (see docs/other-suites.md): the light models' shipped outputs
    are constant (softmax of 1000 equal logits = 0.001 everywhere), so any finite run with equal
    logits matches them. This drops each model's final Softmax and takes the expected values of
    the tensor that fed it (the logits; densenet121 has no Softmax and keeps its output) from
    ONNX Runtime on the same input: it checks nxrt against ORT, not against onnx's reference."""
    import onnxruntime as ort
    ort.set_default_logger_severity(4)
    src = os.path.join(CACHE, "other-suites", "real")
    out = os.path.join(CACHE, "other-suites", "real-logits")
    shutil.rmtree(os.path.join(out, "node"), ignore_errors=True)
    with open(os.path.join(src, "node_manifest.json")) as f:
        base = json.load(f)["cases"]
    cases, skipped = {}, {}
    for case, meta in sorted(base.items()):
        dst = os.path.join(out, "node", case)
        model = onnx.load(os.path.join(src, "node", case, "model.onnx"))
        last = model.graph.node[-1]
        if last.op_type == "Softmax" and last.output[0] == model.graph.output[0].name:
            model.graph.node.pop()
            del model.graph.output[:]
            model.graph.output.append(onnx.helper.make_tensor_value_info(
                last.input[0], onnx.TensorProto.FLOAT, None))
        os.makedirs(os.path.join(dst, "test_data_set_0"))
        onnx.save(model, os.path.join(dst, "model.onnx"))
        shutil.copyfile(os.path.join(src, "node", case, "test_data_set_0", "input_0.pb"),
                        os.path.join(dst, "test_data_set_0", "input_0.pb"))
        x = load_value(os.path.join(dst, "test_data_set_0", "input_0.pb"),
                       model.graph.input[0].type)
        try:
            sess = ort.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x}
            y = sess.run(None, feed)[0]
        except Exception as e:
            skipped[case] = "ORT could not compute the reference: " + " ".join(str(e).split())[:300]
            shutil.rmtree(dst)
            continue
        with open(os.path.join(dst, "test_data_set_0", "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y).SerializeToString())
        cases[case] = dict(meta, expected="ONNX Runtime %s CPU" % ort.__version__,
                           output=last.input[0] if last.op_type == "Softmax" else "model output",
                           expected_min=float(y.min()), expected_max=float(y.max()))
    with open(os.path.join(out, "node_manifest.json"), "w") as f:
        json.dump({"suite": "real-logits", "onnx_version": onnx.__version__, "cases": cases},
                  f, indent=1, sort_keys=True)
    with open(os.path.join(out, "skipped.json"), "w") as f:
        json.dump(skipped, f, indent=1, sort_keys=True)
    return out, sorted(base), cases, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", action="append", choices=SUITES)
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--timeout", type=int, default=300, help="per-case limit for nxrt (s)")
    ap.add_argument("--real-logits", action="store_true",
                    help="also check the real models' logits against ORT (see prepare_real_logits)")
    a = ap.parse_args()
    totals = {}
    todo = list(a.suite or SUITES) + (["real-logits"] if a.real_logits else [])
    for suite in todo:
        t0 = time.time()
        if suite == "real-logits":
            if not os.path.exists(os.path.join(CACHE, "other-suites", "real", "node")):
                prepare_suite("real")
            out, names, cases, skipped = prepare_real_logits()
        else:
            out, names, cases, skipped = prepare_suite(suite)
        print(f"## {suite}\n\nprepared {len(cases)} of {len(names)} cases into {out} "
              f"({sum('converted_to_opset' in m for m in cases.values())} upgraded to opset "
              f"{MIN_OPSET}, {len(skipped)} skipped) in {time.time() - t0:.1f} s\n", flush=True)
        if a.prepare_only:
            continue
        nx, line = run_nxrt(out, a.timeout) if cases else ({}, "")
        use_ort = cases and not a.no_ort and suite != "real-logits"  # ORT is its reference
        ort_res, ort_ver = run_ort(out, cases) if use_ort else ({}, "-")
        n_p, n_f, n_e = tally(nx)
        o_p, o_f, o_e = tally(ort_res)
        print("| suite | cases | prepared | nxrt pass | nxrt fail | nxrt error "
              "| ORT pass | ORT fail | ORT error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(f"| {suite} | {len(names)} | {len(cases)} | {n_p} | {n_f} | {n_e} "
              f"| {o_p if ort_res else '-'} | {o_f if ort_res else '-'} "
              f"| {o_e if ort_res else '-'} |\n")
        if suite != "real-logits":  # an extra check of the same cases, not another suite
            totals[suite] = (len(names), len(cases), n_p, n_f, n_e, o_p, o_f, o_e)
        if skipped:
            print("skipped (not prepared):")
            for c, why in sorted(skipped.items()):
                print(f"- `{c}`: {why}")
            print()
        bad = sorted(c for c, (s, _) in nx.items() if s != "pass")
        if bad:
            print("nxrt failures:")
            for c in bad:
                s, m = nx[c]
                o = ort_res.get(c, ("not run", ""))[0]
                print(f"- `{c}` (ORT: {o}): nxrt {s}: {m}")
            print()
        ort_bad = sorted(c for c, (s, _) in ort_res.items() if s != "pass")
        if ort_bad:
            print(f"ORT {ort_ver} failures:")
            for c in ort_bad:
                print(f"- `{c}`: ORT {ort_res[c][0]}: {ort_res[c][1]}")
            print()
        print(f"({line}; {time.time() - t0:.1f} s for the suite)\n", flush=True)
    if len(totals) > 1:
        print("## all suites\n")
        print("| suite | cases | prepared | nxrt pass | nxrt fail | nxrt error "
              "| ORT pass | ORT fail | ORT error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s, t in totals.items():
            print(f"| {s} | " + " | ".join(str(x) for x in t) + " |")
        tot = [sum(t[i] for t in totals.values()) for i in range(8)]
        print("| **total** | " + " | ".join(str(x) for x in tot) + " |")


if __name__ == "__main__":
    main()
