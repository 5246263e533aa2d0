// book_causal.c - the book's CausalAttention on a batch of two copies of "Your journey starts with
// one step", seeded like torch.manual_seed(123), first as in eval mode and then in training mode
// with dropout 0.5; and the context_length limit.
#include <stdio.h>
#include <string.h>

#include "attn.h"

int main(void) {
    static const float inputs[6 * 3] = {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f,
                                        0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f};
    float batch[2 * 6 * 3], out[2 * 6 * 2], weights[2 * 6 * 6];
    memcpy(batch, inputs, sizeof inputs);
    memcpy(batch + 18, inputs, sizeof inputs);

    attn_ctx *ctx;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.seed = 123;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) return 1;
    attn_book *ca;
    if (attn_book_causal_attention(ctx, 3, 2, 6, 0.5, 0, &ca) != ATTN_OK) return 1;

    for (int training = 0; training <= 1; training++) {
        if (attn_book_forward(ctx, ca, batch, 2, 6, training, out, weights) != ATTN_OK) return 1;
        printf("%s: context of the last token %.4f %.4f; weights of token 2:", training ? "train" : "eval ", out[10],
               out[11]);
        for (int j = 0; j < 6; j++) printf(" %.4f", weights[2 * 6 + j]);
        printf("\n");
    }
    // Seven tokens do not fit a context_length of 6: a clear error, not a crash.
    float seven[7 * 3] = {0}, out7[7 * 2];
    attn_status st = attn_book_forward(ctx, ca, seven, 1, 7, 0, out7, NULL);
    printf("7 tokens: %s (%s)\n", attn_strerror(st), attn_ctx_last_error(ctx));
    attn_book_free(ca);
    attn_ctx_free(ctx);
    return st == ATTN_ERR_CONTEXT_LENGTH ? 0 : 1;
}
