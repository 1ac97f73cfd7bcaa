"""The demo runs end to end through the CLI and reports every mixer."""
import pytest

from experiments.cli import main


def test_demo_cli_prints_a_row_per_mixer(capsys):
    assert main(["demo", "--steps", "3", "--mixers", "ovq,linear", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().split()[:1] in (["ovq"], ["linear"])]
    assert [r[0] for r in rows] == ["ovq", "linear"]
    for r in rows:
        assert 0.0 <= float(r[3]) <= 1.0                      # recall accuracy
        assert all(int(b) > 0 for b in r[4].split("/"))        # state bytes per layer


def test_the_demo_says_how_far_it_is_and_how_long_is_left(capsys):
    assert main(["demo", "--steps", "2", "--mixers", "ovq,linear"]) == 0
    err = capsys.readouterr().err
    assert "demo: 1/2 mixers trained (ovq, recall " in err and "s so far, about " in err
    assert "demo: 2/2 mixers trained (linear" in err and "about 0 s left" in err


def test_a_demo_interrupted_says_so_and_speaks_of_no_run(capsys, monkeypatch):
    import experiments.demo as demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "train_one", interrupted)
    assert main(["demo", "--steps", "2", "--mixers", "ovq", "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert "demo interrupted" in err and "checkpoint" not in err and "KILLED" not in err


def test_demo_cli_rejects_unknown_mixer(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--mixers", "ovq,hyena"])
    assert "unknown mixer" in capsys.readouterr().err


def test_state_sizes_cli_lists_every_mixer_and_only_full_attention_grows(capsys):
    from ovq_cl.layers import MIXERS

    assert main(["state-sizes", "--lengths", "1024,16384"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[3:]}
    assert set(rows) == set(MIXERS)
    for name, (short, long) in rows.items():
        assert (int(long.replace(",", "")) > int(short.replace(",", ""))) == (name == "full")


def test_every_help_text_is_plain_text_not_rst(capsys):
    """`ovq-cl --help` and each subcommand's help show no reStructuredText markup (``...``)."""
    from experiments.arguments import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    texts += [sub.format_help() for sub in subparsers.choices.values()]
    assert len(texts) > 8 and not [t for t in texts if "``" in t]
