"""The preflight's local tokenizer counts a chat prompt as SGLang's /tokenize does: the template rendered to text,
then encoded (transformers 5 answers apply_chat_template(tokenize=True) with a dict, whose keys are no ids)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from ddsweep.point.feasibility import local_tokenizer


def ids_of(text: str) -> list[int]:
    """One id per 4 characters."""
    return [sum(map(ord, text[i:i + 4])) for i in range(0, len(text), 4)]


def fake_transformers() -> types.ModuleType:
    """A `transformers` module whose AutoTokenizer loads FakeTokenizer from any directory."""
    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda path: FakeTokenizer())
    return fake


class FakeTokenizer:
    """transformers 5's behaviour: a dict for tokenize=True, text for tokenize=False; one id per 4 characters."""

    def apply_chat_template(self, messages, tokenize: bool = True, add_generation_prompt: bool = False):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                            else "")
        return {"input_ids": ids_of(text), "attention_mask": [1] * len(ids_of(text))} if tokenize else text

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": ([1] if add_special_tokens else []) + ids_of(text)}


def test_a_chat_prompt_is_counted_in_tokens_of_its_rendered_text(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers())
    tokenize, source = local_tokenizer({"target": {"model_path": str(tmp_path)}})
    assert tokenize is not None and str(tmp_path) in source
    ids = tokenize({"messages": [{"role": "user", "content": "def f(x):"}]})
    assert ids == ids_of("<user>def f(x):<assistant>") and len(ids) == 7  # not 2, the keys of the dict
    assert tokenize({"prompt": "abcd"}) == [1, 394]
