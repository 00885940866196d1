"""A te_assembly model as an lm-evaluation-harness model (``--model te_assembly``): any language model
te_assembly loads (a pretrained directory, an imported one included, a run directory or a checkpoint)
scored on lm-eval's tasks without converting it.

The three request types are answered as lm-eval's own ``hf`` model answers them, so the same weights
score the same: text is tokenized with the model's ``tokenizer.json`` the way ``transformers`` does
by default (its post-processor's special tokens, a Llama tokenizer's BOS, unless ``add_bos_token``
says otherwise); an empty context is the BOS (else the end-of-text) token; a context and continuation
longer than the model's context lose tokens on the left; rolling log-likelihoods use lm-eval's own
windows; generation is greedy unless a task asks to sample, in left-padded batches through the key/value
cache, stopped at the model's end-of-text ids and cut at the task's stop strings.

Imported only with the ``[eval]`` extra (lm-eval).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from te_assembly.data.chat import special_tokens
from te_assembly.data.tokenizer import Tokenizer
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.head_chunks import CHUNK_TOKENS, TokenReduction, reduced_logits
from te_assembly.engines.reference.kv_cache import cache_layouts
from te_assembly.engines.target import DTYPES, Target
from te_assembly.errors import ArgumentError
from te_assembly.jobs.generate.decode import decode
from te_assembly.jobs.generate.job import load_source, model_folder, next_token, stop_ids_of, tokenizer_for
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.token_losses import token_losses
from te_assembly.jobs.window import DEFAULT, check_model_window_fits, model_context

LOG = logging.getLogger(__name__)

NAME = "te_assembly"
"""The name lm-eval knows the model by (``--model te_assembly``)."""

Request = tuple[tuple[str, str] | None, list[int], list[int]]


@register_model(NAME)
class TEAssemblyLM(TemplateLM):  # type: ignore[misc]
    """``pretrained``: the model's folder or checkpoint; ``dtype`` (null: the saved one), ``engine``
    (``auto``, ``reference`` or ``te``), ``device``, ``batch_size`` (rows per forward), ``max_length``
    (null: the model's context), ``max_gen_toks``, ``add_bos_token`` (null: as the tokenizer does)."""

    def __init__(
        self,
        pretrained: str | AssembledModel,
        dtype: str | None = None,
        engine: str = "auto",
        device: str | None = None,
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        tokenizer: str | None = None,
        source: str | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ArgumentError(
                f"te_assembly's lm-eval model does not take {', '.join(sorted(unknown))}: it takes "
                "pretrained, dtype, engine, device, batch_size, max_length, max_gen_toks, add_bos_token, "
                "tokenizer"
            )
        if isinstance(pretrained, AssembledModel):  # the Python API: a model already built
            self.model, where = pretrained, Path(source).expanduser() if source else None
        else:
            where = Path(pretrained).expanduser()
            self.model = load_source(str(pretrained), _target(engine, device, dtype))
        plan = self.model.plan
        if not plan.takes_token_ids or plan.out_features != plan.in_features:
            raise ArgumentError(
                f"{plan.name} is not a language model (token ids in, logits over its vocabulary)"
            )
        self.source = where
        settings = GenerateSettings(tokenizer=tokenizer)
        self.tok: Tokenizer = tokenizer_for(where, settings)
        specials = special_tokens(model_folder(where)) if where is not None else {}
        eos = specials.get("eos_token")
        self._eot = self.tok.token_id(eos) if eos is not None else None
        self._eot_text = eos if self._eot is not None else getattr(self.tok, "eot", "<|endoftext|>")
        bos = specials.get("bos_token")
        self._bos = self.tok.token_id(bos) if bos is not None else None
        self._bos_text = bos if self._bos is not None else None
        self.stop_ids = stop_ids_of(where, self.tok, settings) | {self.eot_token_id}
        self.add_bos_token = add_bos_token
        self._max_length = int(max_length) if max_length else (model_context(where) or DEFAULT)
        self._max_gen_toks = int(max_gen_toks)
        self.batch = _batch_size(batch_size, max_batch_size)
        self._device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        # A model whose attention looks ahead cannot take right-padded rows: each runs alone.
        self.causal = all(a.causal for a in cache_layouts(self.model))
        self.model.eval()

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> TEAssemblyLM:
        """lm-eval's command line always passes its own ``--batch_size`` (1 unless given) beside
        ``--model_args``: a ``batch_size`` inside ``--model_args`` is the one asked for, and wins."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, Any] | None = None
    ) -> TEAssemblyLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- what lm-eval asks of a TemplateLM ------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self._eot if self._eot is not None else self.tok.eot_id

    @property
    def prefix_token_id(self) -> int:
        return self._bos if self._bos is not None else self.eot_token_id

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tok.fingerprint

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = add_special_tokens
        if special is None:
            already = self._bos_text is not None and string.startswith(self._bos_text)
            special = False if already else (self.add_bos_token if self.add_bos_token is not None else True)
        return self.tok.encode(string, special=special)

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids)

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **_: Any
    ) -> list[Any]:
        """``(sum of the continuation's log-probabilities, whether each of its tokens is the greedy
        choice)`` per request, longest first in batches of ``batch_size`` right-padded rows."""
        windows = [
            (context + continuation)[-(self.max_length + 1) :] for _, context, continuation in requests
        ]
        order = sorted(range(len(requests)), key=lambda i: -len(windows[i]))
        out: list[Any] = [None] * len(requests)
        batch = self.batch if self.causal else 1
        with torch.no_grad():
            for start in range(0, len(order), batch):
                chosen = order[start : start + batch]
                scored = self._label_scores([windows[i] for i in chosen])
                for row, index in enumerate(chosen):
                    continuation = requests[index][2]
                    end = len(windows[index]) - 1
                    scores = scored[row, end - len(continuation) : end]
                    total = float(scores[:, 0].double().sum())
                    out[index] = (total, bool((scores[:, 1] > 0).all()))
                    self.cache_hook.add_partial("loglikelihood", requests[index][0], out[index])
        return out

    def _label_scores(self, windows: list[list[int]]) -> torch.Tensor:
        """``[rows, positions, 2]``: at each position of each window but its last token, the
        log-probability of the token after it and whether that token is the model's greedy choice; the
        head and softmax run over chunks of tokens (``engines/head_chunks.py``), never the batch's whole
        logits over the vocabulary."""
        longest = max(len(w) for w in windows) - 1
        check_model_window_fits(self.model, len(windows), longest, "batch_size or max_length")
        ids = torch.tensor([w[:-1] + [0] * (longest + 1 - len(w)) for w in windows], device=self._device)
        labels = torch.tensor(
            [w[1:] + [IGNORE] * (longest + 1 - len(w)) for w in windows], device=self._device
        )
        with reduced_logits(self.model, TokenReduction(_label_scores, labels, CHUNK_TOKENS)):
            return self.model(ids).y

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """A whole text's log-likelihood: lm-eval's disjoint windows of ``max_length`` tokens, the
        first conditioned on the prefix token, each later one on the tokens before it."""
        out = []
        for (string,) in (r.args for r in requests):
            windows = [
                (None, *make_disjoint_window(w))
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(score for score, _ in self._loglikelihood_tokens(windows))
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context continued (greedy unless the task samples) until a stop string, an end-of-text
        id or ``max_gen_toks`` tokens, in left-padded batches of requests that share settings."""
        out: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(index)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(dict(requests[indices[0]].args[1]), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=self._eot_text)
            for start in range(0, len(indices), self.batch):
                chosen = indices[start : start + self.batch]
                texts = self._generate([requests[i].args[0] for i in chosen], kwargs, until)
                for index, text in zip(chosen, texts, strict=True):
                    out[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return out

    def _generate(self, contexts: list[str], kwargs: dict[str, Any], until: list[str]) -> list[str]:
        new = int(kwargs["max_gen_toks"])
        if new >= self.max_length:
            raise ArgumentError(
                f"max_gen_toks={new} leaves no room for a context in {self.max_length} positions"
            )
        prompts = [self.tok_encode(c)[-(self.max_length - new) :] for c in contexts]
        temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
        settings = GenerateSettings(
            max_new_tokens=new,
            temperature=temperature,
            top_k=None,
            top_p=kwargs.get("top_p"),
            context=self.max_length,
        )
        generated: list[list[int]] = [[] for _ in prompts]

        def stop(row: int, token: int) -> bool:
            generated[row].append(token)
            text = self.tok.decode(generated[row])  # whole: a character may span tokens
            return any(term and term in text for term in until)

        generator = torch.Generator().manual_seed(int(kwargs.get("seed", 0) or 0))
        done = decode(self.model, prompts, settings, generator, next_token, self.stop_ids, on_token=stop)
        return [postprocess_generated_text(self.tok.decode(ids), until, None) for ids in done.ids]


def _target(engine: str, device: str | None, dtype: str | None) -> Target | str:
    """An engine name loads the model in its saved dtype on the CPU; a device or dtype makes a target.
    A CUDA device without a GPU is the CPU, as lm-eval's ``hf`` model takes it: lm-eval's command line
    asks for ``cuda:0`` unless told otherwise."""
    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        LOG.warning(f"device={device} asked for, but no CUDA GPU is visible: running on the CPU")
        device = "cpu" if dtype is not None else None
    if device is None and dtype is None:
        return engine
    if dtype is not None and dtype not in DTYPES:
        raise ArgumentError(f"dtype={dtype}: one of {', '.join(DTYPES)}")
    return Target.of(engine, device=device or "cpu", dtype=DTYPES[dtype or "float32"])


def _batch_size(batch_size: int | str, largest: int | None) -> int:
    """lm-eval's ``--batch_size``: a number of rows (``auto`` is not measured here: 8, or at most
    ``max_batch_size``)."""
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        return min(8, largest or 8)
    value = int(batch_size)
    if value < 1:
        raise ArgumentError(f"batch_size={batch_size}: at least 1")
    return value


IGNORE = -100
"""Positions past a window's end in a right-padded batch: not scored."""


def _label_scores(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[n, 2]``: each label's log-probability under ``logits`` ``[n, vocab]`` (minus its cross-entropy,
    ``token_losses``: float32 at least), and 1.0 where it is their argmax (lm-eval's is-greedy)."""
    picked = -token_losses(logits, labels, IGNORE)
    greedy = logits.argmax(dim=-1, keepdim=True) == labels[:, None]
    return torch.cat([picked, greedy.to(picked.dtype)], dim=-1)


__all__ = ["NAME", "TEAssemblyLM"]
