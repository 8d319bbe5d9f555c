"""bench/algorithms.py's gains table, from run folders laid out as its runs leave them."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_algorithms", ROOT / "bench" / "algorithms.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write_run(out: Path, name: str, seed: int, evals: dict[int, float]) -> None:
    run_dir = out / "runs" / f"{name}-seed{seed}" / "20261206-000000-tiny_nft_ocr"
    run_dir.mkdir(parents=True)
    lines = [{"step": step, "train/reward": 0.5} for step in range(1, max(evals) + 1)]
    lines += [{"step": step, "eval/avg": value} for step, value in evals.items()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_gains_has_each_seeds_gain_its_mean_and_a_blank_for_a_seed_not_run(tmp_path):
    bench = load_bench()
    write_run(tmp_path, "nft_k2", 42, {0: 0.75, 10: 0.78, 20: 0.80})  # gain +0.050
    write_run(tmp_path, "nft_k2", 1, {0: 0.74, 10: 0.70, 20: 0.77})  # gain +0.030
    write_run(tmp_path, "nft_opt2", 42, {0: 0.75, 10: 0.70})  # gain -0.050, one seed: no mean
    # `nft` has no runs here: no row
    table = bench.gains(["nft", "nft_k2", "nft_opt2"], [42, 1, 2], tmp_path, {"nft": 5.0, "nft_k2": 7.0, "nft_opt2": 5.8})
    lines = table.splitlines()
    assert lines[0] == "| variant | steps | s/step | seed 42 | seed 1 | seed 2 | mean |"
    k2 = bench.VARIANTS["nft_k2"].description
    opt2 = bench.VARIANTS["nft_opt2"].description
    assert lines[2:] == [f"| {k2} | 20 | 7.00 | +0.050 | +0.030 |  | +0.040 |",
                         f"| {opt2} | 10 | 5.80 | -0.050 |  |  |  |"]


def test_steps_given_per_variant_are_parsed_and_a_bad_one_is_named(capsys):
    import argparse

    import pytest

    bench = load_bench()
    parser = argparse.ArgumentParser()
    assert bench.fixed_steps(["awm=83", "nft_now=100"], parser) == {"awm": 83, "nft_now": 100}
    for bad in ("awm", "awm=0", "nope=5"):
        with pytest.raises(SystemExit):
            bench.fixed_steps([bad], parser)
        assert f"--steps {bad!r}: expected VARIANT=N" in capsys.readouterr().err


def test_the_tables_are_stamped_with_the_lock_and_the_torch_build():
    sys.path.insert(0, str(ROOT / "bench"))
    from provenance import lock_hash, provenance

    stamp = provenance()
    assert f", lock {lock_hash()}, torch " in stamp and ", commit " in stamp
    assert len(lock_hash()) == 12


def test_a_run_still_running_is_left_out_of_the_tables(tmp_path):
    bench = load_bench()
    write_run(tmp_path, "awm", 42, {0: 0.75, 10: 0.78})
    (run_dir,) = (tmp_path / "runs" / "awm-seed42").iterdir()
    (run_dir / "config.yaml").write_text("runner:\n  max_steps: 83\n")  # evals up to step 10 of 83: still running
    assert bench.curve(tmp_path, "awm", 42) == {}
    (run_dir / "config.yaml").write_text("runner:\n  max_steps: 10\n")
    assert bench.curve(tmp_path, "awm", 42) == {0: 0.75, 10: 0.78}
