/* pe_tok.h - the tokenizer's inner loops: SentencePiece segmentation and BPE merges.
 *
 * Python decides everything about a vocabulary (pyengine/tokenizer/) and hands these
 * encoders flat arrays; they only run the hot loops, with per-word caches. Text comes
 * in as UTF-8 (valid: Python's str.encode), ids go out appended to a pe_tok_ids.
 * Every function that can fail returns a negative PE_TOK_E* code; none aborts.
 * An encoder is not thread-safe (its caches change on every call).
 */
#ifndef PE_TOK_H
#define PE_TOK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PE_TOK_ENOMEM  (-1)  /* out of memory */
#define PE_TOK_EINVAL  (-2)  /* arguments that contradict each other */
#define PE_TOK_ENOBYTE (-3)  /* a byte has no token and there is no unknown token */
#define PE_TOK_ECHARSMAP (-4) /* a precompiled_charsmap that points outside itself */
#define PE_TOK_ENOUNK  (-5)  /* an unknown character and no unknown token */

/* A growable array of token ids; start zeroed, free with pe_tok_ids_free. */
typedef struct pe_tok_ids {
    int32_t *data;
    int64_t  len;
    int64_t  cap;
} pe_tok_ids;

void pe_tok_ids_free(pe_tok_ids *ids);
/* Append one id; PE_TOK_ENOMEM on failure. */
int pe_tok_ids_push(pe_tok_ids *ids, int32_t id);

/* Unicode classes of code points, one byte each (table of PE_TOK_N_CODEPOINTS). */
#define PE_TOK_N_CODEPOINTS 0x110000
#define PE_TOK_CP_LETTER 1   /* \p{L} */
#define PE_TOK_CP_NUMBER 2   /* \p{N} */
#define PE_TOK_CP_SPACE  4   /* White_Space (regex \s) */
#define PE_TOK_CP_MARK   8   /* \p{M} */

/* ---- SentencePiece (llama.cpp's llm_tokenizer_spm) ------------------------------ */

typedef struct pe_tok_spm pe_tok_spm;

/* tokens: the UTF-8 texts of all n_tokens tokens back to back, token i at
 * texts[offsets[i] .. offsets[i+1]); scores: their scores; byte_ids: the token of each
 * byte value (<0xNN>) or -1; unk_id: used for bytes without a token (-1: none).
 * A text is cut into independently segmented chunks before each U+2581 whose
 * preceding code point is not one of glued[0..n_glued). */
pe_tok_spm *pe_tok_spm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                           const float *scores, const int32_t *byte_ids, int32_t unk_id,
                           const uint32_t *glued, int32_t n_glued);
void pe_tok_spm_free(pe_tok_spm *spm);
/* Segment a U+2581-escaped text; ids are appended to out. */
int pe_tok_spm_encode(pe_tok_spm *spm, const char *text, int64_t len, pe_tok_ids *out);
/* The same for raw text: spaces become U+2581 first, and one is put in front when
 * prefix_space is set (SentencePiece's add_space_prefix). */
int pe_tok_spm_encode_text(pe_tok_spm *spm, const char *text, int64_t len, int prefix_space,
                           pe_tok_ids *out);

/* ---- byte-level BPE (llama.cpp's llm_tokenizer_bpe) ----------------------------- */

/* How pe_tok_bpe_encode splits text into words (the regex each one reproduces is in
 * pyengine/tokenizer/pretokenizers.py). */
enum pe_tok_splitter {
    PE_TOK_SPLIT_NONE = 0,         /* only pe_tok_bpe_encode_words */
    PE_TOK_SPLIT_GPT2 = 1,         /* GPT2_FUSED */
    PE_TOK_SPLIT_DIGITS_GPT2 = 2,  /* DIGITS_GPT2_FUSED */
    PE_TOK_SPLIT_LLAMA3 = 3,       /* LLAMA3 */
    PE_TOK_SPLIT_QWEN2 = 4,        /* QWEN2 */
    PE_TOK_SPLIT_QWEN35 = 5        /* QWEN35 */
};

#define PE_TOK_BYTE_LEVEL     1  /* symbols are bytes (GPT-2 mapping), else UTF-8 chars */
#define PE_TOK_IGNORE_MERGES  2  /* a word that is a token is taken whole */
#define PE_TOK_NEWLINES_WHOLE 4  /* a word of only '\n' that is a token is taken whole */

typedef struct pe_tok_bpe_params {
    int32_t        n_vocab;
    int32_t        n_symbols;      /* n_vocab tokens + symbols that exist only in merges */
    const char    *symbol_bytes;   /* raw bytes each symbol stands for, back to back */
    const int64_t *symbol_offsets; /* n_symbols + 1; a token without known bytes: empty */
    const int32_t *merges;         /* n_merges rows of (left, right, result); rank = row */
    int32_t        n_merges;
    const int32_t *byte_symbols;   /* BYTE_LEVEL: the symbol of each byte value, or -1 */
    const int32_t *byte_fallback;  /* 256: the token for a byte of a non-token symbol, or -1 */
    int32_t        flags;          /* PE_TOK_BYTE_LEVEL | ... */
    int32_t        splitter;       /* enum pe_tok_splitter */
    const uint8_t *cp_classes;     /* PE_TOK_N_CODEPOINTS entries; kept, not copied */
} pe_tok_bpe_params;

typedef struct pe_tok_bpe pe_tok_bpe;

pe_tok_bpe *pe_tok_bpe_new(const pe_tok_bpe_params *params);
void pe_tok_bpe_free(pe_tok_bpe *bpe);
/* Split text with the built-in splitter and encode every word. */
int pe_tok_bpe_encode(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *out);
/* Encode text already split into n_words words of word_cps[i] code points each. */
int pe_tok_bpe_encode_words(pe_tok_bpe *bpe, const char *text, int64_t len,
                            const int64_t *word_cps, int64_t n_words, pe_tok_ids *out);
/* The word boundaries (code point counts) the built-in splitter finds: for tests. */
int pe_tok_bpe_split(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *word_cps);

/* ---- Unigram (llama.cpp's llm_tokenizer_ugm) ------------------------------------ */

typedef struct pe_tok_ugm pe_tok_ugm;

#define PE_TOK_UGM_ESCAPE_SPACES 1  /* spaces become U+2581 */
#define PE_TOK_UGM_PREPEND_SPACE 2  /* one more before the first word */
#define PE_TOK_UGM_APPEND_SPACE  4  /* one after the text */
#define PE_TOK_UGM_MERGE_SPACES  8  /* runs of spaces: one before each word */

#define PE_TOK_UGM_NONE         0   /* kinds[] of a token: never part of a segmentation */
#define PE_TOK_UGM_NORMAL       1   /* normal or unused: matched with its score */
#define PE_TOK_UGM_USER_DEFINED 2   /* matched with score 0; the normalizer keeps its text */

/* tokens as for pe_tok_spm_new; kinds: PE_TOK_UGM_* per token; unknown_score: the score
 * of an unknown character; charsmap: SentencePiece's precompiled_charsmap (may be empty). */
pe_tok_ugm *pe_tok_ugm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                           const float *scores, const uint8_t *kinds, int32_t unk_id,
                           float unknown_score, const char *charsmap, int64_t charsmap_len,
                           int32_t flags);
void pe_tok_ugm_free(pe_tok_ugm *ugm);
/* Normalize and segment text; ids are appended to out. */
int pe_tok_ugm_encode(pe_tok_ugm *ugm, const char *text, int64_t len, pe_tok_ids *out);

/* ---- WordPiece (llama.cpp's llm_tokenizer_wpm) ------------------------------------ */

typedef struct pe_tok_wpm pe_tok_wpm;

/* tokens as for pe_tok_spm_new (word starts marked with U+2581); unk_id -1: none. */
pe_tok_wpm *pe_tok_wpm_new(const char *texts, const int64_t *offsets, int32_t n_tokens, int32_t unk_id);
void pe_tok_wpm_free(pe_tok_wpm *wpm);
/* Cut the normalized words of text (separated by spaces), each the longest tokens first
 * from its start, or the unknown token when it cannot be cut whole; ids appended to out. */
int pe_tok_wpm_encode(pe_tok_wpm *wpm, const char *text, int64_t len, pe_tok_ids *out);

#ifdef __cplusplus
}
#endif

#endif /* PE_TOK_H */
