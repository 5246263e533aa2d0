// mha_state_dict.c - nn.MultiheadAttention in C: build it like torch.manual_seed(0);
// nn.MultiheadAttention(8, 2), list its state_dict, save it as safetensors, load it back and run a
// causal self-attention forward.
#include <stdio.h>
#include <string.h>

#include "attn.h"

#define CHECK(expr)                                                              \
    do {                                                                         \
        if ((expr) != ATTN_OK) {                                                 \
            fprintf(stderr, "%s: %s\n", #expr, attn_ctx_last_error(ctx));        \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "mha_state_dict.safetensors";
    attn_ctx *ctx;
    if (attn_ctx_create(NULL, &ctx) != ATTN_OK) return 1; // seed 0
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 8, 2);
    attn_mha *m, *loaded;
    CHECK(attn_mha_create(ctx, &cfg, &m));

    attn_tensor state[8];
    int n = attn_mha_param_count(m);
    for (int i = 0; i < n; i++) {
        memset(&state[i], 0, sizeof state[i]);
        float *data;
        int64_t shape[3];
        CHECK(attn_mha_param_at(m, i, (const char **)&state[i].name, &state[i].ndim, shape, &data));
        memcpy(state[i].shape, shape, sizeof shape);
        state[i].data = data;
        if (state[i].ndim == 1)
            printf("%-16s (%lld,)\n", state[i].name, (long long)shape[0]);
        else
            printf("%-16s (%lld, %lld)\n", state[i].name, (long long)shape[0], (long long)shape[1]);
    }
    CHECK(attn_safetensors_write(ctx, path, state, n));
    attn_tensor_list file;
    CHECK(attn_safetensors_read(ctx, path, &file));
    CHECK(attn_mha_create_from_state(ctx, &file, 2, NULL, &loaded));

    float x[5 * 8], out1[5 * 8], out2[5 * 8]; // unbatched (L, E) input
    CHECK(attn_rand_normal(attn_ctx_generator(ctx), x, 5 * 8, 0.0, 1.0));
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.unbatched = 1, a.len_q = 5, a.causal = 1, a.need_weights = 0;
    CHECK(attn_mha_forward(ctx, m, &a, out1, NULL));
    CHECK(attn_mha_forward(ctx, loaded, &a, out2, NULL));
    int same = memcmp(out1, out2, sizeof out1) == 0;
    printf("output[0, :4] = %.4f %.4f %.4f %.4f; the reloaded module agrees: %s\n", out1[0], out1[1], out1[2],
           out1[3], same ? "yes" : "no");
    attn_tensor_list_release(ctx, &file);
    attn_mha_free(m);
    attn_mha_free(loaded);
    attn_ctx_free(ctx);
    return same ? 0 : 1;
}
