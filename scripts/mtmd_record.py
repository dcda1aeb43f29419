"""llama.cpp's view of one image in one prompt, through libmtmd (llama-cpp-python 0.3.36
ships it): what the synthetic vision models' recorders and live checks share.

run_chunks cuts `prompt` at libmtmd's marker into text and image chunks
(mtmd_helper_bitmap_init_from_buf, mtmd_tokenize), encodes the image
(mtmd_encode_chunk, mtmd_get_output_embd); top_logits_after evaluates the whole
prompt (mtmd_helper_eval_chunks: the image's rows both ways or causal, as the
projector type says) for the top-10 logits after it, on 2 threads; record_case
does both for one image.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

N_CTX = 512     # the context the logits are taken in by default: a prompt must fit it
N_BATCH = 512   # the batches mtmd_helper_eval_chunks feeds


def run_chunks(mtmd, ctx, data: bytes, prompt: str, n_embd: int, image_fields=None):
    """libmtmd's cut of `prompt` (its "{marker}" where the image `data` goes) and every
    image chunk encoded: (chunks, bitmap, segments [{"tokens": [...]} or {"image": n, ...}],
    blocks: float32 [n, n_embd] per image chunk).  `image_fields(chunk)` adds keys to an
    image's segment.  The caller frees chunks and bitmap (free_chunks)."""
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False)
    chunks = mtmd.mtmd_input_chunks_init()
    text_bytes = prompt.format(marker=mtmd.mtmd_get_marker(ctx).decode()).encode()
    text = mtmd.mtmd_input_text(text=text_bytes, text_len=len(text_bytes), add_special=True, parse_special=True)
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    if mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
        raise SystemExit("mtmd_tokenize failed")
    segments, blocks = [], []
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == 0:   # text
            n = ctypes.c_size_t()
            ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            segments.append({"tokens": [int(ids[j]) for j in range(n.value)]})
            continue
        n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        extra = image_fields(chunk) if image_fields else {}
        if mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
            raise SystemExit("mtmd_encode_chunk failed")
        out = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n_tokens * n_embd,))
        blocks.append(out.astype(np.float32).reshape(n_tokens, n_embd).copy())
        segments.append({"image": int(n_tokens), **extra})
    return chunks, bitmap, segments, blocks


def free_chunks(mtmd, chunks, bitmap) -> None:
    mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_input_chunks_free(chunks)


def record_case(llama_cpp, model, mmproj: Path, data: bytes, prompt: str, n_embd: int,
                logits: bool = True) -> dict:
    """{"segments": [{"tokens": [...]} or {"image": n}], "top_logits": [[token, logit]] or
    None, "n_tokens": the image's rows, "embeddings": float32 [n, n_embd]} of `prompt`
    (its "{marker}" where the image `data` goes) through `mmproj` and `model`."""
    from llama_cpp import mtmd_cpp as mtmd

    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup, cparams.print_timings = False, 2, False, False
    ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), model, cparams)
    if not ctx:
        raise SystemExit("mtmd_init_from_file failed")
    chunks, bitmap, segments, blocks = run_chunks(mtmd, ctx, data, prompt, n_embd)
    top = top_logits_after(llama_cpp, mtmd, ctx, model, chunks) if logits else None
    mtmd.mtmd_free(ctx)
    free_chunks(mtmd, chunks, bitmap)
    rows = blocks[-1]
    return {"segments": segments, "top_logits": top, "n_tokens": len(rows), "embeddings": rows}


def top_logits_after(llama_cpp, mtmd, ctx, model, chunks, k: int = 10, n_ctx: int = N_CTX) -> list[list[float]]:
    """[[token, logit], ...] the k largest logits after every chunk (mtmd_helper_eval_chunks,
    batches of 512) in a context of n_ctx."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = n_ctx, N_BATCH, N_BATCH, 2, 2
    cp.flash_attn_type = 0   # plain attention, as the text golden files are recorded
    lctx = llama_cpp.llama_init_from_model(model, cp)
    n_past = llama_cpp.llama_pos(0)
    if mtmd.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past)) != 0:
        raise SystemExit("mtmd_helper_eval_chunks failed")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).astype(np.float64)
    order = np.argsort(-logits, kind="stable")[:k]
    top = [[int(t), float(logits[t])] for t in order]
    llama_cpp.llama_free(lctx)
    return top
