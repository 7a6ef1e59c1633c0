"""A character-level tokenizer built locally (no download), wrapped as a transformers tokenizer.

Every printable ASCII character is one token; ``</think>`` (end of thinking), ``<eos>`` and
``<pad>`` are special tokens. Decoding concatenates characters exactly, so
``decode(encode(text)) == text``.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, THINK_END = "<pad>", "<eos>", "</think>"
SPECIALS = (PAD, EOS, THINK_END)
CHARS = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c") + "\n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[THINK_END],
        clean_up_tokenization_spaces=False,
    )
    fast.model_max_length = 1 << 20
    return fast
