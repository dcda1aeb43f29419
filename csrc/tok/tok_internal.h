/* tok_internal.h - shared pieces of the tokenizer loops: hash maps, caches, UTF-8. */
#ifndef PE_TOK_INTERNAL_H
#define PE_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pe_tok.h"

/* Append one id (or n ids) to out; PE_TOK_ENOMEM on failure. */
int tok_ids_push(pe_tok_ids *out, int32_t id);
int tok_ids_append(pe_tok_ids *out, const int32_t *ids, int64_t n);

/* ---- byte string -> int32 (>= 0) map, keys copied into an arena ------------------ */

typedef struct tok_map {
    uint64_t *hash;    /* per slot; 0 marks an empty slot */
    int64_t  *key;     /* offset of the key in arena */
    int32_t  *klen;
    int32_t  *val;
    int64_t   cap;     /* power of two */
    int64_t   count;
    char     *arena;
    int64_t   arena_len, arena_cap;
} tok_map;

uint64_t tok_hash(const char *p, int64_t n);
int      tok_map_init(tok_map *m, int64_t expected);
void     tok_map_free(tok_map *m);
void     tok_map_clear(tok_map *m);
/* The value of key, or -1. */
int32_t  tok_map_get(const tok_map *m, const char *key, int64_t len);
/* Insert when absent (the first value stays, as std::map::emplace keeps it). */
int      tok_map_put(tok_map *m, const char *key, int64_t len, int32_t val);

/* ---- (int32, int32) -> (rank, result) map for BPE merges --------------------------- */

typedef struct tok_pairmap {
    uint64_t *key;     /* (left << 32 | right) + 1; 0 marks an empty slot */
    int32_t  *rank;
    int32_t  *result;
    int64_t   cap;
} tok_pairmap;

int  tok_pairmap_init(tok_pairmap *m, int64_t expected);
void tok_pairmap_free(tok_pairmap *m);
int  tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t result);
/* The rank of (left, right) and its result in *result, or -1. */
int32_t tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right, int32_t *result);

/* ---- word -> ids cache --------------------------------------------------------------- */

typedef struct tok_entry {
    int64_t off;           /* where the word's ids start in the cache's ids */
    int64_t len;
} tok_entry;

typedef struct tok_cache {
    tok_map    index;      /* word bytes -> entry */
    tok_entry *entries;
    int64_t    n_entries, entries_cap;
    int32_t *ids;
    int64_t  ids_len, ids_cap;
} tok_cache;

#define TOK_CACHE_MAX_ENTRIES (1 << 18)
#define TOK_CACHE_MAX_IDS     (1 << 23)
#define TOK_CACHE_MAX_WORD    256  /* longer words are not cached */

int  tok_cache_init(tok_cache *c);
void tok_cache_free(tok_cache *c);
/* Appends the cached ids of word to out and returns 1, or returns 0 when not cached. */
int  tok_cache_lookup(const tok_cache *c, const char *word, int64_t len, pe_tok_ids *out);
/* Remember word -> ids (the cache empties itself when full). */
int  tok_cache_store(tok_cache *c, const char *word, int64_t len, const int32_t *ids, int64_t n);

/* ---- UTF-8 ------------------------------------------------------------------------- */

/* Length of the UTF-8 sequence a lead byte announces (llama.cpp's unicode_len_utf8). */
static inline int tok_utf8_len(unsigned char lead) {
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* Decode the code point at s[*pos] (pos < len) and advance; invalid bytes decode as
 * U+FFFD one at a time. */
uint32_t tok_utf8_decode(const unsigned char *s, int64_t len, int64_t *pos);

/* Growable scratch arrays. */
int tok_grow(void **ptr, int64_t *cap, int64_t need, size_t elem);

/* A binary heap kept in an owner struct's fields `heap`, `heap_cap` and
 * `heap_len`: TOK_DEFINE_HEAP(owner_t, item_t, before) defines
 * heap_push(owner, item) (PE_TOK_ENOMEM when it cannot grow) and
 * heap_pop(owner) (heap_len > 0), where before(&a, &b) says a leaves first. */
#define TOK_DEFINE_HEAP(owner_t, item_t, before)                                                \
    static int heap_push(owner_t *o, item_t item) {                                             \
        if (tok_grow((void **) &o->heap, &o->heap_cap, o->heap_len + 1, sizeof(item_t)) < 0) {  \
            return PE_TOK_ENOMEM;                                                               \
        }                                                                                       \
        item_t *h = o->heap;                                                                    \
        int64_t i = o->heap_len++;                                                              \
        while (i > 0) {                                                                         \
            int64_t parent = (i - 1) / 2;                                                       \
            if (!before(&item, &h[parent])) {                                                   \
                break;                                                                          \
            }                                                                                   \
            h[i] = h[parent];                                                                   \
            i = parent;                                                                         \
        }                                                                                       \
        h[i] = item;                                                                            \
        return 0;                                                                               \
    }                                                                                           \
    static item_t heap_pop(owner_t *o) {                                                        \
        item_t *h = o->heap;                                                                    \
        item_t top = h[0];                                                                      \
        item_t last = h[--o->heap_len];                                                         \
        int64_t n = o->heap_len, i = 0;                                                         \
        for (;;) {                                                                              \
            int64_t child = 2 * i + 1;                                                          \
            if (child >= n) {                                                                   \
                break;                                                                          \
            }                                                                                   \
            if (child + 1 < n && before(&h[child + 1], &h[child])) {                            \
                child++;                                                                        \
            }                                                                                   \
            if (!before(&h[child], &last)) {                                                    \
                break;                                                                          \
            }                                                                                   \
            h[i] = h[child];                                                                    \
            i = child;                                                                          \
        }                                                                                       \
        if (n > 0) {                                                                            \
            h[i] = last;                                                                        \
        }                                                                                       \
        return top;                                                                             \
    }

#endif /* PE_TOK_INTERNAL_H */
