"""The served tokenizer: its files, its deterministic zip, and the zip round trip."""

from __future__ import annotations

import gc
import hashlib
import io
import json
import weakref
import zipfile

import pytest

from homing.text.served import (
    chat_template_text,
    served_tokenizer_files,
    served_tokenizer_sha256,
    served_tokenizer_zip,
    tokenizer_bundle,
    with_revision,
)
from homing.text.tokenizer import TextTokenizer, tokenizer_from_bundle


def test_files_are_the_three_named_ones() -> None:
    """The served files are tokenizer.json, tokenizer_config.json and chat_template.jinja."""
    assert set(served_tokenizer_files()) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }


def test_config_keeps_special_tokens_and_adds_our_template() -> None:
    """tokenizer_config.json keeps DeepSeek's bos/eos and carries our chat template."""
    files = served_tokenizer_files()
    config = json.loads(files["tokenizer_config.json"])
    assert config["bos_token"]["content"] == "<｜begin▁of▁sentence｜>"
    assert config["eos_token"]["content"] == "<｜end▁of▁sentence｜>"
    assert config["chat_template"] == chat_template_text()
    assert files["chat_template.jinja"].decode() == chat_template_text()


def test_zip_sha256_is_stable_across_builds() -> None:
    """Building the zip again from scratch gives the same bytes, hence the same sha256."""
    first = served_tokenizer_zip()
    rebuilt = served_tokenizer_zip.__wrapped__()
    assert rebuilt == first
    assert served_tokenizer_sha256() == hashlib.sha256(rebuilt).hexdigest()


def test_zip_entries_carry_fixed_timestamps() -> None:
    """Every entry is dated 1980-01-01, so the build time never enters the bytes."""
    with zipfile.ZipFile(io.BytesIO(served_tokenizer_zip())) as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == sorted(info.filename for info in infos)
        assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}


def test_bundle_round_trip_encodes_the_same(served: TextTokenizer) -> None:
    """zip -> from_bundle gives a tokenizer that encodes, decodes and templates alike."""
    loaded = TextTokenizer.from_bundle(served_tokenizer_zip())
    messages = [{"role": "user", "content": "Say hello in Chinese 🙂"}]
    prompt = served.apply_chat_template(messages)
    assert loaded.apply_chat_template(messages) == prompt
    assert loaded.encode(prompt) == served.encode(prompt)
    assert loaded.eos_token_ids == served.eos_token_ids
    assert loaded.vocab_size == served.vocab_size


def test_the_bundle_of_a_revision_is_the_zip_with_it_and_its_sha256() -> None:
    """tokenizer_bundle(): the served zip (with REVISION for a revision) and its digest."""
    plain, digest = tokenizer_bundle()
    assert plain == served_tokenizer_zip() and digest == served_tokenizer_sha256()
    revised, revised_digest = tokenizer_bundle("r2")
    assert revised == with_revision(served_tokenizer_zip(), "r2")
    assert revised_digest == hashlib.sha256(revised).hexdigest() != digest


def test_equal_bundles_share_one_tokenizer_and_a_failure_is_not_kept() -> None:
    """tokenizer_from_bundle: equal bytes (even another object) give the same tokenizer,
    another bundle another one; bytes that do not load raise each time."""
    first = tokenizer_from_bundle(served_tokenizer_zip())
    assert tokenizer_from_bundle(bytes(bytearray(served_tokenizer_zip()))) is first
    assert tokenizer_from_bundle(tokenizer_bundle("r2")[0]) is not first
    for _ in range(2):
        with pytest.raises(ValueError, match="not a zip"):
            tokenizer_from_bundle(b"not a zip")


def test_a_shared_tokenizer_is_freed_with_its_last_holder() -> None:
    """tokenizer_from_bundle keeps a tokenizer only while something else holds it."""
    held = tokenizer_from_bundle(tokenizer_bundle("r3")[0])
    gone = weakref.ref(held)
    del held
    gc.collect()
    assert gone() is None
