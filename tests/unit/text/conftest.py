"""Fixtures for the text pipeline tests: the served tokenizer and a tiny in-memory one."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from homing.text.served import load_served_tokenizer
from homing.text.tokenizer import TextTokenizer


@pytest.fixture(scope="session")
def served() -> TextTokenizer:
    """The tokenizer the simulated worker serves (DeepSeek's, loaded once per process)."""
    return load_served_tokenizer()


@pytest.fixture(scope="session")
def tiny_files() -> dict[str, bytes]:
    """Files of a small word-level tokenizer with <s>/</s> specials, built in memory."""
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<eot>": 3, "hello": 4, "world": 5}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens(["<s>", "</s>", "<eot>"])
    config = {
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}",
    }
    return {
        "tokenizer.json": tokenizer.to_str().encode(),
        "tokenizer_config.json": json.dumps(config).encode(),
    }
