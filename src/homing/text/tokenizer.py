"""Tokenizer and chat template: a Hugging Face tokenizer directory or GetTokenizer zip bundle.

Rule of the file: tokenization is the `tokenizers` library's and chat templating is jinja2's;
this file only gathers the files, reads the special tokens, and renders the template the way
Hugging Face `transformers` does (an immutable sandboxed jinja2 environment with
`trim_blocks`/`lstrip_blocks` and the `loopcontrols` extension; `raise_exception`,
`strftime_now` and a non-ASCII-escaping `tojson` available; `bos_token`/`eos_token` passed as
variables), so real models' templates render here as they do there.

Special tokens come only from the template: `encode_chat` tokenizes a chat prompt so that the
template's own text may produce added tokens (bos, eos, role markers) while message content is
always plain text, and `encode_plain` does the same for any text. "Added tokens" are the whole
added vocabulary (`Tokenizer.get_added_tokens_decoder()`), flagged special or not: DeepSeek's
`<｜User｜>` and `<｜Assistant｜>` are added tokens not flagged special, which is why the
library's `encode_special_tokens` switch (it skips only flagged ones) is not enough here.
Dropping the added vocabulary is not enough either where the model's own vocabulary holds the
special token too (a BPE model with `ignore_merges`, as Llama 3's, keeps a word that spells it
whole; a converted SentencePiece Unigram model scores its control tokens 0, the best score):
such a token in plain text is spelled again from ordinary vocabulary entries, or the text is
refused (ValueError). The model's unknown token is the one added token plain text may yield,
as unknown text must.

Files read (names as in a Hugging Face model directory):
- `tokenizer.json` (required),
- `tokenizer_config.json` (bos/eos/pad tokens, `chat_template`),
- `chat_template.jinja` (takes precedence over the config's `chat_template`),
- `generation_config.json` (extra `eos_token_id`s, as generation stops on any of them).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import weakref
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
from tokenizers import Tokenizer, models

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
_KNOWN_FILES = (TOKENIZER_FILE, CONFIG_FILE, CHAT_TEMPLATE_FILE, GENERATION_CONFIG_FILE)

# Delimiters of the placeholders `encode_chat` renders in place of message content: Unicode
# private-use code points (U+E000, U+E001), which no template in the wild writes; the opening
# one is repeated until the template source does not hold it (see `_placeholder_pattern`).
_PLACEHOLDER_OPEN = "\ue000"
_PLACEHOLDER_CLOSE = "\ue001"
_REWRITTEN_SPECIAL_CONTENT = (
    "message content contains special-token text, and this model's chat template rewrites "
    "content, so that text cannot be kept apart from the template's own special tokens"
)


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


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """`tokenizer`'s ids of `text` without added bos/eos. Through `encode_batch_fast`: the
    same ids as `encode`, but the library releases the GIL while it works (its `encode`
    holds it: a 3 MB prompt encoded in a thread stalled the event loop for seconds), and it
    skips the character offsets nobody reads. Raises TypeError for a str the library
    refuses (e.g. one with a lone surrogate)."""
    return tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids


def _plain_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`'s pipeline without its added vocabulary: text in, ids of plain text out.

    The same model, normalizer, pre-tokenizer and post-processor objects (shared, not copied:
    building it takes microseconds), and no added tokens, so a special token's text such as
    "<｜User｜>" encodes as the ordinary text it spells. Neither tokenizer is changed after
    this, so both may encode from several threads at once.
    """
    plain = Tokenizer(tokenizer.model)
    if tokenizer.normalizer is not None:
        plain.normalizer = tokenizer.normalizer
    if tokenizer.pre_tokenizer is not None:
        plain.pre_tokenizer = tokenizer.pre_tokenizer
    if tokenizer.post_processor is not None:
        plain.post_processor = tokenizer.post_processor
    return plain


def _model_facts(tokenizer: Tokenizer) -> tuple[int | None, bool]:
    """The model's unknown-token id (None if it has none) and whether it falls back to byte
    tokens ("<0x3C>") for text its vocabulary lacks. Unigram exposes neither as an attribute,
    so its serialized model (JSON) is read."""
    model = tokenizer.model
    if isinstance(model, models.Unigram):
        state = json.loads(model.__getstate__())
        unk_id = state.get("unk_id")
        return (unk_id if isinstance(unk_id, int) else None), bool(state.get("byte_fallback"))
    unk_token = getattr(model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None
    return unk_id, bool(getattr(model, "byte_fallback", False))


def _placeholder_pattern(template: str | None) -> tuple[str, re.Pattern[str]]:
    """The opening delimiter of content placeholders and the pattern of one placeholder.

    A placeholder is `open + message index + close`. `open` is U+E000 repeated until the
    template source does not contain it, so the template's own text cannot spell one.
    """
    opening = _PLACEHOLDER_OPEN
    while template is not None and opening in template:
        opening += _PLACEHOLDER_OPEN
    pattern = re.compile(f"{re.escape(opening)}([0-9]+){re.escape(_PLACEHOLDER_CLOSE)}")
    return opening, pattern


def _content_text(content: object) -> object:
    """A content list of text parts joined into one string (as `ChatMessage.text()` does);
    other part types are dropped; a string, None or anything else is returned unchanged."""
    if not isinstance(content, list):
        return content
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def _fill(rendered: str, pieces: Sequence[str], contents: Sequence[str | None]) -> list[str] | None:
    """The content texts that, put between the template `pieces`, give `rendered` exactly.

    `contents[k]` is the message content whose placeholder stood between `pieces[k]` and
    `pieces[k + 1]`. The template may have trimmed it (Jinja's `trim`, Python's `strip`), so
    each slot takes the first of the content, stripped, left-stripped or right-stripped that
    fits there and is followed by the next piece. None when no such filling exists (the
    template changed content some other way, or rendered differently without it).
    """
    if not rendered.startswith(pieces[0]):
        return None
    position = len(pieces[0])
    filled: list[str] = []
    for content, after in zip(contents, pieces[1:], strict=True):
        if content is None:
            return None
        for candidate in dict.fromkeys(
            (content, content.strip(), content.lstrip(), content.rstrip())
        ):
            end = position + len(candidate)
            if rendered.startswith(candidate, position) and rendered.startswith(after, end):
                break
        else:
            return None
        filled.append(candidate)
        position = end + len(after)
    return filled if position == len(rendered) else None


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
        added_token_ids: ids of the added vocabulary, flagged special or not (bos, eos, role
            markers, ...): the ids only template text may produce (see `encode_chat`), but
            for the model's unknown token, which unknown text in content also yields.
        max_token_chars: the longest vocabulary entry in characters; a text longer than
            this cannot be a single token.
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
        self._plain = _plain_tokenizer(tokenizer)
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.added_token_ids: frozenset[int] = frozenset(tokenizer.get_added_tokens_decoder())
        unk_id, self._byte_fallback = _model_facts(tokenizer)
        # A vocabulary entry spells its token in at least as many characters as the token
        # decodes to (byte-level entries use one character per byte).
        self.max_token_chars: int = max(
            (len(entry) for entry in tokenizer.get_vocab(with_added_tokens=True)), default=0
        )

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

        # The ids content must not yield: the added vocabulary less the unknown token (unless
        # it doubles as bos, eos or pad), and of those the ones the plain pipeline can still
        # produce, those the model's own vocabulary holds (often none: nothing to check then).
        roles = {self.bos_token_id, self.pad_token_id, *self.eos_token_ids}
        exempt = {unk_id} if unk_id is not None and unk_id not in roles else set()
        self._forbidden: frozenset[int] = self.added_token_ids - exempt
        self._reachable: frozenset[int] = frozenset(
            t for t in self._forbidden if tokenizer.model.id_to_token(t) is not None
        )
        self._ordinary: dict[str, int] | None = None  # built on first need (see _spell)
        # reachable id -> (its vocabulary text, its ordinary spelling or None), on first need
        self._spellings: dict[int, tuple[str | None, list[int] | None]] = {}

        template = chat_template if chat_template is not None else config.get("chat_template")
        if template is not None and not isinstance(template, str):
            # Named templates (a list of {"name", "template"}) are taken as their "default".
            template = _default_named_template(template)
        self.chat_template: str | None = template
        self._template: jinja2.Template | None = (
            _compile_template(template) if template is not None else None
        )
        self._placeholder_open, self._placeholder = _placeholder_pattern(template)
        self._template_variables: frozenset[str] | None = None
        decoder = tokenizer.get_added_tokens_decoder()
        self._special_starts: frozenset[str] = frozenset(
            decoder[t].content[0] for t in self._forbidden if decoder[t].content
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

        Special-token texts inside `text` (e.g. "<｜User｜>") encode to their single ids: for
        template text, stop strings, and prompts whose sender may write control tokens.
        Raises TypeError for a str the library refuses (e.g. one with a lone surrogate).
        """
        return _ids(self._tokenizer, text)

    def holds_special(self, text: str) -> bool:
        """Whether `encode(text)` yields an added token (bos, a role marker, ...) other than
        the unknown token: text that must not be template input. Costs a scan of `text` for
        the first characters of the added tokens, and an encode only where one occurs."""
        if not any(c in text for c in self._special_starts):
            return False
        return not self._forbidden.isdisjoint(self.encode(text))

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` as plain text: never an added token (see `added_token_ids`) but
        the unknown token, so "<｜User｜>" gives the ids of its characters, not the marker's.

        Text without added-token texts encodes as `encode` does. The added vocabulary is not
        matched; where the model itself still yields an added id (see the module docstring),
        that token is spelled from the fewest ordinary vocabulary entries (or byte tokens)
        that concatenate to its vocabulary text, so the ids decode to the text it did. Raises
        ValueError when no such spelling exists, TypeError as `encode`.
        """
        ids = _ids(self._plain, text)
        if not self._reachable or self._reachable.isdisjoint(ids):
            return ids
        plain: list[int] = []
        for token in ids:
            if token not in self._reachable:
                plain.append(token)
                continue
            if token not in self._spellings:  # at most one search per reachable id
                piece = self._tokenizer.model.id_to_token(token)
                self._spellings[token] = (piece, self._spell(piece) if piece else None)
            piece, spelled = self._spellings[token]
            if spelled is None:
                raise ValueError(
                    f"the text {piece!r} can only be encoded as the special token it spells "
                    "with this tokenizer, and special tokens are not accepted in text"
                )
            plain.extend(spelled)
        return plain

    def _spell(self, piece: str) -> list[int] | None:
        """The fewest ids of ordinary vocabulary entries (no added token) whose texts
        concatenate to `piece`, a character taken as its UTF-8 byte tokens where the model
        falls back to bytes; None when there are none."""
        if self._ordinary is None:
            self._ordinary = {
                text: token
                for text, token in self._tokenizer.get_vocab(with_added_tokens=False).items()
                if token not in self.added_token_ids
            }
        ordinary = self._ordinary
        # best[j]: the shortest spelling of piece[:j] (dynamic programming over end positions).
        best: list[list[int] | None] = [[]] + [None] * len(piece)
        for start in range(len(piece)):
            head = best[start]
            if head is None:
                continue
            candidates: list[tuple[int, list[int]]] = [
                (end, [ordinary[piece[start:end]]])
                for end in range(start + 1, len(piece) + 1)
                if piece[start:end] in ordinary
            ]
            if self._byte_fallback:
                raw = [ordinary.get(f"<0x{b:02X}>") for b in piece[start].encode("utf-8")]
                if all(t is not None for t in raw):
                    candidates.append((start + 1, [t for t in raw if t is not None]))
            for end, tokens in candidates:
                known = best[end]
                if known is None or len(head) + len(tokens) < len(known):
                    best[end] = head + tokens
        return best[-1]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens (bos, eos, pad, ...) left out unless asked for."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat -----------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render `messages` ({"role", "content"} mappings) into the prompt text.

        Variables given to the template: `messages`, `add_generation_prompt`, `bos_token`,
        `eos_token`, `pad_token` (as Hugging Face does), then `variables` (`tools`, as
        transformers passes them, and chat-template kwargs such as `enable_thinking`; they
        cannot replace the five). Raises ChatTemplateError (a ValueError) when there is no
        template or rendering fails (including the template's own `raise_exception`, e.g. for
        an unknown role).
        """
        return self._render(
            [dict(message) for message in messages], add_generation_prompt, variables
        )

    @property
    def template_variables(self) -> frozenset[str]:
        """Names the chat template reads and never sets itself (Jinja's undeclared variables
        less any name it assigns somewhere: `messages`, `tools`, `enable_thinking`, ...);
        empty without a template."""
        if self._template_variables is None:
            if self.chat_template is None:
                self._template_variables = frozenset()
            else:
                ast = jinja2.Environment().parse(self.chat_template)
                found = jinja2.meta.find_undeclared_variables(ast)
                stored = {n.name for n in ast.find_all(jinja2.nodes.Name) if n.ctx == "store"}
                self._template_variables = frozenset(found - stored)
        return self._template_variables

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the chat prompt of `messages`, where only the template's own text may
        produce added tokens (see `added_token_ids`) and message content never does.

        A list `content` of text parts is joined first. The template is rendered twice: with
        the real content, and with each non-empty content replaced by a placeholder. The
        placeholder rendering, split at the placeholders, gives the template's pieces; they are
        encoded with added tokens recognised, and the content between them with
        `encode_plain`, so every content boundary is also a token boundary. The pieces and the
        content (trimmed where the template trimmed it) must give the real rendering back.
        When they cannot (a template that rewrites content in another way), the real rendering
        is encoded whole, and only if no content holds an added token's text and the
        rendering's added tokens are, in order, exactly those of the template's pieces. Only
        `content` is kept apart: other message fields (`role`, ...) are template input and
        must be trusted.

        For the served template this gives the ids `encode(apply_chat_template(...))` gave
        for content free of added-token texts (its content always borders a role marker).
        Raises ChatTemplateError (a ValueError) as `apply_chat_template` does, and when the
        last check fails; ValueError as `encode_plain`; TypeError as `encode` for text the
        library refuses. `variables` as `apply_chat_template`; their text and that of message
        fields other than `content` is template input, trusted like `role`.
        """
        given = [dict(message) for message in messages]
        contents: dict[int, str] = {}
        for index, message in enumerate(given):
            if "content" in message:
                message["content"] = content = _content_text(message["content"])
                if isinstance(content, str) and content:
                    contents[index] = content
        rendered = self._render(given, add_generation_prompt, variables)
        masked = [
            {**message, "content": f"{self._placeholder_open}{index}{_PLACEHOLDER_CLOSE}"}
            if index in contents
            else message
            for index, message in enumerate(given)
        ]
        parts = self._placeholder.split(self._render(masked, add_generation_prompt, variables))
        pieces = parts[0::2]
        slots = [contents.get(int(index)) for index in parts[1::2]]
        filled = _fill(rendered, pieces, slots)
        if filled is None:
            return self._encode_checked(rendered, pieces, contents.values())
        ids: list[int] = []
        for piece, content in zip(pieces, [*filled, ""], strict=True):
            if piece:
                ids.extend(self.encode(piece))
            if content:
                ids.extend(self.encode_plain(content))
        return ids

    def _encode_checked(
        self, rendered: str, pieces: Sequence[str], contents: Iterable[str]
    ) -> list[int]:
        """`encode(rendered)` when no content, encoded alone with or without the added
        vocabulary, yields an added id, and the rendering's added ids are, in order, those of
        the template `pieces`; else ChatTemplateError. (The first check keeps content from
        supplying a marker a template that branches on content leaves out; the second catches
        a rewrite that makes special text of ordinary content.)"""
        forbidden = self._forbidden
        if any(
            not forbidden.isdisjoint(self.encode(content))
            or not forbidden.isdisjoint(_ids(self._plain, content))
            for content in contents
        ):
            raise ChatTemplateError(_REWRITTEN_SPECIAL_CONTENT)
        placed = [t for piece in pieces for t in self.encode(piece) if t in forbidden]
        ids = self.encode(rendered)
        if [t for t in ids if t in forbidden] != placed:
            raise ChatTemplateError(_REWRITTEN_SPECIAL_CONTENT)
        return ids

    def _render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        if self._template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        try:
            return self._template.render(
                **(variables or {}),
                messages=messages,
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


_SHARED: weakref.WeakValueDictionary[str, TextTokenizer] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def tokenizer_from_bundle(data: bytes) -> TextTokenizer:
    """`TextTokenizer.from_bundle(data)`, shared: while any holder keeps the tokenizer of a
    bundle with the same SHA-256, that one is returned (its users never change a tokenizer),
    so gateways and reloads in one process build each tokenizer once; it is freed with its
    last holder. One build at a time (thread-safe). Raises what `from_bundle` raises."""
    key = hashlib.sha256(data).hexdigest()
    with _SHARED_LOCK:
        tokenizer = _SHARED.get(key)
        if tokenizer is None:
            tokenizer = TextTokenizer.from_bundle(data)
            _SHARED[key] = tokenizer
        return tokenizer
