"""Build the tiny random-weight Llama that the real-SGLang tests serve (run with .venv-sglang).

    python build_tiny_model.py --tokenizer-dir DIR --out MODEL_DIR

`--tokenizer-dir` holds the served tokenizer (tokenizer.json, tokenizer_config.json with a chat
template), written by homing (`python -m homing.text.served DIR`), so the simulator and SGLang
serve the same tokenizer. The model: 2 layers, hidden 128, 4 heads (2 KV heads, head dim 32),
vocab = the tokenizer's largest id + 1 rounded up to 64, bf16, weights from a fixed seed;
about 74 MB. Writes into a temporary folder and renames it, so a crash leaves no half model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
VOCAB_MULTIPLE = 64


def build(tokenizer_dir: Path, out: Path) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    largest = max(tokenizer.get_vocab().values())
    vocab_size = -(-(largest + 1) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "homing-tiny-model.json").write_text(
            json.dumps({"seed": SEED, "vocab_size": vocab_size}) + "\n"
        )
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    build(args.tokenizer_dir, args.out)


if __name__ == "__main__":
    main()
