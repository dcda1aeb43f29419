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


def _siglip(t: dict, k: dict, rgb: np.ndarray, variant: str | None, positions: np.ndarray | None = None) -> np.ndarray:
    """float64 [n_patches, n_embd] after the post LN: the SigLIP ViT over uint8 RGB [S, S, 3]
    (or [h, w, 3] with its `positions` [n_patches, n_embd])."""
    size, p = int(k["clip.vision.image_size"]), int(k["clip.vision.patch_size"])
    n_head, eps = int(k["clip.vision.attention.head_count"]), float(k["clip.vision.attention.layer_norm_epsilon"])
    n_layer = int(k["clip.vision.block_count"])
    mean, std = np.array(k["clip.vision.image_mean"]), np.array(k["clip.vision.image_std"])
    if variant == "mean_std_swapped":
        mean, std = std, mean
    assert positions is not None or rgb.shape == (size, size, 3)
    img = (rgb.astype(np.float64) / 255.0 - mean) / std                         # [h, w, 3]
    n_y, n_x = rgb.shape[0] // p, rgb.shape[1] // p
    kernel = t["v.patch_embd.weight"]                                          # [n_embd, 3, p, p]
    x = np.empty((n_y * n_x, kernel.shape[0]))
    for py in range(n_y):
        for px in range(n_x):
            window = img[py * p:(py + 1) * p, px * p:(px + 1) * p, :].transpose(2, 0, 1)   # [3, p, p]
            x[py * n_x + px] = np.tensordot(kernel, window, axes=3)
    x += t["v.patch_embd.bias"]
    if variant != "no_position_embd":
        x += t["v.position_embd.weight"] if positions is None else positions   # [n_patches, n_embd]
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
    return _layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)


def gemma3_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] of uint8 RGB [S, S, 3] (already the tower's size)."""
    t, k = read_tensors(mmproj)
    eps = float(k["clip.vision.attention.layer_norm_epsilon"])
    pool = int(k.get("clip.vision.projector.scale_factor", 4))
    x = _siglip(t, k, rgb, variant)
    n_side = int(k["clip.vision.image_size"]) // int(k["clip.vision.patch_size"])
    d = x.shape[1]
    m = n_side // pool
    grid = x.reshape(m, pool, m, pool, d)
    pooled = grid.mean(axis=(1, 3)).reshape(m * m, d)                          # tokens row by row
    if variant != "no_soft_emb_norm":
        pooled = pooled / np.sqrt((pooled ** 2).mean(axis=-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    proj = t["mm.input_projection.weight"]                                     # [n_embd_vision, n_embd_text]
    if variant == "projection_transposed":   # the reading that forgets llama.cpp's transpose
        proj = proj.reshape(proj.shape[1], proj.shape[0]).T
    return pooled @ proj


# and "height_first" (the resampling passes in Pillow's order), which shows on a shrunk image only
IDEFICS3_VARIANTS = ("causal", "no_position_embd", "mean_std_swapped", "shuffle_transposed", "bilinear")


def idefics3_tiles(rgb: np.ndarray, tile: int, longest_edge: int, variant: str | None = None):
    """([tile images row by row], rows, columns, the global image) of uint8 RGB [h, w, 3],
    as Hugging Face's Idefics3 processor resizes and splits it (Lanczos, each pass as
    Pillow computes it, the width first as llama.cpp's mtmd does): the longer side
    to longest_edge keeping the aspect (the other truncated, then rounded up to even),
    both sides up to whole tiles, the global image the tiled one at tile x tile."""
    from PIL import Image

    h, w = rgb.shape[:2]
    if w >= h:
        size = (longest_edge, int(longest_edge / (w / h)))
        size = (size[0], size[1] + size[1] % 2)
    else:
        size = (int(longest_edge * (w / h)), longest_edge)
        size = (size[0] + size[0] % 2, size[1])
    cols, rows = math.ceil(size[0] / tile), math.ceil(size[1] / tile)
    method = Image.BILINEAR if variant == "bilinear" else Image.LANCZOS

    def resize(img, size):   # the width, then the height: llama.cpp's order (Pillow may take the other)
        if variant == "height_first":
            return img.resize((img.width, size[1]), method).resize(size, method)
        return img.resize((size[0], img.height), method).resize(size, method)

    img = resize(resize(Image.fromarray(rgb), size), (cols * tile, rows * tile))
    pixels = np.asarray(img)
    tiles = [pixels[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile] for r in range(rows) for c in range(cols)]
    return tiles, rows, cols, np.asarray(resize(img, (tile, tile)))


def idefics3_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> list[np.ndarray]:
    """float64 [n_tokens, n_embd_text] of each tile of uint8 RGB [h, w, 3], row by row, then
    of the global image: the SigLIP ViT, the pixel shuffle (each s x s square of patches,
    row by row, concatenated into one token), mm.model.fc."""
    t, k = read_tensors(mmproj)
    tile, s = int(k["clip.vision.image_size"]), int(k["clip.vision.projector.scale_factor"])
    tiles, _, _, overview = idefics3_tiles(rgb, tile, int(k["clip.vision.preproc_image_size"]), variant)
    n_side = tile // int(k["clip.vision.patch_size"])
    out = []
    for pixels in [*tiles, overview]:
        x = _siglip(t, k, pixels, variant)
        grid = x.reshape(n_side // s, s, n_side // s, s, -1)                  # Y, dy, X, dx, e
        order = (0, 2, 3, 1, 4) if variant == "shuffle_transposed" else (0, 2, 1, 3, 4)
        merged = grid.transpose(order).reshape((n_side // s) ** 2, -1)         # tokens row by row
        out.append(merged @ t["mm.model.fc.weight"].T)
    return out


def _antialiased_bilinear(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: PyTorch's interpolate(mode="bilinear", antialias=True) along one
    axis - a triangle filter over the input widened by the shrink factor, centred on
    each output's centre mapped back, its weights normalised to sum to one."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        centre = (o + 0.5) * scale
        for i in range(n_in):
            m[o, i] = max(0.0, 1.0 - abs((i + 0.5 - centre) / support))
        m[o] /= m[o].sum()
    return m


def lfm2_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] of uint8 RGB [h, w, 3] already at a size of whole
    tokens: the SigLIP2 ViT with its position grid resized to the patch grid, the pixel
    unshuffle (each s x s square of patches, row by row, into one token), LayerNorm,
    mm.1, GELU(tanh), mm.2."""
    t, k = read_tensors(mmproj)
    p, s = int(k["clip.vision.patch_size"]), int(k["clip.vision.projector.scale_factor"])
    n_y, n_x = rgb.shape[0] // p, rgb.shape[1] // p
    table = t["v.position_embd.weight"]                                       # [side^2, n_embd]
    side = math.isqrt(table.shape[0])
    grid = table.reshape(side, side, -1)
    if variant == "positions_stretched":   # plain bilinear, no antialias: what a shrink must not do
        grid = np.einsum("Yy,yxe,Xx->YXe", _plain_bilinear(side, n_y), grid, _plain_bilinear(side, n_x))
    else:
        grid = np.einsum("Yy,yxe,Xx->YXe", _antialiased_bilinear(side, n_y), grid, _antialiased_bilinear(side, n_x))
    x = _siglip(t, k, rgb, variant, grid.reshape(n_y * n_x, -1))
    d = x.shape[1]
    order = (0, 2, 3, 1, 4) if variant == "shuffle_transposed" else (0, 2, 1, 3, 4)
    x = x.reshape(n_y // s, s, n_x // s, s, d).transpose(order).reshape((n_y // s) * (n_x // s), -1)
    if "mm.input_norm.weight" in t and variant != "no_input_norm":
        x = _layer_norm(x, t["mm.input_norm.weight"], t.get("mm.input_norm.bias", 0.0), 1e-5)
    h = _gelu(x @ t["mm.1.weight"].T + t["mm.1.bias"])
    return h @ t["mm.2.weight"].T + t["mm.2.bias"]


def _plain_bilinear(n_in: int, n_out: int) -> np.ndarray:
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        c = min(max((o + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)
        lo = int(math.floor(c))
        hi = min(lo + 1, n_in - 1)
        m[o, lo] += 1.0 - (c - lo)
        m[o, hi] += c - lo
    return m


LFM2_VARIANTS = ("causal", "no_position_embd", "mean_std_swapped", "shuffle_transposed", "no_input_norm",
                 "positions_stretched")
# ---------------------------------------------------------------- Pixtral

PIXTRAL_VARIANTS = ("rope_rows_cols_swapped", "rope_halves_same_freqs", "no_rope", "no_img_break",
                    "merger_channel_order")
PIXTRAL_ROPE_THETA = 10000.0
# ---------------------------------------------------------------- Qwen2.5-VL

QWEN25VL_VARIANTS = ("no_window", "no_rope", "raster_merge", "one_frame", "no_merger_norm")


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
def _qwen_rope_2d(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Hugging Face's vision rope: x [H, n, hd]; the first hd/4 frequencies turn by the
    patch's row, the next hd/4 by its column, over the halves (rotate_half)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd // 2, 2) / (hd // 2))                     # hd/4 frequencies
    freqs = np.concatenate([rows[:, None] * inv, cols[:, None] * inv], axis=1)   # [n, hd/2]
    cos, sin = np.cos(np.concatenate([freqs, freqs], 1)), np.sin(np.concatenate([freqs, freqs], 1))
    half = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * cos + half * sin


def _merged_patches(t: dict, k: dict, rgb: np.ndarray, *, one_frame: bool = False, raster: bool = False):
    """(x [n, n_embd] both frames' kernels over the patches in merge order - merged token
    (Y, X) row by row, its 2x2 patches row by row -, each patch's row, column, and the
    order as (row, column) pairs) of uint8 RGB [H, W, 3] whose sides are multiples of
    twice the patch.  raster: four consecutive raster patches taken as a group (wrong)."""
    p = int(k["clip.vision.patch_size"])
    mean, std = np.array(k["clip.vision.image_mean"]), np.array(k["clip.vision.image_std"])
    img = (rgb.astype(np.float64) / 255.0 - mean) / std
    n_y, n_x = rgb.shape[0] // p, rgb.shape[1] // p
    kernel = t["v.patch_embd.weight"] + (0 if one_frame else t["v.patch_embd.weight.1"])
    order = [((2 * Y + dy), (2 * X + dx)) for Y in range(n_y // 2) for X in range(n_x // 2)
             for dy in range(2) for dx in range(2)]
    if raster:
        order = [(i // n_x, i % n_x) for i in range(n_y * n_x)]
    x = np.stack([np.tensordot(kernel, img[r * p:(r + 1) * p, c * p:(c + 1) * p, :].transpose(2, 0, 1), axes=3)
                  for r, c in order])
    rows, cols = np.array([o[0] for o in order], float), np.array([o[1] for o in order], float)
    return x, rows, cols, order


def _qwen_attention(lin, h: np.ndarray, n_head: int, rows, cols, *, rope: bool = True, qkv: bool = False,
                    visible: np.ndarray | None = None) -> np.ndarray:
    """The Qwen towers' attention block output (before the residual): q/k/v (fused
    `attn_qkv` or separate), the 2D rope, softmax over the patches `visible` sees."""
    n, d = h.shape
    hd = d // n_head
    if qkv:
        parts = np.split(lin("attn_qkv", h), 3, axis=1)
    else:
        parts = [lin(name, h) for name in ("attn_q", "attn_k", "attn_v")]
    q, kk, v = (part.reshape(n, n_head, hd).transpose(1, 0, 2) for part in parts)
    if rope:
        q, kk = _qwen_rope_2d(q, rows, cols), _qwen_rope_2d(kk, rows, cols)
    scores = q @ kk.transpose(0, 2, 1) / math.sqrt(hd)                               # [H, n, n]
    if visible is not None:
        scores = np.where(visible, scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return lin("attn_out", ((scores / scores.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, d))


def qwen25vl_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] (tokens row by row over the merged grid) of uint8
    RGB [H, W, 3] whose sides are multiples of twice the patch."""
    t, k = read_tensors(mmproj)
    p, n_head = int(k["clip.vision.patch_size"]), int(k["clip.vision.attention.head_count"])
    eps, n_layer = float(k["clip.vision.attention.layer_norm_epsilon"]), int(k["clip.vision.block_count"])
    wa = int(k["clip.vision.n_wa_pattern"])
    x, rows, cols, order = _merged_patches(t, k, rgb, one_frame=variant == "one_frame",
                                           raster=variant == "raster_merge")
    n_x = rgb.shape[1] // p
    side = 112 // p // 2                                                             # window, in merged tokens
    token = np.arange(len(order)) // 4
    ty, tx = token // (n_x // 2), token % (n_x // 2)
    window = (ty // side) * 1000 + tx // side
    n, d = x.shape
    for i in range(n_layer):
        b = f"v.blk.{i}."
        lin = _block_linear(t, b)
        windowed = (i + 1) % wa and variant != "no_window"
        x = x + _qwen_attention(lin, _rms_norm(x, t[b + "ln1.weight"], eps), n_head, rows, cols,
                                rope=variant != "no_rope",
                                visible=window[:, None] == window[None, :] if windowed else None)
        h = _rms_norm(x, t[b + "ln2.weight"], eps)
        gate = lin("ffn_gate", h)
        x = x + lin("ffn_down", gate / (1.0 + np.exp(-gate)) * lin("ffn_up", h))
    if variant != "no_merger_norm":
        x = _rms_norm(x, t["v.post_ln.weight"], eps)
    return _merger_mlp(t, x.reshape(n // 4, 4 * d))                                 # a 2x2 group a row


def _merger_mlp(t: dict, x: np.ndarray, prefix: str = "") -> np.ndarray:
    """mm.0 (or a deepstack fc1), GELU(tanh) as llama.cpp's merger computes it, mm.2 (fc2)."""
    fc1, fc2 = (prefix + "fc1.", prefix + "fc2.") if prefix else ("mm.0.", "mm.2.")
    return _gelu(x @ t[fc1 + "weight"].T + t[fc1 + "bias"]) @ t[fc2 + "weight"].T + t[fc2 + "bias"]


QWEN2VL_VARIANTS = ("gelu_not_quick", "rms_norms", "no_rope", "one_frame", "no_merger_norm")


def qwen2vl_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text] (tokens row by row over the merged grid) of uint8
    RGB [H, W, 3] whose sides are multiples of twice the patch: Qwen2-VL's tower, its
    LayerNorm blocks' MLP with quick GELU, every block attending to every patch."""
    t, k = read_tensors(mmproj)
    n_head = int(k["clip.vision.attention.head_count"])
    eps, n_layer = float(k["clip.vision.attention.layer_norm_epsilon"]), int(k["clip.vision.block_count"])
    x, rows, cols, _ = _merged_patches(t, k, rgb, one_frame=variant == "one_frame")

    def norm(x, name):
        if variant == "rms_norms":
            return _rms_norm(x, t[name + ".weight"], eps)
        return _layer_norm(x, t[name + ".weight"], t[name + ".bias"], eps)

    def act(h):
        return _gelu(h) if variant == "gelu_not_quick" else h / (1.0 + np.exp(-1.702 * h))

    n, d = x.shape
    for i in range(n_layer):
        b = f"v.blk.{i}."
        lin = _block_linear(t, b)
        x = x + _qwen_attention(lin, norm(x, b + "ln1"), n_head, rows, cols, rope=variant != "no_rope")
        x = x + lin("ffn_down", act(lin("ffn_up", norm(x, b + "ln2"))))
    if variant != "no_merger_norm":
        x = norm(x, "v.post_ln")
    return _merger_mlp(t, x.reshape(n // 4, 4 * d))


QWEN3VL_VARIANTS = ("no_position_embd", "positions_not_aligned", "no_deepstack", "deepstack_before_block", "no_rope")


def _corner_bilinear(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: bilinear weights with the corners aligned (output i at input
    i (n_in - 1) / (n_out - 1)), as PyTorch's interpolate(align_corners=True)."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        lo = min(int(math.floor(src)), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        m[o, lo] += 1 - (src - lo)
        m[o, hi] += src - lo
    return m


def qwen3vl_embeddings(mmproj, rgb: np.ndarray, variant: str | None = None) -> np.ndarray:
    """float64 [n_tokens, n_embd_text * (1 + n_deepstack)] (tokens row by row over the merged
    grid: the merger's output, then each deepstack merger's in block order) of uint8 RGB
    [H, W, 3] whose sides are multiples of twice the patch."""
    t, k = read_tensors(mmproj)
    p, n_head = int(k["clip.vision.patch_size"]), int(k["clip.vision.attention.head_count"])
    eps, n_layer = float(k["clip.vision.attention.layer_norm_epsilon"]), int(k["clip.vision.block_count"])
    x, rows, cols, order = _merged_patches(t, k, rgb)
    x = x + t["v.patch_embd.bias"]                                                   # [n, n_embd]
    n_y, n_x = rgb.shape[0] // p, rgb.shape[1] // p
    table = t["v.position_embd.weight"]                                              # [side^2, n_embd]
    side = math.isqrt(table.shape[0])
    grid = table.reshape(side, side, -1)
    resize = _antialiased_bilinear if variant == "positions_not_aligned" else _corner_bilinear
    grid = np.einsum("Yy,yxe,Xx->YXe", resize(side, n_y), grid, resize(side, n_x))
    if variant != "no_position_embd":
        x = x + np.stack([grid[r, c] for r, c in order])
    n, d = x.shape

    def merger(h: np.ndarray, prefix: str) -> np.ndarray:
        if not prefix:   # the main merger: LN over a patch, then a 2x2 group a row
            h = _layer_norm(h, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
            return _merger_mlp(t, h.reshape(n // 4, 4 * d))
        # a deepstack merger: a 2x2 group a row, then LN over the group
        return _merger_mlp(t, _layer_norm(h.reshape(n // 4, 4 * d), t[prefix + "norm.weight"], t[prefix + "norm.bias"],
                                          eps), prefix)

    deepstack = []
    for i in range(n_layer):
        b = f"v.blk.{i}."
        lin = _block_linear(t, b)
        block_input = x
        x = x + _qwen_attention(lin, _layer_norm(x, t[b + "ln1.weight"], t[b + "ln1.bias"], eps), n_head, rows, cols,
                                rope=variant != "no_rope", qkv=True)
        h = _layer_norm(x, t[b + "ln2.weight"], t[b + "ln2.bias"], eps)
        x = x + lin("ffn_down", _gelu(lin("ffn_up", h)))
        if f"v.deepstack.{i}.fc1.weight" in t and variant != "no_deepstack":
            deepstack.append(merger(block_input if variant == "deepstack_before_block" else x, f"v.deepstack.{i}."))
    out = [merger(x, "")] + deepstack
    if variant == "no_deepstack":
        out += [np.zeros_like(out[0])] * sum(f"v.deepstack.{i}.fc1.weight" in t for i in range(n_layer))
    return np.concatenate(out, axis=1)
