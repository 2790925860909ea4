"""Timing, acceptance and text models of the stand-in server: deterministic given a seed."""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass

from ddsweep.sim.tokenizer import pieces as _pieces

# Common English words; a generated word may span several tokens of the stand-in tokenizer.
_WORD_TEXT = """
the of and to in is that it was for on are as with his they at be this from have or by one had not but what
all were when we there can an your which their said if do will each about how up out them then she many some
so these would other into has more her two like him see time could no make than first been its who now people
my made over did down only way find use may water long little very after words called just where most know
get through back much before go good new write our used me man too any day same right look think also around
another came come work three word must because does part even place well such here take why things help put
years different away again off went old number great tell men say small every found still between name should
home big give air line set own under read last never us left end along while might next sound below saw
something thought always house both world going want school important until form food keep children feet land
side without boy once animal life enough took four head above kind began almost live page got earth need far
hand high year mother light country father let night picture being study second soon story since white ever
paper hard near sentence better best across during today however sure knew try told young sun thing whole
hear example heard several change answer room sea against top turned learn point city play toward five
himself usually money seen car morning body upon family later turn move face door cut done group true half
red fish plants living black eat short united run book gave order open ground cold really table remember tree
course front space inside ago sad early learned brought close nothing idea lived became add become grow draw
yet less wind behind cannot letter among able dog shown mean english rest perhaps certain six feel fire ready
green yes built special ran full town complete person hot anything hold state list stood hundred ten fast felt
kept notice strong voice probably area horse matter stand box start class piece surface river common stop am
talk whether fine round dark past ball girl road blue instead either held already warm gone finally summer
understand moon mind outside power says problem longer winter deep heavy carefully follow beautiful everyone
leave everything game system bring watch shape meant coast
"""
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Knobs:
    """The speculative-decoding configuration the server actually applies."""

    kind: str  # "ddtree", "dflash" or "ar": the timing model (a tree, a chain, none)
    budget: int | None
    topk: int | None
    block_size: int | None
    window: int | None
    algorithm: str | None = None  # the engine's algorithm (DDTREE, DFLASH, STANDALONE, NGRAM); None: ar


@dataclass(frozen=True)
class ModelParams:
    """Parameters of the timing and acceptance model (all times in milliseconds)."""

    step_ms: float = 4.0
    token_cost: float = 0.033
    draft_frac: float = 0.86
    draft_batch_frac: float = 0.072
    prefill_ms_per_1k: float = 20.0
    trained_block_size: int = 8
    trained_window: int = 2048
    accept_fixed: int | None = None
    q0: float = 0.85
    q0_code: float = 0.92
    q0_post_eos: float = 0.985
    q_decay: float = 0.92
    beyond_factor: float = 0.9
    branch_gain: float = 0.3
    drift: float = 0.0  # GPU-like slow-down under sustained load (Heat): at most this fraction of the step time
    drift_s: float = 1.0  # its time constant, in seconds of load (and of idling, to recover)


def verify_slots(knobs: Knobs) -> int:
    """Tokens the target model verifies per request and step: budget+1 (DDTree), block size (DFlash), 1 (AR)."""
    if knobs.kind == "ddtree":
        return int(knobs.budget or 0) + 1
    if knobs.kind == "dflash":
        return int(knobs.block_size or 1)
    return 1


def step_time_s(params: ModelParams, knobs: Knobs, batch: int) -> float:
    """Duration of one decode (verify) step for `batch` running requests, in seconds."""
    if batch <= 0:
        return 0.0
    tokens = batch * verify_slots(knobs)
    ms = params.step_ms * (1.0 + params.token_cost * (tokens - 1))
    if knobs.kind != "ar" and knobs.algorithm != "NGRAM":  # NGRAM looks drafts up: no drafter runs
        ms += params.step_ms * (params.draft_frac + params.draft_batch_frac * (batch - 1))
    return ms / 1000.0


@dataclass
class Heat:
    """A GPU-like drift (`--sim-drift`): under sustained load every step slows down towards 1 + `fraction` times
    its time, with time constant `tau_s` of load, and idling relaxes it back at the same rate, as a GPU's clocks
    fall while it heats and recover as it cools. A cell early in a launch, such as a screening job's, slows down
    while it runs (its sub-windows disagree until it has run several time constants); a later one finds the
    server warm, unless the gap before it cooled it."""

    fraction: float
    tau_s: float
    level: float = 0.0
    at: float | None = None

    def advance(self, now: float, busy: bool) -> float:
        """Move the heat to `now` (under load since the last call when `busy`); returns the step-time factor."""
        if self.at is not None and self.tau_s > 0 and now > self.at:
            target = 1.0 if busy else 0.0
            self.level = target + (self.level - target) * math.exp(-(now - self.at) / self.tau_s)
        self.at = now
        return 1.0 + self.fraction * self.level


def prefill_time_s(params: ModelParams, prompt_tokens: int) -> float:
    """Time to prefill `prompt_tokens` tokens, in seconds."""
    return params.prefill_ms_per_1k * prompt_tokens / 1_000_000.0


# Prompt kinds of the acceptance model: code is more predictable than prose, and text generated past the
# natural end of sequence (`ignore_eos`) repeats, which a drafter predicts best of all.
PROMPT_KINDS = ("prose", "code", "post_eos")
_CODE_RE = re.compile(r"```python|^\s*def \w+\(", re.MULTILINE)


def prompt_kind(prompt: str) -> str:
    """"code" when the prompt holds Python code (a fenced block or a `def` line), else "prose"."""
    return "code" if _CODE_RE.search(prompt) else "prose"


def _first_depth_q(params: ModelParams, kind: str) -> float:
    """Acceptance probability of the first draft depth for a prompt kind."""
    return {"prose": params.q0, "code": params.q0_code, "post_eos": params.q0_post_eos}[kind]


def ddtree_shape(budget: int, topk: int, block_size: int) -> tuple[int, int, int]:
    """(depth, width, nodes) of the tree PR #29907 drafts, with L = block_size - 1: a budget <= L is the spine
    chain of `budget` tokens; a larger budget a tree of width min(max(budget // L + 1, 2), topk) down to depth L
    with at most `budget` nodes and never more than its shape holds (a width-1 tree is a chain of L)."""
    spine = max(1, block_size - 1)
    if budget <= spine:
        return budget, 1, budget
    width = max(1, min(max(budget // spine + 1, 2), topk))
    capacity = spine if width == 1 else width * (width ** spine - 1) // (width - 1)
    return spine, width, min(budget, capacity)


def depth_probabilities(params: ModelParams, knobs: Knobs, kind: str = "prose") -> list[float]:
    """Probability that draft depth j is accepted given depth j-1 was; the list length is the maximum depth.

    A DDTree's nodes beyond the spine are siblings, taken in one fixed order (shallow depths first, a depth's r-th
    sibling two depths after its first), each adding `branch_gain` to its depth's effective width: a larger
    budget or width only adds siblings, so acceptance never falls as the budget rises (PR #29907's best-first
    tree of a larger budget contains the smaller one's)."""
    if knobs.kind == "ar":
        return []
    block = int(knobs.block_size or params.trained_block_size)
    widths = [1.0] * max(1, block - 1)
    if knobs.kind == "ddtree":
        depth, width, nodes = ddtree_shape(int(knobs.budget or 1), int(knobs.topk or 1), block)
        widths = [1.0] * depth
        order = sorted((j + 2 * r, j) for j in range(depth) for r in range(width - 1))
        for _, j in order[:nodes - depth]:
            widths[j] += params.branch_gain
    window_factor = 1.0 if knobs.window == params.trained_window else 0.985
    probs = []
    for j, width in enumerate(widths, start=1):
        q = _first_depth_q(params, kind) * params.q_decay ** (j - 1) * window_factor
        if j >= params.trained_block_size:
            q *= params.beyond_factor
        probs.append(1.0 - (1.0 - q) ** width)
    return probs


def expected_accept_length(params: ModelParams, knobs: Knobs, kind: str = "prose") -> float:
    """Mean tokens accepted per verify step (accepted drafts plus the bonus token) for a prompt kind."""
    if params.accept_fixed is not None and knobs.kind != "ar":
        return float(params.accept_fixed)
    total, survive = 1.0, 1.0
    for p in depth_probabilities(params, knobs, kind):
        survive *= p
        total += survive
    return total


def stable_hash(*parts: object) -> int:
    """A process-independent 64-bit hash of `parts` (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class AcceptanceSampler:
    """Draws accepted-token counts for one request, step by step, reproducible from (seed, prompt).

    The probabilities depend on the prompt's kind; from output position `eos_at` on (a request with
    `ignore_eos` past its natural end) they are those of repeated text.
    """

    def __init__(self, params: ModelParams, knobs: Knobs, seed: int, prompt_key: int, kind: str = "prose",
                 eos_at: int | None = None, fixed: int | None = None) -> None:
        """Prepare the per-depth probabilities and a random stream seeded by (seed, prompt); `fixed` accepts that
        many tokens every step (drafts that always agree with the target)."""
        self._fixed = fixed or (params.accept_fixed if knobs.kind != "ar" else 1)
        self._probs = depth_probabilities(params, knobs, kind)
        self._post_eos = depth_probabilities(params, knobs, "post_eos")
        self._eos_at = eos_at
        self._rng = random.Random(stable_hash("accept", seed, prompt_key))

    def draw(self, position: int = 0) -> int:
        """Tokens accepted by the verify step that starts at output token `position` (at least 1)."""
        if self._fixed is not None:
            return self._fixed
        accepted = 1
        rand = self._rng.random
        past_eos = self._eos_at is not None and position >= self._eos_at
        for p in self._post_eos if past_eos else self._probs:
            if rand() >= p:
                break
            accepted += 1
        return accepted


def generate_pieces(seed: int, prompt: str, n: int, lossy: bool = False) -> list[str]:
    """The first `n` output token pieces for `prompt`: plain prose, identical for every knob setting."""
    rng = random.Random(stable_hash("text", seed, prompt))
    out: list[str] = []
    sentence = 0
    while len(out) < n:
        if sentence >= 6 and rng.random() < 0.12:
            out.append("." if rng.random() < 0.85 else "?")
            sentence = 0
        elif sentence >= 3 and rng.random() < 0.06:
            out.append(",")
        else:
            word = rng.choice(_WORDS)
            if lossy and len(out) >= n // 2 and rng.random() < 0.2:
                word = _WORDS[(stable_hash(prompt, len(out)) % len(_WORDS))]
            out.extend(_pieces(" " + (word.capitalize() if sentence == 0 else word)))
            sentence += 1
    return out[:n]


def natural_length(seed: int, prompt: str, max_len: int = 2048) -> int:
    """Where generation would stop at end-of-sequence when `ignore_eos` is false."""
    return 16 + stable_hash("eos", seed, prompt) % max(1, max_len - 16)


def is_lossy_prompt(seed: int, prompt: str) -> bool:
    """Whether the `lossy` fault changes the output for this prompt (about one prompt in three)."""
    return stable_hash("lossy", seed, prompt) % 3 == 0
