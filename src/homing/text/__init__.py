"""Text pipeline: tokenizer and chat template, incremental detokenizer, stop strings.

A leaf package: it depends on `tokenizers` and `jinja2` only, never on other homing packages.
`homing.text.served` gives the tokenizer the simulated worker serves.
"""

from homing.text.detokenizer import IncrementalDetokenizer
from homing.text.stops import StopMatcher, StopResult, StopSet
from homing.text.tokenizer import ChatTemplateError, TextTokenizer

__all__ = [
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "StopMatcher",
    "StopResult",
    "StopSet",
    "TextTokenizer",
]
