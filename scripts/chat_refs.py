#!/usr/bin/env python3
"""Chat-template references from HF `transformers` (its `apply_chat_template`, the renderer
model folders are written for): for the real template of the llama3 tokenizer folder that
`../shared/genai/fetch_genai.sh` fetches, and for templates written here to exercise what
templates use (default system turns, `raise_exception`, Python string methods, `namespace`,
`loop.last`, `tojson` with and without `indent`, `trim_blocks` / `lstrip_blocks` on
multi-line blocks), every conversation below rendered with and without the generation prompt:
the text and the ids (`tokenize=True`), or that HF raises.

    $NXRT_CACHE/corpus-venv/bin/python scripts/chat_refs.py OUT.json

`tests/tests/tokenizer_refs.rs` renders the same and compares (scripts/test.sh writes OUT as
$NXRT_CACHE/genai/chat_refs.json)."""
import json, os, sys

from transformers import AutoTokenizer

CACHE = os.environ.get("NXRT_CACHE", os.path.expanduser("~/.cache/nxrt"))
FOLDER = os.path.join(CACHE, "genai", "tokenizers", "llama3")

TEMPLATES = {
    # the folder's own (tokenizer_config.json)
    "llama3": None,
    "im_blocks": (
        "{%- if messages[0].role != 'system' %}<|im_start|>system\nYou are a helpful assistant."
        "<|im_end|>\n{% endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
        "{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "strict_turns": (
        "{% set ns = namespace(n=0) %}{{ bos_token }}"
        "{% for m in messages %}"
        "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('turns must alternate user, assistant') }}{% endif %}"
        "{% set ns.n = ns.n + 1 %}"
        "[{{ m['role'].upper() }}] {{ m['content'].strip() }}"
        "{% if m['content'].startswith('Q:') %} (question){% endif %}"
        "{% if not loop.last %} | {% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %} [ASSISTANT]{% else %}{{ eos_token }}{% endif %}"
        " turns={{ ns.n }}"
    ),
    "as_json": "{{ messages | tojson }}\n{{ messages[-1] | tojson(indent=2) }}",
    "line_blocks": (
        "{% for m in messages %}\n"
        "  {% if m.role == 'system' %}\n"
        "System: {{ m.content }}\n"
        "  {% elif m.role == 'user' %}\n"
        "User: {{ m.content }}\n"
        "  {% else %}\n"
        "Assistant: {{ m.content }}\n"
        "  {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}\n"
        "Assistant:\n"
        "{% endif %}\n"
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "  Why is the sky blue?  "},
    ],
    [
        {"role": "user", "content": "Q: what is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "Grüße aus Köln, 世界 ✓ \"quoted\" and a\nnewline"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "tabs\tand  spaces"},
    ],
]


def main():
    out = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(FOLDER)
    cases = []
    for name, tmpl in TEMPLATES.items():
        for conv in CONVERSATIONS:
            for gen in (True, False):
                case = {"template": name, "messages": conv, "add_generation_prompt": gen}
                kw = {} if tmpl is None else {"chat_template": tmpl}
                try:
                    case["text"] = tok.apply_chat_template(
                        conv, tokenize=False, add_generation_prompt=gen, **kw)
                    ids = tok.apply_chat_template(
                        conv, tokenize=True, add_generation_prompt=gen, **kw)
                    case["ids"] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                except Exception as e:  # noqa: BLE001 (HF raises the template's own error)
                    case["error"] = str(e)
                cases.append(case)
    refs = {
        "made_with": "transformers " + __import__("transformers").__version__,
        "folder": os.path.relpath(FOLDER, CACHE),
        "templates": {k: v for k, v in TEMPLATES.items() if v is not None},
        "tokens": {k: getattr(tok, k) for k in ("bos_token", "eos_token")},
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(refs, f, ensure_ascii=False, indent=1)
    print(f"{out}: {len(cases)} cases, {sum('error' in c for c in cases)} raising")


main()
