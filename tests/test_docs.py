"""The documentation against its sources: what the pages write out by hand (the stack's versions, the keys of
plan.json, the config groups and their options, the telemetry columns) equals what the code and conf/ hold, every
page is in the site's nav, and README.md's links reach existing pages and headings (mkdocs checks the links
between pages; README.md is outside the site). The built site: every diagram fence drawn, the Performance page's
measurements as tables. The commands on the pages: tests/launcher/test_readme_commands.py;
the generated configuration reference: tests/launcher/test_schema.py."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from common.plan import Plan

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is first_cell."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r}")


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def slug(heading: str) -> str:
    """The anchor of a heading, as Python-Markdown's toc extension (mkdocs) makes it."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def test_the_stack_table_is_conf_stack_yaml():
    stack = yaml.safe_load((REPO / "conf" / "stack.yaml").read_text())["stack"]
    text = page("stack.md")
    for name, key in (("Python", "python"), ("torch", "torch"), ("megatron-core", "megatron_core")):
        assert table_row(text, name)[1].split()[0] == str(stack[key]["tested"]), name
    assert table_row(text, "Transformer Engine")[1] == str(stack["transformer_engine"]["tested"])
    for name, key in (("megatron-core", "megatron_core"), ("Transformer Engine", "transformer_engine")):
        accepted = table_row(text, name)[2].replace(" ", "")
        assert accepted == stack[key]["supported"], name
    gpu = table_row(text, "GPU")[2]
    for precision, capability in stack["min_compute_capability"].items():
        assert f"{capability} for" in gpu and precision.lower() in gpu.lower(), precision
    readme = (REPO / "README.md").read_text()
    for key in ("torch", "megatron_core", "transformer_engine"):
        assert f" {stack[key]['tested']}" in readme, key


def test_the_plan_json_keys_are_the_plans():
    listed = set(backticked(table_row(page("run.md"), "`plan.json`")[1]))
    assert listed == {f.name for f in dataclasses.fields(Plan)}


def test_the_config_groups_and_options_are_conf():
    text = page("configuration.md")
    conf = REPO / "conf"
    for group in ("training", "peft", "dtype", "cluster", "data_preparation", "userbuffers", "resilience"):
        options = {
            str(p.relative_to(conf / group).with_suffix(""))
            for p in (conf / group).rglob("*.yaml")
            if not p.name.startswith("_")
        }
        assert set(backticked(table_row(text, f"`{group}`")[1])) >= options, group
    # default names the training option's layout; auto and custom are in the groups table.
    layouts = {p.stem for p in (conf / "parallelism").glob("*.yaml")} - {"_common", "auto", "custom", "default"}
    table = text[text.index("| layout | TP |") :].split("\n\n")[0]  # the named layouts' table
    documented = {cells[0].strip("`") for cells in _rows(table)[2:]}
    assert documented == layouts


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]


def test_the_telemetry_columns_are_the_samplers():
    tree = ast.parse((REPO / "recipes" / "observability" / "telemetry.py").read_text())
    columns = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COLUMNS"
    )
    text = re.sub(r"\s+", " ", page("watching.md"))
    listed = ", ".join(columns[:-1])
    assert f"`{listed}`" in text and f"`{columns[-1]}`" in text


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_IgnoreTags)

    def entries(nav):
        for item in nav:
            for value in item.values():
                yield from entries(value) if isinstance(value, list) else [value]

    nav = list(entries(config["nav"]))
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


class _IgnoreTags(yaml.SafeLoader):
    """mkdocs.yml's !!python/name tags (the mermaid fence) read as plain strings."""


_IgnoreTags.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)


def test_the_site_builds_in_ci_with_a_pinned_mkdocs_material():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    docs = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    assert [r for r in docs if r.startswith("mkdocs-material==")], docs
    dev = (REPO / "dev.sh").read_text()
    assert '-e ".[dataprep,mlperf,test,docs]"' in dev and "unmet_requirements test mlperf docs" in dev
    assert "mkdocs build --strict" in (REPO / ".ci" / "run").read_text()


def test_the_readme_links_reach_pages_and_headings():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 20
    for target, anchor in links:
        path = REPO / target
        assert path.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"{target}#{anchor}"


# --------------------------------------------------------------------------- the site as a reader gets it
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs site, built as .ci/run builds it (mkdocs build --strict, outside the tree)."""
    pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def built_page(site: Path, source: Path) -> str:
    relative = source.relative_to(DOCS).with_suffix("")
    html = site / ("index.html" if relative.name == "index" else relative / "index.html")
    return html.read_text()


def test_every_diagram_fence_is_drawn_by_the_sites_own_mermaid(site):
    """A ```mermaid fence must reach the page as a diagram element (not as code, which is what an unconfigured
    fence becomes) on a page that loads mermaid.js from the site itself (a CDN is out of reach offline)."""
    pages = [p for p in sorted(DOCS.rglob("*.md")) if "```mermaid" in p.read_text()]
    assert pages, "no diagram on any page"
    for source in pages:
        html = built_page(site, source)
        assert "language-mermaid" not in html, f"{source}: a diagram fence reached the page as code"
        drawn = re.findall(r'<pre class="mermaid"><code>', html)
        assert len(drawn) == source.read_text().count("```mermaid"), source
        scripts = re.findall(r'<script src="([^"]*mermaid[^"]*\.js)"', html)
        assert scripts, f"{source} does not load mermaid.js"
        built = (site / source.relative_to(DOCS).with_suffix("") / scripts[0]).resolve()
        if source.name == "index.md":
            built = (site / scripts[0]).resolve()
        assert built.is_file() and built.stat().st_size > 1_000_000, built


def test_measured_results_on_the_performance_page_are_tables(site):
    """Measurements are tables (they wrap to the page); the only code blocks there are the commands."""
    html = built_page(site, DOCS / "performance.md")
    blocks = [re.sub(r"<[^>]+>", "", block).strip() for block in re.findall(r"<pre.*?</pre>", html, re.S)]
    # A command may set environment variables first (CUDA_VISIBLE_DEVICES=0,1 python ...).
    commands = [next(word for word in block.split() if not re.fullmatch(r"[A-Z_]+=\S*", word)) for block in blocks]
    assert blocks and all(command in ("python", "bash") for command in commands), blocks
    assert len(re.findall(r"<table[ >]", html)) >= 5
