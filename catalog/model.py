"""Types and templates, validated when the catalog loads (not when a worker first renders)."""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from jinja2 import TemplateSyntaxError, meta
from jinja2.exceptions import SecurityError, TemplateAssertionError, UndefinedError

from clarion.catalog import locales as _locales
from clarion.catalog.digest import DIGEST_VARIABLES, DigestSpec, parse_digest
from clarion.catalog.escalation import Escalation, check_escalations, parse_escalation
from clarion.catalog.options import DEFAULT_UPDATE_SECONDS, GateOptions
from clarion.catalog.sandbox import Compiled, Sample, compile_template
from clarion.catalog.sandbox import env as _env
from clarion.catalog.sandbox import render as _render

CATEGORIES = ("transactional", "security", "alert", "activation", "digest", "marketing")
LANES = ("transactional", "activation")
DEFAULT_LANE = {
    "transactional": "transactional",
    "security": "transactional",
    "alert": "transactional",
    "activation": "activation",
    "digest": "activation",
    "marketing": "activation",
}

# Every channel name a type may list: the adapters that exist and those on their way. A name not in
# here is a typo (`webhok`) and refused at load. Extend it when a channel is added.
CHANNELS = frozenset({"console", "webhook", "slack", "teams", "email", "sms", "push", "in_app"})
# The channels a recipient may turn on or off on the preferences page: those that reach the person.
# `console` (the operator's terminal) and `webhook` (the operator's own endpoint, escalation hooks)
# reach a system, not the recipient, so the page never offers them.
RECIPIENT_CHANNELS = frozenset({"slack", "teams", "email", "sms", "push", "in_app"})
LABEL_CHARS = 80  # longest type label
DESCRIPTION_CHARS = 300  # longest type description


# Per-type gate options: window_exempt (neither blocked by nor opening the activation window),
# on_window (skip | defer when blocked), critical (bypasses quiet hours and fatigue caps),
# default (on | off when the recipient has said nothing), collapse ({key, window_seconds,
# update_seconds}: followers update the leader's message in place, at most once per update_seconds),
# delivery (at_most_once | at_least_once: what a send with an unknown outcome may do; see GUARANTEE),
# digest (buffer into a digest type's request: catalog/digest.py).
TYPE_OPTIONS = frozenset(
    {"window_exempt", "on_window", "critical", "default", "collapse", "delivery", "digest"}
)
GUARANTEES = ("at_most_once", "at_least_once")
# What a collapse type's templates may use besides its own variables: the group's size so far
# (the leader included) and whether its window is still open. The first send renders these
# defaults; tasks.refresh re-renders the leader's message with the live values.
COLLAPSE_VARIABLES = {"collapsed_count": 1, "collapse_open": False}
# "Never twice" is the promise of a nudge; a receipt or a security code must arrive.
GUARANTEE = {
    "transactional": "at_least_once",
    "security": "at_least_once",
    "alert": "at_least_once",
    "activation": "at_most_once",
    "digest": "at_most_once",
    "marketing": "at_most_once",
}


class CatalogError(ValueError):
    """The catalog itself is malformed (raised at load time)."""


Fail = Callable[[str], CatalogError]  # the error for one type's spec, given its message


def readable(key: str) -> str:
    """A key as words, for a type without a label: `stalled_plan` -> "Stalled plan"."""
    words = key.replace("_", " ").replace("-", " ").strip()
    return words[:1].upper() + words[1:]


@dataclass(frozen=True)
class TypeText:
    """What a recipient reads about a type (the preferences page), in one locale."""

    label: str | None = None
    description: str | None = None


BUTTON_ACTIONS = ("answer", "stop_series", "snooze")


@dataclass(frozen=True)
class Button:
    """An answer a recipient can give. Labels shown anywhere come from here, never from a client."""

    key: str
    label: str
    action: str = "answer"  # answer | stop_series | snooze
    hours: float = 24.0  # for snooze: how long to hold the next occurrence
    style: str | None = None  # primary | danger (where the platform has styles)


@dataclass(frozen=True)
class Strings:
    """One locale's text of a version: fields for every channel, and per-channel overrides."""

    fields: dict[str, str] = field(default_factory=dict)
    per_channel: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Template:
    """One version of a type's content: default fields plus per-channel overrides (in the
    catalog's default locale), other locales' strings, buttons and sample variables."""

    version: int
    fields: dict[str, str]
    per_channel: dict[str, dict[str, str]] = field(default_factory=dict)
    buttons: tuple[Button, ...] = ()
    samples: dict[str, Any] = field(
        default_factory=dict
    )  # variables the load-time check renders with
    locales: dict[str, Strings] = field(default_factory=dict)  # canonical tag -> its strings

    def button(self, key: str) -> Button | None:
        return next((b for b in self.buttons if b.key == key), None)

    def locale_for(self, locale: str | None, default: str = _locales.DEFAULT) -> str:
        """The locale this version renders for a recipient's `locale`: the first of its fallback
        chain (`de-AT → de → default`) that the version has strings for."""
        return next(tag for tag in _locales.chain(locale, default) if self._has(tag, default))

    def _has(self, tag: str, default: str) -> bool:
        return tag == default or tag in self.locales

    def sources(
        self, channel: str, locale: str | None = None, default: str = _locales.DEFAULT
    ) -> dict[str, str]:
        """Field name -> template source for `channel` in `locale`. Each field comes from the
        most specific locale of the chain that has it (a channel override before that locale's
        own field), so a partly translated locale falls back field by field."""
        layers = [
            self.locales[tag] if tag != default else Strings(self.fields, self.per_channel)
            for tag in _locales.chain(locale, default)
            if self._has(tag, default)
        ]
        out: dict[str, str] = {}
        for strings in reversed(layers):  # least specific first; later layers win
            out.update(strings.fields)
            out.update(strings.per_channel.get(channel, {}))
        return out

    def _all_strings(self) -> list[Strings]:
        return [Strings(self.fields, self.per_channel), *self.locales.values()]

    def variables(self) -> set[str]:
        names: set[str] = set()
        for strings in self._all_strings():
            for source in [strings.fields, *strings.per_channel.values()]:
                for text in source.values():
                    names |= meta.find_undeclared_variables(_env.parse(text))
        return names

    def channels_overridden(self) -> set[str]:
        return {c for strings in self._all_strings() for c in strings.per_channel}

    def targets(
        self, channels: tuple[str, ...], default: str = _locales.DEFAULT
    ) -> list[tuple[str, str, str, str]]:
        """(locale, channel, field, source) for every field this version renders, in every locale
        it has, on `channels` (the type's) and on the channels it has overrides for."""
        return [
            (tag, channel, name, source)
            for tag in [default, *sorted(self.locales)]
            for channel in sorted(set(channels) | self.channels_overridden())
            for name, source in self.sources(channel, tag, default).items()
        ]


@dataclass(frozen=True)
class NotificationType:
    key: str
    category: str
    lane: str
    channels: tuple[str, ...]
    templates: dict[int, Template]
    required: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    one_platform: bool = False
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)  # for every version without its own
    default_locale: str = _locales.DEFAULT  # the locale of the versions' own fields
    escalation: Escalation | None = None  # steps after this one when nobody acknowledges it
    text: TypeText = field(default_factory=TypeText)  # label and description in the default locale
    texts: dict[str, TypeText] = field(default_factory=dict)  # canonical tag -> its text
    # `options` with every default filled, built with the type (catalog/options.py)
    gate_options: GateOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gate_options", GateOptions.of(self.options))

    def label(self, locale: str | None = None) -> str:
        """The type's name for people in `locale` (its fallback chain), else its key as words."""
        found = self._text(locale, "label")
        return found or readable(self.key)

    def description(self, locale: str | None = None) -> str | None:
        """What the type is for, in `locale` through its fallback chain; None if not given."""
        return self._text(locale, "description")

    def _text(self, locale: str | None, name: str) -> str | None:
        for tag in _locales.chain(locale, self.default_locale):
            text = self.text if tag == self.default_locale else self.texts.get(tag)
            if text is not None and getattr(text, name):
                return str(getattr(text, name))
        return None

    @property
    def recipient_channels(self) -> tuple[str, ...]:
        """The type's channels a recipient may choose (RECIPIENT_CHANNELS), in catalog order."""
        return tuple(c for c in self.channels if c in RECIPIENT_CHANNELS)

    @property
    def version(self) -> int:
        """The version new requests pin."""
        return max(self.templates)

    @property
    def window_exempt(self) -> bool:
        return self.gate_options.window_exempt

    @property
    def critical(self) -> bool:
        return self.gate_options.critical

    @property
    def guarantee(self) -> str:
        """at_most_once | at_least_once: `options.delivery`, else the category's default."""
        return self.gate_options.delivery or GUARANTEE[self.category]

    @property
    def default_on(self) -> bool | None:
        """The type's own default, or None to fall back to the category's."""
        return self.gate_options.default_on

    def collapse_key(self, variables: Mapping[str, Any]) -> str | None:
        spec = self.gate_options.collapse
        if spec is None:
            return None
        return _render(
            _compiled(self.key, 0, "", "collapse", spec.key), {**self.defaults, **variables}
        )

    @cached_property
    def digest(self) -> DigestSpec | None:
        """The digest this type's requests are buffered into (options.digest), or None."""
        raw = self.options.get("digest")
        return None if raw is None else parse_digest(raw)

    def digest_key(self, variables: Mapping[str, Any]) -> str:
        """Which of the recipient's digests of the target type a request joins (options.digest.key)."""
        spec = self.digest
        if spec is None or not spec.key:
            return ""
        source = spec.key
        return _render(_compiled(self.key, 0, "", "digest", source), {**self.defaults, **variables})

    @property
    def collapse_update_seconds(self) -> float:
        """Seconds between two in-place updates of a collapse leader's message."""
        spec = self.gate_options.collapse
        return spec.update_seconds if spec is not None else DEFAULT_UPDATE_SECONDS

    def missing(self, variables: dict[str, Any]) -> list[str]:
        return [name for name in self.required if name not in variables]

    def render(
        self,
        version: int,
        channel: str,
        variables: dict[str, Any],
        locale: str | None = None,
    ) -> dict[str, str]:
        """Render every field of the pinned version for `channel` in the sandbox, in the
        recipient's `locale` through its fallback chain (None: the catalog's default locale)."""
        template = self.templates[version]
        key = (id(template), channel, locale, self.default_locale)
        plan = _plans.get(key)
        if plan is None or plan[0] is not template:  # (an id reused after a catalog reload)
            fields = template.sources(channel, locale, self.default_locale).items()
            plan = _plans[key] = (
                template,
                tuple((n, _compiled(self.key, version, channel, n, src)) for n, src in fields),
            )
        context = {**self.defaults, **variables}
        return {name: _render(compiled, context) for name, compiled in plan[1]}

    def locale_for(self, version: int, locale: str | None) -> str:
        """The locale version `version` renders in for a recipient whose locale is `locale`."""
        return self.templates[version].locale_for(locale, self.default_locale)

    def sample_variables(self, version: int) -> dict[str, Any]:
        """What the load-time check renders version `version` with: the declared samples (of the
        version, else of the type) over a Sample for every required variable, over the defaults."""
        template = self.templates[version]
        return {
            **self.defaults,
            **{n: Sample(n) for n in self.required},
            **self.samples,
            **template.samples,
        }


_compiled_cache: dict[tuple[str, int, str, str, str], Compiled] = {}
# (template, channel, locale, default) -> the template and its compiled fields in that locale: the
# fallback chain is worked out once per recipient locale, not once per delivery
_plans: dict[
    tuple[int, str, str | None, str], tuple[Template, tuple[tuple[str, Compiled], ...]]
] = {}


def _compiled(type_key: str, version: int, channel: str, name: str, source: str) -> Compiled:
    key = (type_key, version, channel, name, source)
    if key not in _compiled_cache:
        _compiled_cache[key] = compile_template(source)
    return _compiled_cache[key]


def _names(value: Any, what: str, fail: Fail) -> tuple[str, ...]:
    """A list of non-empty strings (a lone string is an error, not a list of its characters)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail(f"{what} must be a list of names, not {value!r}")
    return tuple(value)


def _fields(value: Any, what: str, fail: Fail) -> dict[str, str]:
    if not isinstance(value, dict):
        raise fail(f"{what} must be a mapping of field name to text, not {value!r}")
    for name, text in value.items():
        if not isinstance(text, str | int | float) or isinstance(text, bool):
            raise fail(f"{what}.{name} must be text, not {text!r}")
    return {str(k): str(v) for k, v in value.items()}


def _templates(raw_list: Any, fail: Fail, default_locale: str) -> dict[int, Template]:
    if not isinstance(raw_list, list) or not raw_list:
        raise fail("needs a list of templates, each with a version")
    templates: dict[int, Template] = {}
    for raw in raw_list:
        if not isinstance(raw, dict):
            raise fail(f"a template must be a mapping, not {raw!r}")
        raw = dict(raw)
        version = raw.pop("version", None)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise fail("every template needs a positive integer version")
        if version in templates:
            raise fail(f"template version {version} is defined twice")
        what = f"template v{version}"
        buttons = _buttons(raw.pop("buttons", None), what, fail)
        samples = _samples(raw.pop("samples", None), what, fail)
        variants = _locale_variants(raw.pop("locales", None), what, fail, default_locale)
        strings = _strings(raw, what, fail)
        templates[version] = Template(
            version, strings.fields, strings.per_channel, buttons, samples, variants
        )
    return templates


def _strings(raw: dict[str, Any], what: str, fail: Fail) -> Strings:
    """Fields and a `channels:` mapping of per-channel overrides (one locale's text)."""
    raw = dict(raw)
    per_channel = raw.pop("channels", None) or {}
    if not isinstance(per_channel, dict):
        raise fail(f"{what}: channels must map a channel to its fields")
    for channel in per_channel:
        _channel_name(channel, f"{what} channels", fail)
    return Strings(
        _fields(raw, what, fail),
        {str(c): _fields(f, f"{what} channel {c}", fail) for c, f in per_channel.items()},
    )


def _locale_variants(raw: Any, what: str, fail: Fail, default_locale: str) -> dict[str, Strings]:
    """`locales:` of a version: tag -> fields (and channels), keyed by the canonical tag."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(f"{what}: locales must map a locale tag (such as 'de-AT') to its fields")
    variants: dict[str, Strings] = {}
    for tag, spec in raw.items():
        canonical = _locales.normalise(tag)
        if canonical is None:
            raise fail(f"{what} locales: {tag!r} is not a language tag such as 'de' or 'de-AT'")
        if canonical == default_locale:
            raise fail(
                f"{what} locales: {tag!r} is the catalog's default locale, whose text is the "
                "version's own fields"
            )
        if canonical in variants:
            raise fail(f"{what} locales: {tag!r} is given twice (as {canonical!r})")
        if not isinstance(spec, dict):
            raise fail(f"{what} locale {tag}: must be a mapping of field name to text")
        variants[canonical] = _strings(spec, f"{what} locale {canonical}", fail)
    return variants


def _channel_name(name: Any, what: str, fail: Fail) -> str:
    if name not in CHANNELS:
        close = difflib.get_close_matches(str(name), sorted(CHANNELS), n=1)
        hint = (
            f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(CHANNELS))}"
        )
        raise fail(f"{what}: unknown channel {name!r}{hint}")
    known: str = name
    return known


def _samples(raw: Any, what: str, fail: Fail) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise fail(f"{what}: samples must map variable names to sample values")
    return dict(raw)


def _buttons(raw: Any, what: str, fail: Fail) -> tuple[Button, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise fail(f"{what}: buttons must be a list")
    buttons: list[Button] = []
    for spec in raw:
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("key"), str)
            or not isinstance(spec.get("label"), str)
        ):
            raise fail(f"{what}: every button needs a text key and label")
        key = spec["key"]
        if not key or len(key) > 32 or not all(c.isalnum() or c in "_-" for c in key):
            raise fail(f"{what}: button key {key!r} must be 1-32 letters, digits, _ or -")
        if any(b.key == key for b in buttons):
            raise fail(f"{what}: button key {key!r} is used twice")
        action = spec.get("action", "answer")
        if action not in BUTTON_ACTIONS:
            raise fail(f"{what}: button action must be one of {', '.join(BUTTON_ACTIONS)}")
        try:
            hours = float(spec.get("hours", 24))
        except (TypeError, ValueError) as exc:
            raise fail(f"{what}: button hours must be a number") from exc
        buttons.append(Button(key, spec["label"], action, hours, spec.get("style")))
    return tuple(buttons)


def _build_type(key: str, spec: Any, default_locale: str = _locales.DEFAULT) -> NotificationType:
    def fail(message: str) -> CatalogError:
        return CatalogError(f"type {key!r}: {message}")

    if not isinstance(spec, dict):
        raise fail(f"must be a mapping, not {spec!r}")
    category = spec.get("category")
    if category not in CATEGORIES:
        raise fail(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")
    lane = spec.get("lane", DEFAULT_LANE[category])
    if lane not in LANES:
        raise fail(f"lane must be one of {', '.join(LANES)}, not {lane!r}")
    channels = _names(spec.get("channels"), "channels", fail)
    if not channels:
        raise fail("needs at least one channel")
    for channel in channels:
        _channel_name(channel, "channels", fail)
    templates = _templates(spec.get("templates"), fail, default_locale)
    required = _names(spec.get("required"), "required", fail)
    defaults = spec.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise fail("defaults must be a mapping")
    if isinstance(spec.get("options"), dict) and spec["options"].get("collapse") is not None:
        defaults = {**COLLAPSE_VARIABLES, **defaults}
    for template in templates.values():
        used = _variables_used(key, template, channels, default_locale)
        undeclared = used - set(required) - set(defaults)
        if undeclared:
            raise fail(
                f"template v{template.version} uses {', '.join(sorted(undeclared))}, "
                "which are neither required nor given defaults"
            )
    for name in ("config", "options"):
        if not isinstance(spec.get(name) or {}, dict):
            raise fail(f"{name} must be a mapping")
    options = dict(spec.get("options") or {})
    unknown = set(options) - TYPE_OPTIONS
    if unknown:
        raise fail(f"unknown options {sorted(unknown)}; known: {sorted(TYPE_OPTIONS)}")
    if options.get("on_window", "skip") not in ("skip", "defer"):
        raise fail("options.on_window must be 'skip' or 'defer'")
    if options.get("delivery", "at_most_once") not in GUARANTEES:
        raise fail(f"options.delivery must be one of {', '.join(GUARANTEES)}")
    if options.get("default", "on") not in ("on", "off", True, False):
        raise fail("options.default must be 'on' or 'off'")
    collapse = options.get("collapse")
    if collapse is not None:
        if not isinstance(collapse, dict) or "key" not in collapse:
            raise fail("options.collapse needs a key template (and window_seconds)")
        try:
            used = meta.find_undeclared_variables(_env.parse(str(collapse["key"])))
        except TemplateSyntaxError as exc:
            raise fail(f"options.collapse.key: {_render_problem(exc)}") from exc
        if used - set(required) - set(defaults):
            raise fail("options.collapse.key may only use required or defaulted variables")
        for name in ("window_seconds", "update_seconds"):
            seconds = collapse.get(name, 1)
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise fail(f"options.collapse.{name} must be a positive number of seconds")
    _check_digest(options, required, defaults, fail)
    text, texts = _type_texts(spec, default_locale, fail)
    ntype = NotificationType(
        key=key,
        category=category,
        lane=lane,
        channels=channels,
        templates=templates,
        required=required,
        defaults=dict(defaults),
        one_platform=bool(spec.get("one_platform", False)),
        config=dict(spec.get("config") or {}),
        options=options,
        samples=_samples(spec.get("samples"), "type", fail),
        default_locale=default_locale,
        escalation=parse_escalation(
            key, spec.get("escalation"), set(required) | set(defaults), fail
        ),
        text=text,
        texts=texts,
    )
    check_renders(ntype)
    return ntype


def _type_text(raw: dict[str, Any], what: str, fail: Fail) -> TypeText:
    """`label` and `description` of a type or of one of its locales: short plain text."""
    found: dict[str, str | None] = {}
    for name, longest in (("label", LABEL_CHARS), ("description", DESCRIPTION_CHARS)):
        value = raw.get(name)
        if value is not None and (
            not isinstance(value, str) or not value.strip() or len(value) > longest
        ):
            raise fail(f"{what}{name} must be text of 1-{longest} characters, not {value!r}")
        found[name] = value.strip() if isinstance(value, str) else None
    return TypeText(found["label"], found["description"])


def _type_texts(
    spec: dict[str, Any], default: str, fail: Fail
) -> tuple[TypeText, dict[str, TypeText]]:
    """The type's own label/description and its `locales:` (tag -> label and description)."""
    raw = spec.get("locales") or {}
    if not isinstance(raw, dict):
        raise fail("locales must map a language tag to a label and description")
    texts: dict[str, TypeText] = {}
    for tag, strings in raw.items():
        canonical = _locales.normalise(tag)
        if canonical is None or canonical == default or canonical in texts:
            raise fail(
                f"locales: {tag!r} must be a language tag, given once, other than the "
                f"default locale {default!r}"
            )
        if not isinstance(strings, dict) or not set(strings) <= {"label", "description"}:
            raise fail(f"locales {tag}: only label and description, not {strings!r}")
        texts[canonical] = _type_text(strings, f"locales {tag} ", fail)
    return _type_text(spec, "", fail), texts


def _check_digest(
    options: dict[str, Any], required: tuple[str, ...], defaults: dict[str, Any], fail: Fail
) -> None:
    """options.digest parses, and its key template uses only required or defaulted variables."""
    if "digest" not in options:
        return
    try:
        spec = parse_digest(options["digest"])
        used = meta.find_undeclared_variables(_env.parse(spec.key))
        fallback_uses = meta.find_undeclared_variables(_env.parse(spec.fallback))
    except TemplateSyntaxError as exc:
        raise fail(f"options.digest: {_render_problem(exc)}") from exc
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if used - set(required) - set(defaults):
        raise fail("options.digest.key may only use required or defaulted variables")
    if fallback_uses - set(DIGEST_VARIABLES):
        raise fail(
            f"options.digest.fallback may use only {', '.join(DIGEST_VARIABLES)}, "
            f"not {', '.join(sorted(fallback_uses - set(DIGEST_VARIABLES)))}"
        )


def _check_digest_targets(types: dict[str, NotificationType]) -> None:
    """Each options.digest.type names a category-digest type that is not itself digested, whose
    templates use only the digest's variables (a digest request carries nothing else)."""
    for ntype in types.values():
        spec = ntype.digest
        if spec is None:
            continue
        target = types.get(spec.type)
        where = f"type {ntype.key!r}: options.digest.type {spec.type!r}"
        if target is None:
            raise CatalogError(f"{where} is not a type")
        if target.category != "digest" or target.digest is not None:
            raise CatalogError(f"{where} must be a category 'digest' type without a digest itself")
        extra = set().union(*(t.variables() for t in target.templates.values()))
        extra -= set(DIGEST_VARIABLES) | set(target.defaults)
        if extra:
            raise CatalogError(
                f"{where} uses {', '.join(sorted(extra))}; a digest carries only "
                f"{', '.join(DIGEST_VARIABLES)}"
            )


def _where(type_key: str, version: int, channel: str, name: str, locale: str | None) -> str:
    """Where a field is; `locale` only for a locale variant (None: the version's own fields)."""
    at = f" locale {locale!r}" if locale else ""
    return f"type {type_key!r} v{version}{at} channel {channel!r} field {name!r}"


def _variables_used(
    type_key: str, template: Template, channels: tuple[str, ...], default_locale: str
) -> set[str]:
    """The variables the version's fields use (in every locale); a field that does not compile
    is a CatalogError."""
    used: set[str] = set()
    for locale, channel, name, source in template.targets(channels, default_locale):
        try:
            used |= meta.find_undeclared_variables(_env.parse(source))
        except TemplateSyntaxError as exc:  # also TemplateAssertionError: an unknown filter or test
            variant = None if locale == default_locale else locale
            where = _where(type_key, template.version, channel, name, variant)
            raise CatalogError(f"{where}: {_render_problem(exc)}") from exc
    return used


def _check_locale_keys(ntype: NotificationType) -> None:
    """A Python-built version's locale keys: canonical tags, none the default locale."""
    for version, template in sorted(ntype.templates.items()):
        for tag in template.locales:
            if _locales.normalise(tag) != tag or tag == ntype.default_locale:
                raise CatalogError(
                    f"type {ntype.key!r} v{version} locales: {tag!r} must be a canonical tag "
                    f"({_locales.normalise(tag)!r}) other than the default locale "
                    f"{ntype.default_locale!r}"
                )


def check_renders(ntype: NotificationType) -> None:
    """Render every field of every version for every channel it targets, with the sample variables,
    in the delivery sandbox: a template that cannot render fails here, not in every delivery."""
    for version, template in sorted(ntype.templates.items()):
        context = ntype.sample_variables(version)
        for locale, channel, name, source in template.targets(ntype.channels, ntype.default_locale):
            try:
                _render(_compiled(ntype.key, version, channel, name, source), context)
            except Exception as exc:  # whatever a template can raise; the message says which
                variant = None if locale == ntype.default_locale else locale
                where = _where(ntype.key, version, channel, name, variant)
                raise CatalogError(f"{where}: {_render_problem(exc)}") from exc
        if ntype.gate_options.collapse is not None:
            try:
                ntype.collapse_key(context)
            except Exception as exc:
                raise CatalogError(
                    f"type {ntype.key!r} v{version} options.collapse.key: {_render_problem(exc)}"
                ) from exc


def _render_problem(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    if isinstance(exc, TemplateAssertionError):
        named = re.match(r"No (filter|test) named '([^']*)'", text)
        return f"unknown {named[1]} {named[2]!r}" if named else text
    if isinstance(exc, TemplateSyntaxError):
        return f"{text} (line {exc.lineno})"
    if isinstance(exc, SecurityError):
        return f"refused by the sandbox: {text}"
    if isinstance(exc, UndefinedError):
        return f"{text} (declare samples: for this type or version if a sample is missing)"
    return f"cannot render: {type(exc).__name__}: {text}"


@dataclass(frozen=True)
class Policy:
    """Catalog-wide gate settings."""

    activation_window_hours: float = 48.0
    per_user_per_day: int | None = None  # fatigue cap on non-critical notifications
    per_org_per_hour: int | None = None
    summary_type: str | None = None  # the type overflow is folded into
    quiet_hours_bypass: tuple[str, ...] = ("security",)  # categories; `critical` types bypass too
    marketing_sms_hours: tuple[str, str] = ("08:00", "21:00")


def _policy(raw: Any, types: dict[str, NotificationType]) -> Policy:
    if raw is None:
        return Policy()
    if not isinstance(raw, dict):
        raise CatalogError(f"policy must be a mapping, not {raw!r}")
    fatigue = raw.get("fatigue") or {}
    if not isinstance(fatigue, dict):
        raise CatalogError("policy.fatigue must be a mapping")
    try:
        policy = Policy(
            activation_window_hours=float(raw.get("activation_window_hours", 48)),
            per_user_per_day=_opt_int(fatigue.get("per_user_per_day")),
            per_org_per_hour=_opt_int(fatigue.get("per_org_per_hour")),
            summary_type=fatigue.get("summary_type"),
            quiet_hours_bypass=tuple(raw.get("quiet_hours_bypass", ("security",))),
            marketing_sms_hours=tuple(raw.get("marketing_sms_hours", ("08:00", "21:00"))),
        )
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"policy: {exc}") from exc
    if policy.summary_type is not None and policy.summary_type not in types:
        raise CatalogError(f"policy.fatigue.summary_type {policy.summary_type!r} is not a type")
    unknown = set(policy.quiet_hours_bypass) - set(CATEGORIES)
    if unknown:
        raise CatalogError(f"policy.quiet_hours_bypass names unknown categories: {sorted(unknown)}")
    return policy


def _default_locale(raw: Any) -> str:
    canonical = _locales.normalise(raw)
    if canonical is None:
        raise CatalogError(f"locale must be a language tag such as 'en' or 'de-AT', not {raw!r}")
    return canonical


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"caps must be positive integers, not {value!r}")
    return value


@dataclass(frozen=True)
class Catalog:
    types: dict[str, NotificationType]
    source: str = "<python>"
    policy: Policy = field(default_factory=Policy)
    locale: str = _locales.DEFAULT  # the default locale: of the versions' own fields, and last
    digest: str = ""  # sha256 of the file's bytes (hex); "" for a catalog built in Python

    def get(self, type_key: str) -> NotificationType | None:
        return self.types.get(type_key)

    @property
    def name(self) -> str:
        """Which catalog this is, for logs and errors: `/path/catalog.yaml (sha256 1a2b3c4d5e6f)`."""
        return f"{self.source} (sha256 {self.digest[:12]})" if self.digest else self.source

    def check(self) -> Catalog:
        """The load-time checks again, for a Catalog built in Python rather than by from_dict:
        channel names and a render of every field. Raises CatalogError naming the source."""
        try:
            for ntype in self.types.values():
                for channel in [
                    *ntype.channels,
                    *(c for t in ntype.templates.values() for c in t.channels_overridden()),
                ]:
                    _channel_name(channel, f"type {ntype.key!r} channels", CatalogError)
                _check_locale_keys(ntype)
                check_renders(ntype)
            check_escalations(self.types, CatalogError)
            _check_digest_targets(self.types)
        except CatalogError as exc:
            raise CatalogError(f"{self.source}: {exc}") from (exc.__cause__ or exc)
        return self

    @cached_property
    def channels(self) -> frozenset[str]:
        return frozenset(c for t in self.types.values() for c in t.channels)

    @cached_property
    def escalation_step_types(self) -> frozenset[str]:
        """The types some escalation chain sends as a later step (the route asks per request)."""
        return frozenset(
            s.type_key for t in self.types.values() if t.escalation for s in t.escalation.steps
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<python>", digest: str = "") -> Catalog:
        """Build and check a catalog; every CatalogError names `source` (the file) first."""
        try:
            types = data.get("types") if isinstance(data, dict) else None
            if not isinstance(types, dict) or not types:
                raise CatalogError("needs a non-empty 'types' mapping")
            default = _default_locale(data.get("locale", _locales.DEFAULT))
            built = {str(key): _build_type(str(key), spec, default) for key, spec in types.items()}
            check_escalations(built, CatalogError)
            _check_digest_targets(built)
            return cls(built, source, _policy(data.get("policy"), built), default, digest)
        except CatalogError as exc:  # the same error with the file named; keep the original cause
            raise CatalogError(f"{source}: {exc}") from (exc.__cause__ or exc)

    @classmethod
    def from_yaml(cls, path: Path | str) -> Catalog:
        path = Path(path)
        try:
            return cls.from_bytes(path.read_bytes(), str(path))
        except OSError as exc:
            raise CatalogError(f"cannot read catalog {path}: {exc}") from exc

    @classmethod
    def from_bytes(cls, raw: bytes, source: str) -> Catalog:
        """A catalog from a YAML file's bytes; its digest is their sha256."""
        try:
            data = yaml.load(raw.decode(), Loader=CatalogLoader)  # noqa: S506 (a SafeLoader)
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            raise CatalogError(f"cannot read catalog {source}: {exc}") from exc
        return cls.from_dict(data, source, hashlib.sha256(raw).hexdigest())


class CatalogLoader(yaml.SafeLoader):
    """yaml.SafeLoader that keeps mapping keys as the text written (a type named `no`, `on` or `1`
    stays "no", "on", "1"), reads only true/false as booleans (YAML 1.2: `yes`, `no`, `on` and
    `off` are text) and refuses a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        # The keys are all str; the annotation is the one SafeConstructor declares.
        self.flatten_mapping(node)
        mapping: dict[Hashable, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be text", key_node.start_mark
                )
            if key_node.value in mapping:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key_node.value!r} is given twice", key_node.start_mark
                )
            mapping[key_node.value] = self.construct_object(value_node, deep=deep)
        return mapping


_BOOL = "tag:yaml.org,2002:bool"
CatalogLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
CatalogLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


EXAMPLES = Path(__file__).parent / "examples"
