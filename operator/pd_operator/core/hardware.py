"""Hardware and model profiles: the published figures the performance model starts from.

Every number is either a public figure (source named next to it) or an assumption (marked as one,
with the reason). Profiles are plain frozen data; `pd_operator.core.perfmodel` turns them into
latency coefficients. Bytes and FLOP/s are in base units; `GB` below means 10**9 bytes, as the
vendors publish them.
"""

from dataclasses import dataclass

GB = 10**9
TB = 10**12
TFLOPS = 10**12

# Prefill runs GEMMs at this fraction of dense peak. Assumption: the middle of the 0.3-0.5 range
# used in the literature (CONTEXT.md). With it the model reproduces the linear term of the
# published Llama-2-70B/8xH100 fit within 4% and the S5000/H200 ratio from peak FLOPs alone; no
# vendor publishes a model-level figure, so every card gets the same value until one is measured.
DEFAULT_MFU = 0.4
# Decode re-reads weights and KV at this fraction of peak HBM bandwidth. Assumption: inside the
# 0.5-0.8 range cited in CONTEXT.md; serving engines' decode kernels are reported at 60-80%.
DEFAULT_MBU = 0.7
# Weights stream from local NVMe or page cache into each card at this rate. Assumption: a node's
# NVMe array gives ~16 GB/s shared by 8 cards; network storage is slower, page cache faster.
DEFAULT_WEIGHT_LOAD_BYTES_PER_SECOND = 2 * GB
# Engine start before weights load and after: process start, compile/graph capture, warm-up.
# Assumption from vLLM/SGLang start-up logs on large models (one to a few minutes in total).
DEFAULT_ENGINE_START_SECONDS = 60.0


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator card: capacity, peak rates, and achievable fractions of them."""

    name: str
    resource_name: str  # the Kubernetes extended resource that schedules one card
    memory_bytes: int
    memory_bandwidth_bytes_per_second: float
    fp8_dense_flops: float  # FLOP/s, dense (no 2:4 sparsity)
    bf16_dense_flops: float  # FLOP/s, dense
    # Card-to-card bandwidth as published: the aggregate of both directions (NVLink's "900 GB/s"
    # is 450 GB/s each way). The model uses half of it for one direction of a ring all-reduce.
    interconnect_bytes_per_second: float
    hourly_price_usd: float  # per card; a placeholder for the business case, set per cluster
    # The card's `<vendor>/gpu.product` node label, as the vendor's feature discovery sets it.
    gpu_product: str
    mfu: float = DEFAULT_MFU
    mbu: float = DEFAULT_MBU
    weight_load_bytes_per_second: float = DEFAULT_WEIGHT_LOAD_BYTES_PER_SECOND
    engine_start_seconds: float = DEFAULT_ENGINE_START_SECONDS

    def __post_init__(self) -> None:
        positive = {
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth_bytes_per_second": self.memory_bandwidth_bytes_per_second,
            "fp8_dense_flops": self.fp8_dense_flops,
            "bf16_dense_flops": self.bf16_dense_flops,
            "interconnect_bytes_per_second": self.interconnect_bytes_per_second,
            "weight_load_bytes_per_second": self.weight_load_bytes_per_second,
        }
        for field, value in positive.items():
            if value <= 0:
                raise ValueError(f"{self.name}: {field} must be positive, got {value}")
        for field, fraction in {"mfu": self.mfu, "mbu": self.mbu}.items():
            if not 0 < fraction <= 1:
                raise ValueError(f"{self.name}: {field} must lie in (0, 1], got {fraction}")
        if self.hourly_price_usd < 0 or self.engine_start_seconds < 0:
            raise ValueError(f"{self.name}: price and start time must not be negative")

    def dense_flops(self, weight_dtype_bytes: float) -> float:
        """Peak dense FLOP/s for a model stored at `weight_dtype_bytes` per parameter.

        One byte or less (FP8, or INT4 weights with FP8 activations) runs on the FP8 units;
        wider weights run on the BF16 units.
        """
        return self.fp8_dense_flops if weight_dtype_bytes <= 1 else self.bf16_dense_flops


@dataclass(frozen=True)
class ModelProfile:
    """The shape of a served model, as far as time and memory depend on it."""

    name: str
    total_params: int
    active_params: int  # parameters one token passes through (MoE: shared + its routed experts)
    layers: int
    d_model: int
    # KV cache: K and V, each kv_heads x head_dim per layer. MLA caches one latent per layer
    # instead; it is written here as kv_heads=1 and head_dim = latent width / 2, which gives the
    # same bytes through the same formula.
    kv_heads: int
    head_dim: int
    # Width of the attention score and value products, summed over query heads:
    # heads x (qk_head_dim + v_head_dim) / 2. Equals d_model for plain MHA/GQA with
    # heads x head_dim = d_model; differs for GLM-4.5 (96 x 128 > 5120) and for MLA.
    attention_width: int
    weight_dtype_bytes: float  # bytes per parameter as served: FP8 1, BF16 2, INT4 0.5
    kv_dtype_bytes: int  # bytes per KV-cache element as served: FP8 1, BF16 2
    routed_experts: int = 0  # MoE routed experts per layer; 0 for a dense model
    experts_per_token: int = 0  # routed experts each token uses; 0 for a dense model
    # The longest sequence (prompt plus answer) the model takes: config.json's
    # max_position_embeddings, vLLM's default --max-model-len. None: not known, no limit.
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if min(self.layers, self.d_model, self.kv_heads, self.head_dim, self.attention_width) < 1:
            raise ValueError(f"{self.name}: dimensions must be positive")
        if not 0 < self.active_params <= self.total_params:
            raise ValueError(f"{self.name}: need 0 < active_params <= total_params")
        if self.weight_dtype_bytes <= 0 or self.kv_dtype_bytes < 1:
            raise ValueError(f"{self.name}: dtype sizes must be positive")
        if (self.routed_experts == 0) != (self.experts_per_token == 0):
            raise ValueError(f"{self.name}: set both routed_experts and experts_per_token, or none")
        if self.experts_per_token > self.routed_experts:
            raise ValueError(f"{self.name}: experts_per_token exceeds routed_experts")
        if self.shared_params < 0:
            raise ValueError(f"{self.name}: active_params too small for the expert counts")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError(f"{self.name}: max_context_tokens must be positive")

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as served."""
        return round(self.total_params * self.weight_dtype_bytes)

    @property
    def shared_params(self) -> int:
        """Parameters every token uses (attention, dense layers, shared experts, embeddings).

        Derived from total P, active A and the routed fraction k/E: A = S + (P - S)k/E.
        """
        if self.routed_experts == 0:
            return self.total_params
        routed_fraction = self.experts_per_token / self.routed_experts
        if routed_fraction == 1:
            return self.total_params
        return round(
            (self.active_params - self.total_params * routed_fraction) / (1 - routed_fraction)
        )


H200_SXM = HardwareProfile(
    name="h200",
    resource_name="nvidia.com/gpu",
    gpu_product="NVIDIA-H200",
    memory_bytes=141 * GB,  # NVIDIA H200 datasheet
    memory_bandwidth_bytes_per_second=4.8 * TB,  # datasheet; the articles' "4.8 TB/s" decode GPU
    fp8_dense_flops=1979 * TFLOPS,  # datasheet 3,958 is with 2:4 sparsity; dense is half
    bf16_dense_flops=989 * TFLOPS,  # datasheet 1,979 with sparsity
    interconnect_bytes_per_second=900 * GB,  # NVLink 4, both directions
    hourly_price_usd=3.5,  # placeholder: 2025 on-demand cloud prices run about 3-4 USD
)

H100_SXM = HardwareProfile(
    name="h100",
    resource_name="nvidia.com/gpu",
    gpu_product="NVIDIA-H100-80GB-HBM3",
    memory_bytes=80 * GB,  # datasheet
    memory_bandwidth_bytes_per_second=3.35 * TB,  # datasheet
    fp8_dense_flops=1979 * TFLOPS,  # same compute die as H200
    bf16_dense_flops=989 * TFLOPS,
    interconnect_bytes_per_second=900 * GB,  # NVLink 4, both directions
    hourly_price_usd=2.5,  # placeholder: 2025 on-demand cloud prices run about 2-3 USD
)

H20 = HardwareProfile(
    name="h20",
    resource_name="nvidia.com/gpu",
    gpu_product="NVIDIA-H20",
    memory_bytes=96 * GB,  # datasheet
    memory_bandwidth_bytes_per_second=4.0 * TB,  # datasheet: a bandwidth-rich, compute-poor card
    fp8_dense_flops=296 * TFLOPS,  # datasheet
    bf16_dense_flops=148 * TFLOPS,  # datasheet
    interconnect_bytes_per_second=900 * GB,  # NVLink 4, both directions
    hourly_price_usd=1.2,  # placeholder: no public cloud list price; set per cluster
)

MTT_S5000 = HardwareProfile(
    name="mtt-s5000",
    resource_name="mthreads.com/gpu",  # Moore Threads device plugin
    gpu_product="MTT-S5000",
    memory_bytes=80 * GB,  # Moore Threads public figure (CONTEXT.md)
    memory_bandwidth_bytes_per_second=1.6 * TB,  # public figure (CONTEXT.md)
    # ~1,000 TFLOPS FP8 is public; dense or sparse is not stated. Treated as dense: the articles'
    # 46-54% of H200 per card matches 1000/1979 = 0.505 only if it is.
    fp8_dense_flops=1000 * TFLOPS,
    bf16_dense_flops=500 * TFLOPS,  # assumption, not published: half of FP8, as on Hopper
    # 784 GB/s between cards (MTLink, public figure); read like NVLink's, both directions.
    interconnect_bytes_per_second=784 * GB,
    hourly_price_usd=1.5,  # placeholder: no public price; below half of H200 makes 2:1 pay off
)

HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    profile.name: profile for profile in (MTT_S5000, H200_SXM, H20, H100_SXM)
}


LLAMA2_70B = ModelProfile(
    name="llama-2-70b",
    # 68.98B parameters in the released checkpoint; one token uses all of them (dense).
    total_params=69_000_000_000,
    active_params=69_000_000_000,
    layers=80,
    d_model=8192,
    kv_heads=8,  # GQA
    head_dim=128,
    attention_width=8192,  # 64 heads x 128
    weight_dtype_bytes=2,  # BF16, as in the published fit
    kv_dtype_bytes=2,
    max_context_tokens=4096,
)

# GLM-4.5 (zai-org config.json): 92 layers, hidden 5120, 96 query heads and 8 KV heads of 128,
# 160 routed experts with 8 per token plus a shared one, 355B total / 32B active (model card).
# The articles ran GLM-5.2-FP8, whose architecture is not public in our sources; GLM-4.5 stands
# in for "GLM-class" and the gap this leaves is stated in docs/performance-model.md.
GLM_45_FP8 = ModelProfile(
    name="glm-4.5-fp8",
    total_params=355_000_000_000,
    active_params=32_000_000_000,
    layers=92,  # the MTP layer (a 93rd) is not counted: it only runs for speculative decoding
    d_model=5120,
    kv_heads=8,
    head_dim=128,
    attention_width=12288,  # 96 heads x 128: wider than d_model
    weight_dtype_bytes=1,  # FP8 checkpoint
    kv_dtype_bytes=1,  # FP8 KV cache, as in the articles
    routed_experts=160,
    experts_per_token=8,
    max_context_tokens=131_072,  # 128K
)

# DeepSeek-V3 (config.json): 61 layers, hidden 7168, 128 heads, MLA with a 512-wide KV latent
# plus a 64-wide shared RoPE key (576 values per token per layer), qk 128+64 and v 128 per head,
# 256 routed experts with 8 per token; 671B total / 37B active (technical report).
DEEPSEEK_V3_FP8 = ModelProfile(
    name="deepseek-v3-fp8",
    total_params=671_000_000_000,
    active_params=37_000_000_000,
    layers=61,
    d_model=7168,
    kv_heads=1,  # MLA approximation: 576 cached values = 2 x 288
    head_dim=288,
    attention_width=20480,  # 128 x (192 + 128) / 2, the un-absorbed prefill form
    weight_dtype_bytes=1,
    kv_dtype_bytes=1,
    routed_experts=256,
    experts_per_token=8,
    max_context_tokens=163_840,  # 160K
)

# Kimi K2 (Moonshot config.json): DeepSeek-V3 architecture with 64 heads and 384 routed experts;
# about 1.03T total / 33B active. The articles served Kimi K2.6 in FP8 on both pools; K2.6's
# architecture is assumed equal to K2's (K2.5's published config is).
KIMI_K2_FP8 = ModelProfile(
    name="kimi-k2-fp8",
    total_params=1_026_000_000_000,
    active_params=33_000_000_000,
    layers=61,
    d_model=7168,
    kv_heads=1,  # MLA approximation, as for DeepSeek-V3
    head_dim=288,
    attention_width=10240,  # 64 x (192 + 128) / 2
    weight_dtype_bytes=1,
    kv_dtype_bytes=1,
    routed_experts=384,
    experts_per_token=8,
    max_context_tokens=131_072,  # Kimi-K2-Instruct; later K2 releases take 256K
)

MODEL_PROFILES: dict[str, ModelProfile] = {
    profile.name: profile for profile in (GLM_45_FP8, LLAMA2_70B, DEEPSEEK_V3_FP8, KIMI_K2_FP8)
}
