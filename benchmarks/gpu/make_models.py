"""Write config-only models for a real SGLang on one GPU with `--load-format dummy` (SGLang draws random weights):
a Llama-shaped target (hidden 2048, 16 layers: about 1.3B parameters) with a byte-level BPE tokenizer trained on
Python's standard library, and a DFlash drafter config reading three of the target's layers. Nothing is
downloaded; the same command writes the same files. Usage: python3 make_models.py OUT_DIR
(writes OUT_DIR/target and OUT_DIR/dflash)."""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTEXT = 8192


def tokenizer(vocab: int):
    """A byte-level BPE trained on the standard library's sources, BOS prepended, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    files = [str(p) for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:300]]
    raw.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", raw.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", additional_special_tokens=SPECIALS[4:],
                                   model_max_length=CONTEXT)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_models(out: Path, hidden: int, layers: int, vocab: int, block_size: int, draft_layers: int) -> dict:
    """Write target/ and dflash/ under `out`; returns what was written."""
    tok = tokenizer(vocab)
    heads = hidden // 128
    base = {"vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": hidden * 4,
            "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 4), "head_dim": 128,
            "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "hidden_act": "silu",
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False, "model_type": "llama"}
    layer_ids = sorted({1, layers // 2, layers - 2})
    mask = tok.convert_tokens_to_ids("<|MASK|>")
    configs = {
        "target": {**base, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers},
        "dflash": {**base, "architectures": ["DFlashDraftModel"], "num_hidden_layers": draft_layers,
                   "block_size": block_size, "num_target_layers": layers,
                   "dflash_config": {"target_layer_ids": layer_ids, "mask_token": "<|MASK|>", "mask_token_id": mask,
                                     "block_size": block_size, "num_target_layers": layers}},
    }
    for name, config in configs.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        (folder / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}))
    return {"target": str(out / "target"), "dflash": str(out / "dflash"), "vocab": len(tok), "hidden": hidden,
            "layers": layers, "draft_layers": draft_layers, "block_size": block_size, "target_layer_ids": layer_ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(write_models(args.out, args.hidden, args.layers, args.vocab, args.block_size,
                                  args.draft_layers)))


if __name__ == "__main__":
    main()
