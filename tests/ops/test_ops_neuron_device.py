"""The op on ``neuron`` tensors: dispatcher -> PrivateUse1 kernel -> the NKI kernel, and autograd
on that device. Runs ops_neuron_device_emulation.py in a subprocess (see its docstring for how the
device is emulated on CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops_cases import requires_kernel

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUBPROCESS_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def findings():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "torch_ext"), str(HERE)]))
    env.pop("NEURON_VIT_ATTN_BACKEND", None)
    proc = subprocess.run([sys.executable, str(HERE / "ops_neuron_device_emulation.py")], capture_output=True, text=True,
                          env=env, timeout=SUBPROCESS_TIMEOUT_S, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


pytestmark = requires_kernel


def test_neuron_tensors_reach_the_nki_kernel_through_the_privateuse1_kernel(findings):
    assert findings["input_device"] == "neuron:0" and findings["out_device"] == "neuron:0"
    first = findings["kernel_calls"][0]
    assert first["all_on_neuron"] and first["nc_matmul"] > 0
    # Transformers' (B, H, S, D) views: the kernel reads the (B, S, H, D) projections themselves.
    assert first["layout"] == "bshd" and first["buffers_contiguous"]
    assert first["kernel_shapes"] == [[1, 24, 4, 32], [1, 24, 2, 32], [1, 24, 2, 32]]
    assert first["buffer_ptrs"] == findings["projection_ptrs"]
    # fp32 kernel vs fp32 SDPA on CPU: summation-order differences only.
    assert findings["forward_max_err"] < 1e-5


def test_autograd_on_the_neuron_device(findings):
    assert findings["grad_devices"] == ["neuron:0"]
    assert findings["backward_max_err"] < 1e-5       # the backward recomputes in fp32 eager


def test_flash_attn_forward_and_reference_backend_on_neuron(findings):
    assert findings["flash_out_shape"] == [1, 24, 4, 32] and findings["flash_max_err"] < 1e-5
    assert len(findings["kernel_calls"]) == 2 and findings["op_calls"] == 3
    assert findings["reference_backend_kernel_calls"] == 0
