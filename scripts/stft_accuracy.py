#!/usr/bin/env python3
"""Shows that ONNX Runtime's reference for asr_whisper80 deviates from the exact (float64) log-mel
features while nxrt does not: recomputes the model's graph (reflect pad, Hann STFT n_fft 400 hop
160, power, mel matrix, log10, max-8 floor, (x+4)/4) in float64 with numpy and compares both.
usage: stft_accuracy.py [path/to/nxrt]   (corpus venv python)"""
import json, os, subprocess, sys, tempfile
import numpy as np, onnx, onnxruntime as ort

d = os.path.join(os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt")), "corpus", "asr_whisper80")
nxrt = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "target", "release", "nxrt")
m = onnx.load(os.path.join(d, "model.onnx"))
m.graph.output.append(onnx.helper.make_value_info("waveforms_6", onnx.TypeProto()))
tmp = tempfile.mkdtemp()
onnx.save(m, os.path.join(tmp, "m.onnx"))
io = json.load(open(os.path.join(d, "ref", "default", "io.json")))
feed = {i["name"]: np.load(os.path.join(d, "ref", "default", i["file"])) for i in io["inputs"]}
s = ort.InferenceSession(os.path.join(tmp, "m.onnx"), providers=["CPUExecutionProvider"])
ort_out = dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
cmd = [nxrt, "run", os.path.join(tmp, "m.onnx"), "--output-dir", tmp]
for i in io["inputs"]:
    cmd += ["--input", f"{i['name']}={os.path.join(d, 'ref', 'default', i['file'])}"]
subprocess.run(cmd, check=True, capture_output=True)
ours = np.load(os.path.join(tmp, "features.npy"))
init = {i.name: onnx.numpy_helper.to_array(i).astype(np.float64) for i in m.graph.initializer}
x = ort_out["waveforms_6"].astype(np.float64)[0]
hop, n = 160, 400
frames = (len(x) - n) // hop + 1
F = np.stack([np.fft.rfft(x[k * hop:k * hop + n] * init["hann_window"]) for k in range(frames)])[:-1]
mel = (np.abs(F) ** 2) @ init["melscale_fbanks80"]
t = np.log10(np.maximum(mel, 1e-10))
t = np.maximum(t, t.max() - 8)
truth = ((t + 4) / 4).T[None]
out = lambda a: int((np.abs(a - truth) > 1e-4 + 1e-3 * np.abs(truth)).sum())
print(f"max |err| vs float64: ORT {np.abs(ort_out['features'] - truth).max():.3e}, nxrt {np.abs(ours - truth).max():.3e}")
print(f"elements outside rtol 1e-3/atol 1e-4 of float64: ORT {out(ort_out['features'])}, nxrt {out(ours)}")
assert np.abs(ours - truth).max() < np.abs(ort_out["features"] - truth).max()
