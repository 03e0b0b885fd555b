"""`<think>` ... `</think>` reasoning: DeepSeek R1 (and V3.1 thinking), Qwen 3, and the many
models that write their thinking between these tags.

Format (DeepSeek-R1 and Qwen3 model cards; SGLang's `deepseek-r1` and `qwen3` reasoning
detectors):

    <think>
    THINKING
    </think>

    ANSWER

Two ways an answer starts: the chat template ended the prompt with `<think>` (DeepSeek R1,
V3.1 with thinking on, Qwen3 thinking-2507), so the answer starts inside the reasoning
(`starts_in_reasoning`), or the model writes `<think>` itself (Qwen3 with
`enable_thinking`). Rules, as SGLang's detectors apply them:

- a `<think>` that starts the answer (after leading whitespace, dropped with it) opens the
  reasoning, and is dropped; with `starts_in_reasoning` such a repeated `<think>` is dropped
  too (DeepSeek-R1-0528 writes one);
- the reasoning runs to the first `</think>` (dropped); the text after it is content,
  verbatim, whitespace included (`\\n\\n` after the tag stays in the content, as in
  SGLang's and vLLM's answers); a later `<think>` or `</think>` there is content;
- an answer that does not start with `<think>` and does not start in the reasoning is all
  content;
- a text that ends before `</think>` (finish reason `length`) is all reasoning.

Only the tags are stripped: the reasoning keeps the model's newlines (SGLang strips nothing
else; a client that renders the reasoning trims it). Chunk invariance as in
`homing.text.output`: text that may still become `<think>` or `</think>` is held back until
the next feed decides it. Never raises.
"""

from __future__ import annotations

from homing.text.output import ContentDelta, Event, ReasoningDelta

OPEN = "<think>"
CLOSE = "</think>"

_START, _REASONING, _CONTENT = range(3)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ThinkParser:
    """Incremental parser of `<think>` reasoning (one per answer)."""

    __slots__ = ("_held", "_starts_in_reasoning", "_state")

    def __init__(self, starts_in_reasoning: bool) -> None:
        self._starts_in_reasoning = starts_in_reasoning
        self._state = _START
        self._held = ""

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of model output."""
        if not text:
            return []
        if self._state == _CONTENT:
            return [ContentDelta(text)]
        buf = self._held + text
        self._held = ""
        events: list[Event] = []
        if self._state == _START:
            rest = buf.lstrip()
            if not rest or (len(rest) < len(OPEN) and OPEN.startswith(rest)):
                self._held = buf
                return events
            if rest.startswith(OPEN):
                buf = rest[len(OPEN) :]
                self._state = _REASONING
            elif self._starts_in_reasoning:
                self._state = _REASONING
            else:
                self._state = _CONTENT
                return [ContentDelta(buf)]
        # _REASONING
        i = buf.find(CLOSE)
        if i >= 0:
            if i:
                events.append(ReasoningDelta(buf[:i]))
            self._state = _CONTENT
            after = buf[i + len(CLOSE) :]
            if after:
                events.append(ContentDelta(after))
            return events
        k = _partial_suffix(buf, CLOSE)
        if k:
            self._held = buf[-k:]
            buf = buf[:-k]
        if buf:
            events.append(ReasoningDelta(buf))
        return events

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text."""
        held, self._held = self._held, ""
        if not held:
            return []
        if self._state == _START and not self._starts_in_reasoning:
            return [ContentDelta(held)]
        return [ReasoningDelta(held)]
