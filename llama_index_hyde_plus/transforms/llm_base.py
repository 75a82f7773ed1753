"""`LLMTransform`: the shared machinery of the built-in, LLM-backed transforms.

It owns the LLM (``Settings.llm`` when none is given, resolved at call time so that
constructing a transform never needs an API key), the swappable prompt, the call
(sync ``complete`` or native async ``acomplete``, with ``timeout``), usage accounting
and the fallback rule: any exception, timeout, or empty/unparseable reply logs one
warning and yields the original query with ``fallback=True``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.settings import Settings

from .._checks import validate_query
from ..caching.keys import NOT_GENERATION_OPTIONS as NOT_GENERATION_OPTIONS  # re-exported
from ..caching.keys import (
    Unkeyable as Unkeyable,  # re-exported: what a key that cannot be built raises
)
from ..caching.keys import option_value, transform_key
from ..calls import llm as _llm
from ..calls.reliability import (
    CircuitOpenError,
    LLMTimeoutError,
    RetryPolicy,
    describe,
    failure,
)
from ..calls.timeouts import timeout_for, with_slot_wait
from ..usage import Usage, sum_usage
from .base import QueryTransformer, TransformResult, logger, revised
from .options import LLMOptions, breaker_from, check_options, generation_options
from .parsing import QueryCount, clean_reply
from .reuse import Reuse
from .templates import checked_template, render_template

if TYPE_CHECKING:
    from typing_extensions import Unpack


class UnusableReplyError(ValueError):
    """The LLM answered, but nothing usable could be parsed from the reply; ``count``
    is what a list transform made of it (`QueryCount`: asked for, kept, why the rest
    was left out), carried into the fallback's ``parsed``."""

    def __init__(self, message: str, *, count: QueryCount | None = None) -> None:
        super().__init__(message)
        self.count = count


class LLMTransform(QueryTransformer):
    """Base of HyDE, MultiQuery, StepBack, Decompose and Rewrite."""

    prompt_key: ClassVar[str]
    """Its prompt's name in ``get_prompts``/``update_prompts``; by default the method's
    with ``_prompt`` (``multi-query``: ``multi_query_prompt``)."""
    default_prompt: ClassVar[str]
    prompt_vars: ClassVar[frozenset[str]] = frozenset({"query"})
    uses_llm: ClassVar[bool] = True
    SEARCH_OPTIONS: ClassVar[frozenset[str]] = frozenset()
    """The constructor options that never change what the LLM writes, only how its
    output is searched: left out of the cache key (`_params`), so configurations that
    differ only in them share one generation (every ``hyde-plus tune`` sweep). Every other
    option is in the key unless it is one of `NOT_GENERATION_OPTIONS`."""

    def __init__(self, llm: LLM | None = None, **options: Unpack[LLMOptions]) -> None:
        super().__init__()
        if llm is not None and not isinstance(llm, LLM):
            raise TypeError(f"llm must be a LlamaIndex LLM, not {type(llm).__name__}")
        check_options(type(self).__name__, options)
        cache = options.get("cache")
        temperature = options.get("temperature")
        timeout = options.get("timeout")
        retry = options.get("retry")
        prices = options.get("prices")
        self.profile = options.get("profile", "auto")
        """``"auto"``, ``"small"`` or ``"capable"``: see `generator`."""
        self._llm = llm
        prompt = options.get("prompt")
        prompt = self.default_prompt if prompt is None else prompt
        self._prompt = checked_template(prompt, self.prompt_vars)
        self.temperature = temperature
        self._timeout = timeout
        self._timeout_given = "timeout" in options
        self.prices = dict(prices) if prices else None
        self._callback_manager = options.get("callback_manager")
        self.cache = cache
        self.retry = retry if retry is not None else RetryPolicy()
        self.breaker = breaker_from(options, self.method)
        self._reuse = Reuse(self)
        self._kind_of: tuple[object, str] | None = None  # (llm, generator kind), see generator
        self._warned_unkeyable = False  # the cache-off warning is given once

    def __repr__(self) -> str:
        """``HyDE(llm='gpt-4o-mini', profile='auto: capable')``: the model and which
        shipped defaults it gets."""
        try:
            name = _llm.model_name(self.llm) or type(self.llm).__name__
        except Exception:  # Settings.llm that cannot be resolved (no key)
            name = "Settings.llm (unresolved)"
        profile = f"auto: {self.generator}" if self.profile == "auto" else self.profile
        return f"{type(self).__name__}(llm={name!r}, profile={profile!r})"

    @property
    def llm(self) -> LLM:
        """The transform's own LLM; ``Settings.llm`` when none was given."""
        return self._llm if self._llm is not None else Settings.llm

    @property
    def generator(self) -> str:
        """Which of the shipped defaults apply when options are left unset: the
        ``profile`` given, else (``"auto"``) ``"small"`` for the bundled SmolLM2-135M and
        ``"capable"`` for any other LLM. An LLM that cannot be resolved (``Settings.llm``
        without a key) counts as capable: its call fails and falls back anyway. Read once
        per LLM object (its metadata is rebuilt on every access, and a search asks
        several times)."""
        if self.profile != "auto":
            return self.profile
        try:
            llm = self.llm
        except Exception:
            return "capable"
        known = self._kind_of
        if known is not None and known[0] is llm:
            return known[1]
        kind = _llm.generator_kind(llm)
        self._kind_of = (llm, kind)
        return kind

    @property
    def timeout(self) -> float | None:
        """Seconds one LLM call may take, retries included: the ``timeout`` option when
        given (None: no bound), else the one policy for this transform's model
        (`timeouts.timeout_for`: by the model's kind and the tokens it may write)."""
        if self._timeout_given:
            return self._timeout
        return timeout_for(self.llm, self._reply_tokens())

    def _reply_tokens(self) -> int | None:
        """The most tokens one reply of this transform needs (None: the model's cap)."""
        return None

    @property
    def prompt(self) -> BasePromptTemplate:
        """The prompt template the transform fills for each call."""
        return self._prompt

    @property
    def callback_manager(self) -> CallbackManager:
        """Where LLM events are reported besides the LLM's own manager."""
        return self._callback_manager or Settings.callback_manager

    # -- prompts -----------------------------------------------------------------
    def _get_prompts(self) -> PromptDictType:
        return {self.prompt_key: self._prompt}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if self.prompt_key in prompts:
            self._prompt = checked_template(prompts[self.prompt_key], self.prompt_vars)

    # -- what subclasses define ----------------------------------------------------
    def _format_vars(self) -> dict[str, Any]:
        return {}

    def _num_calls(self) -> int:
        return 1

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        """Build the result from the replies; raise `UnusableReplyError` if none is.

        Every concrete transform defines it (checked when the class is made). It is
        not abstract on purpose: LlamaIndex wraps implementations of abstract methods
        in an instrumentation span, and a span around this pure step cost each search
        more than the step itself (the LLM call and the searches keep theirs)."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not inspect.isabstract(cls) and cls._build is LLMTransform._build:
            raise TypeError(f"{cls.__name__} must define _build(query, replies, usage)")
        if not hasattr(cls, "prompt_key") and cls.method:  # its own, or inherited
            cls.prompt_key = cls.method.replace("-", "_") + "_prompt"

    # -- the call ----------------------------------------------------------------
    def _render(self, query: str, context: Sequence[str] | None = None) -> str:
        return render_template(self._prompt, query=query, **self._format_vars())

    def _call_options(self, **extra: Any) -> _llm.CallOptions:
        """How this transform's LLM calls are made; ``extra``: a subclass's own fields
        of `CallOptions` (built in one construction: this runs for every generation)."""
        return _llm.CallOptions(
            temperature=self.temperature,
            timeout=self.timeout,
            prices=self.prices,
            host_callback_manager=self.callback_manager,
            retry=self.retry,
            breaker=self.breaker,
            **extra,
        )

    def _options_within(self, budget: float | None) -> _llm.CallOptions:
        """`_call_options`, its timeout cut to ``budget`` seconds when that is shorter."""
        options = self._call_options()
        if budget is None or (options.timeout is not None and options.timeout <= budget):
            return options
        return replace(options, timeout=budget)

    def _params(self) -> dict[str, Any]:
        """The options that change the output, for the cache key: every constructor
        option (`options.generation_options`: all but `NOT_GENERATION_OPTIONS` and the
        class's `SEARCH_OPTIONS`), read from the attribute of the same name, as JSON. A new
        option is thus in the key unless declared search-only; one with no attribute of
        its name, or a value that is not plain data, is an error (no key, no cache)."""
        return {
            name: option_value(name, getattr(self, name))
            for name in generation_options(type(self), type(self).SEARCH_OPTIONS)
        }

    def cache_key_for(self, query: str, context: Sequence[str] | None = None) -> str:
        """The cache key of ``query`` (`keys.transform_key`: what the model is sent, the
        LLM's class, model and generation settings, the method and its generation
        options (`_params`), the query and, for a grounded transform, the passages
        shown to the model). Plain data only: the same in every process.

        Args:
            query: The question.
            context: The passages a grounded transform shows its model."""
        return self._key_of(self._prompt_for(query, context), query, context)

    def _key_of(self, prepared: tuple[LLM, str], query: str, context: Sequence[str] | None) -> str:
        """`cache_key_for` of the prompt already rendered (``prepared``): the very one the
        call sends, so a mapping that renders differently each time never stores one
        rendering's generation under another's key."""
        llm, prompt = prepared
        return transform_key(self.method, llm, prompt, self._params(), query, context)

    def _with_search_options(self, result: TransformResult, **changes: Any) -> TransformResult:
        """A cached result with this instance's search options (they do not change
        what the LLM wrote, so they are not in the cache key), and ``changes``."""
        return revised(result, include_query=self.include_query, **changes)

    def _key(self, query: str, context: Sequence[str] | None, prepared: _Prepared) -> str | None:
        """The cache key, or None when there is no cache (or no LLM to key on: the
        call then falls back on its own)."""
        if self.cache is None or isinstance(prepared, Exception):
            return None  # a prompt that cannot be rendered: the call falls back anyway
        try:
            return self._key_of(prepared, query, context)
        except Exception as exc:
            if not self._warned_unkeyable:
                self._warned_unkeyable = True
                logger.warning(
                    "%s: transform cache off, the cache key cannot be built (%s)",
                    type(self).__name__,
                    describe(failure(exc)),
                )
            return None

    def transform(self, query: str, *, context: Sequence[str] | None = None) -> TransformResult:
        """Rewrite ``query`` with the LLM; ``context`` is the question's top passages
        for a grounded transform (ignored by the others). With a cache, a hit costs no
        call and identical concurrent calls share one generation."""
        validate_query(query)
        context = self._context(context)
        prepared = self._prepared(query, context)  # rendered once: keyed and sent
        key = self._key(query, context, prepared)
        if key is None:
            return self._generate(query, prepared, None)
        generate = partial(self._generate, query, prepared)
        overdue = partial(self._overdue, query)
        return self._reuse.get(key, query, generate, self._flight_wait, overdue)

    async def atransform(
        self, query: str, *, context: Sequence[str] | None = None
    ) -> TransformResult:
        """Async twin of `transform`: native ``acomplete``, never a blocking call (a
        cache on disk or a network is read and written on its own worker threads)."""
        validate_query(query)
        context = self._context(context)
        prepared = self._prepared(query, context)
        key = self._key(query, context, prepared)
        if key is None:
            return await self._agenerate(query, prepared, None)
        generate = partial(self._agenerate, query, prepared)
        overdue = partial(self._overdue, query)
        return await self._reuse.aget(key, query, generate, self._flight_wait, overdue)

    def _flight_wait(self) -> float | None:
        """How long a caller waits on an identical generation: its timeout, plus the
        wait for a slot of a model that hands them out (`LocalLLM.slot_wait_s`), since
        the generation's clock starts once it has one. The leader's work gets it as its
        budget too, which never lengthens its calls' own timeout."""
        return with_slot_wait(self.llm, self.timeout)

    def _overdue(self, query: str, start: float) -> TransformResult:
        """The fallback of a caller whose own timeout ran out while it waited on an
        identical call (the LLM was not called for it)."""
        error = LLMTimeoutError(f"LLM did not answer within {self.timeout:g}s")
        return self._fallback(query, [error], start)

    def _context(self, context: Sequence[str] | None) -> tuple[str, ...] | None:
        """The passages this transform shows its model (none unless it is grounded)."""
        return None

    def _prompt_for(self, query: str, context: Sequence[str] | None) -> tuple[LLM, str]:
        """The LLM and the rendered prompt (raises what a missing LLM or a bad prompt
        raises; the caller falls back)."""
        return self.llm, self._render(query, context)

    def _prepared(self, query: str, context: Sequence[str] | None) -> _Prepared:
        """`_prompt_for`, or what it raised (the generation falls back with it)."""
        try:
            return self._prompt_for(query, context)
        except Exception as exc:
            return exc

    def _generate(self, query: str, prepared: _Prepared, budget: float | None) -> TransformResult:
        """The LLM calls of the prompt ``prepared`` (rendered once, for the key too; or
        what rendering raised: a fallback); several run at once under one deadline
        (`_llm.complete_all`), as `_agenerate` gathers them, so ``timeout`` bounds the
        whole generation (``budget``, when given and shorter: what is left of a
        caller's own time). One call is made in this thread."""
        start = time.perf_counter()
        if isinstance(prepared, Exception):
            return self._fallback(query, [prepared], start)
        llm, prompt = prepared
        options, n = self._options_within(budget), self._num_calls()
        outcomes: Sequence[_llm.LLMReply | BaseException]
        if n == 1:
            outcomes = [_outcome(lambda: _llm.complete(llm, prompt, options))]
        else:
            outcomes = _llm.complete_all(llm, prompt, options, n)
        return self._finish(query, outcomes, start)

    async def _agenerate(
        self, query: str, prepared: _Prepared, budget: float | None
    ) -> TransformResult:
        start = time.perf_counter()
        if isinstance(prepared, Exception):
            return self._fallback(query, [prepared], start)
        llm, prompt = prepared
        options = self._options_within(budget)
        calls = [_llm.acomplete(llm, prompt, options) for _ in range(self._num_calls())]
        outcomes: Sequence[_llm.LLMReply | BaseException]
        if len(calls) == 1:  # one call: awaited here, no task to hold
            outcomes = [await _aoutcome(calls[0])]
        else:
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return self._finish(query, outcomes, start)

    def _finish(
        self,
        query: str,
        outcomes: Sequence[_llm.LLMReply | BaseException],
        start: float,
    ) -> TransformResult:
        """The result from the calls' outcomes (replies, or what the calls raised).

        The call layer raises an ``Exception`` for every failed call, so anything else
        (an interrupt, an exit, a cancellation) is re-raised here, never hidden. Of the
        failures, the first that reached the LLM is reported (a call the breaker
        skipped says less than the call that failed)."""
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome
        replies = [o for o in outcomes if isinstance(o, _llm.LLMReply)]
        errors = sorted(
            (o for o in outcomes if isinstance(o, Exception)),
            key=lambda e: isinstance(e, CircuitOpenError),
        )
        usage = sum_usage([r.usage for r in replies])
        texts = [text for text in (clean_reply(r.text) for r in replies) if text]
        if texts and len(texts) < len(replies) and not errors:  # a partial generation
            empty = len(replies) - len(texts)
            errors = [UnusableReplyError(f"{empty} of {len(replies)} replies had no content")]
        if not texts:
            if not errors:
                errors = [UnusableReplyError("the LLM returned an empty reply")]
            return self._fallback(query, list(errors), start, usage)
        try:
            result = self._build(query, texts, usage)
        except UnusableReplyError as exc:
            # a call that failed (timed out, raised) is what went wrong: it is reported
            failed = [e for e in errors if not isinstance(e, UnusableReplyError)]
            return revised(self._fallback(query, [*failed, exc], start, usage), parsed=exc.count)
        return revised(
            result,
            usage=usage,
            error=describe(errors[0]) if errors else None,
            latency_s=time.perf_counter() - start,
        )

    def _fallback(
        self, query: str, errors: list[BaseException], start: float, usage: Usage | None = None
    ) -> TransformResult:
        """The original query, with the first error and what the failed calls cost."""
        error = describe(errors[0]) if errors else "unknown error"
        # an open breaker was logged once when it opened: no warning for every search
        quiet = bool(errors) and isinstance(errors[0], CircuitOpenError)
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "%s failed (%s); searching with the original query",
            self.method,
            error,
        )
        result = TransformResult.fallback_for(query, self.method, error, usage=usage or Usage())
        return revised(result, latency_s=time.perf_counter() - start)


_T = TypeVar("_T")
_Prepared = tuple[LLM, str] | Exception
"""The LLM and the prompt rendered for one call, or what rendering it raised."""


def _outcome(call: Callable[[], _T]) -> _T | Exception:
    """What ``call()`` returned, or the ``Exception`` it raised (anything else, an
    interrupt, propagates)."""
    try:
        return call()
    except Exception as exc:
        return exc


async def _aoutcome(call: Awaitable[_T]) -> _T | Exception:
    """`_outcome` of a coroutine, awaited in this task."""
    try:
        return await call
    except Exception as exc:
        return exc
