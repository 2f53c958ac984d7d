"""README.md and docs/: every figure traced to a committed JSON, every link and `trace` command real, every stage
and concept covered, the configuration reference generated from the schemas and complete (issue 45).

The figure convention: a measured number is followed at once by where it comes from,
`0.76×<!-- from: benchmarks/results/x.json#/json/pointer -->` (an RFC 6901 pointer; an optional conversion
after it: `s->min`, `s->h`, `x100`). The marker is invisible on the rendered page. The number must equal the
value at the pointer rounded to the digits quoted. A decimal number in prose without a marker fails; settings
and other non-measurements go in code spans (`0.2`), sizes carry their unit letter (`2.6M`).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from trace_testing import REPO, run_cli

README_MAX_LINES = 160
STAGE_PAGES = (
    "ingest",
    "diagnose",
    "synthesize",
    "train",
    "compose",
    "eval",
    "serve-export",
    "model",
    "run-recipes",
)
CONCEPT_PAGES = ("store", "recipes", "calibration", "composition", "sandbox", "serve", "benchmarks")

NUMBER = r"(?P<num>[−-]?\d[\d,]*(?:\.\d+)?)"
MARKER = re.compile(
    NUMBER
    + r"(?P<unit>×|%| ?%)?<!-- from: (?P<file>[^#\s]+)#(?P<ptr>\S*)(?:\s+(?P<conv>s->min|s->h|x100))?\s*-->"
)
ANY_MARKER = re.compile(r"<!--\s*from:.*?-->", re.S)
DECIMAL = re.compile(r"(?<![\w.\-/])\d+\.\d+(?![\w.])")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked (lengths kept, so offsets still match)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"^(```|~~~).*?^\1", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", blank, text)


def resolve(pointer: str, doc):
    for part in pointer.lstrip("/").split("/") if pointer else []:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def check_figure(m: re.Match) -> str | None:
    """None when the quoted number matches the JSON, else what is wrong."""
    path = REPO / m["file"]
    if not path.is_file():
        return f"{m['file']} does not exist"
    try:
        value = resolve(m["ptr"], json.loads(path.read_text(encoding="utf-8")))
    except (KeyError, IndexError, ValueError, TypeError) as e:
        return f"{m['file']}#{m['ptr']}: no such value ({e!r})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{m['file']}#{m['ptr']} is {value!r}, not a number"
    value = float(value) * {"s->min": 1 / 60, "s->h": 1 / 3600, "x100": 100.0}.get(m["conv"] or "", 1.0)
    quoted = m["num"].replace("−", "-").replace(",", "")
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    if abs(float(quoted) - value) > 0.5 * 10**-digits + 1e-9:
        return f"quotes {m['num']} but {m['file']}#{m['ptr']} is {value:g}"
    return None


def test_every_quoted_figure_matches_its_committed_json():
    problems, count = [], 0
    tracked = set(
        __import__("subprocess")
        .run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
        .stdout.split()
    )
    for page in pages():
        text = page.read_text(encoding="utf-8")
        markers = ANY_MARKER.findall(text)
        found = list(MARKER.finditer(text))
        count += len(found)
        if len(found) != len(markers):
            problems.append(f"{_rel(page)}: {len(markers) - len(found)} marker(s) not right after a number")
        for m in found:
            line = text[: m.start()].count("\n") + 1
            if (err := check_figure(m)) is not None:
                problems.append(f"{_rel(page)}:{line}: {err}")
            elif m["file"] not in tracked and not m["file"].startswith("docs/"):
                problems.append(f"{_rel(page)}:{line}: {m['file']} is not committed")
    assert problems == [], "\n".join(problems)
    assert count >= 20  # the README's tables and verdicts are sourced, not just a sample


def test_no_decimal_figure_in_prose_without_its_source():
    problems = []
    for page in pages():
        if page.name == "config-reference.md":
            continue  # generated from the schemas: defaults and bounds are settings, not measurements
        text = page.read_text(encoding="utf-8")
        prose = _prose(text)
        prose = re.sub(r"\]\([^)]*\)", lambda m: " " * len(m.group(0)), prose)  # link targets
        for m in DECIMAL.finditer(prose):
            after = text[m.end() : m.end() + 12]
            if re.match(r"(×|%| ?%)?<!-- from:", after):
                continue
            line = text[: m.start()].count("\n") + 1
            problems.append(f"{_rel(page)}:{line}: {m.group(0)} has no <!-- from: FILE#POINTER --> marker")
    assert problems == [], "\n".join(problems)


def test_the_figure_check_catches_a_wrong_or_unsourced_number():
    good = "ratio 0.76×<!-- from: benchmarks/results/sample_efficiency_mixed.json#/verdict/gain_ratio -->"
    bad = good.replace("0.76", "0.86")
    assert check_figure(MARKER.search(good)) is None
    assert "quotes 0.86" in check_figure(MARKER.search(bad))
    missing = good.replace("gain_ratio", "gain_ratios")
    assert "no such value" in check_figure(MARKER.search(missing))
    assert DECIMAL.search(_prose("TRACE scores 0.51 against `0.2` and\n```\n1.5\n```\n")).group(0) == "0.51"
    assert DECIMAL.search(_prose("a `0.2` band, Python `3.11`, a ~2.6M model")) is None


def test_readme_is_short_and_says_how_to_start():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for needed in (
        "make demo",
        "make test",
        ". .venv/bin/activate",
        "## τ²-bench as the target",
        "### Security",
    ):
        assert needed in text, needed


def test_docs_cover_every_stage_and_concept():
    for sub, names in (("stages", STAGE_PAGES), ("concepts", CONCEPT_PAGES)):
        for n in names:
            page = REPO / "docs" / sub / f"{n}.md"
            assert page.is_file(), page
            text = page.read_text(encoding="utf-8")
            assert "```" in text, f"{_rel(page)} has no example"
            assert len(text.splitlines()) <= 120, f"{_rel(page)} is not short"
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    for sub, names in (("stages", STAGE_PAGES), ("concepts", CONCEPT_PAGES)):
        for n in names:
            assert f"({sub}/{n}.md)" in index, n


def test_every_relative_link_resolves():
    problems = []
    for page in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                problems.append(f"{_rel(page)}: {target}")
    assert problems == [], "\n".join(problems)


def _commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every `trace ...` line in a bash block of the README and docs."""
    out = []
    for page in pages():
        for block in re.findall(
            r"^```(?:bash|sh|console)\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M
        ):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("$ "):
                    line = line[2:]
                if line.startswith("trace "):
                    out.append((_rel(page), shlex.split(line)[1:]))
    return out


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], str]:
    return {}


def _help(path: tuple[str, ...], cache: dict) -> tuple[int, str]:
    if path not in cache:
        r = run_cli(*path, "--help")
        cache[path] = (r.exit_code, r.stdout)
    return cache[path]


def test_every_trace_command_in_the_docs_exists_with_its_options(helps):
    """The subcommand exists and every --option given is one of its options (the commands are examples to
    copy: they must not drift from the CLI)."""
    commands = _commands()
    assert len(commands) >= 30
    problems = []
    for page, argv in commands:
        path: tuple[str, ...] = ()
        for a in argv:  # descend through groups while the next word is a subcommand
            code, out = _help((*path, a), helps)
            if a.startswith("-") or code != 0:
                break
            path = (*path, a)
            if "Commands:" not in out:
                break
        code, out = _help(path, helps)
        if not path or code != 0:
            problems.append(f"{page}: trace {' '.join(argv)}: no such command")
            continue
        for a in argv[len(path) :]:
            flag = a.split("=")[0]
            if flag.startswith("--") and not re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=/]|$)", out, re.M):
                problems.append(f"{page}: trace {' '.join(path)}: no option {flag}")
    assert problems == [], "\n".join(problems)


def test_the_config_reference_is_generated_and_complete():
    from trace_cli.config import reference

    committed = (REPO / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert committed == reference.render(), "docs/config-reference.md is stale: run `make docs`"
    missing = []
    for name, schema in reference.schema_files():
        section = committed.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        for path, _ in reference.keys(schema):
            if f"| `{path}` |" not in section:
                missing.append(f"{name}: {path}")
    assert missing == [], missing
    # every key a user can set (the stage configs) says what it does
    undescribed = [
        f"{name}: {path}"
        for name, schema in reference.schema_files()
        if name.startswith("config/")
        for path, e in reference.entries(schema).items()
        if not e["description"]
    ]
    assert undescribed == [], undescribed
    # the walk reaches nested keys, list items and alternatives (a key it skipped would be missing above)
    keys = {p for p, _ in reference.keys(json.loads((REPO / "schemas/config/compose.v1.json").read_text()))}
    assert {"router.top_p", "moe.data[].expert", "merge.combination_type"} <= keys
