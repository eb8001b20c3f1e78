"""The learned model of a workload's runs (`predictors.explore`): what it proposes, the
weight it earns, the tuner's fallback from a probe, and where scikit-learn loads."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from predictors.explore import Weight, earned_weight, propose
from predictors.state import TunerState
from predictors.tuner import LearnedTuner

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.9
GRID = [(w, d) for d in (2, 4, 8) for w in range(1, d + 1)]


@dataclass
class Record:
    """A run's configuration as `predictors.history.RunRecord` holds it (the fields
    the model reads)."""

    run_id: str
    workers: int
    depth: int
    utilization: float
    utilization_se: float = 0.01
    service_ms: list[float] = field(default_factory=lambda: [10.0] * 16)
    cpu_ms: float = 0.0
    step_ms: float = 5.0
    settled: bool = True
    batches: int = 64


def flat_prior(level: float, width: float = 0.02):
    """A prior that predicts `level` everywhere (lower bound `width` below)."""

    def prior(records, grid):
        point = np.full(len(grid), level)
        return point, point - width

    return prior


def by_depth(levels: dict[int, float]):
    def prior(records, grid):
        point = np.array([levels[d] for _, d in grid])
        return point, point - 0.02

    return prior


def met_runs(n: int = 3) -> list[Record]:
    return [Record(f"r{i}", 4, 8, 0.95) for i in range(n)]


def test_probes_one_step_cheaper_where_the_lower_bound_meets() -> None:
    records = met_runs()
    p = propose(records, by_depth({2: 0.5, 4: 0.97, 8: 0.97}), GRID, TARGET)
    assert p.start == (4, 8)
    assert p.probe and p.depth == 4 and p.fallback == (4, 8)
    assert p.lower >= TARGET


def test_no_probe_where_the_lower_bound_misses() -> None:
    records = met_runs()
    p = propose(records, by_depth({2: 0.5, 4: 0.89, 8: 0.97}), GRID, TARGET)
    assert (p.workers, p.depth) == (4, 8) and not p.probe and p.fallback is None


def test_a_measured_miss_nearby_stops_the_gp_probe() -> None:
    # The prior says depth 4 meets; a run measured (4, 4) far below it. At weight 1 the
    # GP carries that miss to the other depth-4 configurations: no probe there.
    records = [*met_runs(), Record("r3", 4, 4, 0.6), Record("r3", 4, 8, 0.95)]
    prior = by_depth({2: 0.5, 4: 0.97, 8: 0.97})
    with_gp = propose(records, prior, GRID, TARGET, weight=Weight(1.0, 4, 0.0, 0.1, "test"))
    assert not with_gp.probe and (with_gp.workers, with_gp.depth) == (4, 8)
    # Without the model only the measured configuration is ruled out.
    alone = propose(records, prior, GRID, TARGET, weight=Weight(0.0, 4, None, None, "test"))
    assert alone.probe and alone.depth == 4 and alone.workers != 4


def test_weight_is_zero_until_three_runs() -> None:
    w = earned_weight(met_runs(2), flat_prior(0.7))
    assert w.weight == 0 and "needs 3" in w.why


def test_weight_earned_where_the_model_predicts_better() -> None:
    # The prior is 0.2 low everywhere, the truth smooth: each run at a new
    # configuration, the history alone predicts the prior there, the GP its neighbours.
    configs = [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8)]
    records = [Record(f"r{i}", w, d, 0.9) for i, (w, d) in enumerate(configs)]
    w = earned_weight(records, flat_prior(0.7))
    assert w.weight > 0, w.why
    assert w.model_error < w.history_error


def test_weight_is_zero_where_the_model_predicts_worse() -> None:
    # The prior is right on average, but neighbouring configurations err in opposite
    # directions: the GP carries each one's error to the next, where it is wrong.
    configs = [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8)]
    truth = [0.85, 0.65, 0.85, 0.65, 0.85]
    pairs = enumerate(zip(configs, truth, strict=True))
    records = [Record(f"r{i}", w, d, u) for i, ((w, d), u) in pairs]
    w = earned_weight(records, flat_prior(0.75))
    assert w.weight == 0, w.why
    assert w.model_error >= w.history_error


def _states(workers: int, depth: int, batches: int, stall_ms: float, start: int = 0):
    for k in range(start, start + batches):
        yield TunerState(
            batch_index=k,
            workers=workers,
            depth=depth,
            batch_size=64,
            step_ms=10.0,
            stall_ms=stall_ms,
            read_ms=30.0,
            decode_ms=1.0,
            bytes_per_batch=1e6,
            memory_bytes=depth * 1e6,
            cpu_count=4,
            batch_memory_bytes=1e6,
            cpu_ms=1.0,
        )


def test_a_probe_that_measures_a_miss_falls_back_after_two_blocks() -> None:
    tuner = LearnedTuner(target_utilization=TARGET, start=(2, 2), fallback=(4, 8))
    decisions = [tuner.decide(s) for s in _states(2, 2, 40, stall_ms=10.0)]
    back = [d for d in decisions if (d.workers, d.depth) == (4, 8)]
    assert back, [d.reason for d in decisions]
    assert "back to 4/8" in back[0].reason
    # Judged on two blocks of 8 settled batches (the first batch and the settling
    # ones are no sample), not on its first few, and not a full window later.
    assert 16 <= decisions.index(back[0]) <= 24


def test_a_probe_whose_first_batches_stall_but_that_meets_is_kept() -> None:
    tuner = LearnedTuner(target_utilization=TARGET, start=(2, 2), fallback=(4, 8))
    states = [*_states(2, 2, 3, stall_ms=5.0), *_states(2, 2, 60, stall_ms=0.0, start=3)]
    decisions = [tuner.decide(s) for s in states]
    assert all((d.workers, d.depth) != (4, 8) for d in decisions), [d.reason for d in decisions]
    assert not tuner.fell_back


def test_a_probe_that_meets_keeps_its_configuration() -> None:
    tuner = LearnedTuner(target_utilization=TARGET, start=(2, 2), fallback=(4, 8))
    decisions = [tuner.decide(s) for s in _states(2, 2, 40, stall_ms=0.0)]
    assert all((d.workers, d.depth) != (4, 8) for d in decisions)
    assert tuner.fallback is None  # judged: the guard is spent


def _loaded(code: str, tmp_path: Path) -> list[str]:
    code += "\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
    env["IOLIB_HISTORY"] = str(tmp_path / "history")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


def test_import_iolib_does_not_load_scikit_learn(tmp_path: Path) -> None:
    assert _loaded("import sys\nimport iolib\nimport predictors.explore", tmp_path) == []


def test_a_loader_without_history_does_not_load_scikit_learn(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq\n"
        "from iolib import DataLoader\n"
        "from iolib.sources import ParquetSource\n"
        f"path = {str(tmp_path / 'rows.parquet')!r}\n"
        "pq.write_table(pa.table({'x': np.arange(512)}), path, row_group_size=64)\n"
        "loader = DataLoader(ParquetSource(path), batch_size=16, prefetch='auto',\n"
        "                    target_utilization=0.9, num_workers=2)\n"
        "n = sum(1 for _ in loader)\n"
        "loader.close()\n"
        "assert n == 32, n\n"
    )
    assert _loaded(code, tmp_path) == []


def test_a_proposal_from_history_loads_scikit_learn(tmp_path: Path) -> None:
    # The positive control: the model does load it, when it has runs to fit.
    code = (
        "import sys, numpy as np\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_explore import Record, flat_prior\n"
        "from predictors.explore import Weight, propose\n"
        "recs = [Record(f'r{i}', 2, 4, 0.95) for i in range(3)]\n"
        "propose(recs, flat_prior(0.9), [(1, 2), (2, 4)], 0.9,\n"
        "        weight=Weight(1.0, 3, 0.0, 0.1, 'test'))\n"
    )
    assert "sklearn" in _loaded(code, tmp_path)


@pytest.mark.parametrize("explore", [True, False])
def test_no_probe_without_a_measured_meet(explore: bool) -> None:
    records = [Record("r0", 2, 4, 0.6), Record("r1", 2, 4, 0.62), Record("r2", 2, 4, 0.61)]
    p = propose(records, by_depth({2: 0.5, 4: 0.8, 8: 0.95}), GRID, TARGET, explore=explore)
    assert not p.probe and p.depth == 8


def _run_records(n: int, utilization: float = 0.97, configs=None) -> list:
    from predictors.history import RunRecord

    configs = configs or [(4, 8)] * n
    return [
        RunRecord(
            workload="w",
            run_id=f"run{i}",
            rank=0,
            started=1000.0 + i,
            source="auto",
            workers=configs[i][0],
            depth=configs[i][1],
            batch_size=64,
            storage_ms=30.0,
            decode_ms=1.0,
            cpu_ms=1.0,
            service_ms=[31.0] * 32,
            utilization=utilization,
            utilization_se=0.01,
            memory_bytes=configs[i][1] * 1_000_000,
            step_ms=10.0,
            batches=64,
            target=TARGET,
            met=utilization >= TARGET,
            settled=True,
        )
        for i in range(n)
    ]


def test_a_warm_start_probes_and_its_guard_falls_back() -> None:
    from predictors.history import WarmStart

    # 31 ms a batch and a 10 ms step: the prior expects 0.65 of 2 workers, every run
    # measured them saturated. Leaving a run out, the history alone predicts the prior
    # there, the GP the others' residual: it earns its weight, and probes depth 3.
    configs = [(2, 4), (2, 6), (2, 8)]
    warm = WarmStart.from_records(_run_records(3, 1.0, configs), TARGET, memory_budget=64e6)
    tuner = LearnedTuner(target_utilization=TARGET, memory_budget_bytes=64e6, warm=warm)
    assert tuner.start == (2, 4)  # the history's, until the first decision
    first = tuner.decide(next(_states(2, 4, 1, stall_ms=0.0)))
    p = tuner.proposal
    assert p is not None and p.weight.weight > 0 and p.probe, p
    assert (first.workers, first.depth) == (p.workers, p.depth) and p.depth < 4
    assert tuner.fallback == (2, 4)
    decisions = [tuner.decide(s) for s in _states(p.workers, p.depth, 40, stall_ms=10.0, start=1)]
    assert any((x.workers, x.depth) == (2, 4) and "back to" in x.reason for x in decisions)
    report = tuner.history_model
    assert report["fell_back"] and report["measured_utilization"] < TARGET


def test_no_probe_where_the_model_earned_no_weight() -> None:
    from predictors.history import WarmStart

    # Every run measured the same configuration: the GP predicts it no better than
    # the pooled measurement, so it earns no weight and the run starts where they met.
    warm = WarmStart.from_records(_run_records(3), TARGET, memory_budget=64e6)
    tuner = LearnedTuner(target_utilization=TARGET, memory_budget_bytes=64e6, warm=warm)
    first = tuner.decide(next(_states(4, 8, 1, stall_ms=0.0)))
    assert (first.workers, first.depth) == (4, 8)
    assert tuner.proposal.weight.weight == 0 and not tuner.proposal.probe


def test_a_warm_start_without_explore_starts_where_the_history_met() -> None:
    from predictors.history import WarmStart

    warm = WarmStart.from_records(_run_records(3), TARGET, memory_budget=64e6)
    tuner = LearnedTuner(
        target_utilization=TARGET, memory_budget_bytes=64e6, warm=warm, explore=False
    )
    first = tuner.decide(next(_states(4, 8, 1, stall_ms=0.0)))
    assert (first.workers, first.depth) == (4, 8) and tuner.fallback is None
    assert tuner.proposal is not None and not tuner.proposal.probe


def test_warm_runs_hold_the_memory_their_history_met_with() -> None:
    from benchmarks.scenarios import MAX_WORKERS, draw, oracle
    from benchmarks.tuner_history_study import _tuner, drive, records_of
    from predictors.history import WarmStart

    # A simulated storage-bound workload whose tuner, cold, ends some runs a depth step
    # above the least memory that meets (a few slow batches at the threshold). Warm
    # runs weigh what the earlier runs measured there: they stay within 1.25x of the
    # oracle's memory and meet the target over their last third, every run.
    s = draw("storage-threads", 600)
    best = oracle(s)["memory"]
    metrics, states = drive(s, _tuner(s), 101)
    records = records_of("run1", states, s, 1)
    for k in range(2, 6):
        warm = WarmStart.from_records(
            records, s.target, memory_budget=s.budget, max_workers=MAX_WORKERS
        )
        metrics, states = drive(s, _tuner(s, warm), 100 + k)
        assert metrics["memory"] <= 1.25 * best, (k, metrics)
        assert metrics["utilization"] >= s.target, (k, metrics)
        records += records_of(f"run{k}", states, s, k)


def _weight_from_errors(monkeypatch, model_err: list[float], history_err: list[float]):
    """`earned_weight` where leaving run i out, the model errs by model_err[i] and the
    history alone by history_err[i] on its one configuration (truth 0.9)."""
    import predictors.explore as explore

    records = [Record(f"r{i}", 2, 2 * (i + 1), 0.9) for i in range(len(model_err))]

    def left_out(rest) -> int:
        ids = {r.run_id for r in rest}
        return next(i for i in range(len(records)) if f"r{i}" not in ids)

    monkeypatch.setattr(explore, "history_predict", lambda rest, prior, grid: (
        np.array([0.9 - history_err[left_out(rest)]]), None))  # fmt: skip
    monkeypatch.setattr(explore, "model_predict", lambda rest, prior, grid: (
        np.array([0.9 - model_err[left_out(rest)]]), None, None))  # fmt: skip
    return earned_weight(records, flat_prior(0.75))


def test_a_gain_within_its_spread_earns_no_weight(monkeypatch) -> None:
    """Better on average by 0.005 with run-to-run swings of 0.1: weight 0 (before: about
    0.1, and on a real S3 workload such a weight made the model probe and lose)."""
    w = _weight_from_errors(monkeypatch, [0.0, 0.19, 0.0, 0.19], [0.1, 0.1, 0.1, 0.1])
    assert w.model_error < w.history_error
    assert w.weight == 0, w.why
    assert "spread" in w.why


def test_a_steady_gain_earns_its_weight(monkeypatch) -> None:
    """Half the history's error on every run: the whole weight the ratio gives."""
    w = _weight_from_errors(monkeypatch, [0.05, 0.05, 0.051, 0.049], [0.1, 0.1, 0.1, 0.1])
    assert w.weight == pytest.approx(0.75, abs=0.03), w.why
