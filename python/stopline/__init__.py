"""stopline: when an LLM sequence stops and what it reports.

The Rust core (``stopline._core``) holds the stop-string and stop-regex
matchers, the finish-state machine (with reasoning channels and scoped stops,
docs/semantics.md 11) and the incremental detokenizer
(``Vocabulary``); :mod:`stopline.baseline` is the plain-Python reference
used by the differential tests and benchmarks; :mod:`stopline.logits` (needs
the ``torch`` extra) masks logits on the GPU.
"""

from stopline._core import (
    FINISH_REASONS,
    BatchStepResult,
    FinishBatch,
    FinishTracker,
    IncrementalDecoder,
    SequenceFinishedError,
    StepResult,
    StoplineMemoryError,
    StoplineOverflowError,
    StoplineRuntimeError,
    StoplineTypeError,
    StoplineValueError,
    StopMatch,
    StopMatcher,
    StopParams,
    StopRegexes,
    StopRegexMatcher,
    StopStrings,
    Vocabulary,
    __version__,
    check_stop_strings,
    to_openai_finish_reason,
)

__all__ = [
    "FINISH_REASONS",
    "BatchStepResult",
    "FinishBatch",
    "FinishTracker",
    "IncrementalDecoder",
    "SequenceFinishedError",
    "StepResult",
    "StoplineMemoryError",
    "StoplineOverflowError",
    "StoplineRuntimeError",
    "StoplineTypeError",
    "StoplineValueError",
    "StopMatch",
    "StopMatcher",
    "StopParams",
    "StopRegexes",
    "StopRegexMatcher",
    "StopStrings",
    "Vocabulary",
    "__version__",
    "check_stop_strings",
    "to_openai_finish_reason",
]

# The caps on every input from a request (docs/errors.md, "Caps").
from stopline._core import LIMITS  # noqa: E402

__all__ += ["LIMITS"]
