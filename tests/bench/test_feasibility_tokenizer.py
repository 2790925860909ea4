"""The preflight's local tokenizer counts a chat prompt as SGLang's /tokenize does: the template rendered to text,
then encoded (transformers 5 answers apply_chat_template(tokenize=True) with a dict, whose keys are no ids)."""

from __future__ import annotations

import sys
from pathlib import Path

from faketransformers import fake_transformers, ids_of

from ddsweep.bench.feasibility import local_tokenizer


def test_a_chat_prompt_is_counted_in_tokens_of_its_rendered_text(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers())
    tokenize, source = local_tokenizer({"target": {"model_path": str(tmp_path)}})
    assert tokenize is not None and str(tmp_path) in source
    ids = tokenize({"messages": [{"role": "user", "content": "def f(x):"}]})
    assert ids == ids_of("<user>def f(x):<assistant>") and len(ids) == 7  # not 2, the keys of the dict
    assert tokenize({"prompt": "abcd"}) == [1, 394]
