// cmd_demo.c - `attn demo`: attention step by step, in the order of "Build a Large Language Model
// (From Scratch)", ch. 3, and of the notebooks that follow it. Every tensor is printed as PyTorch
// prints it, under a one-line caption that says how PyTorch would produce it; the seeded examples
// print PyTorch's numbers. Everything is computed by the library; the demo only arranges it.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "heatmap.h"
#include "print.h"

static const char summary[] =
    "usage: attn demo [--plot DIR [--plotter auto|matplotlib|gnuplot] [--python EXE]]\n"
    "\n"
    "Walks through attention step by step: self-attention without weights, with trainable weights\n"
    "(raw matrices, then nn.Linear), causal masking and dropout, the multi-head wrapper, the weight-\n"
    "split multi-head module, and nn.MultiheadAttention. Each tensor is printed in PyTorch's format\n"
    "under a caption; the seeded examples reproduce PyTorch's numbers. Everything is computed with the\n"
    "reference kernels (ATTN_ISA_REF), whose sums are exact before the final rounding.\n"
    "\n"
    "--plot DIR also writes the chapter's attention-weight matrices (simplified self-attention, the\n"
    "trainable-weights modules, causal, causal with dropout, each head of the multi-head modules) to\n"
    "DIR (created if missing) as CSV files labelled with the tokens, and draws them as PNG heatmaps with\n"
    "matplotlib (through --python, default python3) or, without it, gnuplot. With neither it says so\n"
    "and exits with status 1; the CSV files are written all the same.";

// "Your journey starts with one step": one 3-d embedding per token.
static const float inputs[6 * 3] = {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f,
                                    0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f};

typedef struct demo {
    attn_ctx *ctx;
    int failed;
    heatmap_set *plots; // --plot: the weights are recorded here; NULL otherwise
} demo;

// Token labels of the heatmaps: the sentence's words, or positions for other inputs.
static const char *const words[6] = {"Your", "journey", "starts", "with", "one", "step"};
static const char *const positions[8] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8"};

// With --plot: writes the (n, n) weights as DIR/NAME.csv for a heatmap (nothing otherwise).
static void plot(demo *d, const char *name, const char *title, const float *w, int64_t n, const char *const *labels) {
    if (d->plots != NULL && !d->failed && heatmap_add(d->plots, name, title, w, n, n, labels, labels) != EXIT_OK)
        d->failed = 1;
}

// Each head of weights (heads, n, n) as NAME_head<h>.
static void plot_heads(demo *d, const char *name, const char *title, const float *w, int heads, int64_t n,
                       const char *const *labels) {
    for (int h = 0; h < heads; h++) {
        char nm[48], tt[200];
        snprintf(nm, sizeof nm, "%s_head%d", name, h);
        snprintf(tt, sizeof tt, "%s: head %d", title, h);
        plot(d, nm, tt, w + (int64_t)h * n * n, n, labels);
    }
}

static void section(const char *title) { printf("== %s ==\n\n", title); }

// Prints "# caption" and the tensor. ndim is followed by ndim sizes.
static void show(const char *caption, const float *x, int ndim, ...) {
    int64_t shape[8];
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int64_t);
    va_end(ap);
    printf("# %s\n", caption);
    attn_print_tensor(stdout, x, ndim, shape, NULL);
    printf("\n");
}

// Records a library failure (the demo stops at the next check).
static bool ok(demo *d, attn_status st, const char *what) {
    if (st == ATTN_OK) return true;
    cli_fail("demo", d->ctx, st, what);
    d->failed = 1;
    return false;
}

static float *param(demo *d, attn_book *m, const char *name) {
    float *p = NULL;
    ok(d, attn_book_param(m, name, NULL, NULL, &p), name);
    return p;
}

// ---- 1. simplified self-attention ---------------------------------------------------------------

static void simple_attention(demo *d) {
    section("1. Self-attention without trainable weights (3.3)");
    float scores[36], w_sum[36], w_soft[36], ctx_sum[18], ctx_soft[18];
    if (!ok(d, attn_simple_self_attention(d->ctx, inputs, 6, 3, ATTN_SIMPLE_SOFTMAX, scores, w_soft, ctx_soft), "simple") ||
        !ok(d, attn_simple_self_attention(d->ctx, inputs, 6, 3, ATTN_SIMPLE_SUM, NULL, w_sum, ctx_sum), "simple"))
        return;
    show("inputs: \"Your journey starts with one step\", one 3-d embedding per token", inputs, 2, 6LL, 3LL);
    show("attention scores of the query x^2 (\"journey\"): the dot products x^2 . x^j", scores + 6, 1, 6LL);
    show("attention weights of x^2 normalised by their sum: scores / scores.sum()", w_sum + 6, 1, 6LL);
    show("attention weights of x^2 with softmax: torch.softmax(scores, dim=0)", w_soft + 6, 1, 6LL);
    show("context vector z^2: sum over j of weight_j * x^j", ctx_soft + 3, 1, 3LL);
    show("all attention scores: inputs @ inputs.T", scores, 2, 6LL, 6LL);
    show("all attention weights: torch.softmax(scores, dim=-1)", w_soft, 2, 6LL, 6LL);
    show("all context vectors: weights @ inputs", ctx_soft, 2, 6LL, 3LL);
    plot(d, "01_self_attention", "3.3 Self-attention without weights: softmax(inputs @ inputs.T)", w_soft, 6, words);
}

// ---- 2. trainable weights: raw matrices ---------------------------------------------------------

static void trainable_weights(demo *d) {
    section("2. Self-attention with trainable weights (3.4): torch.manual_seed(123), then W_query, W_key, "
            "W_value = torch.rand(3, 2) each");
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    attn_book *v1 = NULL;
    if (!ok(d, attn_book_self_attention_v1(d->ctx, 3, 2, &v1), "SelfAttention_v1")) return;
    float *Wq = param(d, v1, "W_query"), *Wk = param(d, v1, "W_key"), *Wv = param(d, v1, "W_value");
    float q[12], k[12], v[12], s[36], w[36], c[12];
    if (d->failed || !ok(d, attn_linear(d->ctx, inputs, 6, 3, Wq, ATTN_WEIGHT_IN_OUT, NULL, 2, q), "queries") ||
        !ok(d, attn_linear(d->ctx, inputs, 6, 3, Wk, ATTN_WEIGHT_IN_OUT, NULL, 2, k), "keys") ||
        !ok(d, attn_linear(d->ctx, inputs, 6, 3, Wv, ATTN_WEIGHT_IN_OUT, NULL, 2, v), "values") ||
        !ok(d, attn_linear(d->ctx, q, 6, 2, k, ATTN_WEIGHT_OUT_IN, NULL, 6, s), "scores") ||
        !ok(d, attn_book_forward(d->ctx, v1, inputs, 1, 6, 0, c, w), "SelfAttention_v1")) {
        attn_book_free(v1);
        return;
    }
    show("W_query", Wq, 2, 3LL, 2LL);
    show("W_key", Wk, 2, 3LL, 2LL);
    show("W_value", Wv, 2, 3LL, 2LL);
    show("query_2 = x^2 @ W_query", q + 2, 1, 2LL);
    show("keys = inputs @ W_key", k, 2, 6LL, 2LL);
    show("values = inputs @ W_value", v, 2, 6LL, 2LL);
    show("attention score w22 = query_2 . key_2", s + 6 + 1, 0);
    show("attention scores of query_2: query_2 @ keys.T", s + 6, 1, 6LL);
    show("attention weights of query_2: torch.softmax(scores / d_k**0.5, dim=-1) with d_k = 2", w + 6, 1, 6LL);
    show("context vector of x^2: weights @ values", c + 2, 1, 2LL);
    show("all attention scores: queries @ keys.T", s, 2, 6LL, 6LL);
    show("all attention weights", w, 2, 6LL, 6LL);
    show("all context vectors: SelfAttention_v1(3, 2) after torch.manual_seed(123)", c, 2, 6LL, 2LL);
    plot(d, "02_self_attention_v1", "3.4 SelfAttention_v1(3, 2), torch.manual_seed(123)", w, 6, words);
    attn_book_free(v1);
}

// ---- 3. nn.Linear layers, 4. causal masking, 5. dropout -------------------------------------------

static void linear_causal_dropout(demo *d) {
    section("3. SelfAttention_v2 with nn.Linear layers (3.4.2): torch.manual_seed(789); SelfAttention_v2(3, 2)");
    attn_generator_seed(attn_ctx_generator(d->ctx), 789);
    attn_book *v2 = NULL, *v1 = NULL, *ca = NULL;
    float c2[12], c1[12], w[36], q[12], k[12], s[36], cw[36], cc[12];
    if (!ok(d, attn_book_self_attention_v2(d->ctx, 3, 2, 0, &v2), "SelfAttention_v2") ||
        !ok(d, attn_book_self_attention_v1(d->ctx, 3, 2, &v1), "SelfAttention_v1") ||
        !ok(d, attn_book_causal_attention(d->ctx, 3, 2, 6, 0.0, 0, &ca), "CausalAttention") ||
        !ok(d, attn_book_transfer_v2_to_v1(v2, v1), "weight transfer"))
        goto done;
    // the causal module takes SelfAttention_v2's weights, as the chapter reuses them
    static const char *const names[3] = {"W_query.weight", "W_key.weight", "W_value.weight"};
    for (int i = 0; i < 3; i++) {
        float *src = param(d, v2, names[i]), *dst = param(d, ca, names[i]);
        if (d->failed) goto done;
        memcpy(dst, src, 6 * sizeof(float));
    }
    if (!ok(d, attn_book_forward(d->ctx, v2, inputs, 1, 6, 0, c2, w), "SelfAttention_v2") ||
        !ok(d, attn_book_forward(d->ctx, v1, inputs, 1, 6, 0, c1, NULL), "SelfAttention_v1") ||
        !ok(d, attn_linear(d->ctx, inputs, 6, 3, param(d, v2, "W_query.weight"), ATTN_WEIGHT_OUT_IN, NULL, 2, q), "q") ||
        !ok(d, attn_linear(d->ctx, inputs, 6, 3, param(d, v2, "W_key.weight"), ATTN_WEIGHT_OUT_IN, NULL, 2, k), "k") ||
        !ok(d, attn_linear(d->ctx, q, 6, 2, k, ATTN_WEIGHT_OUT_IN, NULL, 6, s), "scores") ||
        !ok(d, attn_book_forward(d->ctx, ca, inputs, 1, 6, 0, cc, cw), "CausalAttention"))
        goto done;
    show("context vectors", c2, 2, 6LL, 2LL);
    show("SelfAttention_v1 given v2's weights transposed (exercise 3.1): the same context vectors", c1, 2, 6LL, 2LL);
    plot(d, "03_self_attention_v2", "3.4.2 SelfAttention_v2(3, 2), torch.manual_seed(789)", w, 6, words);

    section("4. Hiding future words with causal attention (3.5), with SelfAttention_v2's weights");
    float tril[36], masked[36], renorm[36], ms[36];
    for (int i = 0; i < 6; i++) {
        double sum = 0.0;
        for (int j = 0; j < 6; j++) {
            tril[i * 6 + j] = j <= i ? 1.0f : 0.0f;
            masked[i * 6 + j] = w[i * 6 + j] * tril[i * 6 + j];
            ms[i * 6 + j] = j <= i ? s[i * 6 + j] : -INFINITY;
            sum += masked[i * 6 + j];
        }
        for (int j = 0; j < 6; j++) renorm[i * 6 + j] = (float)(masked[i * 6 + j] / sum);
    }
    show("attention weights without a mask", w, 2, 6LL, 6LL);
    show("simple mask: torch.tril(torch.ones(6, 6))", tril, 2, 6LL, 6LL);
    show("masked weights: weights * mask", masked, 2, 6LL, 6LL);
    show("renormalised: masked / masked.sum(dim=-1, keepdim=True)", renorm, 2, 6LL, 6LL);
    show("masked scores: scores.masked_fill(torch.triu(torch.ones(6, 6), diagonal=1).bool(), -torch.inf)", ms, 2,
         6LL, 6LL);
    show("attention weights: torch.softmax(masked / d_k**0.5, dim=-1), equal to the renormalised ones", cw, 2, 6LL,
         6LL);
    show("context vectors of causal attention", cc, 2, 6LL, 2LL);
    plot(d, "04_causal", "3.5 Causal attention with SelfAttention_v2's weights", cw, 6, words);

    section("5. Dropout (3.5.2): torch.manual_seed(123); dropout = torch.nn.Dropout(0.5)");
    float ones[36], dropped[36], dropped_w[36];
    for (int i = 0; i < 36; i++) ones[i] = 1.0f;
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_rand_dropout(attn_ctx_generator(d->ctx), ones, dropped, 36, 0.5), "dropout")) goto done;
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_rand_dropout(attn_ctx_generator(d->ctx), cw, dropped_w, 36, 0.5), "dropout")) goto done;
    show("dropout(torch.ones(6, 6)): about half the entries zeroed, the rest scaled by 1/(1-0.5)", dropped, 2, 6LL,
         6LL);
    show("torch.manual_seed(123); dropout(attention weights)", dropped_w, 2, 6LL, 6LL);
    plot(d, "05_causal_dropout", "3.5.2 Causal attention weights after dropout(0.5), torch.manual_seed(123)", dropped_w,
         6, words);
done:
    attn_book_free(v2);
    attn_book_free(v1);
    attn_book_free(ca);
}

// ---- 6.-9. batches and multiple heads ------------------------------------------------------------

static void multi_head(demo *d) {
    float batch[2 * 6 * 3];
    memcpy(batch, inputs, sizeof inputs);
    memcpy(batch + 18, inputs, sizeof inputs);
    attn_book *m = NULL;

    section("6. CausalAttention on a batch (3.5.3): batch = torch.stack((inputs, inputs), dim=0); "
            "torch.manual_seed(123); CausalAttention(3, 2, 6, 0.0)");
    float c6[2 * 6 * 2];
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_book_causal_attention(d->ctx, 3, 2, 6, 0.0, 0, &m), "CausalAttention") ||
        !ok(d, attn_book_forward(d->ctx, m, batch, 2, 6, 0, c6, NULL), "CausalAttention"))
        goto done;
    show("context vectors", c6, 3, 2LL, 6LL, 2LL);
    attn_book_free(m);
    m = NULL;

    section("7. Stacking causal heads (3.6.1): torch.manual_seed(123); MultiHeadAttentionWrapper(3, 2, 6, 0.0, "
            "num_heads=2)");
    float c7[2 * 6 * 4], w7[2 * 2 * 36];
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_book_mha_wrapper(d->ctx, 3, 2, 6, 0.0, 2, 0, &m), "MultiHeadAttentionWrapper") ||
        !ok(d, attn_book_forward(d->ctx, m, batch, 2, 6, 0, c7, w7), "MultiHeadAttentionWrapper"))
        goto done;
    show("context vectors: the two heads' outputs concatenated", c7, 3, 2LL, 6LL, 4LL);
    plot_heads(d, "07_wrapper", "3.6.1 MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2), torch.manual_seed(123)",
               w7, 2, 6, words);
    attn_book_free(m);
    m = NULL;

    section("8. Batched matrix multiplication over heads (3.6.2): a has shape (b, num_heads, num_tokens, "
            "head_dim) = (1, 2, 3, 4)");
    static const float a[2 * 3 * 4] = {0.2745f, 0.6584f, 0.2775f, 0.8573f, 0.8993f, 0.0390f, 0.9268f, 0.7388f,
                                       0.7179f, 0.7058f, 0.9156f, 0.4340f, 0.0772f, 0.3565f, 0.1479f, 0.5331f,
                                       0.4066f, 0.2318f, 0.4545f, 0.9737f, 0.4606f, 0.5159f, 0.4220f, 0.5786f};
    float aa[2 * 9];
    for (int h = 0; h < 2; h++)
        if (!ok(d, attn_linear(d->ctx, a + h * 12, 3, 4, a + h * 12, ATTN_WEIGHT_OUT_IN, NULL, 3, aa + h * 9), "matmul"))
            goto done;
    show("a", a, 4, 1LL, 2LL, 3LL, 4LL);
    show("a @ a.transpose(2, 3)", aa, 4, 1LL, 2LL, 3LL, 3LL);
    show("first head: a[0, 0, :, :] @ a[0, 0, :, :].T", aa, 2, 3LL, 3LL);
    show("second head: a[0, 1, :, :] @ a[0, 1, :, :].T", aa + 9, 2, 3LL, 3LL);

    section("9. Multi-head attention with weight splits (3.6.2): torch.manual_seed(123); "
            "MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)");
    float c9[2 * 6 * 2], w9[2 * 2 * 36];
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_book_mha(d->ctx, 3, 2, 6, 0.0, 2, 0, &m), "MultiHeadAttention") ||
        !ok(d, attn_book_forward(d->ctx, m, batch, 2, 6, 0, c9, w9), "MultiHeadAttention"))
        goto done;
    show("context vectors", c9, 3, 2LL, 6LL, 2LL);
    plot_heads(d, "09_multihead", "3.6.2 MultiHeadAttention(3, 2, 6, 0.0, num_heads=2), torch.manual_seed(123)", w9, 2,
               6, words);
    attn_book_free(m);
    m = NULL;

    section("10. Multi-head attention on embedded tokens: torch.manual_seed(123) (the notebook leaves it "
            "unseeded), inputs = nn.Embedding(6, 3).weight, then MultiHeadAttention(3, 2, 6, 0, num_heads=2) "
            "from the same stream");
    float emb[18], eb[2 * 18], w10[2 * 2 * 36], c10[2 * 6 * 2];
    attn_generator_seed(attn_ctx_generator(d->ctx), 123);
    if (!ok(d, attn_init_embedding(attn_ctx_generator(d->ctx), emb, 6, 3, -1), "nn.Embedding")) goto done;
    memcpy(eb, emb, sizeof emb);
    memcpy(eb + 18, emb, sizeof emb);
    if (!ok(d, attn_book_mha(d->ctx, 3, 2, 6, 0.0, 2, 0, &m), "MultiHeadAttention") ||
        !ok(d, attn_book_forward(d->ctx, m, eb, 2, 6, 0, c10, w10), "MultiHeadAttention"))
        goto done;
    show("inputs = nn.Embedding(6, 3).weight.data; batches = torch.stack((inputs, inputs), dim=0)", emb, 2, 6LL, 3LL);
    show("attention weights of both heads, after the causal mask", w10, 4, 2LL, 2LL, 6LL, 6LL);
    show("context vectors", c10, 3, 2LL, 6LL, 2LL);
    plot_heads(d, "10_multihead_embedded", "MultiHeadAttention on nn.Embedding(6, 3) inputs, torch.manual_seed(123)",
               w10, 2, 6, positions);
done:
    attn_book_free(m);
}

// ---- 11. nn.MultiheadAttention ------------------------------------------------------------------

static void torch_mha(demo *d) {
    section("11. nn.MultiheadAttention against a from-scratch module: torch.manual_seed(1); query, key and value "
            "inputs = torch.rand(1, 8, 4) each");
    attn_generator *g = attn_ctx_generator(d->ctx);
    float q[32], k[32], v[32], out[32], w_avg[64], w_heads[128], mean[64];
    attn_generator_seed(g, 1);
    if (!ok(d, attn_rand_uniform(g, q, 32, 0.0, 1.0), "rand") || !ok(d, attn_rand_uniform(g, k, 32, 0.0, 1.0), "rand") ||
        !ok(d, attn_rand_uniform(g, v, 32, 0.0, 1.0), "rand"))
        return;
    attn_generator_seed(g, 1);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 4, 2);
    cfg.batch_first = 1;
    attn_mha *m = NULL;
    if (!ok(d, attn_mha_create(d->ctx, &cfg, &m), "nn.MultiheadAttention")) return;
    float *w_in = NULL, *w_out = NULL;
    attn_mha_param(m, "in_proj_weight", NULL, NULL, &w_in);
    attn_mha_param(m, "out_proj.weight", NULL, NULL, &w_out);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = k, a.value = v, a.batch = 1, a.len_q = 8, a.len_kv = 8, a.causal = 1;
    a.training = 1; // a module is in training mode after construction; its dropout is 0
    if (!ok(d, attn_mha_forward(d->ctx, m, &a, out, w_avg), "nn.MultiheadAttention")) goto done;
    a.average_attn_weights = 0;
    if (!ok(d, attn_mha_forward(d->ctx, m, &a, out, w_heads), "nn.MultiheadAttention")) goto done;
    for (int i = 0; i < 64; i++) mean[i] = (w_heads[i] + w_heads[64 + i]) / 2.0f;
    show("torch.manual_seed(1); nn.MultiheadAttention(4, 2, bias=True, batch_first=True): in_proj_weight, W_q, W_k, "
         "W_v stacked",
         w_in, 2, 12LL, 4LL);
    show("out_proj.weight", w_out, 2, 4LL, 4LL);
    show("output with attn_mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()", out, 3, 1LL, 8LL, 4LL);
    show("attention weights, averaged over the heads", w_avg, 3, 1LL, 8LL, 8LL);
    show("from scratch: the weights of each head", w_heads, 4, 1LL, 2LL, 8LL, 8LL);
    show("from scratch: their mean over the heads, equal to PyTorch's averaged weights", mean, 3, 1LL, 8LL, 8LL);
    plot_heads(d, "11_nn_multihead", "nn.MultiheadAttention(4, 2), causal, torch.manual_seed(1)", w_heads, 2, 8,
               positions);
    plot(d, "11_nn_multihead_average", "nn.MultiheadAttention(4, 2), causal, torch.manual_seed(1): the heads' average",
         w_avg, 8, positions);
done:
    attn_mha_free(m);
}

// ---- 12. raw weight matrices split into heads ---------------------------------------------------

static void raw_heads(demo *d) {
    section("12. Multi-head attention from raw matrices: torch.manual_seed(123) (the notebook leaves it unseeded); "
            "x = torch.randn(1, 4, 8); W_q, W_k, W_v, W_o = torch.randn(8, 8) each (K is x @ W_k)");
    attn_generator *g = attn_ctx_generator(d->ctx);
    float x[32], Wq[64], Wk[64], Wv[64], Wo[64], Q[32], K[32], V[32], heads[32], concat[32], projected[32];
    attn_generator_seed(g, 123);
    if (!ok(d, attn_rand_normal(g, x, 32, 0.0, 1.0), "randn") || !ok(d, attn_rand_normal(g, Wq, 64, 0.0, 1.0), "randn") ||
        !ok(d, attn_rand_normal(g, Wk, 64, 0.0, 1.0), "randn") || !ok(d, attn_rand_normal(g, Wv, 64, 0.0, 1.0), "randn") ||
        !ok(d, attn_rand_normal(g, Wo, 64, 0.0, 1.0), "randn") ||
        !ok(d, attn_linear(d->ctx, x, 4, 8, Wq, ATTN_WEIGHT_IN_OUT, NULL, 8, Q), "Q") ||
        !ok(d, attn_linear(d->ctx, x, 4, 8, Wk, ATTN_WEIGHT_IN_OUT, NULL, 8, K), "K") ||
        !ok(d, attn_linear(d->ctx, x, 4, 8, Wv, ATTN_WEIGHT_IN_OUT, NULL, 8, V), "V"))
        return;
    // Q, K, V are (1, 4, 8) = (b, tokens, heads * head_dim): split_heads is a view, given as strides.
    attn_sdpa_desc sd;
    attn_sdpa_desc_init(&sd);
    sd.batch = 1, sd.n_heads = 2, sd.len_q = sd.len_kv = 4, sd.head_dim = 4;
    attn_layout_strides(ATTN_LAYOUT_BLHD, 1, 2, 4, 4, sd.q_stride);
    memcpy(sd.k_stride, sd.q_stride, sizeof sd.q_stride);
    memcpy(sd.v_stride, sd.q_stride, sizeof sd.q_stride);
    memcpy(sd.o_stride, sd.q_stride, sizeof sd.q_stride);
    if (!ok(d, attn_sdpa_fwd(d->ctx, &sd, Q, K, V, concat, NULL, NULL), "attention") ||
        !ok(d, attn_linear(d->ctx, concat, 4, 8, Wo, ATTN_WEIGHT_IN_OUT, NULL, 8, projected), "W_o"))
        return;
    for (int h = 0; h < 2; h++) // head_output (1, 2, 4, 4) is the (1, 4, 2, 4) result transposed
        for (int t = 0; t < 4; t++) memcpy(heads + (h * 4 + t) * 4, concat + t * 8 + h * 4, 4 * sizeof(float));
    show("x", x, 3, 1LL, 4LL, 8LL);
    show("head_output = softmax(Qh @ Kh.transpose(-2, -1) / sqrt(head_dim), dim=-1) @ Vh for 2 heads of 4", heads, 4,
         1LL, 2LL, 4LL, 4LL);
    show("multihead attention output: the heads concatenated, head_output.transpose(1, 2).reshape(1, 4, 8)", concat,
         3, 1LL, 4LL, 8LL);
    show("with the output projection the notebook draws but does not apply: concatenated @ W_o", projected, 3, 1LL,
         4LL, 8LL);
}

int cmd_demo(int argc, char **argv) {
    const char *plot_dir = NULL, *plotter_name = "auto", *python = "python3";
    arg_spec specs[] = {
        {"--plot", ARG_STRING, &plot_dir, "DIR", "also write the attention weights to DIR: CSV files and PNG heatmaps",
         false, false},
        {"--plotter", ARG_STRING, &plotter_name, "NAME", "auto (matplotlib, else gnuplot), matplotlib or gnuplot", false,
         false},
        {"--python", ARG_STRING, &python, "EXE", "the Python that runs matplotlib (default python3)", false, false},
    };
    const int n_specs = (int)(sizeof specs / sizeof specs[0]);
    int rc = args_parse("demo", summary, argc, argv, specs, n_specs);
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    heatmap_plotter plotter;
    if (!heatmap_parse_plotter(plotter_name, &plotter))
        return cli_error("demo", EXIT_USAGE, "--plotter must be auto, matplotlib or gnuplot, not '%s'", plotter_name);
    if (plot_dir == NULL && (args_seen(specs, n_specs, "--plotter") || args_seen(specs, n_specs, "--python")))
        return cli_error("demo", EXIT_USAGE, "--plotter and --python go with --plot DIR");
    heatmap_set plots;
    if (plot_dir != NULL && (rc = heatmap_open(&plots, "demo", plot_dir)) != EXIT_OK) return rc;
    demo d = {NULL, 0, plot_dir != NULL ? &plots : NULL};
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_REF; // the specification: exact sums, the numbers a reader checks by hand
    if (cli_context("demo", &p, &d.ctx) != 0) return EXIT_FAILURE_RUN;
    printf("attn demo: attention step by step, as in \"Build a Large Language Model (From Scratch)\", ch. 3.\n"
           "Each tensor is printed as PyTorch prints it, under a caption saying how PyTorch makes it.\n\n");
    void (*const steps[])(demo *) = {simple_attention, trainable_weights, linear_causal_dropout, multi_head, torch_mha,
                                     raw_heads};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0] && !d.failed; i++) steps[i](&d);
    attn_ctx_free(d.ctx);
    if (d.failed) return EXIT_FAILURE_RUN;
    return d.plots != NULL ? heatmap_draw(d.plots, plotter, python) : EXIT_OK;
}
