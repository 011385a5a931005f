"""The data's fingerprint (pgc_mpi.learning.fingerprint): equal exactly for equal data, whatever holds it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from pgc_mpi.errors import ConfigError
from pgc_mpi.learning import fingerprint as fp
from pgc_mpi.learning.user_data import source_of


def _pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((40, 3)).astype(np.float32), rng.integers(0, 4, 40)


def test_equal_arrays_have_one_fingerprint_and_any_change_shows():
    x, y = _pair()
    first = fp.data_fingerprint((x, y))
    assert first.startswith(fp.PREFIX) and first == fp.data_fingerprint((x.copy(), y.copy()))
    assert first == fp.data_fingerprint([x, y])  # a list as a tuple
    changed = x.copy()
    changed[17, 2] = np.nextafter(changed[17, 2], np.float32(1))  # one element, by one ulp
    assert fp.data_fingerprint((changed, y)) != first
    assert fp.data_fingerprint((x, (y + 1) % 4)) != first
    assert fp.data_fingerprint(_pair(1)) != first  # other draws
    assert fp.data_fingerprint((x.reshape(40, 3, 1), y)) != first  # same bytes, other shape
    assert fp.data_fingerprint((x.astype(np.float64), y)) != first  # same values, other dtype
    assert fp.data_fingerprint((x[:, ::-1][:, ::-1], y)) == first  # a non-contiguous view of the same values


def test_torch_tensors_and_numpy_arrays_of_the_same_values_alike():
    x, y = _pair()
    assert fp.data_fingerprint((torch.from_numpy(x), torch.from_numpy(y))) == fp.data_fingerprint((x, y))
    assert fp.data_fingerprint(torch.from_numpy(x).t()) == fp.data_fingerprint(x.T)
    half = torch.from_numpy(x).bfloat16()  # no NumPy dtype: its bits, under torch's name
    assert fp.data_fingerprint(half) == fp.data_fingerprint(half.clone())
    assert fp.data_fingerprint(half) != fp.data_fingerprint(half + 1)


class Noisy(Dataset):
    """Items with a random transform (torch's generator) and a dict target, as torchvision's are."""

    def __init__(self, n: int, offset: float = 0.0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((2, 2), float(i) + self.offset) + torch.rand(2, 2), {"label": i % 3, "name": f"s{i}"}


def test_a_datasets_sample_is_deterministic_and_seeded():
    assert np.array_equal(fp.sample_indices(1000), fp.sample_indices(1000))
    assert len(fp.sample_indices(1000)) == fp.SAMPLE_ITEMS and len(set(fp.sample_indices(1000))) == fp.SAMPLE_ITEMS
    assert np.array_equal(fp.sample_indices(5), np.arange(5))  # a small one whole
    torch.manual_seed(1)
    first = fp.data_fingerprint(Noisy(500))
    torch.manual_seed(2)  # the random transform draws from the fixed seed, whatever the caller's state
    assert fp.data_fingerprint(Noisy(500)) == first
    assert fp.data_fingerprint(Noisy(500, offset=0.5)) != first
    assert fp.data_fingerprint(Noisy(501)) != first  # the length counts


class NumpyNoisy(Noisy):
    """A transform that draws from NumPy's global generator and Python's."""

    def __getitem__(self, i: int):
        return np.full(3, i, np.float32) + np.random.rand(3) + random.random(), i % 3


def test_reading_a_dataset_leaves_the_generators_as_they_were():
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    first = fp.data_fingerprint(NumpyNoisy(100))
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]
    assert fp.data_fingerprint(NumpyNoisy(100)) == first  # drawn from the fixed seed, whatever the callers' state


def test_a_changed_item_in_the_sample_shows():
    x, y = _pair()
    first = fp.data_fingerprint(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)))
    assert first == fp.data_fingerprint(TensorDataset(torch.from_numpy(x.copy()), torch.from_numpy(y)))
    changed = x.copy()
    changed[int(fp.sample_indices(40)[3]), 0] += 1  # 40 items: all of them are read
    assert fp.data_fingerprint(TensorDataset(torch.from_numpy(changed), torch.from_numpy(y))) != first


def test_a_failing_item_is_a_config_error_naming_it():
    class Broken(Noisy):
        def __getitem__(self, i):
            raise OSError(f"cannot read image {i}")

    with pytest.raises(ConfigError, match=r"test_data: reading sample 0 failed: OSError: cannot read image 0"):
        fp.dataset_fingerprint(Broken(3), "test_data")


def test_sources_fingerprint_their_train_and_test_data_once():
    x, y = _pair()
    source = source_of((x, y), (x[:8], y[:8]))
    problem = type("Problem", (), {"source": source})()
    found = fp.problem_fingerprint(problem)
    assert found == {"train": fp.data_fingerprint((x, y)), "test": fp.data_fingerprint((x[:8], y[:8]))}
    assert fp.problem_fingerprint(problem) is found  # computed once
    assert fp.problem_fingerprint(type("P", (), {"source": source_of((x, y))})())["test"] is None
    train, test = TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), TensorDataset(torch.zeros(5, 3),
                                                                                          torch.zeros(5, dtype=int))
    assert source_of(train, test).fingerprint() == {"train": fp.data_fingerprint(train),
                                                    "test": fp.data_fingerprint(test)}
    assert fp.problem_fingerprint(None) is None
    assert fp.problem_fingerprint(object()) is None  # a synthetic problem: no source
    assert fp.describe(found["train"]) == found["train"][len(fp.PREFIX):][:12] and fp.describe(None) == "none"
