"""Links that leave docs/: where each one goes on the site (a MkDocs hook, mkdocs.yml `hooks:`).

On GitHub a docs page may link anywhere in the repository (`../../posttrain/roles/rollout.py`,
`../../lessons/02_rollout_and_pi_old.py`, `../BENCHMARKS.md`); on the site those are not pages,
and MkDocs reports them as broken. This hook gives each target a place on the site, so that
`mkdocs build --strict` still fails on a link whose target exists nowhere:

    lessons/NN_name.py, lessons/index.py   the lesson's page, lessons/NN_name.md (docs/hooks/lessons.py)
    a file a docs page includes            the page that includes it (benchmarks.md includes BENCHMARKS.md)
    a directory                            its README.md or index.md, or else a page listing its files
    any other file of the repository       a page source/<path>.md made here: Markdown rendered (its own
                                           links followed the same way), anything else as highlighted text;
                                           an image or other binary file is copied as it is
    a path that does not exist             left alone: MkDocs reports it (an error under --strict)

The targets are found before the nav is built (on_files reads every page's links, and the links
of the pages made for them), and each link is rewritten on the parsed page by a Markdown tree
processor that runs just before MkDocs's own link check: text in code blocks is never touched.
A page whose text is included from elsewhere says where its links were written from in its
front matter: `links_from: ..` in docs/benchmarks.md, which includes the root's BENCHMARKS.md.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import markdown
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url
from mkdocs.utils.meta import get_data

SOURCE = "source"  # the folder of the pages made here (mkdocs.yml keeps it out of the nav: not_in_nav)
LESSON = re.compile(r"^lessons/(?:\d\d[a-z]?_\w+|index)\.py$")  # as posttrain/teach/lessons.py names them
INCLUDE = re.compile(r'^-{1,3}8<-{1,3}\s+"([^"]+)"\s*$', re.M)  # a pymdownx.snippets line: --8<-- "FILE"
# Link targets as Markdown and HTML write them; only for finding targets ahead of time: what a page
# really links to is read from its parsed tree (LinkRewriter), and a target missed here is reported
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)|(?:src|href)=\"([^\"]+)\"", re.M)
TEXT_LIMIT = 200_000  # bytes of a text file shown whole; past that its first lines, and a note
CODE = {".py": "python", ".toml": "toml", ".json": "json", ".jsonl": "json", ".yml": "yaml", ".yaml": "yaml",
        ".sh": "bash", ".txt": "text", ".cfg": "ini", ".ini": "ini", ".csv": "text", "Makefile": "make"}
BINARY = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp", ".pdf", ".gguf", ".safetensors", ".pt")
# the site's search finds the docs' own words, not every line of a linked source file
UNSEARCHED = "---\nsearch:\n  exclude: true\n---\n"
CODE_PAGE = "---\nsearch:\n  exclude: true\nhide: [toc]\n---\n"  # a code page has no headings to list
SKIPPED = ("__pycache__", ".egg-info", ".pyc")  # a directory listing leaves build leftovers out

ROOT = Path(__file__).resolve().parents[2]
# {a page's src_uri: the repository folder its links are written from}; on_files fills it
LINKS_FROM: dict[str, str] = {}
# {repository path outside docs/: the src_uri on the site that stands for it}
TARGETS: dict[str, str] = {}
current: dict[str, Page | None] = {"page": None}  # the page being rendered (on_page_markdown sets it)


def docs_prefix(config: MkDocsConfig) -> str:
    """docs_dir as a repository path, "docs"."""
    return Path(config.docs_dir).resolve().relative_to(ROOT).as_posix()


def link_targets(text: str, base: str) -> list[str]:
    """The repository paths the relative links in Markdown `text`, written from folder `base`, point at."""
    found = []
    for match in LINK.finditer(text):
        url = next(g for g in match.groups() if g)
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith(("/", "#")) or not parts.path:
            continue
        path = posixpath.normpath(posixpath.join(base, unquote(parts.path)))
        if not path.startswith("../"):
            found.append(path)
    return found


def folder_page(path: str, docs: str, files: Files) -> str | None:
    """The page a link to folder `path` opens: its README.md or index.md where docs has one."""
    for name in ("index.md", "README.md"):
        uri = posixpath.relpath(posixpath.join(path, name), docs) if path.startswith(docs + "/") or path == docs else None
        if uri and files.get_file_from_path(uri) is not None:
            return uri
    return None


def source_page(path: str, config: MkDocsConfig) -> tuple[File, str | None]:
    """The site's stand-in for repository file or folder `path`, and the folder its own links
    are written from (None when it has no links of its own)."""
    where = ROOT / path
    if where.is_dir():
        entries = sorted(p for p in where.iterdir() if not p.name.startswith(".") and not p.name.endswith(SKIPPED))
        lines = [CODE_PAGE + f"# `{path}/`", "", f"The folder `{path}/` of the repository:", ""]
        for entry in entries:  # files link to their pages; subfolders are named only, so a listing stays one level
            lines.append(f"- [`{entry.name}`]({entry.name})" if entry.is_file() else f"- `{entry.name}/`")
        return File.generated(config, f"{SOURCE}/{path}/index.md", content="\n".join(lines) + "\n"), path
    if where.suffix.lower() in BINARY:
        return File.generated(config, f"{SOURCE}/{path}", abs_src_path=str(where)), None
    text = where.read_text(encoding="utf-8", errors="replace")
    if where.suffix == ".md":  # rendered; its own front matter, if any, is kept as it is
        text = text if text.startswith("---") else UNSEARCHED + text
        return File.generated(config, f"{SOURCE}/{path}.md", content=text), posixpath.dirname(path)
    note = ""
    if len(text.encode()) > TEXT_LIMIT:
        lines = text.splitlines()
        shown = text[:TEXT_LIMIT].count("\n")
        text = "\n".join(lines[:shown])
        note = f"\nThe first {shown:,} of its {len(lines):,} lines; the whole file is `{path}` in the repository.\n"
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    language = CODE.get(where.suffix, CODE.get(where.name, "text"))
    content = f"{CODE_PAGE}# `{path}`\n{note}\n{fence}{language} linenums=\"1\"\n{text}\n{fence}\n"
    return File.generated(config, f"{SOURCE}/{path}.md", content=content), None


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Every target outside docs/ that a page links to, with its stand-in page made where needed."""
    docs = docs_prefix(config)
    LINKS_FROM.clear()
    TARGETS.clear()
    pending: list[tuple[str, str]] = []  # (Markdown text, the folder its links are written from)
    for file in files.documentation_pages():
        text, meta = get_data(file.content_string)
        base = posixpath.normpath(posixpath.join(docs, posixpath.dirname(file.src_uri), meta.get("links_from", ".")))
        LINKS_FROM[file.src_uri] = base
        pending.append((text, base))
        for included in INCLUDE.findall(text):  # pymdownx.snippets: paths from the repository root
            TARGETS[posixpath.normpath(included)] = file.src_uri
            if (ROOT / included).is_file():
                pending.append(((ROOT / included).read_text(encoding="utf-8"), base))
    while pending:
        text, base = pending.pop()
        for path in link_targets(text, base):
            if path in TARGETS or not (ROOT / path).exists():
                continue  # done already, or missing: MkDocs reports the link
            inside = path == docs or path.startswith(docs + "/")
            if LESSON.match(path):
                TARGETS[path] = f"lessons/{Path(path).stem}.md"  # docs/hooks/lessons.py makes it
            elif (ROOT / path).is_dir() and folder_page(path, docs, files):
                TARGETS[path] = folder_page(path, docs, files)
            elif (ROOT / path).is_dir() or not inside:
                file, own_base = source_page(path, config)
                files.append(file)
                TARGETS[path] = file.src_uri
                if own_base is not None:
                    LINKS_FROM[file.src_uri] = own_base
                    pending.append((file.content_string, own_base))
    return files


class LinkRewriter(markdown.treeprocessors.Treeprocessor):
    """Rewrites each relative link of the page being rendered to the site's page for its target."""

    def __init__(self, md: markdown.Markdown, config: MkDocsConfig) -> None:
        super().__init__(md)
        self.config = config

    def run(self, root):  # type: ignore[no-untyped-def]
        page = current["page"]
        if page is None:
            return root
        docs = docs_prefix(self.config)
        base = LINKS_FROM.get(page.file.src_uri, posixpath.join(docs, posixpath.dirname(page.file.src_uri)))
        for element in root.iter():
            key = {"a": "href", "img": "src"}.get(element.tag)
            url = element.get(key) if key else None
            if not url:
                continue
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith(("/", "#")) or not parts.path:
                continue
            path = posixpath.normpath(posixpath.join(base, unquote(parts.path)))
            inside = path.startswith(docs + "/")
            target = TARGETS.get(path) or (posixpath.relpath(path, docs) if inside else None)
            if target is None:
                continue  # not in the repository: left for MkDocs to report
            new = get_relative_url(target, page.file.src_uri)
            element.set(key, urlunsplit(("", "", new, parts.query, parts.fragment)))
        return root


class RepositoryLinks(markdown.Extension):
    def __init__(self, config: MkDocsConfig) -> None:
        super().__init__()
        self.config = config

    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802 (Markdown's name)
        md.treeprocessors.register(LinkRewriter(md, self.config), "repository_links", 1)  # MkDocs's own: 0


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(RepositoryLinks(config))  # type: ignore[arg-type]
    return config


def on_page_markdown(markdown_text: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    current["page"] = page
    return markdown_text
