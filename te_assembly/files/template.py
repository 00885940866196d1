"""The one template renderer: every Jinja template te_assembly renders (a checkpoint's chat template, for
``generate``, chat data, ``eval``) goes through ``render_template``.

A template is code-like text from a download, so it runs in Jinja's immutable sandbox (it may read the
values it is given but not reach Python attributes behind them, ``__class__``..., or change them) and
within bounds, each refused with one ``TemplateError`` naming the template's file:

- **time**: ``RENDER_SECONDS`` per render, checked at every call, attribute, item, operator, loop step
  over ``range`` and piece of output, and, in the main thread, by a timer that interrupts any loop (over
  a list, say) between two Python steps: a template that loops forever is stopped, not waited on;
- **size**: no value and no output longer than ``MAX_CHARS`` characters; an operator, filter or call
  whose result would be larger (``'x' * 10**9``, ``'x'|center(10**9)``, ``'{:>9999999999}'.format``) is
  refused before it allocates;
- **numbers**: a power whose result would have more than ``MAX_BITS`` bits;
- **recursion**: a macro calling itself without end ends in Python's ``RecursionError``, reported;

and every other error a template can raise (a ``TypeError``, a division by zero, Jinja's own syntax
and undefined errors, the sandbox's range limit) is reported the same way.

Rendered as ``transformers`` renders chat templates (``trim_blocks``, ``lstrip_blocks``, the
``loopcontrols`` extension, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII
text, ``{% generation %}`` blocks kept as text, or marked with ``MARKS`` around them).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from te_assembly.errors import TemplateError

RENDER_SECONDS = 10.0
MAX_CHARS = 16 * 2**20
MAX_BITS = 1_000_000
MARKS = ("\ue000", "\ue001")
"""Private-use characters around each ``{% generation %}`` block when its spans are asked for."""

_NUMBER_IN_FORMAT = re.compile(r"\d{8,}")
"""A run of digits long enough to be a width or precision over ``MAX_CHARS``, in a format string."""


class _Refused(Exception):
    """Raised inside a render by a bound or ``raise_exception``; becomes a ``TemplateError``."""


class _Expired(BaseException):
    """Raised by the timer wherever the render is: a ``BaseException``, so no ``except Exception`` of a
    library on the way swallows it."""


class _Budget:
    def __init__(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Refused(f"it ran for more than {RENDER_SECONDS:g} s (a loop without end?)")


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > MAX_CHARS:
        raise _Refused(f"{what} would be {len(value):,} long, over the {MAX_CHARS:,} limit")
    return value


def _check_number(value: Any, what: str) -> None:
    """A count or width argument (``center(n)``, ``ljust(n)``, ``indent(n)``) within the size bound."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHARS:
        raise _Refused(f"{what} takes the number {value:,}, over the {MAX_CHARS:,} limit")


def _check_format(text: Any, what: str) -> None:
    """A format string (``str.format``, ``%``, the ``format`` filter) whose widths are within the bound."""
    if isinstance(text, str) and any(int(m) > MAX_CHARS for m in _NUMBER_IN_FORMAT.findall(text)):
        raise _Refused(f"{what} formats with a width over the {MAX_CHARS:,} limit")


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


class _Range:
    """Jinja's ``range`` (the sandbox's limit of 100,000 items kept) whose loop steps count against the
    time bound."""

    def __init__(self, *args: Any) -> None:
        from jinja2.sandbox import safe_range

        self.items = safe_range(*args)
        self.budget: _Budget | None = None

    def __iter__(self) -> Iterator[int]:
        for number, value in enumerate(self.items):
            if number % 256 == 0 and self.budget is not None:
                self.budget.tick()
            yield value

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __reversed__(self) -> Iterator[int]:
        return reversed(self.items)

    def __contains__(self, value: object) -> bool:
        return value in self.items


def _raise(message: str) -> None:
    raise _Refused(f"the template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must keep as they are.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Dict:
    """``dict(...)`` for templates, without handing them the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _bounded_filter(name: str, function: Callable[..., Any], environment: Any) -> Callable[..., Any]:
    @functools.wraps(function)  # keeps Jinja's pass_context / pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        environment.budget.tick()
        for value in (*args, *kwargs.values()):
            _check_number(value, f"the filter {name}")
        if name == "format" and args:
            _check_format(args[0], "the filter format")
        return _check_size(function(*args, **kwargs), f"the filter {name}'s result")

    return bounded


@functools.lru_cache(maxsize=16)
def _compiled(text: str, mark: bool) -> tuple[Any, Any]:
    """The bounded sandbox for ``text`` and the template compiled in it (compiled once per text)."""
    from jinja2 import nodes, utils
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # type: ignore[misc]
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens with it;
        for a prompt its body is plain output."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            if mark:
                body = [
                    nodes.Output([nodes.TemplateData(MARKS[0])]),
                    *body,
                    nodes.Output([nodes.TemplateData(MARKS[1])]),
                ]
            return nodes.Scope(body, lineno=lineno)

    class Namespace(utils.Namespace):  # type: ignore[misc]
        """Jinja's ``namespace`` refusing ``_`` names, which lead towards Python's internals, and values
        over the size bound."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, values = args[0], dict(*args[1:], **kwargs)
            for name, value in values.items():
                Namespace.check(name, value)
            utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name, value)
            utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: object, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"a chat template may not store {name!r} on a namespace")
            _check_size(value, f"namespace value {name!r}")

    class Sandbox(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        budget = _Budget()

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            __self.budget.tick()
            for value in (*args, *kwargs.values()):
                _check_number(value, "a call")
            result = super().call(__context, __obj, *args, **kwargs)
            if isinstance(result, _Range):
                result.budget = __self.budget
            return _check_size(result, "a call's result")

        def getattr(self, obj: Any, attribute: str) -> Any:
            self.budget.tick()
            if attribute in ("format", "format_map"):
                _check_format(obj, f"'.{attribute}'")  # the sandbox wraps it: judged here, by its text
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self.budget.tick()
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.budget.tick()
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    size = _sized(seq)
                    if size is not None and isinstance(count, int) and size * count > MAX_CHARS:
                        raise _Refused(f"'*' would make {size * count:,} items, over the {MAX_CHARS:,} limit")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
                if abs(left) > 1 and abs(left).bit_length() * right > MAX_BITS:
                    raise _Refused(f"'**' would make a number of over {MAX_BITS:,} bits")
            elif operator == "+":
                a, b = _sized(left), _sized(right)
                if a is not None and b is not None and a + b > MAX_CHARS:
                    raise _Refused(f"'+' would make {a + b:,} items, over the {MAX_CHARS:,} limit")
            elif operator == "%":
                _check_format(left, "'%'")
                for value in right if isinstance(right, tuple) else (right,):
                    _check_number(value, "'%'")  # a width given as '*'

            return super().call_binop(context, operator, left, right)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    for name, function in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, function, env)
    env.globals.update(
        raise_exception=_raise, strftime_now=_strftime_now, dict=_Dict(), namespace=Namespace, range=_Range
    )
    env.globals.pop("lipsum", None)  # random words by the million: no chat template needs them
    return env, env.from_string(text)


@contextlib.contextmanager
def _timer(seconds: float) -> Iterator[None]:
    """In the main thread, ``_Expired`` raised wherever the render is after ``seconds`` (``SIGALRM``);
    whatever timer and handler were set before are put back, the timer less the time spent here.
    Elsewhere, the checks at calls, attributes and loop steps over ``range`` bound the time."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise _Expired(f"it ran for more than {RENDER_SECONDS:g} s (a loop without end?)")

    began = time.monotonic()
    handler = signal.signal(signal.SIGALRM, expired)
    before, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if before > 0:
            signal.setitimer(signal.ITIMER_REAL, max(before - (time.monotonic() - began), 1e-3), interval)


def template_tokens(text: str) -> list[tuple[str, str]]:
    """``(kind, value)`` of every token of ``text`` as Jinja lexes it (white space left out), so a tag
    is found in any spelling and never inside a comment or a raw block; ``TemplateError`` for a template
    Jinja cannot lex."""
    from jinja2.exceptions import TemplateSyntaxError

    try:
        env, _ = _compiled("", False)
        return [(kind, value) for _, kind, value in env.lex(text) if kind != "whitespace"]
    except TemplateSyntaxError as exc:
        raise TemplateError(f"the template cannot be read: {exc}") from None


def render_template(text: str, source: str, variables: Mapping[str, Any], mark: bool = False) -> str:
    """``text`` rendered with ``variables`` within the bounds (module docstring); ``mark``: the
    ``{% generation %}`` blocks between ``MARKS``. Any failure is one ``TemplateError`` naming
    ``source``."""
    from jinja2.exceptions import SecurityError
    from jinja2.exceptions import TemplateError as JinjaError

    try:
        env, compiled = _compiled(text, mark)
        env.budget = _Budget()
        pieces, length = [], 0
        with _timer(RENDER_SECONDS + 1):
            for piece in compiled.generate(**variables):
                env.budget.tick()
                length += len(piece)
                if length > MAX_CHARS:
                    raise _Refused(f"its output is over the {MAX_CHARS:,}-character limit")
                pieces.append(piece)
        return "".join(pieces)
    except (_Refused, _Expired) as exc:
        raise TemplateError(f"{source}: {exc}") from None
    except SecurityError as exc:
        raise TemplateError(f"{source}: the template tried something unsafe: {exc}") from None
    except JinjaError as exc:
        raise TemplateError(f"{source}: the template failed: {exc}") from None
    except RecursionError:
        raise TemplateError(f"{source}: the template failed: it recursed without end") from None
    except MemoryError:
        raise TemplateError(f"{source}: the template failed: it ran out of memory") from None
    except Exception as exc:  # whatever Python raises inside a template: its own error, reported
        raise TemplateError(f"{source}: the template failed: {type(exc).__name__}: {exc}") from None


__all__ = ["MARKS", "MAX_CHARS", "RENDER_SECONDS", "render_template", "template_tokens"]
