"""`league run CONFIG --run-dir D` on a D that holds a league: what CONFIG changes of D's config.yaml is said (a
review: it replaced the file silently, the old one gone)."""

from __future__ import annotations

import yaml

from league_cli.run import config_changes


def test_the_changed_keys_are_named_with_their_old_and_new_values(tmp_path):
    saved = tmp_path / "config.yaml"
    old = {"policy": {"ppo": {"learning_rate": 0.001, "gamma": 0.99}}, "run": {"actors": 2}, "env": {"kwargs": {}}}
    saved.write_text(yaml.safe_dump(old))
    assert config_changes(saved, old) == ""
    new = {"policy": {"ppo": {"learning_rate": 0.0005, "gamma": 0.99}}, "run": {"actors": 2, "seconds": 60},
           "env": {"kwargs": {}}}
    # run.seconds is not in the saved file, which `league run` writes whole: a key a newer version added, with
    # its default (every plain resume of an older run said "(unset) -> ..." and set its config.yaml aside).
    assert config_changes(saved, new) == "policy.ppo.learning_rate: 0.001 -> 0.0005"
    saved.write_text(yaml.safe_dump({"a": {str(i): i for i in range(12)}}))
    many = {"a": {str(i): i + 1 for i in range(12)}}
    assert config_changes(saved, many, shown=3).endswith(" and 9 more")
    assert config_changes(saved, {}).startswith("a.0: 0 -> (unset)")  # a key gone is still said


def test_nothing_readable_saved_is_no_change(tmp_path):
    assert config_changes(tmp_path / "missing.yaml", {"a": 1}) == ""
    (tmp_path / "bad.yaml").write_text("[unclosed")
    assert config_changes(tmp_path / "bad.yaml", {"a": 1}) == ""
