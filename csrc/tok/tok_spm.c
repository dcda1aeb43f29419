/* tok_spm.c - SentencePiece segmentation (llama.cpp's llm_tokenizer_spm), chunked.
 *
 * Symbols start as UTF-8 characters; the adjacent pair whose concatenation is the
 * highest-scoring token merges first (the leftmost on ties) until no pair is a token;
 * a symbol that is no token falls back to byte tokens. A merged symbol is always a
 * token, so no symbol spans a boundary the vocabulary never spans: the text is cut
 * before each U+2581 not preceded by a "glued" character (see spm.py), the chunks are
 * segmented independently and cached. A heap keeps a chunk O(n log n).
 */
#include "tok_internal.h"

#define ESCAPED_SPACE_0 0xE2  /* U+2581 in UTF-8: E2 96 81 */
#define ESCAPED_SPACE_1 0x96
#define ESCAPED_SPACE_2 0x81

typedef struct spm_bigram {
    float   score;
    int32_t left;   /* symbol index */
    int32_t right;
    int32_t size;   /* bytes of left + right when pushed */
} spm_bigram;

struct pe_tok_spm {
    tok_map   vocab;        /* token bytes -> id */
    float    *scores;
    int32_t   n_tokens;
    int32_t   byte_ids[256];
    int32_t   unk_id;
    uint32_t *glued;
    int32_t   n_glued;
    tok_cache cache;
    /* scratch, reused across calls */
    int32_t    *off, *len, *next, *prev;
    int64_t     off_cap, len_cap, next_cap, prev_cap;
    spm_bigram *heap;
    int64_t     heap_cap, heap_len;
    pe_tok_ids  chunk_ids;
    char       *escaped;
    int64_t     escaped_cap;
};

void pe_tok_spm_free(pe_tok_spm *spm) {
    if (spm == NULL) {
        return;
    }
    tok_map_free(&spm->vocab);
    tok_cache_free(&spm->cache);
    free(spm->scores);
    free(spm->glued);
    free(spm->off);
    free(spm->len);
    free(spm->next);
    free(spm->prev);
    free(spm->heap);
    pe_tok_ids_free(&spm->chunk_ids);
    free(spm->escaped);
    free(spm);
}

pe_tok_spm *pe_tok_spm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                           const float *scores, const int32_t *byte_ids, int32_t unk_id,
                           const uint32_t *glued, int32_t n_glued) {
    if (n_tokens <= 0 || n_glued < 0 || unk_id >= n_tokens) {
        return NULL;
    }
    pe_tok_spm *spm = calloc(1, sizeof *spm);
    if (spm == NULL) {
        return NULL;
    }
    spm->n_tokens = n_tokens;
    spm->unk_id = unk_id;
    spm->scores = malloc((size_t) n_tokens * sizeof(float));
    spm->glued = malloc((size_t) (n_glued > 0 ? n_glued : 1) * sizeof(uint32_t));
    if (!spm->scores || !spm->glued || tok_map_init(&spm->vocab, n_tokens) < 0 ||
        tok_cache_init(&spm->cache) < 0) {
        pe_tok_spm_free(spm);
        return NULL;
    }
    memcpy(spm->scores, scores, (size_t) n_tokens * sizeof(float));
    if (n_glued > 0) {
        memcpy(spm->glued, glued, (size_t) n_glued * sizeof(uint32_t));
    }
    spm->n_glued = n_glued;
    for (int b = 0; b < 256; b++) {
        spm->byte_ids[b] = byte_ids[b] < n_tokens ? byte_ids[b] : -1;
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        int64_t start = offsets[i], end = offsets[i + 1];
        if (start < 0 || end < start || tok_map_put(&spm->vocab, texts + start, end - start, i) < 0) {
            pe_tok_spm_free(spm);
            return NULL;
        }
    }
    return spm;
}

/* ---- the heap: highest score first, then the leftmost ----------------------------------- */

static inline int bigram_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

TOK_DEFINE_HEAP(pe_tok_spm, spm_bigram, bigram_before)

/* ---- one chunk ------------------------------------------------------------------------- */

/* Push the pair (left, right) when their concatenation is a token. */
static int try_bigram(pe_tok_spm *spm, const char *text, int32_t left, int32_t right) {
    if (left < 0 || right < 0) {
        return 0;
    }
    int32_t size = spm->len[left] + spm->len[right];
    int32_t id = tok_map_get(&spm->vocab, text + spm->off[left], size);
    if (id < 0) {
        return 0;
    }
    spm_bigram item = {spm->scores[id], left, right, size};
    return heap_push(spm, item);
}

static int emit_bytes(pe_tok_spm *spm, const unsigned char *piece, int32_t n, pe_tok_ids *out) {
    for (int32_t k = 0; k < n; k++) {
        int32_t id = spm->byte_ids[piece[k]];
        if (id < 0) {
            id = spm->unk_id;
        }
        if (id < 0) {
            return PE_TOK_ENOBYTE;
        }
        if (tok_ids_push(out, id) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    return 0;
}

static int segment(pe_tok_spm *spm, const char *text, int64_t n_bytes, pe_tok_ids *out) {
    if (n_bytes <= 0) {
        return 0;
    }
    if (n_bytes > INT32_MAX / 2) {
        return PE_TOK_EINVAL;
    }
    int64_t n = 0;  /* symbols: one per UTF-8 character to start with */
    if (tok_grow((void **) &spm->off, &spm->off_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &spm->len, &spm->len_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &spm->next, &spm->next_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &spm->prev, &spm->prev_cap, n_bytes, sizeof(int32_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    for (int64_t pos = 0; pos < n_bytes; n++) {
        int64_t len = tok_utf8_len((unsigned char) text[pos]);
        if (len > n_bytes - pos) {
            len = n_bytes - pos;
        }
        spm->off[n] = (int32_t) pos;
        spm->len[n] = (int32_t) len;
        spm->prev[n] = (int32_t) n - 1;
        spm->next[n] = (int32_t) n + 1;
        pos += len;
    }
    spm->next[n - 1] = -1;
    spm->heap_len = 0;
    for (int32_t i = 1; i < n; i++) {
        if (try_bigram(spm, text, i - 1, i) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    while (spm->heap_len > 0) {
        spm_bigram b = heap_pop(spm);
        int32_t *len = spm->len;
        if (len[b.left] == 0 || len[b.right] == 0 || len[b.left] + len[b.right] != b.size) {
            continue;  /* one side merged into something else since */
        }
        len[b.left] = b.size;
        len[b.right] = 0;
        int32_t after = spm->next[b.right];
        spm->next[b.left] = after;
        if (after >= 0) {
            spm->prev[after] = b.left;
        }
        if (try_bigram(spm, text, spm->prev[b.left], b.left) < 0 ||
            try_bigram(spm, text, b.left, after) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    for (int32_t i = 0; i >= 0; i = spm->next[i]) {
        const char *piece = text + spm->off[i];
        int32_t id = tok_map_get(&spm->vocab, piece, spm->len[i]);
        int rc = id >= 0 ? tok_ids_push(out, id)
                         : emit_bytes(spm, (const unsigned char *) piece, spm->len[i], out);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

static int encode_chunk(pe_tok_spm *spm, const char *text, int64_t len, pe_tok_ids *out) {
    int rc = tok_cache_lookup(&spm->cache, text, len, out);
    if (rc != 0) {
        return rc < 0 ? rc : 0;
    }
    spm->chunk_ids.len = 0;
    rc = segment(spm, text, len, &spm->chunk_ids);
    if (rc < 0) {
        return rc;
    }
    if (tok_ids_append(out, spm->chunk_ids.data, spm->chunk_ids.len) < 0 ||
        tok_cache_store(&spm->cache, text, len, spm->chunk_ids.data, spm->chunk_ids.len) < 0) {
        return PE_TOK_ENOMEM;
    }
    return 0;
}

/* ---- chunking -------------------------------------------------------------------------- */

/* The code point that ends just before byte position pos (pos > 0). */
static uint32_t previous_codepoint(const unsigned char *s, int64_t pos) {
    int64_t start = pos - 1;
    while (start > 0 && pos - start < 4 && (s[start] & 0xC0) == 0x80) {
        start--;
    }
    int64_t at = start;
    uint32_t cp = tok_utf8_decode(s, pos, &at);
    return at == pos ? cp : 0xFFFD;
}

static int is_glued(const pe_tok_spm *spm, uint32_t cp) {
    for (int32_t i = 0; i < spm->n_glued; i++) {
        if (spm->glued[i] == cp) {
            return 1;
        }
    }
    return 0;
}

int pe_tok_spm_encode(pe_tok_spm *spm, const char *text, int64_t len, pe_tok_ids *out) {
    const unsigned char *s = (const unsigned char *) text;
    int64_t start = 0;
    for (int64_t pos = 1; pos + 2 < len; pos++) {
        if (s[pos] != ESCAPED_SPACE_0 || s[pos + 1] != ESCAPED_SPACE_1 || s[pos + 2] != ESCAPED_SPACE_2) {
            continue;
        }
        if (spm->n_glued > 0 && is_glued(spm, previous_codepoint(s, pos))) {
            continue;
        }
        int rc = encode_chunk(spm, text + start, pos - start, out);
        if (rc < 0) {
            return rc;
        }
        start = pos;
        pos += 2;
    }
    return len > start ? encode_chunk(spm, text + start, len - start, out) : 0;
}

int pe_tok_spm_encode_text(pe_tok_spm *spm, const char *text, int64_t len, int prefix_space,
                           pe_tok_ids *out) {
    int64_t spaces = prefix_space ? 1 : 0;
    for (int64_t i = 0; i < len; i++) {
        spaces += text[i] == ' ';
    }
    if (spaces > (INT64_MAX - len) / 2) {
        return PE_TOK_EINVAL;
    }
    if (tok_grow((void **) &spm->escaped, &spm->escaped_cap, len + 2 * spaces + 1, 1) < 0) {
        return PE_TOK_ENOMEM;
    }
    static const char escaped_space[3] = {(char) ESCAPED_SPACE_0, (char) ESCAPED_SPACE_1,
                                          (char) ESCAPED_SPACE_2};
    char *dst = spm->escaped;
    if (prefix_space) {
        memcpy(dst, escaped_space, 3);
        dst += 3;
    }
    for (int64_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(dst, escaped_space, 3);
            dst += 3;
        } else {
            *dst++ = text[i];
        }
    }
    return pe_tok_spm_encode(spm, spm->escaped, dst - spm->escaped, out);
}
