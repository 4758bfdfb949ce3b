"""Load a target + drafter once from EngineSettings; generate many times (run, serve and bench use it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import RunFailure, SetupError, UserError
from ..gguf_check import check_drafter, check_header_fits
from ..native.wrappers import ContextSettings, Model, ModelLoadError, TensorOverride
from ..paths import cache_root
from ..settings import EngineSettings
from ..target_file import TargetFile
from . import prefix
from .confidence import ConfidenceCalibration
from .loop import GenerationResult, SpecDecoder, TokenCallback
from .cost import CostCache, CostCurve, calibration_is_stale, measure_cost_curve
from .policy import DraftLengthPolicy
from .sampling import SamplingParams
from .sources import open_drafter
from .sources.corpus import Corpus
from .sources.lookup import LookupSource
from .target import Target
from .token_probs import TokenProbs, rescore

CALIBRATION_CONTEXT = 64      # tokens decoded before the timed batches
CALIBRATION_BUDGET_S = 10.0   # what measuring the verify-cost curve may take on a slow device
LOOKUP_BLOCK = 16             # most tokens + 1 a lookup continuation verifies when no drafter sets the block


def default_target() -> Path:
    from ..packaged_models import smollm2_q4_1  # noqa: PLC0415
    return smollm2_q4_1()


def default_drafter(target: Path) -> Path:
    from ..assets import shipped_drafter_for  # noqa: PLC0415
    found = shipped_drafter_for(target)
    if found is None:
        raise UserError(f"no shipped drafter fits {target.name}; pass one with -md DRAFT.gguf "
                        "(or train one: dflash-gguf train -m TARGET.gguf -o DRAFT.gguf)")
    return found


def _load(path: Path, **kwargs) -> Model:
    """A validated file that llama.cpp still refuses is a runtime failure (exit 1), named by the message."""
    try:
        return Model(path, **kwargs)
    except ModelLoadError as e:
        raise RunFailure(str(e)) from e


def _overrides(specs: Sequence[str]) -> list[TensorOverride]:
    from ..native.offload import parse_override  # noqa: PLC0415
    return [TensorOverride(*parse_override(s)) for s in specs]


class Engine:
    """One target, optionally one drafter, a plain decoder and speculative decoders over them: one per draft
    source (dflash: the drafter, lookup: prompt lookup, hybrid: both, picked per step), `spec` the settings' one."""

    def __init__(self, settings: EngineSettings | EngineInputs, *, speculative: bool = True,
                 calibrate: bool | None = None, corpus: Corpus | None = None):
        """settings: checked here (check_inputs), or what check_inputs returned where a command checked them
        earlier (serve refuses bad files before it listens and loads the engine later). corpus: earlier answers
        the lookup drafts from where a request's own text has no match (--learn; the caller may add to it)."""
        self.corpus = corpus
        from ..native.offload import moe_overrides  # noqa: PLC0415
        inputs = settings if isinstance(settings, EngineInputs) else check_inputs(settings, speculative=speculative)
        settings, target_path, drafter_path = inputs.settings, inputs.target, inputs.drafter
        if settings.fit:
            settings = self._fit(settings, target_path, drafter_path)
        self.settings = s = settings
        t_overrides = _overrides(list(s.override_tensor) + moe_overrides(s.n_cpu_moe, s.cpu_moe))
        self.target_model = _load(target_path, n_gpu_layers=s.n_gpu_layers, overrides=t_overrides,
                                  main_gpu=s.main_gpu, tensor_split=s.tensor_split or None, rpc_servers=s.rpc,
                                  devices=s.devices)
        self.drafter_model = None
        taps: list[int] = []
        block = LOOKUP_BLOCK
        if drafter_path is not None:
            ngl = s.n_gpu_layers if s.draft_n_gpu_layers is None else s.draft_n_gpu_layers
            self.drafter_model = _load(drafter_path, n_gpu_layers=ngl, overrides=_overrides(s.draft_override_tensor),
                                       devices=s.draft_devices or s.devices)
            taps = self.drafter_model.target_layer_ids()
            block = self.drafter_model.block_size() or 16
        self.draft_max = self._draft_max(block)
        self.lookup_max = s.lookup_max if speculative else 0
        if self.target_model.has_recurrent_state():
            # one recurrent-state snapshot per verified row: lookups past the block would double that memory
            self.lookup_max = min(self.lookup_max, self.draft_max)
        ctx = ContextSettings(n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_batch, n_threads=s.n_threads,
                              flash_attn=s.flash_attn, type_k=s.cache_type_k, type_v=s.cache_type_v)
        self.target = Target(self.target_model, ctx, taps=taps, max_verify=self.max_verify)
        self.drafter = None
        if self.drafter_model is not None:
            dctx = ContextSettings(n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_batch, n_threads=s.n_threads,
                                   flash_attn=s.flash_attn, type_k=s.cache_type_k, type_v=s.cache_type_v)
            window = s.draft_ctx if s.draft_ctx and s.draft_ctx < s.n_ctx else None
            self.drafter = open_drafter(self.drafter_model, self.target.ctx, dctx, self.target_model, window=window)
        self.cost: CostCurve | None = None
        self._calibration: tuple[str, float] | None = None    # the cached curve's key and t(1), while unchecked
        if speculative and s.adaptive and calibrate is not False:
            self.cost = self._cost_curve()
            if self.drafter is not None:
                self.drafter.short_blocks = self.cost.short_blocks
        self._decoders: dict[str, SpecDecoder] = {}
        self.plain = SpecDecoder(self.target, None, DraftLengthPolicy(1, adaptive=False))
        self.spec = self.decoder(s.draft_source)
        self.policy = self.spec.policy
        # Turning the taps off for plain decoding and on again re-reserves the scheduler, and any re-reserve on
        # lavapipe (Vulkan) crashes its queue thread (docs/vulkan.md): on device builds the taps stay on (plain
        # pays one small readback of the tapped rows per token)
        self._toggle_taps = self.target_model.native.info.get("backend") == "cpu"
        self._drafter_in_step = True         # the drafter holds what the target holds (engine/prefix.py)

    def decoder(self, source: str) -> SpecDecoder:
        """The speculative decoder of a draft source (built on first use, each with its own policy); the plain
        decoder where the source needs the drafter and none is loaded."""
        if source not in self._decoders:
            drafter = None if source == "lookup" else self.drafter
            if drafter is None and source != "lookup":
                return self.plain
            lookup = LookupSource(self.target_model.n_vocab, self.draft_max + 1, corpus=self.corpus) \
                if source != "dflash" else None
            policy = DraftLengthPolicy(self.draft_max, min(self.settings.draft_min, self.draft_max),
                                       adaptive=self.settings.adaptive, cost=self.cost,
                                       lookup_max=self.lookup_max if lookup is not None else None)
            # The drafter rates its slots and the policy trims blocks by the ratings: DFlash's own probabilities
            # (calibrated as it runs) with --draft-trim, DSpark's confidence head with --draft-confidence
            wanted = drafter is not None and policy.adaptive and (
                self.settings.draft_trim if drafter.rates_by_probability else self.settings.draft_confidence)
            policy.use_confidence = bool(wanted and drafter.rate_slots())
            if policy.use_confidence and drafter.rates_by_probability:
                policy.calibration = ConfidenceCalibration()
            self._decoders[source] = SpecDecoder(self.target, drafter, policy, t_mode=self.settings.t_mode,
                                                 lookup=lookup)
        return self._decoders[source]

    @staticmethod
    def _fit(s: EngineSettings, target_path: Path, drafter_path: Path | None) -> EngineSettings:
        import sys  # noqa: PLC0415
        from dataclasses import replace  # noqa: PLC0415

        from ..native.lib import load  # noqa: PLC0415
        from ..native.offload import gpu_free_bytes  # noqa: PLC0415
        from .fit import plan_fit, read_sizes  # noqa: PLC0415
        free = gpu_free_bytes(load())
        if not free:
            print("fit: no GPU device in this build: everything stays on the CPU", file=sys.stderr)
            return replace(s, n_gpu_layers=0, n_cpu_moe=0, fit=False)
        kv = (s.cache_type_k, s.cache_type_v)
        plan = plan_fit(read_sizes(target_path, s.n_ctx, *kv),
                        read_sizes(drafter_path, s.n_ctx, *kv) if drafter_path else None, s.n_ctx, s.draft_ctx,
                        free[s.main_gpu] if s.main_gpu < len(free) else free[0], margin_bytes=s.fit_target << 20)
        print(plan.describe(), file=sys.stderr)
        return replace(s, n_gpu_layers=plan.n_gpu_layers, n_cpu_moe=plan.n_cpu_moe, fit=False)

    @property
    def max_verify(self) -> int:
        """Most rows one target call verifies: a drafter's block or a lookup continuation, plus the last token."""
        return max(self.draft_max, self.lookup_max) + 1

    def _draft_max(self, block: int) -> int:
        wanted = self.settings.draft_max
        if wanted is None:
            return block - 1
        if wanted > block - 1:
            import sys  # noqa: PLC0415
            print(f"note: --draft-max {wanted} clamped to the drafter's block size - 1 = {block - 1}", file=sys.stderr)
            return block - 1
        if wanted < 1:
            raise UserError(f"--draft-max must be >= 1, got {wanted}")
        return wanted

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams = SamplingParams(),
                 on_tokens: TokenCallback | None = None, *, speculative: bool = True,
                 source: str | None = None, n_cached: int = 0) -> GenerationResult:
        """source: a draft source other than the settings' (bench runs each of them); n_cached: how many prompt
        tokens `keep_prefix(prompt)` kept in the caches (0: a cold start)."""
        decoder = self._decoder_for(speculative, source)
        try:
            if decoder.drafter is not None:
                result = decoder.generate(list(prompt), max_tokens, sampling, on_tokens, n_cached=n_cached)
                self._drafter_in_step = True
            else:
                self._drafter_in_step = self.drafter is None      # a decoder without the drafter does not feed it
                result = self._generate_without_drafter(decoder, list(prompt), max_tokens, sampling, on_tokens,
                                                        n_cached)
        except BaseException:
            self.forget()             # a decode that failed half-way leaves no cache worth reusing
            raise
        self._drop_stale_calibration()
        return result

    def _decoder_for(self, speculative: bool, source: str | None = None) -> SpecDecoder:
        """The decoder a generation runs: plain, the settings' draft source, or `source`."""
        return (self.spec if source is None else self.decoder(source)) if speculative else self.plain

    def _generate_without_drafter(self, decoder: SpecDecoder, prompt: list[int], max_tokens: int,
                                  sampling: SamplingParams, on_tokens: TokenCallback | None,
                                  n_cached: int) -> GenerationResult:
        taps = self.target.ctx.taps if self._toggle_taps else []
        if taps:      # plain decoding and lookup pay nothing for the drafter: no hidden-state copies
            self.target.ctx.set_taps([])
        try:
            return decoder.generate(prompt, max_tokens, sampling, on_tokens, n_cached=n_cached)
        finally:
            if taps:
                self.target.ctx.set_taps(taps)

    # -- the held sequence (engine/prefix.py) ---------------------------------------------------
    @property
    def held_tokens(self) -> list[int]:
        """The tokens whose positions the target holds now."""
        return self.target.tokens

    def keep_prefix(self, prompt: Sequence[int], *, speculative: bool = True) -> int:
        """Cut the held sequence back to its longest common prefix with `prompt`; pass the result to
        `generate(n_cached=...)`. 0 where nothing can be reused (see engine/prefix.py)."""
        drafter = self._decoder_for(speculative).drafter          # a lookup-only decoder leaves the drafter out
        if drafter is not None and not self._drafter_in_step:
            return 0
        return prefix.keep_prefix(self.target, drafter, prompt)

    def widen(self, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Re-decode the last generation's positions as a prefill would (engine/prefix.py), so that the next turn
        reuses them exactly; returns how many were decoded again. Run it while idle, after the answer is out;
        it stops early (the held sequence cut back to what it re-decoded) once `should_stop()` is true."""
        try:
            return prefix.widen(self.target, self.drafter if self._drafter_in_step else None, should_stop)
        except BaseException:
            self.forget()
            raise

    def snapshot(self) -> prefix.SequenceSnapshot:
        return prefix.snapshot(self.target, self.drafter if self._drafter_in_step else None)

    def restore(self, snap: prefix.SequenceSnapshot) -> None:
        try:
            prefix.restore(self.target, self.drafter, snap)
        except BaseException:
            self.forget()
            raise
        self._drafter_in_step = self.drafter is None or snap.drafter is not None

    def token_probs(self, n_prompt: int, generated: list[int], k: int) -> list[TokenProbs] | None:
        """The target's top-k log-probabilities behind each token of the last generation (engine/token_probs.py);
        None on a recurrent target. The held sequence becomes prompt + generated[:-1] in target and drafter."""
        try:
            out = rescore(self.target, n_prompt, generated, k)
            if out is not None and self.drafter is not None and self._drafter_in_step:
                if not self.drafter.truncate(self.target.n_past):
                    self._drafter_in_step = False
            return out
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        """Drop the held sequence: the next generation starts cold."""
        self.target.reset()
        if self.drafter is not None:
            self.drafter.begin()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.target_model.tokenize(text, add_special=add_special)

    # -- verify-cost curve --------------------------------------------------------------------
    def _cost_curve(self) -> CostCurve:
        from ..native.build import default_backend  # noqa: PLC0415
        cache = CostCache(cache_root() / "cost-curves.json")
        backend = self.target_model.native.info.get("backend", default_backend())
        if backend == "cpu":            # DFLASH_CPU_ISA=avx2 on an AVX-512 machine times other kernels
            from ..native.cpu_kernels import CpuKernels  # noqa: PLC0415
            backend = f"cpu-{CpuKernels(self.target_model.native).isa}"
        # the build (llama.cpp commit, patches and kernels) and the KV types: either makes another curve
        kv = f"kv-{self.settings.cache_type_k}-{self.settings.cache_type_v}"
        backend = f"{backend}|{self.target_model.native.lib_dir.name}|{kv}"
        key = CostCache.key(self.target_model.path, backend, self.settings.n_threads, self.settings.n_gpu_layers,
                            self.drafter_model.path if self.drafter_model else None)
        curve = cache.get(key)
        if curve is None:
            curve = self.measure_cost_curve()
            cache.put(key, curve)
        self._calibration = (key, curve.t1())
        return curve

    def _drop_stale_calibration(self) -> None:
        """Forget the cached curve once the t(1) the loop measures says it was timed in another state of the machine
        (cost.calibration_is_stale): the next start measures it again."""
        if self._calibration is None or self.cost is None:
            return
        key, calibrated = self._calibration
        live = self.cost.t1()
        if calibration_is_stale(calibrated, live):
            import sys  # noqa: PLC0415
            CostCache(cache_root() / "cost-curves.json").drop(key)
            self._calibration = None
            print(f"note: the cached verify-cost curve of {self.target_model.path.name} was timed at "
                  f"{calibrated * 1e3:.3g} ms a token, decoding takes {live * 1e3:.3g} ms now: it is measured "
                  "again at the next start", file=sys.stderr)

    def measure_cost_curve(self, sizes: Sequence[int] | None = None) -> CostCurve:
        """Time target decodes of B rows and draft calls after a fixed context, interleaved as the loop runs
        them (cost.measure_cost_curve); without a drafter the verify curve alone. Leaves the caches empty."""
        sizes = sizes or sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, self.draft_max + 1, self.max_verify})
        sizes = [b for b in sizes if b <= self.max_verify]
        # token ids spread over the vocabulary: timing does not depend on the text, and a target whose
        # tokenizer cannot encode some text (llama.cpp aborts on it) still calibrates
        n_vocab = self.target_model.n_vocab
        context = [(17 + 7919 * i) % n_vocab for i in range(CALIBRATION_CONTEXT)]
        drafter = self.drafter
        self.target.reset()
        if drafter is not None:
            drafter.begin()
        self.target.prefill(context, drafter.process if drafter is not None else None)
        probe = context[-1]

        def time_verify(b: int) -> float:
            return self.target.time_verify([probe] * b)

        if drafter is None:
            t_verify = time_verify(max(sizes))
            repeats = int(min(5, max(1, CALIBRATION_BUDGET_S // max(t_verify * sum(sizes) / max(sizes), 1e-9))))
            curve = measure_cost_curve(time_verify, None, sizes=sizes, repeats=repeats)
            self.target.reset()
            return curve

        def time_draft(n: int, short: bool) -> float:
            self.drafter.short_blocks = short
            t0 = time.perf_counter()
            self.drafter.draft(probe, self.target.n_past, n, want_logits=False)
            return time.perf_counter() - t0

        short_before = self.drafter.short_blocks
        draft_ns = sorted({n for n in (1, 2, 3, 4, 6, self.draft_max) if n <= self.draft_max})
        # warm-up (graph allocation for the largest batch and the full block), timed to fit the budget: a slow
        # device (lavapipe: seconds per verify) measures fewer sizes once instead of taking minutes
        t_verify, t_draft = time_verify(max(sizes)), time_draft(self.draft_max, False)
        round_s = t_verify * sum(sizes) / max(sizes) + t_draft * (2 * len(draft_ns) + 2)
        repeats = int(min(5, max(1, CALIBRATION_BUDGET_S // max(round_s, 1e-9))))
        if round_s > CALIBRATION_BUDGET_S:
            sizes = sorted({1, 2, max(sizes)})
            draft_ns = sorted({1, self.draft_max})
        curve = measure_cost_curve(time_verify, time_draft, sizes=sizes, draft_ns=draft_ns, draft_max=self.draft_max,
                                   repeats=repeats)
        self.drafter.short_blocks = short_before
        self.target.reset()
        self.drafter.begin()
        return curve

    def close(self) -> None:
        for part in (self.drafter, self.target):
            if part is not None:
                part.close()
        for m in (self.drafter_model, self.target_model):
            if m is not None:
                m.close()


@dataclass(frozen=True)
class EngineInputs:
    """Settings whose files passed the header checks, with their paths (defaults resolved), and whose native
    build loaded: what `check_inputs` returns and an Engine loads."""
    settings: EngineSettings
    target: Path
    drafter: Path | None               # None: no drafter file is loaded (plain decoding, or lookup without -md)


def check_inputs(settings: EngineSettings, *, speculative: bool = True) -> EngineInputs:
    """Validate the settings and the target (+ drafter) files before llama.cpp sees them (it aborts on some
    malformed files), then load the native build they ask for. Cheap: headers only, cached per file."""
    settings.validate()
    target_path = settings.target or default_target()
    target = TargetFile.open(target_path)     # its header: the engine loads its own llama.cpp model
    # the lookup source needs no drafter file: one is loaded only where it is given (-md)
    wants_drafter = speculative and (settings.draft_source != "lookup" or settings.drafter is not None)
    drafter_path = (settings.drafter or default_drafter(target_path)) if wants_drafter else None
    if drafter_path is not None:
        check_header_fits(check_drafter(drafter_path), target.header)
    require_native(settings)
    return EngineInputs(settings, target_path, drafter_path)


def require_native(settings: EngineSettings | None = None) -> None:
    """Load the build of the backend the settings ask for; fail early with the build hint when it is missing."""
    from ..native.lib import NativeLibraryError, load, select_backend  # noqa: PLC0415
    try:
        select_backend(settings.backend if settings else None)
        load()
    except NativeLibraryError as e:
        raise SetupError(str(e)) from e
