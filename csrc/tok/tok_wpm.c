/* tok_wpm.c - WordPiece's greedy cutting (llama.cpp's llm_tokenizer_wpm).
 *
 * The BERT normalization (lowercasing, accents, punctuation and CJK split off) stays
 * in Python (pyengine/tokenizer/wpm.py), which hands over its words separated by single
 * spaces. Each word, prefixed with U+2581 (how GGUF vocabularies mark a word start), is
 * cut from the left into the longest vocabulary tokens; a word that cannot be cut to
 * its end is the unknown token. Cuts fall on code point boundaries only.
 */
#include "tok_internal.h"

#define WPM_WORD_START "\xe2\x96\x81"   /* U+2581 */
#define WPM_WORD_START_LEN 3

struct pe_tok_wpm {
    tok_map   vocab;        /* token bytes -> id */
    tok_cache cache;        /* word -> ids */
    int64_t   max_bytes;    /* the longest token, in bytes */
    int32_t   unk_id;       /* -1: none */
    char     *word;         /* scratch: U+2581 and the word */
    int64_t   word_cap;
    pe_tok_ids pieces;      /* scratch: one word's ids */
};

pe_tok_wpm *pe_tok_wpm_new(const char *texts, const int64_t *offsets, int32_t n_tokens, int32_t unk_id) {
    if (n_tokens <= 0 || unk_id >= n_tokens) {
        return NULL;
    }
    pe_tok_wpm *wpm = calloc(1, sizeof *wpm);
    if (!wpm) {
        return NULL;
    }
    wpm->unk_id = unk_id < 0 ? -1 : unk_id;
    if (tok_map_init(&wpm->vocab, n_tokens) < 0 || tok_cache_init(&wpm->cache) < 0) {
        pe_tok_wpm_free(wpm);
        return NULL;
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        const int64_t start = offsets[i], end = offsets[i + 1];
        if (start < 0 || end < start || tok_map_put(&wpm->vocab, texts + start, end - start, i) < 0) {
            pe_tok_wpm_free(wpm);
            return NULL;
        }
        wpm->max_bytes = end - start > wpm->max_bytes ? end - start : wpm->max_bytes;
    }
    return wpm;
}

void pe_tok_wpm_free(pe_tok_wpm *wpm) {
    if (!wpm) {
        return;
    }
    tok_map_free(&wpm->vocab);
    tok_cache_free(&wpm->cache);
    free(wpm->word);
    pe_tok_ids_free(&wpm->pieces);
    free(wpm);
}

/* The previous code point boundary of w before j (> i). */
static inline int64_t boundary_before(const char *w, int64_t i, int64_t j) {
    j--;
    while (j > i && ((unsigned char) w[j] & 0xC0) == 0x80) {
        j--;
    }
    return j;
}

/* The longest-first cut of w[0, n) into wpm->pieces; 0 when some position starts no token. */
static int cut_word(pe_tok_wpm *wpm, const char *w, int64_t n) {
    wpm->pieces.len = 0;
    for (int64_t i = 0; i < n;) {
        int64_t j = i + wpm->max_bytes < n ? i + wpm->max_bytes : n;
        while (j > i && j < n && ((unsigned char) w[j] & 0xC0) == 0x80) {   /* (n is a boundary) */
            j--;
        }
        int32_t id = -1;
        for (; j > i; j = boundary_before(w, i, j)) {
            if ((id = tok_map_get(&wpm->vocab, w + i, j - i)) >= 0) {
                break;
            }
        }
        if (id < 0) {
            return 0;
        }
        if (tok_ids_push(&wpm->pieces, id) < 0) {
            return PE_TOK_ENOMEM;
        }
        i = j;
    }
    return 1;
}

/* One word's ids onto out (from the cache when it has them). */
static int encode_word(pe_tok_wpm *wpm, const char *word, int64_t len, pe_tok_ids *out) {
    int rc = tok_cache_lookup(&wpm->cache, word, len, out);
    if (rc != 0) {
        return rc < 0 ? rc : 0;
    }
    if (tok_grow((void **) &wpm->word, &wpm->word_cap, WPM_WORD_START_LEN + len, 1) < 0) {
        return PE_TOK_ENOMEM;
    }
    memcpy(wpm->word, WPM_WORD_START, WPM_WORD_START_LEN);
    memcpy(wpm->word + WPM_WORD_START_LEN, word, (size_t) len);
    rc = cut_word(wpm, wpm->word, WPM_WORD_START_LEN + len);
    if (rc < 0) {
        return rc;
    }
    if (rc == 0) {   /* the whole word is unknown */
        if (wpm->unk_id < 0) {
            return PE_TOK_ENOUNK;
        }
        wpm->pieces.len = 0;
        if (tok_ids_push(&wpm->pieces, wpm->unk_id) < 0) {
            return PE_TOK_ENOMEM;
        }
    }
    if (tok_ids_append(out, wpm->pieces.data, wpm->pieces.len) < 0 ||
        tok_cache_store(&wpm->cache, word, len, wpm->pieces.data, wpm->pieces.len) < 0) {
        return PE_TOK_ENOMEM;
    }
    return 0;
}

int pe_tok_wpm_encode(pe_tok_wpm *wpm, const char *text, int64_t len, pe_tok_ids *out) {
    if (!wpm || (len > 0 && !text) || len < 0) {
        return PE_TOK_EINVAL;
    }
    for (int64_t i = 0; i < len;) {
        if (text[i] == ' ') {
            i++;
            continue;
        }
        int64_t end = i;
        while (end < len && text[end] != ' ') {
            end++;
        }
        const int rc = encode_word(wpm, text + i, end - i, out);
        if (rc < 0) {
            return rc;
        }
        i = end;
    }
    return 0;
}
