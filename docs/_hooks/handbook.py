"""MkDocs hooks: the handbook's generated pages, built from the code at every build.

Nothing here names a module of GraphVeil. The source roots are the repository's top-level
folders holding a ``graphveil/`` folder (a file's path is its module path, DESIGN.md "Layout"),
and every generated page finds what it renders by walking them, so moving or renaming a module
needs no edit of the handbook:

* ``reference/cli.md``: ``--help`` of ``graphveil`` and of every command and subcommand, from the
  argparse parser the ``graphveil`` console script builds (``build_parser``, plugins' commands
  included);
* ``reference/configuration.md``: every section of the run config (the pydantic model
  ``RunConfig`` and its nested sections) from the ``Field`` descriptions, then every built-in
  component's options (its ``Params`` model) as the plugin host lists them;
* ``reference/node-config.md``: a federated site's node config (``SiteSettings``) and the
  federation's run config (``FederationSettings``);
* ``reference/hookspecs.md`` and ``reference/api/*.md``: mkdocstrings pages (``::: module``), one
  per room of the core and per plugin or connector package, one section per public module;
* ``changelog.md``, when the repository has a ``CHANGELOG.md``.

Two checks make ``--strict`` cover what mkdocs cannot see: a hand-written page that names a
module, an object or a repository file the code no longer has (`` `graphveil.x.Y` ``, an import
line of a code block, `` `bench/x.py` ``) is a warning; and after the build, every relative link
of the README (the front door) is checked against the repository and the built pages.

mkdocstrings reads the code statically (griffe), from a merged copy of the source roots: the one
import namespace ``graphveil`` spans three folders, which a static loader cannot join by itself.
Only the built-in plugins are loaded (third-party ones installed beside would otherwise appear
as if they shipped with GraphVeil).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import logging
import os
import re
import shutil
import tempfile
import types
import typing
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("mkdocs.plugins.graphveil_handbook")  # a warning fails --strict
PACKAGE = "graphveil"
API_DIR = "reference/api"
#: the nav title under which the generated API pages are listed (mkdocs.yml: Reference > API)
API_NAV_TITLE = "API"
HELP_WIDTH = "80"  # the width of a code block in the theme: no sideways scrolling

_state: dict[str, Any] = {}


# ------------------------------------------------------------------------------ source roots
def source_roots() -> list[Path]:
    """Top-level folders of the repository that hold a ``graphveil/`` folder, the core's first."""
    roots = [p.parent for p in sorted(REPO.glob(f"*/{PACKAGE}")) if p.is_dir()]
    return sorted(roots, key=lambda r: not (r / PACKAGE / "__init__.py").is_file())


def merged_tree(into: Path) -> dict[str, str]:
    """Copy the Python sources of every root into ``into/graphveil``; returns layer → root name.

    A *layer* is a first-level package that another root provides (``graphveil.plugins``,
    ``graphveil.connectors``); the core root provides everything else.
    """
    layers: dict[str, str] = {}
    core, *others = source_roots()
    target = into / PACKAGE
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "bundled", "*.tmpl")
    shutil.copytree(core / PACKAGE, target, ignore=ignore)
    for root in others:
        for child in sorted((root / PACKAGE).iterdir()):
            if child.is_dir() and (child / "__init__.py").is_file():
                shutil.copytree(child, target / child.name, ignore=ignore)
                layers[f"{PACKAGE}.{child.name}"] = root.name
    return layers


def _is_package(folder: Path) -> bool:
    return (folder / "__init__.py").is_file()


def public_modules(folder: Path, dotted: str) -> Iterator[str]:
    """``dotted`` (a package folder) and its public modules and subpackages, depth first.

    Private names (``_x``) and folders without ``__init__.py`` (templates, the Flower app's
    own package) are skipped.
    """
    yield dotted
    for child in sorted(folder.iterdir()):
        if child.name.startswith("_"):
            continue
        if child.is_dir() and _is_package(child):
            yield from public_modules(child, f"{dotted}.{child.name}")
        elif child.suffix == ".py":
            yield f"{dotted}.{child.stem}"


def rooms(tree: Path, layers: dict[str, str]) -> list[tuple[str, str, list[str]]]:
    """(group, package, modules) per API page: the core's top level and each of its subpackages,
    and each package of a layer (``graphveil.plugins.gdp``), the layer's own top level first."""
    pages: list[tuple[str, str, list[str]]] = []
    top = tree / PACKAGE
    top_modules = [PACKAGE] + [f"{PACKAGE}.{p.stem}" for p in sorted(top.glob("*.py"))
                               if not p.stem.startswith("_")]
    pages.append(("Core", PACKAGE, top_modules))
    for child in sorted(top.iterdir()):
        dotted = f"{PACKAGE}.{child.name}"
        if child.name.startswith("_") or not child.is_dir() or not _is_package(child):
            continue
        if dotted not in layers:
            pages.append(("Core", dotted, list(public_modules(child, dotted))))
    for layer, root in layers.items():
        folder = top / layer.rsplit(".", 1)[1]
        group = root.capitalize()
        own = [layer] + [f"{layer}.{p.stem}" for p in sorted(folder.glob("*.py")) if not p.stem.startswith("_")]
        pages.append((group, layer, own))
        for child in sorted(folder.iterdir()):
            if child.is_dir() and not child.name.startswith("_") and _is_package(child):
                dotted = f"{layer}.{child.name}"
                pages.append((group, dotted, list(public_modules(child, dotted))))
    return pages


def find_definition(tree: Path, pattern: str) -> str:
    """The dotted name of the one module whose source matches ``pattern`` (a regex, multiline)."""
    found = []
    for path in sorted((tree / PACKAGE).rglob("*.py")):
        if re.search(pattern, path.read_text(encoding="utf-8"), flags=re.M):
            found.append(".".join(path.relative_to(tree).with_suffix("").parts).removesuffix(".__init__"))
    if len(found) != 1:
        raise RuntimeError(f"handbook: expected one module matching {pattern!r}, found {found}")
    return found[0]


def find_object(tree: Path, kind: str, name: str) -> Any:
    """Import the class or function ``name`` from the module that defines it."""
    module = find_definition(tree, rf"^{kind} {name}\b")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------------------ mkdocs events
@event_priority(100)  # before mkdocstrings creates its handler from the options set here
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    # The reference documents what ships with GraphVeil: built-in plugins only.
    os.environ["GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.update(COLUMNS=HELP_WIDTH, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    on_shutdown()  # `mkdocs serve` configures again on every change: drop the previous copy
    tree = Path(tempfile.mkdtemp(prefix="graphveil-docs-src-"))
    layers = merged_tree(tree)
    _state.update(tree=tree, layers=layers, rooms=rooms(tree, layers))
    python = config.plugins["mkdocstrings"].config["handlers"]["python"]
    python["paths"] = [str(tree)]
    _fill_api_nav(config["nav"])
    if (REPO / "CHANGELOG.md").is_file():
        config["nav"].append({"Changelog": "changelog.md"})
    return config


def _fill_api_nav(nav: list[Any]) -> None:
    groups: dict[str, list[dict[str, str]]] = {}
    for group, package, _ in _state["rooms"]:
        groups.setdefault(group, []).append({package: f"{API_DIR}/{package}.md"})
    entry = [{group: pages} for group, pages in groups.items()]
    if not _replace_title(nav, API_NAV_TITLE, entry):
        raise RuntimeError(f"handbook: mkdocs.yml's nav has no {API_NAV_TITLE!r} entry to fill")


def _replace_title(nav: list[Any], title: str, value: Any) -> bool:
    for item in nav:
        if isinstance(item, dict):
            for key, sub in item.items():
                if key == title:
                    item[key] = value
                    return True
                if isinstance(sub, list) and _replace_title(sub, title, value):
                    return True
    return False


def on_files(files: Files, config: MkDocsConfig) -> Files:
    tree: Path = _state["tree"]
    pages = {
        "reference/cli.md": cli_page(tree),
        "reference/configuration.md": configuration_page(tree),
        "reference/node-config.md": node_config_page(tree),
        "reference/hookspecs.md": hookspecs_page(tree),
    }
    hookspecs = find_definition(tree, HOOKSPEC_PATTERN)
    for _, package, modules in _state["rooms"]:
        pages[f"{API_DIR}/{package}.md"] = api_page(package, modules, hookspecs)
    if (REPO / "CHANGELOG.md").is_file():
        pages["changelog.md"] = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    pages["img/rooms.svg"] = rooms_svg(tree, _state["layers"])
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


# ------------------------------------------------------------------------------ the rooms' picture
def room_of(module: str, layers: dict[str, str]) -> str | None:
    """The room a ``graphveil`` module belongs to: a layer (``graphveil.plugins``), a subpackage of
    the core (``graphveil.run``) or a top-level module of the core (``graphveil.sampling``)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def room_imports(tree: Path, layers: dict[str, str]) -> dict[str, set[str]]:
    """room → the rooms its modules import (ast, every import statement, lazy ones included)."""
    edges: dict[str, set[str]] = {}
    for path in sorted((tree / PACKAGE).rglob("*.py")):
        module = ".".join(path.relative_to(tree).with_suffix("").parts).removesuffix(".__init__")
        room = room_of(module, layers)
        if room is None:
            continue
        edges.setdefault(room, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
                names = [f"{PACKAGE}.{a.name}" for a in node.names]
            for name in names:
                other = room_of(name, layers)
                if other is not None and other != room:
                    edges[room].add(other)
    return edges


def rooms_svg(tree: Path, layers: dict[str, str]) -> str:
    """An SVG of the rooms, each above every room it imports, and their import arrows."""
    edges = room_imports(tree, layers)
    floor: dict[str, int] = {}

    def height(room: str, seen: tuple[str, ...] = ()) -> int:
        if room not in floor:
            if room in seen:
                raise RuntimeError(f"handbook: import cycle through {room}")
            floor[room] = 1 + max((height(o, (*seen, room)) for o in edges.get(room, ())), default=-1)
        return floor[room]

    for room in edges:
        height(room)
    rows: dict[int, list[str]] = {}
    for room in sorted(floor, key=lambda r: (floor[r], r)):
        rows.setdefault(floor[room], []).append(room)
    box_w, box_h, gap_x, gap_y, pad = 190, 34, 24, 70, 20
    width = pad * 2 + max(len(r) for r in rows.values()) * (box_w + gap_x)
    height_px = pad * 2 + len(rows) * (box_h + gap_y)
    where: dict[str, tuple[float, float]] = {}
    for level, names in rows.items():
        y = height_px - pad - box_h - level * (box_h + gap_y)
        row_w = len(names) * (box_w + gap_x) - gap_x
        for i, name in enumerate(names):
            where[name] = ((width - row_w) / 2 + i * (box_w + gap_x), y)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height_px}" '
           f'viewBox="0 0 {width} {height_px}" font-family="sans-serif" font-size="13">',
           '<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>']
    for room, targets in sorted(edges.items()):
        x1, y1 = where[room]
        for target in sorted(targets):
            x2, y2 = where[target]
            out.append(f'<line x1="{x1 + box_w / 2:.0f}" y1="{y1 + box_h:.0f}" x2="{x2 + box_w / 2:.0f}" '
                       f'y2="{y2:.0f}" stroke="#9ca3af" stroke-width="1" marker-end="url(#a)"/>')
    for room, (x, y) in where.items():
        fill = "#e0e7ff" if room in layers else "#f3f4f6"
        out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="6" fill="{fill}" '
                   f'stroke="#4b5563"/><text x="{x + box_w / 2:.0f}" y="{y + box_h / 2 + 4:.0f}" '
                   f'text-anchor="middle">{room}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------ stale names
_DOTTED = re.compile(rf"`({PACKAGE}(?:\.\w+)+)")
_IMPORT = re.compile(rf"^\s*from ({PACKAGE}(?:\.\w+)*) import \(?([\w, ]+)", re.M)
#: dotted names that are not code: MLflow tags the tracking plugin sets (how-to/mlflow.md)
NOT_CODE = frozenset({f"{PACKAGE}.site", f"{PACKAGE}.server_round", f"{PACKAGE}.role"})
_REPO_PATH = re.compile(r"`((?:framework|plugins|connectors|deploy|bench|examples|tests|docs)/[\w./-]*\w)`")


def stale_references(markdown: str, tree: Path) -> list[str]:
    """Module names and repository paths a hand-written page mentions that the code no longer has.

    A name in backticks (`` `graphveil.x.y.Name` ``) must start with a module of the source roots
    followed by at most one name that module's source defines or imports; an import line of a
    code block, the same; a repository path in backticks (`` `bench/gdp.py` ``) must exist.
    """
    problems = []
    names = [m.group(1) for m in _DOTTED.finditer(markdown)]
    for module, imported in _IMPORT.findall(markdown):
        names += [f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()]
    for name in sorted(set(names) - NOT_CODE):
        if (why := _unresolved(name, tree)) is not None:
            problems.append(f"`{name}` ({why})")
    for path in sorted(set(_REPO_PATH.findall(markdown))):
        if not (REPO / path.rstrip("/")).exists():
            problems.append(f"`{path}` (no such file or folder in the repository)")
    return problems


def _unresolved(name: str, tree: Path) -> str | None:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = tree.joinpath(*parts[:cut])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.is_file():
            rest = parts[cut:]
            if not rest:
                return None
            if rest[0] in module_names(source):
                return None
            return f"module {'.'.join(parts[:cut])} has no {rest[0]!r}"
    return "no such module in the source roots"


def module_names(source: Path) -> set[str]:
    """Names a module defines or imports at its top level (classes, functions, assignments,
    imports; a class's own names too, for ``Class.method``-style mentions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    """A hand-written page that names a module, an object or a file the code no longer has is a
    warning (so ``--strict`` fails): prose cannot silently drift when modules move."""
    if page.file.generated_by is None:
        for problem in stale_references(markdown, _state["tree"]):
            log.warning("Doc file '%s' mentions %s", page.file.src_uri, problem)
    return markdown


def on_post_build(config: MkDocsConfig) -> None:
    """The README is the handbook's front door: each of its relative links must name a file of
    the repository (not a page that exists only once generated) and, for a handbook page, an
    anchor the built page has. A broken one is a warning, so ``--strict`` fails on it."""
    site = Path(config["site_dir"])
    docs = Path(config["docs_dir"]).resolve()
    for target in readme_links(REPO / "README.md"):
        path, _, anchor = target.partition("#")
        file = (REPO / path).resolve() if path else REPO / "README.md"
        if not file.exists():
            log.warning("README.md links to %r, which is not a file of the repository", target)
            continue
        if anchor and file.suffix == ".md" and file.is_relative_to(docs):
            rel = file.relative_to(docs).with_suffix("")
            built = site / (rel.parent if rel.name == "index" else rel) / "index.html"
            html = built.read_text(encoding="utf-8") if built.is_file() else ""
            if f'id="{anchor}"' not in html:
                log.warning("README.md links to %r, but the built page has no anchor %r", target, anchor)


def readme_links(readme: Path) -> list[str]:
    """Relative link targets of a Markdown file, outside code blocks."""
    text = re.sub(r"^```.*?^```", "", readme.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def on_shutdown() -> None:
    if tree := _state.pop("tree", None):
        shutil.rmtree(tree, ignore_errors=True)


# ------------------------------------------------------------------------------ API pages
MODULE_OPTIONS = "heading_level: 2, show_root_heading: true, show_root_full_path: true, show_submodules: false"


def api_page(package: str, modules: list[str], hookspecs: str) -> str:
    lines = [f"# `{package}`", "",
             "Generated from the docstrings at build time: one section per public module "
             "(private `_` modules are left out).", ""]
    for module in modules:
        if module == hookspecs:  # rendered once, on its own page (one anchor per object)
            lines += [f"## `{module}`", "", "See [Hook specifications](../hookspecs.md).", ""]
            continue
        lines += [f"::: {module}", f"    options: {{{MODULE_OPTIONS}}}", ""]
    return "\n".join(lines)


HOOKSPEC_PATTERN = r"^hookspec = pluggy\.HookspecMarker\("


def hookspecs_page(tree: Path) -> str:
    module = find_definition(tree, HOOKSPEC_PATTERN)
    return "\n".join([
        "# Hook specifications", "",
        f"Every hook a plugin can implement, from `{module}` (generated from its docstrings). "
        "A plugin marks its implementations with `@hookimpl` and registers through the "
        "`graphveil` entry-point group ([Write a plugin](../how-to/write-a-plugin.md)).", "",
        f"::: {module}",
        "    options: {heading_level: 2, show_root_heading: false, show_source: false, members_order: source}",
        ""])


# ------------------------------------------------------------------------------ CLI page
def _console_parser(tree: Path) -> argparse.ArgumentParser:
    build = find_object(tree, "def", "build_parser")
    host_cls = find_object(tree, "class", "PluginHost")
    return build(host_cls()) if inspect.signature(build).parameters else build()


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # aliases map to the same parser
                    seen.add(id(sub))
                    yield sub


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for sub in _subcommands(parser):
        yield from _walk(sub)


def cli_page(tree: Path) -> str:
    parser = _console_parser(tree)
    scripts = [ep.value for ep in entry_points(group="console_scripts") if ep.name == PACKAGE]
    lines = ["# Command line", "",
             f"`{PACKAGE}` (console script `{scripts[0] if scripts else '?'}`) and every command and "
             "subcommand, as `--help` prints them (generated from the argparse definitions at build "
             "time, built-in plugins' commands included). `./run graphveil ARGS` runs the same "
             "commands inside the project's environment.", ""]
    for p in _walk(parser):
        depth = min(p.prog.count(" ") + 1, 4)
        lines += ["#" * (depth + 1) + f" `{p.prog}`", "", "```text", p.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ config pages
_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?\.?([^`]+)`")


def _md(text: str) -> str:
    """One table cell: whitespace collapsed, pipes escaped, reST roles as code, ``<x>`` shown."""
    return _escape_html(_ROLE.sub(r"`\1`", " ".join(str(text).split()))).replace("|", "\\|")


def _escape_html(text: str) -> str:
    """``<`` and ``>`` outside code spans as entities (``runs/<name>`` is text, not a tag)."""
    parts = re.split(r"(`+[^`]*`+)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


def _paragraphs(text: str) -> list[str]:
    """A docstring as Markdown paragraphs (reST roles as code, ``::`` literal blocks kept)."""
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if para.startswith((" ", "\t")) or para.lstrip().startswith(">>>"):
            out.append("```text\n" + inspect.cleandoc(para) + "\n```")
        else:
            out.append(_escape_html(_ROLE.sub(r"`\1`", " ".join(para.split())).replace("::", ":")))
    return out


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Literal:
        return " \\| ".join(f"`{_yaml(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if ann is type(None):
        return "null"
    if (section := _section_model(ann)) is not None:  # a nested model: how YAML sees it
        return "component" if _is_component_section(section) else "section"
    return getattr(ann, "__name__", str(ann)).replace("typing.", "")


def _yaml(value: Any) -> str:
    """A default as it is written in YAML (``null``, ``true``, ``{name: dp_sgd}``)."""
    import yaml

    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, tuple):
        value = list(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


_BOUNDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "min length", "max_length": "max length"}


def _constraints(field: Any) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
        if (pattern := getattr(meta, "pattern", None)) is not None:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if hasattr(value, "model_dump"):
            dumped = value.model_dump(exclude_defaults=True)
            return f"`{_yaml(dumped)}`" if dumped else "(section defaults)"
        return f"`{_yaml(value)}`"
    if field.default is PydanticUndefined:
        return ""
    try:
        return f"`{_yaml(field.default)}`"
    except Exception:  # an object yaml cannot write: its repr
        return f"`{field.default!r}`"


def _section_model(ann: Any) -> Any:
    """The pydantic model a field holds (``X``, ``X | None``, ``list[X]``), else None."""
    from pydantic import BaseModel

    for c in (ann, *typing.get_args(ann)):
        if inspect.isclass(c) and issubclass(c, BaseModel):
            return c
        if typing.get_origin(c) in (list, tuple):
            for arg in typing.get_args(c):
                if inspect.isclass(arg) and issubclass(arg, BaseModel):
                    return arg
    return None


def _is_component_section(model: Any) -> bool:
    """``{name: ..., <options>}``: a section whose options are those of the component it names."""
    return model.model_config.get("extra") == "allow" and set(model.model_fields) == {"name"}


def model_table(model: Any, *, key: str = "key") -> list[str]:
    rows = [f"| {key} | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        shown = field.alias or name
        kind = _type_name(field.annotation)
        if bounds := _constraints(field):
            kind += f", {bounds}"
        rows.append(f"| `{shown}` | {kind} | {_default(field)} | {_md(field.description or '')} |")
    return rows


def nested_tables(model: Any, prefix: str, *, key: str = "option") -> list[str]:
    """The tables of the sections nested in a component's options (``encoder_training.epochs``)."""
    lines: list[str] = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None and not _is_component_section(sub):
            path = f"{prefix}.{field.alias or name}"
            lines += [f"`{path}`:", "", *model_table(sub, key=key), ""]
            lines += nested_tables(sub, path, key=key)
    return lines


def _doc(model: Any) -> str:
    from pydantic import BaseModel

    doc = model.__dict__.get("__doc__") or ""
    return "" if not doc.strip() or doc == BaseModel.__doc__ else inspect.cleandoc(doc)


def _sections(model: Any, prefix: str, above: tuple[Any, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted path, model) of every section, depth first; a section that holds one of the
    sections above it (``data.split.eval_data`` is a ``data``) is listed, not entered."""
    yield prefix, model
    if model in above:
        return
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None:
            yield from _sections(sub, f"{prefix}.{name}" if prefix else name, (*above, model))


def _family_anchor(section: str, families: dict[str, list[Any]]) -> str | None:
    """The Components heading a component section links to (``mechanisms`` → mechanisms)."""
    for family in families:
        if section.rsplit(".", 1)[-1] in (family, f"{family}s"):
            return f"#{family.replace('_', '-')}s"
    return None


def configuration_page(tree: Path) -> str:
    run_config = find_object(tree, "class", "RunConfig")
    host = find_object(tree, "class", "PluginHost")()
    families: dict[str, list[Any]] = {}
    for info in host.components():
        families.setdefault(info.family, []).append(info)
    lines = ["# Run configuration", "",
             "One YAML file per run (`graphveil run CONFIG`, `graphveil sweep`, `graphveil audit`, "
             "`graphveil privacy --config`); `--set KEY=VALUE` overrides any field by its dotted "
             "name. Generated at build time from the pydantic models' `Field` descriptions "
             f"(`{run_config.__module__}.{run_config.__qualname__}` and its sections). An unknown key "
             "is an error naming it; component sections (`sampler`, `clipper`, ...) take `name` and "
             "that component's options, listed under [Components](#components).", ""]
    written: dict[Any, str] = {}
    for path, model in _sections(run_config, ""):
        lines += [f"## {f'`{path}`' if path else 'Top level'}", ""]
        if _is_component_section(model):
            anchor = _family_anchor(path, families)
            where = f"[Components]({anchor})" if anchor else "[Components](#components)"
            lines += [f"`name`: a registered component (`graphveil plugins`), then that component's "
                      f"options next to it: see {where}.", ""]
            continue
        if model in written:
            lines += [f"The same keys as `{written[model]}`.", ""]
            continue
        written[model] = path or "top level"
        lines += [p + "\n" for p in _paragraphs(_doc(model))]
        lines += model_table(model) + [""]
        if path == "data":
            lines += ["Plus the options of the source `source` names, next to it: see "
                      "[data sources](#data-sources).", ""]
    lines += ["## Components", "",
              "Every built-in component a section can name (`graphveil plugins` lists the same, with "
              "any third-party plugin installed), grouped by family, each with its options (its "
              "`Params` model). Options are validated when the run is assembled, before any data "
              "is read.", ""]
    for family, infos in families.items():
        lines += [f"### {family.replace('_', ' ')}s", ""]
        for info in sorted(infos, key=lambda i: i.name):
            lines += [f"#### `{info.name}`", "", f"*{family}, plugin `{info.plugin}`*: {_md(info.description)}", ""]
            params = info.params_model
            if params.model_fields:
                lines += model_table(params, key="option") + [""] + nested_tables(params, info.name)
            else:
                lines += ["No options.", ""]
    return "\n".join(lines)


def node_config_page(tree: Path) -> str:
    site = find_object(tree, "class", "SiteSettings")
    federation = find_object(tree, "class", "FederationSettings")
    lines = ["# Node config and federation settings", "",
             "Generated at build time from the pydantic models' `Field` descriptions. How to set "
             "them is in the [site runbook](../how-to/federation-sites.md) (§4) and the "
             "[operator guide](../how-to/federation-operators.md).", "",
             f"## Site node config (`{site.__module__}.{site.__qualname__}`)", "",
             *[p + "\n" for p in _paragraphs(_doc(site))], *model_table(site), "",
             f"## Federation run config (`{federation.__module__}.{federation.__qualname__}`)", "",
             *[p + "\n" for p in _paragraphs(_doc(federation))],
             "The keys go in the app's `[tool.flwr.app.config]` or `graphveil fed run --run-config`; "
             "`task.*` keys are run-config sections ([Run configuration](configuration.md)) written "
             "as dotted keys.", "", *model_table(federation), ""]
    return "\n".join(lines)
