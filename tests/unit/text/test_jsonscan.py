"""JsonScanner: where a streamed JSON value ends, however the text is cut."""

from __future__ import annotations

import random

from homing.text.jsonscan import JsonScanner, Scan

VALUE = '{"a": "x}\\"]\\\\", "b": [1, {"c": "\\u00e9😀"}], "d": "{["}'


def scan_pieces(pieces: list[str], scanner: JsonScanner) -> int | None:
    """Feed pieces; the offset in the joined text just past the close, or None."""
    offset = 0
    for piece in pieces:
        result, k = scanner.scan(piece)
        if result is Scan.CLOSED:
            return offset + k
        assert result is Scan.MORE
        offset += len(piece)
    return None


def test_value_closes_just_past_its_last_bracket() -> None:
    assert JsonScanner().scan(VALUE + " tail") == (Scan.CLOSED, len(VALUE))


def test_brackets_and_escapes_inside_strings_do_not_count() -> None:
    assert JsonScanner().scan('{"k": "}]\\"}"') == (Scan.MORE, 13)


def test_every_cut_gives_the_same_end() -> None:
    text = VALUE + "rest"
    for i in range(1, len(text)):
        assert scan_pieces([text[:i], text[i:]], JsonScanner()) == len(VALUE)
    assert scan_pieces(list(text), JsonScanner()) == len(VALUE)


def test_random_cuts_give_the_same_end() -> None:
    rng = random.Random(0)
    text = VALUE * 3
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 20)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert scan_pieces(pieces, JsonScanner()) == len(VALUE)


def test_depth_one_reads_the_rest_of_an_object() -> None:
    assert JsonScanner(depth=1).scan('"id": "x"}, more') == (Scan.CLOSED, 10)


def test_a_stop_character_pauses_inside_and_outside_strings() -> None:
    scanner = JsonScanner(stops="<")
    assert scanner.scan('{"a": "x<y"') == (Scan.STOP, 8)
    assert scanner.scan('{"a": "x<y"', 8, 9, stop=False) == (Scan.MORE, 9)
    assert scanner.scan('{"a": "x<y"}', 9) == (Scan.CLOSED, 12)


def test_a_stop_character_after_a_backslash_pauses_whatever_the_cut() -> None:
    text = '{"a": "x\\<y"}'
    assert JsonScanner(stops="<").scan(text) == (Scan.STOP, 9)
    scanner = JsonScanner(stops="<")
    assert scanner.scan(text, 0, 9) == (Scan.MORE, 9)
    assert scanner.scan(text, 9) == (Scan.STOP, 9)
    assert scanner.scan(text, 9, 10, stop=False) == (Scan.MORE, 10)
    assert scanner.scan(text, 10) == (Scan.CLOSED, len(text))
