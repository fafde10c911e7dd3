"""The reference the code can write itself, generated at build time so it cannot drift (mkdocs hooks).

- `<!-- generated: settings -->` (configuration.md) becomes one row per field of
  `clarion.settings.Settings`: its CLARION_ variable, type, default, range rule, whether it is a
  secret, the comment written beside it in clarion/settings.py, and the pages that mention it.
- `<!-- generated: cli -->` (reference/cli.md) becomes every command of `clarion.ops.cli.parser()`.
- `<!-- generated: http -->` (reference/http.md) becomes every operation of the web app's OpenAPI
  document, which is also published whole as reference/openapi.json.

Each of these is a warning, so `mkdocs build --strict` (`make docs`) fails on it: a CLARION_ name in
README.md or a page that is no setting; a setting with no comment in clarion/settings.py; a relative
link out of docs/ to a file the repository does not have. Such links (`../bench/RESULTS.md`) work on
GitHub as they are and are rewritten to the repository's copy for the site.
"""

from __future__ import annotations

import argparse
import ast
import html
import io
import json
import logging
import re
import tokenize
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.reference")  # under "mkdocs": --strict counts its warnings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SETTINGS_PY = ROOT / "clarion" / "settings.py"
MARKER = re.compile(r"<!-- generated: (\w+) -->")
VARIABLE = re.compile(r"(?<![A-Za-z0-9_])CLARION_[A-Z0-9_]*[A-Z0-9]")
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
OPENAPI = "reference/openapi.json"


# --- hooks ----------------------------------------------------------------------------------------


def on_pre_build(config: Any) -> None:
    _check_variables(ROOT / "README.md", (ROOT / "README.md").read_text())


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, OPENAPI, content=json.dumps(_openapi(), indent=2)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    source = DOCS / page.file.src_uri
    _check_variables(source, markdown)
    markdown = _outside_links(markdown, source, config["repo_url"])
    makers = {
        "settings": lambda: settings_table(source),
        "cli": cli_reference,
        "http": http_reference,
    }

    def generated(match: re.Match[str]) -> str:
        if match[1] not in makers:
            log.warning("%s: no generator for %s", page.file.src_uri, match[0])
            return match[0]
        return makers[match[1]]()

    return MARKER.sub(generated, markdown)


# --- checks -----------------------------------------------------------------------------------------


def _check_variables(path: Path, text: str) -> None:
    from clarion.settings import Settings

    known = {f"CLARION_{f.name.upper()}" for f in fields(Settings)}
    for name in sorted(set(VARIABLE.findall(text)) - known):
        log.warning(
            "%s names %s, which is not a setting in clarion/settings.py", _shown(path), name
        )


def _outside_links(markdown: str, source: Path, repo_url: str) -> str:
    """Relative links that leave docs/ point at the repository's file on GitHub (checked to exist)."""

    def rewrite(match: re.Match[str]) -> str:
        target, anchor = match[1], match[2] or ""
        if "://" in target or target.startswith(("/", "mailto:")):
            return match[0]
        resolved = (source.parent / target).resolve()
        if resolved.is_relative_to(DOCS):
            return match[0]
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            log.warning(
                "%s links to %s, which the repository does not have", _shown(source), target
            )
            return match[0]
        kind = "tree" if resolved.is_dir() else "blob"
        return f"]({repo_url.rstrip('/')}/{kind}/main/{resolved.relative_to(ROOT)}{anchor})"

    return LINK.sub(rewrite, markdown)


# --- settings ---------------------------------------------------------------------------------------


def settings_table(page: Path) -> str:
    from clarion.settings import SECRETS, Settings

    comments, factories = _field_comments(), _default_sources()
    mentions = _mentions()
    rows = ["| variable | value | what it does |", "| --- | --- | --- |"]
    for f in fields(Settings):
        variable = f"CLARION_{f.name.upper()}"
        text = comments.get(f.name, "")
        if not text:
            log.warning("clarion/settings.py: %s has no comment to document it", f.name)
        value = ", ".join(
            part
            for part in (
                _kind(f),
                "secret" if f.name in SECRETS else "",
                _prose(f.metadata.get("rule", "")),
            )
            if part
        )
        see = ", ".join(
            f"[{title}]({_relative(path, page)})"
            for path, title in mentions.get(variable, [])
            if path != page
        )
        about = _prose(text) + (f"<br>See: {see}" if see else "")
        value += f"<br>default: {_default(f, factories)}"
        rows.append("| " + " | ".join(_cell(c) for c in (f"`{variable}`", value, about)) + " |")
    return "\n".join(rows)


def _kind(f: Field[Any]) -> str:
    base = str(f.type).split("|")[0].strip()
    return {"float": "number", "int": "integer", "str": "text", "Path": "path"}.get(base, base)


def _default(f: Field[Any], factories: dict[str, str]) -> str:
    if f.default_factory is not MISSING:
        return f"`{factories[f.name]}`"
    if f.default is None:
        return "unset"
    if isinstance(f.default, float):
        return f"{f.default:g}"
    if isinstance(f.default, str):
        return f'`"{f.default}"`'
    return str(f.default)


def _settings_class() -> tuple[str, ast.ClassDef]:
    source = SETTINGS_PY.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "Settings":
            return source, node
    raise LookupError("clarion/settings.py has no class Settings")


def _default_sources() -> dict[str, str]:
    """The source of each default_factory's lambda body (not its value on the building machine)."""
    source, cls = _settings_class()
    found = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == "default_factory" and isinstance(kw.value, ast.Lambda):
                    body = ast.get_source_segment(source, kw.value.body)
                    found[ast.unparse(stmt.target)] = body or ast.unparse(kw.value.body)
    return found


def _field_comments() -> dict[str, str]:
    """Each field's comments in clarion/settings.py: those on its own lines, the comment lines right
    above it (not a `# --- section ---` rule), and a comment right below it that starts with "("
    (a continuation of its own)."""
    source, cls = _settings_class()
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    found = {}
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign):
            continue
        start, end = stmt.lineno, stmt.end_lineno or stmt.lineno
        above = []
        line = start - 1
        while line in comments and line not in code_lines and not comments[line].startswith("---"):
            above.insert(0, comments[line])
            line -= 1
        if above and above[0].startswith("(") and line in code_lines:
            above = []  # the previous field's continuation
        own = [comments[n] for n in range(start, end + 1) if n in comments]
        below = []
        line = end + 1
        if comments.get(line, "").startswith("(") and line not in code_lines:
            while line in comments and line not in code_lines:
                below.append(comments[line])
                line += 1
        found[ast.unparse(stmt.target)] = " ".join(above + own + below)
    return found


def _mentions() -> dict[str, list[tuple[Path, str]]]:
    """CLARION_ variable -> [(page, its title)] for every page that names it."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text()
        title = next((line[2:] for line in text.splitlines() if line.startswith("# ")), path.stem)
        for name in sorted(set(VARIABLE.findall(text))):
            found.setdefault(name, []).append((path, title))
    return found


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _relative(target: Path, page: Path) -> str:
    return Path(
        *[".."] * len(page.parent.relative_to(DOCS).parts), target.relative_to(DOCS)
    ).as_posix()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _prose(text: str) -> str:
    """Text from the code as Markdown shows it: `<`, `>`, `&` and `*` literal outside code spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside backticks
        parts[i] = html.escape(parts[i], quote=False).replace("*", "\\*")
    return "`".join(parts)


# --- CLI --------------------------------------------------------------------------------------------


def cli_reference() -> str:
    from clarion.ops.cli import parser

    out: list[str] = []
    _command(parser(), ["clarion"], "", out)
    return "\n".join(out)


def _command(p: argparse.ArgumentParser, words: list[str], about: str, out: list[str]) -> None:
    name = " ".join(words)
    out += [f"{'#' * min(len(words) + 1, 4)} `{name}`", ""]
    if about or p.description:
        out += [about or p.description or "", ""]
    out += ["```text", p.format_usage().strip().removeprefix("usage: "), "```", ""]
    options = [a for a in p._actions if not isinstance(a, argparse._SubParsersAction)]
    options = [a for a in options if not isinstance(a, argparse._HelpAction)]
    if options:
        out += ["| argument | default | what |", "| --- | --- | --- |"]
        for action in options:
            out.append(f"| {_argument(action)} | {_argument_default(action)} | {_help(action)} |")
        out.append("")
    for group in p._actions:
        if isinstance(group, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in group._choices_actions}
            for sub_name, sub in group.choices.items():
                _command(sub, [*words, sub_name], helps.get(sub_name, ""), out)


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    shown = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return shown
    return f"{shown} `{action.metavar or action.dest.upper()}`"


def _argument_default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{action.default}`" if action.default != "" else '`""`'


def _help(action: argparse.Action) -> str:
    parts = [action.help or ""] if action.help != argparse.SUPPRESS else []
    if action.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        parts.append("repeatable")
    return _cell(_prose("; ".join(p for p in parts if p)))


# --- HTTP -------------------------------------------------------------------------------------------

_OPENAPI_CACHE: dict[str, Any] = {}


def _openapi() -> dict[str, Any]:
    """The document `clarion web` serves at /openapi.json, built without a server or a database."""
    if not _OPENAPI_CACHE:
        quiet = logging.getLogger("clarion")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # the demo-catalog warning is for running processes
        try:
            from clarion.web.app import create_app

            _OPENAPI_CACHE.update(create_app().openapi())
        finally:
            quiet.setLevel(level)
    return _OPENAPI_CACHE


def http_reference() -> str:
    doc = _openapi()
    schemes = doc.get("components", {}).get("securitySchemes", {})
    out = [
        "| method | path | what | credentials | answers |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            creds = sorted({name for choice in op.get("security", []) for name in choice})
            answers = ", ".join(sorted(op.get("responses", {})))
            what = _prose(op.get("summary", ""))
            cells = [method.upper(), f"`{path}`", what, ", ".join(creds), answers]
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out += ["", "Credentials:", ""]
    for name, scheme in schemes.items():
        out.append(f"- `{name}`: {_prose(scheme.get('description', scheme.get('type', '')))}")
    return "\n".join(out)
