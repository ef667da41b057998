"""Targets: data as written (get_target is pure), fitted to a device's properties (target_for_device),
and kogc.compile fitting its target to the GPU it runs on. No GPU needed: the properties are faked."""
import glob
import os
import re
from types import SimpleNamespace

import pytest
import torch

import kogc.api
from kogc.errors import KogcError
from kogc.targets import H100, H200, MI300X, TARGETS, get_target, target_for_device
from kogc.targets.device import arch_capability

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def props(**over):
    """What torch 2.11's get_device_properties reported on an H200 (fields overridable, or None to drop)."""
    d = dict(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, regs_per_multiprocessor=65536,
             shared_memory_per_multiprocessor=233472, L2_cache_size=60 * 2**20, total_memory=150_109_880_320,
             max_threads_per_multi_processor=2048)
    d.update(over)
    return SimpleNamespace(**{k: v for k, v in d.items() if v is not None})


def test_get_target_is_pure_data(monkeypatch):
    def no_device(*a, **k):
        raise AssertionError("get_target asked the device")
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_device)
    assert get_target("h200") is H200 and get_target("NVIDIA_H100") is H100 and get_target("mi300x") is MI300X
    assert set(TARGETS) == {"h200", "h100", "mi300x"}
    assert H200.num_programs == 396 and H200.device == ""
    with pytest.raises(KeyError, match="h100"):
        get_target("a100")


def test_h100_is_data():
    assert (H100.arch, H100.compute_units, H100.hbm_bytes) == ("sm_90", 132, 80 * 10**9)
    assert (H100.hbm_read_bw, H100.hbm_bw_datasheet) == (3.0e12, 3.35e12)     # measured read, datasheet
    assert arch_capability(H100.arch) == (9, 0) and arch_capability("sm_100a") == (10, 0)


def test_fitted_to_an_h200_the_geometry_is_the_written_one():
    t = target_for_device(H200, props())
    assert (t.compute_units, t.programs_per_unit, t.num_programs) == (132, 3, 396)    # 3 x 4 x 32 x 168 <= 65,536
    assert (t.l2_bytes, t.last_level_cache_bytes, t.hbm_bytes) == (60 * 2**20, 60 * 2**20, 150_109_880_320)
    assert t.device == "NVIDIA H200" and t.name == "h200" and t.hbm_read_bw == H200.hbm_read_bw


def test_programs_per_sm_follow_the_register_file_and_the_cap():
    import dataclasses
    assert target_for_device(H200, props(multi_processor_count=114)).num_programs == 342     # an H100 PCIe
    assert target_for_device(H200, props(regs_per_multiprocessor=32768)).programs_per_unit == 1
    # 255 registers per thread (no cap): 2 programs; 64 registers: 8 (threads per SM allow 16)
    assert target_for_device(dataclasses.replace(H200, max_registers=None), props()).programs_per_unit == 2
    assert target_for_device(dataclasses.replace(H200, max_registers=64), props()).programs_per_unit == 8
    # torch without regs_per_multiprocessor: the target's own register file
    assert target_for_device(H200, props(regs_per_multiprocessor=None)).programs_per_unit == 3
    with pytest.raises(KogcError, match="do not hold one program"):
        target_for_device(H200, props(regs_per_multiprocessor=16384))


def test_a_device_of_another_architecture_is_refused():
    with pytest.raises(KogcError, match=r"NVIDIA A100.*8\.0.*h200.*sm_90"):
        target_for_device(H200, props(name="NVIDIA A100", major=8, minor=0))
    with pytest.raises(KogcError, match="NVIDIA"):
        target_for_device(MI300X, props())


class Scheduled(Exception):
    pass


def test_compile_fits_its_target_to_the_gpu(monkeypatch):
    # kogc.compile on a CUDA GPU with an NVIDIA target schedules for the device's SMs (and refuses a
    # GPU of another architecture before tracing); build_schedule is stopped before anything runs
    import laneformer as lf
    seen = {}

    def stop(graph, target, placement, cfg, num_programs=None):
        seen.update(target=target, placement=placement, cfg=cfg)
        raise Scheduled
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kogc.api, "build_schedule", stop)
    model = lf.kogc_model("tiny")          # on the CPU: a first model on "meta" costs seconds of imports
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props(multi_processor_count=114))
    with pytest.raises(Scheduled):
        kogc.api.compile(model, target="h200")
    assert seen["target"].num_programs == 342 and seen["placement"] == "parallel"
    # the register cap a launch asks for changes the programs per SM
    assert kogc.settings.device_target(H200, "cuda", max_registers=255).programs_per_unit == 2
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props(name="NVIDIA A100", major=8))
    with pytest.raises(KogcError, match="A100"):
        kogc.api.compile(model, target="h200")


def test_target_files_cite_only_what_the_repository_has():
    for path in glob.glob(os.path.join(ROOT, "kogc", "targets", "*.py")):
        text = open(path).read()
        assert "../" not in text and "shared/design" not in text, path
        for doc in re.findall(r"docs/[\w./-]+\.md", text):
            assert os.path.isfile(os.path.join(ROOT, doc)), f"{path} cites {doc}"
