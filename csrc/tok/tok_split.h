/* tok_split.h - pre-tokenizer splitters over decoded code points. */
#ifndef PE_TOK_SPLIT_H
#define PE_TOK_SPLIT_H

#include "tok_internal.h"

typedef struct tok_text {
    const uint32_t *cp;    /* code points */
    int64_t         n;
    const uint8_t  *cls;   /* PE_TOK_CP_* classes of every code point */
} tok_text;

/* One past the end of the word that starts at i (i < t->n). */
int64_t tok_split_gpt2(const tok_text *t, int64_t i, int digits_alone);
int64_t tok_split_llama3(const tok_text *t, int64_t i, int max_digits, int marks_are_letters);

#endif /* PE_TOK_SPLIT_H */
