"""Image bytes -> RGB pixels -> the normalised planes a vision tower takes.

Decoding is Pillow's, held to four formats (PNG, JPEG, WebP, GIF's first frame)
and to a pixel cap read from the header before any pixel is decoded, so a
decompression bomb (a small file that claims a huge canvas) costs a header
read, not gigabytes.  Every failure is an ImageError (the server's 400).
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from pyengine.errors import ImageError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_PIXELS = 4096 * 4096          # width * height: 48 MiB as RGB; towers see at most ~1-2 Mpx
MAX_BYTES = 32 * 1024 * 1024      # encoded size; larger requests are refused before parsing


def decode(data: bytes, *, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """The image in `data` as uint8 RGB [height, width, 3] (alpha dropped, a palette
    expanded, GIF's first frame)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"image must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ImageError(f"image is {len(data)} bytes, more than the {max_bytes} allowed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as img:
                _check_size(img.size, max_pixels)
                img.seek(0)
                rgb = img.convert("RGB")
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"not an image pyengine can read (it reads {', '.join(FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image refused: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise ImageError(f"image could not be decoded (truncated or corrupt): {exc}") from None
    return np.asarray(rgb, dtype=np.uint8)


def _check_size(size: tuple[int, int], max_pixels: int) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ImageError(f"image is {width}x{height} = {width * height} pixels, more than the "
                         f"{max_pixels} allowed; scale it down first")


def resize_square(rgb: np.ndarray, size: int) -> np.ndarray:
    """`rgb` fitted into size x size as llama.cpp's mtmd does for Gemma 3: scaled (Pillow's
    bilinear filter) until its longer side fills the square, the aspect ratio kept (the
    other side rounded up), centred on black; unchanged if already so."""
    return resize_padded(rgb, size, size, "bilinear")


def resize_padded(rgb: np.ndarray, width: int, height: int, method: str,
                  pad: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """`rgb` scaled to fit width x height keeping its aspect ratio (each side times the
    smaller ratio, rounded up, in float32 as mtmd computes it), centred on `pad`."""
    h, w = rgb.shape[:2]
    if (h, w) == (height, width):
        return rgb
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    new_w = min(int(np.ceil(np.float32(w) * scale)), width)
    new_h = min(int(np.ceil(np.float32(h) * scale)), height)
    out = np.empty((height, width, 3), np.uint8)
    out[:] = pad
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top:top + new_h, left:left + new_w] = resize(rgb, new_w, new_h, method)
    return out


def resize(rgb: np.ndarray, width: int, height: int, method: str) -> np.ndarray:
    """`rgb` resized to width x height with Pillow's `method` filter ("bilinear" or
    "lanczos"), the width first and then the height, as llama.cpp's mtmd resamples (in
    Pillow's fixed-point steps; Pillow itself may do the height first, which rounds
    differently when both shrink); unchanged if already that size."""
    from PIL import Image

    if rgb.shape[0] == height and rgb.shape[1] == width:
        return rgb
    resample = {"bilinear": Image.BILINEAR, "lanczos": Image.LANCZOS}[method]
    img = Image.fromarray(rgb, "RGB")
    if img.width != width:
        img = img.resize((width, img.height), resample)
    if img.height != height:
        img = img.resize((width, height), resample)
    return np.asarray(img, dtype=np.uint8)


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """float32 planes [3, height, width] of (pixel / 255 - mean[c]) / std[c], each step in
    float32 (the order llama.cpp's mtmd computes them in)."""
    mean32 = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    std32 = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    planes = np.ascontiguousarray(rgb.transpose(2, 0, 1)).astype(np.float32)
    return (planes / np.float32(255.0) - mean32) / std32


def patches(planes: np.ndarray, patch: int) -> np.ndarray:
    """The image cut into patch x patch squares: float32 [n_patches, 3 * patch * patch],
    patches row by row, each as (channel, row, column) with the column fastest - the
    layout of a GGUF patch-embedding kernel [patch, patch, 3, n_embd], so the
    convolution becomes one product."""
    c, h, w = planes.shape
    if h % patch or w % patch:
        raise ImageError(f"image {w}x{h} does not divide into {patch}-pixel patches")
    grid = planes.reshape(c, h // patch, patch, w // patch, patch)       # c, py, ky, px, kx
    return np.ascontiguousarray(grid.transpose(1, 3, 0, 2, 4)).reshape((h // patch) * (w // patch), -1)
