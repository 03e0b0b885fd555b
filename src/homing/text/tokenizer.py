"""Tokenizer and chat template: a Hugging Face tokenizer directory or GetTokenizer zip bundle.

Rule of the file: tokenization is the `tokenizers` library's and chat templating is jinja2's;
this file only gathers the files, reads the special tokens, and renders the template the way
Hugging Face `transformers` does (an immutable sandboxed jinja2 environment with
`trim_blocks`/`lstrip_blocks` and the `loopcontrols` extension; `raise_exception`,
`strftime_now` and a non-ASCII-escaping `tojson` available; `bos_token`/`eos_token` passed as
variables), so real models' templates render here as they do there.

Files read (names as in a Hugging Face model directory):
- `tokenizer.json` (required),
- `tokenizer_config.json` (bos/eos/pad tokens, `chat_template`),
- `chat_template.jinja` (takes precedence over the config's `chat_template`),
- `generation_config.json` (extra `eos_token_id`s, as generation stops on any of them).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
_KNOWN_FILES = (TOKENIZER_FILE, CONFIG_FILE, CHAT_TEMPLATE_FILE, GENERATION_CONFIG_FILE)


class ChatTemplateError(ValueError):
    """The chat template is missing, does not compile, or failed while rendering."""


def _raise_exception(message: str) -> NoReturn:
    """Template helper `raise_exception(msg)`, as in Hugging Face templates."""
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    """Template filter `tojson` that keeps non-ASCII text readable (as transformers does)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    """Template helper `strftime_now(fmt)`: the local time formatted (used by Llama 3 templates)."""
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def _token_content(value: object) -> str | None:
    """A special token from tokenizer_config.json: a plain string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def _as_id_list(value: object) -> list[int]:
    """`eos_token_id` from generation_config.json: an int, a list of ints, or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _parse_json(name: str, data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must hold a JSON object")
    return parsed


class TextTokenizer:
    """A `tokenizers.Tokenizer` with its special tokens and chat template.

    Attributes:
        vocab_size: number of ids including added tokens (e.g. 129280 for DeepSeek-V3's).
        eos_token_ids: ids that end generation, config `eos_token` first, then any
            `generation_config.json` `eos_token_id`s; deduplicated, order kept.
        bos_token_id / pad_token_id: ids of the config's `bos_token` / `pad_token`, or None.
        bos_token / eos_token / pad_token: their texts, or None.
        chat_template: the template source, or None when the files carry none.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: Mapping[str, Any] | None = None,
        *,
        chat_template: str | None = None,
        generation_config: Mapping[str, Any] | None = None,
    ) -> None:
        """Wrap a loaded tokenizer.

        `chat_template` overrides `config["chat_template"]`. Raises ChatTemplateError (a
        ValueError) when the template does not compile.
        """
        config = dict(config or {})
        generation_config = dict(generation_config or {})
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

        self.bos_token: str | None = _token_content(config.get("bos_token"))
        self.eos_token: str | None = _token_content(config.get("eos_token"))
        self.pad_token: str | None = _token_content(config.get("pad_token"))
        self.bos_token_id: int | None = self.token_to_id(self.bos_token)
        self.pad_token_id: int | None = self.token_to_id(self.pad_token)
        if self.bos_token_id is None:
            bos_ids = _as_id_list(generation_config.get("bos_token_id"))
            self.bos_token_id = bos_ids[0] if bos_ids else None

        eos: list[int] = []
        eos_id = self.token_to_id(self.eos_token)
        if eos_id is not None:
            eos.append(eos_id)
        eos.extend(_as_id_list(generation_config.get("eos_token_id")))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))

        template = chat_template if chat_template is not None else config.get("chat_template")
        if template is not None and not isinstance(template, str):
            # Named templates (a list of {"name", "template"}) are taken as their "default".
            template = _default_named_template(template)
        self.chat_template: str | None = template
        self._template: jinja2.Template | None = (
            _compile_template(template) if template is not None else None
        )

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> TextTokenizer:
        """Build from file contents keyed by file name (see the module docstring for names).

        Raises ValueError when `tokenizer.json` is missing or any file does not parse, and
        ChatTemplateError (a ValueError) when the template does not compile.
        """
        if TOKENIZER_FILE not in files:
            raise ValueError(
                f"tokenizer files lack {TOKENIZER_FILE}; got {sorted(files) or 'no files'}"
            )
        try:
            tokenizer = Tokenizer.from_str(files[TOKENIZER_FILE].decode("utf-8"))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ValueError(f"{TOKENIZER_FILE} does not load: {exc}") from exc
        config = _parse_json(CONFIG_FILE, files[CONFIG_FILE]) if CONFIG_FILE in files else {}
        generation_config = (
            _parse_json(GENERATION_CONFIG_FILE, files[GENERATION_CONFIG_FILE])
            if GENERATION_CONFIG_FILE in files
            else {}
        )
        template: str | None = None
        if CHAT_TEMPLATE_FILE in files:
            try:
                template = files[CHAT_TEMPLATE_FILE].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{CHAT_TEMPLATE_FILE} is not UTF-8: {exc}") from exc
        return cls(tokenizer, config, chat_template=template, generation_config=generation_config)

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load a Hugging Face tokenizer directory (`tokenizer.json` required).

        Raises ValueError when the directory or its `tokenizer.json` is missing, or a file
        does not parse; ChatTemplateError (a ValueError) for a template that does not compile.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise ValueError(f"tokenizer directory {str(directory)!r} does not exist")
        files = {
            name: (directory / name).read_bytes()
            for name in _KNOWN_FILES
            if (directory / name).is_file()
        }
        return cls.from_files(files)

    @classmethod
    def from_bundle(cls, data: bytes) -> TextTokenizer:
        """Load a GetTokenizer bundle: the zip bytes (all chunks joined), read in memory.

        The files may sit at the archive root or in one folder (the shallowest folder holding
        `tokenizer.json` is used). Nothing is written to disk. Raises ValueError when the bytes
        are not a zip, the zip holds no `tokenizer.json`, or a file does not parse.
        """
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile as exc:
            raise ValueError(f"tokenizer bundle is not a zip archive: {exc}") from exc
        with archive:
            members = {
                PurePosixPath(info.filename): info
                for info in archive.infolist()
                if not info.is_dir()
            }
            roots = sorted(
                (p.parent for p in members if p.name == TOKENIZER_FILE),
                key=lambda parent: (len(parent.parts), str(parent)),
            )
            if not roots:
                names = sorted(str(p) for p in members)
                raise ValueError(
                    f"tokenizer bundle holds no {TOKENIZER_FILE}; it holds {names or 'nothing'}"
                )
            root = roots[0]
            files = {
                name: archive.read(members[root / name])
                for name in _KNOWN_FILES
                if root / name in members
            }
        return cls.from_files(files)

    # ---- tokens ---------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        """The wrapped `tokenizers.Tokenizer` (used by the incremental detokenizer)."""
        return self._tokenizer

    def token_to_id(self, token: str | None) -> int | None:
        """Id of a token text (e.g. "<｜User｜>"), or None when absent from the vocabulary."""
        if token is None:
            return None
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no special tokens are added (the chat template adds bos).

        Special-token texts inside `text` (e.g. "<｜User｜>") encode to their single ids.
        """
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens (bos, eos, pad, ...) left out unless asked for."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat -----------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
    ) -> str:
        """Render `messages` ({"role", "content"} mappings) into the prompt text.

        Variables given to the template: `messages`, `add_generation_prompt`, `bos_token`,
        `eos_token`, `pad_token` (as Hugging Face does). Raises ChatTemplateError (a
        ValueError) when there is no template or rendering fails (including the template's
        own `raise_exception`, e.g. for an unknown role).
        """
        if self._template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        try:
            return self._template.render(
                messages=[dict(message) for message in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                pad_token=self.pad_token or "",
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, KeyError, AttributeError, IndexError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def _default_named_template(value: object) -> str:
    """Pick the "default" entry of a named chat-template list (tokenizer_config.json form)."""
    if isinstance(value, list):
        named: dict[str, str] = {}
        for entry in value:
            if isinstance(entry, Mapping):
                name, text = entry.get("name"), entry.get("template")
                if isinstance(name, str) and isinstance(text, str):
                    named[name] = text
        if "default" in named:
            return named["default"]
    raise ChatTemplateError("chat_template in tokenizer_config.json is neither text nor named")
