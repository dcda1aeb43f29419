/* tok_util.c - id buffers, hash maps, the word cache and UTF-8 decoding. */
#include "tok_internal.h"

/* ---- growable arrays ------------------------------------------------------------------ */

int tok_grow(void **ptr, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) {
        return 0;
    }
    int64_t cap_new = *cap > 0 ? *cap : 16;
    while (cap_new < need) {
        if (cap_new > INT64_MAX / 2 / (int64_t) elem) {
            return PE_TOK_ENOMEM;
        }
        cap_new *= 2;
    }
    void *grown = realloc(*ptr, (size_t) cap_new * elem);
    if (grown == NULL) {
        return PE_TOK_ENOMEM;
    }
    *ptr = grown;
    *cap = cap_new;
    return 0;
}

void pe_tok_ids_free(pe_tok_ids *ids) {
    free(ids->data);
    ids->data = NULL;
    ids->len = ids->cap = 0;
}

int pe_tok_ids_push(pe_tok_ids *ids, int32_t id) {
    return tok_ids_push(ids, id);
}

int tok_ids_push(pe_tok_ids *out, int32_t id) {
    if (out->len == out->cap &&
        tok_grow((void **) &out->data, &out->cap, out->len + 1, sizeof(int32_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    out->data[out->len++] = id;
    return 0;
}

int tok_ids_append(pe_tok_ids *out, const int32_t *ids, int64_t n) {
    if (n <= 0) {
        return 0;
    }
    if (tok_grow((void **) &out->data, &out->cap, out->len + n, sizeof(int32_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    memcpy(out->data + out->len, ids, (size_t) n * sizeof(int32_t));
    out->len += n;
    return 0;
}

/* ---- hashing --------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x) {  /* a strong 64-bit finalizer (splitmix64's) */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t tok_hash(const char *p, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t) n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t tail = 0;
    if (n > 0) {
        memcpy(&tail, p, (size_t) n);
    }
    h = mix64(h ^ tail ^ ((uint64_t) n << 56));
    return h ? h : 1;  /* 0 marks empty slots */
}

/* ---- string map -------------------------------------------------------------------------- */

static int map_alloc(tok_map *m, int64_t cap) {
    m->hash = calloc((size_t) cap, sizeof(uint64_t));
    m->key = malloc((size_t) cap * sizeof(int64_t));
    m->klen = malloc((size_t) cap * sizeof(int32_t));
    m->val = malloc((size_t) cap * sizeof(int32_t));
    m->cap = cap;
    m->count = 0;
    if (!m->hash || !m->key || !m->klen || !m->val) {
        return PE_TOK_ENOMEM;
    }
    return 0;
}

int tok_map_init(tok_map *m, int64_t expected) {
    memset(m, 0, sizeof *m);
    int64_t cap = 64;
    while (cap < expected * 2) {
        cap *= 2;
    }
    return map_alloc(m, cap);
}

void tok_map_free(tok_map *m) {
    free(m->hash);
    free(m->key);
    free(m->klen);
    free(m->val);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

void tok_map_clear(tok_map *m) {
    memset(m->hash, 0, (size_t) m->cap * sizeof(uint64_t));
    m->count = 0;
    m->arena_len = 0;
}

int32_t tok_map_get(const tok_map *m, const char *key, int64_t len) {
    uint64_t h = tok_hash(key, len);
    uint64_t mask = (uint64_t) m->cap - 1;
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        uint64_t hs = m->hash[slot];
        if (hs == 0) {
            return -1;
        }
        if (hs == h && m->klen[slot] == len && memcmp(m->arena + m->key[slot], key, (size_t) len) == 0) {
            return m->val[slot];
        }
    }
}

static int map_rehash(tok_map *m) {
    tok_map grown = *m;
    if (map_alloc(&grown, m->cap * 2) < 0) {
        free(grown.hash);
        free(grown.key);
        free(grown.klen);
        free(grown.val);
        return PE_TOK_ENOMEM;
    }
    uint64_t mask = (uint64_t) grown.cap - 1;
    for (int64_t i = 0; i < m->cap; i++) {
        if (m->hash[i] == 0) {
            continue;
        }
        uint64_t slot = m->hash[i] & mask;
        while (grown.hash[slot] != 0) {
            slot = (slot + 1) & mask;
        }
        grown.hash[slot] = m->hash[i];
        grown.key[slot] = m->key[i];
        grown.klen[slot] = m->klen[i];
        grown.val[slot] = m->val[i];
    }
    grown.count = m->count;
    free(m->hash);
    free(m->key);
    free(m->klen);
    free(m->val);
    *m = grown;
    return 0;
}

int tok_map_put(tok_map *m, const char *key, int64_t len, int32_t val) {
    if (len > INT32_MAX || val < 0) {
        return PE_TOK_EINVAL;
    }
    if ((m->count + 1) * 2 > m->cap && map_rehash(m) < 0) {
        return PE_TOK_ENOMEM;
    }
    uint64_t h = tok_hash(key, len);
    uint64_t mask = (uint64_t) m->cap - 1;
    uint64_t slot = h & mask;
    for (;; slot = (slot + 1) & mask) {
        uint64_t hs = m->hash[slot];
        if (hs == 0) {
            break;
        }
        if (hs == h && m->klen[slot] == len && memcmp(m->arena + m->key[slot], key, (size_t) len) == 0) {
            return 0;  /* present: keep the first value */
        }
    }
    if (tok_grow((void **) &m->arena, &m->arena_cap, m->arena_len + len, 1) < 0) {
        return PE_TOK_ENOMEM;
    }
    if (len > 0) {
        memcpy(m->arena + m->arena_len, key, (size_t) len);
    }
    m->hash[slot] = h;
    m->key[slot] = m->arena_len;
    m->klen[slot] = (int32_t) len;
    m->val[slot] = val;
    m->arena_len += len;
    m->count++;
    return 0;
}

/* ---- pair map ---------------------------------------------------------------------------- */

static inline uint64_t pair_key(int32_t left, int32_t right) {
    return (((uint64_t) (uint32_t) left << 32) | (uint32_t) right) + 1;
}

int tok_pairmap_init(tok_pairmap *m, int64_t expected) {
    memset(m, 0, sizeof *m);
    int64_t cap = 64;
    while (cap < expected * 2) {
        cap *= 2;
    }
    m->key = calloc((size_t) cap, sizeof(uint64_t));
    m->rank = malloc((size_t) cap * sizeof(int32_t));
    m->result = malloc((size_t) cap * sizeof(int32_t));
    m->cap = cap;
    return (m->key && m->rank && m->result) ? 0 : PE_TOK_ENOMEM;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->key);
    free(m->rank);
    free(m->result);
    memset(m, 0, sizeof *m);
}

int tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = pair_key(left, right);
    uint64_t mask = (uint64_t) m->cap - 1;
    for (uint64_t slot = mix64(key) & mask;; slot = (slot + 1) & mask) {
        if (m->key[slot] == key) {
            return 0;  /* the first (lowest) rank stays */
        }
        if (m->key[slot] == 0) {
            m->key[slot] = key;
            m->rank[slot] = rank;
            m->result[slot] = result;
            return 0;
        }
    }
}

int32_t tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right, int32_t *result) {
    uint64_t key = pair_key(left, right);
    uint64_t mask = (uint64_t) m->cap - 1;
    for (uint64_t slot = mix64(key) & mask;; slot = (slot + 1) & mask) {
        if (m->key[slot] == key) {
            *result = m->result[slot];
            return m->rank[slot];
        }
        if (m->key[slot] == 0) {
            return -1;
        }
    }
}

/* ---- word cache -------------------------------------------------------------------------- */

int tok_cache_init(tok_cache *c) {
    memset(c, 0, sizeof *c);
    return tok_map_init(&c->index, 4096);
}

void tok_cache_free(tok_cache *c) {
    tok_map_free(&c->index);
    free(c->entries);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

int tok_cache_lookup(const tok_cache *c, const char *word, int64_t len, pe_tok_ids *out) {
    if (len > TOK_CACHE_MAX_WORD) {
        return 0;
    }
    int32_t entry = tok_map_get(&c->index, word, len);
    if (entry < 0) {
        return 0;
    }
    const tok_entry *e = &c->entries[entry];
    int rc = tok_ids_append(out, c->ids + e->off, e->len);
    return rc < 0 ? rc : 1;
}

int tok_cache_store(tok_cache *c, const char *word, int64_t len, const int32_t *ids, int64_t n) {
    if (len > TOK_CACHE_MAX_WORD) {
        return 0;
    }
    if (c->n_entries >= TOK_CACHE_MAX_ENTRIES || c->ids_len + n > TOK_CACHE_MAX_IDS) {
        tok_map_clear(&c->index);  /* simply start over: cheap, and the hot words return */
        c->n_entries = 0;
        c->ids_len = 0;
    }
    if (tok_grow((void **) &c->entries, &c->entries_cap, c->n_entries + 1, sizeof(tok_entry)) < 0 ||
        tok_grow((void **) &c->ids, &c->ids_cap, c->ids_len + n, sizeof(int32_t)) < 0 ||
        tok_map_put(&c->index, word, len, (int32_t) c->n_entries) < 0) {
        return PE_TOK_ENOMEM;
    }
    if (n > 0) {
        memcpy(c->ids + c->ids_len, ids, (size_t) n * sizeof(int32_t));
    }
    c->entries[c->n_entries].off = c->ids_len;
    c->entries[c->n_entries].len = n;
    c->n_entries++;
    c->ids_len += n;
    return 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

uint32_t tok_utf8_decode(const unsigned char *s, int64_t len, int64_t *pos) {
    int64_t i = *pos;
    unsigned char b0 = s[i];
    if (b0 < 0x80) {
        *pos = i + 1;
        return b0;
    }
    int n = (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : (b0 & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > len) {
        *pos = i + 1;
        return 0xFFFD;
    }
    uint32_t cp = b0 & (0x7F >> n);
    for (int k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) {
            *pos = i + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    *pos = i + n;
    return cp < PE_TOK_N_CODEPOINTS ? cp : 0xFFFD;
}
