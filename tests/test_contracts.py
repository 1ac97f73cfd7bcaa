"""What the framework asks of a mixer and a stream is declared on its base class, with a default, and a
mistake is one line before any compute (``ovq_cl.layers.base.Mixer``, ``streams.common.StreamData``)."""
import dataclasses

import pytest
import torch
from torch.utils.data import TensorDataset

from ovq_cl.layers import OVQAttention, VQAttention
from ovq_cl.layers.base import Mixer, MixerOptions
from strategies.training import distributed
from streams.common import EpisodeDataset, StreamData, StreamInfo


@dataclasses.dataclass(frozen=True)
class NamedLikeOVQOptions(MixerOptions):
    init: str = "random"            # a user's option that happens to share OVQ's name and value


class UserMixer(Mixer):
    Options = NamedLikeOVQOptions


def info():
    return StreamInfo("toy", "accuracy", 1, 4, 4, 8, None)


def test_a_plain_dataset_as_meta_training_set_is_refused_when_the_stream_is_built():
    x = torch.zeros(4, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="meta_train must be a streams.common.EpisodeDataset") as err:
        StreamData([TensorDataset(x, x)], [TensorDataset(x, x)], TensorDataset(x, x), info())
    assert "\n" not in str(err.value)
    episodes = EpisodeDataset(lambda i: (x[0], x[0]), (), 3)
    assert StreamData([], [], episodes, info()).meta_train is episodes and StreamData([], [], None, info()).meta_train is None


def test_defaults_of_the_mixer_contract():
    m = UserMixer(d_model=8, n_heads=2)
    assert m.aux_loss is None and m.data_parallel_problem() is None and m.sizing_chunk == 1
    m.set_process_group(object())                                   # nothing to do by default
    assert OVQAttention(d_model=8, n_heads=2, chunk_size=16).sizing_chunk == 16


def test_only_a_mixer_that_declares_a_problem_is_refused_under_torchrun(monkeypatch):
    monkeypatch.setattr(distributed, "active", lambda: object())     # as if torchrun had started a group
    distributed.check_mixer_options(torch.nn.Sequential(UserMixer(d_model=8, n_heads=2)))    # no name clash
    distributed.check_mixer_options(torch.nn.Sequential(OVQAttention(d_model=8, n_heads=2)))
    with pytest.raises(ValueError, match="OVQAttention: init 'random'"):
        distributed.check_mixer_options(torch.nn.Sequential(OVQAttention(d_model=8, n_heads=2, init="random")))
    monkeypatch.setattr(distributed, "active", lambda: None)         # one process: nothing is refused
    distributed.check_mixer_options(torch.nn.Sequential(OVQAttention(d_model=8, n_heads=2, init="random")))


def test_vq_takes_the_process_group_through_the_hook():
    vq, group = VQAttention(d_model=8, n_heads=2), object()
    assert vq.ema_process_group is None
    vq.set_process_group(group)
    assert vq.ema_process_group is group
