"""mkdocs hook (mkdocs.yml: hooks): links from a page to a file of the
repository outside docs/ (`../redis.conf.example`, `../bench/results/`) work
on GitHub but are not part of the site; the site shows their text and the
file's path instead of a broken link. A link to a path that exists nowhere
is left alone, so the strict build still fails on it."""

import pathlib
import re

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    docs = pathlib.Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_uri).parent

    def outside(m):
        label, target = m.group(1), m.group(2)
        if "://" in target or target.startswith("mailto:"):
            return m.group(0)
        path = (here / target).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
            return m.group(0)
        name = path.relative_to(root).as_posix()
        return label if label.strip("`").rstrip("/") == name.rstrip("/") else f"{label} (`{name}`)"

    return LINK.sub(outside, markdown)
