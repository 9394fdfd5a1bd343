"""Issue 22, bug 1: a run with a precision policy resumes (the manifest records and compares JSON values)."""

import json

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.runs.manifest import json_normal, merge_manifest

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()


@pytest.mark.parametrize("cmd,extra", [
    ("run", ["--fp-blocks", "0"]),
    ("run", ["--fp-first-steps", "1"]),
    ("run", ["--fp-last-steps", "1", "--fp-blocks", "transformer_blocks.0"]),
    ("compare", ["--fp-blocks", "0,-1"]),
])
def test_policy_run_twice_resumes(cmd, extra, fake_model, tmp_path):
    out = tmp_path / "D"
    args = [cmd, "tiny-flux", "-p", "x", "--steps", "2", "--warmup", "0", "-q", "--out", str(out), *extra]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["attention"]["policy"] is not None
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "already holds a different run" not in second.output
    assert "already finished" in second.output
    assert fake_model.loads == ["tiny-flux"]  # the second run had nothing to do, so loaded nothing


def test_a_different_policy_is_still_refused(fake_model, tmp_path):
    out = tmp_path / "D"
    base = ["run", "tiny-flux", "-p", "x", "--steps", "2", "--warmup", "0", "-q", "--out", str(out)]
    assert runner.invoke(app, [*base, "--fp-blocks", "0"]).exit_code == 0
    r = runner.invoke(app, [*base, "--fp-blocks", "1"])
    assert r.exit_code == 2 and "attention.policy.blocks: [0] -> [1]" in r.output


def test_merge_compares_json_values():
    new = {"model": {"name": "m"}, "settings": {"size": (1, 2)}, "samples": [],
           "attention": {"sage": {}, "policy": {"blocks": (0,)}, "backend": "auto"}, "variants": ["sage"],
           "created": "now"}
    back = json.loads(json.dumps(new))
    merged = merge_manifest(back, new, where="D")  # no RunDirConflict: (0,) is recorded as [0]
    assert merged["attention"]["policy"]["blocks"] == [0] and merged["settings"]["size"] == [1, 2]
    assert json_normal({"a": (1, (2,))}) == {"a": [1, [2]]}
