"""Golden ids and renderings for extproc/tokenize's tests, from the
reference implementation: Hugging Face's tokenizers (ids) and transformers'
apply_chat_template (chat templates), on the same files.

Reads {"dir": ..., "cases": [...]} on stdin and writes one result per case
on stdout as JSON: {"ids": [...], "text": "...", "error": "..."}.

A case is {"kind": "text", "text": ..., "add_special": bool} (the
tokenizer alone) or {"kind": "chat", "messages": [...], "tools": [...],
"add_generation_prompt": bool, "kwargs": {...}} (the chat template rendered,
then tokenized without special tokens, as SGLang does).
"""
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def main():
    req = json.load(sys.stdin)
    d = req["dir"]
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    hf = None
    out = []
    for case in req["cases"]:
        try:
            if case["kind"] == "text":
                ids = tok.encode(case["text"], add_special_tokens=case.get("add_special", False)).ids
                out.append({"ids": ids})
            else:
                if hf is None:
                    hf = AutoTokenizer.from_pretrained(d)
                text = hf.apply_chat_template(
                    case["messages"],
                    tools=case.get("tools"),
                    add_generation_prompt=case.get("add_generation_prompt", True),
                    tokenize=False,
                    **(case.get("kwargs") or {}),
                )
                ids = tok.encode(text, add_special_tokens=False).ids
                out.append({"ids": ids, "text": text})
        except Exception as e:  # the Go side checks for an expected error
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
