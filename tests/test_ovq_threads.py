"""The OVQ loop's threads: the op applies what its caller gives it; the run's policy (auto, from the
load) is the caller's (experiments.threads): its choices (known answers), its settings, and that it
never changes what is computed."""
import pytest
import torch

from ovq_cl.ops.ovq import OVQParams, ovq_attention
from experiments import threads as policy
from ovq_cl.ops.ovq import threads


@pytest.mark.parametrize("current,cores,others,want", [
    (2, 2, 0, 2), (2, 2, 1, 1), (2, 2, 2, 1), (2, 2, 5, 1), (8, 16, 3, 8), (8, 16, 12, 4), (4, 4, None, 4),
])
def test_auto_uses_the_cores_other_processes_leave(current, cores, others, want):
    assert policy.threads_for(current, cores, others) == want


def test_others_running_is_read_on_linux():
    n = policy.others_running()
    assert n is None or n >= 0
    if open("/proc/version").read().startswith("Linux"):
        assert isinstance(n, int)


@pytest.fixture
def restored():
    before, setting = torch.get_num_threads(), threads.loop_threads_policy()
    yield
    torch.set_num_threads(before)
    threads.set_loop_threads(setting)


def test_the_op_applies_what_it_is_given_and_restores_torch_threads(restored):
    """The op reads no load itself: by default it keeps torch's setting; it applies an integer, or asks a
    callable with torch's current setting."""
    torch.set_num_threads(2)
    threads.set_loop_threads("inherit")
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 2
    threads.set_loop_threads(1)
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    asked = []
    threads.set_loop_threads(lambda current: asked.append(current) or 1)
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 1 and asked == [2]


def test_a_fresh_process_keeps_torchs_setting_until_a_run_installs_its_policy():
    import subprocess
    import sys

    code = ("from ovq_cl.ops.ovq import threads; assert threads.loop_threads_policy() == 'inherit'; "
            "import experiments.runner; assert threads.loop_threads_policy() == 'inherit'; "
            "from experiments.threads import install_loop_threads, auto_threads; install_loop_threads(); "
            "assert threads.loop_threads_policy() is auto_threads")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_runs_policy_follows_the_environment_and_auto_counts_the_free_cores(monkeypatch, restored):
    torch.set_num_threads(2)
    monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "1")
    policy.install_loop_threads()
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 1
    monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "inherit")
    policy.install_loop_threads()
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 2
    monkeypatch.delenv("OVQ_CL_LOOP_THREADS")
    policy.install_loop_threads()                                # auto, the default
    monkeypatch.setattr(policy, "_RECHECK_S", 0.0)               # decide afresh at every call
    monkeypatch.setattr(policy, "others_running", lambda: 2)     # both cores held by others
    monkeypatch.setattr(policy, "_cores", lambda: 2)
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 1
    monkeypatch.setattr(policy, "others_running", lambda: 0)     # idle
    with threads.loop_threads(torch.device("cpu")) as n:
        assert n == 2


def test_bad_policies_fail_in_one_line(monkeypatch, restored):
    with pytest.raises(ValueError, match="'inherit', an integer >= 1 or a callable"):
        threads.set_loop_threads("fast")
    with pytest.raises(ValueError, match=">= 1"):
        threads.set_loop_threads(0)
    monkeypatch.setenv("OVQ_CL_LOOP_THREADS", "many")
    with pytest.raises(ValueError, match="OVQ loop threads"):
        policy.install_loop_threads()


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
        for n in (1, 2):
            threads.set_loop_threads(n)
            with torch.no_grad():
                results.append(ovq_attention(q, k, v, beta, params))
    finally:
        torch.set_num_threads(before)
        threads.set_loop_threads("inherit")
    (o1, s1), (o2, s2) = results
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert (o1 - o2).abs().max() <= tol and (s1.keys - s2.keys).abs().max() <= tol
    assert torch.equal(s1.counts, s2.counts)
