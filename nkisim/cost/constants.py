"""Every number of the cost model, with where it comes from.

Sources are sections of the project's NKI reference (``nki-reference.md``), which cites the
public Neuron SDK documents: section 3 (hardware table: clocks, bandwidths, peaks) and
section 4.3 (per-instruction cost formulas (a), architecture-guide rules (b), practitioner data (c)).
Numbers marked MODEL are modelling choices of this package, not published figures; each says why.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- per-instruction rules (section 4.3) -------------------------------------------------------

MIN_II = 64                    # cycles, minimum initiation interval of Vector/Scalar/GpSimd (4.3a)
MM_INIT_CYCLES = 64            # cycles, TensorE min(64, N_stationary) term / MM_INIT_LATENCY (4.3a, 4.3b)
FP32_MATMUL_FACTOR = 4         # fp32 matmul is 4x slower than bf16 (4.3a "nc_matmul (fp32)")
FP32_TRANSPOSE_FACTOR = 2      # v3+: transpose mode "2x faster for fp32", i.e. 4x -> 2x (4.3b)
ONEZERO_FP32_FACTOR = 2        # is_*_onezero: "up to 2x faster for fp32 operands" (2.1)
STATIC_OVERHEAD_CYCLES = 100   # "add ~100 cycles static overhead when instructions are tiny (N << 128)
                               # or each depends on the previous one" (4.3b)
TINY_N = 128                   # MODEL: "tiny" read as N < 128 elements per partition (4.3b says N << 128)
GPSIMD_START = 150             # cycles, GpSimd start cost of iota/affine_select (4.3a)
ACT_READ_ACCUMULATOR = 64      # cycles, ScalarE ActReadAccumulator when reduce_res is given (4.3b)
STRIDED_ACCESS_FACTOR = 2.0    # innermost free stride > 16 bytes "halves bandwidth" (4.3b, NC-v2 rule)
STRIDED_ACCESS_BYTES = 16
PE_BLOCK = 32                  # smallest PE tile (tile_size 32) -> the 128x128 array is 4x4 blocks (2.1)

# ---- DMA (section 4.3b, section 3) ---------------------------------------------------------------

DMA_ENGINES = 16               # DMA engines per NeuronCore on trn1/trn2/trn3 (3)
DMA_PARTITIONS_PER_ENGINE = 8  # "~8 partitions per engine for a 128-partition tile" (4.3b)
DMA_FIXED_NS = 1300.0          # fixed cost per transfer: descriptor setup + semaphore (4.3b, DMA bandwidth
                               # guide). MODEL: latency, overlapped across transfers (not engine occupancy)
HWDGE_FIXED_NS = 600.0         # HWDGE instruction ~600 ns (4.3b); used when a kernel asks for dge_mode=hwdge
HWDGE_INSTANCES = 2            # hardware DGE blocks per NeuronCore on trn2+ (3). MODEL: each hwdge DMA holds
                               # one of them for HWDGE_FIXED_NS, so at most two descriptor generations overlap
DMA_SATURATION_BYTES = 4096    # ">= 4 KiB saturates" bytes per partition / contiguous chunk (4.3b)
DMA_HALF_EFFICIENCY_BYTES = 512  # MODEL: per-chunk overhead worth 512 B of transfer, so efficiency is
                               # b/(b+512) normalised to 1 at 4 KiB: 2 KiB -> 90%, 512 B -> 56%,
                               # 256 B -> 38%, 64 B -> 12% ("<256 B severely overhead-bound, >= 2 KiB
                               # recommended minimum, >= 4 KiB saturates", 4.3b)
DMA_TRANSPOSE_EFFICIENCY = {"hbm": 0.9, "sbuf": 0.5}  # dma_transpose <= 90% HBM->SBUF, <= 50% SBUF->SBUF (4.3b)

# ---- what the public measurements say (used by the calibration tests) ---------------------------

MEASURED_DMA_32KIB_NS = 1416.0     # one engine moved 32 KiB HBM->SBUF in 1416 ns on trn2 (4.3b, DMA overview)
MEASURED_MATMUL_2048_MFU = 0.909   # hand-tuned 2048^3 bf16 matmul on trn2 (4.3c)
MEASURED_TINY_DEPENDENT_II_NS = 189.0  # tiny dependent ScalarE instructions, perf guide (4.3b); trn1 clock


@dataclass(frozen=True)
class TargetCost:
    """Per-target engine clocks and bandwidths (section 3 table)."""

    name: str
    nc_version: int
    tensor_ghz: float          # TensorE clock
    vector_ghz: float          # VectorE clock
    scalar_ghz: float          # ScalarE clock
    gpsimd_ghz: float          # GpSimdE clock
    dma_bytes_per_ns: float    # DMA peak per engine (DMA guide table: 17 / 23 / 33 B/ns)
    hbm_gbps: float            # HBM bandwidth per NeuronCore = chip bandwidth / physical cores
    pe_rows: int = 128
    pe_cols: int = 128
    fp8_speedup: float = 1.0   # TensorE fp8 peak over bf16 peak (trn2: 4x128 FP8 vs 2x128 BF16 inputs/cycle)

    def clock_ghz(self, engine: str) -> float:
        """Clock of ``engine``; an engine the model does not know runs at the ScalarE/GpSimd clock
        (MODEL: the documented default for instructions new to nkisim, reported in the profile)."""
        return {"tensor": self.tensor_ghz, "vector": self.vector_ghz, "scalar": self.scalar_ghz,
                "gpsimd": self.gpsimd_ghz}.get(engine, self.scalar_ghz)

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """TensorE peak FLOP/s of one NeuronCore for matmul inputs of ``dtype``:
        128 x 128 PEs x 2 FLOP x clock (section 3 sanity check), fp32 at 1/4, fp8 per ``fp8_speedup``."""
        base = self.pe_rows * self.pe_cols * 2 * self.tensor_ghz * 1e9
        if dtype == "float32":
            return base / FP32_MATMUL_FACTOR
        if dtype.startswith("float8"):
            return base * self.fp8_speedup
        return base

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9


TARGETS = {
    # trn1: NeuronCore-v2, TensorE 2.8 GHz, VectorE 1.12 GHz, ScalarE/GpSimd 1.4 GHz, DMA 17 B/ns per engine,
    # HBM 820 GB/s / 2 cores = 410 GB/s per core (section 3).
    "trn1": TargetCost("trn1", 2, 2.8, 1.12, 1.4, 1.4, 17.0, 410.0),
    # trn2: NeuronCore-v3, TensorE 2.4 GHz, VectorE 0.96 GHz, ScalarE/GpSimd 1.2 GHz, DMA 23 B/ns per engine,
    # HBM 2.9 TB/s / 8 cores = 362.5 GB/s per core (section 3; the attention roofline uses 362 GB/s);
    # FP8 158 TFLOPS = 2x BF16 (double_row).
    "trn2": TargetCost("trn2", 3, 2.4, 0.96, 1.2, 1.2, 23.0, 362.5, fp8_speedup=2.0),
    # trn3: NeuronCore-v4, TensorE 2.4 GHz, VectorE/ScalarE/GpSimd 1.2 GHz, DMA 33 B/ns per engine,
    # HBM 4.9 TB/s / 8 cores = 612.5 GB/s per core (section 3). Non-MX fp8 runs at the bf16 rate (2x128 in).
    "trn3": TargetCost("trn3", 4, 2.4, 1.2, 1.2, 1.2, 33.0, 612.5),
}
