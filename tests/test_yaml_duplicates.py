"""A key given twice in one mapping of a scenario file is refused: YAML's loaders keep the last value without a
word, so a second `policy:` pasted under a variant, or a second `workload:`, ran instead of the first."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.yaml_limits import safe_load_limited

HEAD = """name: dup
seed: 0
workload:
  arrival: {type: poisson, rate: 5.0}
  num_requests: 5
  prompt_len: {type: fixed, value: 100}
  output_len: {type: fixed, value: 10}
deployment: {model: llama-3.2-1b, gpu: l4, max_model_len: 1024}
"""


@pytest.mark.parametrize(("tail", "message"), [
    ("variants:\n  - name: a\n    policy: {type: continuous, max_num_seqs: 4}\n    policy: {type: fcfs}\n",
     "error: {path}: not valid YAML: line 12, column 5: the key 'policy' is given twice in this mapping (first at "
     "line 11, column 5; YAML would keep the last without a word)"),
    ("seed: 3\n", "error: {path}: not valid YAML: line 9, column 1: the key 'seed' is given twice in this mapping "
     "(first at line 2, column 1; YAML would keep the last without a word)"),
    ("variants: [{name: a, policy: {type: fcfs, max_num_seqs: 4, max_num_seqs: 8}}]\n",
     "error: {path}: not valid YAML: line 9, column 60: the key 'max_num_seqs' is given twice in this mapping "
     "(first at line 9, column 43; YAML would keep the last without a word)"),
])
def test_a_key_given_twice_exits_2_naming_both_lines(tmp_path: Path, tail: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + tail)
    r = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == message.format(path=path)
    assert not (tmp_path / "out").exists()


def test_merge_keys_may_still_be_overridden() -> None:
    # `<<: *base` then a key of its own is YAML's way to override a merged value, not a repeat
    doc = safe_load_limited("base: &b {type: fcfs, max_num_seqs: 4}\npolicy:\n  <<: *b\n  max_num_seqs: 8\n")
    assert doc["policy"] == {"type": "fcfs", "max_num_seqs": 8}
    with pytest.raises(yaml.YAMLError, match="the key 'x' is given twice"):
        safe_load_limited("a: {x: 1, x: 1}\n")
