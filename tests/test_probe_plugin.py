"""A fifth probe added from outside the framework, as a user would: one file that defines a probe class and
registers it (``experiments.probes.register_probe``), asked for in a run's config under ``probes:``. The
runner measures, logs and records it, a killed run keeps its record through the checkpoint, its cross-run
table reaches the reports' probe tables, and the stream's R is the run's R without it (a probe keeps the
RNG as it was, even one that draws from it).

The runs are a subprocess: registering the probe in this test process would leak it into other tests.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent('''
    """A user's probe: the model's weight norm, and one draw from the global RNG (which must not leak)."""
    import torch

    from experiments.probes import Measured, Probe, register_probe


    class WeightNorm(Probe):
        name = "weight_norm"

        def check(self, cfg, bench):
            if self.options(cfg).get("scale", 1.0) <= 0:
                raise ValueError("probes.weight_norm.scale: must be > 0")

        def measure(self, ctx):
            scale = float(ctx.options.get("scale", 1.0))
            norm = scale * float(sum(p.detach().norm() ** 2 for p in ctx.model.parameters()) ** 0.5)
            torch.rand(1000)                      # the runner must keep the stream's RNG as it was
            return Measured({"norm": norm}, table=f"weight norm {norm:.4f}", metrics={"weight_norm": norm})

        def tables(self, records, baseline=None):
            rows = [r for r in records if r.probe(self.name)]
            if not rows:
                return []
            lines = ["| run | weight norm |", "|---|---|"] + [f"| {r.label} | {r.probe(self.name)['norm']:.4f} |"
                                                             for r in rows]
            return [("Weight norms (a user's probe):", "\\n".join(lines))]


    register_probe(WeightNorm)
''')

SCRIPT = textwrap.dedent('''
    import json, sys
    from experiments.config import run_config
    from experiments.runner import run
    from experiments import compare
    from experiments.probes import probe_tables
    from mlflow import MlflowClient

    TINY = {"plugins": ["user_probe"],
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "layers": ["ovq"],
                      "mixers": {"ovq": {"num_slots": 8, "chunk_size": 4}}},
            "stream": {"name": "icr", "options": {"n_experiences": 2, "train_episodes": 8, "test_episodes": 4,
                       "facts_per_experience": 6, "facts_per_episode": 4, "queries_per_episode": 2,
                       "test_queries": 3, "meta_train_episodes": 32}},
            "strategy": {"name": "naive", "train_mb_size": 4, "lr": 3e-3}, "meta_train": {"steps": 4, "batch_size": 4},
            "tracking": {"tracking_uri": sys.argv[1]}}
    out = {}
    def cfg(name, **extra):
        return run_config({**TINY, "checkpoint": {"dir": "ckpt/" + name}, "tracking": {**TINY["tracking"], "experiment": name},
                           **extra})
    plain = run(cfg("plain"))
    probed_cfg = cfg("probed", probes={"weight_norm": {"scale": 2.0}})
    stopped = run(probed_cfg, stop_after=0)                  # killed after experience 0: resumed below
    probed = run(probed_cfg)
    out["R_plain"], out["R_probed"] = plain.R, probed.R
    out["record"] = probed.record()["probes"]
    out["plain_probes"] = plain.record()["probes"]
    client = MlflowClient(sys.argv[1])
    out["artifacts"] = sorted(a.path for a in client.list_artifacts(probed.run_id))
    out["metric"] = client.get_run(probed.run_id).data.metrics.get("weight_norm")
    records = [compare.record_from_json(plain.record()), compare.record_from_json(probed.record())]
    out["tables"] = [caption for caption, _ in probe_tables(records)]
    out["identity_differs"] = plain.config.identity() != probed.config.identity()
    errors = []
    for bad in ({"nothing": {}}, {"weight_norm": {"scale": -1}}, {"delay": {}}, {"weight_norm": 3}):
        try:
            run(cfg("bad", probes=bad))
        except ValueError as err:
            errors.append(str(err))
    out["errors"] = errors
    print("RESULT " + json.dumps(out))
''')


def test_a_probe_added_from_outside_is_measured_logged_recorded_resumed_and_tabled(tmp_path, new_store):
    (tmp_path / "user_probe.py").write_text(PROBE)
    uri = new_store(tmp_path / "mlruns.db")
    done = subprocess.run([sys.executable, "-c", SCRIPT, uri], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert out["R_probed"] == out["R_plain"], "the probe changed what the stream drew"
    # beside the built-in probes this stream measures by default (the delay curve), the same in both runs
    assert set(out["record"]) - set(out["plain_probes"]) == {"weight_norm"} and out["record"]["weight_norm"]["norm"] > 0
    assert {k: v for k, v in out["record"].items() if k != "weight_norm"} == out["plain_probes"]
    assert {"weight_norm.json", "weight_norm.txt"} <= set(out["artifacts"])
    assert out["metric"] == pytest.approx(out["record"]["weight_norm"]["norm"])
    assert "Weight norms (a user's probe):" in out["tables"]
    assert out["identity_differs"]
    unknown, bad_option, built_in, not_a_mapping = out["errors"]
    assert unknown.startswith("run config: probes.nothing: no probe 'nothing' is registered") and "weight_norm" in unknown
    assert bad_option == "probes.weight_norm.scale: must be > 0"
    assert "probes.delay: the built-in probe 'delay' is configured under gate" in built_in
    assert "probes.weight_norm must be a mapping" in not_a_mapping
