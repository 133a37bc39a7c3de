"""stopline behind vLLM's logits-processor interfaces (vLLM 0.33 and 0.34).

:class:`StoplineLogitsProcessor` applies, for every request of the batch, the
masks of :class:`stopline.logits.LogitsConstraints` in one pass:
``allowed_token_ids``, ``bad_words``, ``min_tokens`` over the stop ids with
vLLM's restore rule for structured-output requests, and ``logit_bias``; one
kernel launch on CUDA (the torch reference elsewhere).

Installing stopline must never stop a vLLM from starting, and vLLM loads the
``vllm.logits_processors`` entry point (this class) into every engine at
start-up. So the class subclasses whichever logits-processor interfaces the
installed vLLM has (V1 and V2 on 0.33, V2 on 0.34, else the loader's own
``LogitsProcessor``), and acts only on a tested release
(:data:`TESTED_VLLM_RANGE`; ``STOPLINE_VLLM_PLUGIN`` overrides, see
:func:`plugin_mode`). On any other it is inactive: it allocates nothing,
changes no logits, and refuses at admission, as a client error naming the
installed version and the tested range, only the requests that ask for
stopline (docs/integrations.md, "Supported engine versions").

Two classes, differing in where a request's constraints come from:

- :class:`StoplineLogitsProcessor` reads ``SamplingParams.extra_args["stopline"]``,
  a mapping of :meth:`LogitsConstraints.set` arguments (the way vLLM passes
  arguments to custom processors). Requests without it are untouched, so it is
  safe to load everywhere: the entry point installed with stopline names it.
  Do not pass it again in ``logits_processors=[...]``: vLLM would build a
  second instance and apply ``extra_args["stopline"]`` twice, so a second
  instance of the same class in one engine is refused with a ``ValueError``.
- :class:`StoplineBuiltinsProcessor` reads the ordinary fields
  (``min_tokens``/``all_stop_token_ids``, ``allowed_token_ids``,
  ``bad_words_token_ids``, ``logit_bias``): what vLLM 0.33's V1 built-in
  processors and its sampler's allowed-ids and bad-words steps do, in one
  pass, for an engine that takes those out; passed explicitly, V1 runner only.

vLLM picks the interface by how it constructs the class: the V1 model runner
(0.33) calls ``cls(vllm_config, device, is_pin_memory)`` then
``update_state(BatchUpdate)`` and ``apply(logits)``; the model runner V2 (0.33
opt-in, 0.34 only) calls ``cls(vllm_config, req_states)`` then
``add_request(req_idx, params)`` and ``apply(logits, ctx)``, with the
persistent request slot as the stopline slot. Under V2 the output tokens stay
on the device (``req_states.all_token_ids``): multi-token ``bad_words`` read
them there (:meth:`LogitsConstraints.load_history`, no host sync), and the
thinking budget is vLLM's own ``thinking_token_budget``.

:class:`RequestStop` (``check_stop``) and :class:`DetokenizerStop` (the
detokenizer's stop-string step) are defined in :mod:`stopline.engines.vllm`,
which needs no vLLM import, and re-exported here.

Reasoning models (docs/semantics.md 11, docs/integrations.md "Reasoning
models (vLLM)"): :func:`vllm_reasoning` reads the engine's
``--reasoning-parser`` markers once; :class:`RequestStop` and
:class:`DetokenizerStop` take them as ``reasoning=`` (stops then fire only in
content). Both processors read ``vllm_config.reasoning_config`` themselves
(:func:`engine_reasoning`) and force a request's end marker once its thinking
budget is spent (:meth:`LogitsConstraints.force`): ``thinking_token_budget``
for :class:`StoplineBuiltinsProcessor`, ``extra_args["stopline"]["max_reasoning_tokens"]``
for :class:`StoplineLogitsProcessor`; V1 runner only (under V2 vLLM forces
``thinking_token_budget`` itself).

Batch rows move as vLLM condenses its persistent batch; the processor keeps a
row -> slot map (a move or swap rewrites two map entries, never device state)
and feeds each slot's new output tokens from the request's live
``output_tok_ids`` list once per step (O(new tokens)), in ``apply``: under
vLLM's async scheduling (on by default) the list ends in ``-1`` placeholders
during ``update_state`` and holds the sampled ids only by the time the sampler
calls ``apply``.
"""

from __future__ import annotations

import logging
import numbers
import os
import sys
import weakref
from importlib import metadata
from typing import TYPE_CHECKING, Any

from .._caps import field_error, field_type_error, field_value_error, unknown_keys
from .._core import FinishTracker
from ..engines._common import Reasoning, thinking_budget
from ..engines.vllm import DetokenizerStop, RequestStop, vllm_reasoning

#: The vLLM releases (major, minor) this adapter is tested with, oldest and
#: newest: ``.ci/engines.sh`` runs the adapter and parity tests on each.
TESTED_VLLM = ((0, 33), (0, 34))
#: The same as a requirement specifier (the ``vllm`` extra says it too).
TESTED_VLLM_RANGE = ">=0.33,<0.35"
#: The environment variable that chooses how the adapter behaves
#: (:func:`plugin_mode`): ``auto`` (default), ``off`` or ``force``.
PLUGIN_ENV = "STOPLINE_VLLM_PLUGIN"

_log = logging.getLogger(__name__)


def installed_vllm() -> str | None:
    """The installed vLLM's version string (``importlib.metadata``, nothing
    imported), or ``None`` when vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def is_tested_vllm(version: str) -> bool:
    """Whether ``version`` (as ``installed_vllm`` gives it, e.g. ``"0.34.0"``,
    ``"0.34.1.dev3+g1234"``) is a release in :data:`TESTED_VLLM`."""
    parts = version.split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return False
    return TESTED_VLLM[0] <= release <= TESTED_VLLM[1]


def plugin_mode() -> str:
    """``$STOPLINE_VLLM_PLUGIN``, read at import: ``auto`` (the default: the
    processors act on a tested vLLM and are inactive on any other),
    ``off`` (inactive whatever the version: stopline stays installed and
    vLLM runs as without it) or ``force`` (active on an untested vLLM too,
    to take up a new release before stopline has been tested with it).
    ``0``/``false``/``no`` read as ``off``, ``1``/``true``/``yes``/``on`` as
    ``auto``; anything else as ``auto``, with a warning."""
    raw = os.environ.get(PLUGIN_ENV, "auto").strip().lower()
    mode = {"": "auto", "1": "auto", "true": "auto", "yes": "auto", "on": "auto",
            "0": "off", "false": "off", "no": "off", "none": "off"}.get(raw, raw)
    if mode not in ("auto", "off", "force"):
        _log.warning("%s=%r is not one of auto, off, force; read as auto", PLUGIN_ENV, raw[:40])
        return "auto"
    return mode


def _loader_interface() -> type | None:
    """The ``LogitsProcessor`` class of a vLLM plug-in loader already imported
    (the module that defines ``LOGITSPROCS_GROUP``): the class an entry point
    must subclass on a vLLM whose interface is not where 0.33 and 0.34 keep
    it. The loader is imported by the time it loads the entry point."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm.") or getattr(module, "LOGITSPROCS_GROUP", None) != "vllm.logits_processors":
            continue
        cls = getattr(module, "LogitsProcessor", None)
        if isinstance(cls, type) and hasattr(cls, "apply"):
            return cls
    return None


VLLM_VERSION = installed_vllm()
if VLLM_VERSION is None:
    raise ImportError(
        f"stopline.integrations.vllm needs vLLM (tested with {TESTED_VLLM_RANGE}): pip install 'stopline[vllm]'"
    )

try:
    import numpy as np
    import torch

    from ..logits import LIMITS, LogitsConstraints, check_request
except ImportError as exc:  # pragma: no cover - vLLM brings both
    raise ImportError(f"stopline.integrations.vllm needs numpy and torch beside vLLM {VLLM_VERSION}: {exc}") from exc

# The V2 interface (vLLM >= 0.33: the only one from 0.34 on), then V1's (0.33's
# other runner, gone in 0.34). The classes below subclass every interface
# the installed vLLM has, so each of its loaders accepts them.
# Any failure to import an interface is read as "not in this release" (a vLLM that
# breaks on an import here must still start with stopline installed).
try:
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as _V2Interface
except Exception:
    _V2Interface = _loader_interface()
try:
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor as _V1Interface, MoveDirectionality
except Exception:
    _V1Interface = None

#: Whether the installed vLLM still has the V1 model runner (0.33), where the
#: processors see each request's output tokens on the host.
HAS_V1_RUNNER = _V1Interface is not None
_BASES: tuple[type, ...] = tuple(b for b in (_V1Interface, _V2Interface) if b is not None)
if not _BASES:
    raise ImportError(
        f"stopline.integrations.vllm: vLLM {VLLM_VERSION} has no logits-processor interface stopline knows "
        f"(tested with vLLM {TESTED_VLLM_RANGE}); see docs/integrations.md, 'Supported engine versions'"
    )

def _v1_runner_certain() -> bool:
    """Whether this engine certainly runs the V1 model runner: only vLLM 0.33 has it, and
    there it runs only with ``VLLM_USE_V2_MODEL_RUNNER=0`` or when the configuration needs a
    feature V2 lacks (unknown at admission, so read as "V2 may run")."""
    if not HAS_V1_RUNNER:
        return False
    try:
        import vllm.envs as envs

        return envs.VLLM_USE_V2_MODEL_RUNNER is False
    except Exception:
        return False


PLUGIN_MODE = plugin_mode()
#: Whether the processors act (True) or are loaded inactive (False): the
#: interface was found where a tested vLLM keeps it, and :func:`plugin_mode`
#: with the installed version allows it.
ACTIVE = PLUGIN_MODE == "force" or (
    PLUGIN_MODE == "auto"
    and is_tested_vllm(VLLM_VERSION)
    and _V2Interface is not None
    and _V2Interface.__module__.startswith("vllm.v1.worker.gpu.sample.logits_processor")
)
if not ACTIVE and PLUGIN_MODE == "auto":
    _log.warning(
        "stopline's vLLM processors are tested with vLLM %s and this is vLLM %s: they are loaded inactive "
        "(requests that ask for stopline are refused; set %s=force to use them anyway)",
        TESTED_VLLM_RANGE, VLLM_VERSION, PLUGIN_ENV,
    )


def _inactive_reason() -> str:
    why = (f"{PLUGIN_ENV}=off" if PLUGIN_MODE == "off"
           else f"stopline is tested with vLLM {TESTED_VLLM_RANGE} and this is vLLM {VLLM_VERSION}")
    return (f"stopline's vLLM processors are inactive in this engine ({why}); "
            f"{PLUGIN_ENV}=force turns them on (docs/integrations.md, 'Supported engine versions')")


if TYPE_CHECKING:
    from vllm import SamplingParams

# RequestStop and DetokenizerStop live in the engine layer (they need no vLLM
# import) and are re-exported here, where they are documented.
__all__ = [
    "DetokenizerStop",
    "RequestStop",
    "StoplineBuiltinsProcessor",
    "StoplineLogitsProcessor",
    "constraints_from_params",
    "engine_reasoning",
    "vllm_reasoning",
]

EXTRA_ARGS_KEY = "stopline"


def constraints_from_extra_args(params: SamplingParams) -> dict[str, Any] | None:
    """``extra_args["stopline"]`` as :meth:`LogitsConstraints.set` arguments, or None."""
    extra = params.extra_args
    if not isinstance(extra, dict) or EXTRA_ARGS_KEY not in extra:
        return None  # vLLM's own field: anything but a dict carries nothing for stopline
    kw = extra[EXTRA_ARGS_KEY]
    field = f"extra_args[{EXTRA_ARGS_KEY!r}]"
    if not isinstance(kw, dict):
        raise field_type_error(field, "a dict of LogitsConstraints.set arguments", kw)
    unknown = [key for key in kw if key not in _EXTRA_ARGUMENTS]
    if unknown:
        raise unknown_keys(field, unknown, _EXTRA_ARGUMENTS)
    return {k: v for k, v in kw.items() if k != _BUDGET_KEY} or None


def budget_from_extra_args(params: SamplingParams) -> int | None:
    """``extra_args["stopline"]["max_reasoning_tokens"]``: the request's
    thinking budget in tokens (``None`` / -1: none)."""
    extra = params.extra_args
    kw = extra.get(EXTRA_ARGS_KEY) if isinstance(extra, dict) else None
    if not isinstance(kw, dict):
        return None
    return thinking_budget(kw.get(_BUDGET_KEY), f"extra_args[{EXTRA_ARGS_KEY!r}][{_BUDGET_KEY!r}]")


def budget_from_params(params: SamplingParams) -> int | None:
    """``SamplingParams.thinking_token_budget`` (``None`` / -1: none)."""
    return thinking_budget(getattr(params, "thinking_token_budget", None), "thinking_token_budget")


#: The keywords of LogitsConstraints.set a request may pass in extra_args.
_SET_ARGUMENTS = frozenset({"min_tokens", "stop_token_ids", "allowed_token_ids", "bad_words", "logit_bias", "restore"})
#: The thinking budget beside them (forced through LogitsConstraints.force).
_BUDGET_KEY = "max_reasoning_tokens"
_EXTRA_ARGUMENTS = _SET_ARGUMENTS | {_BUDGET_KEY}


def engine_reasoning(vllm_config: Any) -> Reasoning | None:
    """The engine's reasoning markers for a logits processor:
    ``vllm_config.reasoning_config`` once vLLM has initialised it
    (``--reasoning-parser`` / ``--reasoning-config``), read by
    :func:`vllm_reasoning` with the engine's tokenizer (so multi-token markers
    are matched as text and a prompt that ends inside ``<think>`` is read);
    ``None`` without reasoning."""
    config = getattr(vllm_config, "reasoning_config", None)
    if config is None or not getattr(config, "enabled", False):
        return None
    from vllm.config import ModelConfig

    tokenizer = None
    model_config = getattr(vllm_config, "model_config", None)
    if isinstance(model_config, ModelConfig):
        from vllm.tokenizers import cached_tokenizer_from_config

        tokenizer = cached_tokenizer_from_config(model_config)
    return vllm_reasoning(config, tokenizer=tokenizer)


def constraints_from_params(params: SamplingParams) -> dict[str, Any] | None:
    """The :meth:`LogitsConstraints.set` arguments for a vLLM request, or None if it has none.

    ``min_tokens`` masks ``all_stop_token_ids`` (EOS included, as vLLM's
    ``MinTokensLogitsProcessor``); masked stop tokens come back only on
    structured-output requests whose row is otherwise empty (``restore="always"``
    for them, ``"never"`` otherwise, which is vLLM's rule). ``bad_words`` are
    the tokenized ``bad_words_token_ids`` (vLLM fills them in the frontend).
    """
    kw: dict[str, Any] = {}
    if params.min_tokens:
        kw["min_tokens"] = int(params.min_tokens)
        kw["stop_token_ids"] = sorted(params.all_stop_token_ids)
        kw["restore"] = "always" if params.structured_outputs is not None else "never"
    if params.allowed_token_ids:
        kw["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.bad_words_token_ids:
        kw["bad_words"] = [list(w) for w in params.bad_words_token_ids]
    if params.logit_bias:
        kw["logit_bias"] = {int(t): float(b) for t, b in params.logit_bias.items()}
    return kw or None


def _refuse_iterators(kw: dict[str, Any]) -> None:
    """A one-shot iterator among a request's lists would be used up by the admission check (and
    cannot cross to vLLM's engine process): refused, with the field, before anything reads it."""
    from collections.abc import Iterator

    for key in ("stop_token_ids", "allowed_token_ids", "bad_words", "logit_bias"):
        value = kw.get(key)
        if isinstance(value, Iterator):
            raise field_type_error(key, "a list, tuple or array (an iterator would be used up at admission)", value)
    words = kw.get("bad_words")
    if isinstance(words, (list, tuple)):
        for i, word in enumerate(words[: LIMITS["max_bad_words"] + 1]):
            if isinstance(word, Iterator):
                raise field_type_error(f"bad_words[{i}]", "a list, tuple or array (an iterator would be used up at "
                                       "admission)", word)


# (class, id of the engine object it was built with) -> the instance; entries
# go with their instance. Keeping the engine object on the instance keeps its id
# from being reused while the entry lives.
_ENGINES: dict[tuple[type, int], weakref.ref[Any]] = {}


def _claim_engine(proc: Any, engine_object: Any) -> None:
    """Refuse a second live instance of the same class built for the same
    engine: vLLM loads the entry point's classes and then those of
    ``logits_processors=[...]`` without removing repeats, so a class named in
    both would run twice per step."""
    key = (type(proc), id(engine_object))
    ref = _ENGINES.get(key)
    other = None if ref is None else ref()
    if other is not None and other._engine_object is engine_object:
        name = type(proc).__name__
        raise field_error(
            ValueError,
            "logits_processors",
            f"{name} is already loaded in this engine: vLLM loads the vllm.logits_processors entry point (where "
            f"stopline registers StoplineLogitsProcessor) and then logits_processors=[...] without removing repeats; "
            f"name {name} once (a second instance would apply each request's constraints twice)",
            "invalid",
        )
    proc._engine_object = engine_object

    def forget(dead: weakref.ref[Any], key: tuple[type, int] = key) -> None:
        if _ENGINES.get(key) is dead:
            del _ENGINES[key]

    _ENGINES[key] = weakref.ref(proc, forget)


class StoplineLogitsProcessor(*_BASES):  # type: ignore[misc]
    """vLLM logits processor over :class:`stopline.logits.LogitsConstraints`,
    for requests that carry ``extra_args["stopline"]``; a subclass of every
    logits-processor interface the installed vLLM has (V1 and V2 on 0.33, V2
    on 0.34).

    Args (vLLM's constructors): V1 ``(vllm_config, device, is_pin_memory)``:
        ``vllm_config`` gives ``scheduler_config.max_num_seqs`` (slots) and
        ``model_config.get_vocab_size()`` (logits width); ``device`` is the
        logits' device; ``is_pin_memory`` is unused. V2 ``(vllm_config,
        req_states)``: slots, width and device come from ``req_states`` (a
        ``LogitsProcRequestState``), the persistent request slot is the
        stopline slot.

    Outside the tested vLLM releases (:data:`TESTED_VLLM_RANGE`), or with
    ``STOPLINE_VLLM_PLUGIN=off``, the class is inactive (:data:`ACTIVE`): it
    allocates nothing, leaves every row as it is, and :meth:`validate_params`
    refuses the requests that carry ``extra_args["stopline"]`` as a client
    error naming the installed version and the tested range; every other
    request runs as if stopline were not installed
    (docs/integrations.md, "Supported engine versions").

    Thinking budget (V1 runner): a request with
    ``extra_args["stopline"]["max_reasoning_tokens"]`` (this class) or
    ``thinking_token_budget`` (:class:`StoplineBuiltinsProcessor`)
    gets its end marker forced (:meth:`LogitsConstraints.force`) once it has
    thought that many tokens, one id per step, counted as vLLM 0.33's
    ``ThinkingBudgetStateHolder`` (docs/semantics.md 11.8). The
    markers are the engine's (:attr:`reasoning_for`, by default
    :func:`engine_reasoning`); a prompt that ends inside ``<think>`` is read,
    and its thinking counted as vLLM counts it, when the tokenizer's
    vocabulary is known. A sampled id past that vocabulary (engines pad the
    embedding) cannot be decoded: the budget is then no longer enforced for
    that request, rather than failing the step. Under the V2 runner vLLM
    forces ``thinking_token_budget`` itself, after every processor, and a
    ``max_reasoning_tokens`` is refused (use ``thinking_token_budget``).

    Raises:
        ValueError: at construction, when this class is already loaded in the
            same engine (the entry point and ``logits_processors=[...]`` both
            naming it); from :meth:`update_state` / :meth:`add_request` for a
            request whose constraints are invalid for this model (an id
            outside the vocabulary, ...) or that has a thinking budget in an
            engine without reasoning markers, naming the field;
            :meth:`validate_params` catches the model-independent ones at
            admission.
    """

    #: Where a request's constraints come from (None: the request has none).
    constraints_for = staticmethod(constraints_from_extra_args)
    #: Where a request's thinking budget comes from (None: no budget).
    budget_for = staticmethod(budget_from_extra_args)
    #: The engine's reasoning markers, read once at construction; override
    #: to give them explicitly (a :class:`stopline.engines.Reasoning`).
    reasoning_for = staticmethod(engine_reasoning)

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool = False):
        self._on = self._check_active()
        if not self._on:
            self._row_slot: dict[int, int] = {}
            return
        if not isinstance(device, (torch.device, str)):
            # V2: the loader hands every processor of one engine the same request-state object.
            _claim_engine(self, device)
            self._init_v2(vllm_config, device)
            return
        _claim_engine(self, vllm_config)  # V1: one build per model runner, one vllm_config
        self._reasoning = self.reasoning_for(vllm_config)
        self._trackers: dict[int, FinishTracker] = {}  # slot -> its thinking budget's tracker
        self._req_states: Any = None
        max_slots = int(vllm_config.scheduler_config.max_num_seqs)
        vocab_size = int(vllm_config.model_config.get_vocab_size())
        # One extra slot that is never set: rows without constraints point at it.
        self._blank = max_slots
        self.constraints = LogitsConstraints(max_slots + 1, vocab_size, device)
        self._free = list(range(max_slots - 1, -1, -1))
        self._row_slot = {}
        self._outputs: dict[int, list[int]] = {}  # slot -> the request's live output list
        self._fed: dict[int, int] = {}  # slot -> output tokens appended to the constraints
        # slot -> (constraints, budget, prompt, params), to restart the slot as it was added
        self._setup: dict[int, tuple[dict[str, Any], int | None, Any, Any]] = {}
        self._batch_size = 0
        self._rows: list[int] = []
        self._positions: list[int] = []

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse, at admission, what ``update_state`` would refuse in the engine core (vLLM calls
        this in the frontend, where an error is the client's HTTP 400, not a failed engine step):
        every check of :meth:`LogitsConstraints.set` that needs no vocabulary
        (:func:`stopline.logits.check_request`), the budget's type and range, and no one-shot
        iterator among the lists. What it cannot see is still refused later, in the engine
        step: an id at or past the model's vocabulary (it is given no vocabulary), a
        multi-token bad-words table over ``max_bad_words_table_bytes`` at the engine's
        ``max_num_seqs``, a thinking budget on an engine without reasoning markers, and under
        the model runner V2 a budget or a multi-token bad word (docs/integrations.md).

        Raises:
            ValueError: every problem, ``field`` and ``kind`` as ``set`` reports them (a
                ``TypeError`` of ``set`` is raised as a ``ValueError`` here, which vLLM turns
                into a client error; it does not for ``TypeError``).
        """
        if not ACTIVE:
            if cls._asks_for_stopline(sampling_params):
                raise field_error(ValueError, f"extra_args[{EXTRA_ARGS_KEY!r}]", _inactive_reason(), "unsupported")
            return
        try:
            kw = cls.constraints_for(sampling_params) or {}
            budget = cls.budget_for(sampling_params)  # type and range of the budget
            _refuse_iterators(kw)
            check_request(None, **kw)
            if not _v1_runner_certain():  # V2 may run: refuse here what add_request could not serve
                cls._check_v2(kw, budget)
        except TypeError as exc:
            raise field_error(ValueError, getattr(exc, "field", None) or f"extra_args[{EXTRA_ARGS_KEY!r}]", str(exc),
                              getattr(exc, "kind", None) or "wrong_type") from exc

    def is_argmax_invariant(self) -> bool:
        """Masks and biases change the argmax."""
        return False

    def _release(self, slot: int) -> None:
        self.constraints.clear(slot)
        self._outputs.pop(slot, None)
        self._fed.pop(slot, None)
        self._setup.pop(slot, None)
        self._trackers.pop(slot, None)
        self._free.append(slot)

    def _budget_tracker(self, budget: int, prompt: Any) -> FinishTracker:
        """A tracker that counts the thinking tokens of one request (ids only)."""
        reasoning = self._reasoning
        if reasoning is None:
            raise field_value_error(
                "max_reasoning_tokens",
                f"={budget}: this engine has no reasoning markers (start vLLM with --reasoning-parser)",
            )
        return reasoning.budget_counter(budget, prompt)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply vLLM's removed, added, moved lists (in that order); the new output tokens are
        read in :meth:`apply` (async scheduling fills them in between the two)."""
        if self._on and batch_update is not None:
            for index in batch_update.removed:
                slot = self._row_slot.pop(index, None)
                if slot is not None:
                    self._release(slot)
            for index, params, _prompt, output_ids in batch_update.added:
                old = self._row_slot.pop(index, None)
                if old is not None:
                    self._release(old)
                kw = self.constraints_for(params)
                budget = self.budget_for(params)
                if kw is None and budget is None:
                    continue
                slot = self._free.pop()
                self._setup[slot] = (kw or {}, budget, _prompt, params)
                self._start(slot)
                self._row_slot[index] = slot
                self._outputs[slot] = output_ids
            for a, b, direction in batch_update.moved:
                slot_a = self._row_slot.pop(a, None)
                slot_b = self._row_slot.pop(b, None)
                if slot_a is not None:
                    self._row_slot[b] = slot_a
                if slot_b is not None:
                    if direction == MoveDirectionality.SWAP:
                        self._row_slot[a] = slot_b
                    else:  # b was overwritten by a
                        self._release(slot_b)
            self._batch_size = batch_update.batch_size

    def _feed(self) -> None:
        """Feed each slot's new output tokens and lay out the rows (called by
        :meth:`apply`). Under vLLM's async scheduling (its default) the model
        runner appends a ``-1`` placeholder per sampled token and fills it in
        just before the sampler runs the processors, after ``update_state``;
        so the ids are read here, where they are known. A placeholder still
        unfilled is counted in the position but not fed (its id is unknown:
        a bad word that would end on it cannot fire yet). A list shorter than
        what was fed (vLLM drops tokens after a KV-load failure, or trims
        optimistic speculative placeholders) restarts the slot from the list
        as it is."""
        for slot, output_ids in self._outputs.items():
            n, fed = len(output_ids), self._fed[slot]
            if n < fed:
                self._start(slot)
                fed = 0
            if n == fed:
                continue
            new = output_ids[fed:n]
            if -1 in new:
                new = new[: new.index(-1)]
                if not new:
                    continue
            self.constraints.append_tokens(slot, new)
            self._fed[slot] = fed + len(new)
            counter, reasoning = self._trackers.get(slot), self._reasoning
            if counter is None or reasoning is None or counter.finished:
                continue
            if not reasoning.count(counter, new):
                del self._trackers[slot]  # the budget is no longer enforced for this request
            self.constraints.force(slot, counter.forced_token_id if slot in self._trackers else None)
        rows = [self._blank] * self._batch_size
        positions = [0] * self._batch_size
        for index, slot in self._row_slot.items():
            if index < self._batch_size:
                rows[index] = slot
                positions[index] = len(self._outputs[slot])
        self._rows, self._positions = rows, positions

    def _start(self, slot: int) -> None:
        """The slot as its request was added (``_setup``): its constraints, and its thinking
        budget counted from the prompt; the output is fed from the start. A refusal ends the
        request instead of failing the engine step (:meth:`_end_in_step`)."""
        kw, budget, prompt, params = self._setup[slot]
        self._fed[slot] = 0
        self._trackers.pop(slot, None)
        try:
            self.constraints.set(slot, **_within_vocab(kw, self.constraints.vocab_size))
            if budget is not None:
                tracker = self._trackers[slot] = self._budget_tracker(budget, prompt)
                self.constraints.force(slot, tracker.forced_token_id)
        except (TypeError, ValueError) as exc:
            self._trackers.pop(slot, None)
            self._end_in_step(slot, params, exc)

    # -- model runner V2 --------------------------------------------------

    def _init_v2(self, vllm_config: Any, req_states: Any) -> None:
        self._req_states = req_states
        slots = int(req_states.max_num_reqs)
        self.constraints = LogitsConstraints(slots, int(req_states.vocab_size), req_states.device)
        self._active = np.zeros(slots, dtype=bool)  # slots whose request has constraints
        self._multi = np.zeros(slots, dtype=bool)  # ... with multi-token bad words (they need the history)
        spec = getattr(vllm_config, "speculative_config", None)
        self._max_drafts = int(getattr(spec, "num_speculative_tokens", 0) or 0)
        self._row_slot = {}

    @staticmethod
    def _check_v2(kw: dict[str, Any], budget: int | None) -> None:
        """What the V2 runner cannot serve: a thinking budget of this processor's own (vLLM's V2
        sampler forces ``thinking_token_budget`` itself, after every processor, so a second
        budget would fight it)."""
        if budget is not None:
            raise field_value_error(
                f"extra_args[{EXTRA_ARGS_KEY!r}][{_BUDGET_KEY!r}]",
                f"={budget}: under vLLM's model runner V2 the thinking budget is vLLM's own: set "
                "SamplingParams.thinking_token_budget (vLLM forces its end marker after every logits processor)",
                "unsupported",
            )

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """V2: (re)initialize slot ``req_idx``; True if this request has constraints."""
        if not self._on:
            return False
        kw = self.constraints_for(sampling_params)
        budget = self.budget_for(sampling_params)
        if kw is None and budget is None:
            if self._active[req_idx]:
                self.constraints.clear(req_idx)
                self._active[req_idx] = self._multi[req_idx] = False
            return False
        self._active[req_idx], self._multi[req_idx] = True, False
        try:
            self._check_v2(kw or {}, budget)
            kw = _within_vocab(kw or {}, self.constraints.vocab_size)
            self.constraints.set(req_idx, **kw)
        except (TypeError, ValueError) as exc:
            self._end_in_step(req_idx, sampling_params, exc)
            return True
        self._multi[req_idx] = any(len(w) > 1 for w in kw.get("bad_words") or ())
        return True

    def _end_in_step(self, slot: int, params: SamplingParams, exc: Exception) -> None:
        """A request refused inside the engine step, where vLLM treats any exception as fatal
        to the whole engine: it is ended at its next token instead (its row forced to its first
        stop id, so it finishes with ``stop``), or, with no stop id to end it, run without its
        constraints; either way an error naming the field is logged. Admission
        (:meth:`validate_params`) refuses everything it can see, so this is for what needs the
        model: a table over its byte cap, a budget without reasoning markers, an
        ``allowed_token_ids`` with no id inside the vocabulary."""
        vocab = self.constraints.vocab_size
        stops = sorted(t for t in (getattr(params, "all_stop_token_ids", None) or ()) if 0 <= int(t) < vocab)
        self.constraints.clear(slot)
        field = getattr(exc, "field", None) or f"extra_args[{EXTRA_ARGS_KEY!r}]"
        if stops:
            self.constraints.force(slot, stops[0])
        _log.error("stopline: a request in slot %d cannot be served (%s: %s); %s", slot, field, str(exc)[:300],
                   f"it is ended at its next token (forced to its stop id {stops[0]})" if stops
                   else "it has no stop id to end it, so it runs without stopline's constraints")

    def apply_staged_writes(self) -> None:
        """V2: nothing is staged (``set`` writes the slot's rows at once)."""

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        batch = ctx.idx_mapping_np
        if not self._active[batch].any():
            return logits
        rs = self._req_states
        slots = ctx.expanded_idx_mapping
        dev = slots.device
        prompt_len = rs.prompt_len.gpu.to(dev)
        # pos is the input position of the row; the token it samples has pos + 1 - prompt_len outputs before it.
        positions = ctx.pos.to(torch.int64) + 1 - prompt_len[slots.long()].to(torch.int64)
        drafts = None
        if self._multi[batch].any():
            # Multi-token bad words match the request's committed output (req_states.all_token_ids,
            # prompt_len..total_len) and, on a speculative row, the drafts before it (ctx.input_ids).
            # The whole batch's history is copied (a few ids a request): indexing by the device's
            # own slot list needs no host-to-device copy, so no sync.
            idx = ctx.idx_mapping.long()
            self.constraints.load_history(idx, rs.all_token_ids.gpu, prompt_len[idx], rs.total_len.gpu.to(dev)[idx])
            if self._max_drafts:
                drafts = _draft_token_ids(ctx, self._max_drafts)
        self.constraints.apply(logits, row_slots=slots, row_positions=positions, draft_token_ids=drafts)
        return logits

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """V1: mask ``logits[:batch_size]`` in place; V2 (with ``ctx``): every row of ``logits``.
        ``logits`` is ``[rows, vocab]`` float; returns it."""
        if not self._on:
            return logits
        if ctx is not None:
            return self._apply_v2(logits, ctx)
        if not self._row_slot:
            return logits
        self._feed()
        n = len(self._rows)
        self.constraints.apply(logits[:n], row_slots=self._rows, row_positions=self._positions)
        return logits

    # -- activation ---------------------------------------------------------

    @classmethod
    def _asks_for_stopline(cls, params: SamplingParams) -> bool:
        """Whether a request needs this class to act (refused while it is inactive)."""
        return isinstance(params.extra_args, dict) and EXTRA_ARGS_KEY in params.extra_args

    def _check_active(self) -> bool:
        """Whether this instance acts: the module's :data:`ACTIVE` (the entry point's class
        then loads as a no-op)."""
        return ACTIVE


def _past(value: Any, vocab_size: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= vocab_size


def _within_vocab(kw: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """``kw`` without the ids at or past the model's vocabulary (admission checks everything
    else but cannot know it): a stop id, a biased id or a bad word holding such an id names no
    column, so dropping it changes nothing the model can sample. ``allowed_token_ids`` left
    with no id is then refused by ``set`` (the request allows nothing the model has)."""
    out = dict(kw)
    for key in ("stop_token_ids", "allowed_token_ids"):
        ids = out.get(key)
        if isinstance(ids, (list, tuple)) and any(_past(t, vocab_size) for t in ids):
            out[key] = [t for t in ids if not _past(t, vocab_size)]
    bias = out.get("logit_bias")
    if isinstance(bias, dict) and any(_past(t, vocab_size) for t in bias):
        out["logit_bias"] = {t: b for t, b in bias.items() if not _past(t, vocab_size)}
    words = out.get("bad_words")
    if isinstance(words, (list, tuple)):
        kept = [w for w in words if not (isinstance(w, (list, tuple)) and any(_past(t, vocab_size) for t in w))]
        if len(kept) != len(words):
            out["bad_words"] = kept
    return out


def _draft_token_ids(ctx: Any, max_drafts: int) -> torch.Tensor:
    """``[rows, max_drafts]`` int32 for :meth:`LogitsConstraints.apply`: for a row at offset
    ``k`` among its request's rows (``ctx.expanded_local_pos``), the ``k`` draft tokens fed
    before it (``ctx.input_ids`` of the rows after its request's first), -1 after them."""
    local = ctx.expanded_local_pos.to(torch.int64)
    dev = local.device
    rows = local.shape[0]
    j = torch.arange(max_drafts, device=dev)
    src = (torch.arange(rows, device=dev) - local)[:, None] + 1 + j
    ids = ctx.input_ids.to(torch.int32)[src.clamp(max=rows - 1)]
    return torch.where(j < local[:, None], ids, torch.full_like(ids, -1)).contiguous()


if not ACTIVE:
    # Inactive, the class must still be built by a loader whose interface grew abstract methods
    # this release of stopline does not know: none of them is ever called on a no-op.
    StoplineLogitsProcessor.__abstractmethods__ = frozenset()


class StoplineBuiltinsProcessor(StoplineLogitsProcessor):
    """The same processor over the ordinary ``SamplingParams`` fields
    (:func:`constraints_from_params`): vLLM's built-in min-tokens, logit-bias,
    allowed-ids and bad-words steps in one pass, for a V1-runner engine
    (vLLM 0.33) that takes its own steps out. Named explicitly
    (``logits_processors=[StoplineBuiltinsProcessor]``), never by the entry point.

    Raises:
        ValueError: at construction under the model runner V2 (vLLM's V2 sampler
            always runs its own stages on these fields, so a ``logit_bias`` would be
            added twice: use :class:`StoplineLogitsProcessor` with
            ``extra_args["stopline"]`` there), and where the adapter is inactive
            (an untested vLLM or ``STOPLINE_VLLM_PLUGIN=off``: the class was asked
            for by name, so the engine is told at start rather than run without it).
    """

    constraints_for = staticmethod(constraints_from_params)
    budget_for = staticmethod(budget_from_params)

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool = False):
        if not isinstance(device, (torch.device, str)):
            raise field_error(
                ValueError, "logits_processors",
                "StoplineBuiltinsProcessor reads the fields vLLM's model runner V2 applies itself (its "
                "LogitBiasState and BadWordsState always run), so a logit_bias would be added twice; under V2 "
                "use StoplineLogitsProcessor with extra_args['stopline'] (loaded by the entry point)",
                "unsupported",
            )
        super().__init__(vllm_config, device, is_pin_memory)

    @classmethod
    def _asks_for_stopline(cls, params: SamplingParams) -> bool:
        return False  # its fields are vLLM's own: an inactive instance is refused at construction instead

    def _check_active(self) -> bool:
        if not ACTIVE:
            raise field_error(ValueError, "logits_processors", _inactive_reason(), "unsupported")
        return True
