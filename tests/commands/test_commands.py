"""The commands' surfaces: bin/rlrunner's help and program names, `keys`, and `plan` without a recipe."""

import re
import subprocess

import pytest
from shell_helpers import ROOT, clean_env, run_handed_in_process

from rlrunner.commands import keys, plan
from rlrunner.run import outcome

EXIT_CODES = sorted(value for name, value in vars(outcome).items() if name.startswith("EXIT_"))


def rlrunner(*args: str) -> subprocess.CompletedProcess:
    """``bin/rlrunner args``: the script for real, the Python command it hands over in this process."""
    return run_handed_in_process(["bash", str(ROOT / "bin/rlrunner"), *args], clean_env(), timeout=120)


def test_every_leaf_key_has_a_meaning_beside_its_field():
    # a key added without a comment (schema.py, settings.py) fails here, naming it
    missing = [key.name for key in keys.schema_keys() if not key.meaning]
    assert not missing, f"keys without a meaning (a comment above or beside the field): {missing}"


def test_keys_lists_a_section_with_type_default_allowed_values_and_meaning(capsys):
    assert keys.main(["actor.optim"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert names[:2] == ["actor.optim.optimizer", "actor.optim.lr"] and all(n.startswith("actor.optim.") for n in names)
    lr = lines.index("actor.optim.lr: float = 0.0003  (a number > 0)")
    assert lines[lr + 1] == "    AdamW learning rate of the LoRA weights"
    assert "actor.optim.lr_scheduler: str = \"constant\"  (one of constant | cosine | linear)" in lines


def test_keys_shows_each_familys_default_and_the_shared_meaning(capsys):
    assert keys.main(["actor.model.tiny.lora_rank"]) == 0
    tiny = capsys.readouterr().out.splitlines()
    assert keys.main(["actor.model.sd3.lora_rank"]) == 0
    sd3 = capsys.readouterr().out.splitlines()
    assert tiny[0].startswith("actor.model.tiny.lora_rank: int = 16") and sd3[0].startswith("actor.model.sd3."
                                                                                             "lora_rank: int = 32")
    assert tiny[1] == sd3[1] == "    LoRA rank r"  # TinySettings changes the default, not the meaning


def test_keys_with_an_unknown_prefix_names_the_nearest_keys(capsys):
    assert keys.main(["actor.optm"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("rlrunner: error: no recipe key 'actor.optm' (nearest: actor.optim")


def test_bin_rlrunner_keys_runs_the_command():
    result = rlrunner("keys", "runner.logger")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("runner.logger.log_path: str = \"logs\"")


def test_plan_without_a_recipe_says_the_name_is_missing(capsys):
    assert plan.main([]) == 2
    err = capsys.readouterr().err
    assert err == ("rlrunner: error: the recipe name is missing: bin/rlrunner plan <config_name> [key=value ...]; "
                   "bin/rlrunner train --help lists the recipes\n")


@pytest.mark.parametrize("command", ["train", "plan", "keys", "export", "serve_reward"])
def test_every_commands_help_names_it_as_bin_rlrunner_does(command):
    result = rlrunner(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: bin/rlrunner {command}")
    usage = result.stdout.split("recipes:")[0]  # train's recipe list quotes the recipes' own comments
    assert "python -m rlrunner" not in usage and "run_diffusion.sh [" not in usage


def test_bin_rlrunner_help_lists_keys_and_every_exit_status():
    result = rlrunner("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: bin/rlrunner <command>")
    assert "bin/rlrunner keys [prefix]" in result.stdout
    statuses = result.stdout.split("Exit status")[1]
    assert [int(code) for code in re.findall(r"(?:^|\s)(\d+) [a-z]", statuses)] == EXIT_CODES


def test_the_docs_home_documents_every_exit_status_and_the_readme_links_there():
    """One table of exit statuses, on the docs site's home; the landing page names the common ones and links it."""
    home = (ROOT / "docs/index.md").read_text()
    table = home[home.index("| exit status | meaning |"):].split("\n\n")[0]
    assert [int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)] == EXIT_CODES
    readme = (ROOT / "README.md").read_text()
    assert "| exit status |" not in readme and "(docs/index.md#exit-statuses)" in readme
