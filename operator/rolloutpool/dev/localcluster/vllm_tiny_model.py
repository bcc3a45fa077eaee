"""Make a tiny random-weight Llama and a locally trained tokenizer for vLLM (no hub, no download).

Run by the cached vLLM venv's python (it imports torch, transformers and tokenizers,
which the project's own venv does not have): ``python vllm_tiny_model.py OUT_DIR``.
:mod:`rolloutpool.dev.localcluster.vllm_model` calls it once per machine and caches the
result. The model is what DESIGN section 5 describes: 2 layers, ``head_dim`` 32 (the
CPU attention backend needs >= 32), vocabulary 2048, random weights with a fixed seed,
saved as safetensors; the tokenizer is a byte-level BPE trained on a synthetic corpus,
with a small chat template.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "VOCAB_SIZE", "build", "corpus"]

VOCAB_SIZE = 2048
SPECIALS = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "an", "el", "or", "ix", "um")


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """A deterministic synthetic text: pseudo-words, digits, punctuation and the chat markers."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible corpus, not cryptography
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for i in range(lines):
        n = rng.randint(4, 24)
        text = " ".join(rng.choice(words) for _ in range(n))
        out.append(f"<|{rng.choice(('system', 'user', 'assistant'))}|>\n{text.capitalize()} {i}. {rng.random():.3f}!")
    return out


def build(out: Path) -> None:
    """Write config, safetensors weights, tokenizer and chat template into ``out``."""
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    tokenizers: Any = importlib.import_module("tokenizers")

    out.mkdir(parents=True, exist_ok=True)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=list(SPECIALS))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        model_max_length=4096,
        **dict(zip(("unk_token", "bos_token", "eos_token"), SPECIALS, strict=True)),
        pad_token=SPECIALS[2],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "rolloutpool-tiny-model.json").write_text(json.dumps({"vocab_size": VOCAB_SIZE, "layers": 2}) + "\n")


if __name__ == "__main__":  # pragma: no cover - run by the vLLM venv's python
    if len(sys.argv) != 2:
        sys.exit("usage: python vllm_tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]))
