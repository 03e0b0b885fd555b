"""TextTokenizer: loading from files, a directory and a bundle; special tokens; chat template."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from homing.text.served import served_tokenizer_files
from homing.text.tokenizer import ChatTemplateError, TextTokenizer


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class TestServedTokenizer:
    def test_special_tokens_come_from_the_config(self, served: TextTokenizer) -> None:
        """bos/eos/pad ids and the vocab size are read from DeepSeek's config and vocab."""
        assert served.bos_token_id == 0
        assert served.eos_token_ids == (1,)
        assert served.pad_token_id == 1
        assert served.vocab_size == 129280

    def test_encode_adds_no_special_tokens(self, served: TextTokenizer) -> None:
        """encode gives the text's ids only, and decode gives the text back."""
        ids = served.encode("hello world, 你好")
        assert served.bos_token_id not in ids
        assert served.decode(ids) == "hello world, 你好"

    def test_role_markers_encode_to_single_ids(self, served: TextTokenizer) -> None:
        """The template's role markers are single tokens of the served vocabulary."""
        for marker in ("<｜User｜>", "<｜Assistant｜>", "<｜begin▁sys｜>", "<｜end▁sys｜>"):
            marker_id = served.token_to_id(marker)
            assert marker_id is not None
            assert served.encode(marker) == [marker_id]


class TestChatTemplate:
    def test_renders_every_role_and_the_generation_prompt(self, served: TextTokenizer) -> None:
        """Each role gets its marker, assistant turns end with eos, and the prompt opens a turn."""
        prompt = served.apply_chat_template(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use metric units."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "tool", "content": '{"t": 21}'},
                {"role": "user", "content": "你好"},
            ]
        )
        assert prompt == (
            "<｜begin▁of▁sentence｜>"
            "<｜begin▁sys｜>Be brief.<｜end▁sys｜>"
            "<｜begin▁sys｜>Use metric units.<｜end▁sys｜>"
            "<｜User｜>Weather?"
            "<｜Assistant｜>Sunny.<｜end▁of▁sentence｜>"
            '<｜tool▁output▁begin｜>{"t": 21}<｜tool▁output▁end｜>'
            "<｜User｜>你好"
            "<｜Assistant｜>"
        )

    def test_without_generation_prompt_no_turn_is_opened(self, served: TextTokenizer) -> None:
        """add_generation_prompt=False leaves the prompt ending after the last message."""
        prompt = served.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=False
        )
        assert prompt == "<｜begin▁of▁sentence｜><｜User｜>hi"

    def test_text_parts_are_joined(self, served: TextTokenizer) -> None:
        """List content keeps its text parts in order and drops other part types."""
        prompt = served.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": [  # type: ignore[dict-item]
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": "x"},
                        {"type": "text", "text": "b"},
                    ],
                }
            ]
        )
        assert prompt == "<｜begin▁of▁sentence｜><｜User｜>ab<｜Assistant｜>"

    def test_unknown_role_is_a_clear_value_error(self, served: TextTokenizer) -> None:
        """The template's raise_exception surfaces as a ValueError naming the role."""
        with pytest.raises(ValueError, match="unknown role: wizard") as caught:
            served.apply_chat_template([{"role": "wizard", "content": "x"}])
        assert isinstance(caught.value, ChatTemplateError)

    def test_chat_template_file_wins_over_config(self, tiny_files: dict[str, bytes]) -> None:
        """chat_template.jinja takes precedence over tokenizer_config.json's chat_template."""
        from_config = TextTokenizer.from_files(tiny_files)
        from_file = TextTokenizer.from_files(
            {**tiny_files, "chat_template.jinja": b"{{ eos_token }}{{ messages|length }}"}
        )
        messages = [{"role": "user", "content": "hello"}]
        assert from_config.apply_chat_template(messages) == "<s>[user]"
        assert from_file.apply_chat_template(messages) == "</s>1"

    def test_template_that_does_not_compile_is_a_value_error(
        self, tiny_files: dict[str, bytes]
    ) -> None:
        """A syntax error in the template is reported as a ValueError when loading."""
        with pytest.raises(ValueError, match="does not compile"):
            TextTokenizer.from_files({**tiny_files, "chat_template.jinja": b"{% if %}"})

    def test_template_cannot_mutate_its_inputs(self, tiny_files: dict[str, bytes]) -> None:
        """The sandbox refuses to change a list from inside a template."""
        tokenizer = TextTokenizer.from_files(
            {**tiny_files, "chat_template.jinja": b"{{ messages.append(1) }}"}
        )
        with pytest.raises(ValueError, match="chat template failed"):
            tokenizer.apply_chat_template([{"role": "user", "content": "x"}])

    def test_missing_template_is_a_value_error(self, tiny_files: dict[str, bytes]) -> None:
        """A tokenizer without any chat template refuses to render one."""
        config = json.loads(tiny_files["tokenizer_config.json"])
        del config["chat_template"]
        tokenizer = TextTokenizer.from_files(
            {**tiny_files, "tokenizer_config.json": json.dumps(config).encode()}
        )
        assert tokenizer.chat_template is None
        with pytest.raises(ValueError, match="no chat template"):
            tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


class TestLoading:
    def test_generation_config_adds_eos_ids(self, tiny_files: dict[str, bytes]) -> None:
        """generation_config.json's eos_token_id list extends the config's eos, without repeats."""
        tokenizer = TextTokenizer.from_files(
            {**tiny_files, "generation_config.json": b'{"eos_token_id": [2, 3]}'}
        )
        assert tokenizer.eos_token_ids == (2, 3)
        assert tokenizer.bos_token_id == 1

    def test_from_dir_reads_the_known_files(
        self, tmp_path: Path, tiny_files: dict[str, bytes]
    ) -> None:
        """A directory with tokenizer.json, config and chat_template.jinja loads all three."""
        for name, data in tiny_files.items():
            (tmp_path / name).write_bytes(data)
        (tmp_path / "chat_template.jinja").write_text("T{{ messages[0].content }}")
        tokenizer = TextTokenizer.from_dir(tmp_path)
        assert tokenizer.encode("hello world") == [4, 5]
        assert tokenizer.apply_chat_template([{"role": "user", "content": "c"}]) == "Tc"

    def test_from_dir_without_tokenizer_json_is_a_value_error(self, tmp_path: Path) -> None:
        """A directory lacking tokenizer.json gives a ValueError naming the file."""
        (tmp_path / "tokenizer_config.json").write_text("{}")
        with pytest.raises(ValueError, match=r"tokenizer\.json"):
            TextTokenizer.from_dir(tmp_path)

    def test_bundle_without_tokenizer_json_is_a_value_error(self) -> None:
        """A zip that holds no tokenizer.json gives a ValueError listing what it holds."""
        data = _zip({"tokenizer_config.json": b"{}"})
        with pytest.raises(ValueError, match=r"no tokenizer\.json.*tokenizer_config\.json"):
            TextTokenizer.from_bundle(data)

    def test_bytes_that_are_not_a_zip_are_a_value_error(self) -> None:
        """Garbage bytes as a bundle give a ValueError, not a zipfile exception."""
        with pytest.raises(ValueError, match="not a zip"):
            TextTokenizer.from_bundle(b"definitely not a zip")

    def test_bundle_with_files_in_a_folder_loads(self, tiny_files: dict[str, bytes]) -> None:
        """Files inside one folder of the zip are found next to its tokenizer.json."""
        data = _zip({f"model/{name}": content for name, content in tiny_files.items()})
        tokenizer = TextTokenizer.from_bundle(data)
        assert tokenizer.encode("world hello") == [5, 4]
        assert tokenizer.eos_token_ids == (2,)

    def test_served_files_round_trip_through_a_directory(
        self, tmp_path: Path, served: TextTokenizer
    ) -> None:
        """The served files written to disk load to a tokenizer encoding like the served one."""
        for name, data in served_tokenizer_files().items():
            (tmp_path / name).write_bytes(data)
        loaded = TextTokenizer.from_dir(tmp_path)
        text = "Say hello in Chinese: 你好 👋"
        assert loaded.encode(text) == served.encode(text)
        assert loaded.chat_template == served.chat_template
