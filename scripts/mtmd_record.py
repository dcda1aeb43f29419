"""llama.cpp's view of one image in one prompt, through libmtmd (llama-cpp-python 0.3.36
ships it): what the synthetic vision models' recorders and live checks share.

record_case cuts `prompt` at libmtmd's marker into text and image chunks
(mtmd_helper_bitmap_init_from_buf, mtmd_tokenize), encodes the image
(mtmd_encode_chunk, mtmd_get_output_embd) and, with `logits`, evaluates the whole
prompt (mtmd_helper_eval_chunks: the image's rows both ways or causal, as the
projector type says) for the top-10 logits after it, on 2 threads.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

N_CTX = 512   # the context the logits are taken in: a prompt must fit it


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
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False)
    chunks = mtmd.mtmd_input_chunks_init()
    text_bytes = prompt.format(marker=mtmd.mtmd_get_marker(ctx).decode()).encode()
    text = mtmd.mtmd_input_text(text=text_bytes, text_len=len(text_bytes), add_special=True, parse_special=True)
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    if mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
        raise SystemExit("mtmd_tokenize failed")
    segments, rows = [], None
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == 0:   # text
            n = ctypes.c_size_t()
            ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            segments.append({"tokens": [int(ids[j]) for j in range(n.value)]})
            continue
        n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        if mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
            raise SystemExit("mtmd_encode_chunk failed")
        out = mtmd.mtmd_get_output_embd(ctx)
        rows = np.ctypeslib.as_array(out, shape=(n_tokens * n_embd,)).astype(np.float32).reshape(n_tokens, -1)
        segments.append({"image": int(n_tokens)})
    top = top_logits_after(llama_cpp, mtmd, ctx, model, chunks) if logits else None
    mtmd.mtmd_free(ctx)
    mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_input_chunks_free(chunks)
    return {"segments": segments, "top_logits": top, "n_tokens": len(rows), "embeddings": rows}


def top_logits_after(llama_cpp, mtmd, ctx, model, chunks, k: int = 10) -> list[list[float]]:
    """[[token, logit], ...] the k largest logits after every chunk (mtmd_helper_eval_chunks)."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = N_CTX, N_CTX, N_CTX, 2, 2
    cp.flash_attn_type = 0   # plain attention, as the text golden files are recorded
    lctx = llama_cpp.llama_init_from_model(model, cp)
    n_past = llama_cpp.llama_pos(0)
    if mtmd.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, N_CTX, True, ctypes.byref(n_past)) != 0:
        raise SystemExit("mtmd_helper_eval_chunks failed")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).astype(np.float64)
    order = np.argsort(-logits, kind="stable")[:k]
    top = [[int(t), float(logits[t])] for t in order]
    llama_cpp.llama_free(lctx)
    return top
