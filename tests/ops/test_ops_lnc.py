"""The kernel's launch degree (``_backend.logical_core_degree``): it must match the Neuron runtime's
logical-NeuronCore degree, so NEURON_LOGICAL_NC_CONFIG wins when set, and on a Neuron device the
runtime's default for the architecture (2 on Trainium2) applies when it is not."""

import pytest

from neuron_vit_attn import _backend, _validation


@pytest.fixture
def arch_file(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    monkeypatch.setattr(_validation, "_warned", set())
    path = tmp_path / "arch_type"
    monkeypatch.setattr(_backend, "ARCH_TYPE_SYSFS", str(path))
    return path


@pytest.mark.parametrize("arch,degree", [("NCv3", 2), ("NCv2", 1), ("ncv1\n", 1)])
def test_device_default_follows_the_architecture(arch_file, arch, degree):
    arch_file.write_text(arch)
    assert _backend.logical_core_degree(on_device=True) == degree


def test_device_default_without_sysfs_is_one_core_with_a_warning(arch_file):
    with pytest.warns(UserWarning, match="NEURON_LOGICAL_NC_CONFIG is not set and the runtime's default degree "
                                         "for this NeuronCore architecture is not known .*'unavailable'"):
        assert _backend.logical_core_degree(on_device=True) == 1


def test_device_default_for_an_unknown_architecture_is_one_core_with_a_warning(arch_file):
    arch_file.write_text("NCv9")
    with pytest.warns(UserWarning, match="is not known .*'ncv9'"):
        assert _backend.logical_core_degree(on_device=True) == 1


@pytest.mark.parametrize("on_device", [True, False])
def test_the_variable_wins(arch_file, monkeypatch, on_device):
    arch_file.write_text("NCv3")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert _backend.logical_core_degree(on_device=on_device) == 1
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert _backend.logical_core_degree(on_device=on_device) == 2


def test_cpu_default_is_one_core(arch_file):
    arch_file.write_text("NCv3")
    assert _backend.logical_core_degree() == 1
