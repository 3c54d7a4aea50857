"""The public corpus as the benchmark scripts see it: the models issue 01 runs and each model's
first reference case (its inputs as (name, .npy path) pairs). Fetched by
../shared/corpus/fetch_corpus.sh into $NXRT_CACHE/corpus."""
import json, os

CACHE = os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt"))
CORPUS = os.path.join(CACHE, "corpus")


def corpus_models(only="", root=CORPUS):
    """Model names (all but the onnxruntime-genai pair), sorted; `only`: comma-separated subset;
    `root`: another folder in the corpus layout (the single-op models of make_micro.py)."""
    models = sorted(m for m in os.listdir(root)
                    if os.path.exists(os.path.join(root, m, "model.onnx")) and not m.startswith("tiny_llama_genai"))
    if only:
        models = [m for m in models if m in only.split(",")]
    return models


def first_case(model, root=CORPUS):
    """(model.onnx path, case name, [(input name, .npy path)]) of the model's first reference case."""
    mdir = os.path.join(root, model)
    case = sorted(os.listdir(os.path.join(mdir, "ref")))[0]
    cdir = os.path.join(mdir, "ref", case)
    io = json.load(open(os.path.join(cdir, "io.json")))
    return os.path.join(mdir, "model.onnx"), case, [(i["name"], os.path.join(cdir, i["file"])) for i in io["inputs"]]
