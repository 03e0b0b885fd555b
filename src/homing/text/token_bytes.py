"""Each vocabulary entry's raw bytes and its OpenAI token string.

Rule of the file: a token id maps to the bytes the tokenizer's decoder produces for it on its
own, whatever the vocabulary's spelling:
- added tokens (special or not): their content, UTF-8 encoded;
- byte-level BPE (a `ByteLevel` decoder, GPT-2 style): each character of the piece through the
  inverse of GPT-2's `bytes_to_unicode` table;
- otherwise (SentencePiece style): a byte-fallback piece `<0xAB>` is that byte, and the
  metaspace `▁` is a space.
The token string (OpenAI's `token`, and the key of a completions `top_logprobs` entry) is those
bytes as UTF-8 when they decode, else OpenAI's form for a partial character: "bytes:" and each
byte as a `\\xNN` escape (e.g. `bytes:\\xe4\\xbd`). vLLM shows such a token as U+FFFD instead;
the escape keeps distinct byte tokens distinct. Lookups are cached per id.
"""

from __future__ import annotations

import json
import re
import weakref

from tokenizers import Tokenizer

from homing.text.tokenizer import TextTokenizer

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_METASPACE = "\u2581"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (`bytes_to_unicode` of its encoder.py)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


#: Printable character of a byte-level piece -> the byte it stands for.
BYTE_OF_CHAR: dict[str, int] = {char: byte for byte, char in _bytes_to_unicode().items()}


def token_string(raw: bytes) -> str:
    """OpenAI's token string of `raw`: its UTF-8 text, else "bytes:" and `\\xNN` escapes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _decoder_types(tokenizer: Tokenizer) -> set[str]:
    """The types of the tokenizer's decoder, those inside a `Sequence` included."""
    decoder = tokenizer.decoder
    if decoder is None:
        return set()
    found: set[str] = set()
    stack = [json.loads(decoder.__getstate__())]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


class TokenBytes:
    """Raw bytes and token strings of one tokenizer's ids (cached; see the module docstring).

    An id outside the vocabulary has no bytes (b"") and the token string "".
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        raw = tokenizer.tokenizer
        self._raw = raw
        self._byte_level = "ByteLevel" in _decoder_types(raw)
        self._added = {i: t.content for i, t in raw.get_added_tokens_decoder().items()}
        self._cache: dict[int, tuple[str, bytes]] = {}

    @property
    def byte_level(self) -> bool:
        """The vocabulary spells bytes GPT-2's way (a `ByteLevel` decoder)."""
        return self._byte_level

    def bytes_of(self, token_id: int) -> bytes:
        """The token's raw bytes."""
        return self.lookup(token_id)[1]

    def string_of(self, token_id: int) -> str:
        """The token's OpenAI token string."""
        return self.lookup(token_id)[0]

    def lookup(self, token_id: int) -> tuple[str, bytes]:
        """(token string, raw bytes) of `token_id`."""
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._compute(token_id)
            hit = self._cache[token_id] = (token_string(raw), raw)
        return hit

    def _compute(self, token_id: int) -> bytes:
        added = self._added.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        piece = self._raw.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            out = bytearray()
            for char in piece:
                byte = BYTE_OF_CHAR.get(char)
                if byte is None:
                    out += char.encode("utf-8")
                else:
                    out.append(byte)
            return bytes(out)
        match = _BYTE_FALLBACK.fullmatch(piece)
        if match is not None:
            return bytes([int(match.group(1), 16)])
        return piece.replace(_METASPACE, " ").encode("utf-8")


_BY_TOKENIZER: weakref.WeakKeyDictionary[TextTokenizer, TokenBytes] = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: TextTokenizer) -> TokenBytes:
    """The (shared, cached) `TokenBytes` of `tokenizer`."""
    found = _BY_TOKENIZER.get(tokenizer)
    if found is None:
        found = _BY_TOKENIZER[tokenizer] = TokenBytes(tokenizer)
    return found
