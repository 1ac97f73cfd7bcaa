"""The layer-choice search: pinned starting settings, a JSON record, resumable."""
import json

from experiments.studies.baseline_choices import analysis, search


def test_search_records_every_candidate_and_reruns_only_new_ones(tmp_path, monkeypatch):
    out = tmp_path / "search.json"
    assert search.main(["--steps", "1", "--seeds", "1", "--mixers", "deltanet", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["options"] for r in rows] == search.CANDIDATES["deltanet"]
    assert all(len(r["recall"]) == 1 and 0 <= r["mean"] <= 1 for r in rows)
    calls = []
    monkeypatch.setitem(search.CANDIDATES, "deltanet", search.CANDIDATES["deltanet"] + [{"chunk_size": 8}])
    monkeypatch.setattr(search, "train_one", lambda mixer, cfg, progress: calls.append(cfg) or type("R", (), {"accuracy": 0.5}))
    assert search.main(["--steps", "1", "--seeds", "1", "--mixers", "deltanet", "--out", str(out)]) == 0
    assert len(calls) == 1 and calls[0].mixer_options["deltanet"]["chunk_size"] == 8, "only the new candidate ran"
    assert calls[0].mixer_options["deltanet"]["short_conv"] == 0, "candidates start from the pinned settings"
    assert "| deltanet | chunk_size=8 | 1 | 0.500 | 0.500 | 0.500 |" in analysis.search_table(str(out))
