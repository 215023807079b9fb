"""Hand-built trace instructions for formula tests: one operand or instruction per line, without
running a kernel (the scheduler and calibration tests run real kernels through nkisim)."""

import itertools
import math

from nkisim.trace import Instruction, Operand

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3": 1, "int32": 4, "uint8": 1}
_ids = itertools.count(10_000_000)


def operand(role, shape, dtype="bfloat16", buffer="sbuf", write=False, stride=1, storage=None):
    on_chip = buffer in ("sbuf", "psum")
    size = math.prod(shape)
    partitions = shape[0] if on_chip else 1
    free = size // partitions
    item = ITEMSIZE[dtype]
    sid = next(_ids) if storage is None else storage
    return Operand(role=role, shape=tuple(shape), dtype=dtype, buffer=buffer, partitions=partitions, free_elems=free,
                   nbytes=size * item, inner_stride=stride, region=(sid, 0, partitions, 0, free * item * stride),
                   write=write, box=None, contiguous_bytes=(free if stride == 1 else 1) * item)


def instruction(name, engine, reads=(), writes=(), **attrs):
    return Instruction(index=0, name=name, engine=engine, operands=list(writes) + list(reads), attrs=attrs)


def elementwise(name, engine, shape, dtype="bfloat16", src_buffer="sbuf", dst_buffer="sbuf", n_inputs=1, **attrs):
    reads = [operand(f"data{i}", shape, dtype, src_buffer) for i in range(n_inputs)]
    return instruction(name, engine, reads, [operand("dst", shape, dtype, dst_buffer, write=True)], **attrs)


def matmul(k=128, m=128, n=512, dtype="bfloat16", **attrs):
    reads = [operand("stationary", (k, m), dtype), operand("moving", (k, n), dtype)]
    return instruction("nc_matmul", "tensor", reads, [operand("dst", (m, n), "float32", "psum", write=True)],
                       k=k, m=m, n=n, dtype=dtype, stationary_dtype=dtype, is_transpose=False, **attrs)
