/* tok_bpe.c - BPE words to ids (llama.cpp's llm_tokenizer_bpe), with a word cache.
 *
 * A word's symbols start as its bytes (byte-level vocabularies: each byte stands for
 * its GPT-2 character) or its UTF-8 characters; the adjacent pair with the lowest merge
 * rank merges first (the leftmost on ties) until no pair has a rank. Symbols are ids:
 * vocabulary tokens, or "virtual" ids >= n_vocab for strings that occur only inside
 * merges; a symbol that is no token falls back to per-byte tokens, as in llama.cpp.
 */
#include "tok_split.h"

#define DEAD (-2)    /* a symbol merged into its left neighbour */
#define OPAQUE (-1)  /* a character with no symbol: never merges, falls back to bytes */

typedef struct bpe_bigram {
    int32_t rank;
    int32_t left;           /* position of the left symbol */
    int32_t lsym, rsym;     /* the pair's ids when pushed: stale once either differs */
} bpe_bigram;

struct pe_tok_bpe {
    int32_t     n_vocab;
    int32_t     n_symbols;
    int32_t     flags;
    int32_t     splitter;
    tok_map     symbols;          /* raw bytes -> symbol id */
    tok_pairmap merges;
    int32_t     byte_symbols[256];
    int32_t     byte_fallback[256];
    const uint8_t *cls;
    tok_cache   cache;
    /* scratch */
    int32_t    *sym, *off, *len, *next, *prev;
    int64_t     sym_cap, off_cap, len_cap, next_cap, prev_cap;
    bpe_bigram *heap;
    int64_t     heap_cap, heap_len;
    uint32_t   *cps;
    int64_t    *cp_off;
    int64_t     cps_cap, cp_off_cap;
    pe_tok_ids  word_ids;
};

void pe_tok_bpe_free(pe_tok_bpe *bpe) {
    if (bpe == NULL) {
        return;
    }
    tok_map_free(&bpe->symbols);
    tok_pairmap_free(&bpe->merges);
    tok_cache_free(&bpe->cache);
    free(bpe->sym);
    free(bpe->off);
    free(bpe->len);
    free(bpe->next);
    free(bpe->prev);
    free(bpe->heap);
    free(bpe->cps);
    free(bpe->cp_off);
    pe_tok_ids_free(&bpe->word_ids);
    free(bpe);
}

static int check_params(const pe_tok_bpe_params *p) {
    if (p->n_vocab <= 0 || p->n_symbols < p->n_vocab || p->n_merges < 0) {
        return 0;
    }
    if (p->splitter < PE_TOK_SPLIT_NONE || p->splitter > PE_TOK_SPLIT_QWEN35) {
        return 0;
    }
    if (p->splitter != PE_TOK_SPLIT_NONE && p->cp_classes == NULL) {
        return 0;
    }
    for (int64_t i = 0; i < 3 * (int64_t) p->n_merges; i++) {
        if (p->merges[i] < 0 || p->merges[i] >= p->n_symbols) {
            return 0;
        }
    }
    return 1;
}

pe_tok_bpe *pe_tok_bpe_new(const pe_tok_bpe_params *p) {
    if (!check_params(p)) {
        return NULL;
    }
    pe_tok_bpe *bpe = calloc(1, sizeof *bpe);
    if (bpe == NULL) {
        return NULL;
    }
    bpe->n_vocab = p->n_vocab;
    bpe->n_symbols = p->n_symbols;
    bpe->flags = p->flags;
    bpe->splitter = p->splitter;
    bpe->cls = p->cp_classes;
    if (tok_map_init(&bpe->symbols, p->n_symbols) < 0 ||
        tok_pairmap_init(&bpe->merges, p->n_merges) < 0 || tok_cache_init(&bpe->cache) < 0) {
        pe_tok_bpe_free(bpe);
        return NULL;
    }
    for (int32_t i = 0; i < p->n_symbols; i++) {
        int64_t start = p->symbol_offsets[i], end = p->symbol_offsets[i + 1];
        if (start < 0 || end < start) {
            pe_tok_bpe_free(bpe);
            return NULL;
        }
        if (end > start && tok_map_put(&bpe->symbols, p->symbol_bytes + start, end - start, i) < 0) {
            pe_tok_bpe_free(bpe);
            return NULL;
        }
    }
    for (int32_t r = 0; r < p->n_merges; r++) {
        const int32_t *m = p->merges + 3 * (int64_t) r;
        if (tok_pairmap_put(&bpe->merges, m[0], m[1], r, m[2]) < 0) {
            pe_tok_bpe_free(bpe);
            return NULL;
        }
    }
    for (int b = 0; b < 256; b++) {
        int32_t s = p->byte_symbols ? p->byte_symbols[b] : -1;
        int32_t f = p->byte_fallback[b];
        bpe->byte_symbols[b] = (s >= 0 && s < p->n_symbols) ? s : OPAQUE;
        bpe->byte_fallback[b] = (f >= 0 && f < p->n_vocab) ? f : -1;
    }
    return bpe;
}

/* ---- the heap: lowest rank first, then the leftmost --------------------------------------- */

static inline int bigram_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

TOK_DEFINE_HEAP(pe_tok_bpe, bpe_bigram, bigram_before)

static int try_pair(pe_tok_bpe *bpe, int32_t left, int32_t right) {
    if (left < 0 || right < 0) {
        return 0;
    }
    int32_t lsym = bpe->sym[left], rsym = bpe->sym[right];
    if (lsym < 0 || rsym < 0) {
        return 0;
    }
    int32_t result;
    int32_t rank = tok_pairmap_get(&bpe->merges, lsym, rsym, &result);
    if (rank < 0) {
        return 0;
    }
    bpe_bigram item = {rank, left, lsym, rsym};
    return heap_push(bpe, item);
}

/* ---- one word ------------------------------------------------------------------------------ */

static int initial_symbols(pe_tok_bpe *bpe, const unsigned char *w, int64_t n_bytes, int32_t *count) {
    if (tok_grow((void **) &bpe->sym, &bpe->sym_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &bpe->off, &bpe->off_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &bpe->len, &bpe->len_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &bpe->next, &bpe->next_cap, n_bytes, sizeof(int32_t)) < 0 ||
        tok_grow((void **) &bpe->prev, &bpe->prev_cap, n_bytes, sizeof(int32_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    int byte_level = bpe->flags & PE_TOK_BYTE_LEVEL;
    int32_t n = 0;
    for (int64_t pos = 0; pos < n_bytes; n++) {
        int64_t len = byte_level ? 1 : tok_utf8_len(w[pos]);
        if (len > n_bytes - pos) {
            len = n_bytes - pos;
        }
        bpe->sym[n] = byte_level ? bpe->byte_symbols[w[pos]]
                                 : tok_map_get(&bpe->symbols, (const char *) w + pos, len);
        if (bpe->sym[n] < 0) {
            bpe->sym[n] = OPAQUE;
        }
        bpe->off[n] = (int32_t) pos;
        bpe->len[n] = (int32_t) len;
        bpe->prev[n] = n - 1;
        bpe->next[n] = n + 1;
        pos += len;
    }
    bpe->next[n - 1] = -1;
    *count = n;
    return 0;
}

static int merge_symbols(pe_tok_bpe *bpe, int32_t n) {
    bpe->heap_len = 0;
    for (int32_t i = 1; i < n; i++) {
        if (try_pair(bpe, i - 1, i) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    while (bpe->heap_len > 0) {
        bpe_bigram b = heap_pop(bpe);
        int32_t right = bpe->next[b.left];
        if (bpe->sym[b.left] != b.lsym || right < 0 || bpe->sym[right] != b.rsym) {
            continue;  /* outdated: one side merged into something else since */
        }
        int32_t result;
        tok_pairmap_get(&bpe->merges, b.lsym, b.rsym, &result);
        bpe->sym[b.left] = result;
        bpe->len[b.left] += bpe->len[right];
        bpe->sym[right] = DEAD;
        int32_t after = bpe->next[right];
        bpe->next[b.left] = after;
        if (after >= 0) {
            bpe->prev[after] = b.left;
        }
        if (try_pair(bpe, bpe->prev[b.left], b.left) < 0 || try_pair(bpe, b.left, after) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    return 0;
}

static int emit_symbols(pe_tok_bpe *bpe, const unsigned char *w, pe_tok_ids *out) {
    for (int32_t i = 0; i >= 0; i = bpe->next[i]) {
        int32_t s = bpe->sym[i];
        if (s >= 0 && s < bpe->n_vocab) {
            if (tok_ids_push(out, s) < 0) {
                return PE_TOK_ENOMEM;
            }
            continue;
        }
        for (int32_t k = 0; k < bpe->len[i]; k++) {  /* not a token: its bytes that are */
            int32_t id = bpe->byte_fallback[w[bpe->off[i] + k]];
            if (id >= 0 && tok_ids_push(out, id) < 0) {
                return PE_TOK_ENOMEM;
            }
        }
    }
    return 0;
}

static int only_newlines(const unsigned char *w, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (w[i] != '\n') {
            return 0;
        }
    }
    return 1;
}

static int encode_word(pe_tok_bpe *bpe, const char *word, int64_t n_bytes, pe_tok_ids *out) {
    if (n_bytes <= 0) {
        return 0;
    }
    if (n_bytes > INT32_MAX / 2) {
        return PE_TOK_EINVAL;
    }
    int rc = tok_cache_lookup(&bpe->cache, word, n_bytes, out);
    if (rc != 0) {
        return rc < 0 ? rc : 0;
    }
    const unsigned char *w = (const unsigned char *) word;
    pe_tok_ids *ids = &bpe->word_ids;
    ids->len = 0;
    int whole = (bpe->flags & PE_TOK_IGNORE_MERGES) ||
                ((bpe->flags & PE_TOK_NEWLINES_WHOLE) && only_newlines(w, n_bytes));
    int32_t id = whole ? tok_map_get(&bpe->symbols, word, n_bytes) : -1;
    if (id >= 0 && id < bpe->n_vocab) {
        rc = tok_ids_push(ids, id);
    } else {
        int32_t n;
        rc = initial_symbols(bpe, w, n_bytes, &n);
        if (rc == 0) {
            rc = merge_symbols(bpe, n);
        }
        if (rc == 0) {
            rc = emit_symbols(bpe, w, ids);
        }
    }
    if (rc < 0) {
        return rc;
    }
    if (tok_ids_append(out, ids->data, ids->len) < 0 ||
        tok_cache_store(&bpe->cache, word, n_bytes, ids->data, ids->len) < 0) {
        return PE_TOK_ENOMEM;
    }
    return 0;
}

/* ---- splitting ---------------------------------------------------------------------------- */

static int decode_text(pe_tok_bpe *bpe, const char *text, int64_t len, tok_text *t) {
    if (tok_grow((void **) &bpe->cps, &bpe->cps_cap, len + 1, sizeof(uint32_t)) < 0 ||
        tok_grow((void **) &bpe->cp_off, &bpe->cp_off_cap, len + 1, sizeof(int64_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    int64_t n = 0;
    for (int64_t pos = 0; pos < len; n++) {
        bpe->cp_off[n] = pos;
        bpe->cps[n] = tok_utf8_decode((const unsigned char *) text, len, &pos);
    }
    bpe->cp_off[n] = len;
    t->cp = bpe->cps;
    t->n = n;
    t->cls = bpe->cls;
    return 0;
}

static int64_t word_end(const pe_tok_bpe *bpe, const tok_text *t, int64_t i) {
    switch (bpe->splitter) {
    case PE_TOK_SPLIT_GPT2:        return tok_split_gpt2(t, i, 0);
    case PE_TOK_SPLIT_DIGITS_GPT2: return tok_split_gpt2(t, i, 1);
    case PE_TOK_SPLIT_LLAMA3:      return tok_split_llama3(t, i, 3, 0);
    case PE_TOK_SPLIT_QWEN2:       return tok_split_llama3(t, i, 1, 0);
    case PE_TOK_SPLIT_QWEN35:      return tok_split_llama3(t, i, 1, 1);
    default:                       return t->n;
    }
}

int pe_tok_bpe_split(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *word_cps) {
    if (bpe->splitter == PE_TOK_SPLIT_NONE) {
        return PE_TOK_EINVAL;
    }
    tok_text t;
    if (decode_text(bpe, text, len, &t) < 0) {
        return PE_TOK_ENOMEM;
    }
    for (int64_t i = 0; i < t.n;) {
        int64_t end = word_end(bpe, &t, i);
        if (tok_ids_push(word_cps, (int32_t) (end - i)) < 0) {
            return PE_TOK_ENOMEM;
        }
        i = end;
    }
    return 0;
}

int pe_tok_bpe_encode(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *out) {
    if (bpe->splitter == PE_TOK_SPLIT_NONE) {
        return PE_TOK_EINVAL;
    }
    tok_text t;
    if (decode_text(bpe, text, len, &t) < 0) {
        return PE_TOK_ENOMEM;
    }
    for (int64_t i = 0; i < t.n;) {
        int64_t end = word_end(bpe, &t, i);
        int64_t start_byte = bpe->cp_off[i];
        int rc = encode_word(bpe, text + start_byte, bpe->cp_off[end] - start_byte, out);
        if (rc < 0) {
            return rc;
        }
        i = end;
    }
    return 0;
}

int pe_tok_bpe_encode_words(pe_tok_bpe *bpe, const char *text, int64_t len,
                            const int64_t *word_cps, int64_t n_words, pe_tok_ids *out) {
    const unsigned char *s = (const unsigned char *) text;
    int64_t pos = 0;
    for (int64_t w = 0; w < n_words; w++) {
        if (word_cps[w] < 0) {
            return PE_TOK_EINVAL;
        }
        int64_t start = pos;
        for (int64_t k = 0; k < word_cps[w]; k++) {
            if (pos >= len) {
                return PE_TOK_EINVAL;
            }
            tok_utf8_decode(s, len, &pos);
        }
        int rc = encode_word(bpe, text + start, pos - start, out);
        if (rc < 0) {
            return rc;
        }
    }
    return pos == len ? 0 : PE_TOK_EINVAL;
}
