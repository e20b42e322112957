"""Which torch is imported and what it was built for (collectors/torch_build.py), on
stand-ins with torch's ``version`` attributes: the tool never imports torch to ask."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from jupyter_gpumem.collectors.torch_build import (
    cuda_ready,
    gpu_backend,
    gpu_build,
    imported_torch,
    rocm_build,
)


def torch_like(cuda=None, hip=None, initialized=False):
    return SimpleNamespace(
        __version__="2.11.0",
        version=SimpleNamespace(cuda=cuda, hip=hip),
        cuda=SimpleNamespace(is_initialized=lambda: initialized),
    )


@pytest.mark.parametrize(
    ("t", "gpu", "rocm", "backend"),
    [
        (torch_like(cuda="13.0"), True, False, "cuda"),
        (torch_like(hip="6.4.43482"), True, True, "rocm"),
        (torch_like(), False, False, "cuda"),
    ],
    ids=["cuda", "rocm", "cpu"],
)
def test_builds(t, gpu, rocm, backend):
    assert (gpu_build(t), rocm_build(t)) == (gpu, rocm)
    if gpu:
        assert gpu_backend(t) == backend


def test_no_torch_and_old_torch_without_version_are_no_gpu_build():
    assert not gpu_build(None)
    assert not gpu_build(SimpleNamespace(__version__="0.4"))
    assert not cuda_ready(None)


def test_cuda_ready_only_once_cuda_started():
    assert not cuda_ready(torch_like(cuda="13.0"))
    assert cuda_ready(torch_like(cuda="13.0", initialized=True))
    assert not cuda_ready(torch_like(initialized=True))  # a CPU build is asked nothing


def test_imported_torch_reads_sys_modules_only(monkeypatch):
    fake = torch_like(cuda="13.0")
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert imported_torch() is fake
    monkeypatch.delitem(sys.modules, "torch")
    assert imported_torch() is None
    assert "torch" not in sys.modules
