"""Helpers shared by the benchmarks: the machine, timers, the matmul peak, peak memory.

Timings are the minimum over repeats (the least disturbed run: on a shared 2-core machine other
processes only ever add time). Peak memory on CPU is the resident set's high-water mark (VmHWM) of a
fresh process, reset after warm-up through ``/proc/self/clear_refs`` (Linux), so it counts what the
measured work itself adds: tensors, the allocator's slack, nothing from imports or earlier runs.
On CUDA it is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Callable, Dict, List, Optional

import torch

D_MODEL, HEADS = 256, 4

#: every mixer at the same width and heads (d_model 256 = 4 heads x 64); state sizes comparable:
#: OVQ/VQ keep 1024 slots per head, sliding-window attention 1024 tokens.
MIXER_OPTIONS: Dict[str, dict] = {
    "ovq": {"num_slots": 1024, "chunk_size": 64},
    "vq": {"codebook_size": 1024, "chunk_size": 64},
    "linear": {"chunk_size": 64},
    "delta": {"chunk_size": 64},
    "full": {},
    "swa": {"window": 1024},
}


def machine_info(device: str = "cpu") -> Dict[str, object]:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: Dict[str, object] = {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": model,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "loadavg": load_average(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
    }
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def load_average() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_min(fn: Callable[[], object], device: str = "cpu", repeats: int = 3, max_seconds: float = 20.0) -> float:
    """Minimum wall time of ``fn`` over up to ``repeats`` runs (fewer when one run is long)."""
    times: List[float] = []
    spent = 0.0
    for _ in range(max(1, repeats)):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent + dt > max_seconds:
            break
    return min(times)


def matmul_peak(device: str = "cpu", n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """Achieved FLOP/s of one large square matmul (the machine's practical peak), in GFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    t = time_min(lambda: a @ b, device, repeats)
    return 2 * n**3 / t / 1e9


# ------------------------------------------------------------------------------------ peak memory

def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Peak memory of a block of work, in bytes, relative to the memory in use when it starts.

    CPU: ``VmHWM - VmRSS(start)`` after resetting the high-water mark (``/proc/self/clear_refs``);
    where that file cannot be written, ``ru_maxrss`` (not resettable: run in a fresh process).
    CUDA: ``max_memory_allocated - memory_allocated(start)``.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.start = 0
        self.peak = 0
        self.absolute = 0

    def __enter__(self) -> "PeakMemory":
        import gc

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        self.resettable = True
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False
        self.start = (_status_kb("VmRSS") or 0) * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.absolute = torch.cuda.max_memory_allocated()
        else:
            hwm = _status_kb("VmHWM") if self.resettable else None
            if hwm is None:
                import resource

                hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.absolute = hwm * 1024
        self.peak = max(0, self.absolute - self.start)


def fmt_time(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_mb(b: Optional[float]) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def markdown_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
