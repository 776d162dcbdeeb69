"""The Python API: ``Fly``, shaped like llama-cpp-python's ``Llama``.

Three layers, each built on the one below:

- ``Fly.generate(prompt, ...) -> Generation``: iterate it for one :class:`~fly_cpp.Step` per
  committed token (token id, text piece, drafted, loosely accepted, round); ``stats`` after.
- ``create_completion(..., stream=True)`` / ``create_chat_completion(..., stream=True)``:
  OpenAI-shaped chunks made from those steps.
- ``create_completion(...)`` / ``create_chat_completion(...)``: one OpenAI-shaped dict, with
  the generation's counters under ``"fly"`` (the fields of :meth:`fly_cpp.Stats.as_dict`).

Thread safety: one ``Fly`` may be shared by threads. Generations on one instance run one at a
time (the engine holds a lock while a generation is being iterated); a stream holds that lock
from its first chunk until it is exhausted or closed, so close streams you abandon.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fly_cpp.api import oai, reply, structured, tool_formats
from fly_cpp.api import tools as tool_calls
from fly_cpp.api.chat_format import ChatFormat, continued, resolve
from fly_cpp.backend.lib import set_verbose
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine.engine import Engine
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.request import Shift

PathLike = str | os.PathLike[str]
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSettings) if f.name != "path")
# llama-cpp-python's keywords for model settings (Llama(use_mmap=False)), from the fields' metadata
_PY_NAMES = {f.metadata["python"]: f.name for f in dataclasses.fields(ModelSettings) if "python" in f.metadata}
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(SpecSettings))
_SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingSettings))
_CALL_FIELDS = _SPEC_FIELDS + _SAMPLING_FIELDS


# a request's own arguments, not settings: a misspelt one (Fly(max_tokns=3)) is named as such, not
# matched to the closest setting (it suggested ngram_tokens)
CHAT_TEMPERATURE = 0.2  # llama-cpp-python's create_chat_completion default (its create_completion: 0.8)
_REQUEST_ARGUMENTS = ("max_tokens", "stop", "stream", "prompt", "messages", "logprobs", "echo", "suffix")


def _unknown(where: str, name: str, known: Sequence[str]) -> TypeError:
    close = difflib.get_close_matches(name, (*known, *_REQUEST_ARGUMENTS), n=1)
    if close and close[0] in _REQUEST_ARGUMENTS and close[0] not in known:
        return TypeError(f"{where}: unknown setting {name!r}; {close[0]!r} is an argument of a request "
                         f"(create_completion(..., {close[0]}=...)), not a setting")
    hint = f"; did you mean {close[0]!r}?" if close else f"; known settings: {', '.join(sorted(known))}"
    return TypeError(f"{where}: unknown setting {name!r}{hint}")


def _split_call_settings(where: str, settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate per-call keyword arguments into SpecSettings and SamplingSettings fields."""
    spec, sampling = {}, {}
    for name, value in settings.items():
        if name in _SPEC_FIELDS:
            spec[name] = value
        elif name in _SAMPLING_FIELDS:
            sampling[name] = value
        else:
            raise _unknown(where, name, _CALL_FIELDS)
    return spec, sampling


def _model_settings(path: PathLike | ModelSettings, changes: Mapping[str, Any]) -> ModelSettings:
    if isinstance(path, ModelSettings):
        return dataclasses.replace(path, **changes)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a model must be a path or a ModelSettings, got {type(path).__name__}")
    return ModelSettings(path=os.fspath(path), **changes)


def _stop_list(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    return tuple(stop)


class Fly:
    """A target model and an optional draft model, loaded once, for many requests.

    ``target`` / ``draft``: GGUF paths or :class:`ModelSettings` (``model_path`` is accepted
    for ``target``, as in llama-cpp-python), or files on the Hugging Face hub (``hf_repo`` +
    ``hf_file``, ``hf_draft_repo`` (default: ``hf_repo``) + ``hf_draft_file``), downloaded once
    into huggingface-hub's cache, or a named ``pair`` (see ``fly-cpp models list``). With no
    target, the bundled tiny story pair loads.
    ``chat_format``: ``None`` (the GGUF's ``tokenizer.chat_template``, else ``"plain"``), a
    built-in format (``"plain"``, ``"chatml"``, ``"llama-3"``, ``"mistral-instruct"``,
    ``"gemma"``, ``"phi-3"``), or a Jinja template.
    ``verbose``: True echoes llama.cpp's log to stderr (process-wide, like FLY_CPP_VERBOSE=1);
    False or None leaves it quiet (accepted, as llama-cpp-python's ``Llama`` takes it).
    ``**settings``: any field of ``ModelSettings`` (target model, e.g. ``n_ctx=2048``,
    ``n_gpu_layers=-1``), of ``ModelSettings`` prefixed ``draft_`` (draft model: unset, it
    follows the target's threads, GPU layers, KV cache types, ...), or of
    ``SpecSettings`` / ``SamplingSettings`` (defaults for every call, e.g. ``mode="spd"``,
    ``k=8``, ``temperature=0.7``). Unknown names raise ``TypeError``; bad values ``FlyError``.

    Threads may share one instance: its generations run one at a time (see the module notes
    on streams).

    Example::

        with Fly("target.gguf", "draft.gguf", n_ctx=4096, temperature=0) as llm:
            out = llm.create_chat_completion([{"role": "user", "content": "Hi!"}])
            print(out["choices"][0]["message"]["content"], out["fly"]["mean_accepted"])
    """

    def __init__(self, target: PathLike | ModelSettings | None = None, draft: PathLike | ModelSettings | None = None,
                 *, model_path: PathLike | None = None, hf_repo: str | None = None, hf_file: str | None = None,
                 hf_draft_repo: str | None = None, hf_draft_file: str | None = None, pair: str | None = None,
                 chat_format: str | None = None, verbose: bool | None = None, **settings: Any) -> None:
        if verbose:
            set_verbose(True)
        target_changes: dict[str, Any] = {}
        draft_changes: dict[str, Any] = {}
        call: dict[str, Any] = {}
        for name, value in settings.items():
            bare = name[6:] if name.startswith("draft_") else name
            if bare in _PY_NAMES:
                name = name[: len(name) - len(bare)] + _PY_NAMES[bare]
            if name in _MODEL_FIELDS:
                target_changes[name] = value
            elif name.startswith("draft_") and name[6:] in _MODEL_FIELDS:
                draft_changes[name[6:]] = value
            elif name in _CALL_FIELDS:
                call[name] = value
            else:
                raise _unknown("Fly()", name, _MODEL_FIELDS + tuple("draft_" + f for f in _MODEL_FIELDS) + _CALL_FIELDS)
        spec, sampling = _split_call_settings("Fly()", call)
        self.spec = SpecSettings(**spec)  # defaults for every call; validated now
        self.sampling = SamplingSettings(**sampling)
        self._chat_temperature = None if "temperature" in sampling else CHAT_TEMPERATURE
        if model_path is not None:
            if target is not None:
                raise TypeError("give the target model as target or model_path, not both")
            target = model_path
        from fly_cpp.models import sources

        given = sources.resolve(_path(target), _path(draft), hf_repo=hf_repo, hf_file=hf_file,
                                hf_draft_repo=hf_draft_repo, hf_draft_file=hf_draft_file, pair=pair)
        target = target if isinstance(target, ModelSettings) else given.target
        draft = draft if isinstance(draft, ModelSettings) else given.draft
        t = _model_settings(target, {**given.defaults, **target_changes})
        d = None
        if isinstance(draft, ModelSettings):
            d = dataclasses.replace(draft, **draft_changes)
        elif draft is not None:
            d = t.for_draft(os.fspath(draft), **draft_changes)  # the draft follows the target unless set
        self._init(Engine(t, d, max_draft=self.spec.max_draft, branches=self.spec.draft_tree > 0), chat_format)

    @classmethod
    def from_engine(cls, engine: Engine, *, chat_format: str | None = None, spec: SpecSettings | None = None,
                    sampling: SamplingSettings | None = None) -> Fly:
        """Wrap an engine that is already loaded; the Fly owns it from now on (``close()``
        closes it, and so does a failure here)."""
        self = cls.__new__(cls)
        self.spec, self.sampling = spec or SpecSettings(), sampling or SamplingSettings()
        self._chat_temperature = None if sampling is not None else CHAT_TEMPERATURE
        self._init(engine, chat_format)
        return self

    def _init(self, engine: Engine, chat_format: str | None) -> None:
        self.engine = engine
        self.info = info = engine.info()
        self.model = info.target_name
        try:
            self.chat_format: ChatFormat = resolve(chat_format, info.chat_template, bos_token=info.bos_text,
                                                   eos_token=info.eos_text)
        except BaseException:
            engine.close()
            raise
        self._closed = False

    # -- tokens ---------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.engine.detokenize(tokens)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], **template_vars: Any) -> list[int]:
        """The prompt tokens of a conversation: the chat format rendered (``template_vars``:
        extra variables for its template), special tokens parsed, BOS added when the model
        wants one and the template did not write it."""
        return self._prompt_tokens(self._chat_text(messages, template_vars))

    def _chat_text(self, messages: Sequence[Mapping[str, Any]], template_vars: Mapping[str, Any]) -> str:
        """The rendered conversation; one that ends with an assistant's message is continued from
        its text (the messages before it, the assistant's opening, then that text)."""
        messages = tool_calls.template_messages(messages, tool_formats.detect(self.chat_format.template))
        prefill = continued(messages)
        if prefill is not None:
            messages = messages[:-1]
        return self.chat_format.render(messages, add_generation_prompt=True, **template_vars) + (prefill or "")

    def chat_turn(self, messages: Sequence[Mapping[str, Any]], *, tools: Any = None, tool_choice: Any = None,
                  parallel_tool_calls: bool | None = None, reasoning_format: str | None = None,
                  **template_vars: Any) -> tuple[list[int], dict[str, Any], reply.Options]:
        """A conversation's prompt tokens, the settings its tools add (the grammar a call obeys:
        ``fly_cpp.api.tools``) and how to read the answer (``fly_cpp.api.reply``). ``tools``,
        ``tool_choice``, ``parallel_tool_calls``: OpenAI's; ``reasoning_format``: llama-server's
        (auto, deepseek: ``<think>`` goes to reasoning_content; none: it stays in the content)."""
        found = tool_calls.check(tools, tool_choice, parallel_tool_calls)
        spec = found if found is not None and found.active else None
        fmt = None
        if spec is not None:
            fmt = tool_calls.check_template(self.chat_format.template, self.chat_format.name)
            template_vars = {**template_vars, "tools": list(spec.tools)}
        text = self._chat_text(messages, template_vars)
        opened = tool_calls.think_open(text)
        settings: dict[str, Any] = {}
        if spec is not None and fmt is not None:
            gbnf, trigger = tool_calls.grammar(spec, opened, fmt)
            settings = {"grammar": gbnf, "grammar_trigger": trigger, "json_schema": "",  # over any default
                        "preserved_tokens": fmt.preserved}
        opts = reply.Options(reasoning=tool_calls.reasoning(reasoning_format), calls=fmt,
                             names=tool_calls.function_names(spec) if spec else (), think_open=opened)
        return self._prompt_tokens(text), settings, opts

    def _prompt_tokens(self, text: str) -> list[int]:
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        info = self.info
        if info.add_bos and info.bos >= 0 and tokens[:1] != [info.bos]:
            tokens.insert(0, info.bos)
        return tokens

    # -- layer 1: steps -------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = 128,
                 stop: str | Sequence[str] | None = None, fly: SpecSettings | Mapping[str, Any] | None = None,
                 n_probs: int = 0, cache_prompt: bool = True, slot: int | None = None,
                 shift: Shift | None = None, **settings: Any) -> Generation:
        """Prepare a generation; iterate it for Steps. ``settings``: SpecSettings and
        SamplingSettings fields for this call (over the instance's defaults); ``fly``: a whole
        SpecSettings, or a dict of its fields. ``max_tokens=None``: until the context is full.
        ``n_probs``: each Step carries the target's top-n log-probabilities (``Step.probs``).
        ``cache_prompt=False``: start from empty KV caches. ``slot``: the engine's slot to run in
        (None: the first free one). ``shift``: a text that fills the context shifts it and goes
        on (``fly_cpp.rounds.shift``; None: it ends there). Request errors are raised here,
        before any token."""
        if self._closed:
            raise FlyError("this Fly instance is closed")
        if not isinstance(prompt, str) and not (
                isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt)):
            raise TypeError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            raise TypeError(f"max_tokens must be an int or None, got {max_tokens!r}")
        spec_changes, sampling_changes = _split_call_settings("Fly", settings)
        base = self.spec
        if isinstance(fly, SpecSettings):
            base = fly
        elif fly is not None:
            if not isinstance(fly, Mapping):
                raise TypeError(f"fly must be a SpecSettings or a dict of its fields, got {type(fly).__name__}")
            extra, wrong = _split_call_settings("fly=", fly)
            if wrong:
                raise _unknown("fly=", next(iter(wrong)), _SPEC_FIELDS)
            spec_changes = {**extra, **spec_changes}
        spec = dataclasses.replace(base, **{k: v for k, v in spec_changes.items() if v is not None})
        sampling = dataclasses.replace(self.sampling, **{k: v for k, v in sampling_changes.items() if v is not None})
        return self.engine.generate(prompt, spec=spec, sampling=sampling,
                                    max_tokens=self.n_ctx if max_tokens is None else max_tokens, stop=_stop_list(stop),
                                    n_probs=n_probs, cache_prompt=cache_prompt, slot=slot, shift=shift)

    def generate_chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = 128,
                      stop: str | Sequence[str] | None = None, fly: SpecSettings | Mapping[str, Any] | None = None,
                      n_probs: int = 0, cache_prompt: bool = True, **settings: Any) -> Generation:
        """``generate`` for a conversation: the chat format's prompt, and its stop strings
        besides ``stop``. Iterate it for Steps; ``fly_cpp.api.oai.answer_text`` gives the answer's
        text pieces without the whitespace it starts with."""
        return self.generate(self.chat_tokens(messages), max_tokens=max_tokens,
                             stop=(*self.chat_format.stop, *_stop_list(stop)), fly=fly, n_probs=n_probs,
                             cache_prompt=cache_prompt, **settings)

    # -- layers 2 and 3: OpenAI-shaped completions -----------------------------------------

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 128, *,
                          temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                          min_p: float | None = None, repeat_penalty: float | None = None,
                          presence_penalty: float | None = None, frequency_penalty: float | None = None,
                          stop: str | Sequence[str] | None = None, stream: bool = False, seed: int | None = None,
                          mode: str | None = None, k: int | None = None, window: int | None = None,
                          entropy_threshold: float | None = None, fly: SpecSettings | Mapping[str, Any] | None = None,
                          **settings: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Complete ``prompt`` (text or token ids). Returns an OpenAI ``text_completion`` dict,
        or with ``stream=True`` an iterator of ``text_completion`` chunks whose last one carries
        ``finish_reason``, ``usage`` and ``fly``. Options left at ``None`` keep the instance's
        defaults; ``**settings`` takes any other SpecSettings/SamplingSettings field."""
        gen = self.generate(prompt, max_tokens=max_tokens, stop=stop, fly=fly, **settings, **_given(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed, mode=mode, k=k,
            window=window, entropy_threshold=entropy_threshold))
        top = oai.head("text_completion", self.model)
        return oai.completion_chunks(gen, top) if stream else oai.completion(gen.run(), top)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = 128, *,
                               temperature: float | None = None, top_p: float | None = None,
                               top_k: int | None = None, min_p: float | None = None,
                               repeat_penalty: float | None = None, presence_penalty: float | None = None,
                               frequency_penalty: float | None = None, stop: str | Sequence[str] | None = None,
                               stream: bool = False, seed: int | None = None, mode: str | None = None,
                               k: int | None = None, window: int | None = None,
                               entropy_threshold: float | None = None,
                               fly: SpecSettings | Mapping[str, Any] | None = None,
                               response_format: Mapping[str, Any] | None = None,
                               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                               parallel_tool_calls: bool | None = None, reasoning_format: str | None = None,
                               chat_template_kwargs: Mapping[str, Any] | None = None,
                               **settings: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation (OpenAI-style ``messages``) through the chat format. Returns a
        ``chat.completion`` dict, or with ``stream=True`` ``chat.completion.chunk`` dicts: the
        role first, then content deltas, then one with ``finish_reason``, ``usage`` and ``fly``.
        The answer's leading whitespace is dropped. ``response_format``: OpenAI's
        (``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema": ...}}``),
        enforced; ``grammar=`` (GBNF) and ``json_schema=`` (text) are taken as settings.
        ``tools`` / ``tool_choice`` (auto, none, required, ``{"type": "function", "function":
        {"name": ...}}``) / ``parallel_tool_calls``: OpenAI's, through a Hermes-style template
        (docs/structured-output.md); calls come back as ``message.tool_calls``. A reasoning
        model's ``<think>`` block comes back as ``reasoning_content`` (``reasoning_format="none"``
        keeps it in the content); ``chat_template_kwargs``: extra template variables
        (``{"enable_thinking": False}``).
        Resending the whole conversation each turn is cheap: both KV caches keep the common
        prefix, so only the new turn is decoded."""
        if (schema := structured.response_format(None if response_format is None else dict(response_format))):
            settings = {**settings, "json_schema": schema}
        tokens, extra, opts = self.chat_turn(messages, tools=tools, tool_choice=tool_choice,
                                             parallel_tool_calls=parallel_tool_calls,
                                             reasoning_format=reasoning_format, **dict(chat_template_kwargs or {}))
        settings = tool_calls.with_grammar(settings, extra)
        if temperature is None and "temperature" not in settings:
            temperature = self._chat_temperature  # llama-cpp-python's chat default, unless the instance set one
        gen = self.generate(tokens, max_tokens=max_tokens, stop=(*self.chat_format.stop, *_stop_list(stop)), fly=fly,
                            **settings, **_given(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed, mode=mode, k=k,
            window=window, entropy_threshold=entropy_threshold))
        top = oai.head("chat.completion", self.model)
        return oai.chat_chunks(gen, top, opts=opts) if stream else oai.chat_completion(gen.run(), top, opts=opts)

    __call__ = create_completion

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Free both models. Open generations and streams are closed first; one that another
        thread is running is waited for."""
        if self._closed:
            return
        self._closed = True
        self.engine.close()

    def __enter__(self) -> Fly:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Fly(target={self.model!r}, draft={self.info.draft_name!r}, n_ctx={self.n_ctx}, "
                f"chat_format={self.chat_format.name!r})")


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _path(model: PathLike | ModelSettings | None) -> str | None:
    """A model argument as the source resolver sees it (settings carry their own path)."""
    if model is None:
        return None
    if isinstance(model, ModelSettings):
        return model.path
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"a model must be a path or a ModelSettings, got {type(model).__name__}")
    return os.fspath(model)
