// generate.c - choosing tokens (greedy or top-k sampling) and the generation loop: one prefill,
// then one decoding step per new token, timed apart.
#include <math.h>
#include <stdlib.h>

#include "../example_check.h"
#include "gpt2_internal.h"

attn_status gpt2_sampler_init(gpt2_sampler *s, int64_t top_k, double temperature, int64_t vocab_size, char *err) {
    *s = (gpt2_sampler){0};
    if (top_k < 0 || !(temperature >= 0.0) || !isfinite(temperature))
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "sampling: top-k %lld and temperature %g must be >= 0",
                          (long long)top_k, temperature);
    s->top_k = top_k < vocab_size ? top_k : vocab_size;
    s->temperature = temperature;
    if (s->top_k > 1 && temperature > 0.0) {
        s->index = malloc((size_t)s->top_k * sizeof *s->index);
        s->value = malloc((size_t)s->top_k * sizeof *s->value);
        if (s->index == NULL || s->value == NULL) {
            gpt2_sampler_free(s);
            return gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "sampling: out of memory");
        }
    }
    return ATTN_OK;
}

void gpt2_sampler_free(gpt2_sampler *s) {
    free(s->index);
    free(s->value);
    s->index = NULL, s->value = NULL;
}

// Candidate a ranks before b: a larger logit, or the same and a lower id. NaN ranks last.
static int before(float va, int64_t ia, float vb, int64_t ib) {
    if (va != va) va = -INFINITY;
    if (vb != vb) vb = -INFINITY;
    return va > vb || (va == vb && ia < ib);
}

// The min-heap of the k best candidates so far (root: the one that ranks last), restored below i.
static void sift_down(float *v, int64_t *ix, int64_t k, int64_t i) {
    for (;;) {
        int64_t worst = i;
        const int64_t l = 2 * i + 1, r = l + 1;
        if (l < k && before(v[worst], ix[worst], v[l], ix[l])) worst = l;
        if (r < k && before(v[worst], ix[worst], v[r], ix[r])) worst = r;
        if (worst == i) return;
        const float tv = v[i];
        const int64_t ti = ix[i];
        v[i] = v[worst], ix[i] = ix[worst], v[worst] = tv, ix[worst] = ti;
        i = worst;
    }
}

int32_t gpt2_sample(gpt2_sampler *s, const float *logits, int64_t V, attn_generator *gen) {
    if (s->index == NULL) { // greedy
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (before(logits[i], i, logits[best], best)) best = i;
        return (int32_t)best;
    }
    const int64_t k = s->top_k;
    float *v = s->value;
    int64_t *ix = s->index;
    for (int64_t i = 0; i < k; i++) v[i] = logits[i], ix[i] = i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(v, ix, k, i);
    for (int64_t i = k; i < V; i++)
        if (before(logits[i], i, v[0], ix[0])) {
            v[0] = logits[i], ix[0] = i;
            sift_down(v, ix, k, 0);
        }
    // heap sort: the root (the candidate that ranks last) to the end, k times: best first
    for (int64_t n = k - 1; n > 0; n--) {
        const float tv = v[0];
        const int64_t ti = ix[0];
        v[0] = v[n], ix[0] = ix[n], v[n] = tv, ix[n] = ti;
        sift_down(v, ix, n, 0);
    }
    // softmax over the candidates at the temperature (the weights replace the logits), one uniform draw
    const double top = v[0] == v[0] ? (double)v[0] : 0.0;
    double sum = 0.0;
    for (int64_t i = 0; i < k; i++) {
        v[i] = v[i] == v[i] ? (float)exp(((double)v[i] - top) / s->temperature) : 0.0f;
        sum += (double)v[i];
    }
    float u;
    if (attn_rand_uniform(gen, &u, 1, 0.0, 1.0) != ATTN_OK || !(sum > 0.0)) return (int32_t)ix[0];
    const double target = (double)u * sum;
    double acc = 0.0;
    for (int64_t i = 0; i < k; i++) {
        acc += (double)v[i];
        if (acc > target) return (int32_t)ix[i];
    }
    return (int32_t)ix[k - 1];
}

attn_status gpt2_generate(attn_ctx *ctx, const gpt2_model *m, gpt2_state *s, gpt2_sampler *sampler,
                          int32_t *tokens, int64_t n_prompt, int64_t n_new, float *logits, gpt2_step_fn on_step,
                          void *user, gpt2_timing *timing, char *err) {
    *timing = (gpt2_timing){0};
    if (n_prompt < 1 || n_new < 0)
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "generate: needs a prompt (%lld tokens) and n_new >= 0 (%lld)",
                          (long long)n_prompt, (long long)n_new);
    if (n_new == 0) return ATTN_OK;
    attn_generator *gen = attn_ctx_generator(ctx);
    const int64_t V = m->cfg.vocab_size;
    gpt2_state_reset(m, s);
    for (int64_t t = n_prompt; t < n_prompt + n_new; t++) {
        // step t chooses tokens[t]: the prefill runs the prompt, each later step the token before
        const int64_t first = t == n_prompt ? 0 : t - 1;
        const double t0 = example_now();
        GPT2_RETURN_IF_ERR(gpt2_forward(ctx, m, s, tokens + first, t - first, logits, 0, err));
        tokens[t] = gpt2_sample(sampler, logits, V, gen);
        const double dt = example_now() - t0;
        if (t == n_prompt) {
            timing->prefill_s = dt;
        } else {
            timing->decode_s += dt;
            timing->decode_steps++;
        }
        if (on_step != NULL) GPT2_RETURN_IF_ERR(on_step(user, tokens, t, logits));
    }
    return ATTN_OK;
}
