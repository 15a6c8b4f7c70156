"""The model suite on the CPU: tiny configs of every zoo model (smelt.tools.model_suite), each
(model, mode) judged by smelt.tools.accuracy against eager and a float64 run of the same weights.

`make test` runs this file under each CPU backend. By default it runs every model's fp32 inference,
and the training step, bf16 inference and the decoder modes for a few models (TRAIN_MODELS,
BF16_MODELS, DECODER_MODE_MODELS), which fit the suite's time budget; SMELT_MODEL_SUITE=full runs
every case (about 43 min per CPU backend on a loaded 2-core machine, training is 60% of it).
Models whose library (timm, transformers) is not installed are skipped.
"""
import os

import pytest
import torch

from conftest import BACKEND, DEVICE

from smelt.tools.model_suite import all_specs, cases, run_case
from smelt.tools.model_suite.spec import library_missing

CPU_BACKEND = os.environ.get("SMELT_CPU_BACKEND", "halide")

# Cases that fail today: (model, mode, CPU backend or None for both) -> what is wrong.
# strict: a case that starts passing fails the suite until its line is removed here.
KNOWN_FAILURES: dict = {}  # none today


# The default selection: one model of each family per mode beyond fp32 inference.
TRAIN_MODELS = {"resnet18", "vit", "bert", "llama", "t5", "transformer_encoder"}
BF16_MODELS = {"convnext", "swin", "deberta_v2", "llama", "whisper"}
DECODER_MODE_MODELS = {"gpt2", "llama"}
FULL = os.environ.get("SMELT_MODEL_SUITE", "") == "full"


def _selected(spec, mode) -> bool:
    if FULL or mode == "infer_fp32":
        return True
    if mode == "train":
        return spec.name in TRAIN_MODELS
    if mode == "infer_bf16":
        return spec.name in BF16_MODELS
    return spec.name in DECODER_MODE_MODELS


def _params():
    params = []
    for spec, mode in cases(all_specs().values()):
        if not _selected(spec, mode):
            continue
        marks = []
        for backend in (None, CPU_BACKEND):
            reason = KNOWN_FAILURES.get((spec.name, mode, backend))
            if reason and BACKEND == "smelt":
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(spec.name, mode, marks=marks, id=f"{spec.name}-{mode}"))
    return params


@pytest.mark.parametrize("model,mode", _params())
def test_model(model, mode, device, backend):
    spec = all_specs()[model]
    why = library_missing(spec)
    if why:
        pytest.skip(why)
    result = run_case(spec, mode, size="tiny", device=device, backend=backend)
    details = "" if result.status != "error" else "\n" + result.notes[-1]
    assert result.passed, f"{model} {mode} ({CPU_BACKEND}): {result.status}\n{result.message(12)}{details}"


def _off_by_five_percent(gm, example_inputs):
    """A backend that runs the graph and scales its floating outputs: a wrong compiler. 5%: well past
    what bfloat16 autocast leaves (on the GPU the training mode's eager error is ~0.5%, allowed 3x,
    and one bfloat16 rounding, 2**-8, is always allowed), where 1% passed."""
    def run(*args):
        outs = gm(*args)
        return type(outs)(o * 1.05 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs)
    return run


@pytest.mark.parametrize("mode", ["infer_fp32", "train"])
def test_runner_reports_a_wrong_compiler(mode):
    spec = all_specs()["multihead_attention"]
    result = run_case(spec, mode, size="tiny", device=DEVICE, backend=_off_by_five_percent)
    assert result.status == "fail", result
    assert any("rmse against float64" in f for f in result.failures), result.failures


def test_the_runner_works_where_torchs_test_utilities_froze_the_backend_flags(monkeypatch):
    # Importing torch.testing._internal freezes torch.backends' global flags; the runner's TF32 switch
    # set cuDNN's flag by assignment, which then raises (CI, fifty-seventh session).
    monkeypatch.setitem(torch.backends.flags_frozen.__globals__, "__allow_nonbracketed_mutation_flag", False)
    assert torch.backends.flags_frozen()
    result = run_case(all_specs()["multihead_attention"], "infer_fp32", size="tiny", device=DEVICE, backend="eager")
    assert result.passed, result.message(4)


def test_shards_merge_into_one_table():
    # scripts/model_suite_shards prints one table from each shard's JSON (report.py's __main__).
    from smelt.tools.model_suite import report
    from smelt.tools.model_suite.runner import CaseResult
    results = [CaseResult("gpt2", "dynamic", "tiny", "cpu", "pass"),
               CaseResult("llama", "decode", "tiny", "cpu", "fail", failures=["logits: off"])]
    again = report.from_json(report.to_json(results))
    assert report.markdown(again) == report.markdown(results)
    assert "1 passed, 1 failed" in report.markdown(again)


def test_each_case_line_carries_its_ratios():
    # A run stopped by a time limit before its table still shows every finished case's ratios.
    from smelt.tools.model_suite import report
    from smelt.tools.model_suite.runner import CaseResult
    timed = CaseResult("qwen2", "train", "real", "cuda", "pass", timings={
        "ms": {"eager": 40.0, "inductor": 20.0, "smelt": 16.0}, "compile_s": {"smelt": 30.0, "inductor": 50.0},
        "peak_bytes": {"eager": 400, "inductor": 210, "smelt": 200}})
    line = report.summary(timed)
    assert "40.00 / 20.00 / 16.00" in line, line
    assert "vs eager 2.50x" in line and "vs Inductor 1.25x" in line and "0.95x" in line and "30.0 / 50.0" in line, line
    assert report.summary(CaseResult("gpt2", "train", "tiny", "cpu", "pass")) == ""


def test_a_case_that_would_outrun_the_time_budget_is_not_begun(tmp_path, monkeypatch):
    # On the GPU machine a call's own limit kills the run: the forty-third session lost a finished
    # row's JSON and table to a case begun at 360 s of a 430-s budget. Now each finished case is in
    # the files at once, and a case starts only if the longest so far would end within the budget.
    import types
    from smelt.tools.model_suite import __main__ as suite_main
    from smelt.tools.model_suite import report, runner
    clock = [0.0]
    written = tmp_path / "suite.json"
    seen = []

    def fake_case(spec, mode, size, device, backend, **kw):
        seen.append(len(report.from_json(written.read_text())) if written.exists() else 0)
        clock[0] += 40.0
        return runner.CaseResult(spec.name, mode, size, device, "pass")

    monkeypatch.setattr(suite_main, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(runner, "run_case", fake_case)
    code = suite_main.main(["--device", "cpu", "--models", "gpt2,bert,llama", "--modes", "infer_fp32",
                            "--time-budget", "90", "--json", str(written)])
    assert code == 0
    statuses = [r.status for r in report.from_json(written.read_text())]
    assert statuses == ["pass", "pass", "skip"], statuses  # 80 + 40 > 90: the third is not begun
    assert seen == [0, 1], seen


def test_shards_sharing_a_gpu_time_one_at_a_time(tmp_path, monkeypatch):
    # scripts/model_suite_shards --timings: a shard's turns hold the shared lock file, so another
    # shard's turns (or the graphed rows' times) wait rather than share the GPU with them.
    import fcntl
    from smelt.tools.model_suite import timing
    lock = tmp_path / "timing.lock"
    held = []

    def probe(fn, device, calls):
        with open(lock, "a") as other:  # another open file: another shard's view of the lock
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(other, fcntl.LOCK_UN)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return 1.0

    monkeypatch.setattr(timing, "_steady_ms", probe)
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    result = {"ms": {}}
    timing._rounds({"eager": None, "smelt": None}, "cpu", 15, result, "a case")
    assert held and all(held), held
    assert result["ms"] == {"eager": 1.0, "smelt": 1.0}
    with open(lock, "a") as other:  # let go after the turns
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_cuda_graph_columns_compare_reserved_memory():
    # Under CUDA graphs a recording's memory is its pool's and Inductor's replays hand out outputs the
    # allocator does not count as allocated: the graph columns compare the reserved peaks.
    from smelt.tools.model_suite import report
    from smelt.tools.model_suite.runner import CaseResult
    timed = CaseResult("whisper", "train", "real", "cuda", "pass", timings={
        "ms": {"eager": 30.0, "inductor": 20.0, "smelt": 20.0, "inductor-ro": 10.0, "smelt-ro": 12.5},
        "compile_s": {"smelt": 30.0, "inductor": 50.0},
        "peak_bytes": {"eager": 400, "inductor": 400, "smelt": 400, "inductor-ro": 100, "smelt-ro": 800},
        "peak_reserved": {"eager": 500, "inductor": 500, "smelt": 500, "inductor-ro": 1000, "smelt-ro": 800}})
    row = report.markdown([timed]).splitlines()[2].split(" | ")
    assert row[8:12] == ["2.40x", "0.80x", "1.60x", "0.80x"], row


def test_a_graphs_only_row_shows_the_graphed_compile_times():
    # --graphs-only leaves the default-mode rows out: the compile cell reads the graphed rows'.
    from smelt.tools.model_suite import report
    from smelt.tools.model_suite.runner import CaseResult
    timed = CaseResult("deit", "infer_bf16", "real", "cuda", "pass", timings={
        "ms": {"eager": 3.0, "inductor-ro": 2.0, "smelt-ro": 1.6},
        "compile_s": {"smelt-ro": 4.0, "inductor-ro": 10.0},
        "peak_bytes": {}, "peak_reserved": {"eager": 500, "inductor-ro": 1000, "smelt-ro": 800}})
    row = report.markdown([timed]).splitlines()[2].split(" | ")
    assert row[3:6] == ["-", "-", "4.0 / 10.0"], row
    assert row[8:10] == ["1.88x", "1.25x"], row


def test_a_graphed_smelt_row_compiles_with_its_cache_folder(tmp_path):
    # The timed smelt-ro row asks for mode="reduce-overhead" and for its own cache folder (options):
    # torch.compile refuses both at once, so the mode goes in as the settings it stands for. This
    # failed every row of the H200's CUDA-graph column (twenty-third session) before.
    from smelt.tools.model_suite.timing import case_callable
    spec = all_specs()["multihead_attention"]
    torch._dynamo.reset()
    fn = case_callable(spec, "infer_fp32", "tiny", "cpu", 0, "smelt", "reduce-overhead",
                       {"graph_cache": True, "cache_dir": str(tmp_path)})
    fn()
    assert any(tmp_path.iterdir())  # compiled into its own folder


def test_timings_take_turns_with_no_compile_between(monkeypatch):
    # The suite keeps its backends alive together and times them in turns, the order rotating, each
    # figure the best of its turns (timing.py: the GPU host's speed runs in phases), with no compile
    # during the turns.
    from smelt import observe
    from smelt.tools.model_suite import timing
    spec = all_specs()["multihead_attention"]
    order, compiled_before = [], {}
    plain_rounds = timing._rounds

    def fake_steady(fn, device, calls):
        fn()
        order.append(fn)
        return 10.0 - len(order) % 5  # some spread: the best is not the last

    def rounds(steady, device, cpu_calls, result, case):
        compiled_before["graphs"] = len(list(observe.compiled_graphs()))
        plain_rounds(steady, device, cpu_calls, result, case)
        compiled_before["after"] = len(list(observe.compiled_graphs()))
        compiled_before["names"] = {id(fn): name for name, fn in steady.items()}

    monkeypatch.setattr(timing, "_steady_ms", fake_steady)
    monkeypatch.setattr(timing, "_rounds", rounds)
    result = timing.measure_case(spec, "infer_fp32", "tiny", "cpu", inductor=False)
    names = [compiled_before["names"][id(fn)] for fn in order]
    assert len(names) == 2 * timing.ROUNDS
    assert [names[2 * r] for r in range(timing.ROUNDS)] == ["eager", "smelt"] * (timing.ROUNDS // 2) + ["eager"]
    for name in ("eager", "smelt"):
        assert len(result["ms_turns"][name]) == timing.ROUNDS
        assert result["ms"][name] == min(result["ms_turns"][name])
    assert compiled_before["after"] == compiled_before["graphs"], "a compile during the turns"


def test_a_model_named_with_a_mode_runs_only_that_mode(tmp_path, monkeypatch):
    # One device call can then re-time one model's inference beside other models' training.
    from smelt.tools.model_suite import __main__ as suite_main
    from smelt.tools.model_suite import runner
    seen = []

    def fake_case(spec, mode, size, device, backend, **kw):
        seen.append((spec.name, mode))
        return runner.CaseResult(spec.name, mode, size, device, "pass")

    monkeypatch.setattr(runner, "run_case", fake_case)
    code = suite_main.main(["--device", "cpu", "--models", "bert:infer_bf16,gpt2", "--modes", "train,decode",
                            "--json", str(tmp_path / "suite.json")])
    assert code == 0
    # bert takes only its named mode; gpt2 takes --modes; decode applies to decoders only.
    assert seen == [("bert", "infer_bf16"), ("gpt2", "train"), ("gpt2", "decode")], seen
    with pytest.raises(ValueError, match="unknown mode 'trian'"):
        suite_main.main(["--device", "cpu", "--models", "bert:trian"])
