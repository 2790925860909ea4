"""Write a tiny, randomly initialised Llama-architecture model with a locally trained tokenizer, for a real
SGLang server on a CPU: nothing is downloaded. The weights are random (the model's text is noise); the tokenizer
is a byte-level BPE trained on the Python standard library's own sources, with BOS/EOS and a chat template.
Seeded, so the same command writes the same model. Usage: python make_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
# A Llama-3-like template: role headers, the end-of-sequence token closing every turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CONTEXT = 2048


def stdlib_texts(limit_bytes: int) -> Iterator[str]:
    """Source text that ships with Python (the standard library's .py files), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        total += len(text)
        yield text
        if total >= limit_bytes:
            return


def train_tokenizer(vocab_size: int, corpus_bytes: int):
    """A byte-level BPE tokenizer trained on the standard library's sources, BOS prepended by its post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(stdlib_texts(corpus_bytes), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                             special_tokens=[(BOS, bos_id)])
    return tokenizer


def write_model(out: Path, seed: int, vocab_size: int, hidden: int, layers: int, corpus_bytes: int) -> dict:
    """Write tokenizer, config and random safetensors weights to `out`; returns the summary written beside them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    raw = train_tokenizer(vocab_size, corpus_bytes)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        model_max_length=CONTEXT, chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=CONTEXT, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    summary = {"architecture": "LlamaForCausalLM", "seed": seed, "vocab_size": len(tokenizer), "hidden_size": hidden,
               "num_hidden_layers": layers, "max_position_embeddings": CONTEXT,
               "parameters": sum(p.numel() for p in model.parameters()),
               "tokenizer": f"byte-level BPE trained on {corpus_bytes} bytes of Python "
                            f"{sysconfig.get_python_version()}'s standard library",
               "weights": "random (the model's output is noise)"}
    (out / "ddsweep-tiny-model.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--corpus-bytes", type=int, default=4_000_000)
    args = parser.parse_args()
    summary = write_model(args.out, args.seed, args.vocab_size, args.hidden_size, args.layers, args.corpus_bytes)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
