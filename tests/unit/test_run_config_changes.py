"""`league run CONFIG --run-dir D` on a D that holds a league: what CONFIG changes of D's config.yaml is said (a
review: it replaced the file silently, the old one gone)."""

from __future__ import annotations

import yaml

from league_cli.run import config_changes


def test_the_changed_keys_are_named_with_their_old_and_new_values(tmp_path):
    from league_service.config import config_to_dict, load_config

    saved = tmp_path / "config.yaml"
    old = config_to_dict(load_config(None))  # what `league run` writes: the whole config
    saved.write_text(yaml.safe_dump(old))
    assert config_changes(saved, old) == ""
    new = yaml.safe_load(yaml.safe_dump(old))
    new["policy"]["ppo"]["learning_rate"] = 0.0005
    assert config_changes(saved, new) == "policy.ppo.learning_rate: 0.001 -> 0.0005"
    # run.learner_device is not in a file an older version wrote: a key a newer version added, with its default
    # (every plain resume of an older run said "(unset) -> auto" and set its config.yaml aside).
    del old["run"]["learner_device"]
    saved.write_text(yaml.safe_dump(old))
    assert config_changes(saved, new) == "policy.ppo.learning_rate: 0.001 -> 0.0005"
    # Not a config this version loads (an unknown section): read raw.
    saved.write_text(yaml.safe_dump({"a": {str(i): i for i in range(12)}}))
    many = {"a": {str(i): i + 1 for i in range(12)}}
    assert config_changes(saved, many, shown=3).endswith(" and 9 more")
    assert config_changes(saved, {}).startswith("a.0: 0 -> (unset)")  # a key gone is still said


def test_nothing_readable_saved_is_no_change(tmp_path):
    assert config_changes(tmp_path / "missing.yaml", {"a": 1}) == ""
    (tmp_path / "bad.yaml").write_text("[unclosed")
    assert config_changes(tmp_path / "bad.yaml", {"a": 1}) == ""


def test_a_key_added_to_a_map_is_a_change_and_a_newer_versions_default_is_not(tmp_path):
    """A kwarg added under env.kwargs was skipped as "a key the saved file lacks" (a newer version's default):
    config.yaml was replaced silently and no config.prev.yaml kept; added to an empty map it read
    "env.kwargs: {} -> (unset)"."""
    from pathlib import Path

    from league_service.config import config_to_dict, load_config

    solo = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "solo_cartpole.yaml").read_text())
    solo["env"]["kwargs"] = {}
    solo.pop("run", None)  # (a saved file without the section: the last check)
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(solo))

    def changes(edit) -> str:
        data = yaml.safe_load(yaml.safe_dump(solo))
        edit(data)
        path = tmp_path / "new.yaml"
        path.write_text(yaml.safe_dump(data))
        return config_changes(saved, config_to_dict(load_config(path)))

    assert changes(lambda d: None) == ""
    assert changes(lambda d: d["env"]["kwargs"].update(max_episode_steps=400)) == \
        "env.kwargs.max_episode_steps: (unset) -> 400"
    saved.write_text(yaml.safe_dump({**solo, "env": {**solo["env"], "kwargs": {"max_episode_steps": 400}}}))
    assert changes(lambda d: d["env"]["kwargs"].update(max_episode_steps=400, disable_env_checker=True)) == \
        "env.kwargs.disable_env_checker: (unset) -> True"
    assert changes(lambda d: None) == "env.kwargs.max_episode_steps: 400 -> (unset)"  # taken out: said too
    # A section the saved file lacks has this version's defaults: no change unless the new file sets others.
    assert changes(lambda d: d.update(run={"actors": 1})) == "env.kwargs.max_episode_steps: 400 -> (unset), run.actors: 2 -> 1"


def test_a_resume_names_the_keys_its_config_yaml_lacks_that_take_this_versions_defaults(tmp_path):
    """An older run's config.yaml lacks the keys added since: resumed, the league took their defaults without a
    word (three reference bots joined its opponents, weight averaging started; an upgrade review)."""
    from league_cli.run import defaults_taken
    from league_service.config import config_to_dict, load_config

    saved = tmp_path / "config.yaml"
    whole = config_to_dict(load_config(None))  # what `league run` writes: every key
    saved.write_text(yaml.safe_dump(whole))
    assert defaults_taken(saved) == ""
    del whole["league"]["reference_bots"], whole["learner"]["average_decay"]
    saved.write_text(yaml.safe_dump(whole))
    assert defaults_taken(saved) == ("league.reference_bots (['random', 'mcts:10', 'mcts:25']), "
                                     "learner.average_decay (0.97)")
    saved.write_text("not: [a, league")  # unreadable: nothing said here (loading it says what is wrong)
    assert defaults_taken(saved) == ""
