"""A `transformers` stand-in for the local-tokenizer checks (the preflight's and `ddsweep plan`'s): it loads a
tokenizer with transformers 5's chat-template behaviour from any directory, one id per 4 characters."""

from __future__ import annotations

import types


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
