"""`run bench`: the measuring core (cold, warm-up, interleaved rounds, medians and spread), the
JSON result's shape, references that are not installed skipped with a line, and one real
end-to-end run on a tiny model against sentence-transformers. Nothing here is timed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from taskrun.runner.bench import core as bench_core
from taskrun.runner.bench import embed as bench_embed
from taskrun.runner.bench import host as bench_host
from taskrun.runner.bench import suites as bench_suites
from taskrun.runner.bench.core import Contender, measure, order_of, report
from taskrun.runner.cli import main
from tests.tiny.bert import build


class FakeClock:
    """A clock that each contender's run advances by its own fixed cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def contender(name, clock, cost, calls, role="reference", load_cost=1.0):
    def load():
        clock.now += load_cost
        calls.append(f"load {name}")

        def run():
            clock.now += cost
            calls.append(name)
            return name.upper()

        return run

    return Contender(name, load, role)


def test_rounds_alternate_their_order():
    assert order_of(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_measure_is_cold_then_warmup_then_interleaved_rounds():
    clock, calls = FakeClock(), []
    cs = [contender("ours", clock, 1.0, calls, "taskrun"), contender("ref", clock, 2.0, calls)]
    measured, trace = measure(cs, rounds=2, warmup=1, clock=clock)
    assert trace == [
        "load:ours",
        "cold:ours",
        "load:ref",
        "cold:ref",
        "warmup:ours",
        "warmup:ref",
        "round1:ours",
        "round1:ref",
        "round2:ref",
        "round2:ours",
    ]
    assert calls == ["load ours", "ours", "load ref", "ref", "ours", "ref", "ours", "ref", "ref", "ours"]
    ours, ref = measured
    assert ours.load_s == 1.0 and ours.cold_s == 1.0 and ours.runs_s == [1.0, 1.0]
    assert ref.runs_s == [2.0, 2.0] and ref.output == "REF"


def test_report_has_medians_spread_ratios_and_skips():
    m = [
        bench_core.Measured("taskrun", "taskrun", "", 0.5, 3.0, [1.0, 2.0, 4.0], None),
        bench_core.Measured("ref", "reference", "", 0.1, 5.0, [4.0, 4.0, 4.0], None),
    ]
    out = report(
        "embed",
        "minilm",
        3,
        100,
        "sentences",
        m,
        [bench_core.Skipped("onnxruntime", "not installed")],
        ["x"],
        {"ref": {"min_cosine": 0.9999}},
    )
    json.dumps(out)  # plain JSON
    ours, ref = out["contenders"]
    assert ours["warm"] == {"median_s": 2.0, "min_s": 1.0, "max_s": 4.0, "spread": 1.5, "runs_s": [1.0, 2.0, 4.0]}
    assert ours["sentences_per_s"] == 50.0 and ref["sentences_per_s"] == 25.0
    assert out["ratios"] == {"taskrun / ref": 2.0}
    assert ref["quality"] == {"min_cosine": 0.9999}
    assert out["skipped"] == [{"name": "onnxruntime", "reason": "not installed"}]
    assert out["host"]["cpus"] >= 1 and out["order"] == ["x"]


def test_a_reference_that_is_not_installed_is_skipped_with_a_line(monkeypatch, tmp_path):
    import numpy as np
    import soundfile as sf

    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    monkeypatch.setattr(bench_suites, "missing", lambda module: module == "faster_whisper")
    suite = bench_suites.transcribe(None, (), [wav], quick=True)
    assert [c.name for c in suite.contenders] == [
        "taskrun",
        "taskrun --beam-size 5",
        "taskrun --batch-size 8",
        "taskrun passive waits",
    ]
    assert {s.name for s in suite.skipped} == {
        "faster-whisper greedy",
        "faster-whisper beam 5",
        "faster-whisper batched",
    }
    assert all("pip install faster-whisper" in s.reason for s in suite.skipped)


def test_against_picks_the_references():
    suite = bench_embed.embed(None, ("sentence",), [], quick=True)
    assert [c.name for c in suite.contenders] == ["taskrun", "sentence-transformers"]
    suite = bench_embed.embed(None, ("onnxruntime",), [], quick=True)
    if bench_suites.missing("onnx"):
        assert [c.name for c in suite.contenders] == ["taskrun"] and suite.skipped[0].name == "onnxruntime"
    else:  # the ONNX Runtime reference: its own plain export of the same folder
        assert [c.name for c in suite.contenders] == ["taskrun", "onnxruntime"] and not suite.skipped


def test_unknown_task_names_the_choices():
    r = CliRunner().invoke(main, ["bench", "dance"])
    assert r.exit_code != 0 and "transcribe" in r.output


def test_bench_embed_on_a_tiny_model_against_sentence_transformers(tiny_dir, tmp_path):
    pytest.importorskip("sentence_transformers")
    texts = tmp_path / "lines.txt"
    texts.write_text("the cat\na dog\nstock prices fell\n")
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "embed",
            "--model",
            str(build(tiny_dir)),
            "--rounds",
            "2",
            "--input",
            str(texts),
            "--against",
            "sentence-transformers",
            "--json",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    assert [c["name"] for c in result["contenders"]] == ["taskrun", "sentence-transformers"]
    assert result["units_per_run"] == 3 and result["unit"] == "sentences"
    assert [t for t in result["order"] if t.startswith("round")] == [
        "round1:taskrun",
        "round1:sentence-transformers",
        "round2:sentence-transformers",
        "round2:taskrun",
    ]
    for c in result["contenders"]:
        assert len(c["warm"]["runs_s"]) == 2 and c["cold_s"] > 0 and c["sentences_per_s"] > 0
    # the same weights: sentence-transformers' vectors match taskrun's
    assert result["contenders"][1]["quality"]["min_cosine_vs_taskrun"] > 0.999
    assert list(result["ratios"]) == ["taskrun / sentence-transformers"]


# ------------------------------------------------------------------ a process per contender


def _pid_contender(name, role="reference"):
    def load():
        import os

        os.environ["TASKRUN_BENCH_LOADED"] = os.environ.get("TASKRUN_BENCH_LOADED", "") + name

        def run():
            return {"pid": os.getpid(), "loaded_here": os.environ["TASKRUN_BENCH_LOADED"]}

        return run

    return Contender(name, load, role)


def test_isolated_contenders_each_run_in_a_process_of_their_own(monkeypatch):
    import os

    monkeypatch.delenv("TASKRUN_BENCH_LOADED", raising=False)
    cs = [_pid_contender("ours", "taskrun"), _pid_contender("ref")]
    measured, trace = measure(cs, rounds=2, warmup=1, isolate=True)
    assert trace == [
        "load:ours",
        "cold:ours",
        "load:ref",
        "cold:ref",
        "warmup:ours",
        "warmup:ref",
        "round1:ours",
        "round1:ref",
        "round2:ref",
        "round2:ours",
    ]
    ours, ref = (m.output for m in measured)
    assert len({ours["pid"], ref["pid"], os.getpid()}) == 3
    # what one contender's load did to its process is not seen by the other (nor by this one)
    assert ours["loaded_here"] == "ours" and ref["loaded_here"] == "ref"
    assert "TASKRUN_BENCH_LOADED" not in os.environ
    assert all(len(m.runs_s) == 2 and m.cold_s > 0 for m in measured)
    # in one process, the second contender sees the first's state: what isolation is for
    measured, _ = measure([_pid_contender("ours", "taskrun"), _pid_contender("ref")], rounds=1, isolate=False)
    assert measured[1].output["loaded_here"] == "oursref" and measured[1].output["pid"] == os.getpid()


def test_an_isolated_contender_that_fails_gives_its_error_and_leaves_no_process():
    import multiprocessing

    from taskrun.tasks.base import TaskError

    def refuse():
        raise TaskError("no model named 'nope': pass --model")

    with pytest.raises(TaskError, match="no model named 'nope': pass --model"):
        measure([_pid_contender("ours", "taskrun"), Contender("ref", refuse)], rounds=1, isolate=True)

    def crash():
        def run():
            raise ValueError("bad shape")

        return run

    with pytest.raises(bench_core.ContenderFailed, match="ref: ValueError: bad shape") as err:
        measure([Contender("ref", crash)], rounds=1, isolate=True)
    assert "\n" not in str(err.value)  # one line; the worker's traceback only with TASKRUN_DEBUG=1

    class CacheFull(TaskError):  # a TaskError of another kind is still the user's to fix
        pass

    def full():
        raise CacheFull("the cache is full: free space or set TASKRUN_CACHE_DIR")

    with pytest.raises(TaskError, match="^the cache is full: free space or set TASKRUN_CACHE_DIR$"):
        measure([Contender("ref", full)], rounds=1, isolate=True)
    assert not multiprocessing.active_children()


def test_bench_result_says_whether_contenders_were_isolated(monkeypatch):
    monkeypatch.setattr(bench_core, "can_isolate", lambda: False)
    from taskrun.runner.commands import bench as bench_cmd

    calls = {}
    real = bench_core.measure

    def spy(*a, **kw):
        calls["isolate"] = kw.get("isolate")
        return real(*a, **kw)

    monkeypatch.setattr(bench_core, "measure", spy)
    monkeypatch.setattr(
        bench_cmd,
        "suite_for",
        lambda *a: bench_suites.Suite("embed", "m", "sentences", 1, [_pid_contender("taskrun", "taskrun")]),
    )
    out = bench_cmd.bench("embed", rounds=1)
    assert out["isolated"] is False and calls["isolate"] is False


def test_busy_neighbours_spin_for_the_run_and_are_gone_after(monkeypatch):
    with bench_core.busy_neighbours(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
    from taskrun.runner.commands import bench as bench_cmd

    monkeypatch.setattr(
        bench_cmd,
        "suite_for",
        lambda *a: bench_suites.Suite("embed", "m", "sentences", 1, [_pid_contender("taskrun", "taskrun")]),
    )
    result = CliRunner().invoke(main, ["bench", "embed", "--rounds", "1", "--busy", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["host"]["busy_neighbours"] == 1 and out["isolated"] is True


def test_a_contender_that_needs_its_own_process_is_skipped_in_process(monkeypatch):
    from taskrun.runner.commands import bench as bench_cmd

    spin = Contender(
        "taskrun spinning",
        bench_suites.with_env({"TASKRUN_BENCH_X": "1"}, _pid_contender("x").load),
        "taskrun",
        own_process=True,
    )
    monkeypatch.delenv("TASKRUN_BENCH_X", raising=False)
    monkeypatch.setattr(
        bench_cmd,
        "suite_for",
        lambda *a: bench_suites.Suite("embed", "m", "sentences", 1, [_pid_contender("taskrun", "taskrun"), spin]),
    )
    out = bench_cmd.bench("embed", rounds=1, isolate=False)
    assert [c["name"] for c in out["contenders"]] == ["taskrun"]
    assert out["skipped"] == [
        {"name": "taskrun spinning", "reason": "needs a process of its own (leave out --in-process)"}
    ]
    out = bench_cmd.bench("embed", rounds=1, isolate=True)
    assert [c["name"] for c in out["contenders"]] == ["taskrun", "taskrun spinning"]
    import os

    assert "TASKRUN_BENCH_X" not in os.environ  # set in the contender's process only


def test_the_transcribe_suite_has_a_passive_taskrun_in_its_own_process():
    suite = bench_suites.transcribe(None, (), [], False)
    own = [c for c in suite.contenders if c.own_process]
    assert [c.name for c in own] == ["taskrun passive waits"] and own[0].role == "taskrun"


def _torch_matmul():
    import torch

    a = torch.ones(256, 256)
    return lambda: float((a @ a)[0, 0])


def test_isolation_works_after_this_process_ran_torchs_thread_pool():
    """A forked worker died here (libgomp's pool does not survive a fork); spawned ones do not."""
    import torch

    torch.ones(512, 512) @ torch.ones(512, 512)  # this process's OpenMP pool has run
    measured, _ = measure([Contender("ref", _torch_matmul)], rounds=1, isolate=True)
    assert measured[0].output == 256.0


def test_a_loader_that_cannot_travel_leaves_no_worker_behind():
    import multiprocessing
    import threading

    lock = threading.Lock()  # cloudpickle cannot send a lock to another process
    with pytest.raises(TypeError):
        measure(
            [_pid_contender("ours", "taskrun"), Contender("ref", lambda: (lock, lambda: 1)[1])], rounds=1, isolate=True
        )
    assert not multiprocessing.active_children()


def _hang_contender(name, where):
    """A contender whose load or (second) run never ends, as a stuck reference's would."""

    def load():
        import time

        if where == "load":
            time.sleep(3600)
        calls = []

        def run():
            calls.append(1)
            if where == "run" and len(calls) > 1:  # the cold call answers; the warm-up hangs
                time.sleep(3600)
            return len(calls)

        return run

    return Contender(name, load)


def test_a_contender_past_the_timeout_is_stopped_and_the_others_finish():
    import multiprocessing
    import time

    cs = [_pid_contender("ours", "taskrun"), _hang_contender("stuck run", "run"), _hang_contender("stuck load", "load")]
    t = time.monotonic()
    measured, trace = measure(cs, rounds=2, isolate=True, timeout=3, keep_going=True)
    assert time.monotonic() - t < 60  # not an hour
    ours, run, load = measured
    assert not ours.failed and len(ours.runs_s) == 2
    assert (
        run.failed == "stuck run: its run gave no answer in 3 s and its worker was stopped (--timeout raises the limit)"
    )
    assert load.failed.startswith("stuck load: its load gave no answer in 3 s") and not load.runs_s
    assert trace.count("failed:stuck run") == 1 and "round1:stuck run" not in trace
    assert "cold:stuck run" in trace and "round2:ours" in trace
    assert not multiprocessing.active_children()
    out = report("embed", "m", 2, 10, "sentences", measured, [], trace)
    assert [c["name"] for c in out["contenders"]] == ["ours"]
    assert [f["name"] for f in out["failed"]] == ["stuck run", "stuck load"] and out["ratios"] == {}
    # without keep_going the first failure stops the measurement, and no worker is left behind
    with pytest.raises(bench_core.ContenderFailed, match="stuck load: its load gave no answer in 1 s"):
        measure(
            [_hang_contender("stuck load", "load"), _pid_contender("ours", "taskrun")],
            rounds=1,
            isolate=True,
            timeout=1,
        )
    assert not multiprocessing.active_children()


def _crash_contender(name):
    def load():
        def run():
            raise ValueError("bad shape")

        return run

    return Contender(name, load)


def test_run_bench_reports_a_failed_reference_measures_the_rest_and_exits_non_zero(monkeypatch):
    from taskrun.runner.commands import bench as bench_cmd

    monkeypatch.setattr(
        bench_cmd,
        "suite_for",
        lambda *a: bench_suites.Suite(
            "embed", "m", "sentences", 1, [_pid_contender("taskrun", "taskrun"), _crash_contender("ref")]
        ),
    )
    result = CliRunner().invoke(main, ["bench", "embed", "--rounds", "1", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert [c["name"] for c in out["contenders"]] == ["taskrun"]
    assert out["failed"] == [{"name": "ref", "role": "reference", "reason": "ref: ValueError: bad shape"}]
    assert "1 contender(s) failed: ref" in result.stderr
    result = CliRunner().invoke(main, ["bench", "embed", "--rounds", "1"])
    assert result.exit_code == 1 and "failed: ref: ValueError: bad shape" in result.stdout


ZEN3 = """processor\t: 0
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse2 avx f16c fma avx2 bmi2 sha_ni
"""
SAPPHIRE = """model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile
"""


def test_host_facts_name_the_cpu_and_the_instruction_sets_that_pick_the_kernels():
    assert bench_host.cpu_facts(ZEN3) == {"cpu": "AMD EPYC 7B13 64-Core Processor", "isa": ["avx2", "fma", "f16c"]}
    assert bench_host.cpu_facts(SAPPHIRE)["isa"] == [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "amx_bf16",
        "amx_int8",
    ]
    assert bench_host.cpu_facts("") == {"cpu": None, "isa": []}


def test_memory_bandwidth_is_a_copys_bytes_read_and_written_over_its_best_time(monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.75])  # copies of 0.5, 0.25 and 0.75 s
    monkeypatch.setattr(bench_host.time, "perf_counter", lambda: next(ticks))
    # 64 MiB read + 64 MiB written in the best copy's 0.25 s
    assert bench_host.memory_bandwidth_gbs(mib=64, repeats=3) == round(2 * 64 * 2**20 / 0.25 / 1e9, 1)
    monkeypatch.undo()
    real = bench_host.memory_bandwidth_gbs(mib=16, repeats=2)
    assert real is None or real > 0


def test_run_bench_measures_the_host_before_the_contenders_and_prints_it(monkeypatch):
    from taskrun.runner.commands import bench as bench_cmd

    events = []
    monkeypatch.setattr(bench_host, "memory_bandwidth_gbs", lambda: events.append("bandwidth") or 31.5)
    zen3 = bench_host.cpu_facts(ZEN3)
    monkeypatch.setattr(bench_host, "cpu_facts", lambda: zen3)
    ticks = iter([(10, 1000), (13, 1100)] * 2)  # 3 of 100 ticks stolen during each run
    monkeypatch.setattr(bench_host, "cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(
        bench_cmd,
        "suite_for",
        lambda *a: bench_suites.Suite("embed", "m", "sentences", 1, [_pid_contender("taskrun", "taskrun")]),
    )
    real = bench_core.measure
    monkeypatch.setattr(bench_core, "measure", lambda *a, **kw: events.append("measure") or real(*a, **kw))
    result = CliRunner().invoke(main, ["bench", "embed", "--rounds", "1", "--in-process"])
    assert result.exit_code == 0, result.output
    assert events == ["bandwidth", "measure"]
    assert (
        "AMD EPYC 7B13 64-Core Processor · avx2 fma f16c · memory 31.5 GB/s · 3.0% of CPU time stolen" in result.output
    )
    out = bench_cmd.bench("embed", rounds=1, isolate=False)
    assert out["host"]["memory_bandwidth_gbs"] == 31.5 and out["host"]["isa"] == ["avx2", "fma", "f16c"]
    assert out["host"]["cpu_steal_pct"] == 3.0


def test_cpu_steal_is_the_stolen_share_of_the_ticks_between_two_readings():
    before = bench_host.cpu_ticks("cpu  100 0 50 800 10 0 5 35 0 0\n")
    after = bench_host.cpu_ticks("cpu  200 0 60 900 10 0 5 55 0 0\n")
    assert before == (35, 1000) and after == (55, 1230)
    assert bench_host.steal_pct(before, after) == round(100 * 20 / 230, 1)
    assert bench_host.steal_pct(None, after) is None and bench_host.steal_pct(after, after) is None
    assert bench_host.cpu_ticks("intr 1 2 3") is None


def test_what_a_taskrun_job_ran_with_is_in_the_result_and_the_table():
    from types import SimpleNamespace

    from taskrun.runner.commands import bench as bench_cmd

    job = SimpleNamespace(card=SimpleNamespace(extra={"ran": ["CTranslate2's threads wait passively (why)"]}))
    measured = [
        bench_core.Measured("taskrun", "taskrun", "", 1.0, 1.0, [1.0], job),
        bench_core.Measured("ref", "reference", "", 1.0, 1.0, [1.0], ["text"]),
    ]
    out = report("transcribe", "m", 1, 10.0, "audio_s", measured, [], [])
    assert out["contenders"][0]["ran"] == ["CTranslate2's threads wait passively (why)"]
    assert "ran" not in out["contenders"][1]
    assert "ran: taskrun: CTranslate2's threads wait passively (why)" in bench_cmd.table(out)
    assert "noisy host" not in bench_cmd.table(out | {"host": out["host"] | {"cpu_steal_pct": 2.8}})
    noisy = bench_cmd.table(out | {"host": out["host"] | {"cpu_steal_pct": 7.5}})
    assert "noisy host: the hypervisor took 7.5% of this VM's CPU time" in noisy
