// A program outside the project that uses an installed libattn.
#include <stdio.h>

#include <attn.h>

int main(void) {
    if (attn_version_number() != ATTN_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %d\n", ATTN_VERSION_NUMBER, attn_version_number());
        return 1;
    }
    attn_ctx *ctx;
    if (attn_ctx_create(NULL, &ctx) != ATTN_OK) return 1;
    float x[3 * 2] = {1, 0, 0, 1, 1, 1}, w[9], c[6];
    attn_status st = attn_simple_self_attention(ctx, x, 3, 2, ATTN_SIMPLE_SOFTMAX, NULL, w, c);
    printf("attn %s: weights[0] = %.4f %.4f %.4f (%s)\n", attn_version_string(), w[0], w[1], w[2], attn_strerror(st));
    attn_ctx_free(ctx);
    return st == ATTN_OK ? 0 : 1;
}
