"""read_tensor against torch.load(weights_only=True) and a plain bytes copy, per payload size.

Run with ``pytest benchmarks/bench_tensorfile.py --benchmark-only`` (not part of the default test run,
whose testpaths are ``tests/``). The payloads are the benchmark sizes (primus_energon.formats.SIZES): the small f32 sample and the
FLUX-sized bf16 sample. ``bytes copy`` copies as many bytes as the tensor's storage: the ceiling for
any reader that copies once.
"""

from __future__ import annotations

import io

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

from primus_energon.tensorfile import read_tensor

PAYLOADS = {
    "f32[16,32,32]": (torch.float32, (16, 32, 32)),
    "f32[77,256]": (torch.float32, (77, 256)),
    "f32[768]": (torch.float32, (768,)),
    "bf16[16,64,64]": (torch.bfloat16, (16, 64, 64)),
    "bf16[512,4096]": (torch.bfloat16, (512, 4096)),
}


def _payload(name: str) -> tuple[bytes, torch.Tensor]:
    dtype, shape = PAYLOADS[name]
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue(), tensor


def _torch_load(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


READERS = {
    "read_tensor(copy=True)": lambda data: read_tensor(data, copy=True),
    "read_tensor(copy=False)": lambda data: read_tensor(data, copy=False),
    "torch.load(weights_only=True)": _torch_load,
}


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("reader", READERS)
def test_read(benchmark: BenchmarkFixture, payload: str, reader: str) -> None:
    benchmark.group = payload
    data, tensor = _payload(payload)
    result = benchmark(READERS[reader], data)
    assert torch.equal(result, tensor)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_bytes_copy(benchmark: BenchmarkFixture, payload: str) -> None:
    benchmark.group = payload
    data, tensor = _payload(payload)
    storage = memoryview(data)[: tensor.untyped_storage().nbytes()]
    assert len(benchmark(bytes, storage)) == tensor.untyped_storage().nbytes()
