"""The run's tokenizer beside a Hugging Face export, so that `AutoTokenizer.from_pretrained(DIR)` encodes as the run's
data was encoded and `generate()` knows where a document ends.

A prepared dataset names its tokenizer (contract/data/run_tokenizer.py): its tokenizer.json is saved as transformers'
fast tokenizer with the end-of-document token as `eos_token`, the other special tokens its tokenizer_config.json
names (bos_token, pad_token, unk_token, when the vocabulary holds them) and its chat template (contract/data/sft.py
finds it as transformers does), which save_pretrained writes as chat_template.jinja. The `bytes` tokenizer has no file: an equivalent one
is built, byte-level BPE without merges over a vocabulary whose id of each byte is the byte (GPT-2's byte-to-character
table, as every byte-level tokenizer writes it), and the end-of-document id 256 as a special token.
"""

from __future__ import annotations

from typing import Any

from contract.data.run_tokenizer import RunTokenizer

BYTES_EOD_TOKEN = "<|endoftext|>"  # the text of the bytes tokenizer's end-of-document id (256), which has none


def bytes_tokenizer() -> Any:
    """A `tokenizers` Tokenizer that encodes text as its UTF-8 bytes (ids 0-255), 256 the end of a document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([BYTES_EOD_TOKEN])
    return tokenizer


def fast_tokenizer(run: RunTokenizer, max_len: int) -> Any:
    """transformers' PreTrainedTokenizerFast of the run's tokenizer, its end of document as eos_token."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from contract.data.sft import chat_template, special_tokens

    inner = bytes_tokenizer() if run.path is None else Tokenizer.from_file(run.path)
    eos = inner.id_to_token(run.eod_id)
    if eos is None:
        raise ValueError(f"the run's tokenizer {run.name} has no token of its end-of-document id {run.eod_id}")
    named = {key: token for key, token in special_tokens(run.path).items()
             if key != "eos_token" and token and inner.token_to_id(token) is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=eos, model_max_length=max_len,
                                   clean_up_tokenization_spaces=False, **named)
    template = chat_template(run.path)
    if template is not None:
        fast.chat_template = template.template
    return fast


def special_ids(fast: Any | None) -> dict[str, int | None]:
    """config.json's bos/eos/pad ids: the tokenizer's own, None where it has none (not the config class's
    defaults, LlamaConfig's bos 1 and eos 2)."""
    return {f"{kind}_token_id": None if fast is None else getattr(fast, f"{kind}_token_id", None)
            for kind in ("bos", "eos", "pad")}

