"""Runtime resolution, determinism switches, environment capture, atomic writes and process locks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainlab.core.atomic import atomic_dir, atomic_path, process_lock, write_json
from trainlab.core.config import BaseParams
from trainlab.core.provenance import environment
from trainlab.core.repro import derived_seed, generator, seed_everything
from trainlab.core.runtime import cpu_supports_bf16, resolve_runtime
from trainlab.tasks.augment import random_shift

REPO = Path(__file__).resolve().parents[2]


def test_cpu_runtime_resolves_precision_from_the_cpu():
    rt = resolve_runtime(BaseParams(device="auto"))
    if not torch.cuda.is_available():
        assert rt.device.type == "cpu"
        assert rt.precision == ("bf16" if cpu_supports_bf16() else "fp32")
    assert resolve_runtime(BaseParams(device="cpu", precision="fp32")).amp_dtype is None
    assert resolve_runtime(BaseParams(device="cpu", precision="fp16")).needs_grad_scaler


@pytest.mark.parametrize("held", [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}])
def test_precision_auto_is_fp32_on_a_cpu_held_to_avx2(held):
    """bf16 without native bf16 runs about 10x slower than fp32 (docs/reproducibility.md): a CPU held to AVX2 gets
    fp32, as an AVX2-only CPU does."""
    code = ("from trainlab.core.config import BaseParams; from trainlab.core.runtime import resolve_runtime; "
            "print(resolve_runtime(BaseParams(device='cpu')).precision)")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    done = subprocess.run([sys.executable, "-c", code], env={**env, **held}, cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "fp32"


def test_determinism_flag_is_applied_and_reported():
    rt = resolve_runtime(BaseParams(device="cpu", deterministic=True))
    assert torch.are_deterministic_algorithms_enabled() and not rt.cudnn_benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    rt = resolve_runtime(BaseParams(device="cpu", deterministic=False))
    assert not torch.are_deterministic_algorithms_enabled() and rt.cudnn_benchmark
    assert rt.describe()["runtime_deterministic"] == "False"
    resolve_runtime(BaseParams(device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
@pytest.mark.parametrize("compiling", [False, True])
def test_determinism_loads_the_inductor_only_when_compiling(compiling):
    """torch.use_deterministic_algorithms imports torch._inductor (~1 s of a stage's start); only compile needs it."""
    code = textwrap.dedent(f"""
        import sys, torch
        from trainlab.core.config import BaseParams
        from trainlab.core.runtime import resolve_runtime
        resolve_runtime(BaseParams(device="cpu", deterministic=True, compile={compiling}))
        assert torch.are_deterministic_algorithms_enabled()
        loaded = "torch._inductor.config" in sys.modules
        assert loaded == {compiling}, loaded
        if loaded:
            assert sys.modules["torch._inductor.config"].deterministic
        from trainlab.engine.metrics import bincount_allowed
        with bincount_allowed(torch.device("cpu")):
            assert not torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert ("torch._inductor.config" in sys.modules) == {compiling}
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


MALLOC_PROBE = textwrap.dedent("""
    import ctypes, sys, torch
    from trainlab.core.config import BaseParams
    from trainlab.core.runtime import resolve_runtime
    if sys.argv[1] == "runtime":
        resolve_runtime(BaseParams(device="cpu"))
    class MallInfo(ctypes.Structure):  # glibc's struct mallinfo2
        _fields_ = [(name, ctypes.c_size_t) for name in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo
    def spaces():  # MiB in malloc's heap, MiB in blocks mapped on their own
        info = mallinfo2()
        return info.arena >> 20, info.hblkhd >> 20
    before = spaces()
    activation = torch.empty(5 << 20)  # 20 MiB, as a step's activation
    during = spaces()
    del activation
    print(*before, *during, *spaces())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_the_runtime_keeps_freed_memory_so_steps_do_not_fault_their_activations_in_again():
    """glibc maps a 20 MiB block on its own and unmaps it when freed, so the next step faults it in again, page by
    page (the Zen 4: 10k against 49k minor faults in 20 steps; how many depends on the machine's kernel). With the
    runtime's thresholds the block comes from the heap and stays there, freed, for the next step."""
    def spaces(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", MALLOC_PROBE, mode], cwd=REPO, capture_output=True, text=True,
                             check=True)
        return [int(v) for v in out.stdout.split()]

    heap, mapped, heap_during, mapped_during, heap_after, mapped_after = spaces("default")
    assert mapped_during >= mapped + 20 and mapped_after == mapped, "glibc's default: a block of its own, unmapped"
    heap, mapped, heap_during, mapped_during, heap_after, mapped_after = spaces("runtime")
    assert heap_during >= heap + 20 and mapped_during == mapped, "the runtime's: from the heap"
    assert heap_after == heap_during, "the runtime's: kept in the heap once freed"


def test_cuda_requested_without_cuda_is_a_params_error():
    from trainlab.core.errors import ParamsError

    with pytest.raises(ParamsError, match="base.device"):
        resolve_runtime(BaseParams(device="cuda"))


def test_seeds_and_generators_are_reproducible():
    seed_everything(1)
    a = torch.rand(3)
    seed_everything(1)
    assert torch.equal(a, torch.rand(3))
    assert derived_seed(1, "x", 2) == derived_seed(1, "x", 2) != derived_seed(1, "x", 3)
    assert torch.equal(torch.rand(4, generator=generator(5, "a")), torch.rand(4, generator=generator(5, "a")))


def test_environment_names_versions_device_and_git():
    env = environment(torch.device("cpu"))
    assert env["pkg_torch"].startswith("2.14.1")
    assert {"git_commit", "git_dirty", "device", "device_name", "python"} <= set(env)


def test_a_flow_and_a_run_that_never_use_torch_do_not_load_it_for_their_record(tmp_path):
    """The Prefect flows (git state) and the TF-IDF baseline (meta.json, its run's tags and environment record) do
    their work without importing torch (1.2-1.7 s); a process that has loaded torch records its part too."""
    (tmp_path / "meta.json").write_text('{"num_classes": 3}')
    code = textwrap.dedent(f"""
        import sys
        import pipelines.flow, pipelines.sweep, pipelines.search
        from trainlab.data.prepared import load_meta
        from trainlab.jobs.text_baseline import write_baseline
        assert load_meta("{tmp_path}")["num_classes"] == 3
        from trainlab.core.config import load_params
        from trainlab.tracking.runs import plan_run
        params = load_params("params.yaml")
        plan = plan_run(params, "text_baseline", "sqlite:///{tmp_path}/mlflow.db", device="cpu")
        assert "torch" not in sys.modules, "torch was imported"
        assert plan.tags["device"] == "cpu" and "torch_version" not in plan.tags, plan.tags
        assert plan.environment["pkg_torch"].startswith("2.14.1") and "torch_threads" not in plan.environment
        import torch
        plan = plan_run(params, "train_text", "sqlite:///{tmp_path}/mlflow.db", device="cpu")
        assert plan.tags["torch_version"] == torch.__version__, plan.tags
        assert plan.environment["torch_threads"] == str(torch.get_num_threads()), plan.environment
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def test_atomic_path_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text().strip().startswith("{") and '"a": 1' in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_dir_replaces_whole_or_nothing(tmp_path):
    target = tmp_path / "prepared"
    with atomic_dir(target) as d:
        (d / "a.txt").write_text("1")
    with pytest.raises(ValueError):
        with atomic_dir(target) as d:
            (d / "b.txt").write_text("2")
            raise ValueError
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    with atomic_dir(target) as d:
        (d / "c.txt").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]


def test_process_lock_is_exclusive_until_released(tmp_path):
    name = f"test:{tmp_path}"
    with process_lock(name, wait=False) as first:
        assert first
        with process_lock(name, wait=False) as second:  # a second open file: flock conflicts as across processes
            assert not second
        with process_lock(f"{name}-other", wait=False) as other:
            assert other
    with process_lock(name, wait=False) as again:
        assert again
    assert list(tmp_path.iterdir()) == []  # the lock file lives in the temp dir, not beside the caller's files


def test_random_shift_moves_image_and_mask_together():
    img = torch.zeros(8, 1, 10, 10, dtype=torch.uint8)
    img[:, :, 4:6, 4:6] = 200
    mask = (img[:, 0] > 0).to(torch.uint8) * 3
    g = torch.Generator().manual_seed(0)
    s_img, s_mask = random_shift([img, mask], 2, g)
    assert s_img.shape == img.shape and s_mask.shape == mask.shape
    assert torch.equal((s_img[:, 0] > 0), (s_mask > 0))
    assert (s_img > 0).sum() == (img > 0).sum()  # a 2px shift keeps the centre square inside
    assert not torch.equal(s_img, img)


def test_auto_precision_on_cuda_keeps_fp32_for_a_launch_bound_step_and_takes_bf16_for_a_large_one():
    """The rule is by the step's FLOPs (counted on the CPU), so it is decided the same way on every run; the device
    is only read here, nothing runs on it."""
    import dataclasses

    from trainlab.core.config import Params
    from trainlab.core.runtime import CUDA_BF16_MIN_TRAIN_GFLOP, cuda_auto_precision
    from trainlab.jobs.train import build_trainable, settle_auto_precision

    assert cuda_auto_precision(CUDA_BF16_MIN_TRAIN_GFLOP / 4) == "fp32"
    assert cuda_auto_precision(CUDA_BF16_MIN_TRAIN_GFLOP * 2) in ("bf16", "fp16")
    cpu = resolve_runtime(BaseParams(device="cpu"))
    cuda = dataclasses.replace(cpu, device=torch.device("cuda"), precision="bf16")
    task = build_trainable("classifier", Params(), {"num_classes": 10, "channels": 1})
    train = {"images": torch.zeros(1024, 1, 28, 28, dtype=torch.uint8), "labels": torch.zeros(1024, dtype=torch.long)}
    assert settle_auto_precision(cuda, "auto", task, train, 128).precision == "fp32"  # 28 GFLOP per step
    assert settle_auto_precision(cuda, "auto", task, train, 1024).precision != "fp32"  # 228 GFLOP per step
    assert settle_auto_precision(cuda, "bf16", task, train, 128).precision == "bf16"  # asked for: kept
    assert settle_auto_precision(cpu, "auto", task, train, 128) is cpu  # the CPU rule is resolve_runtime's
