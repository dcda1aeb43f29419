"""Float64 references of the vision towers, written from the papers' and Hugging Face's
formulas, not from pyengine's graphs: the weights read by gguf's reader, the image
convolved patch by patch, exact GELU(tanh), softmax and norms, the pool as a mean
over each k x k window of the patch grid, the projection as Hugging Face multiplies
it (x @ mm_input_projection_weight [vision, text]).

`variant` switches one thing off or changes it, for the tests that show a wrong
tower lands far from llama.cpp's numbers.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader

VARIANTS = ("causal", "no_soft_emb_norm", "projection_transposed", "no_position_embd", "mean_std_swapped")


def read_tensors(path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """(tensor name -> float64 array in numpy order, key -> value) of a GGUF of F16/F32 tensors."""
    reader = GGUFReader(path)
    tensors = {t.name: np.asarray(t.data, dtype=np.float64).reshape(tuple(reversed([int(d) for d in t.shape])))
               for t in reader.tensors}
    keys = {k: f.contents() for k, f in reader.fields.items()}
    return tensors, keys


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _block_linear(t: dict, prefix: str):
    """(name, h) -> h @ W.T + b with block `prefix`'s tensors `name`.weight / .bias."""
    return lambda name, h: h @ t[prefix + name + ".weight"].T + t[prefix + name + ".bias"]


def gemma3_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] of uint8 RGB [S, S, 3] (already the tower's size)."""
    t, k = read_tensors(mmproj)
    size, p = int(k["clip.vision.image_size"]), int(k["clip.vision.patch_size"])
    n_head, eps = int(k["clip.vision.attention.head_count"]), float(k["clip.vision.attention.layer_norm_epsilon"])
    n_layer, pool = int(k["clip.vision.block_count"]), int(k.get("clip.vision.projector.scale_factor", 4))
    mean, std = np.array(k["clip.vision.image_mean"]), np.array(k["clip.vision.image_std"])
    if variant == "mean_std_swapped":
        mean, std = std, mean
    assert rgb.shape == (size, size, 3)
    img = (rgb.astype(np.float64) / 255.0 - mean) / std                         # [S, S, 3]
    n_side = size // p
    kernel = t["v.patch_embd.weight"]                                          # [n_embd, 3, p, p]
    x = np.empty((n_side * n_side, kernel.shape[0]))
    for py in range(n_side):
        for px in range(n_side):
            window = img[py * p:(py + 1) * p, px * p:(px + 1) * p, :].transpose(2, 0, 1)   # [3, p, p]
            x[py * n_side + px] = np.tensordot(kernel, window, axes=3)
    x += t["v.patch_embd.bias"]
    if variant != "no_position_embd":
        x += t["v.position_embd.weight"]                                       # [n_patches, n_embd]
    n, d = x.shape
    hd = d // n_head
    for i in range(n_layer):
        b = f"v.blk.{i}."
        lin = _block_linear(t, b)
        h = _layer_norm(x, t[b + "ln1.weight"], t[b + "ln1.bias"], eps)
        q, kk, v = (lin(name, h).reshape(n, n_head, hd).transpose(1, 0, 2) for name in ("attn_q", "attn_k", "attn_v"))
        scores = q @ kk.transpose(0, 2, 1) / math.sqrt(hd)                     # [H, n, n]
        if variant == "causal":
            scores = scores + np.triu(np.full((n, n), -np.inf), 1)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v               # [H, n, hd]
        x = x + lin("attn_out", attn.transpose(1, 0, 2).reshape(n, d))
        h = _layer_norm(x, t[b + "ln2.weight"], t[b + "ln2.bias"], eps)
        x = x + lin("ffn_down", _gelu(lin("ffn_up", h)))
    x = _layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    m = n_side // pool
    grid = x.reshape(m, pool, m, pool, d)
    pooled = grid.mean(axis=(1, 3)).reshape(m * m, d)                          # tokens row by row
    if variant != "no_soft_emb_norm":
        pooled = pooled / np.sqrt((pooled ** 2).mean(axis=-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    proj = t["mm.input_projection.weight"]                                     # [n_embd_vision, n_embd_text]
    if variant == "projection_transposed":   # the reading that forgets llama.cpp's transpose
        proj = proj.reshape(proj.shape[1], proj.shape[0]).T
    return pooled @ proj


# ---------------------------------------------------------------- Qwen2.5-VL

QWEN25VL_VARIANTS = ("no_window", "no_rope", "raster_merge", "one_frame", "no_merger_norm")


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * w


def _rope_2d(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Hugging Face's vision rope: x [H, n, hd]; the first hd/4 frequencies turn by the
    patch's row, the next hd/4 by its column, over the halves (rotate_half)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd // 2, 2) / (hd // 2))                     # hd/4 frequencies
    freqs = np.concatenate([rows[:, None] * inv, cols[:, None] * inv], axis=1)   # [n, hd/2]
    cos, sin = np.cos(np.concatenate([freqs, freqs], 1)), np.sin(np.concatenate([freqs, freqs], 1))
    half = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * cos + half * sin


def qwen25vl_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] (tokens row by row over the merged grid) of uint8
    RGB [H, W, 3] whose sides are multiples of twice the patch."""
    t, k = read_tensors(mmproj)
    p, n_head = int(k["clip.vision.patch_size"]), int(k["clip.vision.attention.head_count"])
    eps, n_layer = float(k["clip.vision.attention.layer_norm_epsilon"]), int(k["clip.vision.block_count"])
    wa = int(k["clip.vision.n_wa_pattern"])
    mean, std = np.array(k["clip.vision.image_mean"]), np.array(k["clip.vision.image_std"])
    img = (rgb.astype(np.float64) / 255.0 - mean) / std
    n_y, n_x = rgb.shape[0] // p, rgb.shape[1] // p
    kernel = t["v.patch_embd.weight"] + (0 if variant == "one_frame" else t["v.patch_embd.weight.1"])
    # patches in merge order: merged token (Y, X) row by row, its 2x2 patches row by row
    order = [((2 * Y + dy), (2 * X + dx)) for Y in range(n_y // 2) for X in range(n_x // 2)
             for dy in range(2) for dx in range(2)]
    if variant == "raster_merge":   # four consecutive raster patches taken as a group
        order = [(i // n_x, i % n_x) for i in range(n_y * n_x)]
    x = np.stack([np.tensordot(kernel, img[r * p:(r + 1) * p, c * p:(c + 1) * p, :].transpose(2, 0, 1), axes=3)
                  for r, c in order])                                                 # [n, n_embd]
    rows, cols = np.array([o[0] for o in order], float), np.array([o[1] for o in order], float)
    side = 112 // p // 2                                                             # window, in merged tokens
    token = np.arange(len(order)) // 4
    ty, tx = token // (n_x // 2), token % (n_x // 2)
    window = (ty // side) * 1000 + tx // side
    n, d = x.shape
    hd = d // n_head
    for i in range(n_layer):
        b = f"v.blk.{i}."
        lin = _block_linear(t, b)
        h = _rms_norm(x, t[b + "ln1.weight"], eps)
        q, kk, v = (lin(name, h).reshape(n, n_head, hd).transpose(1, 0, 2) for name in ("attn_q", "attn_k", "attn_v"))
        if variant != "no_rope":
            q, kk = _rope_2d(q, rows, cols), _rope_2d(kk, rows, cols)
        scores = q @ kk.transpose(0, 2, 1) / math.sqrt(hd)                           # [H, n, n]
        if (i + 1) % wa and variant != "no_window":
            scores = np.where(window[:, None] == window[None, :], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        x = x + lin("attn_out", ((scores / scores.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, d))
        h = _rms_norm(x, t[b + "ln2.weight"], eps)
        gate = lin("ffn_gate", h)
        x = x + lin("ffn_down", gate / (1.0 + np.exp(-gate)) * lin("ffn_up", h))
    if variant != "no_merger_norm":
        x = _rms_norm(x, t["v.post_ln.weight"], eps)
    x = x.reshape(n // 4, 4 * d)                                                     # a 2x2 group a row
    x = _gelu(x @ t["mm.0.weight"].T + t["mm.0.bias"])   # GELU(tanh), as llama.cpp's merger computes it
    return x @ t["mm.2.weight"].T + t["mm.2.bias"]
