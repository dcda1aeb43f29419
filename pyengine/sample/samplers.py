"""The samplers of the chain, one small object each, with llama.cpp's semantics.

Every sampler has `apply(cand)` over a Candidates set; those with history also have
`accept(token)` and `reset()`. Samplers that need randomness share the chain's numpy
Generator, so one seed reproduces the whole chain. The two "draw" samplers (Dist,
Mirostat) end the chain: `select(cand) -> token`.
"""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np

from pyengine.sample.candidates import Candidates, log_partition, softmax, top_k_positions

# Above this many candidates, top-p looks at a growing top slice instead of sorting all.
_TOP_P_SLICE = 256


class LogitBias:
    """Adds a fixed bias to chosen tokens (-inf bans them). Always first in the chain."""

    name = "logit_bias"

    def __init__(self, bias: dict[int, float]) -> None:
        self.tokens = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.amounts = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))

    @property
    def active(self) -> bool:
        return self.tokens.size > 0

    def touched(self) -> np.ndarray:
        """The ids whose logits apply() may change (each from its own logit alone)."""
        return self.tokens

    def apply(self, cand: Candidates) -> None:
        positions, which = cand.positions_of(self.tokens)
        cand.logits[positions] += self.amounts[which]
        cand.sorted = False


class Penalties:
    """Repetition (divide positive / multiply negative logits), frequency and presence
    penalties over the last `last_n` accepted tokens (None = every token seen)."""

    name = "penalties"

    def __init__(self, last_n: int | None, repeat: float, frequency: float, presence: float) -> None:
        self.last_n = last_n
        self.repeat = repeat
        self.frequency = frequency
        self.presence = presence
        self.history: deque[int] = deque()
        self.counts: Counter[int] = Counter()
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None   # sorted_window(), until the window moves

    @property
    def enabled(self) -> bool:
        return self.last_n != 0 and (self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0)

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.counts)

    def touched(self) -> np.ndarray:
        """The ids whose logits apply() may change (each from its own logit alone)."""
        return np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        self._sorted = None
        self.history.append(token)
        self.counts[token] += 1
        if self.last_n is not None and len(self.history) > self.last_n:
            oldest = self.history.popleft()
            self.counts[oldest] -= 1
            if not self.counts[oldest]:
                del self.counts[oldest]

    def accept_many(self, tokens: list[int]) -> None:
        """accept() of each token in order; only the last last_n can still be in the
        window afterwards, so only those are fed (a long prompt costs its window)."""
        for token in tokens[-self.last_n:] if self.last_n else tokens:
            self.accept(token)

    def reset(self) -> None:
        self._sorted = None
        self.history.clear()
        self.counts.clear()

    def apply(self, cand: Candidates) -> None:
        if not self.active:
            return
        tokens, counts = self.tokens_and_counts()
        positions, which = cand.positions_of(tokens)
        cand.logits[positions] = self.penalize(cand.logits[positions], counts[which])
        cand.sorted = False

    def tokens_and_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The tokens in the window (touched()'s order) and how often each occurs there."""
        return self.touched(), np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))

    def sorted_window(self) -> tuple[np.ndarray, np.ndarray]:
        """tokens_and_counts() in ascending token order (what the native greedy pick
        takes), made once per window."""
        if self._sorted is None:
            tokens, counts = self.tokens_and_counts()
            order = np.argsort(tokens)
            self._sorted = (tokens[order], counts[order])
        return self._sorted

    def penalize(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The logits `values` of tokens seen `counts` times, penalised."""
        # Dividing a negative logit would make the token likelier, so those get multiplied.
        values = np.where(values <= 0, values * self.repeat, values / self.repeat)
        values -= counts * self.frequency + self.presence
        return values


class TopNSigma:
    """Keeps tokens whose logit is within n standard deviations of the best logit."""

    name = "top_n_sigma"

    def __init__(self, n: float) -> None:
        self.n = n

    def apply(self, cand: Candidates) -> None:
        if self.n <= 0 or len(cand) <= 1:
            return
        finite = cand.logits[cand.logits > -np.inf].astype(np.float64)
        if finite.size == 0:
            return
        threshold = finite.max() - self.n * finite.std()
        cand.keep(np.flatnonzero(cand.logits >= threshold), sorted=cand.sorted)


class TopK:
    """Keeps the k best tokens (k <= 0 disables); leaves the set sorted."""

    name = "top_k"

    def __init__(self, k: int) -> None:
        self.k = k

    def apply(self, cand: Candidates) -> None:
        if self.k <= 0:
            return
        if cand.sorted:
            cand.keep_prefix(min(self.k, len(cand)))
        else:
            cand.keep(top_k_positions(cand.logits, self.k), sorted=True)


class Typical:
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy
    until their mass exceeds p (p >= 1 disables). Leaves the set unsorted."""

    name = "typ_p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = p
        self.min_keep = min_keep

    def apply(self, cand: Candidates) -> None:
        if self.p >= 1.0 or len(cand) <= 1:
            return
        cand.sort()
        probs = cand.probs()
        with np.errstate(divide="ignore"):
            surprise = -np.log(probs)
        positive = probs > 0
        entropy = float(np.sum(probs[positive] * surprise[positive]))
        order = np.argsort(np.abs(surprise - entropy), kind="stable")
        mass = np.cumsum(probs[order])
        over = np.flatnonzero((mass > self.p) & (np.arange(1, len(order) + 1) >= self.min_keep))
        last = int(over[0]) + 1 if over.size else len(order)
        cand.keep(order[:last], sorted=False)


class TopP:
    """Nucleus sampling: the smallest best-first set whose mass reaches p (p >= 1 disables)."""

    name = "top_p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = p
        self.min_keep = min_keep

    def apply(self, cand: Candidates) -> None:
        if self.p >= 1.0 or len(cand) == 0:
            return
        if cand.sorted:
            cand.keep_prefix(self._cut(cand.probs()))
            return
        log_total = log_partition(cand.logits)
        width = _TOP_P_SLICE
        while True:
            # Only the best slice needs ordering unless the nucleus is wider than it.
            if width * 4 >= len(cand):
                width = len(cand)
            positions = top_k_positions(cand.logits, width)
            count = self._cut(np.exp(cand.logits[positions].astype(np.float64) - log_total))
            if count < positions.size or positions.size == len(cand):
                cand.keep(positions[:count], sorted=True)
                return
            width *= 8

    def _cut(self, sorted_probs: np.ndarray) -> int:
        mass = np.cumsum(sorted_probs)
        reached = np.flatnonzero((mass >= self.p) & (np.arange(1, mass.size + 1) >= self.min_keep))
        return int(reached[0]) + 1 if reached.size else int(mass.size)


class MinP:
    """Keeps tokens whose probability is at least p times the best one's (p <= 0 disables)."""

    name = "min_p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = p
        self.min_keep = min_keep

    def apply(self, cand: Candidates) -> None:
        if self.p <= 0.0 or len(cand) == 0:
            return
        # p_i >= p * p_max  <=>  logit_i >= logit_max + log(p)
        threshold = float(cand.logits.max()) + math.log(self.p)
        if not cand.sorted:
            passing = np.flatnonzero(cand.logits >= threshold)
            if passing.size and passing.size >= self.min_keep:
                cand.keep(passing, sorted=False)
                return
            cand.sort()
        passing = int(np.count_nonzero(cand.logits >= threshold))
        cand.keep_prefix(max(passing, min(self.min_keep, len(cand)), 1))


class Xtc:
    """Exclude Top Choices: with some probability, drop every token above the threshold
    except the least likely of them (threshold > 0.5 disables)."""

    name = "xtc"

    def __init__(self, probability: float, threshold: float, rng: np.random.Generator,
                 min_keep: int = 0) -> None:
        self.probability = probability
        self.threshold = threshold
        self.rng = rng
        self.min_keep = min_keep

    def apply(self, cand: Candidates) -> None:
        if self.probability <= 0.0 or self.threshold > 0.5 or len(cand) < 2:
            return
        if self.rng.random() > self.probability:
            return
        cand.sort()
        probs = cand.probs()
        # sorted descending, so the tokens at or above the threshold form a prefix
        last_above = int(np.count_nonzero(probs >= self.threshold)) - 1
        if last_above > 0 and len(cand) - last_above >= self.min_keep:
            cand.keep(np.arange(last_above, len(cand)), sorted=True)


class Temperature:
    """Divides logits by the temperature; with a dynamic range the temperature follows
    the normalised entropy of the candidates. Temperature <= 0 keeps only the best."""

    name = "temperature"

    def __init__(self, temperature: float, dyn_range: float = 0.0, exponent: float = 1.0) -> None:
        self.temperature = temperature
        self.dyn_range = dyn_range
        self.exponent = exponent

    def apply(self, cand: Candidates) -> None:
        if self.dyn_range > 0.0:
            if len(cand) <= 1:
                return
            scale_logits(cand, self.dynamic_temperature(cand))
        else:
            scale_logits(cand, self.temperature)

    def dynamic_temperature(self, cand: Candidates) -> float:
        low = max(0.0, self.temperature - self.dyn_range)
        high = self.temperature + self.dyn_range
        cand.sort()
        probs = cand.probs()
        positive = probs[probs > 0]
        entropy = float(-np.sum(positive * np.log(positive)))
        normalized = entropy / math.log(len(cand))
        return low + (high - low) * normalized ** self.exponent


def scale_logits(cand: Candidates, temperature: float) -> None:
    """Logits / temperature; at 0, or a temperature so small that the best logit
    overflows (or that is 0 as a float32), its limit: the best token alone."""
    if not len(cand):
        return
    divisor = np.float32(temperature)
    if divisor > 0:
        with np.errstate(over="ignore"):
            scaled = cand.logits / divisor
        if np.isfinite(scaled.max()):
            cand.logits = scaled
            return
    cand.keep(np.array([int(np.argmax(cand.logits))]), sorted=True)


class Dist:
    """The seeded draw from the softmax of whatever candidates are left."""

    name = "dist"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def select(self, cand: Candidates) -> int:
        return int(cand.ids[draw_index(softmax(cand.logits), self.rng)])


def draw_index(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw; zero-probability entries can never be chosen."""
    mass = np.cumsum(probs)
    target = rng.random() * mass[-1]
    return min(int(np.searchsorted(mass, target, side="right")), probs.shape[0] - 1)


class Mirostat:
    """Mirostat 1.0: estimate the Zipf exponent from the top m tokens, derive k from the
    target surprise mu, draw from the top k; mu moves toward tau on accept."""

    name = "mirostat"

    def __init__(self, n_vocab: int, tau: float, eta: float, rng: np.random.Generator, m: int = 100) -> None:
        self.n_vocab = n_vocab
        self.tau = tau
        self.eta = eta
        self.rng = rng
        self.m = m
        self.mu = 2.0 * tau
        self.pending: tuple[int, float] | None = None

    def select(self, cand: Candidates) -> int:
        best = top_k_positions(cand.logits, min(self.m, len(cand)))
        k = self._estimate_k(np.exp(cand.logits[best].astype(np.float64) - log_partition(cand.logits)))
        chosen = top_k_positions(cand.logits, min(k, len(cand)))
        kept = softmax(cand.logits[chosen])
        index = draw_index(kept, self.rng)
        return self._remember(int(cand.ids[chosen[index]]), float(kept[index]))

    def _estimate_k(self, top_probs: np.ndarray) -> int:
        top_probs = top_probs[top_probs > 0]
        if top_probs.size < 2:
            return 1
        ranks = np.arange(1, top_probs.size, dtype=np.float64)
        t = np.log((ranks + 1) / ranks)
        b = np.log(top_probs[:-1] / top_probs[1:])
        s_hat = float(np.sum(t * b) / np.sum(t * t))
        epsilon = s_hat - 1.0
        with np.errstate(all="ignore"):
            k = np.power(epsilon * np.power(2.0, self.mu) / (1.0 - np.power(float(self.n_vocab), -epsilon)),
                         1.0 / s_hat)
        if not np.isfinite(k):
            return self.n_vocab if not s_hat > 0 else 1
        return max(int(k), 1)

    def _remember(self, token: int, prob: float) -> int:
        self.pending = (token, -math.log2(prob) if prob > 0 else math.inf)
        return token

    def accept(self, token: int) -> None:
        if self.pending is not None and self.pending[0] == token:
            self.mu -= self.eta * (self.pending[1] - self.tau)
        self.pending = None

    def reset(self) -> None:
        self.mu = 2.0 * self.tau
        self.pending = None


class MirostatV2(Mirostat):
    """Mirostat 2.0: drop tokens whose surprise exceeds mu, draw from the rest."""

    name = "mirostat_v2"

    def select(self, cand: Candidates) -> int:
        # -log2(p) <= mu  <=>  logit >= log(Z) - mu * ln 2
        threshold = log_partition(cand.logits) - self.mu * math.log(2.0)
        kept_positions = np.flatnonzero(cand.logits >= threshold)
        if kept_positions.size == 0:
            kept_positions = np.array([int(np.argmax(cand.logits))])
        kept_positions = kept_positions[np.argsort(-cand.logits[kept_positions], kind="stable")]
        kept = softmax(cand.logits[kept_positions])
        index = draw_index(kept, self.rng)
        return self._remember(int(cand.ids[kept_positions[index]]), float(kept[index]))
