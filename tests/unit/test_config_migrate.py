"""`vllm-sr config migrate` (config/migrate.py): golden before/after files, idempotence, a dry
run that writes nothing, and comments, order and formatting kept, on our golden file and on
every upstream 3d48f8c9 fixture that uses the old names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vllm_sr.cli import main
from vllm_sr.config.files import collect_problems, parse_document, to_plain
from vllm_sr.config.migrate import migrate_text
from vllm_sr.config.renames import RENAMES
from vllm_sr.errors import EXIT_DO_NOT_RESTART, ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / "migrate"
UPSTREAM = [
    p
    for p in [
        FIXTURES / "upstream" / "config.yaml",
        *sorted((FIXTURES / "upstream").glob("recipes/*/config.yaml")),
    ]
    if "default_model" in p.read_text(encoding="utf-8")
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def golden(name: str) -> str:
    return (GOLDEN / name).read_text(encoding="utf-8")


def test_golden_before_becomes_golden_after() -> None:
    migration = migrate_text(golden("before.yaml"))
    assert migration.after == golden("after.yaml")
    assert [r.describe() for r in migration.renamed] == [
        "line 8: providers.defaults.default_model -> model",
        "line 9: providers.defaults.default_reasoning_effort -> reasoning_effort",
    ]


def test_migrate_is_idempotent() -> None:
    once = migrate_text(golden("before.yaml")).after
    again = migrate_text(once)
    assert not again.changed and again.renamed == () and again.after == once
    assert again.diff("config.yaml") == ""


def test_dry_run_prints_the_golden_diff_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(golden("before.yaml"), encoding="utf-8")
    os.utime(path, (1_000_000, 1_000_000))
    code, out, err = run(["config", "migrate", "--dry-run", "config.yaml"], capsys)
    assert code == 0
    assert out == golden("before-after.diff")
    assert "would rename 2 field(s)" in err
    assert path.read_text(encoding="utf-8") == golden("before.yaml")
    assert path.stat().st_mtime == 1_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no temp file left


def test_migrate_rewrites_the_file_in_place_and_a_second_run_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(golden("before.yaml"), encoding="utf-8")
    path.chmod(0o600)
    code, out, err = run(["config", "migrate", str(path)], capsys)
    assert (code, out) == (0, "")
    assert "renamed 2 field(s) to v0.4's names" in err
    assert "line 8: providers.defaults.default_model -> model" in err
    assert path.read_text(encoding="utf-8") == golden("after.yaml")
    assert path.stat().st_mode & 0o777 == 0o600
    code, out, err = run(["config", "migrate", str(path)], capsys)
    assert (code, out) == (0, "")
    assert "already on v0.4's names; nothing to rename" in err
    assert path.read_text(encoding="utf-8") == golden("after.yaml")
    code, _, _ = run(["config", "validate", "--config", str(path)], capsys)
    assert code == 0


def test_flow_style_defaults_are_renamed_in_place() -> None:
    text = "providers:\n  defaults: {default_model: a, 'default_reasoning_effort': low}  # x\n"
    after = migrate_text(text).after
    assert after == "providers:\n  defaults: {model: a, 'reasoning_effort': low}  # x\n"


def test_both_names_given_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "providers:\n  defaults:\n    model: a\n    default_model: a\n"
    with pytest.raises(ConfigError) as info:
        migrate_text(text, "c.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("c.yaml:4: providers.defaults.default_model: 'default_model' and")
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    code, _, err = run(["config", "migrate", str(path)], capsys)
    assert code == EXIT_DO_NOT_RESTART and "are both given" in err
    assert path.read_text(encoding="utf-8") == text


def renamed_plain(plain: Any) -> Any:
    """The plain mapping with the table's old keys replaced by the new ones, in place."""
    for r in RENAMES:
        node = plain
        for key in r.section:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and r.old in node:
            node[r.new] = node.pop(r.old)
    return plain


def new_path(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    for r in RENAMES:
        if path == (*r.section, r.old):
            return (*r.section, r.new)
    return path


@pytest.mark.parametrize("path", UPSTREAM, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_upstream_files_change_only_in_the_renamed_keys(path: Path) -> None:
    before = path.read_text(encoding="utf-8")
    migration = migrate_text(before, path.name)
    assert migration.renamed, "the fixture uses an old name"
    old_lines, new_lines = before.split("\n"), migration.after.split("\n")
    assert len(old_lines) == len(new_lines)  # comments, blank lines and order all kept
    changed = [i + 1 for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True)) if a != b]
    assert changed == [r.line for r in migration.renamed]
    plain_before = to_plain(parse_document(before))
    plain_after = to_plain(parse_document(migration.after))
    assert plain_after == renamed_plain(to_plain(parse_document(before)))
    # vllm-sr reads both the same way: the same problems (or none), at the renamed paths.
    _, problems_before = collect_problems(plain_before)
    _, problems_after = collect_problems(plain_after)
    assert {(p.path, p.message) for p in problems_after} == {
        (new_path(p.path), p.message) for p in problems_before
    }
