"""Image decoding and its limits (a decompression bomb, a pixel cap, truncated and
non-image bytes: typed errors within a second), and Gemma 3's preprocessing steps."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from pyengine.errors import ImageError, PyEngineError
from pyengine.vision import image


def encoded(rgb: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt, **kw)
    return buf.getvalue()


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ---------------------------------------------------------------- decoding

def png_bomb(side: int) -> bytes:
    """A valid 1-bit PNG of side x side zeros: ~50 KB claiming side^2 pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    comp = zlib.compressobj(9)
    row = bytes(1 + (side + 7) // 8)
    body = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "JPEG"])
def test_decode_formats(fmt):
    rgb = noise(20, 30)
    kw = {"lossless": True} if fmt == "WEBP" else {}
    out = image.decode(encoded(rgb, fmt, **kw))
    assert out.shape == (20, 30, 3) and out.dtype == np.uint8
    if fmt in ("PNG", "WEBP"):
        assert np.array_equal(out, rgb)


def test_gif_first_frame_and_alpha_dropped():
    first, second = np.full((8, 8, 3), 200, np.uint8), np.full((8, 8, 3), 10, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(first).save(buf, format="GIF", save_all=True, append_images=[Image.fromarray(second)])
    assert image.decode(buf.getvalue()).mean() > 150
    rgba = np.dstack([noise(6, 6), np.zeros((6, 6), np.uint8)])
    assert np.array_equal(image.decode(encoded(rgba, "PNG")), rgba[..., :3])


@pytest.mark.parametrize("case", ["bomb", "over_cap", "truncated_jpeg", "truncated_png", "random", "empty", "bmp"])
def test_bad_images_are_image_errors_fast(case):
    jpeg = encoded(noise(64, 64), "JPEG")
    data = {"bomb": lambda: png_bomb(20000),
            "over_cap": lambda: png_bomb(5000),            # under Pillow's own bomb limit, over pyengine's cap
            "truncated_jpeg": lambda: jpeg[:len(jpeg) // 2],
            "truncated_png": lambda: encoded(noise(64, 64), "PNG")[:300],
            "random": lambda: np.random.default_rng(1).bytes(4096),
            "empty": lambda: b"",
            "bmp": lambda: encoded(noise(4, 4), "BMP")}[case]()
    start = time.monotonic()
    with pytest.raises(ImageError) as info:
        image.decode(data)
    assert time.monotonic() - start < 1.0
    assert isinstance(info.value, PyEngineError) and isinstance(info.value, ValueError)   # the server's 400


def test_pixel_cap_is_read_from_the_header():
    assert image.decode(png_bomb(64), max_pixels=64 * 64).shape == (64, 64, 3)
    with pytest.raises(ImageError, match="65x65"):
        image.decode(png_bomb(65), max_pixels=64 * 64)
    with pytest.raises(ImageError, match="bytes"):
        image.decode(b"\0" * 100, max_bytes=99)


def test_resize_normalize_and_patches():
    rgb = noise(40, 24)
    square = image.resize_square(rgb, 32)
    assert square.shape == (32, 32, 3)
    assert image.resize_square(square, 32) is square                      # the tower's size: untouched
    planes = image.normalize(square, (0.5, 0.4, 0.3), (0.25, 0.5, 2.0))
    assert planes.shape == (3, 32, 32) and planes.dtype == np.float32
    assert np.allclose(planes[1, 3, 5], (square[3, 5, 1] / 255 - 0.4) / 0.5, atol=1e-6)
    cut = image.patches(planes, 4)                                       # [64, 3*4*4]
    assert cut.shape == (64, 48)
    # patch (row 1, column 2), channel 2, pixel (3, 1) inside it
    assert cut[1 * 8 + 2, 2 * 16 + 3 * 4 + 1] == planes[2, 4 + 3, 8 + 1]


def test_a_non_square_image_is_fitted_and_padded_as_mtmd_does_for_gemma3():
    """llama.cpp's mtmd keeps Gemma 3's image aspect: 48x64 (w x h) -> 24x32 centred on black."""
    rgb = np.full((64, 48, 3), 200, np.uint8)
    square = image.resize_square(rgb, 32)
    assert square.shape == (32, 32, 3)
    assert (square[:, :4] == 0).all() and (square[:, 28:] == 0).all()       # the bars: (32 - 24) / 2 each
    assert (square[:, 4:28] == 200).all()                                   # the image, flat: still 200
    odd = image.resize_square(np.full((10, 30, 3), 9, np.uint8), 32)        # 30x10 -> 32x11 (10.67 up)
    assert (odd[10:21] == 9).all() and (odd[:10] == 0).all() and (odd[21:] == 0).all()
