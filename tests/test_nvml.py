"""CUDA_VISIBLE_DEVICES -> NVML index mapping, against a fake NVML library."""

from __future__ import annotations

import sys
import types

import pytest

from jupyter_gpumem.collectors.nvml import Nvml, parse_visible_devices, uuids_to_ordinals


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, list(range(64))),
        ("1,0", [1, 0]),
        ("2", [2]),
        ("0,1,-1,3", [0, 1]),  # a negative entry ends the list
        ("1gpu2,2ampere", [1, 2]),  # strtoul reads leading digits
        ("0,0", []),  # a repeat makes it empty
        ("", []),
        ("GPU-abc,GPU-def", ["GPU-abc", "GPU-def"]),
        ("GPU-abc,1", ["GPU-abc"]),
        ("MIG-xyz", ["MIG-xyz"]),
    ],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


def test_uuid_prefixes():
    uuids = ["GPU-aaaa-1111", "GPU-aaab-2222", "GPU-cccc-3333"]
    assert uuids_to_ordinals(["GPU-cccc", "GPU-aaaa"], uuids) == [2, 0]
    assert uuids_to_ordinals(["GPU-aaa"], uuids) == []  # ambiguous
    assert uuids_to_ordinals(["GPU-cccc", "GPU-cccc-3333"], uuids) == []  # repeated device


@pytest.fixture
def fake_pynvml(monkeypatch):
    """Three GPUs; process 4242 uses 1 GiB on GPU 2."""
    m = types.ModuleType("pynvml")
    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]

    class Mem:
        def __init__(self, i):
            self.total, self.used, self.free = 80 << 30, (i + 1) << 30, (80 << 30) - ((i + 1) << 30)

    class Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: 3
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: uuids[h]
    m.nvmlDeviceGetName = lambda h: f"GPU{h}".encode()
    m.nvmlDeviceGetMemoryInfo = lambda h: Mem(h)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [Proc(4242, 1 << 30)] if h == 2 else []
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return m


def test_visible_integers(fake_pynvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    nv = Nvml(pid=4242)
    assert nv.visible() == [2, 0]
    assert nv.nvml_index(0) == 2
    d = nv.read(nv.nvml_index(0))
    assert (d.name, d.used, d.process_used) == ("GPU2", 3 << 30, 1 << 30)
    assert nv.read(nv.nvml_index(1)).process_used is None


def test_visible_out_of_range_is_cut(fake_pynvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")
    assert Nvml().visible() == [1]


def test_visible_uuids(fake_pynvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc,GPU-a")
    assert Nvml().visible() == [2, 0]


def test_visible_mig_has_no_nvml_figures(fake_pynvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert Nvml().visible() == [None]


def test_all_visible_when_unset(fake_pynvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert Nvml().visible() == [0, 1, 2]


def test_no_nvml_library_is_a_reason_not_a_raise(monkeypatch):
    m = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", m)
    nv = Nvml()
    assert nv.visible() == []
    assert nv.error == "NVML unavailable: NVML Shared Library Not Found"


class _Binding:
    """pynvml's internals as _ComputeProcesses uses them: a function pointer that fills
    the caller's array the way the driver does (count in, count out)."""

    import pynvml as _real  # nvidia-ml-py, a dependency: its structure and constants

    c_nvmlProcessInfo_v3_t = _real.c_nvmlProcessInfo_v3_t
    NVMLError = _real.NVMLError
    NVML_SUCCESS = _real.NVML_SUCCESS
    NVML_ERROR_INSUFFICIENT_SIZE = _real.NVML_ERROR_INSUFFICIENT_SIZE
    NVML_VALUE_NOT_AVAILABLE_ulonglong = _real.NVML_VALUE_NOT_AVAILABLE_ulonglong

    def __init__(self, procs, fail=None):
        self.procs, self.fail, self.calls = procs, fail, 0

    def _nvmlGetFunctionPointer(self, name):
        assert name == "nvmlDeviceGetComputeRunningProcesses_v3"

        def fn(handle, count_ref, array):
            self.calls += 1
            if self.fail is not None:
                return self.fail
            count = count_ref._obj
            if count.value < len(self.procs):
                count.value = len(self.procs)
                return self.NVML_ERROR_INSUFFICIENT_SIZE
            for i, (pid, used) in enumerate(self.procs):
                array[i].pid = pid
                array[i].usedGpuMemory = used
            count.value = len(self.procs)
            return self.NVML_SUCCESS

        return fn


def test_compute_processes_in_one_driver_call():
    from jupyter_gpumem.collectors.nvml import _ComputeProcesses

    na = _Binding.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    b = _Binding([(4242, 3 << 30), (17, na), (99, 0)])
    read = _ComputeProcesses(b)
    assert read(0) == [(4242, 3 << 30), (17, None), (99, 0)]
    assert b.calls == 1
    b.procs = []
    assert read(0) == []  # the array is reused: nothing of the last answer is left


def test_compute_processes_grow_when_more_are_listed():
    from jupyter_gpumem.collectors.nvml import _ComputeProcesses

    procs = [(1000 + i, i << 20) for i in range(40)]  # more than the kept array holds
    b = _Binding(procs)
    read = _ComputeProcesses(b)
    assert read(0) == procs
    assert b.calls == 2  # asked once, told the count, asked again with room
    assert read(0) == procs and b.calls == 3  # the larger array is kept


def test_compute_processes_raise_nvml_errors():
    from jupyter_gpumem.collectors.nvml import _ComputeProcesses

    read = _ComputeProcesses(_Binding([], fail=_Binding._real.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(_Binding.NVMLError) as e:
        read(0)
    assert e.value.value == _Binding._real.NVML_ERROR_GPU_IS_LOST


def test_process_figures_without_pynvml_internals(fake_pynvml):
    """Another NVML implementation (the fake module has only the public calls): the
    public call is used, and the figures are the same."""
    nv = Nvml(pid=4242)
    assert nv.process_used(2) == 1 << 30
    assert nv.listed_processes(2) == [(4242, 1 << 30)]
    assert nv.compute_processes(0) == []
