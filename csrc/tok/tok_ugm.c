/* tok_ugm.c - Unigram tokenization (llama.cpp's llm_tokenizer_ugm).
 *
 * Normalization: at each position the longest walk through the user-defined tokens
 * (kept as they are), else the longest sequence the precompiled character map replaces
 * (an XOR-compressed double array, see SentencePiece), else the character itself; then
 * spaces are escaped. Segmentation: Viterbi over the normalized bytes, walking a byte
 * trie of the tokens from every character start; a character no token starts with is
 * the unknown token (runs of them collapse). All on bytes, as llama.cpp does it.
 */
#include <float.h>

#include "tok_internal.h"

/* ---- a byte trie: (node, byte) -> child in an open-addressing table --------------------- */

typedef struct ugm_trie {
    uint64_t *key;      /* (node << 8 | byte) + 1; 0 marks an empty slot */
    int32_t  *child;
    int64_t   cap;      /* power of two */
    int64_t   count;
    int32_t  *token;    /* per node: the token ending there, or -1 */
    int64_t   n_nodes, token_cap;
} ugm_trie;

static inline uint64_t trie_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

static int trie_init(ugm_trie *t, int64_t expected_edges) {
    memset(t, 0, sizeof *t);
    int64_t cap = 64;
    while (cap < expected_edges * 2) {
        cap *= 2;
    }
    t->key = calloc((size_t) cap, sizeof(uint64_t));
    t->child = malloc((size_t) cap * sizeof(int32_t));
    t->cap = cap;
    if (!t->key || !t->child || tok_grow((void **) &t->token, &t->token_cap, 1, sizeof(int32_t)) < 0) {
        return PE_TOK_ENOMEM;
    }
    t->token[0] = -1;  /* the root */
    t->n_nodes = 1;
    return 0;
}

static void trie_free(ugm_trie *t) {
    free(t->key);
    free(t->child);
    free(t->token);
    memset(t, 0, sizeof *t);
}

static inline int32_t trie_child(const ugm_trie *t, int32_t node, unsigned char byte) {
    uint64_t key = (((uint64_t) node << 8) | byte) + 1;
    uint64_t mask = (uint64_t) t->cap - 1;
    for (uint64_t slot = trie_hash(key) & mask;; slot = (slot + 1) & mask) {
        if (t->key[slot] == key) {
            return t->child[slot];
        }
        if (t->key[slot] == 0) {
            return -1;
        }
    }
}

static int trie_grow(ugm_trie *t) {
    ugm_trie grown = *t;
    grown.cap = t->cap * 2;
    grown.key = calloc((size_t) grown.cap, sizeof(uint64_t));
    grown.child = malloc((size_t) grown.cap * sizeof(int32_t));
    if (!grown.key || !grown.child) {
        free(grown.key);
        free(grown.child);
        return PE_TOK_ENOMEM;
    }
    uint64_t mask = (uint64_t) grown.cap - 1;
    for (int64_t i = 0; i < t->cap; i++) {
        if (t->key[i] == 0) {
            continue;
        }
        uint64_t slot = trie_hash(t->key[i]) & mask;
        while (grown.key[slot] != 0) {
            slot = (slot + 1) & mask;
        }
        grown.key[slot] = t->key[i];
        grown.child[slot] = t->child[i];
    }
    free(t->key);
    free(t->child);
    t->key = grown.key;
    t->child = grown.child;
    t->cap = grown.cap;
    return 0;
}

/* Add a key; the first token to end at a node keeps it (ids are unique per text). */
static int trie_insert(ugm_trie *t, const unsigned char *key, int64_t len, int32_t token) {
    int32_t node = 0;
    for (int64_t i = 0; i < len; i++) {
        int32_t child = trie_child(t, node, key[i]);
        if (child < 0) {
            if ((t->count + 1) * 2 > t->cap && trie_grow(t) < 0) {
                return PE_TOK_ENOMEM;
            }
            if (t->n_nodes >= INT32_MAX ||
                tok_grow((void **) &t->token, &t->token_cap, t->n_nodes + 1, sizeof(int32_t)) < 0) {
                return PE_TOK_ENOMEM;
            }
            child = (int32_t) t->n_nodes++;
            t->token[child] = -1;
            uint64_t k = (((uint64_t) node << 8) | key[i]) + 1;
            uint64_t mask = (uint64_t) t->cap - 1;
            uint64_t slot = trie_hash(k) & mask;
            while (t->key[slot] != 0) {
                slot = (slot + 1) & mask;
            }
            t->key[slot] = k;
            t->child[slot] = child;
            t->count++;
        }
        node = child;
    }
    if (t->token[node] < 0) {
        t->token[node] = token;
    }
    return 0;
}

/* ---- the encoder ----------------------------------------------------------------------- */

typedef struct ugm_best {
    double  score;
    int64_t from;     /* where the token ending here starts */
    int32_t token;
} ugm_best;

struct pe_tok_ugm {
    ugm_trie  tokens;        /* normal, unused and user-defined tokens */
    ugm_trie  user;          /* user-defined tokens only (the normalizer keeps them) */
    double   *score;         /* per token, as used by the Viterbi pass */
    int32_t   n_tokens;
    int32_t   unk_id;
    double    unknown_score;
    uint32_t *xcda;          /* the charsmap's double array */
    int64_t   xcda_len;
    char     *replacements;  /* NUL-terminated replacement strings */
    int64_t   replacements_len;
    int32_t   flags;
    /* scratch */
    char     *norm, *spaced;
    int64_t   norm_cap, spaced_cap;
    ugm_best *best;
    int64_t   best_cap;
};

void pe_tok_ugm_free(pe_tok_ugm *ugm) {
    if (ugm == NULL) {
        return;
    }
    trie_free(&ugm->tokens);
    trie_free(&ugm->user);
    free(ugm->score);
    free(ugm->xcda);
    free(ugm->replacements);
    free(ugm->norm);
    free(ugm->spaced);
    free(ugm->best);
    free(ugm);
}

static int load_charsmap(pe_tok_ugm *ugm, const char *blob, int64_t len) {
    if (len == 0) {
        return 0;
    }
    if (len < 4) {
        return PE_TOK_ECHARSMAP;
    }
    uint32_t xcda_bytes;
    memcpy(&xcda_bytes, blob, 4);  /* little-endian in GGUF; the hosts we build for agree */
    if ((int64_t) xcda_bytes + 4 >= len) {
        return PE_TOK_ECHARSMAP;
    }
    ugm->xcda_len = xcda_bytes / 4;
    ugm->replacements_len = len - 4 - xcda_bytes;
    ugm->xcda = malloc((size_t) (ugm->xcda_len > 0 ? ugm->xcda_len : 1) * sizeof(uint32_t));
    ugm->replacements = malloc((size_t) ugm->replacements_len);
    if (!ugm->xcda || !ugm->replacements) {
        return PE_TOK_ENOMEM;
    }
    memcpy(ugm->xcda, blob + 4, (size_t) ugm->xcda_len * sizeof(uint32_t));
    memcpy(ugm->replacements, blob + 4 + xcda_bytes, (size_t) ugm->replacements_len);
    return 0;
}

pe_tok_ugm *pe_tok_ugm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                           const float *scores, const uint8_t *kinds, int32_t unk_id,
                           float unknown_score, const char *charsmap, int64_t charsmap_len,
                           int32_t flags) {
    if (n_tokens <= 0 || unk_id >= n_tokens || charsmap_len < 0) {
        return NULL;
    }
    pe_tok_ugm *ugm = calloc(1, sizeof *ugm);
    if (ugm == NULL) {
        return NULL;
    }
    ugm->n_tokens = n_tokens;
    ugm->unk_id = unk_id;
    ugm->unknown_score = unknown_score;
    ugm->flags = flags;
    ugm->score = malloc((size_t) n_tokens * sizeof(double));
    if (!ugm->score || trie_init(&ugm->tokens, offsets[n_tokens] - offsets[0]) < 0 ||
        trie_init(&ugm->user, 64) < 0 || load_charsmap(ugm, charsmap, charsmap_len) < 0) {
        pe_tok_ugm_free(ugm);
        return NULL;
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        const unsigned char *key = (const unsigned char *) texts + offsets[i];
        int64_t len = offsets[i + 1] - offsets[i];
        /* user-defined tokens score 0, which makes them win (others are log-probabilities) */
        ugm->score[i] = kinds[i] == PE_TOK_UGM_USER_DEFINED ? 0.0 : (double) scores[i];
        if (len <= 0 || kinds[i] == PE_TOK_UGM_NONE) {
            continue;
        }
        if (trie_insert(&ugm->tokens, key, len, i) < 0 ||
            (kinds[i] == PE_TOK_UGM_USER_DEFINED && trie_insert(&ugm->user, key, len, i) < 0)) {
            pe_tok_ugm_free(ugm);
            return NULL;
        }
    }
    return ugm;
}

/* ---- normalization ------------------------------------------------------------------------ */

static inline uint32_t xcda_base(uint32_t node) {
    return (node >> 10) << ((node & (1u << 9)) >> 6);
}

/* Longest charsmap match at s[pos..len): its length (0: none); *replacement, *rlen set. */
static int64_t charsmap_match(const pe_tok_ugm *ugm, const unsigned char *s, int64_t pos, int64_t len,
                              const char **replacement, int64_t *rlen) {
    if (ugm->xcda_len == 0) {
        return 0;
    }
    int64_t best_len = 0;
    uint32_t best_offset = 0;
    uint64_t index = xcda_base(ugm->xcda[0]);
    for (int64_t p = pos; p < len; p++) {
        unsigned char c = s[p];
        if (c == 0) {
            break;
        }
        index ^= c;
        if (index >= (uint64_t) ugm->xcda_len) {
            return PE_TOK_ECHARSMAP;
        }
        uint32_t node = ugm->xcda[index];
        if ((node & ((1u << 31) | 0xFFu)) != c) {
            break;
        }
        int is_leaf = (node >> 8) & 1;
        index ^= xcda_base(node);
        if (is_leaf) {
            if (index >= (uint64_t) ugm->xcda_len) {
                return PE_TOK_ECHARSMAP;
            }
            best_len = p - pos + 1;
            best_offset = ugm->xcda[index] & ((1u << 31) - 1);
        }
    }
    if (best_len == 0) {
        return 0;
    }
    if ((int64_t) best_offset >= ugm->replacements_len) {
        return PE_TOK_ECHARSMAP;
    }
    const char *r = ugm->replacements + best_offset;
    const char *end = memchr(r, 0, (size_t) (ugm->replacements_len - best_offset));
    if (end == NULL) {
        return PE_TOK_ECHARSMAP;
    }
    *replacement = r;
    *rlen = end - r;
    return best_len;
}

/* llama.cpp's check of the UTF-8 character at pos (lenient: no overlong/surrogate
 * checks): its length, or 0 when invalid. */
static int valid_char_len(const unsigned char *s, int64_t pos, int64_t len) {
    unsigned char b = s[pos];
    int n = b < 0x80 ? 1 : !(b & 0x40) ? 0 : !(b & 0x20) ? 2 : !(b & 0x10) ? 3 : !(b & 0x08) ? 4 : 0;
    if (n == 0 || pos + n > len) {
        return 0;
    }
    for (int k = 1; k < n; k++) {
        if ((s[pos + k] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return n;
}

static int append_bytes(char **buf, int64_t *cap, int64_t *len, const char *src, int64_t n) {
    if (tok_grow((void **) buf, cap, *len + n, 1) < 0) {
        return PE_TOK_ENOMEM;
    }
    memcpy(*buf + *len, src, (size_t) n);
    *len += n;
    return 0;
}

/* The character map and user-defined tokens applied (spaces not yet escaped). */
static int64_t map_characters(pe_tok_ugm *ugm, const unsigned char *s, int64_t len) {
    int64_t out = 0;
    for (int64_t pos = 0; pos < len;) {
        int32_t node = 0;  /* the longest walk through the user-defined tokens */
        int64_t walked = 0;
        while (pos + walked < len && (node = trie_child(&ugm->user, node, s[pos + walked])) >= 0) {
            walked++;
        }
        const char *piece = (const char *) s + pos;
        int64_t piece_len = walked, consumed = walked;
        if (walked == 0) {
            int64_t matched = charsmap_match(ugm, s, pos, len, &piece, &piece_len);
            if (matched < 0) {
                return matched;
            }
            consumed = matched;
            if (matched == 0) {
                int n = valid_char_len(s, pos, len);
                piece = n ? (const char *) s + pos : "\xEF\xBF\xBD";  /* U+FFFD */
                piece_len = n ? n : 3;
                consumed = n ? n : 1;
            }
        }
        if (append_bytes(&ugm->norm, &ugm->norm_cap, &out, piece, piece_len) < 0) {
            return PE_TOK_ENOMEM;
        }
        pos += consumed;
    }
    return out;
}

/* Spaces escaped as llama.cpp's normalize does it; returns the length in ugm->spaced. */
static int64_t place_spaces(pe_tok_ugm *ugm, int64_t n) {
    static const char escaped[3] = {(char) 0xE2, (char) 0x96, (char) 0x81};
    const char *space = (ugm->flags & PE_TOK_UGM_ESCAPE_SPACES) ? escaped : " ";
    int64_t space_len = (ugm->flags & PE_TOK_UGM_ESCAPE_SPACES) ? 3 : 1;
    int merge = (ugm->flags & PE_TOK_UGM_MERGE_SPACES) != 0;
    int prepend = (ugm->flags & PE_TOK_UGM_PREPEND_SPACE) != 0;
    int64_t out = 0;
    int in_word = 0, prepended = 0;
    for (int64_t i = 0; i < n; i++) {
        char c = ugm->norm[i];
        int rc = 0;
        if (c != ' ') {
            if (!in_word) {
                in_word = 1;
                if ((prepend && !prepended) || merge) {
                    rc = append_bytes(&ugm->spaced, &ugm->spaced_cap, &out, space, space_len);
                    prepended = 1;
                }
            }
            if (rc == 0) {
                rc = append_bytes(&ugm->spaced, &ugm->spaced_cap, &out, &c, 1);
            }
        } else {
            in_word = 0;
            if (!merge) {
                rc = append_bytes(&ugm->spaced, &ugm->spaced_cap, &out, space, space_len);
            }
        }
        if (rc < 0) {
            return rc;
        }
    }
    if ((ugm->flags & PE_TOK_UGM_APPEND_SPACE) &&
        append_bytes(&ugm->spaced, &ugm->spaced_cap, &out, space, space_len) < 0) {
        return PE_TOK_ENOMEM;
    }
    return out;
}

/* ---- segmentation ---------------------------------------------------------------------------- */

static int viterbi(pe_tok_ugm *ugm, const unsigned char *s, int64_t n, pe_tok_ids *out) {
    if (tok_grow((void **) &ugm->best, &ugm->best_cap, n + 1, sizeof(ugm_best)) < 0) {
        return PE_TOK_ENOMEM;
    }
    ugm_best *best = ugm->best;
    for (int64_t i = 0; i <= n; i++) {
        best[i].score = -DBL_MAX;  /* below every sum of scores */
        best[i].from = 0;
        best[i].token = ugm->unk_id;
    }
    best[0].score = 0.0;
    for (int64_t pos = 0; pos < n;) {
        int64_t char_len = tok_utf8_len(s[pos]);
        if (char_len > n - pos) {
            char_len = n - pos;
        }
        double here = best[pos].score;
        int whole_char = 0;
        int32_t node = 0;
        for (int64_t end = pos; end < n;) {
            node = trie_child(&ugm->tokens, node, s[end++]);
            if (node < 0) {
                break;
            }
            int32_t token = ugm->tokens.token[node];
            if (token < 0) {
                continue;
            }
            whole_char |= end - pos == char_len;
            double score = here + ugm->score[token];
            if (score > best[end].score) {
                best[end].score = score;
                best[end].from = pos;
                best[end].token = token;
            }
        }
        if (!whole_char) {
            if (ugm->unk_id < 0) {
                return PE_TOK_ENOUNK;
            }
            double score = here + ugm->unknown_score;
            if (score > best[pos + char_len].score) {
                best[pos + char_len].score = score;
                best[pos + char_len].from = pos;
                best[pos + char_len].token = ugm->unk_id;
            }
        }
        pos += char_len;
    }
    /* backwards from the end; runs of unknown tokens collapse into one */
    int64_t first = out->len;
    int prev_unknown = 0;
    for (int64_t pos = n;;) {
        int32_t token = best[pos].token;
        int unknown = token == ugm->unk_id;
        if (!(prev_unknown && unknown) && tok_ids_push(out, token) < 0) {
            return PE_TOK_ENOMEM;
        }
        if (best[pos].from == 0) {
            break;
        }
        prev_unknown = unknown;
        pos = best[pos].from;
    }
    for (int64_t a = first, b = out->len - 1; a < b; a++, b--) {
        int32_t t = out->data[a];
        out->data[a] = out->data[b];
        out->data[b] = t;
    }
    return 0;
}

int pe_tok_ugm_encode(pe_tok_ugm *ugm, const char *text, int64_t len, pe_tok_ids *out) {
    int64_t mapped = map_characters(ugm, (const unsigned char *) text, len);
    if (mapped < 0) {
        return (int) mapped;
    }
    int64_t n = place_spaces(ugm, mapped);
    if (n < 0) {
        return (int) n;
    }
    return n > 0 ? viterbi(ugm, (const unsigned char *) ugm->spaced, n, out) : 0;
}
