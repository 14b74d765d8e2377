"""Supervised fine-tuning data for tests: a character-level BPE (trained by `tokenizers` here) with a chat template
written beside it, and "shift: abc" -> "bcd" records (each letter to the next, f to a), a task a tiny model learns
in a few hundred steps and answers for words it never saw."""

from __future__ import annotations

import json
import random
from pathlib import Path

LETTERS = "abcdef"
SPECIALS = ["<|end|>", "<|user|>", "<|assistant|>"]
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n{% else %}<|assistant|>"
            "{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>"
            "{% endif %}")
HELD_OUT = ("fed", "abc", "cab", "bad", "dfa")


def shift(word: str) -> str:
    return "".join(LETTERS[(LETTERS.index(c) + 1) % len(LETTERS)] for c in word)


def write_tokenizer(directory: Path, template: str | None = TEMPLATE) -> Path:
    """A BPE over single characters (no merges: every letter its own token) and, with `template`, a
    tokenizer_config.json naming its chat template and eos_token <|end|>."""
    from tokenizers import Tokenizer, decoders, models, trainers

    chars = sorted(set(LETTERS + "shift: prompt\n"))
    tokenizer = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=len(SPECIALS) + len(chars), special_tokens=SPECIALS,
                                  initial_alphabet=chars, show_progress=False)
    tokenizer.train_from_iterator([LETTERS], trainer)
    tokenizer.decoder = decoders.Fuse()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|end|>"} | ({"chat_template": template} if template else {})
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def words(count: int, seed: int = 0, length: int = 3) -> list[str]:
    """`count` random words of LETTERS, none of HELD_OUT."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        word = "".join(rng.choice(LETTERS) for _ in range(length))
        if word not in HELD_OUT:
            out.append(word)
    return out


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def shift_records(path: Path, count: int, seed: int = 0) -> Path:
    return write_records(path, [{"prompt": f"shift: {w}", "response": shift(w)} for w in words(count, seed)])
