"""reference/api.md's package face, made when the site is built from `posttrain.PUBLIC` (a MkDocs
hook, mkdocs.yml `hooks:`): one mkdocstrings entry per public name, grouped by the module it
lives in, put where the page has the line `<!-- posttrain.PUBLIC -->`. A name added to or taken
from the face changes the page with it; mkdocstrings renders each from its docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/api.md"
MARK = "<!-- posttrain.PUBLIC -->"


def public() -> dict[str, str]:
    """posttrain.PUBLIC, {name: module}, read from posttrain/__init__.py without importing it."""
    tree = ast.parse((ROOT / "posttrain" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PUBLIC" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("posttrain/__init__.py has no PUBLIC = {...}: docs/hooks/api_reference.py lists the "
                       "package face from it")


def face() -> str:
    by_module: dict[str, list[str]] = {}
    for name, module in public().items():
        by_module.setdefault(module, []).append(name)
    lines = []
    for module, names in by_module.items():
        lines += [f"### `{module}`", ""]
        lines += [f"::: {module}.{name}\n    options:\n      heading_level: 4\n" for name in names]
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARK not in markdown:
        raise RuntimeError(f"docs/{PAGE} lost the line {MARK!r}, where the package face goes: put it back")
    return markdown.replace(MARK, face())
