/* tok_split.c - pre-tokenizer splitters: where the next word ends.
 *
 * Each function reproduces one regex of pyengine/tokenizer/pretokenizers.py exactly
 * (ordered alternation, greedy runs, the (?!\S) lookahead): given the start of a word,
 * it returns the index one past its last code point. Classes come from a table the
 * Python side builds with the same `regex` module, so both paths agree on Unicode.
 */
#include "tok_split.h"

#define L PE_TOK_CP_LETTER
#define N PE_TOK_CP_NUMBER
#define S PE_TOK_CP_SPACE
#define M PE_TOK_CP_MARK

static inline uint8_t cls_at(const tok_text *t, int64_t i) {
    return i < t->n ? t->cls[t->cp[i]] : 0;
}

static inline uint32_t lower_ascii(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at i: the length matched (0: none). */
static int contraction(const tok_text *t, int64_t i, int any_case) {
    if (t->cp[i] != '\'' || i + 1 >= t->n) {
        return 0;
    }
    uint32_t c1 = any_case ? lower_ascii(t->cp[i + 1]) : t->cp[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        return 2;
    }
    if (i + 2 >= t->n) {
        return 0;
    }
    uint32_t c2 = any_case ? lower_ascii(t->cp[i + 2]) : t->cp[i + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return 3;
    }
    return 0;
}

static inline int64_t run_of(const tok_text *t, int64_t i, uint8_t any_of) {
    while (i < t->n && (t->cls[t->cp[i]] & any_of)) {
        i++;
    }
    return i;
}

static inline int64_t run_without(const tok_text *t, int64_t i, uint8_t none_of) {
    while (i < t->n && !(t->cls[t->cp[i]] & none_of)) {
        i++;
    }
    return i;
}

/* GPT2_FUSED:        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s
 * DIGITS_GPT2_FUSED: \p{N}|'s|...| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s */
int64_t tok_split_gpt2(const tok_text *t, int64_t i, int digits_alone) {
    uint8_t c = cls_at(t, i);
    if (digits_alone && (c & N)) {
        return i + 1;
    }
    int len = contraction(t, i, 0);
    if (len) {
        return i + len;
    }
    int space = t->cp[i] == ' ' && i + 1 < t->n;
    uint8_t g = space ? cls_at(t, i + 1) : c;  /* the class after an optional space */
    if (space && !(g & (L | N | S)) ) {
        return run_without(t, i + 1, L | N | S);  /* " " + symbols */
    }
    if (g & L) {
        return run_of(t, i + space, L);
    }
    if (!digits_alone && (g & N)) {
        return run_of(t, i + space, N);
    }
    if (!(c & (L | N | S))) {
        return run_without(t, i, L | N | S);
    }
    /* c is whitespace (a space followed by whitespace, a digit or the end included) */
    int64_t end = run_of(t, i, S);
    if (end == t->n || (digits_alone && (cls_at(t, end) & N))) {
        return end;           /* \s+ up to the end (a digit ends the text the same way) */
    }
    return end - i > 1 ? end - 1 : i + 1;  /* \s+(?!\S), else the lone \s */
}

/* LLAMA3 (max_digits 3), QWEN2 (1), QWEN35 (1, marks count as letters):
 * (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
int64_t tok_split_llama3(const tok_text *t, int64_t i, int max_digits, int marks_are_letters) {
    uint32_t cp = t->cp[i];
    uint8_t c = cls_at(t, i);
    uint8_t word = marks_are_letters ? (L | M) : L;
    int len = contraction(t, i, 1);
    if (len) {
        return i + len;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : the first character (a letter, or any prefix before one),
     * then the run of letters */
    if (cp != '\r' && cp != '\n' && !(c & N) && ((c & word) || (cls_at(t, i + 1) & word))) {
        return run_of(t, i + 1, word);
    }
    if (c & N) {
        int64_t end = i;
        while (end < t->n && end - i < max_digits && (t->cls[t->cp[end]] & N)) {
            end++;
        }
        return end;
    }
    uint8_t not_symbol = S | L | N | (marks_are_letters ? M : 0);
    int64_t start = (cp == ' ' && i + 1 < t->n && !(cls_at(t, i + 1) & not_symbol)) ? i + 1 : i;
    if (!(cls_at(t, start) & not_symbol)) {  /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        int64_t end = run_without(t, start, not_symbol);
        while (end < t->n && (t->cp[end] == '\r' || t->cp[end] == '\n')) {
            end++;
        }
        return end;
    }
    /* whitespace */
    int64_t end = i, last_newline = -1;
    while (end < t->n && (t->cls[t->cp[end]] & S)) {
        if (t->cp[end] == '\r' || t->cp[end] == '\n') {
            last_newline = end;
        }
        end++;
    }
    if (last_newline >= 0) {
        return last_newline + 1;  /* \s*[\r\n]+ */
    }
    if (end == i) {
        return i + 1;  /* unreachable with a consistent class table; never stall */
    }
    return (end < t->n && end - i > 1) ? end - 1 : end;  /* \s+(?!\S) | \s+ */
}
