"""The OVQ loop's thread policy: its choices (known answers), its settings, and that it never changes
what is computed."""
import pytest
import torch

from ovq_cl.ops.ovq import OVQParams, ovq_attention
from ovq_cl.ops.ovq import threads


@pytest.mark.parametrize("current,cores,others,want", [
    (2, 2, 0, 2), (2, 2, 1, 1), (2, 2, 2, 1), (2, 2, 5, 1), (8, 16, 3, 8), (8, 16, 12, 4), (4, 4, None, 4),
])
def test_auto_uses_the_cores_other_processes_leave(current, cores, others, want):
    assert threads.threads_for(current, cores, others) == want


def test_others_running_is_read_on_linux():
    n = threads.others_running()
    assert n is None or n >= 0
    if open("/proc/version").read().startswith("Linux"):
        assert isinstance(n, int)


def test_the_loop_restores_torch_threads_and_follows_the_policy(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "1")
        with threads.loop_threads(torch.device("cpu")) as n:
            assert n == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "inherit")
        with threads.loop_threads(torch.device("cpu")) as n:
            assert n == 2
        monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "auto")
        monkeypatch.setattr(threads, "_RECHECK_S", 0.0)             # decide afresh at every call
        monkeypatch.setattr(threads, "others_running", lambda: 2)   # both cores held by others
        monkeypatch.setattr(threads, "_cores", lambda: 2)
        with threads.loop_threads(torch.device("cpu")) as n:
            assert n == 1
        monkeypatch.setattr(threads, "others_running", lambda: 0)   # idle
        with threads.loop_threads(torch.device("cpu")) as n:
            assert n == 2
    finally:
        torch.set_num_threads(before)


def test_bad_policies_fail_in_one_line(monkeypatch):
    with pytest.raises(ValueError, match="'auto', 'inherit' or an integer"):
        threads.set_loop_threads("fast")
    with pytest.raises(ValueError, match=">= 1"):
        threads.set_loop_threads(0)
    monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "many")
    with pytest.raises(ValueError, match="OVQ loop threads"):
        threads.loop_threads_policy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_thread_count_does_not_change_the_result(monkeypatch, dtype):
    params = OVQParams(num_slots=64, chunk_size=16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 32, generator=g, dtype=dtype) for _ in range(3))
    beta = torch.full((4,), 6.0, dtype=dtype)
    before = torch.get_num_threads()
    results = []
    try:
        torch.set_num_threads(2)
        for policy in ("1", "2"):
            monkeypatch.setenv("OVQ_CL_LOOP_THREADS", policy)
            with torch.no_grad():
                results.append(ovq_attention(q, k, v, beta, params))
    finally:
        torch.set_num_threads(before)
    (o1, s1), (o2, s2) = results
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert (o1 - o2).abs().max() <= tol and (s1.keys - s2.keys).abs().max() <= tol
    assert torch.equal(s1.counts, s2.counts)
