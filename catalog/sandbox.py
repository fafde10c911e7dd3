"""The one Jinja sandbox every template renders in, at load and at delivery, with guards against
templates that blow up: output over MAX_OUTPUT characters, a render longer than RENDER_SECONDS, calls
nested deeper than MAX_CALL_DEPTH (a macro calling itself), and `*` / `**` on operands that would
allocate or compute without bound.

Filters with a width argument (`center(10**9)`) are not intercepted here; the catalog is trusted
configuration, and the load-time check renders every template once, so a blow-up shows at load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, Template, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

MAX_OUTPUT = 100_000  # characters one field may render to
RENDER_SECONDS = 1.0  # wall time one field may take to render
MAX_REPEAT = MAX_OUTPUT  # the largest n in "text" * n
MAX_EXPONENT = 1000
MAX_CALL_DEPTH = 64  # calls in progress at once: a recursive macro stops here, at any speed

_deadline: ContextVar[float | None] = ContextVar("clarion_render_deadline", default=None)
_depth: ContextVar[int] = ContextVar("clarion_render_call_depth", default=0)


class RenderLimitExceeded(SecurityError):
    """A template took too long, or produced or computed too much."""


def _check_deadline() -> None:
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() > deadline:
        raise RenderLimitExceeded(f"rendering took longer than {RENDER_SECONDS:g} s")


class GuardedSandbox(SandboxedEnvironment):
    """SandboxedEnvironment whose calls, lookups and risky operators check the render's limits."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_deadline()
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise RenderLimitExceeded(f"exponent {right} is larger than {MAX_EXPONENT}")
        if operator == "*" and _repeats(left, right) > MAX_REPEAT:
            raise RenderLimitExceeded(f"repeating a text or list more than {MAX_REPEAT} times")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_deadline()
        depth = _depth.get() + 1
        if depth > MAX_CALL_DEPTH:
            raise RenderLimitExceeded(f"calls nest deeper than {MAX_CALL_DEPTH}")
        token = _depth.set(depth)
        try:
            return super().call(__context, __obj, *args, **kwargs)
        finally:
            _depth.reset(token)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_deadline()
        return super().getitem(obj, argument)


def _repeats(left: Any, right: Any) -> int:
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, str | list | tuple) and isinstance(n, int) and not isinstance(n, bool):
            return n * max(1, len(seq))
    return 0


env = GuardedSandbox(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=False)


@dataclass(frozen=True)
class Substitution:
    """A template that is only text and `{{ name }}` outputs ("Receipt {{ order }}"), rendered by
    joining its parts: Jinja's per-render context costs more than the rest of such a render, and
    most templates are like this. `template` is the same source as Jinja compiled it, used when
    the context lacks a name (a Jinja global, or undefined: Jinja's StrictUndefined says so)."""

    parts: tuple[tuple[bool, str], ...]  # (is a name, the name or the literal text)
    template: Template


Compiled = Template | Substitution  # what compile_template returns and render takes

_SPECIAL = frozenset({"self", "loop", "caller", "varargs", "kwargs", "super"})  # Jinja's own


def compile_template(source: str) -> Template | Substitution:
    """The source compiled in the sandbox; a Substitution when that is all it does."""
    template = env.from_string(source)
    parts: list[tuple[bool, str]] = []
    for output in env.parse(source).body:
        if not isinstance(output, nodes.Output):
            return template
        for node in output.nodes:
            if isinstance(node, nodes.TemplateData):
                parts.append((False, node.data))
            elif isinstance(node, nodes.Name) and node.ctx == "load" and node.name not in _SPECIAL:
                parts.append((True, node.name))
            else:
                return template
    return Substitution(tuple(parts), template)


def render(template: Template | Substitution, context: dict[str, Any]) -> str:
    """Render within the limits; raises RenderLimitExceeded (a jinja2 SecurityError) past them."""
    if isinstance(template, Substitution):
        try:
            out = "".join(str(context[t]) if name else t for name, t in template.parts)
        except KeyError:
            return render(template.template, context)
        if len(out) > MAX_OUTPUT:
            raise RenderLimitExceeded(f"renders to more than {MAX_OUTPUT} characters")
        return out
    token = _deadline.set(time.monotonic() + RENDER_SECONDS)
    try:
        return _collect(template.generate(context))
    finally:
        _deadline.reset(token)


def _collect(chunks: Iterator[str]) -> str:
    out: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_OUTPUT:
            raise RenderLimitExceeded(f"renders to more than {MAX_OUTPUT} characters")
        _check_deadline()
        out.append(chunk)
    return "".join(out)


_PROBES = frozenset({"unsafe_callable", "alters_data", "jinja_pass_arg"})  # markers jinja looks for


class Sample(str):
    """A stand-in for a required variable with no declared sample: its own name as text, that also
    has any attribute or item (another Sample) and iterates as one Sample, so `{{ user.name }}` and
    `{% for i in items %}` render at load without a declared sample."""

    def __getattr__(self, name: str) -> Sample:
        if name.startswith("_") or name in _PROBES:
            raise AttributeError(name)
        return Sample(f"{self}.{name}")

    def __getitem__(self, key: Any) -> Sample:
        if isinstance(key, str) and key.startswith("_"):
            raise KeyError(key)  # the sandbox then judges it as the attribute it names
        return Sample(f"{self}[{key}]")

    def __iter__(self) -> Iterator[Sample]:
        yield Sample(f"{self}[0]")

    def __call__(self, *args: Any, **kwargs: Any) -> Sample:
        return Sample(f"{self}()")
