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

        def lin(name, h, b=b):
            return h @ t[b + name + ".weight"].T + t[b + name + ".bias"]

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


# ---------------------------------------------------------------- Pixtral

PIXTRAL_VARIANTS = ("rope_rows_cols_swapped", "rope_halves_same_freqs", "no_rope", "no_img_break",
                    "merger_channel_order")
PIXTRAL_ROPE_THETA = 10000.0


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * w


def _rope_pairs(x: np.ndarray, pos: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """x [..., n, 2k]: adjacent pairs (2i, 2i+1) rotated by pos[n] * freqs[i]."""
    angle = pos[:, None] * freqs[None, :]                                       # [n, k]
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _rope_2d(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, variant: str | None) -> np.ndarray:
    """x [H, n, hd]: Pixtral's 2D RoPE as Hugging Face's PixtralRotaryEmbedding builds it:
    the head_dim ladder theta^(-2j/hd); even rungs turn with the row, odd rungs with the
    column; llama.cpp lays them out as two halves (rows' rungs, then columns')."""
    hd = x.shape[-1]
    ladder = PIXTRAL_ROPE_THETA ** (-np.arange(0, hd, 2) / hd)                  # [hd/2]
    if variant == "no_rope":
        return x
    if variant == "rope_rows_cols_swapped":
        rows, cols = cols, rows
    first, second = ladder[0::2], ladder[1::2]
    if variant == "rope_halves_same_freqs":
        second = first
    half = hd // 2
    return np.concatenate([_rope_pairs(x[..., :half], rows, first), _rope_pairs(x[..., half:], cols, second)], -1)


def pixtral_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [tokens, n_embd_text] ([IMG_BREAK] rows included) of uint8 RGB [H, W, 3]
    already at the size the tower takes (sides multiples of patch x merge)."""
    t, k = read_tensors(mmproj)
    p, n_head = int(k["clip.vision.patch_size"]), int(k["clip.vision.attention.head_count"])
    eps, n_layer = float(k["clip.vision.attention.layer_norm_epsilon"]), int(k["clip.vision.block_count"])
    m = int(k.get("clip.vision.spatial_merge_size", 1))
    mean, std = np.array(k["clip.vision.image_mean"]), np.array(k["clip.vision.image_std"])
    img = (rgb.astype(np.float64) / 255.0 - mean) / std
    ny, nx = rgb.shape[0] // p, rgb.shape[1] // p
    kernel = t["v.patch_embd.weight"]                                           # [n_embd, 3, p, p]
    windows = img.reshape(ny, p, nx, p, 3).transpose(0, 2, 4, 1, 3).reshape(ny * nx, 3, p, p)
    x = np.tensordot(windows, kernel, axes=([1, 2, 3], [1, 2, 3]))              # [n, n_embd]
    x = _rms_norm(x, t["v.pre_ln.weight"], eps)
    n, d = x.shape
    hd = d // n_head
    rows, cols = np.divmod(np.arange(n), nx)
    for i in range(n_layer):
        b = f"v.blk.{i}."
        h = _rms_norm(x, t[b + "ln1.weight"], eps)
        q, kk, v = ((h @ t[b + name + ".weight"].T).reshape(n, n_head, hd).transpose(1, 0, 2)
                    for name in ("attn_q", "attn_k", "attn_v"))
        q, kk = _rope_2d(q, rows, cols, variant), _rope_2d(kk, rows, cols, variant)
        scores = q @ kk.transpose(0, 2, 1) / math.sqrt(hd)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v
        x = x + attn.transpose(1, 0, 2).reshape(n, d) @ t[b + "attn_out.weight"].T
        h = _rms_norm(x, t[b + "ln2.weight"], eps)
        gate, up = h @ t[b + "ffn_gate.weight"].T, h @ t[b + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[b + "ffn_down.weight"].T
    if m > 1:   # Mistral Small 3.1: RMS norm, then each m x m block (torch's unfold: channel-major) projected
        x = _rms_norm(x, t["mm.input_norm.weight"], eps)
        grid = x.reshape(ny // m, m, nx // m, m, d)                              # ty, oy, tx, ox, c
        order = (0, 2, 4, 1, 3) if variant != "merger_channel_order" else (0, 2, 1, 3, 4)
        x = grid.transpose(*order).reshape((ny // m) * (nx // m), d * m * m) @ t["mm.patch_merger.weight"].T
        ny, nx = ny // m, nx // m
    x = _gelu(x @ t["mm.1.weight"].T + t["mm.1.bias"]) @ t["mm.2.weight"].T + t["mm.2.bias"]
    if variant == "no_img_break":
        return x
    out = []
    for r in range(ny):
        out += list(x[r * nx:(r + 1) * nx])
        if r < ny - 1:
            out.append(t["v.token_embd.img_break"])
    return np.array(out)
