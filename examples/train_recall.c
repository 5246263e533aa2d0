// train_recall.c - train a small causal multi-head attention model in C with AdamW.
//
// The task needs attention: at every position t >= K the model must output the token it saw K
// positions earlier (x[t-K]). Nothing at position t says what x[t-K] was, so the model has to look
// back, and to know how far it needs positions; a model without attention cannot beat chance
// (1/VOCAB). The model:
//
//   h0 = tok_emb[x_t] + pos_emb[t]                       (T, E) per sequence
//   h1 = h0 + MultiheadAttention(h0, causal)              libattn, batch_first, E = 32, 4 heads
//   logits = h1 W_head^T + b_head                         (T, VOCAB)
//   loss = mean cross-entropy over positions t >= K
//
// The attention's forward and backward are attn_mha_forward_train / attn_mha_backward; the
// embeddings, the head and the loss are a few loops here. Every parameter, the attention's
// included (its state_dict tensors), is updated by AdamW (torch.optim.AdamW's update rule).
//
// Usage: train_recall [--steps N] [--csv FILE] [--threads T] [--no-attention] [--check] [--device cpu|cuda]
//   --csv writes "step,loss,accuracy" per step; --no-attention trains the same model with the
//   attention removed (h1 = h0), which stays at chance; --check exits 1 unless the final loss is
//   below 0.05 (above ln(VOCAB) - 0.1 with --no-attention). --device cuda runs the attention's
//   forward and backward on the GPU (libattn_cuda's attn_cuda_mha_*, from the same module and the
//   same parameters, copied there after every update); the rest stays here, so the loss curve is
//   the CPU run's to float32 rounding. The last line gives the time per step.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#ifdef ATTN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "attn_cuda.h"
#endif

enum { VOCAB = 16, T = 24, K = 5, E = 32, HEADS = 4, BATCH = 32, MAX_PARAMS = 16 };

#define CHECK(expr)                                                              \
    do {                                                                         \
        if ((expr) != ATTN_OK) {                                                 \
            fprintf(stderr, "%s: %s\n", #expr, attn_ctx_last_error(ctx));        \
            goto done;                                                           \
        }                                                                        \
    } while (0)

// One trainable tensor with its gradient and AdamW moments.
typedef struct tensor {
    const char *name;
    float *w, *g, *m, *v;
    int64_t n;
    int decay; // weight decay applies to matrices, not to biases (as usual with AdamW)
} tensor;

typedef struct adamw {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t t;
} adamw;

// torch.optim.AdamW, one step: decoupled weight decay, bias-corrected moments.
static void adamw_step(adamw *o, tensor *p, int np) {
    o->t++;
    const double c1 = 1.0 - pow(o->beta1, (double)o->t), c2 = 1.0 - pow(o->beta2, (double)o->t);
    for (int k = 0; k < np; k++)
        for (int64_t i = 0; i < p[k].n; i++) {
            const double g = p[k].g[i];
            if (p[k].decay) p[k].w[i] -= (float)(o->lr * o->weight_decay * p[k].w[i]);
            p[k].m[i] = (float)(o->beta1 * p[k].m[i] + (1.0 - o->beta1) * g);
            p[k].v[i] = (float)(o->beta2 * p[k].v[i] + (1.0 - o->beta2) * g * g);
            const double mhat = p[k].m[i] / c1, vhat = p[k].v[i] / c2;
            p[k].w[i] -= (float)(o->lr * mhat / (sqrt(vhat) + o->eps));
        }
}

static int add_tensor(tensor *p, int np, const char *name, float *w, int64_t n, int decay) {
    p[np] = (tensor){name, w, calloc((size_t)n, 4), calloc((size_t)n, 4), calloc((size_t)n, 4), n, decay};
    return p[np].g != NULL && p[np].m != NULL && p[np].v != NULL ? np + 1 : -1;
}

// The attention on the GPU: the module's copy there, device buffers for h0, its output, dh1, dh0,
// the saved activations and the parameters' gradients.
typedef struct gpu {
#ifdef ATTN_HAVE_CUDA
    attn_cuda_ctx *ctx;
    attn_cuda_mha *mha;
    attn_cuda_mha_args args;
    void *x, *a, *dy, *dx, *saved;
    size_t saved_size, bytes;
    float *dparams[MAX_PARAMS];
    int64_t pn[MAX_PARAMS];
    int n_params;
#endif
    int on;
} gpu;

#ifdef ATTN_HAVE_CUDA
static int gpu_fail(gpu *g, const char *what) {
    fprintf(stderr, "train_recall: %s: %s\n", what, g->ctx != NULL ? attn_cuda_ctx_last_error(g->ctx) : "no context");
    return 1;
}

static int gpu_open(gpu *g, attn_mha *mha, const attn_mha_args *host_args, int64_t rows) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) {
        fprintf(stderr, "train_recall: --device cuda: %s\n", why);
        return 1;
    }
    if (attn_cuda_ctx_create(NULL, &g->ctx) != ATTN_OK || attn_cuda_mha_create(g->ctx, mha, &g->mha) != ATTN_OK)
        return gpu_fail(g, "the module on the GPU");
    attn_cuda_mha_args_init(&g->args);
    g->args.base = *host_args;
    g->bytes = (size_t)rows * E * sizeof(float);
    if (cudaMalloc(&g->x, g->bytes) != cudaSuccess || cudaMalloc(&g->a, g->bytes) != cudaSuccess ||
        cudaMalloc(&g->dy, g->bytes) != cudaSuccess || cudaMalloc(&g->dx, g->bytes) != cudaSuccess)
        return gpu_fail(g, "cudaMalloc");
    g->args.base.query = g->x;
    if (attn_cuda_mha_saved_size(g->ctx, g->mha, &g->args, &g->saved_size) != ATTN_OK ||
        cudaMalloc(&g->saved, g->saved_size) != cudaSuccess)
        return gpu_fail(g, "the saved buffer");
    g->n_params = attn_mha_param_count(mha);
    for (int i = 0; i < g->n_params; i++) {
        int ndim;
        int64_t shape[3];
        if (attn_mha_param_at(mha, i, NULL, &ndim, shape, NULL) != ATTN_OK) return 1;
        g->pn[i] = ndim == 1 ? shape[0] : ndim == 2 ? shape[0] * shape[1] : shape[0] * shape[1] * shape[2];
        if (cudaMalloc((void **)&g->dparams[i], (size_t)g->pn[i] * sizeof(float)) != cudaSuccess)
            return gpu_fail(g, "cudaMalloc");
    }
    g->on = 1;
    return 0;
}

static int gpu_forward(gpu *g, const float *h0, float *a) {
    if (cudaMemcpy(g->x, h0, g->bytes, cudaMemcpyHostToDevice) != cudaSuccess) return gpu_fail(g, "cudaMemcpy");
    if (attn_cuda_mha_forward_train(g->ctx, g->mha, &g->args, g->a, g->saved, g->saved_size) != ATTN_OK)
        return gpu_fail(g, "attn_cuda_mha_forward_train");
    return cudaMemcpy(a, g->a, g->bytes, cudaMemcpyDeviceToHost) != cudaSuccess ? gpu_fail(g, "cudaMemcpy") : 0;
}

// The backward: dh0 and the attention's parameter gradients (into dparams, host arrays).
static int gpu_backward(gpu *g, const float *dh1, float *dh0, float *const *dparams) {
    if (cudaMemcpy(g->dy, dh1, g->bytes, cudaMemcpyHostToDevice) != cudaSuccess) return gpu_fail(g, "cudaMemcpy");
    if (attn_cuda_mha_backward(g->ctx, g->mha, &g->args, g->saved, g->saved_size, g->dy, g->dx, NULL, NULL,
                               g->dparams) != ATTN_OK)
        return gpu_fail(g, "attn_cuda_mha_backward");
    if (cudaMemcpy(dh0, g->dx, g->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return gpu_fail(g, "cudaMemcpy");
    for (int i = 0; i < g->n_params; i++)
        if (cudaMemcpy(dparams[i], g->dparams[i], (size_t)g->pn[i] * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
            return gpu_fail(g, "cudaMemcpy");
    return 0;
}

// The module's parameters, just updated here, to the GPU's copy.
static int gpu_push(gpu *g, attn_mha *mha) {
    for (int i = 0; i < g->n_params; i++) {
        const char *name;
        float *w, *dw;
        if (attn_mha_param_at(mha, i, &name, NULL, NULL, &w) != ATTN_OK ||
            attn_cuda_mha_param(g->mha, name, NULL, NULL, NULL, (void **)&dw) != ATTN_OK ||
            cudaMemcpy(dw, w, (size_t)g->pn[i] * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            return gpu_fail(g, "the parameters to the GPU");
    }
    return 0;
}

static void gpu_close(gpu *g) {
    cudaFree(g->x), cudaFree(g->a), cudaFree(g->dy), cudaFree(g->dx), cudaFree(g->saved);
    for (int i = 0; i < g->n_params; i++) cudaFree(g->dparams[i]);
    attn_cuda_mha_free(g->mha);
    attn_cuda_ctx_free(g->ctx);
}
#else
static int gpu_open(gpu *g, attn_mha *mha, const attn_mha_args *host_args, int64_t rows) {
    (void)g, (void)mha, (void)host_args, (void)rows;
    fprintf(stderr, "train_recall: --device cuda: this build has no libattn_cuda (no CUDA compiler when configured)\n");
    return 1;
}
static int gpu_forward(gpu *g, const float *h0, float *a) { return (void)g, (void)h0, (void)a, 1; }
static int gpu_backward(gpu *g, const float *dh1, float *dh0, float *const *dparams) {
    return (void)g, (void)dh1, (void)dh0, (void)dparams, 1;
}
static int gpu_push(gpu *g, attn_mha *mha) { return (void)g, (void)mha, 1; }
static void gpu_close(gpu *g) { (void)g; }
#endif

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int steps = 400, threads = 1, check = 0, attention = 1;
    const char *csv_path = NULL, *device = "cpu";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--check") == 0) check = 1;
        else if (strcmp(argv[i], "--no-attention") == 0) attention = 0;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--steps N] [--csv FILE] [--threads T] [--no-attention] [--check] [--device cpu|cuda]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1 || threads < 1) {
        fprintf(stderr, "%s: --steps and --threads must be >= 1\n", argv[0]);
        return 2;
    }
    if (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fprintf(stderr, "%s: --device must be cpu or cuda, not '%s'\n", argv[0], device);
        return 2;
    }
    gpu dev = {0};

    int rc = 1;
    attn_ctx *ctx = NULL;
    attn_mha *mha = NULL;
    FILE *csv = NULL;
    tensor p[MAX_PARAMS];
    int np = 0;
    void *saved = NULL;
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.seed = 1234, cp.n_threads = threads;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) return 1;
    attn_generator *gen = attn_ctx_generator(ctx);

    // ---- parameters: embeddings and head here, the attention's in the module
    static float tok_emb[VOCAB * E], pos_emb[T * E], w_head[VOCAB * E], b_head[VOCAB];
    CHECK(attn_init_embedding(gen, tok_emb, VOCAB, E, -1));
    CHECK(attn_init_embedding(gen, pos_emb, T, E, -1));
    CHECK(attn_init_linear(gen, w_head, b_head, E, VOCAB));
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, HEADS);
    cfg.batch_first = 1;
    CHECK(attn_mha_create(ctx, &cfg, &mha));
    if ((np = add_tensor(p, np, "tok_emb", tok_emb, VOCAB * E, 1)) < 0 ||
        (np = add_tensor(p, np, "pos_emb", pos_emb, T * E, 1)) < 0 ||
        (np = add_tensor(p, np, "head.weight", w_head, VOCAB * E, 1)) < 0 ||
        (np = add_tensor(p, np, "head.bias", b_head, VOCAB, 0)) < 0)
        goto done;
    const int first_mha = np;
    for (int i = 0; i < attn_mha_param_count(mha); i++) {
        const char *name;
        int ndim;
        int64_t shape[3];
        float *data;
        CHECK(attn_mha_param_at(mha, i, &name, &ndim, shape, &data));
        const int64_t n = ndim == 1 ? shape[0] : ndim == 2 ? shape[0] * shape[1] : shape[0] * shape[1] * shape[2];
        if ((np = add_tensor(p, np, name, data, n, ndim >= 2)) < 0) goto done;
    }
    float *dparams[MAX_PARAMS];
    for (int i = first_mha; i < np; i++) dparams[i - first_mha] = p[i].g;

    // ---- activations (batch_first (BATCH, T, E)) and the attention's saved buffer
    static int tokens[BATCH * T];
    static float h0[BATCH * T * E], a[BATCH * T * E], h1[BATCH * T * E], logits[BATCH * T * VOCAB];
    static float dlogits[BATCH * T * VOCAB], dh1[BATCH * T * E], dh0[BATCH * T * E], u[BATCH * T];
    attn_mha_args args;
    attn_mha_args_init(&args);
    args.query = h0, args.batch = BATCH, args.len_q = T, args.causal = 1, args.need_weights = 0;
    size_t saved_size;
    CHECK(attn_mha_saved_size(ctx, mha, &args, &saved_size));
    if ((saved = malloc(saved_size)) == NULL) goto done;
    if (strcmp(device, "cuda") == 0 && attention && gpu_open(&dev, mha, &args, BATCH * T) != 0) goto done;
    if (csv_path != NULL) {
        if ((csv = fopen(csv_path, "w")) == NULL) {
            perror(csv_path);
            goto done;
        }
        fprintf(csv, "step,loss,accuracy\n");
    }

    adamw opt = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    const int64_t rows = BATCH * T, counted = BATCH * (T - K);
    double loss = 0.0;
    const double t0 = seconds();
    for (int step = 1; step <= steps; step++) {
        // a fresh batch of random sequences
        CHECK(attn_rand_uniform(gen, u, rows, 0.0, 1.0));
        for (int64_t i = 0; i < rows; i++) tokens[i] = (int)(u[i] * VOCAB) % VOCAB;

        // forward
        for (int64_t r = 0; r < rows; r++)
            for (int e = 0; e < E; e++) h0[r * E + e] = tok_emb[tokens[r] * E + e] + pos_emb[(r % T) * E + e];
        if (dev.on) {
            if (gpu_forward(&dev, h0, a) != 0) goto done;
        } else if (attention) {
            CHECK(attn_mha_forward_train(ctx, mha, &args, a, NULL, saved, saved_size));
        } else {
            memset(a, 0, sizeof a);
        }
        for (int64_t i = 0; i < rows * E; i++) h1[i] = h0[i] + a[i];
        CHECK(attn_linear(ctx, h1, rows, E, w_head, ATTN_WEIGHT_OUT_IN, b_head, VOCAB, logits));

        // loss and dL/dlogits: softmax cross-entropy at positions t >= K, target x[t - K]
        loss = 0.0;
        int64_t correct = 0;
        for (int64_t r = 0; r < rows; r++) {
            float *lg = logits + r * VOCAB, *dl = dlogits + r * VOCAB;
            if (r % T < K) {
                memset(dl, 0, sizeof(float) * VOCAB);
                continue;
            }
            const int target = tokens[r - K];
            float mx = lg[0];
            int best = 0;
            for (int c = 1; c < VOCAB; c++)
                if (lg[c] > mx) mx = lg[c], best = c;
            double sum = 0.0;
            for (int c = 0; c < VOCAB; c++) sum += exp((double)(lg[c] - mx));
            loss += log(sum) - (double)(lg[target] - mx);
            correct += best == target;
            for (int c = 0; c < VOCAB; c++)
                dl[c] = (float)((exp((double)(lg[c] - mx)) / sum - (c == target)) / (double)counted);
        }
        loss /= (double)counted;

        // backward: head, residual, attention (its parameters' gradients land in p[first_mha..]),
        // embeddings
        memset(p[2].g, 0, sizeof w_head), memset(p[3].g, 0, sizeof b_head);
        for (int64_t r = 0; r < rows; r++)
            for (int c = 0; c < VOCAB; c++) {
                const float d = dlogits[r * VOCAB + c];
                p[3].g[c] += d;
                for (int e = 0; e < E; e++) p[2].g[c * E + e] += d * h1[r * E + e];
            }
        CHECK(attn_linear(ctx, dlogits, rows, VOCAB, w_head, ATTN_WEIGHT_IN_OUT, NULL, E, dh1)); // dlogits W
        if (dev.on) {
            if (gpu_backward(&dev, dh1, dh0, dparams) != 0) goto done;
        } else if (attention) {
            CHECK(attn_mha_backward(ctx, mha, &args, saved, saved_size, dh1, dh0, NULL, NULL, dparams));
        } else {
            memset(dh0, 0, sizeof dh0);
        }
        for (int64_t i = 0; i < rows * E; i++) dh0[i] += dh1[i]; // the residual path
        memset(p[0].g, 0, sizeof tok_emb), memset(p[1].g, 0, sizeof pos_emb);
        for (int64_t r = 0; r < rows; r++)
            for (int e = 0; e < E; e++) {
                p[0].g[tokens[r] * E + e] += dh0[r * E + e];
                p[1].g[(r % T) * E + e] += dh0[r * E + e];
            }
        adamw_step(&opt, p, np);
        if (dev.on && gpu_push(&dev, mha) != 0) goto done;

        const double accuracy = (double)correct / (double)counted;
        if (csv != NULL) fprintf(csv, "%d,%.6f,%.4f\n", step, loss, accuracy);
        if (step == 1 || step % 50 == 0 || step == steps)
            printf("step %4d  loss %.4f  accuracy %5.1f%%\n", step, loss, 100.0 * accuracy);
    }
    printf("chance: loss %.4f (ln %d), accuracy %.1f%%\n", log((double)VOCAB), VOCAB, 100.0 / VOCAB);
    printf("time: %.3f ms per step (%d steps, attention on %s)\n", 1e3 * (seconds() - t0) / steps, steps,
           dev.on ? "the GPU" : "the CPU");
    if (check) {
        const int ok = attention ? loss < 0.05 : loss > log((double)VOCAB) - 0.1;
        printf("check: final loss %.4f, expected %s %.4f: %s\n", loss, attention ? "<" : ">",
               attention ? 0.05 : log((double)VOCAB) - 0.1, ok ? "ok" : "FAILED");
        rc = ok ? 0 : 1;
    } else {
        rc = 0;
    }

done:
    if (csv != NULL && fclose(csv) != 0) rc = 1;
    for (int i = 0; i < np; i++) free(p[i].g), free(p[i].m), free(p[i].v);
    free(saved);
    if (strcmp(device, "cuda") == 0) gpu_close(&dev); // also after a partial gpu_open
    attn_mha_free(mha);
    attn_ctx_free(ctx);
    return rc;
}
