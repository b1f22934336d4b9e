"""MkDocs hook: pages generated at every build, so none is kept by hand beside its source.

``index.md`` is the README (its ``docs/`` links made relative to the site), ``changelog.md`` the
CHANGELOG, ``reference/spec.md`` the job spec's reference from the pydantic models.
"""

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from primus_dagster.spec import spec_reference_markdown

REPO = Path(__file__).resolve().parents[2]


def _site_links(markdown: str) -> str:
    markdown = re.sub(r"\]\(docs/", "](", markdown)
    return markdown.replace("](CHANGELOG.md)", "](changelog.md)")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    pages = {
        "index.md": _site_links((REPO / "README.md").read_text()),
        "changelog.md": _site_links((REPO / "CHANGELOG.md").read_text()),
        "reference/spec.md": spec_reference_markdown(),
    }
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files
